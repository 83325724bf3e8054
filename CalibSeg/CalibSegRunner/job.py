"""Background inference: the network runs in a worker thread; the main thread polls and publishes.

The widget starts an :class:`InferenceJob`, polls :attr:`InferenceJob.fraction` from a timer
for the progress bar, and calls :meth:`InferenceJob.finish` on the main thread once
:meth:`InferenceJob.done` is true; MRML is only touched there.
"""

from __future__ import annotations

import threading

from .runner import CalibSegOutputs, CalibSegRequest, SegmentationRunner

__all__ = ["InferenceJob"]


class InferenceJob:
    """One run of :meth:`SegmentationRunner.compute` in a daemon thread, with progress and cancel."""

    def __init__(self, runner: SegmentationRunner, request: CalibSegRequest) -> None:
        self.runner = runner
        self.request = request
        self.fraction = 0.0
        self.error: BaseException | None = None
        self._computation = None
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._work, name="CalibSeg inference", daemon=True)

    def _progress(self, fraction: float) -> None:
        self.fraction = fraction

    def _work(self) -> None:
        try:
            self._computation = self.runner.compute(self.request, self._progress, self._cancel)
        except BaseException as error:  # reported to the main thread by finish()
            self.error = error

    def start(self) -> "InferenceJob":
        self._thread.start()
        return self

    def cancel(self) -> None:
        """Ask the worker to stop before its next batch."""
        self._cancel.set()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return self.done()

    def finish(self) -> CalibSegOutputs:
        """Publish the results (main thread); re-raises the worker's error, including InferenceCancelled."""
        if not self.done():
            raise RuntimeError("The inference job is still running; wait for done() first.")
        if self.error is not None:
            raise self.error
        return self.runner.publish(self.request, self._computation)
