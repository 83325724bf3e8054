"""Background work in a child process; the main thread polls and publishes.

:class:`ChildJob` runs a library entry point in a child process: an :class:`InferenceJob` one case's inference, a
:class:`~CalibSegRunner.function.FunctionJob` a cardiac function measurement. The widget starts a job, polls
:attr:`ChildJob.fraction` from a timer for the progress bar, and calls :meth:`ChildJob.finish` on the main thread
once :meth:`ChildJob.done` is true; MRML is only touched there. The network runs in a child Python process
(:mod:`CalibSegLib.analysis_process`'s protocol, as SlicerMONAIAuto3DSeg and SlicerTotalSegmentator run theirs): a
crash, an out-of-memory kill or a hung CUDA call there ends that process, never the user's Slicer session, and
becomes one sentence with the scene unchanged. The child alone reads the bundle's weights; this process has
read its metadata only (:meth:`~CalibSegRunner.runner.SegmentationRunner.settings`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from abc import ABC, abstractmethod
from pathlib import Path

from .runner import CalibSegOutputs, CalibSegRequest, SegmentationRunner

__all__ = ["ChildJob", "InferenceJob", "child_python"]


def child_python() -> str:
    """The interpreter the child runs in: Slicer's ``PythonSlicer`` inside Slicer (``sys.executable`` is the
    application there), else this process's own."""
    return shutil.which("PythonSlicer") or sys.executable


def _library_path() -> str:
    """``PYTHONPATH`` for the child, so it imports the very CalibSegLib this process runs."""
    import CalibSegLib

    parent = str(Path(CalibSegLib.__file__).resolve().parents[1])
    return os.pathsep.join([parent, *filter(None, [os.environ.get("PYTHONPATH")])])


class ChildJob(ABC):
    """Work of the library done in a child process (``python -m <module> FOLDER``, the protocol of
    :mod:`CalibSegLib.analysis_process`), with progress and cancel; a subclass writes the request and publishes the
    result.

    ``python``: the child's interpreter (default :func:`child_python`).
    """

    module = ""  # the child's entry point
    what = "inference"  # the work's name in the sentences

    def __init__(self, python: str | None = None) -> None:
        self.python = python or child_python()
        self.fraction = 0.0
        self._folder: Path | None = None  # made by start(), removed by finish()
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._cancelled = False

    @abstractmethod
    def _write_request(self, folder: Path) -> None:
        """Write what the child reads into ``folder``."""

    @abstractmethod
    def _publish(self, folder: Path):
        """Read the child's result from ``folder`` and add it to the scene (main thread)."""

    def _progress(self, fraction: float) -> None:
        self.fraction = fraction

    def _read_progress(self) -> None:
        """Follow the child's stdout: each ``progress <fraction>`` line moves :attr:`fraction`."""
        from CalibSegLib.analysis_process import PROGRESS_PREFIX

        for line in self._process.stdout:
            if line.startswith(PROGRESS_PREFIX):
                self._progress(float(line[len(PROGRESS_PREFIX):]))

    def start(self) -> "ChildJob":
        """Write the request and start the child; returns the job itself."""
        self._folder = Path(tempfile.mkdtemp(prefix="calibseg-job-"))
        try:
            self._write_request(self._folder)
            with (self._folder / "stderr.txt").open("w") as stderr:
                self._process = subprocess.Popen(
                    [self.python, "-m", self.module, str(self._folder)], stdout=subprocess.PIPE,
                    stderr=stderr, stdin=subprocess.DEVNULL, text=True,
                    env={**os.environ, "PYTHONPATH": _library_path()})
        except OSError:  # a full disk, a missing interpreter: no child, so finish() will not clean up
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        self._reader = threading.Thread(target=self._read_progress, name="CalibSeg progress", daemon=True)
        self._reader.start()
        return self

    def cancel(self) -> None:
        """End the child at once (its partial results are discarded)."""
        self._cancelled = True
        if self._process is not None and self._process.poll() is None:
            self._process.kill()

    def done(self) -> bool:
        return self._process is not None and self._process.poll() is not None and not self._reader.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        self._reader.join(timeout)
        return self.done()

    def finish(self):
        """Publish the results (main thread).

        Raises:
            InferenceCancelled: :meth:`cancel` ended the child.
            BundleError: the child refused the bundle (its weights; one sentence); nothing added.
            ValueError: the library refused the input, or the child died (one sentence each); nothing added.
        """
        from CalibSegLib.analysis_process import BUNDLE_REFUSED_STATUS, REFUSED_STATUS
        from CalibSegLib.bundle import BundleError
        from CalibSegLib.inference import InferenceCancelled

        if not self.done():
            raise RuntimeError(f"The {self.what} job is still running; wait for done() first.")
        try:
            status = self._process.returncode
            if self._cancelled:
                raise InferenceCancelled(f"The {self.what} was cancelled; the scene is unchanged.")
            if status != 0:
                sentence = self._failure(status, (REFUSED_STATUS, BUNDLE_REFUSED_STATUS))
                raise (BundleError if status == BUNDLE_REFUSED_STATUS else ValueError)(sentence)
            return self._publish(self._folder)
        finally:
            shutil.rmtree(self._folder, ignore_errors=True)

    def _failure(self, status: int, refused: tuple[int, ...]) -> str:
        """One sentence for a child that ended with ``status``: its own refusal (a status in ``refused``), or how
        it died."""
        lines = [line for line in (self._folder / "stderr.txt").read_text(errors="replace").splitlines() if line]
        if status in refused and lines and lines[-1].startswith("error: "):
            return lines[-1][len("error: "):]
        how = (f"was killed by signal {-status}" if status < 0 else f"stopped with exit status {status}")
        last = f" ({lines[-1].strip()[:200]})" if lines else ""
        return (f"The {self.what} process {how}{last}; it may have run out of memory, so try the CPU device or a "
                "smaller volume; the scene is unchanged.")


class InferenceJob(ChildJob):
    """One :func:`CalibSegLib.analysis.analyse_case` of ``request`` in a child process, with progress and cancel.

    ``python``: the child's interpreter (default :func:`child_python`).
    """

    module = "CalibSegLib.analysis_process"

    def __init__(self, runner: SegmentationRunner, request: CalibSegRequest, python: str | None = None) -> None:
        super().__init__(python)
        self.runner = runner
        self.request = request

    def _write_request(self, folder: Path) -> None:
        from CalibSegLib.analysis_process import write_request

        request = self.request
        write_request(folder, request.bundle_path, request.image, request.spacing, request.reference, request.device,
                      request.hot_spot_level)

    def _publish(self, folder: Path) -> CalibSegOutputs:
        from CalibSegLib.analysis_process import read_result

        return self.runner.publish(self.request, read_result(folder))
