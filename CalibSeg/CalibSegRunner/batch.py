"""Segment several volume nodes in turn, one child process at a time, with one progress for the whole batch.

From Slicer's Python console, every loaded volume with explicit arguments::

    from CalibSegRunner import batch_volumes, run_batch
    outputs = run_batch(batch_volumes(slicer.mrmlScene), "acdc_crac", device="cpu")
    outputs.rows                      # one per case: case, status, review flag, per structure volume and predicted Dice
    outputs.cases[0].outputs.summary  # a segmented case's quality summary (None for a case that failed)

The module's widget drives the same :class:`BatchJob` from its timer: :meth:`BatchJob.advance` on the main thread
publishes a case whose child has ended and starts the next, :attr:`BatchJob.fraction` and
:attr:`BatchJob.status_text` feed the progress bar and its label, :meth:`BatchJob.finish` adds the summary table.

With a bundle of K input channels (``channel_names``, e.g. T1, T1ce, T2, FLAIR) a case is the volumes named
``<case>_0000`` ... ``<case>_000K`` (as Slicer names volumes loaded from nnU-Net-style files, and as
``calibseg-predict --image-dir`` groups files), channel 0 first; a volume not named so, or a case missing a channel,
is one sentence in its row. A case's outputs are named after the case (``a CalibSeg segmentation``). Volumes
that would be one case (two named ``a_0000``, or ``a`` beside ``a_0000``; for a one-channel bundle two of one
name) are refused before any case starts: every volume is its case's or its own, with a row and outputs of its
own.

Each case runs as one :class:`~CalibSegRunner.job.InferenceJob` and is published as a single run's outputs are
(segmentation, overlays, quality table, named after its volume). A case that fails — an input the library
refuses, a child that dies — gets its sentence in its row and the others still run. Cancel ends the running child
and starts no other: the cases finished before keep their outputs, the rest are ``cancelled`` in the table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from .job import InferenceJob
from .nodes import NodeTransaction, add_batch_table, is_calibseg_output
from .runner import CalibSegOutputs, RunSettings, SegmentationRunner

__all__ = ["BatchCase", "BatchOutputs", "BatchJob", "batch_volumes", "run_batch", "BATCH_TABLE_NAME", "OK",
           "CANCELLED"]

BATCH_TABLE_NAME = "CalibSeg batch summary"
INPUT_CLASS = "vtkMRMLScalarVolumeNode"  # the input selector's class: no labelmaps, vector or tensor volumes
OK = "ok"  # a case's status when it was segmented (as in calibseg-predict's predictions.csv)
CANCELLED = "cancelled"
_WAITING, _RUNNING = "waiting", "running"
POLL_INTERVAL_S = 0.05  # how often wait() looks at the running child


def batch_volumes(scene) -> list:
    """The volumes a batch segments by default: every scalar volume of ``scene`` in scene order (exactly
    :data:`INPUT_CLASS`, as the module's input selector lists them: labelmaps are labels, not images), except
    the confidence and uncertainty volumes CalibSeg added (:func:`~CalibSegRunner.nodes.is_calibseg_output`)."""
    nodes = scene.GetNodesByClass(INPUT_CLASS)
    volumes = [nodes.GetItemAsObject(index) for index in range(nodes.GetNumberOfItems())]
    return [node for node in volumes if node.GetClassName() == INPUT_CLASS and not is_calibseg_output(node)]


@dataclass(eq=False)  # a case is itself, even when a volume is given twice
class BatchCase:
    """One case of a batch and how it ended: ``status`` is ``ok``, ``error: <sentence>`` or ``cancelled``
    (``waiting`` / ``running`` before)."""

    volume: object  # its (first channel's) volume node: the grid and name of its outputs
    name: str
    status: str = _WAITING
    channels: tuple = ()  # the volume nodes of a multi-channel bundle's further channels, in the bundle's order
    outputs: CalibSegOutputs | None = None  # the nodes published for it, when it was segmented

    @property
    def row(self) -> dict:
        """Its row of the summary table, the shape ``calibseg-predict --image-dir`` writes
        (:func:`CalibSegLib.predict.batch_row`)."""
        from CalibSegLib.predict import batch_row

        return batch_row(self.name, self.status, None if self.outputs is None else self.outputs.summary)


@dataclass
class BatchOutputs:
    """What a batch added: every case's outputs, and one summary table over the cases."""

    cases: list[BatchCase]
    summary_table: object
    rows: list[dict]  # the table's rows, one per case


class BatchJob:
    """Segment ``volumeNodes`` in turn with ``settings`` (:meth:`SegmentationRunner.settings`), each case an
    :class:`InferenceJob` (``python``: its interpreter, default :func:`~CalibSegRunner.job.child_python`).

    Every method runs on the main thread (they add nodes); only the children work in the background.

    Raises:
        ValueError: no volume given, a volume given twice, or two volumes that would be one case (the same
            name, ``a`` beside ``a_0000`` for a multi-channel bundle); nothing is run then.
    """

    def __init__(self, runner: SegmentationRunner, volumeNodes: Sequence, settings: RunSettings,
                 python: str | None = None) -> None:
        from CalibSegLib.channels import input_names

        volumes = list(volumeNodes)
        if not volumes:
            raise ValueError("There is no volume to segment; load a scalar volume first.")
        self.runner, self.settings, self.python = runner, settings, python
        self.scene = volumes[0].GetScene()  # the summary table's
        self.cases = _cases(volumes, input_names(settings.metadata))
        self._job: InferenceJob | None = None
        self._running: BatchCase | None = None
        self._cancelled = False
        self._bundle_refusal: str | None = None  # the child refused the bundle: no case can run, the batch stops

    @property
    def fraction(self) -> float:
        """Progress of the whole batch in [0, 1]: (ended cases + the running case's fraction) / cases; never
        decreases (a case ending adds 1 where its own fraction stood below 1)."""
        ended = sum(case.status not in (_WAITING, _RUNNING) for case in self.cases)
        running = 0.0 if self._job is None else min(max(self._job.fraction, 0.0), 1.0)
        return (ended + running) / len(self.cases)

    @property
    def running_case(self) -> BatchCase | None:
        """The case whose child runs now (None before :meth:`start` and once all ended)."""
        return self._running

    @property
    def running_job(self) -> InferenceJob | None:
        """The running case's :class:`InferenceJob`."""
        return self._job

    @property
    def status_text(self) -> str:
        """``case k of n: <name>`` while a case runs; once done, how many were segmented, failed, cancelled."""
        total = len(self.cases)
        if self._running is not None:
            number = next(index for index, case in enumerate(self.cases, start=1) if case is self._running)
            return f"case {number} of {total}: {self._running.name}"
        segmented = sum(case.status == OK for case in self.cases)
        cancelled = sum(case.status == CANCELLED for case in self.cases)
        failed = total - segmented - cancelled
        parts = [f"{segmented} of {total} cases segmented"] + [f"{count} {what}" for count, what in
                                                                  ((failed, "failed"), (cancelled, "cancelled"))
                                                                  if count]
        return ", ".join(parts) + "."

    def start(self) -> "BatchJob":
        """Start the first case (a case that cannot start is reported in its row, and the next one starts)."""
        self._start_next()
        return self

    def advance(self) -> None:
        """If the running case's child has ended, publish its outputs (or record why it failed) and start the
        next case; call it from a timer (the widget) or :meth:`wait`."""
        if self._job is not None and self._job.done():
            self._end_running()
            self._start_next()

    def done(self) -> bool:
        """True once every case has ended (segmented, failed or cancelled)."""
        return all(case.status not in (_WAITING, _RUNNING) for case in self.cases)

    def cancel(self) -> None:
        """End the running child at once and start no other case; :meth:`advance` records them as cancelled."""
        self._cancelled = True
        if self._job is not None:
            self._job.cancel()
        else:
            self._start_next()

    def wait(self, timeout: float | None = None, progress: Callable[[float], None] | None = None) -> bool:
        """Advance until :meth:`done` (True) or ``timeout`` seconds passed (False), calling ``progress(fraction)``
        after each look at the running child."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.advance()
            if progress is not None:
                progress(self.fraction)
            if self.done():
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(POLL_INTERVAL_S)

    def finish(self) -> BatchOutputs:
        """Add the summary table over the cases (one :attr:`BatchCase.row` each) and return the batch's outputs.

        Raises:
            ValueError: the inference child refused the bundle (its weights, which only the child reads) on the
                first case, so no case ran and nothing was added (one sentence).
        """
        if not self.done():
            raise RuntimeError("The batch is still running; wait for done() first.")
        if self._bundle_refusal is not None:
            raise ValueError(self._bundle_refusal)
        rows = [case.row for case in self.cases]
        with NodeTransaction(self.scene):
            table = add_batch_table(self.scene, BATCH_TABLE_NAME, rows)
        return BatchOutputs(self.cases, table, rows)

    def _start_next(self) -> None:
        """Start the first waiting case that can start (each one that cannot gets its sentence); all waiting cases
        are cancelled after :meth:`cancel`."""
        from CalibSegLib.io import os_error_sentence

        self._job, self._running = None, None
        for case in self.cases:
            if case.status != _WAITING:
                continue
            if self._cancelled or self._bundle_refusal is not None:
                case.status = CANCELLED
                continue
            try:
                if case.volume.GetScene() is not self.scene:
                    raise ValueError(f"The volume '{case.name}' was removed from the scene before its turn.")
                request = self.runner.request(case.volume, self.settings, channelNodes=case.channels)
                request.output_name = case.name  # a multi-channel case's outputs are named after the case
                self._job = InferenceJob(self.runner, request, self.python).start()
            except ValueError as error:
                case.status = f"error: {error}"
                continue
            except OSError as error:
                case.status = f"error: {os_error_sentence(error)}"
                continue
            case.status, self._running = _RUNNING, case
            return

    def _end_running(self) -> None:
        """Publish the running case's outputs, or record in its status why there are none."""
        from CalibSegLib.bundle import BundleError
        from CalibSegLib.inference import InferenceCancelled
        from CalibSegLib.io import os_error_sentence

        case = self._running
        try:
            case.outputs = self._job.finish()
            case.status = OK
        except InferenceCancelled:
            case.status = CANCELLED
        except BundleError as error:
            case.status, self._bundle_refusal = f"error: {error}", str(error)
        except ValueError as error:
            case.status = f"error: {error}"
        except OSError as error:
            case.status = f"error: {os_error_sentence(error)}"


def _check_distinct(volumes: list, grouped: bool) -> None:
    """Refuse (ValueError, one sentence) a volume given twice, or two volumes that would be one case's same
    channel or two cases of one name (:func:`CalibSegLib.channels.first_collision`): their outputs and rows
    would be one."""
    from CalibSegLib.channels import first_collision, first_repeat
    from CalibSegLib.io import case_and_channel

    repeat = first_repeat([volume.GetID() for volume in volumes])
    if repeat is not None:
        name = volumes[repeat[0]].GetName()
        raise ValueError(f"The volume '{name}' is given twice; give each volume once.")
    names = [volume.GetName() for volume in volumes]
    collision = first_collision(names, grouped)
    if collision is not None:
        first, second = (names[position] for position in collision)
        clash = (f"Two volumes are named '{first}'" if first == second else
                 f"The volumes '{first}' and '{second}' would both be case '{case_and_channel(first)[0]}'")
        raise ValueError(f"{clash}; rename one of them (Data module), so that each case gets its own outputs "
                         "and row.")


def _cases(volumes: list, channel_names: list[str]) -> list[BatchCase]:
    """The batch's cases: each volume alone for a one-channel bundle; else the volumes grouped by their names'
    ``_000K`` suffixes (:func:`CalibSegLib.io.group_channels`), a case without exactly channels 0 ... K - 1 already
    failed with its sentence. Volumes that would be one case are refused first (:func:`_check_distinct`)."""
    from CalibSegLib.io import case_and_channel, group_channels

    _check_distinct(volumes, grouped=len(channel_names) > 1)
    if len(channel_names) == 1:
        return [BatchCase(volume, volume.GetName()) for volume in volumes]
    expected = list(range(len(channel_names)))
    wanted = (f"the model reads {len(channel_names)} channels ({', '.join(channel_names)}) from volumes named "
              f"<case>_0000 to <case>_{expected[-1]:04d}, in that order")
    cases = []
    for name, channels in group_channels([volume.GetName() for volume in volumes]):
        nodes = [volumes[channels[index]] for index in sorted(channels)]
        case = BatchCase(nodes[0], name, channels=tuple(nodes[1:]))
        if case_and_channel(nodes[0].GetName())[1] is None:
            case.status = (f"error: '{name}' is not named as a channel of a case, but {wanted}; rename the volumes, "
                           "or segment the case alone with one volume per channel.")
        elif sorted(channels) != expected:
            found = ", ".join(f"{index:04d}" for index in sorted(channels))
            case.status = (f"error: Case '{name}' has the channel volume(s) {found}, but {wanted}; load the missing "
                           "ones, or segment the case alone with one volume per channel.")
        cases.append(case)
    return cases


def run_batch(volumeNodes: Sequence, bundlePath, device: str = "auto", lowConfidenceThreshold: float | None = None,
              hotSpotLevel: float | None = None, progress: Callable[[float], None] | None = None,
              runner: SegmentationRunner | None = None) -> BatchOutputs:
    """Segment ``volumeNodes`` (e.g. :func:`batch_volumes`) with a bundle (a ``.calibseg`` path or a shipped
    model's name) in the calling thread, which must be the main thread (the Python console); arguments as
    :meth:`SegmentationRunner.prepare`'s, ``progress(fraction)`` for the whole batch.

    Raises:
        ValueError: a bad bundle or setting, or no volume (one sentence; nothing run, nothing added).
    """
    runner = runner or SegmentationRunner()
    settings = runner.settings(bundlePath, device, lowConfidenceThreshold, hotSpotLevel)
    job = BatchJob(runner, volumeNodes, settings).start()
    job.wait(progress=progress)
    return job.finish()
