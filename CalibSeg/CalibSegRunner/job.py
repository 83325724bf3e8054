"""Background inference in a child process; the main thread polls and publishes.

The widget starts an :class:`InferenceJob`, polls :attr:`InferenceJob.fraction` from a timer for the
progress bar, and calls :meth:`InferenceJob.finish` on the main thread once :meth:`InferenceJob.done` is
true; MRML is only touched there. The network runs in a child Python process
(:mod:`CalibSegLib.analysis_process`, as SlicerMONAIAuto3DSeg and SlicerTotalSegmentator run theirs): a crash,
an out-of-memory kill or a hung CUDA call there ends that process, never the user's Slicer session, and
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
from pathlib import Path

from .runner import CalibSegOutputs, CalibSegRequest, SegmentationRunner

__all__ = ["InferenceJob", "child_python"]


def child_python() -> str:
    """The interpreter the child runs in: Slicer's ``PythonSlicer`` inside Slicer (``sys.executable`` is the
    application there), else this process's own."""
    return shutil.which("PythonSlicer") or sys.executable


def _library_path() -> str:
    """``PYTHONPATH`` for the child, so it imports the very CalibSegLib this process runs."""
    import CalibSegLib

    parent = str(Path(CalibSegLib.__file__).resolve().parents[1])
    return os.pathsep.join([parent, *filter(None, [os.environ.get("PYTHONPATH")])])


class InferenceJob:
    """One :func:`CalibSegLib.analysis.analyse_case` of ``request`` in a child process, with progress and cancel.

    ``python``: the child's interpreter (default :func:`child_python`).
    """

    def __init__(self, runner: SegmentationRunner, request: CalibSegRequest, python: str | None = None) -> None:
        self.runner = runner
        self.request = request
        self.python = python or child_python()
        self.fraction = 0.0
        self._folder: Path | None = None  # made by start(), removed by finish()
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._cancelled = False

    def _progress(self, fraction: float) -> None:
        self.fraction = fraction

    def _read_progress(self) -> None:
        """Follow the child's stdout: each ``progress <fraction>`` line moves :attr:`fraction`."""
        from CalibSegLib.analysis_process import PROGRESS_PREFIX

        for line in self._process.stdout:
            if line.startswith(PROGRESS_PREFIX):
                self._progress(float(line[len(PROGRESS_PREFIX):]))

    def start(self) -> "InferenceJob":
        from CalibSegLib.analysis_process import write_request

        request = self.request
        self._folder = Path(tempfile.mkdtemp(prefix="calibseg-job-"))
        try:
            write_request(self._folder, request.bundle_path, request.image, request.spacing,
                          request.reference, request.device, request.hot_spot_level)
            with (self._folder / "stderr.txt").open("w") as stderr:
                self._process = subprocess.Popen(
                    [self.python, "-m", "CalibSegLib.analysis_process", str(self._folder)], stdout=subprocess.PIPE,
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

    def finish(self) -> CalibSegOutputs:
        """Publish the results (main thread).

        Raises:
            InferenceCancelled: :meth:`cancel` ended the child.
            BundleError: the child refused the bundle (its weights; one sentence); nothing added.
            ValueError: the library refused the input, or the child died (one sentence each); nothing added.
        """
        from CalibSegLib.analysis_process import BUNDLE_REFUSED_STATUS, REFUSED_STATUS, read_result
        from CalibSegLib.bundle import BundleError
        from CalibSegLib.inference import InferenceCancelled

        if not self.done():
            raise RuntimeError("The inference job is still running; wait for done() first.")
        try:
            status = self._process.returncode
            if self._cancelled:
                raise InferenceCancelled("The inference was cancelled; the scene is unchanged.")
            if status != 0:
                sentence = self._failure(status, (REFUSED_STATUS, BUNDLE_REFUSED_STATUS))
                raise (BundleError if status == BUNDLE_REFUSED_STATUS else ValueError)(sentence)
            analysis = read_result(self._folder)
        finally:
            shutil.rmtree(self._folder, ignore_errors=True)
        return self.runner.publish(self.request, analysis)

    def _failure(self, status: int, refused: tuple[int, ...]) -> str:
        """One sentence for a child that ended with ``status``: its own refusal (a status in ``refused``), or how
        it died."""
        lines = [line for line in (self._folder / "stderr.txt").read_text(errors="replace").splitlines() if line]
        if status in refused and lines and lines[-1].startswith("error: "):
            return lines[-1][len("error: "):]
        how = (f"was killed by signal {-status}" if status < 0 else f"stopped with exit status {status}")
        last = f" ({lines[-1].strip()[:200]})" if lines else ""
        return (f"The inference process {how}{last}; it may have run out of memory, so try the CPU device or a "
                "smaller volume; the scene is unchanged.")
