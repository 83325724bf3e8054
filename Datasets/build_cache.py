"""Write the compact, lossless cache of an ACDC HDF5 folder (:mod:`Datasets.cache` describes the format).

    python -m Datasets.build_cache /work/shared/data/acdc .device/acdc_cache    # 160 volumes, 47.3 MB

Each volume is read and checked as training reads it (:func:`Datasets.loading.load_cases`), then written under a
temporary name and renamed; the folder's marker comes last, so a cache cut short is never taken for one.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from CalibSegLib.io import os_error_sentence
from Datasets.acdc import ACDC_CLASS_NAMES
from Datasets.cache import write_marker, write_volume
from Datasets.errors import DataError
from Datasets.layouts import find_cases
from Datasets.loading import load_cases

__all__ = ["write_cache", "main"]


def write_cache(source: Path, destination: Path) -> tuple[int, int]:
    """Cache every ACDC volume of ``source`` (``patientNNN_frameMM.h5``) into ``destination``; returns (volumes,
    bytes written)."""
    files = find_cases(source, "acdc")
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    written = 0
    for file in files:
        case = load_cases([file], len(ACDC_CLASS_NAMES))[0]
        written += write_volume(destination / f"{file.case_id}.npz", case.image, case.label)
    write_marker(destination, len(files), written, Path(source).name)
    return len(files), written


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m Datasets.build_cache SOURCE DESTINATION``: prints the cache's size; bad input exits with one
    sentence."""
    flags = argparse.ArgumentParser(prog="python -m Datasets.build_cache", description=__doc__.split("\n\n")[0])
    flags.add_argument("source", type=Path, help="a folder of ACDC patientNNN_frameMM.h5 files")
    flags.add_argument("destination", type=Path, help="the cache folder to write")
    arguments = flags.parse_args(argv)
    try:
        count, size = write_cache(arguments.source, arguments.destination)
    except DataError as error:
        raise SystemExit(f"error: {error}") from None
    except OSError as error:
        raise SystemExit(f"error: {os_error_sentence(error)}") from None
    print(f"{count} volumes cached in {arguments.destination}: {size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    main()
