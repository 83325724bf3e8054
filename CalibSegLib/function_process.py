"""Cardiac function measured in a child process: the request and the result as files, and the child's entry point.

The protocol of :mod:`CalibSegLib.analysis_process` (a host that must survive whatever the inference does writes
the request into a folder, runs ``<python> -m CalibSegLib.function_process FOLDER`` and reads the result when it
exits 0), for :mod:`CalibSegLib.cardiac`'s measurement:

- the request: ``phases.npz`` (the phases ``(T, z, y, x)``, read without pickle) and ``request.json`` (the bundle's
  path, the spacing ``(z, y, x)`` mm, the trigger times in ms or null, whether the phases are a cine or an ED and an
  ES volume, the device);
- the child prints ``progress <fraction>`` lines on stdout and writes ``function.json``, the file
  ``calibseg-function`` writes;
- it exits 0 done, 2 with ``error: <one sentence>`` on stderr for input the library refuses, 3 where the bundle is
  refused.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from CalibSegLib.analysis_process import PROGRESS_PREFIX, REQUEST_NAME, run_child
from CalibSegLib.cardiac.command import FUNCTION_NAME

__all__ = ["write_function_request", "measure_phases", "read_function_result", "main"]

_PHASES = "phases.npz"


def write_function_request(folder: str | Path, bundle_path: str | Path, images: np.ndarray, spacing: Sequence[float],
                           trigger_times_ms: Sequence[float] | None, cine: bool, device: str = "auto") -> Path:
    """Write what the child needs into ``folder`` (which must exist): ``images`` ``(T, z, y, x)`` (``cine``: every
    phase of a cycle; else ED then ES), their ``spacing`` ``(z, y, x)`` mm, ``trigger_times_ms`` ``(T,)`` or None.
    Returns ``folder``."""
    folder = Path(folder)
    np.savez(folder / _PHASES, images=np.asarray(images))
    request = {"bundle": str(bundle_path), "spacing": [float(value) for value in spacing], "device": device,
               "trigger_times_ms": None if trigger_times_ms is None else [float(value) for value in trigger_times_ms],
               "cine": bool(cine)}
    (folder / REQUEST_NAME).write_text(json.dumps(request))
    return folder


def measure_phases(bundle_path: str | Path, images: np.ndarray, spacing: Sequence[float],
                   trigger_times_ms: Sequence[float] | None, cine: bool, device: str = "auto",
                   progress: Callable[[float], None] | None = None,
                   cancel: threading.Event | None = None) -> dict:
    """The ``function.json`` dictionary of ``images`` ``(T, z, y, x)`` measured with the bundle: a cine's phases
    (:func:`CalibSegLib.cardiac.function.measure_cine`, ED and ES chosen by its rule), or ED then ES
    (:func:`~CalibSegLib.cardiac.function.measure_function`); ``spacing`` ``(z, y, x)`` mm."""
    from CalibSegLib.cardiac.function import measure_cine, measure_function
    from CalibSegLib.inference import Predictor
    from CalibSegLib.io import ImageGeometry

    predictor = Predictor(bundle_path, device=device)
    geometry = ImageGeometry(tuple(float(value) for value in spacing))  # one grid: the host checked the phases'
    phases = [(image, geometry) for image in images]
    if cine:
        result = measure_cine(predictor, phases, trigger_times_ms, progress=progress, cancel=cancel)
    else:
        result = measure_function(predictor, *phases, progress=progress, cancel=cancel)
    return result.to_json()


def read_function_result(folder: str | Path) -> dict:
    """The ``function.json`` dictionary the child wrote into ``folder``."""
    return json.loads((Path(folder) / FUNCTION_NAME).read_text())


def _measure(folder: Path) -> None:
    """The child's work: read the request, measure with progress on stdout, write ``function.json``."""
    request = json.loads((folder / REQUEST_NAME).read_text())
    with np.load(folder / _PHASES, allow_pickle=False) as arrays:
        images = arrays["images"]

    def progress(fraction: float) -> None:
        print(f"{PROGRESS_PREFIX}{fraction:.4f}", flush=True)

    function = measure_phases(request["bundle"], images, request["spacing"], request["trigger_times_ms"],
                              request["cine"], request["device"], progress)
    (folder / FUNCTION_NAME).write_text(json.dumps(function))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m CalibSegLib.function_process FOLDER``: the exit status (see the module docstring)."""
    return run_child(argv, _measure)


if __name__ == "__main__":
    sys.exit(main())
