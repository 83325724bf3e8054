"""Store in a bundle what its training inputs looked like, and its classes' standard terminology.

    python -m Training.fit_input_check --bundle runs/crac/model.calibseg [--data DIR] [--out PATH]
    python -m Training.fit_input_check --bundle acdc_crac --data /path/to/acdc --out CalibSegLib/pretrained/acdc_crac.calibseg

The training patients the bundle records (``bundle.json``: ``data["train"]``) are read from ``--data``
or the folder of the dataset the bundle records, and :func:`CalibSegLib.input_check.statistics_of_cases`
computes ``input_statistics`` from their images and reference labels with the decided
:data:`CalibSegLib.input_check.THRESHOLDS`; a bundle with ACDC's classes and no ``class_terminology`` also gets
:data:`Datasets.cases.ACDC_TERMINOLOGY`. No prediction is run. The bundle is rewritten atomically
(default: in place; a shipped model: ``runs/<name>/<name>.calibseg``) with the same weights in the same
dtype, so its checksum and predictions stay as they were.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Sequence

from CalibSegLib.bundle import BUNDLE_SUFFIX, load_bundle, save_bundle
from CalibSegLib.input_check import statistics_of_cases
from CalibSegLib.io import check_output_file
from CalibSegLib.pretrained import resolve_bundle_path, shipped_name
from Datasets.cases import DataError, data_folder, default_terminology, find_cases, load_cases
from Datasets.splits import select_patients

__all__ = ["refit_input_check", "main"]


def refit_input_check(bundle: str | Path, data: str | Path | None = None, out: str | Path | None = None) -> Path:
    """Write ``bundle`` with ``input_statistics`` from its training patients (and ACDC's terminology); its path.

    Raises:
        BundleError, DataError, InputStatisticsError: unreadable bundle, missing data or training patients (one
            sentence each).
    """
    path = resolve_bundle_path(bundle)
    shipped = shipped_name(path)
    if out is None:
        out = Path("runs") / shipped / f"{shipped}{BUNDLE_SUFFIX}" if shipped else path
    check_output_file(out)
    loaded = load_bundle(path)
    metadata = loaded.metadata
    patients = metadata.data.get("train")
    if not patients:
        raise DataError(f"{path.name} records no training patients (data['train']), so there is nothing to compute "
                        f"its input statistics from.")
    cases = load_cases(select_patients(find_cases(data_folder(metadata.data, data)), patients), metadata.num_classes)
    terminology = metadata.class_terminology or default_terminology(metadata.class_names)
    refitted = dataclasses.replace(metadata, input_statistics=statistics_of_cases(metadata, cases),
                                   class_terminology=terminology)
    return save_bundle(out, loaded.state_dict, refitted, half=metadata.weights_dtype == "float16")


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the written bundle's path; returns 0. Bad input exits with one sentence, no traceback."""
    parser = argparse.ArgumentParser(prog="python -m Training.fit_input_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, help="bundle (.calibseg) or a shipped model's name")
    parser.add_argument("--data", type=Path, default=None,
                        help="data folder (default: found from the dataset the bundle records)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the bundle here (default: in place; a shipped model: runs/<name>/<name>.calibseg)")
    arguments = parser.parse_args(argv)
    try:
        print(f"bundle: {refit_input_check(arguments.bundle, arguments.data, arguments.out)}")
    except ValueError as error:  # BundleError, DataError and InputStatisticsError included
        raise SystemExit(f"error: {error}") from None
    return 0


if __name__ == "__main__":
    main()
