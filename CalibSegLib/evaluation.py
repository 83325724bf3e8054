"""Predict one volume and measure it against a reference: the path shared by the CLI, evaluate.py and Slicer.

Calibration statistics are streamed batch by batch from the predictor, so the probability
volume is never kept.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from CalibSegLib.inference import Prediction, Predictor
from CalibSegLib.metrics import aurc, error_detection_auroc, segmentation_metrics
from CalibSegLib.metrics.calibration import CalibrationStatistics, masked_probabilities
from CalibSegLib.quality import structure_key

__all__ = ["CaseEvaluation", "predict_and_evaluate", "case_metrics_row"]


@dataclass
class CaseEvaluation:
    """One volume's prediction and metrics.

    ``segmentation``: ``{"dice", "hd95", "asd"}`` each ``(C-1,)`` (mm); ``calibration``: ECE,
    MCE, CECE, TACE, Brier, NLL over the reference foreground; ``confidence``: error-detection
    AUROC and AURC of the per-voxel confidence, and mean normalised entropy inside the
    predicted foreground; ``statistics``: the volume's calibration sums (reliability diagram,
    pooling over cases).
    """

    prediction: Prediction
    segmentation: dict[str, np.ndarray]
    calibration: dict[str, float]
    confidence: dict[str, float]
    statistics: CalibrationStatistics


def predict_and_evaluate(
    predictor: Predictor,
    image: np.ndarray,
    reference: np.ndarray,
    spacing: Sequence[float],
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
) -> CaseEvaluation:
    """Predict ``image (z, y, x)`` and compute every metric against ``reference (z, y, x)``.

    Calibration uses the reference foreground as mask (DESIGN.md); merge the returned
    ``statistics`` of several cases (``CalibrationStatistics.merge``) to pool them.
    """
    num_classes = predictor.num_classes
    reference = np.asarray(reference)
    if reference.shape != image.shape:
        raise ValueError(f"reference shape {reference.shape} does not match image shape {image.shape}.")
    if not np.issubdtype(reference.dtype, np.integer):
        raise ValueError(f"reference must hold integer labels, got dtype {reference.dtype}.")
    if reference.size and (reference.min() < 0 or reference.max() >= num_classes):
        raise ValueError(
            f"reference labels must lie in [0, {num_classes - 1}] for this model, found [{reference.min()}, {reference.max()}]."
        )
    axis = predictor.metadata.preprocessing.slice_axis
    reference_slices = np.moveaxis(reference, axis, 0)
    statistics = CalibrationStatistics(num_classes)

    def stream(slices: slice, probabilities: np.ndarray) -> None:
        statistics.add(*masked_probabilities(probabilities, reference_slices[slices]))

    prediction = predictor.predict(image, spacing, progress=progress, cancel=cancel, probability_sink=stream)
    correct = prediction.labels == reference
    foreground = prediction.labels > 0
    confidence = {
        "error_auroc": error_detection_auroc(prediction.confidence, correct),
        "aurc": aurc(prediction.confidence, correct)[0],
        "mean_foreground_entropy": float(prediction.entropy[foreground].mean()) if foreground.any() else float("nan"),
    }
    return CaseEvaluation(
        prediction=prediction,
        segmentation=segmentation_metrics(prediction.labels, reference, num_classes, spacing),
        calibration=statistics.metrics(),
        confidence=confidence,
        statistics=statistics,
    )


def case_metrics_row(evaluation: CaseEvaluation, class_names: Sequence[str]) -> dict[str, float]:
    """Flat ``{metric: value}`` of one case: per-class Dice/HD95/ASD, their means, calibration, confidence."""
    row: dict[str, float] = {}
    for metric, values in evaluation.segmentation.items():
        for name, value in zip(class_names[1:], values):
            row[f"{metric}_{structure_key(name)}"] = float(value)
        defined = values[~np.isnan(values)]
        row[f"{metric}_mean"] = float(defined.mean()) if defined.size else float("nan")
    row.update({key: float(value) for key, value in evaluation.calibration.items()})
    row.update(evaluation.confidence)
    return row
