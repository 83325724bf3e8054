"""A run with a reference: its metrics table equals CalibSegLib's, its reliability plot, and a reference given as a
segmentation."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from CalibSegRunner import SegmentationRunner

from .scene import NUM_CLASSES, SPACING_XYZ, make_volume_node, phantom, tiny_bundle

__all__ = ["check_metrics_table_equals_calibseglib", "check_reliability_plot_shows_accuracy_diagonal_and_histogram",
           "check_reference_segmentation_node_is_accepted"]


def check_metrics_table_equals_calibseglib(scene, work_dir: Path) -> None:
    from CalibSegLib.inference import Predictor
    from CalibSegLib.metrics import asd, brier, cece, dice, ece, hd95, nll, tace

    image, labels = phantom()
    reference = labels.copy()
    reference[:, :20, :] = np.where(reference[:, :20, :] > 0, 1, 0)  # disagree with the truth in one half
    volume = make_volume_node(scene, image)
    reference_node = make_volume_node(scene, reference, "reference", "vtkMRMLLabelMapVolumeNode")
    bundle_path = tiny_bundle(work_dir)
    outputs = SegmentationRunner().run(volume, bundle_path, referenceNode=reference_node)

    spacing = tuple(reversed(SPACING_XYZ))
    prediction = Predictor(bundle_path, device="cpu").predict(image, spacing, keep_probabilities=True)
    target = reference.astype(np.int64)
    probabilities = prediction.probabilities  # (C, k, j, i)
    independent = {"ECE": ece(probabilities, target), "CECE": cece(probabilities, target),
                   "TACE": tace(probabilities, target), "Brier": brier(probabilities, target),
                   "NLL": nll(probabilities, target)}
    for metric, label in ((dice, "Dice"), (hd95, "HD95"), (asd, "ASD")):
        arguments = (prediction.labels, target, NUM_CLASSES) + (() if metric is dice else (spacing,))
        for name, value in zip([f"class {index}" for index in range(1, NUM_CLASSES)], metric(*arguments)):
            independent[f"{label} {name}"] = value

    table = outputs.metrics_table.GetTable()
    rows = {table.GetValueByName(row, "Metric").ToString(): table.GetValueByName(row, "Value").ToDouble()
            for row in range(table.GetNumberOfRows())}
    for label, value in independent.items():
        np.testing.assert_allclose(rows[label], value, rtol=1e-6, atol=1e-9, err_msg=label)
    assert table.GetValueByName(0, "Unit").ToString() == "" and rows.keys() >= {"HD95 mean", "ASD mean"}


def check_reliability_plot_shows_accuracy_diagonal_and_histogram(scene, work_dir: Path) -> None:
    image, labels = phantom()
    volume = make_volume_node(scene, image)
    reference = make_volume_node(scene, labels, "reference", "vtkMRMLLabelMapVolumeNode")
    chart = SegmentationRunner().run(volume, tiny_bundle(work_dir), referenceNode=reference).reliability_chart
    assert chart.IsA("vtkMRMLPlotChartNode") and chart.GetNumberOfPlotSeriesNodes() == 3
    series = [chart.GetNthPlotSeriesNode(index) for index in range(3)]
    assert [node.GetYColumnName() for node in series] == ["accuracy", "perfect calibration", "fraction of voxels"]
    table = series[0].GetTableNode().GetTable()
    fractions = [table.GetValueByName(row, "fraction of voxels").ToDouble() for row in range(table.GetNumberOfRows())]
    assert table.GetNumberOfRows() == 15 and abs(sum(fractions) - 1.0) < 1e-9


def check_reference_segmentation_node_is_accepted(scene, work_dir: Path) -> None:
    """A reference given as a segmentation maps segments to classes by name, giving the labelmap's numbers."""
    import slicer

    image, labels = phantom()
    volume = make_volume_node(scene, image)
    labelmap = make_volume_node(scene, labels, "reference labels", "vtkMRMLLabelMapVolumeNode")
    segmentation = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", "reference segmentation")
    slicer.vtkSlicerSegmentationsModuleLogic.ImportLabelmapToSegmentationNode(labelmap, segmentation)
    for index in range(segmentation.GetSegmentation().GetNumberOfSegments()):
        segmentation.GetSegmentation().GetNthSegment(index).SetName(f"class {index + 1}")
    bundle_path = tiny_bundle(work_dir)
    from_labelmap = SegmentationRunner().run(volume, bundle_path, referenceNode=labelmap).metrics
    from_segmentation = SegmentationRunner().run(volume, bundle_path, referenceNode=segmentation).metrics
    assert from_labelmap.keys() == from_segmentation.keys()
    np.testing.assert_allclose(list(from_segmentation.values()), list(from_labelmap.values()), rtol=1e-9)
