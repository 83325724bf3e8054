"""Overlap and surface-distance metrics per foreground class, in mm (MONAI surface distances).

Empty-mask policy (explicit, never silently dropped), per class:
both prediction and reference empty → Dice 1, HD95 0, ASD 0; exactly one empty →
Dice 0, HD95 NaN, ASD NaN. Summaries count the NaNs (:func:`summarize`).

HD95 follows MONAI ``compute_hausdorff_distance(percentile=95, directed=False)``: the 95th
percentile of the distances from each surface to the other, taken per direction, and the
larger of the two. ASD follows ``compute_average_surface_distance(symmetric=True)``: the mean
of both directions' surface distances pooled together. Both are read off one computation of
those distances (MONAI's ``get_edge_surface_distance``, what each of its two functions calls
on its own), so :func:`surface_metrics` gives the numbers of MONAI's two functions at the cost
of one; the distances' nearest-neighbour queries are most of an evaluation's time on the CPU.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import torch
from monai.metrics.utils import get_edge_surface_distance

__all__ = ["dice", "surface_metrics", "hd95", "asd", "segmentation_metrics", "summarize"]


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


def _class_surface_metrics(predicted: np.ndarray, expected: np.ndarray, spacing: tuple[float, ...]
                           ) -> tuple[float, float]:
    """HD95 and ASD in mm of one class's non-empty predicted and reference masks, from one computation of the
    distances from each surface to the other (float32, as MONAI's two functions store them)."""
    with warnings.catch_warnings():
        # MONAI 1.5+ warns about its own internal use of a deprecated argument on every call.
        warnings.simplefilter("ignore", FutureWarning)
        _, distances, _ = get_edge_surface_distance(torch.from_numpy(predicted), torch.from_numpy(expected),
                                                    distance_metric="euclidean", spacing=spacing, symmetric=True)
    hausdorff = torch.max(torch.stack([torch.quantile(directed, 0.95) for directed in distances]))
    pooled = torch.cat(distances)
    average = pooled.mean() if pooled.numel() else torch.tensor(float("nan"))
    return float(hausdorff.to(torch.float32)), float(average.to(torch.float32))


def surface_metrics(prediction, reference, num_classes: int, spacing: Sequence[float]) -> dict[str, np.ndarray]:
    """``{"hd95", "asd"}`` of classes 1..C-1 in mm, each ``(C-1,)``, under the module's empty-mask policy."""
    prediction, reference = _check_labels(prediction, reference, num_classes)
    spacing = _check_spacing(spacing, prediction.ndim)
    values = {"hd95": np.empty(num_classes - 1), "asd": np.empty(num_classes - 1)}
    for k in range(1, num_classes):
        predicted, expected = prediction == k, reference == k
        has_prediction, has_reference = bool(predicted.any()), bool(expected.any())
        if not has_prediction and not has_reference:
            values["hd95"][k - 1] = values["asd"][k - 1] = 0.0
        elif has_prediction != has_reference:
            values["hd95"][k - 1] = values["asd"][k - 1] = np.nan
        else:
            values["hd95"][k - 1], values["asd"][k - 1] = _class_surface_metrics(predicted, expected, spacing)
    return values


def hd95(prediction, reference, num_classes: int, spacing: Sequence[float]) -> np.ndarray:
    """Symmetric 95th-percentile Hausdorff distance of classes 1..C-1 in mm, ``(C-1,)``."""
    return surface_metrics(prediction, reference, num_classes, spacing)["hd95"]


def asd(prediction, reference, num_classes: int, spacing: Sequence[float]) -> np.ndarray:
    """Average symmetric surface distance of classes 1..C-1 in mm, ``(C-1,)``."""
    return surface_metrics(prediction, reference, num_classes, spacing)["asd"]


def segmentation_metrics(prediction, reference, num_classes: int, spacing: Sequence[float]) -> dict[str, np.ndarray]:
    """``{"dice", "hd95", "asd"}`` each ``(C-1,)`` for foreground classes 1..C-1."""
    return {"dice": dice(prediction, reference, num_classes),
            **surface_metrics(prediction, reference, num_classes, spacing)}


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
