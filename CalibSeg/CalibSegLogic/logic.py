"""CalibSegLogic: run a bundle on a volume node and publish the results as MRML nodes.

Callable from Slicer's Python console with explicit arguments::

    from CalibSegLogic import CalibSegLogic
    outputs = CalibSegLogic().run(slicer.util.getNode("patient016_frame01"), "/path/model.calibseg",
                                  referenceNode=slicer.util.getNode("patient016_frame01 reference"))

Work is split so the GUI never freezes: :meth:`CalibSegLogic.prepare` reads the scene (main
thread), :meth:`CalibSegLogic.compute` runs the network and the metrics on arrays only (any
thread, see :class:`~CalibSegLogic.job.InferenceJob`), and
:meth:`CalibSegLogic.publish` adds all output nodes at once (main thread), removing them
again if anything fails — so an error or a cancel leaves the scene as it was.
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
    add_reliability_plot,
    add_segmentation,
    metrics_rows,
    set_low_confidence_segment,
)
from .volumes import reference_label_array, volume_array, volume_spacing

__all__ = ["CalibSegRequest", "CalibSegComputation", "CalibSegOutputs", "CalibSegLogic"]


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


@dataclass
class CalibSegComputation:
    """Arrays and metrics computed off the main thread (no MRML)."""

    prediction: object
    evaluation: object | None = None


@dataclass
class CalibSegOutputs:
    """The nodes one run added to the scene."""

    segmentation: object
    confidence: object
    uncertainty: object
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


class CalibSegLogic:
    """Qt-free logic of the CalibSeg module."""

    def prepare(self, inputVolumeNode, bundlePath, referenceNode=None, device: str = "auto",
                lowConfidenceThreshold: float | None = None) -> CalibSegRequest:
        """Read and check everything the run needs from the scene; raises ValueError with one sentence.

        ``bundlePath`` is a ``.calibseg`` file or a shipped model's name (e.g. ``"acdc_crac"``);
        ``lowConfidenceThreshold`` None or a confidence in [0, 1].
        """
        from CalibSegLib.bundle import load_bundle
        from CalibSegLib.pretrained import resolve_bundle_path

        lowConfidenceThreshold = _checked_threshold(lowConfidenceThreshold)
        if not bundlePath:
            raise ValueError("Choose a model bundle (.calibseg file).")
        bundle = load_bundle(resolve_bundle_path(bundlePath))
        image = volume_array(inputVolumeNode)
        reference = None
        if referenceNode is not None:
            reference = reference_label_array(referenceNode, inputVolumeNode, bundle.metadata.class_names)
        return CalibSegRequest(inputVolumeNode, bundle, image, volume_spacing(inputVolumeNode), referenceNode,
                               reference, device, lowConfidenceThreshold)

    def compute(self, request: CalibSegRequest, progress: Callable[[float], None] | None = None,
                cancel: threading.Event | None = None) -> CalibSegComputation:
        """Run the network (and the metrics when there is a reference); touches no MRML node."""
        from CalibSegLib.evaluation import predict_and_evaluate
        from CalibSegLib.inference import Predictor

        predictor = Predictor(request.bundle, device=request.device)
        if request.reference is None:
            prediction = predictor.predict(request.image, request.spacing, progress=progress, cancel=cancel)
            return CalibSegComputation(prediction)
        evaluation = predict_and_evaluate(predictor, request.image, request.reference, request.spacing,
                                          progress=progress, cancel=cancel)
        return CalibSegComputation(evaluation.prediction, evaluation)

    def publish(self, request: CalibSegRequest, computation: CalibSegComputation) -> CalibSegOutputs:
        """Add the output nodes; on any error remove what was added and re-raise."""
        scene = request.input_node.GetScene()
        metadata = request.bundle.metadata
        base = request.input_node.GetName()
        prediction = computation.prediction
        with NodeTransaction(scene):
            segmentation = add_segmentation(scene, request.input_node, prediction.labels, metadata.class_names,
                                            metadata.class_colors, f"{base} CalibSeg segmentation")
            confidence = add_overlay(scene, request.input_node, prediction.confidence, f"{base} confidence", "viridis")
            uncertainty = add_overlay(scene, request.input_node, prediction.entropy, f"{base} uncertainty", "inferno")
            if request.low_confidence_threshold is not None:
                set_low_confidence_segment(segmentation, request.input_node, prediction.confidence,
                                           request.low_confidence_threshold)
            outputs = CalibSegOutputs(segmentation, confidence, uncertainty)
            if computation.evaluation is not None:
                rows = metrics_rows(computation.evaluation, metadata.class_names)
                outputs.metrics = {label: value for label, value, _ in rows}
                outputs.metrics_table = add_metrics_table(scene, f"{base} CalibSeg metrics", rows)
                outputs.reliability_chart = add_reliability_plot(
                    scene, f"{base} reliability", computation.evaluation.statistics.reliability())
        return outputs

    def run(self, inputVolumeNode, bundlePath, referenceNode=None, device: str = "auto",
            lowConfidenceThreshold: float | None = None, progress: Callable[[float], None] | None = None,
            cancel: threading.Event | None = None) -> CalibSegOutputs:
        """Prepare, compute and publish in the calling thread (Python console, tests)."""
        request = self.prepare(inputVolumeNode, bundlePath, referenceNode, device, lowConfidenceThreshold)
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
