"""SegmentationRunner: run a bundle on a volume node and publish the results as MRML nodes, without Qt.

The module's ``CalibSegLogic`` (``CalibSeg.py``) hands every run to it; without the GUI::

    from CalibSegRunner import SegmentationRunner
    outputs = SegmentationRunner().run(slicer.util.getNode("patient016_frame01"), "/path/model.calibseg",
                                       referenceNode=slicer.util.getNode("patient016_frame01 reference"))

Work is split so the GUI never freezes: :meth:`SegmentationRunner.prepare` reads the scene (main
thread), :meth:`SegmentationRunner.compute` runs the network, the quality summary and the metrics
on arrays only (any thread, see :class:`~CalibSegRunner.job.InferenceJob`), and
:meth:`SegmentationRunner.publish` adds all output nodes at once (main thread), removing them
again if anything fails — so an error or a cancel leaves the scene as it was.

Without a reference the outputs already say what to check: the quality table (per structure:
review marker, predicted Dice and interval, volume, mean confidence and entropy), the
uncertainty volume shown only at its hot spots, and the most uncertain slices
(``outputs.summary["uncertain_slices"]``), which :meth:`SegmentationRunner.jumpToSlice` brings
into the slice views.
"""

from __future__ import annotations

import numbers
import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .nodes import (
    NodeTransaction,
    add_metrics_table,
    add_overlay,
    add_quality_table,
    add_reliability_plot,
    add_segmentation,
    metrics_rows,
    set_low_confidence_segment,
    show_hot_spots,
)
from .volumes import reference_label_array, slice_center_ras, volume_array, volume_spacing

__all__ = ["CalibSegRequest", "CalibSegComputation", "CalibSegOutputs", "SegmentationRunner", "review_text"]


@dataclass
class CalibSegRequest:
    """What to run: arrays read from the scene plus the user's choices."""

    input_node: object
    bundle: object  # CalibSegLib.bundle.Bundle, read and checked once by prepare()
    image: np.ndarray
    spacing: tuple[float, float, float]
    reference_node: object | None = None
    reference: np.ndarray | None = None
    device: str = "auto"
    low_confidence_threshold: float | None = None
    hot_spot_level: float | None = None  # set by prepare(): CalibSegLib.quality.HOT_SPOT_LEVEL unless chosen


@dataclass
class CalibSegComputation:
    """Arrays and metrics computed off the main thread (no MRML).

    ``summary``: :func:`CalibSegLib.quality.quality_summary` of the prediction (no reference needed).
    """

    prediction: object
    summary: dict
    evaluation: object | None = None


@dataclass
class CalibSegOutputs:
    """The nodes one run added to the scene."""

    segmentation: object
    confidence: object
    uncertainty: object  # shown only at its hot spots (display threshold at the request's level)
    quality_table: object
    summary: dict  # the quality summary behind quality_table (uncertain_slices, slice_axis, review, ...)
    metrics_table: object | None = None
    reliability_chart: object | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the table's rows: label -> value


def _checked_threshold(threshold: float | None) -> float | None:
    """``threshold`` as a float in [0, 1] (None stays None); ValueError with one sentence otherwise."""
    if threshold is None:
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not 0 <= threshold <= 1:
        # ``not 0 <= nan <= 1`` is True, so NaN is refused here too.
        raise ValueError(f"The low-confidence threshold must be a number in [0, 1], got {threshold!r}.")
    return float(threshold)


def review_text(summary: dict) -> str:
    """What the reader is told about a quality summary: :func:`CalibSegLib.quality.review_text`, after the input
    check's warning and reasons when the input is unsuitable (imported on call: the library's dependencies may not
    be installed when the module loads)."""
    from CalibSegLib.input_check import input_check_lines
    from CalibSegLib.quality import review_text as library_review_text

    check = summary.get("input_check")
    warning = input_check_lines(check) if check is not None and check["suitable"] is False else []
    return " ".join([*warning, library_review_text(summary)])


class SegmentationRunner:
    """Runs a bundle on a volume node: prepare (reads the scene), compute (arrays only), publish (adds the
    nodes); also the follow-ups on a run's outputs (low-confidence segment, hot-spot level, jump to a slice)."""

    def prepare(self, inputVolumeNode, bundlePath, referenceNode=None, device: str = "auto",
                lowConfidenceThreshold: float | None = None,
                hotSpotLevel: float | None = None) -> CalibSegRequest:
        """Read and check everything the run needs from the scene; raises ValueError with one sentence.

        ``bundlePath`` is a ``.calibseg`` file or a shipped model's name (e.g. ``"acdc_crac"``);
        ``lowConfidenceThreshold`` None or a confidence in [0, 1].
        ``hotSpotLevel`` the normalised entropy from which the uncertainty overlay is shown
        (default :data:`CalibSegLib.quality.HOT_SPOT_LEVEL`).
        """
        from CalibSegLib.bundle import load_bundle
        from CalibSegLib.pretrained import resolve_bundle_path
        from CalibSegLib.quality import HOT_SPOT_LEVEL

        lowConfidenceThreshold = _checked_threshold(lowConfidenceThreshold)
        if not bundlePath:
            raise ValueError("Choose a model bundle (.calibseg file).")
        bundle = load_bundle(resolve_bundle_path(bundlePath))
        image = volume_array(inputVolumeNode)
        reference = None
        if referenceNode is not None:
            reference = reference_label_array(referenceNode, inputVolumeNode, bundle.metadata.class_names)
        return CalibSegRequest(inputVolumeNode, bundle, image, volume_spacing(inputVolumeNode), referenceNode,
                               reference, device, lowConfidenceThreshold,
                               HOT_SPOT_LEVEL if hotSpotLevel is None else float(hotSpotLevel))

    def compute(self, request: CalibSegRequest, progress: Callable[[float], None] | None = None,
                cancel: threading.Event | None = None) -> CalibSegComputation:
        """Run the network, the quality summary and, with a reference, the metrics; touches no MRML node."""
        from CalibSegLib.evaluation import predict_and_evaluate
        from CalibSegLib.inference import Predictor
        from CalibSegLib.input_check import check_input
        from CalibSegLib.quality import quality_summary

        predictor = Predictor(request.bundle, device=request.device)
        evaluation = None
        if request.reference is None:
            prediction = predictor.predict(request.image, request.spacing, progress=progress, cancel=cancel)
        else:
            evaluation = predict_and_evaluate(predictor, request.image, request.reference, request.spacing,
                                              progress=progress, cancel=cancel)
            prediction = evaluation.prediction
        # Slices are ranked at the run's hot-spot level, so the list points where the overlay shows.
        metadata = request.bundle.metadata
        summary = {"input_check": check_input(metadata, request.image, request.spacing, prediction.labels),
                   **quality_summary(prediction, request.spacing, metadata, request.hot_spot_level)}
        return CalibSegComputation(prediction, summary, evaluation)

    def publish(self, request: CalibSegRequest, computation: CalibSegComputation) -> CalibSegOutputs:
        """Add the output nodes; on any error remove what was added and re-raise."""
        scene = request.input_node.GetScene()
        metadata = request.bundle.metadata
        base = request.input_node.GetName()
        prediction = computation.prediction
        with NodeTransaction(scene):
            segmentation = add_segmentation(scene, request.input_node, prediction.labels, metadata.class_names,
                                            metadata.class_colors, f"{base} CalibSeg segmentation",
                                            metadata.class_terminology)
            confidence = add_overlay(scene, request.input_node, prediction.confidence, f"{base} confidence", "viridis")
            uncertainty = add_overlay(scene, request.input_node, prediction.entropy, f"{base} uncertainty", "inferno")
            show_hot_spots(uncertainty, request.hot_spot_level)
            if request.low_confidence_threshold is not None:
                set_low_confidence_segment(segmentation, request.input_node, prediction.confidence,
                                           request.low_confidence_threshold)
            measured = None if computation.evaluation is None else computation.evaluation.segmentation["dice"]
            quality = add_quality_table(scene, f"{base} CalibSeg quality", computation.summary, measured)
            outputs = CalibSegOutputs(segmentation, confidence, uncertainty, quality, computation.summary)
            if computation.evaluation is not None:
                rows = metrics_rows(computation.evaluation, metadata.class_names)
                outputs.metrics = {label: value for label, value, _ in rows}
                outputs.metrics_table = add_metrics_table(scene, f"{base} CalibSeg metrics", rows)
                outputs.reliability_chart = add_reliability_plot(
                    scene, f"{base} reliability", computation.evaluation.statistics.reliability())
        return outputs

    def run(self, inputVolumeNode, bundlePath, referenceNode=None, device: str = "auto",
            lowConfidenceThreshold: float | None = None, progress: Callable[[float], None] | None = None,
            cancel: threading.Event | None = None, hotSpotLevel: float | None = None) -> CalibSegOutputs:
        """Prepare, compute and publish in the calling thread (Python console, tests)."""
        request = self.prepare(inputVolumeNode, bundlePath, referenceNode, device, lowConfidenceThreshold,
                               hotSpotLevel)
        return self.publish(request, self.compute(request, progress, cancel))

    @staticmethod
    def updateLowConfidence(outputs: CalibSegOutputs, inputVolumeNode, threshold: float) -> None:
        """Recompute the 'low confidence' segment for a new threshold in [0, 1] (the widget's slider).

        Raises:
            ValueError: ``threshold`` is not a number in [0, 1] (NaN included); nothing changes then.
        """
        import slicer.util

        threshold = _checked_threshold(threshold)
        confidence = np.array(slicer.util.arrayFromVolume(outputs.confidence))
        set_low_confidence_segment(outputs.segmentation, inputVolumeNode, confidence, threshold)

    @staticmethod
    def setHotSpotLevel(outputs: CalibSegOutputs, level: float) -> None:
        """Show the uncertainty overlay from another normalised-entropy level on (the widget's slider)."""
        show_hot_spots(outputs.uncertainty, level)

    @staticmethod
    def jumpToSlice(inputVolumeNode, sliceIndex: int, sliceAxis: int = 0) -> np.ndarray:
        """Centre every slice view of the scene on the middle of slice ``sliceIndex`` of the input
        (along array axis ``sliceAxis``, as ``summary["uncertain_slices"]`` counts); returns that
        point in RAS (mm)."""
        ras = slice_center_ras(inputVolumeNode, int(sliceIndex), int(sliceAxis))
        slice_nodes = inputVolumeNode.GetScene().GetNodesByClass("vtkMRMLSliceNode")
        for index in range(slice_nodes.GetNumberOfItems()):
            slice_nodes.GetItemAsObject(index).JumpSliceByCentering(*ras)
        return ras
