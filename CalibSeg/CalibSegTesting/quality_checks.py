"""What tells the user where to look: the quality table (with and without a reference, the network's feature
distance), the review text, the low-confidence segment, the uncertainty's hot spots and the jump to a slice."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from CalibSegRunner import SegmentationRunner, input_and_review_text
from CalibSegRunner.nodes import LOW_CONFIDENCE_SEGMENT

from .scene import (NUM_CLASSES, SPACING_XYZ, class_segment_id, hand_made_quality_model, ijk_to_ras, make_volume_node,
                    phantom, scene_is_unchanged_after, table_columns, tiny_bundle)

__all__ = ["check_low_confidence_segment_follows_the_threshold",
           "check_quality_table_without_a_reference_shows_the_summary",
           "check_quality_table_gives_the_network_feature_distance", "check_review_text_names_what_to_check",
           "check_quality_table_with_a_reference_puts_measured_beside_predicted_dice",
           "check_uncertainty_is_shown_only_at_its_hot_spots", "check_jump_to_slice_centres_every_slice_view"]


def check_low_confidence_segment_follows_the_threshold(scene, work_dir: Path) -> None:
    import slicer

    image, _ = phantom()
    volume = make_volume_node(scene, image)
    runner = SegmentationRunner()
    outputs = runner.run(volume, tiny_bundle(work_dir), lowConfidenceThreshold=0.6)
    confidence = slicer.util.arrayFromVolume(outputs.confidence)
    segmentation = outputs.segmentation.GetSegmentation()
    # the input (the console), then the confidence volume on its grid (the widget, which may show a batch's case)
    for threshold, grid in ((0.6, None), (0.9, volume), (0.75, outputs.confidence)):
        if grid is not None:
            runner.updateLowConfidence(outputs, grid, threshold)
        segment_id = segmentation.GetSegmentIdBySegmentName(LOW_CONFIDENCE_SEGMENT)
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation, segment_id, volume)
        np.testing.assert_array_equal(mask > 0, confidence < threshold)
    assert segmentation.GetNumberOfSegments() == NUM_CLASSES  # replaced, not added again


def check_quality_table_without_a_reference_shows_the_summary(scene, work_dir: Path) -> None:
    from CalibSegLib.bundle import load_bundle
    from CalibSegLib.inference import Predictor
    from CalibSegLib.quality import quality_summary

    image, _ = phantom()
    volume = make_volume_node(scene, image)
    spacing = tuple(reversed(SPACING_XYZ))
    for bundle_path in (tiny_bundle(work_dir, quality_model=hand_made_quality_model()), tiny_bundle(work_dir)):
        outputs = SegmentationRunner().run(volume, bundle_path)
        assert outputs.metrics_table is None and outputs.quality_table.IsA("vtkMRMLTableNode")
        metadata = load_bundle(bundle_path).metadata
        expected = quality_summary(Predictor(bundle_path, device="cpu").predict(image, spacing), spacing, metadata)
        assert {key: value for key, value in outputs.summary.items() if key != "input_check"} == expected
        columns = table_columns(outputs.quality_table)
        assert list(columns) == ["Structure", "Review", "Predicted Dice", "Interval low", "Interval high",
                                 "Volume (mL)", "Mean confidence", "Mean entropy", "Low-confidence fraction"]
        assert columns["Structure"] == ["input check"] + list(metadata.class_names[1:])
        assert columns["Review"][0].startswith("input not checked") and math.isnan(columns["Predicted Dice"][0])
        assert outputs.summary["input_check"]["suitable"] is None
        columns = {title: values[1:] for title, values in columns.items()}
        for row, entry in enumerate(expected["structures"].values()):
            marker = {True: "REVIEW", False: "ok", None: "no quality model"}[entry["review"]]
            assert columns["Review"][row] == marker
            np.testing.assert_allclose(columns["Volume (mL)"][row], entry["volume_ml"], rtol=1e-12)
            predicted = math.nan if entry["predicted_dice"] is None else entry["predicted_dice"]
            np.testing.assert_allclose(columns["Predicted Dice"][row], predicted, rtol=1e-12)
        if metadata.quality_model is not None:
            assert columns["Review"][0] == "REVIEW" and columns["Predicted Dice"][0] == 0.5
            assert input_and_review_text(outputs.summary).startswith("Review: class 1 (predicted Dice 0.50)")
        else:
            assert all(marker in ("no quality model", "REVIEW") for marker in columns["Review"])


def check_quality_table_gives_the_network_feature_distance(scene, work_dir: Path) -> None:
    """A bundle storing its network's feature statistics (fitted on phantoms with the public API): the quality
    table's input-check row gives a volume's distance against the threshold, and a contrast-inverted volume is
    unlike the training images to the network."""
    from types import SimpleNamespace

    from CalibSegLib.bundle import load_bundle
    from CalibSegLib.features import feature_distance, fit_network_features
    from CalibSegLib.input_check import statistics_of_cases

    spacing = tuple(reversed(SPACING_XYZ))
    cases = [SimpleNamespace(image=image, label=labels, spacing=spacing)
             for image, labels in (phantom(seed=seed) for seed in range(12))]
    plain = load_bundle(tiny_bundle(work_dir))
    network = plain.build_model()
    features = fit_network_features(network, plain.metadata, cases[:8], cases[8:])
    statistics = statistics_of_cases(plain.metadata, cases[:8], features=features)
    path = tiny_bundle(work_dir, input_statistics=statistics)
    image, _ = phantom(seed=12)
    sentences = ("network features: distance {:.3g}, like the training images the network saw",
                 "Unlike the training images the network saw: feature distance {:.3g}, above all 4")
    for array, sentence in zip((image, image.max() + image.min() - image), sentences):
        outputs = SegmentationRunner().run(make_volume_node(scene, array), path)
        check = outputs.summary["input_check"]["features"]
        expected = feature_distance(network, load_bundle(path).metadata, array, spacing)
        assert math.isclose(check["distance"], expected, rel_tol=1e-5), (check, expected)
        assert check["threshold"] == features.threshold and check["validation_volumes"] == 4
        review = table_columns(outputs.quality_table)["Review"][0]
        assert sentence.format(expected) in review, review


def check_review_text_names_what_to_check(scene, work_dir: Path) -> None:
    def summary(*entries, model=True):
        structures = {f"class {index}": {"review": review, "predicted_dice": dice}
                      for index, (review, dice) in enumerate(entries, start=1)}
        flags = [review for review, _ in entries]
        case = True if True in flags else (None if None in flags else False)
        return {"structures": structures, "review": case, "quality_model": {"review_below": 0.8} if model else None}

    assert input_and_review_text(summary((True, 0.612), (False, 0.9), (True, None))) == \
        "Review: class 1 (predicted Dice 0.61), class 3 (predicted nowhere)."
    assert input_and_review_text(summary((False, 0.85), (False, 0.9))) == \
        "No structure flagged: every predicted Dice is 0.80 or more."
    assert input_and_review_text(summary((None, None), (None, None), model=False)).startswith(
        "This bundle has no quality model")
    unsuitable = {**summary((False, 0.85)), "input_check": {"suitable": False, "reasons": ["No class 2 was found."]}}
    assert input_and_review_text(unsuitable) == (
        "INPUT UNSUITABLE: unlike the model's training volumes, so no Dice here can be trusted. No class 2 "
        "was found. No structure flagged: every predicted Dice is 0.80 or more.")


def check_quality_table_with_a_reference_puts_measured_beside_predicted_dice(scene, work_dir: Path) -> None:
    from CalibSegLib.metrics import dice

    image, labels = phantom()
    volume = make_volume_node(scene, image)
    reference = make_volume_node(scene, labels, "reference", "vtkMRMLLabelMapVolumeNode")
    outputs = SegmentationRunner().run(volume, tiny_bundle(work_dir, quality_model=hand_made_quality_model()),
                                       referenceNode=reference)
    columns = table_columns(outputs.quality_table)
    titles = list(columns)
    assert titles[titles.index("Predicted Dice") + 1] == "Measured Dice"
    predicted_labels = np.zeros(image.shape, np.int64)
    import slicer

    for label in range(1, NUM_CLASSES):
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation,
                                                          class_segment_id(outputs.segmentation, label), volume)
        predicted_labels[mask > 0] = label
    assert math.isnan(columns["Measured Dice"][0])  # the input check's row
    np.testing.assert_allclose(columns["Measured Dice"][1:],
                               dice(predicted_labels, labels.astype(np.int64), NUM_CLASSES))
    assert outputs.metrics_table is not None  # the calibration metrics stay in their own table


def check_uncertainty_is_shown_only_at_its_hot_spots(scene, work_dir: Path) -> None:
    from CalibSegLib.quality import HOT_SPOT_LEVEL

    image, _ = phantom()
    volume = make_volume_node(scene, image)
    runner = SegmentationRunner()
    display = runner.run(volume, tiny_bundle(work_dir)).uncertainty.GetDisplayNode()
    assert display.GetApplyThreshold() and display.GetLowerThreshold() == HOT_SPOT_LEVEL
    assert display.GetUpperThreshold() == 1.0
    outputs = runner.run(volume, tiny_bundle(work_dir), hotSpotLevel=0.7)
    assert outputs.uncertainty.GetDisplayNode().GetLowerThreshold() == 0.7
    import slicer

    from CalibSegLib.quality import uncertain_slices

    # the slice list is ranked at the run's level, where the overlay shows
    entropy = slicer.util.arrayFromVolume(outputs.uncertainty)
    assert outputs.summary["hot_spot_level"] == 0.7
    assert outputs.summary["uncertain_slices"] == uncertain_slices(entropy, 0, 0.7)
    runner.setHotSpotLevel(outputs, 0.25)
    assert outputs.uncertainty.GetDisplayNode().GetLowerThreshold() == 0.25
    # the colour scale stays the fixed 0–1 one: a hot spot's colour means the same value on every case
    assert (outputs.uncertainty.GetDisplayNode().GetWindow(),
            outputs.uncertainty.GetDisplayNode().GetLevel()) == (1.0, 0.5)


def check_jump_to_slice_centres_every_slice_view(scene, work_dir: Path) -> None:
    import slicer

    image, _ = phantom()
    volume = make_volume_node(scene, image)
    outputs = SegmentationRunner().run(volume, tiny_bundle(work_dir))
    views = []
    for name, normal, transverse in (("Red", (0, 0, 1), (1, 0, 0)), ("Green", (0, 1, 0), (1, 0, 0))):
        node = slicer.vtkMRMLSliceNode()
        node.SetLayoutName(name)
        scene.AddNode(node)
        node.SetSliceToRASByNTP(*normal, *transverse, 0, 0, 0, 0)
        views.append(node)
    slices = outputs.summary["uncertain_slices"]
    index = slices[0] if slices else 2
    ras = SegmentationRunner.jumpToSlice(volume, index, outputs.summary["slice_axis"])
    k_size, j_size, i_size = image.shape
    expected = ijk_to_ras(volume) @ np.array([(i_size - 1) / 2, (j_size - 1) / 2, index, 1.0])
    np.testing.assert_allclose(ras, expected[:3], atol=1e-9)
    for node in views:
        slice_to_ras = node.GetSliceToRAS()
        np.testing.assert_allclose([slice_to_ras.GetElement(row, 3) for row in range(3)], ras, atol=1e-6)
    error = scene_is_unchanged_after(scene, lambda: SegmentationRunner.jumpToSlice(volume, image.shape[0], 0),
                                      "a slice outside the volume")
    assert "outside the volume" in error, error
