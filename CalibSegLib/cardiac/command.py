"""Command line: cardiac function (volumes, ejection fractions, myocardial mass) with 90 % intervals.

    calibseg-function --bundle acdc_ce_dice --ed ed.nii.gz --es es.nii.gz --out-dir out/
    calibseg-function --bundle acdc_ce_dice --ed dicom/ed/ --es dicom/es/ --out-dir out/
    calibseg-function --bundle acdc_ce_dice --cine cine.nii.gz --out-dir out/      # 4D (t, z, y, x)
    calibseg-function --bundle acdc_ce_dice --cine dicom/cine/ --out-dir out/      # a multi-phase DICOM series

``--ed`` and ``--es`` are 3D image files (NIfTI, NRRD, MHA) or folders of one DICOM series each, of one
acquisition (same grid). ``--cine`` is a 4D image file or a folder holding a multi-phase cine series (classic
single-frame files or an Enhanced MR multi-frame file): every phase is segmented, ED is the phase with the largest
LV blood pool and ES the one with the smallest (:mod:`CalibSegLib.cardiac.phases`; ties by DICOM trigger time).

Every input goes through the checks of ``calibseg-predict`` (the file's header against its data, its spacing, the
input check of every phase) and the result through those of :mod:`CalibSegLib.cardiac.checks` before anything is
written. Writes ``<out-dir>/function.json`` (:meth:`CalibSegLib.cardiac.function.FunctionResult.to_json`) and
prints each index with its interval, then any reason to review the contours first; ``--report`` also writes
``<out-dir>/report.html``, the indices with their intervals and, for a cine, the LV and RV volume curve
(:func:`CalibSegLib.report.write_function_report`). The files are written as a set (temporary names, then renamed):
both replace an earlier pair in ``--out-dir``, or neither does. Bad input prints one sentence after ``error:`` and
exits with status 2, writing nothing (Ctrl-C: 130).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from CalibSegLib.bundle import BundleError
from CalibSegLib.cardiac.function import FunctionResult, PhaseImage, measure_cine, measure_function
from CalibSegLib.cardiac.indices import CardiacError
from CalibSegLib.dicom import SinglePhaseError, read_cine_series, read_dicom_folder
from CalibSegLib.inference import Predictor
from CalibSegLib.io import (ImageDimensionError, OutputSet, check_output_file, check_output_folder, os_error_sentence,
                           read_image)
from CalibSegLib.pretrained import bundle_label, pretrained_models, resolve_bundle_path
from CalibSegLib.report import REPORT_NAME, write_function_report

__all__ = ["FUNCTION_NAME", "read_phase", "read_cine", "write_function_files", "run", "main"]

FUNCTION_NAME = "function.json"


def read_phase(path: Path) -> PhaseImage:
    """A 3D image file or the one DICOM series of a folder, with its geometry (``ValueError`` says why not)."""
    return read_dicom_folder(path)[:2] if path.is_dir() else read_image(path)


def _single_phase(path: Path) -> CardiacError:
    return CardiacError(f"{path.name} holds one phase, not a cine; give a series of several time points to "
                        "--cine, or one phase each to --ed and --es.")


def _read_4d(path: Path) -> list[PhaseImage]:
    """The phases of a 4D ``(t, z, y, x)`` image file, all on its 3D grid, read with the checks of a 3D one
    (:func:`CalibSegLib.io.read_image`); a 3D file is refused as one phase."""
    try:
        volumes, geometry = read_image(path, dimension=4)
    except ImageDimensionError as error:
        if error.found == 3:
            raise _single_phase(path) from None
        raise
    if len(volumes) < 2:
        raise _single_phase(path)
    return [(volume, geometry) for volume in volumes]


def read_cine(path: Path) -> tuple[list[PhaseImage], list[float] | None]:
    """The phases of ``--cine`` (a 4D file, or a folder of a multi-phase DICOM series) and their trigger times in
    ms (None when the input has none).

    Raises:
        CardiacError: the input holds one phase. ValueError: it cannot be read (one sentence).
    """
    if not path.is_dir():
        return _read_4d(path), None
    try:
        cine = read_cine_series(path)
    except SinglePhaseError:
        raise _single_phase(path) from None
    return [(volume, cine.geometry) for volume in cine.volumes], cine.trigger_times_ms


def write_function_files(folder: Path, function: Mapping[str, Any], bundle_name: str, made_by: str, case_name: str,
                         report: bool = True) -> tuple[Path, Path | None]:
    """``function.json`` (the ``function`` dictionary) and, with ``report``, ``report.html`` into ``folder`` as one
    set: both replace what ``folder`` held, or neither does (:class:`~CalibSegLib.io.OutputSet`). The command and
    the Slicer section both write through it. Returns the two paths (None for no report)."""
    with OutputSet() as files:
        files.stage(folder / FUNCTION_NAME).write_text(json.dumps(function, indent=2, allow_nan=True))
        if report:
            write_function_report(files.stage(folder / REPORT_NAME), function, bundle_name, made_by, case_name)
    return folder / FUNCTION_NAME, folder / REPORT_NAME if report else None


def _write_outputs(out: Path, result: FunctionResult, arguments: argparse.Namespace) -> Path:
    """The command's files (:func:`write_function_files`); a failed write is one sentence naming ``out``."""
    source = arguments.cine if arguments.cine is not None else arguments.ed
    try:
        return write_function_files(out, result.to_json(), bundle_label(arguments.bundle), "calibseg-function",
                                    source.name, arguments.report)[0]
    except OSError as error:
        raise OSError(f"Cannot write the results into {out} ({os_error_sentence(error).rstrip('.')}); nothing there "
                      "was changed, so free some space or choose another --out-dir.") from None


def run(arguments: argparse.Namespace) -> tuple[FunctionResult, Path]:
    """Read, check, measure and write (module docstring); returns the result and the written file."""
    out = check_output_folder(arguments.out_dir)  # a bad --out-dir is reported before anything is read
    for name in (FUNCTION_NAME, REPORT_NAME) if arguments.report else (FUNCTION_NAME,):
        check_output_file(out / name)  # a folder in the way, before the long work
    if arguments.cine is not None:
        phases, times = read_cine(arguments.cine)
        predictor = Predictor(resolve_bundle_path(arguments.bundle), device=arguments.device,
                              batch_size=arguments.batch_size)
        result = measure_cine(predictor, phases, times)
    else:
        ed, es = read_phase(arguments.ed), read_phase(arguments.es)
        predictor = Predictor(resolve_bundle_path(arguments.bundle), device=arguments.device,
                              batch_size=arguments.batch_size)
        result = measure_function(predictor, ed, es)
    return result, _write_outputs(out, result, arguments)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calibseg-function", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True,
                        help="model bundle (.calibseg) or a shipped model's name: "
                             + (", ".join(pretrained_models()) or "none shipped"))
    parser.add_argument("--ed", type=Path, help="end-diastolic 3D image file or DICOM folder (with --es)")
    parser.add_argument("--es", type=Path, help="end-systolic 3D image file or DICOM folder (with --ed)")
    parser.add_argument("--cine", type=Path,
                        help="4D image file (t, z, y, x) or a folder of a multi-phase cine DICOM series")
    parser.add_argument("--out-dir", required=True, type=Path, help=f"folder for {FUNCTION_NAME}")
    parser.add_argument("--report", action="store_true",
                        help=f"also write {REPORT_NAME}: the indices with their intervals and, for --cine, "
                             "the volume curve")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda (default: auto)")
    parser.add_argument("--batch-size", type=int, default=16, help="slices per forward pass (default: 16)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 done, 2 bad input, 130 interrupted)."""
    parser = _parser()
    arguments = parser.parse_args(argv)
    pair = arguments.ed is not None or arguments.es is not None
    if arguments.cine is not None and pair:
        parser.error("give either --cine or --ed and --es, not both")
    if arguments.cine is None and (arguments.ed is None or arguments.es is None):
        parser.error("give --ed and --es (one phase each), or --cine")
    try:
        result, path = run(arguments)
    except (BundleError, ValueError) as error:  # CardiacError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: {os_error_sentence(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: nothing was written to {arguments.out_dir}.", file=sys.stderr)
        return 130
    print("\n".join(result.table_lines()))
    print(f"function: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
