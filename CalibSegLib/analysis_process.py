"""One case analysed in a child process: the request and the result as files, and the child's entry point.

A host that must survive whatever the inference does (the Slicer module: a crash, an out-of-memory or a hung
CUDA call must not take the user's session down) writes the request into a folder
(:func:`write_request`), runs ``<python> -m CalibSegLib.analysis_process FOLDER`` and reads
:func:`read_result` when it exits 0. The child:

- prints ``progress <fraction>`` lines on stdout as the prediction goes;
- writes ``result.npz`` (labels, confidence, entropy; arrays only, read without pickle) and
  ``result.json`` (the quality summary, the metric row and the reliability bins with a reference);
- exits 0 done, 2 with ``error: <one sentence>`` on stderr for input the library refuses (3 where it is the
  bundle that is refused, which no other case would get past); anything else
  (a signal, an exit status 1 with a traceback) is the host's to report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

if TYPE_CHECKING:
    from CalibSegLib.analysis import CaseAnalysis

__all__ = ["REQUEST_NAME", "RESULT_NAME", "PROGRESS_PREFIX", "REFUSED_STATUS", "BUNDLE_REFUSED_STATUS",
           "write_request", "read_result", "run_child", "main"]

REQUEST_NAME = "request.json"
RESULT_NAME = "result.json"
_REQUEST_ARRAYS = "request.npz"
_RESULT_ARRAYS = "result.npz"
PROGRESS_PREFIX = "progress "
REFUSED_STATUS = 2  # the child's exit status for input the library refuses (the sentence is on stderr)
# The bundle itself refused (its weights, read only here): every case would fail the same way, so a batch stops.
BUNDLE_REFUSED_STATUS = 3


def write_request(folder: str | Path, bundle_path: str | Path, image: np.ndarray, spacing: Sequence[float],
                  reference: np.ndarray | None = None, device: str = "auto", hot_spot_level: float | None = None,
                  ) -> Path:
    """Write what the child needs into ``folder`` (which must exist): the bundle's path, ``image (z, y, x)``
    with its ``spacing`` ``(z, y, x)`` mm, an optional ``reference (z, y, x)`` label map, the device and the
    summary's hot-spot level (None: the library's default). Returns ``folder``."""
    folder = Path(folder)
    arrays = {"image": np.asarray(image)}
    if reference is not None:
        arrays["reference"] = np.asarray(reference)
    np.savez(folder / _REQUEST_ARRAYS, **arrays)
    request = {"bundle": str(bundle_path), "spacing": [float(value) for value in spacing], "device": device,
               "hot_spot_level": hot_spot_level}
    (folder / REQUEST_NAME).write_text(json.dumps(request))
    return folder


def read_result(folder: str | Path) -> "CaseAnalysis":
    """The :class:`~CalibSegLib.analysis.CaseAnalysis` the child wrote into ``folder`` (``evaluation`` None: its
    numbers are in ``metrics`` and ``reliability``)."""
    from CalibSegLib.analysis import CaseAnalysis
    from CalibSegLib.metrics.calibration import Reliability
    from CalibSegLib.prediction import Prediction

    folder = Path(folder)
    result = json.loads((folder / RESULT_NAME).read_text())
    with np.load(folder / _RESULT_ARRAYS, allow_pickle=False) as arrays:
        prediction = Prediction(arrays["labels"], arrays["confidence"], arrays["entropy"],
                                disagreement=arrays["disagreement"] if "disagreement" in arrays.files else None)
    bins = result["reliability"]
    reliability = None if bins is None else Reliability(**{key: np.asarray(value, dtype=np.float64)
                                                           for key, value in bins.items()})
    return CaseAnalysis(prediction, result["summary"], metrics=result["metrics"], reliability=reliability)


def _analyse(folder: Path) -> None:
    """The child's work: read the request, analyse the case with progress on stdout, write the result."""
    from CalibSegLib.analysis import analyse_case
    from CalibSegLib.inference import Predictor
    from CalibSegLib.quality import HOT_SPOT_LEVEL

    request = json.loads((folder / REQUEST_NAME).read_text())
    with np.load(folder / _REQUEST_ARRAYS, allow_pickle=False) as arrays:
        image = arrays["image"]
        reference = arrays["reference"] if "reference" in arrays.files else None

    def progress(fraction: float) -> None:
        print(f"{PROGRESS_PREFIX}{fraction:.4f}", flush=True)

    predictor = Predictor(request["bundle"], device=request["device"])
    level = request["hot_spot_level"]
    analysis = analyse_case(predictor, image, request["spacing"], reference, progress=progress,
                            hot_spot_level=HOT_SPOT_LEVEL if level is None else level)
    prediction = analysis.prediction
    maps = {"disagreement": prediction.disagreement} if prediction.disagreement is not None else {}
    np.savez(folder / _RESULT_ARRAYS, labels=prediction.labels, confidence=prediction.confidence,
             entropy=prediction.entropy, **maps)
    reliability = analysis.reliability
    bins = None if reliability is None else {key: getattr(reliability, key).tolist()
                                             for key in ("counts", "mean_confidence", "accuracy", "edges")}
    (folder / RESULT_NAME).write_text(json.dumps({"summary": analysis.summary, "metrics": analysis.metrics,
                                                  "reliability": bins}))


def run_child(argv: Sequence[str] | None, work: Callable[[Path], None]) -> int:
    """A child's entry point: ``work(FOLDER)`` for ``argv`` (default ``sys.argv[1:]``) = ``[FOLDER]``, a folder
    holding :data:`REQUEST_NAME`; returns the exit status (see the module docstring)."""
    from CalibSegLib.bundle import BundleError

    arguments = list(sys.argv[1:] if argv is None else argv)
    if len(arguments) != 1 or not (Path(arguments[0]) / REQUEST_NAME).is_file():
        print("error: give the folder a host wrote its request into.", file=sys.stderr)
        return REFUSED_STATUS
    try:
        work(Path(arguments[0]))
    except BundleError as error:
        print(f"error: {error}", file=sys.stderr)
        return BUNDLE_REFUSED_STATUS
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return REFUSED_STATUS
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m CalibSegLib.analysis_process FOLDER``: the exit status (see the module docstring)."""
    return run_child(argv, _analyse)


if __name__ == "__main__":
    sys.exit(main())
