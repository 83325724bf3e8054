"""Refused and failed runs leave the scene unchanged: bad bundles, volumes that are not 3D scalar, a reference on
another grid, a failure while publishing or while adding the quality table."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from CalibSegRunner import SegmentationRunner

from .scene import (ORIGIN, hand_made_quality_model, hand_made_terminology, make_volume_node, phantom,
                    scene_is_unchanged_after, tiny_bundle)

__all__ = ["check_bad_bundles_leave_the_scene_unchanged", "check_volumes_that_are_not_3d_scalar_are_refused",
           "check_reference_on_another_grid_is_refused", "check_a_failure_while_publishing_removes_every_new_node",
           "check_a_failure_while_adding_the_quality_table_removes_every_new_node"]


def check_bad_bundles_leave_the_scene_unchanged(scene, work_dir: Path) -> None:
    image, _ = phantom()
    volume = make_volume_node(scene, image)
    work_dir = Path(work_dir)
    not_a_zip = work_dir / "notes.calibseg"
    not_a_zip.write_text("not a bundle")
    no_metadata = work_dir / "empty.calibseg"
    with zipfile.ZipFile(no_metadata, "w") as archive:
        archive.writestr("weights.safetensors", b"")
    malformed_quality = work_dir / "quality.calibseg"
    with zipfile.ZipFile(tiny_bundle(work_dir, quality_model=hand_made_quality_model())) as archive:
        stored = json.loads(archive.read("bundle.json"))
        weights = archive.read("weights.safetensors")
    stored["quality_model"]["structures"]["class 3"]["slope"] = 2.0  # Dice rising with entropy
    with zipfile.ZipFile(malformed_quality, "w") as archive:
        archive.writestr("bundle.json", json.dumps(stored))
        archive.writestr("weights.safetensors", weights)
    malformed_terminology = work_dir / "terminology.calibseg"
    terminology_bundle = tiny_bundle(work_dir, class_terminology=hand_made_terminology())
    stored = json.loads(zipfile.ZipFile(terminology_bundle).read("bundle.json"))
    del stored["class_terminology"]["class 2"]["type"]["CodeValue"]
    with zipfile.ZipFile(malformed_terminology, "w") as archive:
        archive.writestr("bundle.json", json.dumps(stored))
        archive.writestr("weights.safetensors", weights)
    for path, expected in ((work_dir / "missing.calibseg", "No model bundle"), (not_a_zip, "zip"),
                           (no_metadata, "bundle.json"), ("", "Choose a model bundle"),
                           (malformed_quality, "quality model is malformed"),
                           (malformed_terminology, "class_terminology is malformed")):
        error = scene_is_unchanged_after(scene, lambda path=path: SegmentationRunner().run(volume, path),
                                         f"bundle {path!s}")
        assert expected in error, error
        assert error.count(". ") == 0 and error.endswith("."), f"not one sentence: {error}"


def check_volumes_that_are_not_3d_scalar_are_refused(scene, work_dir: Path) -> None:
    bundle_path = tiny_bundle(work_dir)
    single_slice = make_volume_node(scene, np.random.default_rng(1).normal(size=(1, 32, 32)).astype(np.float32),
                                    "one slice")
    vector = scene.AddNewNodeByClass("vtkMRMLVectorVolumeNode", "vector volume")
    import slicer

    slicer.util.updateVolumeFromArray(vector, np.random.default_rng(2).normal(size=(4, 16, 16, 3)).astype(np.float32))
    for node, expected in ((single_slice, "3D volume"), (vector, "components"), (None, "scalar volume")):
        error = scene_is_unchanged_after(scene, lambda node=node: SegmentationRunner().run(node, bundle_path),
                                         f"input {node}")
        assert expected in error, error


def check_reference_on_another_grid_is_refused(scene, work_dir: Path) -> None:
    image, labels = phantom()
    volume = make_volume_node(scene, image)
    shifted = make_volume_node(scene, labels, "shifted reference", "vtkMRMLLabelMapVolumeNode",
                               origin=(ORIGIN[0] + 5.0, ORIGIN[1], ORIGIN[2]))
    smaller = make_volume_node(scene, labels[:, :40], "cropped reference", "vtkMRMLLabelMapVolumeNode")
    for reference in (shifted, smaller):
        error = scene_is_unchanged_after(
            scene, lambda reference=reference: SegmentationRunner().run(volume, tiny_bundle(work_dir),
                                                                   referenceNode=reference),
            "reference grid")
        assert "not on the input volume's grid" in error, error


def check_a_failure_while_publishing_removes_every_new_node(scene, work_dir: Path) -> None:
    image, _ = phantom()
    volume = make_volume_node(scene, image)
    runner = SegmentationRunner()
    request = runner.prepare(volume, tiny_bundle(work_dir), lowConfidenceThreshold=0.5)
    computation = runner.compute(request)
    computation.prediction.entropy = None  # fails after the segmentation and confidence nodes were added
    scene_is_unchanged_after(scene, lambda: runner.publish(request, computation), "failed publish")


def check_a_failure_while_adding_the_quality_table_removes_every_new_node(scene, work_dir: Path) -> None:
    image, _ = phantom()
    volume = make_volume_node(scene, image)
    runner = SegmentationRunner()
    request = runner.prepare(volume, tiny_bundle(work_dir))
    computation = runner.compute(request)
    computation.summary = {"structures": {"class 1": {}}}  # fails after the segmentation and overlays were added
    scene_is_unchanged_after(scene, lambda: runner.publish(request, computation), "failed quality table")
