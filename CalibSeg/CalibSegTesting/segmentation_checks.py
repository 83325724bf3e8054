"""The segmentation and overlays a run adds: on the input's grid, segments named, coloured and coded from the
bundle, equal to the predicted labels, and an ensemble's disagreement overlay."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from CalibSegRunner import InferenceJob, SegmentationRunner

from .scene import (NUM_CLASSES, SPACING_XYZ, class_segment_id, hand_made_terminology, ijk_to_ras, make_volume_node,
                    phantom, tiny_bundle)

__all__ = ["check_segments_carry_the_bundles_terminology", "check_a_shipped_models_segments_carry_snomed_codes",
           "check_outputs_keep_input_geometry", "check_segments_are_named_and_coloured_from_bundle",
           "check_segments_match_the_predicted_labels", "check_an_ensemble_adds_its_disagreement_overlay"]


def _terminology_tags(segmentation_node) -> dict[str, str]:
    """Segment name → its ``TerminologyEntry`` tag."""
    segmentation = segmentation_node.GetSegmentation()
    tags = {}
    for index in range(segmentation.GetNumberOfSegments()):
        segment = segmentation.GetNthSegment(index)
        tags[segment.GetName()] = segment.GetTerminology()  # the TerminologyEntry tag
    return tags


def check_segments_carry_the_bundles_terminology(scene, work_dir: Path) -> None:
    image, _ = phantom()
    bundle_path = tiny_bundle(work_dir, class_terminology=hand_made_terminology())
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

    image, _ = phantom()
    outputs = SegmentationRunner().run(make_volume_node(scene, image), resolve_bundle_path(DEFAULT_MODEL))
    types = {name: tag.split("~")[2] for name, tag in _terminology_tags(outputs.segmentation).items()}
    assert types == {"right ventricle": "SCT^53085002^Right ventricle", "myocardium": "SCT^74281007^Myocardium",
                     "left ventricle": "SCT^87878005^Left ventricle"}, types
    assert not any("85756007" in tag for tag in _terminology_tags(outputs.segmentation).values())


def check_outputs_keep_input_geometry(scene, work_dir: Path) -> None:
    image, _ = phantom()
    volume = make_volume_node(scene, image)
    outputs = SegmentationRunner().run(volume, tiny_bundle(work_dir))
    expected = ijk_to_ras(volume)
    for node in (outputs.confidence, outputs.uncertainty):
        np.testing.assert_allclose(ijk_to_ras(node), expected, atol=1e-9)
        assert node.GetImageData().GetDimensions() == volume.GetImageData().GetDimensions()
    import slicer

    confidence = slicer.util.arrayFromVolume(outputs.confidence)
    entropy = slicer.util.arrayFromVolume(outputs.uncertainty)
    assert confidence.shape == image.shape and confidence.min() >= 1 / NUM_CLASSES - 1e-6 and confidence.max() <= 1
    assert entropy.min() >= 0 and entropy.max() <= 1
    # The segmentation is defined on the input's grid too: its labelmap comes back voxel for voxel.
    labelmap = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation,
                                                          class_segment_id(outputs.segmentation, 1), volume)
    assert labelmap.shape == image.shape


def check_segments_are_named_and_coloured_from_bundle(scene, work_dir: Path) -> None:
    from CalibSegLib.bundle import load_bundle

    image, _ = phantom()
    bundle_path = tiny_bundle(work_dir)
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

    image, _ = phantom()
    volume = make_volume_node(scene, image)
    bundle_path = tiny_bundle(work_dir)
    outputs = SegmentationRunner().run(volume, bundle_path)
    spacing = tuple(reversed(SPACING_XYZ))
    labels = Predictor(bundle_path, device="cpu").predict(image, spacing).labels
    for label in range(1, NUM_CLASSES):
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation,
                                                          class_segment_id(outputs.segmentation, label), volume)
        np.testing.assert_array_equal(mask > 0, labels == label)


def _ensemble_bundle(work_dir: Path) -> Path:
    """Two tiny untrained UNets (seeds 0 and 1) as one ensemble bundle, with a temperature of 1.5."""
    import dataclasses

    from CalibSegLib.bundle import load_bundle, save_bundle

    members = [load_bundle(tiny_bundle(Path(work_dir) / f"member{seed}", seed=seed)) for seed in (0, 1)]
    state = {f"members.{index}.{name}": tensor for index, member in enumerate(members)
             for name, tensor in member.state_dict.items()}
    metadata = dataclasses.replace(members[0].metadata, ensemble_size=2, temperature=1.5)
    return save_bundle(Path(work_dir) / "tiny_ensemble.calibseg", state, metadata)


def check_an_ensemble_adds_its_disagreement_overlay(scene, work_dir: Path) -> None:
    """An ensemble bundle's run adds a disagreement volume equal to CalibSegLib's, with its own colour table, in the
    calling thread and from the child process alike; a single network's run adds none."""
    import slicer

    from CalibSegLib.inference import Predictor

    image, _ = phantom()
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
    assert runner.run(volume, tiny_bundle(work_dir)).disagreement is None
