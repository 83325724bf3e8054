"""Reliability diagrams as matplotlib figures (no pyplot global state; Agg-safe)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from CalibSegLib.io import atomic_output
from CalibSegLib.metrics.calibration import Reliability

__all__ = ["reliability_figure", "compare_reliability_figure", "save_figure"]


def _draw(axis, histogram_axis, reliability: Reliability, label: str | None = None, color: str = "tab:blue") -> None:
    centres = (reliability.edges[:-1] + reliability.edges[1:]) / 2
    width = reliability.edges[1] - reliability.edges[0]
    filled = reliability.counts > 0
    accuracy = np.where(filled, reliability.accuracy, 0.0)
    confidence = np.where(filled, reliability.mean_confidence, 0.0)
    axis.bar(centres, accuracy, width=width, edgecolor="black", color=color, alpha=0.75, label=label or "accuracy")
    # The gap between accuracy and confidence is the miscalibration ECE sums up.
    axis.bar(centres[filled], (confidence - accuracy)[filled], bottom=accuracy[filled], width=width,
             color="tab:red", alpha=0.3, edgecolor="tab:red", hatch="//", label="gap" if label is None else None)
    total = reliability.counts.sum()
    histogram_axis.bar(centres, reliability.counts / max(total, 1), width=width, color=color, alpha=0.75,
                       edgecolor="black")


def _axes(figure: Figure):
    grid = figure.add_gridspec(2, 1, height_ratios=(3, 1), hspace=0.08)
    axis = figure.add_subplot(grid[0])
    histogram_axis = figure.add_subplot(grid[1], sharex=axis)
    axis.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
    axis.set_xlim(0, 1)
    axis.set_ylim(0, 1)
    axis.set_ylabel("accuracy")
    axis.tick_params(labelbottom=False)
    histogram_axis.set_xlabel("confidence")
    histogram_axis.set_ylabel("fraction")
    return axis, histogram_axis


def reliability_figure(reliability: Reliability, title: str = "Reliability diagram",
                       ece: float | None = None) -> Figure:
    """Accuracy per confidence bin against the diagonal, the gap hatched, the confidence histogram below.

    ``ece`` is shown in the title as the *pooled* ECE: the one these bins give, over all their voxels
    together (for several volumes not the mean of per-volume ECEs, which tables usually report).
    """
    figure = Figure(figsize=(5, 6), dpi=100)
    axis, histogram_axis = _axes(figure)
    _draw(axis, histogram_axis, reliability)
    axis.set_title(title if ece is None else f"{title} (pooled ECE {ece:.3f})")
    axis.legend(loc="upper left", fontsize=8)
    return figure


def compare_reliability_figure(
    reliabilities: Sequence[Reliability], labels: Sequence[str], title: str = "Reliability"
) -> Figure:
    """One reliability panel per method, side by side (e.g. CE+Dice vs NACL vs CRaC)."""
    figure = Figure(figsize=(4 * len(reliabilities), 5.5), dpi=100)
    grid = figure.add_gridspec(2, len(reliabilities), height_ratios=(3, 1), hspace=0.08, wspace=0.25)
    for index, (reliability, label) in enumerate(zip(reliabilities, labels)):
        axis = figure.add_subplot(grid[0, index])
        histogram_axis = figure.add_subplot(grid[1, index], sharex=axis)
        axis.plot([0, 1], [0, 1], "k--", linewidth=1)
        _draw(axis, histogram_axis, reliability)
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1)
        axis.set_title(label)
        axis.tick_params(labelbottom=False)
        histogram_axis.set_xlabel("confidence")
    figure.suptitle(title)
    return figure


def save_figure(figure: Figure, path: Path) -> Path:
    """Write ``figure`` to ``path`` as a PNG cropped to its content, atomically (temporary name, then rename)."""
    with atomic_output(path) as temporary:
        figure.savefig(temporary, bbox_inches="tight", format="png")
    return path
