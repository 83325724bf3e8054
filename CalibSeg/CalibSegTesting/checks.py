"""Checks of the CalibSeg logic against a real MRML scene.

Each check takes ``(scene, work_dir)``: an empty ``vtkMRMLScene`` (``slicer.mrmlScene``
inside Slicer, a fresh scene from the ``slicer-core`` package under pytest) and a writable
folder, builds its own inputs and a tiny deterministic bundle (an untrained UNet, made with
CalibSegLib's public API), and raises ``AssertionError`` when the module misbehaves. ``Testing/test_slicer_module.py`` runs every entry of
:data:`CHECKS` under pytest; ``CalibSegTest`` runs the same list inside Slicer.
"""

from __future__ import annotations

import json
import math
import os
import threading
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from CalibSegRunner import (BatchJob, InferenceJob, SegmentationRunner, batch_volumes, channel_choice_problem,
                            input_and_review_text)
from CalibSegRunner.batch import BATCH_TABLE_NAME, CANCELLED, OK
from CalibSegRunner.nodes import LOW_CONFIDENCE_SEGMENT

__all__ = ["CHECKS", "make_volume_node", "scene_snapshot"]

NUM_CLASSES = 4
# Anisotropic voxels (x, y, z mm, Slicer's order), an off-origin corner and an oblique direction.
SPACING_XYZ = (1.25, 0.8, 6.0)
ORIGIN = (-31.0, 12.5, 40.0)
ANGLE = math.radians(25.0)
DIRECTION = ((math.cos(ANGLE), -math.sin(ANGLE), 0.0), (math.sin(ANGLE), math.cos(ANGLE), 0.0), (0.0, 0.0, -1.0))


def make_volume_node(scene, array: np.ndarray, name: str = "input", class_name: str = "vtkMRMLScalarVolumeNode",
                     spacing=SPACING_XYZ, origin=ORIGIN, direction=DIRECTION):
    """Add a volume node holding ``array`` (k, j, i) with the given spacing (x, y, z), origin and direction rows."""
    import slicer
    import vtk

    node = scene.AddNewNodeByClass(class_name, name)
    slicer.util.updateVolumeFromArray(node, array)
    node.SetSpacing(*spacing)
    node.SetOrigin(*origin)
    matrix = vtk.vtkMatrix4x4()
    for row in range(3):
        for column in range(3):
            matrix.SetElement(row, column, direction[row][column])
    node.SetIJKToRASDirectionMatrix(matrix)
    return node


def _ijk_to_ras(node) -> np.ndarray:
    import vtk

    matrix = vtk.vtkMatrix4x4()
    node.GetIJKToRASMatrix(matrix)
    return np.array([[matrix.GetElement(row, column) for column in range(4)] for row in range(4)])


def scene_snapshot(scene) -> list[tuple[str, str, str, int]]:
    """Every node's ID, class, name and modification time: equal snapshots mean an untouched scene."""
    nodes = [scene.GetNthNode(index) for index in range(scene.GetNumberOfNodes())]
    return [(node.GetID(), node.GetClassName(), node.GetName() or "", node.GetMTime()) for node in nodes]


def _phantom(shape=(6, 48, 40), seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A bright disc ring phantom (k, j, i) and its 4-class label map, so the network output varies in space."""
    rng = np.random.default_rng(seed)
    k, j, i = np.indices(shape)
    radius = np.hypot(j - shape[1] / 2, i - shape[2] / 2)
    labels = np.select([radius < 6, radius < 10, radius < 14], [3, 2, 1], 0).astype(np.uint8)
    image = (labels * 40.0 + rng.normal(0, 10, shape) + k).astype(np.float32)
    return image, labels


def _bundle(work_dir: Path, seed: int = 0, **overrides) -> Path:
    """A tiny untrained UNet bundle of :data:`NUM_CLASSES` classes (``class 1`` ...), the same weights for the same
    ``seed``; ``overrides`` replace metadata fields (e.g. ``quality_model``)."""
    import torch

    from CalibSegLib.bundle import BundleMetadata, save_bundle
    from CalibSegLib.networks import build_network
    from CalibSegLib.sliding_window import SlidingWindow

    metadata = BundleMetadata(**{
        "network": "unet", "network_kwargs": {"channels": [4, 8], "strides": [2], "num_res_units": 0},
        "in_channels": 1, "num_classes": NUM_CLASSES, "spatial_dims": 2,
        "class_names": ["background"] + [f"class {index}" for index in range(1, NUM_CLASSES)],
        "class_colors": [(0.0, 0.0, 0.0)] + [(index / NUM_CLASSES, 0.5, 1.0 - index / NUM_CLASSES)
                                             for index in range(1, NUM_CLASSES)],
        "sliding_window": SlidingWindow(patch_size=(32, 32)), **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        network = build_network(metadata.network, metadata.in_channels, NUM_CLASSES, 2, **metadata.network_kwargs)
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    return save_bundle(Path(work_dir) / ("tiny_quality.calibseg" if overrides else "tiny.calibseg"), network, metadata)


def _quality_model() -> dict:
    """A hand-made quality model: class 1 always predicted Dice 0.5 (flagged), class 2 always 0.95,
    class 3 falling with its mean entropy."""
    from CalibSegLib.quality import QualityModel, StructureQuality

    def line(intercept: float, slope: float) -> StructureQuality:
        return StructureQuality("mean_entropy", "linear", {"intercept": intercept, "slope": slope},
                                (-0.1, 0.1), 0.05, 0.1, 20)

    return QualityModel({"class 1": line(0.5, 0.0), "class 2": line(0.95, 0.0), "class 3": line(1.2, -1.0)}).to_dict()


def _terminology() -> dict:
    """Hand-made SNOMED CT entries for classes 1 and 2 (class 3 has none): a type alone, and one with a region."""
    def code(value: str, meaning: str) -> dict:
        return {"CodingSchemeDesignator": "SCT", "CodeValue": value, "CodeMeaning": meaning}

    structure = code("123037004", "Anatomical Structure")
    return {"class 1": {"category": structure, "type": code("53085002", "Right ventricle")},
            "class 2": {"category": structure, "type": code("74281007", "Myocardium"),
                        "region": code("87878005", "Left Ventricle")}}


def _terminology_tags(segmentation_node) -> dict[str, str]:
    """Segment name → its ``TerminologyEntry`` tag."""
    segmentation = segmentation_node.GetSegmentation()
    tags = {}
    for index in range(segmentation.GetNumberOfSegments()):
        segment = segmentation.GetNthSegment(index)
        tags[segment.GetName()] = segment.GetTerminology()  # the TerminologyEntry tag
    return tags


def check_segments_carry_the_bundles_terminology(scene, work_dir: Path) -> None:
    image, _ = _phantom()
    bundle_path = _bundle(work_dir, class_terminology=_terminology())
    outputs = SegmentationRunner().run(make_volume_node(scene, image), bundle_path)
    context = "Segmentation category and type - DICOM master list"
    tags = _terminology_tags(outputs.segmentation)
    assert "SCT^85756007^Tissue" in tags.pop("class 3"), tags  # no entry: Slicer's default "Tissue"
    assert tags == {
        "class 1": f"{context}~SCT^123037004^Anatomical Structure~SCT^53085002^Right ventricle~^^~~^^~^^",
        "class 2": f"{context}~SCT^123037004^Anatomical Structure~SCT^74281007^Myocardium~^^~"
                   "Anatomic codes - DICOM master list~SCT^87878005^Left Ventricle~^^",
    }, tags


def check_a_shipped_models_segments_carry_snomed_codes(scene, work_dir: Path) -> None:
    from CalibSegLib.pretrained import DEFAULT_MODEL, resolve_bundle_path

    image, _ = _phantom()
    outputs = SegmentationRunner().run(make_volume_node(scene, image), resolve_bundle_path(DEFAULT_MODEL))
    types = {name: tag.split("~")[2] for name, tag in _terminology_tags(outputs.segmentation).items()}
    assert types == {"right ventricle": "SCT^53085002^Right ventricle", "myocardium": "SCT^74281007^Myocardium",
                     "left ventricle": "SCT^87878005^Left ventricle"}, types
    assert not any("85756007" in tag for tag in _terminology_tags(outputs.segmentation).values())


def _table_columns(table_node) -> dict[str, list]:
    table = table_node.GetTable()
    columns = {}
    for index in range(table.GetNumberOfColumns()):
        column = table.GetColumn(index)
        columns[column.GetName()] = [column.GetValue(row) for row in range(table.GetNumberOfRows())]
    return columns


def _scene_is_unchanged_after(scene, action: Callable[[], object], message: str) -> str:
    """Run ``action``, which must raise; return its error text after checking the scene is untouched."""
    before = scene_snapshot(scene)
    try:
        action()
    except Exception as error:  # the check is on the scene, whatever the error's type
        assert scene_snapshot(scene) == before, f"{message}: the scene changed"
        return str(error)
    raise AssertionError(f"{message}: no error was raised")


def check_outputs_keep_input_geometry(scene, work_dir: Path) -> None:
    image, _ = _phantom()
    volume = make_volume_node(scene, image)
    outputs = SegmentationRunner().run(volume, _bundle(work_dir))
    expected = _ijk_to_ras(volume)
    for node in (outputs.confidence, outputs.uncertainty):
        np.testing.assert_allclose(_ijk_to_ras(node), expected, atol=1e-9)
        assert node.GetImageData().GetDimensions() == volume.GetImageData().GetDimensions()
    import slicer

    confidence = slicer.util.arrayFromVolume(outputs.confidence)
    entropy = slicer.util.arrayFromVolume(outputs.uncertainty)
    assert confidence.shape == image.shape and confidence.min() >= 1 / NUM_CLASSES - 1e-6 and confidence.max() <= 1
    assert entropy.min() >= 0 and entropy.max() <= 1
    # The segmentation is defined on the input's grid too: its labelmap comes back voxel for voxel.
    labelmap = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation, _segment_id(outputs.segmentation, 1),
                                                          volume)
    assert labelmap.shape == image.shape


def _segment_id(segmentation_node, order: int) -> str:
    return segmentation_node.GetSegmentation().GetNthSegmentID(order - 1)


def check_segments_are_named_and_coloured_from_bundle(scene, work_dir: Path) -> None:
    from CalibSegLib.bundle import load_bundle

    image, _ = _phantom()
    bundle_path = _bundle(work_dir)
    metadata = load_bundle(bundle_path).metadata
    outputs = SegmentationRunner().run(make_volume_node(scene, image), bundle_path)
    segmentation = outputs.segmentation.GetSegmentation()
    names = [segmentation.GetNthSegment(index).GetName() for index in range(segmentation.GetNumberOfSegments())]
    assert names == list(metadata.class_names[1:]), names
    for index, color in enumerate(metadata.class_colors[1:]):
        np.testing.assert_allclose(segmentation.GetNthSegment(index).GetColor(), color, atol=1e-6)


def check_segments_match_the_predicted_labels(scene, work_dir: Path) -> None:
    import slicer

    from CalibSegLib.inference import Predictor

    image, _ = _phantom()
    volume = make_volume_node(scene, image)
    bundle_path = _bundle(work_dir)
    outputs = SegmentationRunner().run(volume, bundle_path)
    spacing = tuple(reversed(SPACING_XYZ))
    labels = Predictor(bundle_path, device="cpu").predict(image, spacing).labels
    for label in range(1, NUM_CLASSES):
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation,
                                                          _segment_id(outputs.segmentation, label), volume)
        np.testing.assert_array_equal(mask > 0, labels == label)


def _ensemble_bundle(work_dir: Path) -> Path:
    """Two tiny untrained UNets (seeds 0 and 1) as one ensemble bundle, with a temperature of 1.5."""
    import dataclasses

    from CalibSegLib.bundle import load_bundle, save_bundle

    members = [load_bundle(_bundle(Path(work_dir) / f"member{seed}", seed=seed)) for seed in (0, 1)]
    state = {f"members.{index}.{name}": tensor for index, member in enumerate(members)
             for name, tensor in member.state_dict.items()}
    metadata = dataclasses.replace(members[0].metadata, ensemble_size=2, temperature=1.5)
    return save_bundle(Path(work_dir) / "tiny_ensemble.calibseg", state, metadata)


def check_an_ensemble_adds_its_disagreement_overlay(scene, work_dir: Path) -> None:
    """An ensemble bundle's run adds a disagreement volume equal to CalibSegLib's, with its own colour table, in the
    calling thread and from the child process alike; a single network's run adds none."""
    import slicer

    from CalibSegLib.inference import Predictor

    image, _ = _phantom()
    volume = make_volume_node(scene, image)
    bundle_path = _ensemble_bundle(work_dir)
    runner = SegmentationRunner()
    outputs = runner.run(volume, bundle_path)
    expected = Predictor(bundle_path, device="cpu").predict(image, tuple(reversed(SPACING_XYZ))).disagreement
    assert expected.max() > 0, "the phantom's members should disagree somewhere"
    np.testing.assert_allclose(slicer.util.arrayFromVolume(outputs.disagreement), expected, atol=1e-6)
    color_node = scene.GetNodeByID(outputs.disagreement.GetDisplayNode().GetColorNodeID())
    assert color_node.GetName() == "CalibSeg magma"
    job = InferenceJob(runner, runner.prepare(volume, bundle_path)).start()
    assert job.wait(timeout=120)
    np.testing.assert_array_equal(slicer.util.arrayFromVolume(job.finish().disagreement),
                                  slicer.util.arrayFromVolume(outputs.disagreement))
    assert runner.run(volume, _bundle(work_dir)).disagreement is None


def check_a_multichannel_bundle_reads_one_volume_per_channel(scene, work_dir: Path) -> None:
    import slicer

    from CalibSegLib.inference import Predictor

    first, _ = _phantom()
    second, _ = _phantom(seed=1)
    bundle_path = _bundle(work_dir, in_channels=2, channel_names=["T1", "T2"])
    t1, t2 = make_volume_node(scene, first, "T1"), make_volume_node(scene, second[::-1].copy(), "T2")
    runner = SegmentationRunner()
    # Refused before anything is added: a channel missing, or one on another grid.
    missing = _scene_is_unchanged_after(scene, lambda: runner.run(t1, bundle_path), "one volume for two channels")
    assert missing == ("The model reads 2 channel(s) (T1, T2), one volume each, but 1 volume(s) were "
                       "given."), missing
    shifted = make_volume_node(scene, second, "T2 shifted", origin=(0.0, 0.0, 0.0))
    elsewhere = _scene_is_unchanged_after(scene, lambda: runner.run(t1, bundle_path, channelNodes=[shifted]),
                                          "off grid")
    assert elsewhere.startswith("The 'T2' volume 'T2 shifted' is not on the grid of 'T1';"), elsewhere
    outputs = runner.run(t1, bundle_path, channelNodes=[t2])
    expected = Predictor(bundle_path, device="cpu").predict(np.stack([first, second[::-1]]),
                                                            tuple(reversed(SPACING_XYZ))).labels
    for label in range(1, NUM_CLASSES):
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation,
                                                          _segment_id(outputs.segmentation, label), t1)
        np.testing.assert_array_equal(mask > 0, expected == label)


def check_channel_volumes_are_matched_by_name_and_never_taken_twice(scene, work_dir: Path) -> None:
    """Volumes named ``<case>_0000`` ... are read as the channels their suffixes say, whatever the order they
    are given in, and the outputs are named after the case; one volume for two channels, suffixes of two cases
    or of a channel the model lacks are one sentence each, nothing added; one node for the one other channel
    is that channel (not Python's TypeError)."""
    import slicer

    from CalibSegLib.inference import Predictor

    arrays = [_phantom(seed=seed)[0] for seed in range(3)]
    bundle_path = _bundle(work_dir, in_channels=3, channel_names=["T1", "T2", "FLAIR"])
    t1, t2, flair = (make_volume_node(scene, array, f"a_000{index}") for index, array in enumerate(arrays))
    runner, logic_names = SegmentationRunner(), ["T1", "T2", "FLAIR"]
    for chosen, changed, problem in (
            ([t1, t2, flair], None, None), ([t1, None, flair], 1, None),
            ([flair, t2, flair], None, "The volume 'a_0002' is already chosen for the 'T1' channel; choose "
                                       "another volume for 'FLAIR'."),
            ([flair, t2, flair], 0, "The volume 'a_0002' is already chosen for the 'FLAIR' channel; choose "
                                    "another volume for 'T1'.")):  # the input selector was picked last
        assert channel_choice_problem(chosen, logic_names, changed) == problem
    twice = _scene_is_unchanged_after(scene, lambda: runner.run(flair, bundle_path, channelNodes=[t2, flair]),
                                      "one volume for two channels")
    assert twice == ("The volume 'a_0002' is already chosen for the 'T1' channel; choose another volume for "
                     "'FLAIR'.")
    other = make_volume_node(scene, arrays[1], "b_0001")
    mixed = _scene_is_unchanged_after(scene, lambda: runner.run(t1, bundle_path, channelNodes=[other, flair]),
                                      "two cases")
    assert mixed.startswith("The volumes belong to different cases (a, b) by their channel suffixes;"), mixed
    fourth = make_volume_node(scene, arrays[2], "a_0003")
    missing = _scene_is_unchanged_after(scene, lambda: runner.run(t1, bundle_path, channelNodes=[t2, fourth]),
                                        "a channel the model lacks")
    assert missing.startswith("Case a's volumes are the channels _0000, _0001, _0003, but the model reads "
                              "a_0000 to a_0002 (T1, T2, FLAIR)"), missing
    outputs = runner.run(flair, bundle_path, channelNodes=[t1, t2])  # FLAIR as the input: still channel 2
    spacing = tuple(reversed(SPACING_XYZ))
    expected = Predictor(bundle_path, device="cpu").predict(np.stack(arrays), spacing).labels
    assert outputs.segmentation.GetName() == "a CalibSeg segmentation", outputs.segmentation.GetName()
    for label in range(1, NUM_CLASSES):
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation,
                                                          _segment_id(outputs.segmentation, label), flair)
        np.testing.assert_array_equal(mask > 0, expected == label)
    (work_dir / "two").mkdir()
    two_channels = _bundle(work_dir / "two", in_channels=2, channel_names=["T1", "T2"])
    single = runner.prepare(t1, two_channels, channelNodes=t2)  # one node, not a list
    np.testing.assert_array_equal(single.image, np.stack(arrays[:2]))


def check_metrics_table_equals_calibseglib(scene, work_dir: Path) -> None:
    from CalibSegLib.inference import Predictor
    from CalibSegLib.metrics import asd, brier, cece, dice, ece, hd95, nll, tace

    image, labels = _phantom()
    reference = labels.copy()
    reference[:, :20, :] = np.where(reference[:, :20, :] > 0, 1, 0)  # disagree with the truth in one half
    volume = make_volume_node(scene, image)
    reference_node = make_volume_node(scene, reference, "reference", "vtkMRMLLabelMapVolumeNode")
    bundle_path = _bundle(work_dir)
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
    image, labels = _phantom()
    volume = make_volume_node(scene, image)
    reference = make_volume_node(scene, labels, "reference", "vtkMRMLLabelMapVolumeNode")
    chart = SegmentationRunner().run(volume, _bundle(work_dir), referenceNode=reference).reliability_chart
    assert chart.IsA("vtkMRMLPlotChartNode") and chart.GetNumberOfPlotSeriesNodes() == 3
    series = [chart.GetNthPlotSeriesNode(index) for index in range(3)]
    assert [node.GetYColumnName() for node in series] == ["accuracy", "perfect calibration", "fraction of voxels"]
    table = series[0].GetTableNode().GetTable()
    fractions = [table.GetValueByName(row, "fraction of voxels").ToDouble() for row in range(table.GetNumberOfRows())]
    assert table.GetNumberOfRows() == 15 and abs(sum(fractions) - 1.0) < 1e-9


def check_reference_segmentation_node_is_accepted(scene, work_dir: Path) -> None:
    """A reference given as a segmentation maps segments to classes by name, giving the labelmap's numbers."""
    import slicer

    image, labels = _phantom()
    volume = make_volume_node(scene, image)
    labelmap = make_volume_node(scene, labels, "reference labels", "vtkMRMLLabelMapVolumeNode")
    segmentation = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", "reference segmentation")
    slicer.vtkSlicerSegmentationsModuleLogic.ImportLabelmapToSegmentationNode(labelmap, segmentation)
    for index in range(segmentation.GetSegmentation().GetNumberOfSegments()):
        segmentation.GetSegmentation().GetNthSegment(index).SetName(f"class {index + 1}")
    bundle_path = _bundle(work_dir)
    from_labelmap = SegmentationRunner().run(volume, bundle_path, referenceNode=labelmap).metrics
    from_segmentation = SegmentationRunner().run(volume, bundle_path, referenceNode=segmentation).metrics
    assert from_labelmap.keys() == from_segmentation.keys()
    np.testing.assert_allclose(list(from_segmentation.values()), list(from_labelmap.values()), rtol=1e-9)


def check_low_confidence_segment_follows_the_threshold(scene, work_dir: Path) -> None:
    import slicer

    image, _ = _phantom()
    volume = make_volume_node(scene, image)
    runner = SegmentationRunner()
    outputs = runner.run(volume, _bundle(work_dir), lowConfidenceThreshold=0.6)
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


def check_bad_bundles_leave_the_scene_unchanged(scene, work_dir: Path) -> None:
    image, _ = _phantom()
    volume = make_volume_node(scene, image)
    work_dir = Path(work_dir)
    not_a_zip = work_dir / "notes.calibseg"
    not_a_zip.write_text("not a bundle")
    no_metadata = work_dir / "empty.calibseg"
    with zipfile.ZipFile(no_metadata, "w") as archive:
        archive.writestr("weights.safetensors", b"")
    malformed_quality = work_dir / "quality.calibseg"
    with zipfile.ZipFile(_bundle(work_dir, quality_model=_quality_model())) as archive:
        stored = json.loads(archive.read("bundle.json"))
        weights = archive.read("weights.safetensors")
    stored["quality_model"]["structures"]["class 3"]["slope"] = 2.0  # Dice rising with entropy
    with zipfile.ZipFile(malformed_quality, "w") as archive:
        archive.writestr("bundle.json", json.dumps(stored))
        archive.writestr("weights.safetensors", weights)
    malformed_terminology = work_dir / "terminology.calibseg"
    stored = json.loads(zipfile.ZipFile(_bundle(work_dir, class_terminology=_terminology())).read("bundle.json"))
    del stored["class_terminology"]["class 2"]["type"]["CodeValue"]
    with zipfile.ZipFile(malformed_terminology, "w") as archive:
        archive.writestr("bundle.json", json.dumps(stored))
        archive.writestr("weights.safetensors", weights)
    for path, expected in ((work_dir / "missing.calibseg", "No model bundle"), (not_a_zip, "zip"),
                           (no_metadata, "bundle.json"), ("", "Choose a model bundle"),
                           (malformed_quality, "quality model is malformed"),
                           (malformed_terminology, "class_terminology is malformed")):
        error = _scene_is_unchanged_after(scene, lambda: SegmentationRunner().run(volume, path), f"bundle {path!s}")
        assert expected in error, error
        assert error.count(". ") == 0 and error.endswith("."), f"not one sentence: {error}"


def check_volumes_that_are_not_3d_scalar_are_refused(scene, work_dir: Path) -> None:
    bundle_path = _bundle(work_dir)
    single_slice = make_volume_node(scene, np.random.default_rng(1).normal(size=(1, 32, 32)).astype(np.float32),
                                    "one slice")
    vector = scene.AddNewNodeByClass("vtkMRMLVectorVolumeNode", "vector volume")
    import slicer

    slicer.util.updateVolumeFromArray(vector, np.random.default_rng(2).normal(size=(4, 16, 16, 3)).astype(np.float32))
    for node, expected in ((single_slice, "3D volume"), (vector, "components"), (None, "scalar volume")):
        error = _scene_is_unchanged_after(scene, lambda: SegmentationRunner().run(node, bundle_path), f"input {node}")
        assert expected in error, error


def check_reference_on_another_grid_is_refused(scene, work_dir: Path) -> None:
    image, labels = _phantom()
    volume = make_volume_node(scene, image)
    shifted = make_volume_node(scene, labels, "shifted reference", "vtkMRMLLabelMapVolumeNode",
                               origin=(ORIGIN[0] + 5.0, ORIGIN[1], ORIGIN[2]))
    smaller = make_volume_node(scene, labels[:, :40], "cropped reference", "vtkMRMLLabelMapVolumeNode")
    for reference in (shifted, smaller):
        error = _scene_is_unchanged_after(
            scene, lambda: SegmentationRunner().run(volume, _bundle(work_dir), referenceNode=reference), "reference grid")
        assert "not on the input volume's grid" in error, error


def _interrupted_job(scene, work_dir: Path, interrupt: Callable[[InferenceJob], None]):
    """A background job on a larger phantom whose first progress report calls ``interrupt(job)``, run until it
    ended; returns the volume, the runner, the job and the scene's snapshot from before it started."""
    image, _ = _phantom(shape=(40, 48, 40))
    volume = make_volume_node(scene, image)
    runner = SegmentationRunner()
    job = InferenceJob(runner, runner.prepare(volume, _bundle(work_dir)))
    before = scene_snapshot(scene)
    interrupted = threading.Event()
    report = job._progress

    def progress(fraction: float) -> None:
        report(fraction)
        if not interrupted.is_set():
            interrupted.set()
            interrupt(job)

    job._progress = progress
    job.start()
    assert job.wait(timeout=120), "the interrupted job did not end"
    assert interrupted.is_set() and job.fraction < 1.0
    return volume, runner, job, before


def check_cancel_leaves_the_scene_unchanged(scene, work_dir: Path) -> None:
    from CalibSegLib.inference import InferenceCancelled

    # the user presses Cancel while the first batches run
    _, _, job, before = _interrupted_job(scene, work_dir, InferenceJob.cancel)
    try:
        job.finish()
    except InferenceCancelled:
        pass
    else:
        raise AssertionError("finish() of a cancelled job did not raise InferenceCancelled")
    assert scene_snapshot(scene) == before


def check_background_job_publishes_what_run_publishes(scene, work_dir: Path) -> None:
    """The child process's outputs, metrics and reliability bins with a reference, equal the in-process run's."""
    import slicer

    image, labels = _phantom()
    volume = make_volume_node(scene, image)
    reference = make_volume_node(scene, labels, "reference", "vtkMRMLLabelMapVolumeNode")
    bundle_path = _bundle(work_dir)
    runner = SegmentationRunner()
    job = InferenceJob(runner, runner.prepare(volume, bundle_path, referenceNode=reference)).start()
    assert job.wait(timeout=120)
    in_background = job.finish()
    in_foreground = runner.run(volume, bundle_path, referenceNode=reference)
    assert job.fraction == 1.0
    for name in ("confidence", "uncertainty"):
        np.testing.assert_array_equal(slicer.util.arrayFromVolume(getattr(in_background, name)),
                                      slicer.util.arrayFromVolume(getattr(in_foreground, name)))
    np.testing.assert_equal(in_background.metrics, in_foreground.metrics)  # NaN where both are undefined
    np.testing.assert_equal(in_background.summary, in_foreground.summary)


def check_a_killed_inference_child_is_one_sentence_and_the_next_run_works(scene, work_dir: Path) -> None:
    """The child dies mid-way (as an out-of-memory kill would end it): one sentence, nothing added, and the
    next job runs to the end."""
    import signal

    def kill(job: InferenceJob) -> None:  # not cancel(): the process just dies
        os.kill(job._process.pid, signal.SIGKILL)

    volume, runner, job, before = _interrupted_job(scene, work_dir, kill)
    error = _scene_is_unchanged_after(scene, job.finish, "killed child")
    assert error.startswith("The inference process was killed by signal 9"), error
    assert error.count(". ") == 0 and error.endswith("the scene is unchanged."), error
    assert scene_snapshot(scene) == before
    again = InferenceJob(runner, runner.prepare(volume, _bundle(work_dir))).start()
    assert again.wait(timeout=120) and again.finish().segmentation is not None


def check_a_failure_while_publishing_removes_every_new_node(scene, work_dir: Path) -> None:
    image, _ = _phantom()
    volume = make_volume_node(scene, image)
    runner = SegmentationRunner()
    request = runner.prepare(volume, _bundle(work_dir), lowConfidenceThreshold=0.5)
    computation = runner.compute(request)
    computation.prediction.entropy = None  # fails after the segmentation and confidence nodes were added
    _scene_is_unchanged_after(scene, lambda: runner.publish(request, computation), "failed publish")


def check_quality_table_without_a_reference_shows_the_summary(scene, work_dir: Path) -> None:
    from CalibSegLib.bundle import load_bundle
    from CalibSegLib.inference import Predictor
    from CalibSegLib.quality import quality_summary

    image, _ = _phantom()
    volume = make_volume_node(scene, image)
    spacing = tuple(reversed(SPACING_XYZ))
    for bundle_path in (_bundle(work_dir, quality_model=_quality_model()), _bundle(work_dir)):
        outputs = SegmentationRunner().run(volume, bundle_path)
        assert outputs.metrics_table is None and outputs.quality_table.IsA("vtkMRMLTableNode")
        metadata = load_bundle(bundle_path).metadata
        expected = quality_summary(Predictor(bundle_path, device="cpu").predict(image, spacing), spacing, metadata)
        assert {key: value for key, value in outputs.summary.items() if key != "input_check"} == expected
        columns = _table_columns(outputs.quality_table)
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
             for image, labels in (_phantom(seed=seed) for seed in range(12))]
    plain = load_bundle(_bundle(work_dir))
    network = plain.build_model()
    features = fit_network_features(network, plain.metadata, cases[:8], cases[8:])
    statistics = statistics_of_cases(plain.metadata, cases[:8], features=features)
    path = _bundle(work_dir, input_statistics=statistics)
    image, _ = _phantom(seed=12)
    sentences = ("network features: distance {:.3g}, like the training images the network saw",
                 "Unlike the training images the network saw: feature distance {:.3g}, above all 4")
    for array, sentence in zip((image, image.max() + image.min() - image), sentences):
        outputs = SegmentationRunner().run(make_volume_node(scene, array), path)
        check = outputs.summary["input_check"]["features"]
        expected = feature_distance(network, load_bundle(path).metadata, array, spacing)
        assert math.isclose(check["distance"], expected, rel_tol=1e-5), (check, expected)
        assert check["threshold"] == features.threshold and check["validation_volumes"] == 4
        review = _table_columns(outputs.quality_table)["Review"][0]
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

    image, labels = _phantom()
    volume = make_volume_node(scene, image)
    reference = make_volume_node(scene, labels, "reference", "vtkMRMLLabelMapVolumeNode")
    outputs = SegmentationRunner().run(volume, _bundle(work_dir, quality_model=_quality_model()), referenceNode=reference)
    columns = _table_columns(outputs.quality_table)
    titles = list(columns)
    assert titles[titles.index("Predicted Dice") + 1] == "Measured Dice"
    predicted_labels = np.zeros(image.shape, np.int64)
    import slicer

    for label in range(1, NUM_CLASSES):
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation, _segment_id(outputs.segmentation, label),
                                                          volume)
        predicted_labels[mask > 0] = label
    assert math.isnan(columns["Measured Dice"][0])  # the input check's row
    np.testing.assert_allclose(columns["Measured Dice"][1:], dice(predicted_labels, labels.astype(np.int64), NUM_CLASSES))
    assert outputs.metrics_table is not None  # the calibration metrics stay in their own table


def check_uncertainty_is_shown_only_at_its_hot_spots(scene, work_dir: Path) -> None:
    from CalibSegLib.quality import HOT_SPOT_LEVEL

    image, _ = _phantom()
    volume = make_volume_node(scene, image)
    runner = SegmentationRunner()
    display = runner.run(volume, _bundle(work_dir)).uncertainty.GetDisplayNode()
    assert display.GetApplyThreshold() and display.GetLowerThreshold() == HOT_SPOT_LEVEL
    assert display.GetUpperThreshold() == 1.0
    outputs = runner.run(volume, _bundle(work_dir), hotSpotLevel=0.7)
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
    assert (outputs.uncertainty.GetDisplayNode().GetWindow(), outputs.uncertainty.GetDisplayNode().GetLevel()) == (1.0, 0.5)


def check_jump_to_slice_centres_every_slice_view(scene, work_dir: Path) -> None:
    import slicer

    image, _ = _phantom()
    volume = make_volume_node(scene, image)
    outputs = SegmentationRunner().run(volume, _bundle(work_dir))
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
    expected = _ijk_to_ras(volume) @ np.array([(i_size - 1) / 2, (j_size - 1) / 2, index, 1.0])
    np.testing.assert_allclose(ras, expected[:3], atol=1e-9)
    for node in views:
        slice_to_ras = node.GetSliceToRAS()
        np.testing.assert_allclose([slice_to_ras.GetElement(row, 3) for row in range(3)], ras, atol=1e-6)
    error = _scene_is_unchanged_after(scene, lambda: SegmentationRunner.jumpToSlice(volume, image.shape[0], 0),
                                      "a slice outside the volume")
    assert "outside the volume" in error, error


def check_a_failure_while_adding_the_quality_table_removes_every_new_node(scene, work_dir: Path) -> None:
    image, _ = _phantom()
    volume = make_volume_node(scene, image)
    runner = SegmentationRunner()
    request = runner.prepare(volume, _bundle(work_dir))
    computation = runner.compute(request)
    computation.summary = {"structures": {"class 1": {}}}  # fails after the segmentation and overlays were added
    _scene_is_unchanged_after(scene, lambda: runner.publish(request, computation), "failed quality table")


def _batch(scene, work_dir: Path, volumes: list, on_progress: Callable[[BatchJob], None] | None = None,
           **settings) -> tuple[BatchJob, list[float], list[str]]:
    """A :class:`BatchJob` over ``volumes`` with the quality-model bundle, run to its end; ``on_progress(job)``
    after each look at the running child. Returns the job and the fractions and status texts seen."""
    runner = SegmentationRunner()
    job = BatchJob(runner, volumes, runner.settings(_bundle(work_dir, quality_model=_quality_model()), **settings))
    fractions, texts = [job.fraction], []

    def progress(fraction: float) -> None:
        fractions.append(fraction)
        texts.append(job.status_text)
        if on_progress is not None:
            on_progress(job)

    job.start()
    assert job.wait(timeout=300, progress=progress), "the batch did not end"
    return job, fractions, texts


def _node_names(scene) -> list[str]:
    return [scene.GetNthNode(index).GetName() or "" for index in range(scene.GetNumberOfNodes())]


def check_a_batch_segments_every_loaded_volume_and_reports_the_one_that_fails(scene, work_dir: Path) -> None:
    """Three volumes, the middle one constant: the two others are segmented and published as single runs are,
    the constant one's row says why it failed, the progress rises from 0 to 1 across the cases, and neither the
    overlays of an earlier run nor a labelmap are taken as inputs."""
    import slicer

    from CalibSegLib.predict import batch_row
    from CalibSegLib.quality import structure_key

    first, constant, second = (make_volume_node(scene, image, name) for image, name in (
        (_phantom()[0], "first"), (np.full((6, 48, 40), 7.0, np.float32), "constant"),
        (_phantom(seed=1)[0], "second")))
    make_volume_node(scene, _phantom()[1], "first labels", "vtkMRMLLabelMapVolumeNode")
    earlier = SegmentationRunner().run(first, _bundle(work_dir))  # adds "first confidence" and "first uncertainty"
    volumes = batch_volumes(scene)
    assert [node.GetID() for node in volumes] == [first.GetID(), constant.GetID(), second.GetID()], \
        [node.GetName() for node in volumes]

    job, fractions, texts = _batch(scene, work_dir, volumes)
    outputs = job.finish()

    assert fractions[0] == 0.0 and fractions[-1] == 1.0 and all(np.diff(fractions) >= 0), fractions
    # each case's end is seen (the next one starts at 0 of its own), so the bar moves case by case
    assert {round(value, 6) for value in fractions} >= {0.0, round(1 / 3, 6), round(2 / 3, 6), 1.0}, fractions
    shown = list(dict.fromkeys(texts))
    assert shown[:3] == ["case 1 of 3: first", "case 2 of 3: constant", "case 3 of 3: second"], shown
    assert shown[-1] == "2 of 3 cases segmented, 1 failed.", shown

    statuses = [case.status for case in outputs.cases]
    assert statuses[0] == statuses[2] == OK, statuses
    assert statuses[1].startswith("error: The image is constant") and statuses[1].count(". ") == 0, statuses
    assert outputs.cases[1].outputs is None and not any(name.startswith("constant ") for name in _node_names(scene))
    for case in (outputs.cases[0], outputs.cases[2]):  # named after their volume, as a single run's
        assert case.outputs.segmentation.GetName().startswith(f"{case.name} CalibSeg segmentation")
        assert case.outputs.quality_table.GetName().startswith(f"{case.name} CalibSeg quality")
        assert case.outputs.segmentation.GetSegmentation().GetNumberOfSegments() == NUM_CLASSES - 1
    assert outputs.cases[2].outputs.segmentation.GetName() == "second CalibSeg segmentation"
    # a second run on "first" gets nodes of its own; the earlier run's stay
    assert outputs.cases[0].outputs.confidence.GetName() == "first confidence_1"
    assert scene.GetNodeByID(earlier.confidence.GetID()) is earlier.confidence

    # the summary table: calibseg-predict's rows (case, status, review, volumes, predicted Dice) in the same order
    assert outputs.summary_table.GetName() == BATCH_TABLE_NAME
    columns = _table_columns(outputs.summary_table)
    summaries = [case.outputs and case.outputs.summary for case in outputs.cases]
    expected = [batch_row(case.name, case.status, summary) for case, summary in zip(outputs.cases, summaries)]
    assert outputs.rows == expected and list(columns) == list(expected[0]), list(columns)
    assert columns["case"] == ["first", "constant", "second"] and columns["status"] == statuses
    assert columns["review"] == ["REVIEW", "", "REVIEW"], columns["review"]  # class 1 is always flagged
    assert columns["input_check"][1] == "" and all(  # the tiny bundle stores no training statistics
        columns["input_check"][row].startswith("input not checked") for row in (0, 2)), columns["input_check"]
    for name in ("class 1", "class 2", "class 3"):
        key = structure_key(name)
        for column, field in ((f"volume_ml_{key}", "volume_ml"), (f"predicted_dice_{key}", "predicted_dice")):
            values = columns[column]
            assert math.isnan(values[1]), (column, values)
            for row, summary in ((0, summaries[0]), (2, summaries[2])):
                assert math.isclose(values[row], summary["structures"][name][field]), (column, values)
    assert columns["predicted_dice_class_1"][0] == 0.5 and columns["review_class_2"][2] == 0.0

    # what the batch added is not an input of the next one
    assert [node.GetID() for node in batch_volumes(scene)] == [first.GetID(), constant.GetID(), second.GetID()]
    assert slicer.util.arrayFromVolume(outputs.cases[2].outputs.confidence).shape == (6, 48, 40)


def check_a_batch_with_a_multichannel_bundle_reads_each_case_from_its_channel_volumes(scene, work_dir: Path) -> None:
    """A two-channel bundle: ``a_0000`` and ``a_0001`` are one case, loaded in any order and segmented as a run given
    both channels is; ``b_0000`` without its second channel, and a volume not named as a channel, each fail with
    their sentence."""
    import slicer

    from CalibSegLib.inference import Predictor

    first, second = _phantom()[0], _phantom(seed=1)[0]
    channel_0 = make_volume_node(scene, first, "a_0000")
    make_volume_node(scene, first, "b_0000")
    channel_1 = make_volume_node(scene, second, "a_0001")
    make_volume_node(scene, second, "T2")
    bundle_path = _bundle(work_dir, in_channels=2, channel_names=["T1", "T2"])
    runner = SegmentationRunner()
    job = BatchJob(runner, batch_volumes(scene), runner.settings(bundle_path)).start()
    assert job.wait(timeout=300), "the batch did not end"
    outputs = job.finish()

    assert [case.name for case in outputs.cases] == ["a", "b", "T2"], [case.name for case in outputs.cases]
    statuses = [case.status for case in outputs.cases]
    assert statuses[0] == OK and outputs.cases[0].channels == (channel_1,), statuses
    wanted = ("the model reads 2 channels (T1, T2) from volumes named <case>_0000 to <case>_0001, in that order; ")
    assert statuses[1] == (f"error: Case 'b' has the channel volume(s) 0000, but {wanted}load the missing ones, or "
                           "segment the case alone with one volume per channel."), statuses[1]
    assert statuses[2] == (f"error: 'T2' is not named as a channel of a case, but {wanted}rename the volumes, or "
                           "segment the case alone with one volume per channel."), statuses[2]
    assert job.status_text == "1 of 3 cases segmented, 2 failed.", job.status_text
    assert [row["case"] for row in outputs.rows] == ["a", "b", "T2"]
    expected = Predictor(bundle_path, device="cpu").predict(np.stack([first, second]),
                                                            tuple(reversed(SPACING_XYZ))).labels
    segmentation = outputs.cases[0].outputs.segmentation
    assert segmentation.GetName() == "a CalibSeg segmentation", segmentation.GetName()  # the case's, not a_0000's
    assert outputs.cases[0].outputs.confidence.GetName() == "a confidence"
    for label in range(1, NUM_CLASSES):
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(segmentation, _segment_id(segmentation, label), channel_0)
        np.testing.assert_array_equal(mask > 0, expected == label)


def check_cancelling_a_batch_keeps_the_finished_cases_outputs(scene, work_dir: Path) -> None:
    """Cancel as the second case starts: its child ends, the third never starts; the first case's outputs and the
    summary table (the others ``cancelled``) are all the batch added."""
    volumes = [make_volume_node(scene, _phantom()[0], "finished"),
               make_volume_node(scene, _phantom(shape=(40, 48, 40))[0], "interrupted"),
               make_volume_node(scene, _phantom()[0], "not started")]
    before = set(_node_names(scene))

    def cancel_on_the_second_case(job: BatchJob) -> None:
        if job.running_case is job.cases[1]:
            job.cancel()

    job, fractions, _ = _batch(scene, work_dir, volumes, cancel_on_the_second_case)
    outputs = job.finish()
    assert [case.status for case in outputs.cases] == [OK, CANCELLED, CANCELLED]
    assert [row["status"] for row in outputs.rows] == [OK, CANCELLED, CANCELLED]
    assert all(np.diff(fractions) >= 0), fractions
    added = set(_node_names(scene)) - before
    assert not [name for name in added if name.startswith(("interrupted", "not started"))], added
    assert {f"finished {suffix}" for suffix in ("CalibSeg segmentation", "confidence", "uncertainty",
                                                "CalibSeg quality")} | {BATCH_TABLE_NAME} <= added, added
    assert job.status_text == "1 of 3 cases segmented, 2 cancelled.", job.status_text


def check_a_batch_case_whose_child_dies_is_one_sentence_and_the_others_run(scene, work_dir: Path) -> None:
    """The first case's child is killed (as an out-of-memory kill would end it): its row says so in one sentence,
    nothing of it is added, and the second case is segmented."""
    import signal

    volumes = [make_volume_node(scene, _phantom(shape=(40, 48, 40))[0], "killed"),
               make_volume_node(scene, _phantom()[0], "survivor")]
    killed = []

    def kill_the_first_child(job: BatchJob) -> None:
        if job.running_case is job.cases[0] and not killed:
            os.kill(job.running_job._process.pid, signal.SIGKILL)
            killed.append(True)

    job, _, _ = _batch(scene, work_dir, volumes, kill_the_first_child)
    outputs = job.finish()
    status = outputs.cases[0].status
    assert status.startswith("error: The inference process was killed by signal 9"), status
    assert status.count(". ") == 0 and status.endswith("the scene is unchanged."), status
    assert outputs.cases[1].status == OK and outputs.cases[1].outputs.segmentation is not None
    assert not any(name.startswith("killed ") for name in _node_names(scene))


CHECKS: dict[str, Callable[[object, Path], None]] = {
    name.removeprefix("check_"): function for name, function in list(globals().items())
    if name.startswith("check_") and callable(function)
}
