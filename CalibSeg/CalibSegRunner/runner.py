"""SegmentationRunner: run a bundle on a volume node and publish the results as MRML nodes, without Qt.

The module's ``CalibSegLogic`` (``CalibSeg.py``) hands every run to it; without the GUI::

    from CalibSegRunner import SegmentationRunner
    outputs = SegmentationRunner().run(slicer.util.getNode("patient016_frame01"), "/path/model.calibseg",
                                       referenceNode=slicer.util.getNode("patient016_frame01 reference"))

Work is split so the GUI never freezes: :meth:`SegmentationRunner.prepare` reads the scene (main
thread; :meth:`~SegmentationRunner.settings`, what runs share, then :meth:`~SegmentationRunner.request`, one
input's arrays), :meth:`SegmentationRunner.compute` runs the network, the quality summary and the metrics
on arrays only (any thread, see :class:`~CalibSegRunner.job.InferenceJob`), and
:meth:`SegmentationRunner.publish` adds all output nodes at once (main thread), removing them
again if anything fails — so an error or a cancel leaves the scene as it was.

Preparing and publishing read the bundle's metadata alone (:func:`CalibSegLib.bundle.read_metadata`: classes,
colours, channels, terminology); the weights are read where the network runs, once per run: by
:meth:`SegmentationRunner.compute` in the calling thread, or by the inference child of a background job.

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
from typing import TYPE_CHECKING, Callable

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
from .volumes import reference_label_array, same_grid, slice_center_ras, volume_array, volume_spacing

if TYPE_CHECKING:  # the library's dependencies may not be installed when the module loads
    from pathlib import Path

    from CalibSegLib.analysis import CaseAnalysis
    from CalibSegLib.bundle import BundleMetadata

__all__ = ["RunSettings", "CalibSegRequest", "CalibSegOutputs", "SegmentationRunner", "input_and_review_text",
           "channel_choice_problem"]


@dataclass(frozen=True)
class RunSettings:
    """What every run with the same choices shares, checked once by :meth:`SegmentationRunner.settings`."""

    bundle_path: "Path"  # the .calibseg file (a shipped model's name resolved)
    metadata: "BundleMetadata"  # its checked bundle.json, read once without the weights
    device: str
    low_confidence_threshold: float | None
    hot_spot_level: float  # CalibSegLib.quality.HOT_SPOT_LEVEL unless chosen


@dataclass
class CalibSegRequest:
    """What to run: arrays read from the scene plus the user's choices."""

    input_node: object
    bundle_path: "Path"  # the .calibseg file whose weights the run reads
    metadata: "BundleMetadata"  # its checked bundle.json, read once by settings()
    image: np.ndarray
    spacing: tuple[float, float, float]
    reference_node: object | None = None
    reference: np.ndarray | None = None
    device: str = "auto"
    low_confidence_threshold: float | None = None
    hot_spot_level: float | None = None  # set by prepare(): CalibSegLib.quality.HOT_SPOT_LEVEL unless chosen
    output_name: str | None = None  # what the output nodes are named after (default: the input volume's name)


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
    disagreement: object | None = None  # an ensemble bundle's: its members' disagreement (magma, [0, 1])


def _checked_fraction(value: float | None, what: str) -> float | None:
    """``value`` as a float in [0, 1] (None stays None); ValueError with one sentence naming ``what`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        # ``not 0 <= nan <= 1`` is True, so NaN is refused here too.
        raise ValueError(f"The {what} must be a number in [0, 1], got {value!r}.")
    return float(value)


def _checked_whole(value: int, what: str) -> int:
    """``value`` as an int when it is a whole number (NumPy integers too, never bool, float or text);
    ValueError with one sentence naming ``what`` otherwise, rather than truncating 2.7 to 2."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"The {what} must be a whole number, got {value!r}.")
    return int(value)


_SLICE_AXES = (0, 1, 2)  # array axes (z, y, x) of a volume


def channel_choice_problem(chosen, channelNames, changed: int | None = None) -> str | None:
    """Why the volumes chosen for a bundle's channels cannot all be used, or None: ``chosen[k]`` is the volume
    picked for ``channelNames[k]`` (the input selector's first, None where nothing is picked yet); one volume
    picked for two channels is refused, naming both. ``changed``: the channel whose volume was just picked,
    the one the sentence refuses (default: the later of the two); the module's selectors call this on every
    pick."""
    from CalibSegLib.channels import first_repeat

    order = [index for index in range(len(chosen)) if index != changed]
    order += [changed] if changed is not None else []
    picked = [(index, chosen[index]) for index in order if chosen[index] is not None]
    repeat = first_repeat([node.GetID() for _, node in picked])
    if repeat is None:
        return None
    (earlier, node), (later, _) = (picked[position] for position in repeat)
    return (f"The volume '{node.GetName()}' is already chosen for the '{channelNames[earlier]}' channel; "
            f"choose another volume for '{channelNames[later]}'.")


def _channel_volumes(inputVolumeNode, channelNodes, channelNames) -> tuple[list, str | None]:
    """The input volume and ``channelNodes`` (a list, or one node) in the bundle's channel order, and the
    case's name when their names carry channel suffixes (``a_0002``, ``a_0000``, ``a_0001``: read as channels
    2, 0, 1, named ``a``), else None (read in the order given); ValueError with one sentence otherwise."""
    from CalibSegLib.channels import channel_order
    from CalibSegLib.io import case_and_channel

    others = [channelNodes] if hasattr(channelNodes, "GetID") else list(channelNodes or ())
    nodes = [inputVolumeNode, *others]
    for name, node in zip(channelNames, nodes):
        if node is None:
            raise ValueError(f"Choose a volume for the model's '{name}' channel.")
    names = [node.GetName() for node in nodes]
    if len(nodes) == len(channelNames):  # another count is channel_order's sentence
        problem = channel_choice_problem(nodes, channelNames)
        if problem:
            raise ValueError(problem)
    order = channel_order(names, channelNames, "volume")
    case, channel = case_and_channel(names[0])
    return [nodes[position] for position in order], case if len(nodes) > 1 and channel is not None else None


def input_and_review_text(summary: dict) -> str:
    """What the reader is told about a quality summary: the input check's warning and reasons when the input
    is unsuitable, then :func:`CalibSegLib.quality.review_sentence` (imported on call: the library's
    dependencies may not be installed when the module loads)."""
    from CalibSegLib.input_check import input_check_lines
    from CalibSegLib.quality import review_sentence

    check = summary.get("input_check")
    warning = input_check_lines(check) if check is not None and check["suitable"] is False else []
    return " ".join([*warning, review_sentence(summary)])


class SegmentationRunner:
    """Runs a bundle on a volume node: prepare (reads the scene), compute (arrays only), publish (adds the
    nodes); also the follow-ups on a run's outputs (low-confidence segment, hot-spot level, jump to a slice)."""

    def settings(self, bundlePath, device: str = "auto", lowConfidenceThreshold: float | None = None,
                 hotSpotLevel: float | None = None) -> RunSettings:
        """Check the choices a run (or every case of a batch) shares and read the bundle's metadata once (not
        its weights: :meth:`compute` or the inference child reads those); raises ValueError (``BundleError``
        among them) with one sentence.

        ``bundlePath`` is a ``.calibseg`` file or a shipped model's name (e.g. ``"acdc_crac"``);
        ``lowConfidenceThreshold`` None or a confidence in [0, 1].
        ``hotSpotLevel`` the normalised entropy from which the uncertainty overlay is shown
        (default :data:`CalibSegLib.quality.HOT_SPOT_LEVEL`).
        """
        from CalibSegLib.bundle import read_metadata
        from CalibSegLib.pretrained import resolve_bundle_path
        from CalibSegLib.quality import HOT_SPOT_LEVEL

        lowConfidenceThreshold = _checked_fraction(lowConfidenceThreshold, "low-confidence threshold")
        hotSpotLevel = _checked_fraction(hotSpotLevel, "hot-spot level")
        if not bundlePath:
            raise ValueError("Choose a model bundle (.calibseg file).")
        path = resolve_bundle_path(bundlePath)
        return RunSettings(path, read_metadata(path), device, lowConfidenceThreshold,
                           HOT_SPOT_LEVEL if hotSpotLevel is None else hotSpotLevel)

    @staticmethod
    def request(inputVolumeNode, settings: RunSettings, referenceNode=None, channelNodes=()) -> CalibSegRequest:
        """Read the input (and reference) arrays from the scene for a run with ``settings``; raises ValueError
        with one sentence (not a 3D scalar volume, a reference off the input's grid, ...).

        A bundle of K input channels (``channel_names``, e.g. T1, T1ce, T2, FLAIR) reads ``inputVolumeNode``
        and ``channelNodes`` (the K - 1 others; one node for K = 2), each on the input's grid: volumes named
        ``<case>_0000`` ... ``_000K`` by their suffixes, whatever the order given (the outputs are then named
        after the case), others in the order given (:func:`CalibSegLib.channels.channel_order`); one volume
        for two channels is refused (:func:`channel_choice_problem`)."""
        from CalibSegLib.channels import input_names

        names = input_names(settings.metadata)
        given = volume_array(inputVolumeNode)  # first: its sentence for no volume, or one not a 3D scalar
        nodes, case = _channel_volumes(inputVolumeNode, channelNodes, names)
        for name, node in zip(names, nodes):
            if node is not inputVolumeNode and not same_grid(node, inputVolumeNode):
                raise ValueError(f"The '{name}' volume '{node.GetName()}' is not on the grid of "
                                 f"'{inputVolumeNode.GetName()}'; resample it onto the first channel's volume first.")
        arrays = [given if node is inputVolumeNode else volume_array(node) for node in nodes]
        image = np.stack(arrays) if len(arrays) > 1 else arrays[0]
        reference = None
        if referenceNode is not None:
            reference = reference_label_array(referenceNode, inputVolumeNode, settings.metadata.class_names)
        return CalibSegRequest(inputVolumeNode, settings.bundle_path, settings.metadata, image,
                               volume_spacing(inputVolumeNode), referenceNode, reference, settings.device,
                               settings.low_confidence_threshold, settings.hot_spot_level, output_name=case)

    def prepare(self, inputVolumeNode, bundlePath, referenceNode=None, device: str = "auto",
                lowConfidenceThreshold: float | None = None,
                hotSpotLevel: float | None = None, channelNodes=()) -> CalibSegRequest:
        """Read and check everything the run needs from the scene (:meth:`settings`, then :meth:`request`);
        raises ValueError with one sentence, nothing added."""
        return self.request(inputVolumeNode, self.settings(bundlePath, device, lowConfidenceThreshold, hotSpotLevel),
                            referenceNode, channelNodes)

    def compute(self, request: CalibSegRequest, progress: Callable[[float], None] | None = None,
                cancel: threading.Event | None = None) -> "CaseAnalysis":
        """Read the bundle's weights, then run the network, the quality summary and, with a reference, the
        metrics (one :func:`CalibSegLib.analysis.analyse_case`); touches no MRML node."""
        from CalibSegLib.analysis import analyse_case
        from CalibSegLib.inference import Predictor

        predictor = Predictor(request.bundle_path, device=request.device)
        # Slices are ranked at the run's hot-spot level, so the list points where the overlay shows.
        analysis = analyse_case(predictor, request.image, request.spacing, request.reference, progress=progress,
                                cancel=cancel, hot_spot_level=request.hot_spot_level)
        return analysis

    def publish(self, request: CalibSegRequest, analysis: "CaseAnalysis") -> CalibSegOutputs:
        """Add the output nodes of ``analysis`` (from :meth:`compute` or a child process); on any error remove
        what was added and re-raise."""
        from CalibSegLib.quality import structure_key

        scene = request.input_node.GetScene()
        if scene is None:  # the user deleted the input while its inference ran
            raise ValueError(f"The volume '{request.input_node.GetName()}' was removed from the scene before its "
                             "results were added; nothing was added.")
        metadata = request.metadata
        base = request.output_name or request.input_node.GetName()
        prediction = analysis.prediction
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
            metrics = analysis.metrics
            measured = None if metrics is None else [metrics[f"dice_{structure_key(name)}"]
                                                     for name in metadata.class_names[1:]]
            quality = add_quality_table(scene, f"{base} CalibSeg quality", analysis.summary, measured)
            outputs = CalibSegOutputs(segmentation, confidence, uncertainty, quality, analysis.summary)
            if prediction.disagreement is not None:
                outputs.disagreement = add_overlay(scene, request.input_node, prediction.disagreement,
                                                   f"{base} disagreement", "magma")
            if metrics is not None:
                rows = metrics_rows(metrics, metadata.class_names)
                outputs.metrics = {label: value for label, value, _ in rows}
                outputs.metrics_table = add_metrics_table(scene, f"{base} CalibSeg metrics", rows)
                outputs.reliability_chart = add_reliability_plot(scene, f"{base} reliability",
                                                                 analysis.reliability)
        return outputs

    def run(self, inputVolumeNode, bundlePath, referenceNode=None, device: str = "auto",
            lowConfidenceThreshold: float | None = None, progress: Callable[[float], None] | None = None,
            cancel: threading.Event | None = None, hotSpotLevel: float | None = None,
            channelNodes=()) -> CalibSegOutputs:
        """Prepare, compute and publish in the calling thread (Python console, tests)."""
        request = self.prepare(inputVolumeNode, bundlePath, referenceNode, device, lowConfidenceThreshold,
                               hotSpotLevel, channelNodes)
        return self.publish(request, self.compute(request, progress, cancel))

    @staticmethod
    def updateLowConfidence(outputs: CalibSegOutputs, inputVolumeNode, threshold: float) -> None:
        """Recompute the 'low confidence' segment for a new threshold in [0, 1] (the widget's slider).

        Raises:
            ValueError: ``threshold`` is not a number in [0, 1] (NaN included); nothing changes then.
        """
        import slicer.util

        threshold = _checked_fraction(threshold, "low-confidence threshold")
        confidence = np.array(slicer.util.arrayFromVolume(outputs.confidence))
        set_low_confidence_segment(outputs.segmentation, inputVolumeNode, confidence, threshold)

    @staticmethod
    def setHotSpotLevel(outputs: CalibSegOutputs, level: float) -> None:
        """Show the uncertainty overlay from another normalised-entropy level on (the widget's slider).

        Raises:
            ValueError: ``level`` is not a number in [0, 1] (NaN included); nothing changes then.
        """
        show_hot_spots(outputs.uncertainty, _checked_fraction(level, "hot-spot level"))

    @staticmethod
    def jumpToSlice(inputVolumeNode, sliceIndex: int, sliceAxis: int = 0) -> np.ndarray:
        """Centre every slice view of the scene on the middle of slice ``sliceIndex`` of the input
        (along array axis ``sliceAxis``, as ``summary["uncertain_slices"]`` counts); returns that
        point in RAS (mm).

        Raises:
            ValueError: the node holds no image data, ``sliceAxis`` is not 0, 1 or 2, or ``sliceIndex`` is not
                a whole number inside the volume along it; no view moves then.
        """
        axis = _checked_whole(sliceAxis, "slice axis")
        if axis not in _SLICE_AXES:
            raise ValueError(f"The slice axis must be 0, 1 or 2 (an array axis of the (z, y, x) volume), got {axis}.")
        ras = slice_center_ras(inputVolumeNode, _checked_whole(sliceIndex, "slice index"), axis)
        slice_nodes = inputVolumeNode.GetScene().GetNodesByClass("vtkMRMLSliceNode")
        for index in range(slice_nodes.GetNumberOfItems()):
            slice_nodes.GetItemAsObject(index).JumpSliceByCentering(*ras)
        return ras
