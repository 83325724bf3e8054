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
from CalibSegRunner import InferenceJob, SegmentationRunner, run_batch  # noqa: E402  (needs the module folder on sys.path)
from CalibSegRunner.nodes import LOW_CONFIDENCE_SEGMENT  # noqa: E402
from CalibSegTesting import make_volume_node, scene_snapshot  # noqa: E402

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


BAD_LEVELS = [math.nan, -0.1, 1.5, math.inf, "0.4", True]


@pytest.mark.parametrize("level", BAD_LEVELS, ids=repr)
def test_run_refuses_a_hot_spot_level_outside_0_1(level, bundle, mrml_scene):  # noqa: F811
    volume = make_volume_node(mrml_scene, image())
    message = refused_without_change(mrml_scene, lambda: SegmentationRunner().run(volume, bundle, hotSpotLevel=level))
    assert_one_sentence(message, r"hot-spot level must be a number in \[0, 1\]", re.escape(repr(level)))


@pytest.mark.parametrize("level", BAD_LEVELS, ids=repr)
def test_set_hot_spot_level_refuses_a_level_outside_0_1(level, bundle, mrml_scene):  # noqa: F811
    volume = make_volume_node(mrml_scene, image())
    runner = SegmentationRunner()
    outputs = runner.run(volume, bundle, hotSpotLevel=0.3)
    message = refused_without_change(mrml_scene, lambda: runner.setHotSpotLevel(outputs, level))
    assert_one_sentence(message, r"hot-spot level must be a number in \[0, 1\]")
    assert outputs.uncertainty.GetDisplayNode().GetLowerThreshold() == 0.3


def _slice_view(scene):
    import slicer

    node = slicer.vtkMRMLSliceNode()
    node.SetLayoutName("Red")
    scene.AddNode(node)
    return node


# (slice index, slice axis) → the sentence; the volume is 4 × 32 × 28 voxels.
BAD_JUMPS = {
    "index NaN": (math.nan, 0, "slice index must be a whole number, got nan"),
    "index 2.7": (2.7, 0, "slice index must be a whole number, got 2.7"),
    "index '2'": ("2", 0, "slice index must be a whole number, got '2'"),
    "index True": (True, 0, "slice index must be a whole number"),
    "index -1": (-1, 0, "Slice -1 is outside the volume, which has 4 slices"),
    "index 7": (7, 0, "Slice 7 is outside the volume"),
    "index 28 along x": (28, 2, "Slice 28 is outside the volume, which has 28 slices"),
    "axis 3": (1, 3, "slice axis must be 0, 1 or 2"),
    "axis -1": (1, -1, "slice axis must be 0, 1 or 2"),
    "axis 1.0": (1, 1.0, "slice axis must be a whole number"),
}


@pytest.mark.parametrize("case", list(BAD_JUMPS))
def test_jump_to_slice_refuses_what_is_not_a_slice_and_moves_no_view(case, mrml_scene):  # noqa: F811
    index, axis, pattern = BAD_JUMPS[case]
    volume = make_volume_node(mrml_scene, image())
    _slice_view(mrml_scene)
    message = refused_without_change(mrml_scene, lambda: SegmentationRunner.jumpToSlice(volume, index, axis))
    assert_one_sentence(message, re.escape(pattern))


def test_jump_to_slice_on_a_node_without_image_data_is_one_sentence(mrml_scene):  # noqa: F811
    import slicer

    empty = mrml_scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "empty")
    assert isinstance(empty, slicer.vtkMRMLScalarVolumeNode)
    _slice_view(mrml_scene)
    message = refused_without_change(mrml_scene, lambda: SegmentationRunner.jumpToSlice(empty, 0, 0))
    assert_one_sentence(message, "The volume 'empty' holds no image data")


def test_jump_to_slice_takes_numpy_integers(mrml_scene):  # noqa: F811
    volume = make_volume_node(mrml_scene, image())
    first = SegmentationRunner.jumpToSlice(volume, np.int64(3), np.int64(0))
    np.testing.assert_allclose(first, SegmentationRunner.jumpToSlice(volume, 3, 0))


def test_an_inference_child_that_exits_non_zero_mid_way_is_one_sentence(bundle, mrml_scene, tmp_path):  # noqa: F811
    """A child interpreter that reports progress, then dies with a message of its own: the runner says how it
    ended in one sentence, publishes nothing, and a job with the real interpreter runs afterwards."""
    failing = tmp_path / "failing-python"
    failing.write_text("#!/bin/sh\necho 'progress 0.5000'\necho 'Fatal Python error: Segmentation fault' >&2\nexit 3\n")
    failing.chmod(0o755)
    runner = SegmentationRunner()
    volume = make_volume_node(mrml_scene, image())
    job = InferenceJob(runner, runner.prepare(volume, bundle), python=str(failing)).start()
    assert job.wait(timeout=60) and job.fraction == 0.5
    message = refused_without_change(mrml_scene, job.finish)
    assert_one_sentence(message, r"^The inference process stopped with exit status 3 \(Fatal Python error: "
                                 r"Segmentation fault\); it may have run out of memory")
    again = InferenceJob(runner, runner.prepare(volume, bundle)).start()
    assert again.wait(timeout=60) and again.finish().segmentation is not None


# What a batch is given → the sentence; refused before any case runs.
BAD_BATCHES = {
    "no volume": (lambda volume, bundle, broken: run_batch([], bundle), "There is no volume to segment"),
    "NaN weights": (lambda volume, bundle, broken: run_batch([volume], broken), "holds NaN or infinite values"),
    "threshold 5": (lambda volume, bundle, broken: run_batch([volume], bundle, lowConfidenceThreshold=5.0),
                    r"threshold must be a number in \[0, 1\], got 5\.0"),
    "hot-spot level NaN": (lambda volume, bundle, broken: run_batch([volume], bundle, hotSpotLevel=math.nan),
                           r"hot-spot level must be a number in \[0, 1\], got nan"),
    "a volume given twice": (lambda volume, bundle, broken: run_batch([volume, volume], bundle),
                             r"^The volume 'input' is given twice; give each volume once\.$"),
}


@pytest.mark.parametrize("case", list(BAD_BATCHES))
def test_a_batch_that_cannot_start_is_one_sentence_and_adds_nothing(case, bundle, mrml_scene, tmp_path):  # noqa: F811
    action, pattern = BAD_BATCHES[case]
    broken = BROKEN_BUNDLES["NaN weights"][0](bundle, tmp_path / "broken.calibseg")
    volume = make_volume_node(mrml_scene, image())
    assert_one_sentence(refused_without_change(mrml_scene, lambda: action(volume, bundle, broken)), pattern)


@pytest.fixture(scope="module")
def three_channels(tmp_path_factory) -> Path:
    from tiny_bundles import make_test_bundle

    return make_test_bundle(tmp_path_factory.mktemp("three") / "three.calibseg", patch_size=(32, 32),
                            in_channels=3, channel_names=["T1", "T2", "FLAIR"])


def _channel_volumes(scene, *names: str) -> list:
    return [make_volume_node(scene, image(), name) for name in names]


# Volumes given to a run of the three-channel bundle (T1, T2, FLAIR) → the sentence; nothing added.
BAD_CHANNEL_RUNS = {
    "one volume for two channels": (lambda scene: [*_channel_volumes(scene, "a_0000", "a_0001")] * 2,
                                    (0, 1, 0), r"^The volume 'a_0000' is already chosen for the 'T1' "
                                               r"channel; choose another volume for 'FLAIR'\.$"),
    "volumes of two cases": (lambda scene: _channel_volumes(scene, "a_0000", "b_0001", "a_0002"), (0, 1, 2),
                             r"belong to different cases \(a, b\) by their channel suffixes"),
    "a channel the model lacks": (lambda scene: _channel_volumes(scene, "a_0000", "a_0001", "a_0003"),
                                  (0, 1, 2), r"channels _0000, _0001, _0003, but the model reads a_0000 to "
                                             r"a_0002"),
    "some named as channels, some not": (lambda scene: _channel_volumes(scene, "a_0000", "T2", "a_0002"),
                                         (0, 1, 2), "'a_0000' carries a channel suffix but 'T2' does not"),
    "no volume chosen for a channel": (lambda scene: [*_channel_volumes(scene, "T1", "FLAIR"), None],
                                       (0, 2, 1), r"^Choose a volume for the model's 'T2' channel\.$"),
    "four volumes for three channels": (lambda scene: _channel_volumes(scene, "a", "b", "c", "d"),
                                        (0, 1, 2, 3),
                                        r"reads 3 channel\(s\) \(T1, T2, FLAIR\), one volume each, but 4"),
}


@pytest.mark.parametrize("case", list(BAD_CHANNEL_RUNS))
def test_volumes_that_are_not_the_models_channels_are_refused(case, three_channels, mrml_scene):  # noqa: F811
    make, order, pattern = BAD_CHANNEL_RUNS[case]
    volumes = make(mrml_scene)
    given = [volumes[index] for index in order]
    message = refused_without_change(
        mrml_scene, lambda: SegmentationRunner().run(given[0], three_channels, channelNodes=given[1:]))
    assert_one_sentence(message, pattern)


def test_one_node_instead_of_a_list_is_a_channel_not_a_type_error(three_channels, mrml_scene):  # noqa: F811
    """``channelNodes=node`` (not ``[node]``) was Python's TypeError: it is that one further channel, so a
    three-channel model says how many volumes it reads."""
    first, second = _channel_volumes(mrml_scene, "T1", "T2")
    message = refused_without_change(
        mrml_scene, lambda: SegmentationRunner().run(first, three_channels, channelNodes=second))
    assert_one_sentence(message, r"^The model reads 3 channel\(s\) \(T1, T2, FLAIR\), one volume each, but 2 "
                                 r"volume\(s\) were given\.$")


# Volume names of a batch → (channels of the bundle, the sentence); refused before any case starts.
BAD_BATCH_NAMES = {
    "two volumes named a_0000": (3, ("a_0000", "a_0001", "a_0002", "a_0000"),
                                 r"^Two volumes are named 'a_0000'; rename one of them \(Data module\)"),
    "a beside a_0000": (3, ("a", "a_0000", "a_0001", "a_0002"),
                        r"^The volumes 'a' and 'a_0000' would both be case 'a'; rename one of them"),
    "two volumes of one name, one channel": (1, ("scan", "other", "scan"), r"^Two volumes are named 'scan'"),
}


@pytest.mark.parametrize("case", list(BAD_BATCH_NAMES))
def test_batch_volumes_that_would_be_one_case_are_refused_before_any_case(case, bundle, three_channels,
                                                                          mrml_scene):  # noqa: F811
    channels, names, pattern = BAD_BATCH_NAMES[case]
    volumes = _channel_volumes(mrml_scene, *names)
    model = three_channels if channels == 3 else bundle
    message = refused_without_change(mrml_scene, lambda: run_batch(volumes, model))
    assert_one_sentence(message, pattern)


def test_volumes_removed_while_a_batch_runs_are_reported_in_their_rows(bundle, mrml_scene):  # noqa: F811
    """The user deletes the running case's volume and a waiting one: each row says so in one sentence, neither
    gets outputs, and the remaining volume is segmented."""
    running, waiting, kept = (make_volume_node(mrml_scene, image(), name) for name in ("running", "waiting", "kept"))

    def remove(fraction: float) -> None:
        if running.GetScene() is not None:
            mrml_scene.RemoveNode(running)
            mrml_scene.RemoveNode(waiting)

    outputs = run_batch([running, waiting, kept], bundle, progress=remove)
    statuses = [row["status"] for row in outputs.rows]
    assert_one_sentence(statuses[0], r"^error: The volume 'running' was removed from the scene before its results "
                                     r"were added; nothing was added\.$")
    assert_one_sentence(statuses[1], r"^error: The volume 'waiting' was removed from the scene before its turn\.$")
    assert statuses[2] == "ok" and outputs.cases[2].outputs.segmentation.GetScene() is mrml_scene
    names = [mrml_scene.GetNthNode(index).GetName() or "" for index in range(mrml_scene.GetNumberOfNodes())]
    assert not [name for name in names if name.startswith(("running", "waiting"))], names


def _heart_phases(scene):
    """An ED and an ES phase on the module's grid."""
    from CalibSegRunner import ed_es_phases

    ed, es = (make_volume_node(scene, image(), name) for name in ("ED", "ES"))
    return ed_es_phases(ed, es)


# What a cardiac function measurement is given (bundle, output folder: files in tmp_path) → the sentence; refused
# before anything runs, no file written.
BAD_FUNCTION_REQUESTS = {
    "no bundle": (lambda folder: ("", folder / "out"), r"^Choose a model bundle \(\.calibseg file\)\.$"),
    "a missing bundle": (lambda folder: (folder / "missing.calibseg", folder / "out"), "No model bundle"),
    "a bundle without the heart's codes": (
        lambda folder: (_tiny(folder, cardiac=False), folder / "out"),
        r"^The bundle's terminology codes no class as left ventricle \(SCT 87878005\), right ventricle "),
    "an output folder that is a file": (
        lambda folder: (_tiny(folder), _file(folder / "taken")), r"is a file, not a folder; choose another output"),
    "function.json a folder": (
        lambda folder: (_tiny(folder), _folder(folder / "out" / "function.json").parent),
        r"function\.json: a folder of that name is in the way"),
}


def _tiny(folder: Path, cardiac: bool = True) -> Path:
    from CalibSegTesting.scene import cardiac_terminology, tiny_bundle

    return tiny_bundle(folder / ("heart" if cardiac else "plain"),
                       **({"class_terminology": cardiac_terminology()} if cardiac else {}))


def _file(path: Path) -> Path:
    path.write_text("taken")
    return path


def _folder(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


@pytest.mark.parametrize("case", list(BAD_FUNCTION_REQUESTS))
def test_a_function_request_that_cannot_run_is_one_sentence(case, mrml_scene, tmp_path):  # noqa: F811
    from fault_checks import tree_snapshot

    from CalibSegRunner import FunctionRunner

    make, pattern = BAD_FUNCTION_REQUESTS[case]
    bundle, folder = make(tmp_path)
    phases = _heart_phases(mrml_scene)
    files = tree_snapshot(tmp_path)
    message = refused_without_change(mrml_scene, lambda: FunctionRunner().run(phases, bundle, "cpu", folder))
    assert_one_sentence(message, pattern)
    assert tree_snapshot(tmp_path) == files


def test_a_function_child_that_dies_is_one_sentence_and_writes_nothing(mrml_scene, tmp_path):  # noqa: F811
    """The measuring child reports progress, then dies with a message of its own: one sentence saying how it
    ended, nothing published, no file written."""
    from CalibSegRunner import FunctionJob, FunctionRunner

    failing = tmp_path / "failing-python"
    failing.write_text("#!/bin/sh\necho 'progress 0.2500'\necho 'Killed' >&2\nexit 137\n")
    failing.chmod(0o755)
    request = FunctionRunner().request(_heart_phases(mrml_scene), _tiny(tmp_path), "cpu", tmp_path / "out")
    job = FunctionJob(request, python=str(failing)).start()
    assert job.wait(timeout=60) and job.fraction == 0.25
    message = refused_without_change(mrml_scene, job.finish)
    assert_one_sentence(message, r"^The cardiac function process stopped with exit status 137 \(Killed\); it may have "
                                 r"run out of memory")
    assert not (tmp_path / "out").exists()
