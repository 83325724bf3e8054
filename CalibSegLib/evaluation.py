"""Predict one volume and measure it against a reference: the path shared by the CLI, evaluate.py and Slicer.

Calibration statistics are streamed batch by batch from the predictor, so the probability
volume is never kept. Beside our metrics (docs/design.md), every case also gets the papers'
protocol columns — ECE over *all* voxels (``ece_all``), their equal-width TACE
(``tace_authors``), HD95 in voxels without spacing (``hd95_voxels_*``) — and the mean
confidence and accuracy in three regions of the reference (CRaC's regions, per slice:
*inner background*, *inner foreground* — the 3×3 window holds one label — and *boundary*), so
over- and under-confidence show where they happen instead of averaging out.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

import torch

from CalibSegLib.inference import Predictor
from CalibSegLib.metrics import aurc, error_detection_auroc, hd95, segmentation_metrics
from CalibSegLib.metrics.calibration import CalibrationStatistics, masked_probabilities
from CalibSegLib.prediction import Prediction
from CalibSegLib.priors import inner_region_mask
from CalibSegLib.quality import structure_key

__all__ = ["CaseEvaluation", "REFERENCE_REGIONS", "predict_and_evaluate", "evaluate_variants", "reference_regions",
           "case_metrics_row"]

# CRaC's inner/outer split of a reference (CalibSegLib.priors.inner_region_mask), inner split again by its label.
REFERENCE_REGIONS: tuple[str, ...] = ("inner_background", "inner_foreground", "boundary")


@dataclass
class CaseEvaluation:
    """One volume's prediction and metrics.

    ``segmentation``: ``{"dice", "hd95", "asd", "hd95_voxels"}`` each ``(C-1,)`` (mm; the last in
    voxels, the papers' protocol); ``calibration``: ECE, MCE, CECE, TACE, the papers' TACE,
    Brier, NLL over the reference foreground and ``ece_all`` over every voxel; ``confidence``:
    error-detection AUROC and AURC of the per-voxel confidence, mean normalised entropy inside
    the predicted foreground (for an ensemble also the error-detection AUROC of its members' agreement, one minus
    their disagreement, and their mean disagreement inside the predicted foreground), mean confidence and accuracy
    per reference region
    (:data:`REFERENCE_REGIONS`); ``statistics``: the volume's foreground calibration sums (reliability
    diagram, pooling over cases).
    """

    prediction: Prediction
    segmentation: dict[str, np.ndarray]
    calibration: dict[str, float]
    confidence: dict[str, float]
    statistics: CalibrationStatistics


def reference_regions(reference: np.ndarray, slice_axis: int = 0) -> dict[str, np.ndarray]:
    """CRaC's regions of a ``(z, y, x)`` reference, per 2D slice along ``slice_axis``: ``{region: bool mask}``.

    A voxel is *inner* when its 3×3 in-plane window (outside the slice = background) holds one
    label, split by that label into background and foreground; the rest is *boundary*.
    """
    slices = torch.from_numpy(np.ascontiguousarray(np.moveaxis(reference, slice_axis, 0)).astype(np.int64))
    inner = np.moveaxis(inner_region_mask(slices, 3).numpy(), 0, slice_axis)
    return {"inner_background": inner & (reference == 0), "inner_foreground": inner & (reference > 0),
            "boundary": ~inner}


def predict_and_evaluate(
    predictor: Predictor,
    image: np.ndarray,
    reference: np.ndarray,
    spacing: Sequence[float],
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
) -> CaseEvaluation:
    """Predict ``image (z, y, x)`` at the bundle's temperature and compute every metric against
    ``reference (z, y, x)``.

    Calibration uses the reference foreground as mask (docs/design.md); merge the returned
    ``statistics`` of several cases (``CalibrationStatistics.merge``) to pool them.
    """
    return evaluate_variants(predictor, image, reference, spacing, [predictor.metadata.temperature], progress,
                             cancel)[0]


def evaluate_variants(
    predictor: Predictor,
    image: np.ndarray,
    reference: np.ndarray,
    spacing: Sequence[float],
    temperatures: Sequence[float | Sequence[float]],
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
) -> list[CaseEvaluation]:
    """:func:`predict_and_evaluate` at each of ``temperatures`` from one pass of the network."""
    num_classes = predictor.num_classes
    reference = np.asarray(reference)
    if reference.shape != image.shape[-3:]:
        raise ValueError(f"reference shape {reference.shape} does not match image shape {image.shape[-3:]}.")
    if not np.issubdtype(reference.dtype, np.integer):
        raise ValueError(f"reference must hold integer labels, got dtype {reference.dtype}.")
    if reference.size and (reference.min() < 0 or reference.max() >= num_classes):
        raise ValueError(
            f"reference labels must lie in [0, {num_classes - 1}] for this model, "
            f"found [{reference.min()}, {reference.max()}]."
        )
    axis = predictor.metadata.preprocessing.slice_axis
    reference_slices = np.moveaxis(reference, axis, 0)
    foreground = [CalibrationStatistics(num_classes) for _ in temperatures]
    # Every voxel, for the papers' ECE column: too many to keep TACE pairs for.
    everywhere = [CalibrationStatistics(num_classes, track_tace=False) for _ in temperatures]

    def streamer(on_foreground: CalibrationStatistics, on_all: CalibrationStatistics):
        def stream(slices: slice, probabilities: np.ndarray) -> None:
            labels = reference_slices[slices]
            on_foreground.add(*masked_probabilities(probabilities, labels))
            on_all.add(*masked_probabilities(probabilities, labels, np.ones(labels.shape, bool)))
        return stream

    predictions = predictor.predict_variants(
        image, spacing, temperatures, progress=progress, cancel=cancel,
        probability_sinks=[streamer(*pair) for pair in zip(foreground, everywhere)])
    regions = reference_regions(reference, axis)
    measured: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []

    def segmentation_of(labels: np.ndarray) -> dict[str, np.ndarray]:
        """The segmentation metrics of ``labels``, measured once for labels several temperatures share (a scalar
        temperature never moves a single network's argmax, and the surface distances are most of the time)."""
        metrics = next((metrics for seen, metrics in measured if np.array_equal(seen, labels)), None)
        if metrics is None:
            metrics = {**segmentation_metrics(labels, reference, num_classes, spacing),
                       "hd95_voxels": hd95(labels, reference, num_classes, (1.0, 1.0, 1.0))}
            measured.append((labels, metrics))
        return {name: values.copy() for name, values in metrics.items()}

    return [_case_evaluation(prediction, reference, segmentation_of(prediction.labels), statistics, on_all, regions)
            for prediction, statistics, on_all in zip(predictions, foreground, everywhere)]


def _case_evaluation(prediction: Prediction, reference: np.ndarray, segmentation: dict[str, np.ndarray],
                     statistics: CalibrationStatistics, on_all: CalibrationStatistics,
                     regions: dict[str, np.ndarray]) -> CaseEvaluation:
    correct = prediction.labels == reference
    predicted_foreground = prediction.labels > 0
    confidence = {
        "error_auroc": error_detection_auroc(prediction.confidence, correct),
        "aurc": aurc(prediction.confidence, correct)[0],
        "mean_foreground_entropy": float(prediction.entropy[predicted_foreground].mean())
        if predicted_foreground.any() else float("nan"),
    }
    if prediction.disagreement is not None:  # an ensemble: do the members' disagreements find its errors too?
        confidence["disagreement_auroc"] = error_detection_auroc(1.0 - prediction.disagreement, correct)
        confidence["mean_foreground_disagreement"] = float(prediction.disagreement[predicted_foreground].mean()) \
            if predicted_foreground.any() else float("nan")
    for region, mask in regions.items():
        confidence[f"confidence_{region}"] = float(prediction.confidence[mask].mean()) if mask.any() else float("nan")
        confidence[f"accuracy_{region}"] = float(correct[mask].mean()) if mask.any() else float("nan")
    calibration = statistics.metrics()
    calibration["ece_all"] = on_all.ece()
    return CaseEvaluation(prediction=prediction, segmentation=segmentation, calibration=calibration,
                          confidence=confidence, statistics=statistics)


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
