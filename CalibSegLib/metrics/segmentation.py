"""Overlap and surface-distance metrics per foreground class, in mm (MONAI surface distances).

Empty-mask policy (explicit, never silently dropped), per class:
both prediction and reference empty → Dice 1, HD95 0, ASD 0; exactly one empty →
Dice 0, HD95 NaN, ASD NaN. Summaries count the NaNs (:func:`summarize`).

HD95 follows MONAI ``compute_hausdorff_distance(percentile=95, directed=False)``: the 95th
percentile of the distances from each surface to the other, taken per direction, and the
larger of the two. ASD follows ``compute_average_surface_distance(symmetric=True)``: the mean
of both directions' surface distances pooled together.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import torch
from monai.metrics.hausdorff_distance import compute_hausdorff_distance
from monai.metrics.surface_distance import compute_average_surface_distance

__all__ = ["dice", "hd95", "asd", "segmentation_metrics", "summarize"]


def _check_labels(prediction, reference, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    prediction = np.asarray(prediction.detach().cpu() if hasattr(prediction, "detach") else prediction)
    reference = np.asarray(reference.detach().cpu() if hasattr(reference, "detach") else reference)
    if prediction.shape != reference.shape:
        raise ValueError(f"prediction shape {prediction.shape} does not match reference shape {reference.shape}.")
    for name, labels in (("prediction", prediction), ("reference", reference)):
        if not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"{name} must hold integer labels, got dtype {labels.dtype}.")
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(f"{name} labels must lie in [0, {num_classes - 1}], "
                             f"found [{labels.min()}, {labels.max()}].")
    return prediction, reference


def _check_spacing(spacing: Sequence[float], ndim: int) -> tuple[float, ...]:
    spacing = tuple(float(value) for value in spacing)
    if len(spacing) != ndim or not all(np.isfinite(value) and value > 0 for value in spacing):
        raise ValueError(f"spacing must be {ndim} positive numbers in mm, in array axis order, got {spacing}.")
    return spacing


def dice(prediction, reference, num_classes: int) -> np.ndarray:
    """Dice of classes 1..C-1, ``(C-1,)``; 1 when a class is absent from both."""
    prediction, reference = _check_labels(prediction, reference, num_classes)
    scores = np.empty(num_classes - 1)
    for k in range(1, num_classes):
        predicted, expected = prediction == k, reference == k
        total = predicted.sum() + expected.sum()
        scores[k - 1] = 1.0 if total == 0 else 2.0 * np.logical_and(predicted, expected).sum() / total
    return scores


def _surface_metric(prediction, reference, num_classes: int, spacing, compute) -> np.ndarray:
    prediction, reference = _check_labels(prediction, reference, num_classes)
    spacing = _check_spacing(spacing, prediction.ndim)
    values = np.empty(num_classes - 1)
    for k in range(1, num_classes):
        predicted, expected = prediction == k, reference == k
        has_prediction, has_reference = bool(predicted.any()), bool(expected.any())
        if not has_prediction and not has_reference:
            values[k - 1] = 0.0
        elif has_prediction != has_reference:
            values[k - 1] = np.nan
        else:
            as_batch = lambda mask: torch.from_numpy(mask)[None, None]  # noqa: E731  (B=1, C=1)
            with warnings.catch_warnings():
                # MONAI 1.5+ warns about its own internal use of a deprecated argument on every call.
                warnings.simplefilter("ignore", FutureWarning)
                values[k - 1] = float(compute(as_batch(predicted), as_batch(expected), spacing))
    return values


def hd95(prediction, reference, num_classes: int, spacing: Sequence[float]) -> np.ndarray:
    """Symmetric 95th-percentile Hausdorff distance of classes 1..C-1 in mm, ``(C-1,)``."""
    return _surface_metric(
        prediction, reference, num_classes, spacing,
        lambda p, r, s: compute_hausdorff_distance(p, r, include_background=True, percentile=95, spacing=s),
    )


def asd(prediction, reference, num_classes: int, spacing: Sequence[float]) -> np.ndarray:
    """Average symmetric surface distance of classes 1..C-1 in mm, ``(C-1,)``."""
    return _surface_metric(
        prediction, reference, num_classes, spacing,
        lambda p, r, s: compute_average_surface_distance(p, r, include_background=True, symmetric=True, spacing=s),
    )


def segmentation_metrics(prediction, reference, num_classes: int, spacing: Sequence[float]) -> dict[str, np.ndarray]:
    """``{"dice", "hd95", "asd"}`` each ``(C-1,)`` for foreground classes 1..C-1."""
    return {
        "dice": dice(prediction, reference, num_classes),
        "hd95": hd95(prediction, reference, num_classes, spacing),
        "asd": asd(prediction, reference, num_classes, spacing),
    }


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean and standard deviation over the defined values, and how many were NaN (undefined)."""
    array = np.asarray(values, dtype=np.float64)
    defined = array[~np.isnan(array)]
    return {
        "mean": float(defined.mean()) if defined.size else float("nan"),
        "std": float(defined.std()) if defined.size else float("nan"),
        "count": int(defined.size),
        "undefined": int(array.size - defined.size),
    }
