"""Fault catalogue, Slicer logic on a real MRML scene (slicer-core): every refused run or threshold is
one sentence and leaves the scene exactly as it was (same nodes, same modification times)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from fault_checks import BROKEN_BUNDLES, assert_one_sentence
from mrml_standins import install_standins, mrml_scene  # noqa: F401  (fixture)

install_standins()
from CalibSegRunner import InferenceJob, SegmentationRunner  # noqa: E402  (needs the module folder on sys.path)
from CalibSegRunner.nodes import LOW_CONFIDENCE_SEGMENT  # noqa: E402
from CalibSegTesting.checks import make_volume_node, scene_snapshot  # noqa: E402

pytestmark = pytest.mark.mrml


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    from tiny_bundles import make_test_bundle

    return make_test_bundle(tmp_path_factory.mktemp("bundle") / "tiny.calibseg", patch_size=(32, 32))


def image(shape=(4, 32, 28)) -> np.ndarray:
    return np.random.default_rng(5).normal(100, 25, size=shape).astype(np.float32)


def refused_without_change(scene, action) -> str:
    """Run ``action``, which must raise; return its message after checking the scene is untouched."""
    before, count = scene_snapshot(scene), scene.GetNumberOfNodes()
    with pytest.raises(Exception) as caught:  # the type is checked by the callers' sentences
        action()
    assert scene.GetNumberOfNodes() == count and scene_snapshot(scene) == before
    return str(caught.value)


BAD_THRESHOLDS = [5.0, -0.1, 1.0000001, math.nan, math.inf, "0.5", True]


@pytest.mark.parametrize("threshold", BAD_THRESHOLDS, ids=repr)
def test_run_refuses_a_threshold_outside_0_1(threshold, bundle, mrml_scene):  # noqa: F811
    volume = make_volume_node(mrml_scene, image())
    message = refused_without_change(
        mrml_scene, lambda: SegmentationRunner().run(volume, bundle, lowConfidenceThreshold=threshold))
    assert_one_sentence(message, r"threshold must be a number in \[0, 1\]", re.escape(repr(threshold)))


@pytest.mark.parametrize("threshold", BAD_THRESHOLDS[:4], ids=repr)
def test_update_refuses_a_threshold_outside_0_1(threshold, bundle, mrml_scene):  # noqa: F811
    volume = make_volume_node(mrml_scene, image())
    runner = SegmentationRunner()
    outputs = runner.run(volume, bundle, lowConfidenceThreshold=0.6)
    segmentation = outputs.segmentation.GetSegmentation()
    segment = segmentation.GetSegmentIdBySegmentName(LOW_CONFIDENCE_SEGMENT)
    message = refused_without_change(
        mrml_scene, lambda: runner.updateLowConfidence(outputs, volume, threshold))
    assert_one_sentence(message, r"threshold must be a number in \[0, 1\]")
    assert segmentation.GetSegmentIdBySegmentName(LOW_CONFIDENCE_SEGMENT) == segment


@pytest.mark.parametrize("name", list(BROKEN_BUNDLES))
def test_broken_bundle_leaves_the_scene_unchanged(name, bundle, mrml_scene, tmp_path):  # noqa: F811
    make, pattern = BROKEN_BUNDLES[name]
    broken = make(bundle, tmp_path / "broken.calibseg")
    volume = make_volume_node(mrml_scene, image())
    message = refused_without_change(mrml_scene, lambda: SegmentationRunner().run(volume, broken))
    assert_one_sentence(message, pattern)


def test_exploding_bundle_in_the_background_job_publishes_nothing(bundle, mrml_scene, tmp_path):  # noqa: F811
    make, pattern = BROKEN_BUNDLES["exploding weights"]
    runner = SegmentationRunner()
    request = runner.prepare(make_volume_node(mrml_scene, image()), make(bundle, tmp_path / "x.calibseg"))
    job = InferenceJob(runner, request).start()
    assert job.wait(timeout=60)
    assert_one_sentence(refused_without_change(mrml_scene, job.finish), pattern)


def test_nan_voxel_in_the_input_volume_is_refused(bundle, mrml_scene):  # noqa: F811
    values = image()
    values[2, 10, 10] = np.nan
    volume = make_volume_node(mrml_scene, values)
    message = refused_without_change(mrml_scene, lambda: SegmentationRunner().run(volume, bundle))
    assert_one_sentence(message, "NaN or infinite")
