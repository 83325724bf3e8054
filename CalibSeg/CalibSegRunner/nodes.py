"""Output MRML nodes: segmentation, confidence/uncertainty overlays with the hot-spot threshold,
quality table, metrics table, reliability plot, and a batch's summary table.

Every function here adds nodes through a :class:`NodeTransaction`, so a failure part-way
removes what was added and the scene is left as it was.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .colors import color_table_node
from .volumes import add_volume_like

__all__ = [
    "NodeTransaction",
    "add_segmentation",
    "add_overlay",
    "show_hot_spots",
    "set_low_confidence_segment",
    "quality_columns",
    "add_quality_table",
    "metrics_rows",
    "add_metrics_table",
    "add_reliability_plot",
    "batch_columns",
    "add_batch_table",
    "add_table",
    "is_calibseg_output",
    "LOW_CONFIDENCE_SEGMENT",
    "OUTPUT_ATTRIBUTE",
]

LOW_CONFIDENCE_SEGMENT = "low confidence"
# Node attribute marking the volumes a run added (saved with the scene), so a batch never segments them again.
OUTPUT_ATTRIBUTE = "CalibSeg.Output"


class NodeTransaction:
    """Collects nodes added to a scene; ``rollback()`` removes them (used on error or cancel)."""

    def __init__(self, scene) -> None:
        self.scene = scene
        self.before = {scene.GetNthNode(i).GetID() for i in range(scene.GetNumberOfNodes())}

    def rollback(self) -> None:
        added = [self.scene.GetNthNode(i) for i in range(self.scene.GetNumberOfNodes())]
        for node in reversed(added):
            if node is not None and node.GetID() not in self.before:
                self.scene.RemoveNode(node)

    def __enter__(self) -> "NodeTransaction":
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        if kind is not None:
            self.rollback()
        return False


def _import_mask(segmentation_node, reference_node, mask: np.ndarray, name: str, color) -> str:
    """Add one segment holding ``mask`` (z, y, x) on ``reference_node``'s grid; an empty mask becomes an empty segment.

    Through a temporary labelmap without display nodes, removed again: ``slicer.util``'s
    ``updateSegmentBinaryLabelmapFromArray`` does the same, but leaves its temporary labelmap's display
    node in the scene.
    """
    import slicer

    segmentation = segmentation_node.GetSegmentation()
    if not mask.any():
        return segmentation.AddEmptySegment(name, name, list(color))
    scene = segmentation_node.GetScene()
    labelmap = scene.AddNewNodeByClass("vtkMRMLLabelMapVolumeNode", scene.GenerateUniqueName("__CalibSeg_mask"))
    try:
        labelmap.CopyOrientation(reference_node)
        slicer.util.updateVolumeFromArray(labelmap, mask.astype(np.uint8))
        before = {segmentation.GetNthSegmentID(i) for i in range(segmentation.GetNumberOfSegments())}
        slicer.vtkSlicerSegmentationsModuleLogic.ImportLabelmapToSegmentationNode(labelmap, segmentation_node)
        added = [segmentation.GetNthSegmentID(i) for i in range(segmentation.GetNumberOfSegments())
                 if segmentation.GetNthSegmentID(i) not in before]
    finally:
        scene.RemoveNode(labelmap)
    segment = segmentation.GetSegment(added[0])
    segment.SetName(name)
    segment.SetColor(*color)
    return added[0]


def add_segmentation(scene, reference_node, labels: np.ndarray, class_names: Sequence[str],
                     class_colors: Sequence[Sequence[float]], name: str, class_terminology: dict | None = None):
    """A segmentation node with one segment per foreground class, named and coloured as in the bundle.

    A class with an entry in ``class_terminology`` (``bundle.json``'s, :mod:`CalibSegLib.terminology`) gets it as
    the segment's ``TerminologyEntry`` tag, so Slicer and DICOM SEG export read its standard codes.
    """
    from CalibSegLib.terminology import parse_class_terminology

    terminology = parse_class_terminology(class_terminology or {}, class_names)
    node = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", scene.GenerateUniqueName(name))
    node.CreateDefaultDisplayNodes()
    node.SetReferenceImageGeometryParameterFromVolumeNode(reference_node)
    for label in range(1, len(class_names)):
        segment_id = _import_mask(node, reference_node, labels == label, class_names[label], class_colors[label])
        if class_names[label] in terminology:
            segment = node.GetSegmentation().GetSegment(segment_id)
            segment.SetTag(segment.GetTerminologyEntryTagName(), terminology[class_names[label]].slicer_string())
    return node


def add_overlay(scene, reference_node, array: np.ndarray, name: str, colormap: str):
    """A float volume on the input grid, coloured with a CalibSeg table over the fixed range [0, 1] and marked
    with :data:`OUTPUT_ATTRIBUTE` (:func:`is_calibseg_output`)."""
    node = add_volume_like(reference_node, array.astype(np.float32), name)
    node.SetAttribute(OUTPUT_ATTRIBUTE, colormap)
    display = node.GetDisplayNode()
    display.SetAndObserveColorNodeID(color_table_node(scene, colormap).GetID())
    display.SetAutoWindowLevel(False)
    display.SetWindowLevelMinMax(0.0, 1.0)  # the same colour means the same value on every case
    return node


def is_calibseg_output(node) -> bool:
    """True for a volume a CalibSeg run added (:func:`add_overlay`), false for the user's own nodes."""
    return node.GetAttribute(OUTPUT_ATTRIBUTE) is not None


def show_hot_spots(overlay_node, level: float) -> None:
    """Show ``overlay_node`` only where its value is at least ``level`` (Slicer's display threshold
    makes the other voxels transparent, so the anatomy under them stays visible)."""
    display = overlay_node.GetDisplayNode()
    display.SetApplyThreshold(1)
    display.SetThreshold(float(level), 1.0)  # normalised entropy never exceeds 1


def set_low_confidence_segment(segmentation_node, reference_node, confidence: np.ndarray, threshold: float) -> str:
    """Replace the 'low confidence' segment with the voxels whose confidence is below ``threshold``."""
    segmentation = segmentation_node.GetSegmentation()
    existing = segmentation.GetSegmentIdBySegmentName(LOW_CONFIDENCE_SEGMENT)
    if existing:
        segmentation.RemoveSegment(existing)
    return _import_mask(segmentation_node, reference_node, confidence < threshold, LOW_CONFIDENCE_SEGMENT,
                        (1.0, 1.0, 0.0))


def add_table(scene, name: str, columns: dict[str, list]):
    """A table node with one column per entry, text or numbers. Filled here: ``slicer.util.updateTableFromArray``
    takes NumPy arrays of numbers only (Slicer 5.6 and older also store them as float32)."""
    import vtk

    node = scene.AddNewNodeByClass("vtkMRMLTableNode", scene.GenerateUniqueName(name))
    table = node.GetTable()
    for title, values in columns.items():
        column = vtk.vtkStringArray() if isinstance(values[0], str) else vtk.vtkDoubleArray()
        column.SetName(title)
        for value in values:
            column.InsertNextValue(value)
        table.AddColumn(column)
    node.Modified()
    return node


# Review column of the quality table: flagged, not flagged, or unknown (a bundle without a quality model).
REVIEW_MARKERS = {True: "REVIEW", False: "ok", None: "no quality model"}
# (column title, key of a summary's structure entry); interval ends are entries of "predicted_dice_interval".
QUALITY_COLUMNS = (("Predicted Dice", "predicted_dice"), ("Interval low", 0), ("Interval high", 1),
                   ("Volume (mL)", "volume_ml"), ("Mean confidence", "mean_confidence"),
                   ("Mean entropy", "mean_entropy"), ("Low-confidence fraction", "low_confidence_fraction"))


def quality_columns(summary: dict, measured_dice: Sequence[float] | None = None) -> dict[str, list]:
    """Columns of the quality table, one row per structure of a :func:`CalibSegLib.quality.quality_summary`.

    A first row, ``input check``, carries the summary's ``input_check`` in its Review cell
    (:func:`CalibSegLib.input_check.input_check_lines`, numbers NaN). Structure and Review
    (:data:`REVIEW_MARKERS`) as text, then the numbers (NaN where the summary has null); with
    ``measured_dice`` (``(C-1,)``, from a reference) a Measured Dice column follows the predicted one.
    """
    from CalibSegLib.input_check import input_check_lines
    from CalibSegLib.quality.model import MEAN_DISAGREEMENT

    entries = list(summary["structures"].values())

    def number(entry: dict, key) -> float:
        interval = entry["predicted_dice_interval"] or [None, None]
        value = entry[key] if isinstance(key, str) else interval[key]
        return math.nan if value is None else float(value)

    # The input check comes first, above any Dice: its row says whether the image is like the training images.
    columns: dict[str, list] = {"Structure": ["input check"] + list(summary["structures"]),
                                "Review": [" ".join(input_check_lines(summary["input_check"]))]
                                + [REVIEW_MARKERS[entry["review"]] for entry in entries]}
    for title, key in QUALITY_COLUMNS:
        columns[title] = [math.nan] + [number(entry, key) for entry in entries]
        if key == "predicted_dice" and measured_dice is not None:
            columns["Measured Dice"] = [math.nan] + [float(value) for value in measured_dice]
    if any(MEAN_DISAGREEMENT in entry for entry in entries):  # an ensemble bundle's run
        columns["Mean disagreement"] = [math.nan] + [float(entry.get(MEAN_DISAGREEMENT, math.nan))
                                                     for entry in entries]
    return columns


def add_quality_table(scene, name: str, summary: dict, measured_dice: Sequence[float] | None = None):
    """A table node with the :func:`quality_columns` of a summary."""
    return add_table(scene, name, quality_columns(summary, measured_dice))


# (key in CaseEvaluation.segmentation, label, unit); one row per foreground class and the mean.
SEGMENTATION_METRICS = (("dice", "Dice", ""), ("hd95", "HD95", "mm"), ("asd", "ASD", "mm"))
# (key in CaseEvaluation.calibration / .confidence, label); over the reference foreground.
CALIBRATION_METRICS = (("ece", "ECE"), ("cece", "CECE"), ("tace", "TACE"), ("brier", "Brier"), ("nll", "NLL"),
                       ("mce", "MCE"), ("error_auroc", "Error-detection AUROC"), ("aurc", "AURC"))
# An ensemble bundle's further rows (a single network's metrics have no such keys).
ENSEMBLE_METRICS = (("disagreement_auroc", "Error-detection AUROC of disagreement"),
                    ("mean_foreground_disagreement", "Mean disagreement in the predicted foreground"))


def metrics_rows(metrics: dict[str, float], class_names: Sequence[str]) -> list[tuple[str, float, str]]:
    """``(label, value, unit)`` rows of one case: Dice/HD95/ASD per class and mean, then calibration.

    ``metrics`` is the case's flat row (:attr:`CalibSegLib.analysis.CaseAnalysis.metrics`, the CLI's and
    evaluate.py's), labelled here for the table; undefined values (e.g. HD95 when only one of the two masks
    is empty) stay NaN.
    """
    from CalibSegLib.quality import structure_key

    rows = []
    for key, label, unit in SEGMENTATION_METRICS:
        rows += [(f"{label} {name}", metrics[f"{key}_{structure_key(name)}"], unit) for name in class_names[1:]]
        rows.append((f"{label} mean", metrics[f"{key}_mean"], unit))
    rows += [(label, metrics[key], "") for key, label in CALIBRATION_METRICS + ENSEMBLE_METRICS if key in metrics]
    return rows


def add_metrics_table(scene, name: str, rows: Sequence[tuple[str, float, str]]):
    """A table node with columns Metric, Value and Unit, one row per entry of :func:`metrics_rows`."""
    labels, values, units = zip(*rows)
    return add_table(scene, name, {"Metric": list(labels), "Value": [float(v) for v in values], "Unit": list(units)})


def add_reliability_plot(scene, name: str, reliability):
    """A plot chart node: accuracy per confidence bin, the diagonal, and the confidence histogram."""
    centres = (reliability.edges[:-1] + reliability.edges[1:]) / 2
    total = max(float(reliability.counts.sum()), 1.0)
    accuracy = [0.0 if math.isnan(v) else float(v) for v in reliability.accuracy]
    table = add_table(scene, f"{name} data", {
        "confidence": [float(v) for v in centres],
        "accuracy": accuracy,
        "perfect calibration": [float(v) for v in centres],
        "fraction of voxels": [float(v) / total for v in reliability.counts],
    })
    chart = scene.AddNewNodeByClass("vtkMRMLPlotChartNode", scene.GenerateUniqueName(name))
    chart.SetTitle("Reliability diagram")
    chart.SetXAxisTitle("confidence")
    chart.SetYAxisTitle("accuracy / fraction of voxels")
    for column, plot_type, color in (("accuracy", "Bar", (0.2, 0.4, 0.8)), ("perfect calibration", "Line", (0, 0, 0)),
                                     ("fraction of voxels", "Line", (0.9, 0.5, 0.1))):
        series = scene.AddNewNodeByClass("vtkMRMLPlotSeriesNode", scene.GenerateUniqueName(f"{name} {column}"))
        series.SetAndObserveTableNodeID(table.GetID())
        series.SetXColumnName("confidence")
        series.SetYColumnName(column)
        series.SetPlotType(getattr(series, f"PlotType{plot_type}"))
        series.SetColor(*color)
        chart.AddAndObservePlotSeriesNodeID(series.GetID())
    return chart


# Text columns of a batch row (CalibSegLib.predict.batch_row); every other column is a number.
BATCH_TEXT_COLUMNS = ("case", "status", "input_check")


def batch_columns(rows: Sequence[dict]) -> dict[str, list]:
    """Columns of a batch's summary table, one row per case: every key of
    :func:`CalibSegLib.predict.batch_row`'s rows in their order (as ``predictions.csv`` has them): case, status and
    input check as text, the review flag as :data:`REVIEW_MARKERS` text (both empty for a case that was not
    segmented), the numbers NaN where a case has none (it failed, or its summary holds null)."""
    keys = list(dict.fromkeys(key for row in rows for key in row))
    columns: dict[str, list] = {}
    for key in keys:
        if key in BATCH_TEXT_COLUMNS:
            columns[key] = [str(row.get(key, "")) for row in rows]  # a failed case has no input check
        elif key == "review":
            columns[key] = [REVIEW_MARKERS[row[key]] if key in row else "" for row in rows]
        else:
            columns[key] = [math.nan if row.get(key) is None else float(row[key]) for row in rows]
    return columns


def add_batch_table(scene, name: str, rows: Sequence[dict]):
    """A table node with the :func:`batch_columns` of a batch's rows."""
    return add_table(scene, name, batch_columns(rows))
