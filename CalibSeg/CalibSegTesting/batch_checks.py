"""Batches: every loaded volume (or multichannel case) segmented as a single run is, a failing case reported in its
row, and a cancel or a dead child keeping the finished cases' outputs."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable

import numpy as np

from CalibSegRunner import BatchJob, SegmentationRunner, batch_volumes
from CalibSegRunner.batch import BATCH_TABLE_NAME, CANCELLED, OK

from .scene import (NUM_CLASSES, SPACING_XYZ, class_segment_id, hand_made_quality_model, make_volume_node, phantom,
                    table_columns, tiny_bundle)

__all__ = ["check_a_batch_segments_every_loaded_volume_and_reports_the_one_that_fails",
           "check_a_batch_with_a_multichannel_bundle_reads_each_case_from_its_channel_volumes",
           "check_cancelling_a_batch_keeps_the_finished_cases_outputs",
           "check_a_batch_case_whose_child_dies_is_one_sentence_and_the_others_run"]


def _batch(scene, work_dir: Path, volumes: list, on_progress: Callable[[BatchJob], None] | None = None,
           **settings) -> tuple[BatchJob, list[float], list[str]]:
    """A :class:`BatchJob` over ``volumes`` with the quality-model bundle, run to its end; ``on_progress(job)``
    after each look at the running child. Returns the job and the fractions and status texts seen."""
    runner = SegmentationRunner()
    bundle_path = tiny_bundle(work_dir, quality_model=hand_made_quality_model())
    job = BatchJob(runner, volumes, runner.settings(bundle_path, **settings))
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
        (phantom()[0], "first"), (np.full((6, 48, 40), 7.0, np.float32), "constant"),
        (phantom(seed=1)[0], "second")))
    make_volume_node(scene, phantom()[1], "first labels", "vtkMRMLLabelMapVolumeNode")
    earlier = SegmentationRunner().run(first, tiny_bundle(work_dir))  # adds "first confidence" and "first uncertainty"
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
    columns = table_columns(outputs.summary_table)
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

    first, second = phantom()[0], phantom(seed=1)[0]
    channel_0 = make_volume_node(scene, first, "a_0000")
    make_volume_node(scene, first, "b_0000")
    channel_1 = make_volume_node(scene, second, "a_0001")
    make_volume_node(scene, second, "T2")
    bundle_path = tiny_bundle(work_dir, in_channels=2, channel_names=["T1", "T2"])
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
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(segmentation, class_segment_id(segmentation, label),
                                                          channel_0)
        np.testing.assert_array_equal(mask > 0, expected == label)


def check_cancelling_a_batch_keeps_the_finished_cases_outputs(scene, work_dir: Path) -> None:
    """Cancel as the second case starts: its child ends, the third never starts; the first case's outputs and the
    summary table (the others ``cancelled``) are all the batch added."""
    volumes = [make_volume_node(scene, phantom()[0], "finished"),
               make_volume_node(scene, phantom(shape=(40, 48, 40))[0], "interrupted"),
               make_volume_node(scene, phantom()[0], "not started")]
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

    volumes = [make_volume_node(scene, phantom(shape=(40, 48, 40))[0], "killed"),
               make_volume_node(scene, phantom()[0], "survivor")]
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
