"""The evaluation summary, ``summary.json``: what :func:`Evaluation.evaluate.evaluate_bundle` writes and
the reports (``Reporting/``) read, as a typed object instead of loose keys.

``summary.json`` holds the case and patient ids, the bundle and its temperature, the machine, the
quality report (:mod:`Evaluation.quality_report`; null for a bundle without a quality model), one
:class:`VariantSummary` per temperature variant (:data:`VARIANTS`: ``scaled`` at the bundle's
fitted temperature, ``uncalibrated`` at T = 1) and the evaluation's wall time. Summaries written
before a field existed read with its default (no patients, environment or quality, NaN wall time,
no reliability bins, NaN correlation).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from CalibSegLib.io import recorded_path, write_json_atomic
from CalibSegLib.metrics.calibration import Reliability

__all__ = ["EVALUATION_DIR", "SUMMARY_NAME", "CASES_NAME", "VARIANTS", "Metric", "METRICS", "RANKED_METRICS",
           "VariantSummary", "EvaluationSummary", "reliability_to_dict", "reliability_from_dict"]

EVALUATION_DIR = "evaluation"  # a run's evaluation folder, beside its bundle
SUMMARY_NAME = "summary.json"
CASES_NAME = "per_case.csv"
VARIANTS: tuple[str, ...] = ("scaled", "uncalibrated")


@dataclass(frozen=True)
class Metric:
    """One table column: its label, its key in ``summary.json`` and whether larger is better."""

    label: str
    key: str
    higher_is_better: bool


METRICS: tuple[Metric, ...] = (
    Metric("DSC", "dice_mean", True),
    Metric("HD95 (mm)", "hd95_mean", False),
    Metric("ECE", "ece", False),
    Metric("CECE", "cece", False),
    Metric("TACE", "tace", False),
    Metric("Brier", "brier", False),
    Metric("NLL", "nll", False),
    Metric("AUROC", "error_auroc", True),
    Metric("AURC", "aurc", False),
)
# The papers (CRaC Table 1, NACL) rank methods on these; the other columns are reported beside.
RANKED_METRICS: tuple[str, ...] = ("dice_mean", "hd95_mean", "ece", "cece", "tace")


def reliability_to_dict(reliability: Reliability) -> dict[str, list[float]]:
    """JSON-ready reliability bins (NaN for empty bins becomes null)."""
    def listed(values: np.ndarray) -> list:
        return [None if math.isnan(value) else float(value) for value in np.asarray(values, dtype=float)]

    return {"edges": listed(reliability.edges), "counts": [int(count) for count in reliability.counts],
            "mean_confidence": listed(reliability.mean_confidence), "accuracy": listed(reliability.accuracy)}


def reliability_from_dict(values: dict[str, list]) -> Reliability:
    """Inverse of :func:`reliability_to_dict`."""
    def array(key: str) -> np.ndarray:
        return np.array([np.nan if value is None else value for value in values[key]], dtype=float)

    return Reliability(counts=np.asarray(values["counts"], dtype=np.int64), mean_confidence=array("mean_confidence"),
                       accuracy=array("accuracy"), edges=array("edges"))


@dataclass
class VariantSummary:
    """One temperature variant over the test volumes.

    ``per_metric``: per column of ``per_case.csv`` (``dice_mean``, ``hd95_mean``, ``ece``, ...)
    :func:`CalibSegLib.metrics.summarize` over the volumes: ``{"mean", "std", "count",
    "undefined"}`` (``ece`` is the mean of the per-volume ECEs); ``pooled_calibration``: the
    calibration metrics of all volumes' voxels together; ``reliability``: their reliability bins;
    ``spearman_entropy_vs_dice``: Spearman ρ between a case's mean foreground entropy and its Dice.
    """

    per_metric: dict[str, dict[str, float]]
    pooled_calibration: dict[str, float]
    reliability: Reliability | None = None
    spearman_entropy_vs_dice: float = math.nan

    def value(self, column: str, statistic: str = "mean") -> float:
        """One statistic (``mean``, ``std``, ``count``, ``undefined``) of one column over the volumes."""
        return float(self.per_metric[column][statistic])

    def to_json(self) -> dict[str, Any]:
        values: dict[str, Any] = {"per_metric": self.per_metric, "pooled_calibration": self.pooled_calibration}
        if self.reliability is not None:
            values["reliability"] = reliability_to_dict(self.reliability)
        values["spearman_entropy_vs_dice"] = self.spearman_entropy_vs_dice
        return values

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> "VariantSummary":
        reliability = values.get("reliability")
        return cls(values["per_metric"], values.get("pooled_calibration", {}),
                   reliability_from_dict(reliability) if reliability else None,
                   float(values.get("spearman_entropy_vs_dice", math.nan)))


@dataclass
class EvaluationSummary:
    """``summary.json`` of one evaluation (see the module docstring); ``variants`` maps each of
    :data:`VARIANTS` to its :class:`VariantSummary`; ``case_patients`` each case id to its patient's (the unit a
    patient-level interval resamples; empty in summaries written before it existed)."""

    cases: list[str]
    variants: dict[str, VariantSummary]
    patients: list[str] = field(default_factory=list)
    bundle: str = ""
    temperature: float | list[float] = 1.0
    environment: dict[str, Any] = field(default_factory=dict)
    quality: dict[str, Any] | None = None
    wall_s: float = math.nan
    case_patients: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON object, in the order ``summary.json`` has always had."""
        return {"cases": self.cases, "patients": self.patients, "bundle": recorded_path(self.bundle),
                "temperature": self.temperature, "environment": self.environment, "quality": self.quality,
                **{name: variant.to_json() for name, variant in self.variants.items()}, "wall_s": self.wall_s,
                "case_patients": self.case_patients}

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> "EvaluationSummary":
        return cls(cases=list(values.get("cases", [])),
                   variants={name: VariantSummary.from_json(values[name]) for name in VARIANTS if name in values},
                   patients=list(values.get("patients") or []), bundle=str(values.get("bundle") or ""),
                   temperature=values.get("temperature", 1.0), environment=dict(values.get("environment") or {}),
                   quality=values.get("quality"), wall_s=float(values.get("wall_s", math.nan)),
                   case_patients=dict(values.get("case_patients") or {}))

    def write(self, path: str | Path) -> Path:
        """Write ``summary.json`` atomically; returns its path."""
        return write_json_atomic(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> "EvaluationSummary":
        """The summary in ``path``: a ``summary.json`` file, or a run folder holding ``evaluation/summary.json``.

        Raises:
            ValueError: there is none, or it is not JSON (one sentence naming the file).
        """
        path = Path(path)
        if path.is_dir():
            path = path / EVALUATION_DIR / SUMMARY_NAME
        if not path.is_file():
            raise ValueError(f"{path} does not exist; train the run to the end or evaluate its bundle "
                             "(Evaluation/evaluate.py).")
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"Cannot read {path} as an evaluation summary ({error}).") from None
