"""The background job: its child process publishes what an in-process run does; a cancel or a killed child leaves
the scene unchanged."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from CalibSegRunner import InferenceJob, SegmentationRunner

from .scene import make_volume_node, phantom, scene_is_unchanged_after, scene_snapshot, tiny_bundle

__all__ = ["check_cancel_leaves_the_scene_unchanged", "check_background_job_publishes_what_run_publishes",
           "check_a_killed_inference_child_is_one_sentence_and_the_next_run_works"]


def _interrupted_job(scene, work_dir: Path, interrupt: Callable[[InferenceJob], None]):
    """A background job on a larger phantom whose first progress report calls ``interrupt(job)``, run until it
    ended; returns the volume, the runner, the job and the scene's snapshot from before it started."""
    image, _ = phantom(shape=(40, 48, 40))
    volume = make_volume_node(scene, image)
    runner = SegmentationRunner()
    job = InferenceJob(runner, runner.prepare(volume, tiny_bundle(work_dir)))
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

    image, labels = phantom()
    volume = make_volume_node(scene, image)
    reference = make_volume_node(scene, labels, "reference", "vtkMRMLLabelMapVolumeNode")
    bundle_path = tiny_bundle(work_dir)
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
    error = scene_is_unchanged_after(scene, job.finish, "killed child")
    assert error.startswith("The inference process was killed by signal 9"), error
    assert error.count(". ") == 0 and error.endswith("the scene is unchanged."), error
    assert scene_snapshot(scene) == before
    again = InferenceJob(runner, runner.prepare(volume, tiny_bundle(work_dir))).start()
    assert again.wait(timeout=120) and again.finish().segmentation is not None
