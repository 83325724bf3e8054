"""Uncertainty features of a predicted volume: per structure (:func:`structure_features`) and per slice
(:func:`uncertain_slices`), from the labels, confidence and normalised entropy of a
:class:`~CalibSegLib.prediction.Prediction`. Definitions: :mod:`CalibSegLib.quality.summary`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import ndimage

from CalibSegLib.prediction import Prediction
from CalibSegLib.quality.model import BOUNDARY_RING, LOW_CONFIDENCE_THRESHOLD, MEAN_DISAGREEMENT, MIRROR_AGREEMENT
from CalibSegLib.uncertainty_levels import HOT_SPOT_LEVEL

__all__ = ["HOT_SPOT_LEVEL", "MAX_UNCERTAIN_SLICES", "structure_features", "uncertain_slices"]

MAX_UNCERTAIN_SLICES = 10
_CHUNK_SLICES = 32  # slabs of the first axis per bincount, so no float64 copy of a whole volume is made


def _class_sums(labels: np.ndarray, values: np.ndarray | None, num_classes: int) -> np.ndarray:
    """Per-label sums of ``values`` (counts when None) in float64, ``(num_classes,)``."""
    totals = np.zeros(num_classes)
    for start in range(0, labels.shape[0], _CHUNK_SLICES):
        chunk = labels[start:start + _CHUNK_SLICES].ravel()
        weights = None if values is None else values[start:start + _CHUNK_SLICES].ravel().astype(np.float64)
        totals += np.bincount(chunk, weights=weights, minlength=num_classes)[:num_classes]
    return totals


def structure_features(
    prediction: Prediction,
    num_classes: int,
    low_confidence_threshold: float = LOW_CONFIDENCE_THRESHOLD,
    boundary_ring: int = BOUNDARY_RING,
    spacing: Sequence[float] | None = None,
) -> list[dict[str, float] | None]:
    """Uncertainty features of each foreground class of one predicted volume.

    Args:
        prediction: ``labels`` uint8, ``confidence`` and ``entropy`` float32, all ``(z, y, x)``.
        num_classes: C, background included.
        low_confidence_threshold: confidence below this counts as low, in [0, 1].
        boundary_ring: face-neighbour steps around a structure included in ``boundary_entropy_ratio`` and
            ``boundary_low_confidence_ratio``.
        spacing: the voxel size ``(z, y, x)`` in mm, for ``log_volume_ml``.

    Returns:
        C-1 entries, class 1 first: ``{"voxels", "mean_confidence", "mean_entropy",
        "low_confidence_fraction", "boundary_entropy_ratio", "boundary_low_confidence_ratio",
        "expected_dice", "log_volume_ml", "mirror_agreement", "mean_disagreement"}``, or None for a class predicted
        nowhere.
        ``expected_dice`` is left out when the prediction carries neither ``probability_sums`` nor
        ``probabilities``, ``log_volume_ml`` (natural log of the volume in mL) when ``spacing`` is None,
        ``mirror_agreement`` when the prediction carries none (a bundle that does not mirror), ``mean_disagreement``
        (the ensemble members' mean disagreement inside the structure) for a single network's prediction.
    """
    labels = prediction.labels
    counts = _class_sums(labels, None, num_classes)
    confidence = _class_sums(labels, prediction.confidence, num_classes)
    entropy = _class_sums(labels, prediction.entropy, num_classes)
    low = _class_sums(labels, prediction.confidence < low_confidence_threshold, num_classes)
    expected_counts = _expected_counts(prediction)
    boxes = ndimage.find_objects(labels, max_label=num_classes - 1)
    cross = ndimage.generate_binary_structure(3, 1)
    voxel_ml = None if spacing is None else math.prod(float(value) for value in spacing) / 1000.0
    features: list[dict[str, float] | None] = []
    for label in range(1, num_classes):
        count = counts[label]
        if count == 0:
            features.append(None)
            continue
        # The ring only reaches `boundary_ring` voxels beyond the structure's box: crop to that.
        box = tuple(slice(max(item.start - boundary_ring, 0), item.stop + boundary_ring) for item in boxes[label - 1])
        around = labels[box] == label
        if boundary_ring > 0:
            around = ndimage.binary_dilation(around, structure=cross, iterations=boundary_ring)
        values = {
            "voxels": float(count),
            "mean_confidence": float(confidence[label] / count),
            "mean_entropy": float(entropy[label] / count),
            "low_confidence_fraction": float(low[label] / count),
            "boundary_entropy_ratio": float(prediction.entropy[box][around].sum(dtype=np.float64) / count),
            "boundary_low_confidence_ratio": float(
                np.count_nonzero(prediction.confidence[box][around] < low_confidence_threshold) / count),
        }
        if expected_counts is not None:
            # Inside the predicted structure the class is the argmax (post-processing only removes
            # voxels), so its probability there is the confidence.
            values["expected_dice"] = float(2.0 * confidence[label] / (count + expected_counts[label]))
        if voxel_ml is not None:
            values["log_volume_ml"] = math.log(count * voxel_ml)
        if prediction.disagreement is not None:
            values[MEAN_DISAGREEMENT] = float(_class_sums(labels, prediction.disagreement, num_classes)[label] / count)
        if prediction.mirror_agreement is not None:
            # NaN: no pass drew the class on the network's grid, yet resampling left some voxels of it on the
            # input's: nothing agrees on it.
            agreement = float(prediction.mirror_agreement[label])
            values[MIRROR_AGREEMENT] = agreement if math.isfinite(agreement) else 0.0
        features.append(values)
    return features


def _expected_counts(prediction: Prediction) -> np.ndarray | None:
    """Σ of each class's probability over the volume ``(C,)``, or None when the prediction cannot tell."""
    if prediction.probability_sums is not None:
        return prediction.probability_sums
    if prediction.probabilities is not None:
        return prediction.probabilities.reshape(len(prediction.probabilities), -1).sum(axis=1, dtype=np.float64)
    return None


def uncertain_slices(
    entropy: np.ndarray, slice_axis: int = 0, level: float = HOT_SPOT_LEVEL, limit: int = MAX_UNCERTAIN_SLICES
) -> list[int]:
    """Slice indices along ``slice_axis`` by hot-spot uncertainty (Σ entropy ≥ ``level``), most first.

    ``entropy`` is the ``(z, y, x)`` normalised entropy; slices without a voxel at or above
    ``level`` are left out; equal scores keep slice order; at most ``limit`` indices.
    """
    slices = np.moveaxis(entropy, slice_axis, 0)
    scores = np.array([np.where(plane >= level, plane, 0).sum(dtype=np.float64) for plane in slices])
    order = np.argsort(-scores, kind="stable")
    return [int(index) for index in order[scores[order] > 0][:limit]]

