"""The names bundles record their data by, and finding a recorded dataset's folder again.

Bundles record their data by dataset name (:func:`dataset_name`: ``acdc-sample`` for the
shipped sample, ``acdc`` for any other ACDC folder, else the folder's name), never by a path of
the training machine; :func:`data_folder` finds a recorded dataset again: ``--data`` when
given, the shipped sample for ``acdc-sample``, ``$CALIBSEG_ACDC`` for ``acdc``, and for bundles
written before names were recorded the absolute folder they hold, when it exists here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

from Datasets.errors import DataError
from Datasets.layouts import CaseFile

__all__ = ["SAMPLE_DATA", "SAMPLE_DATASET", "ACDC_DATASET", "ACDC_ENVIRONMENT", "dataset_name", "recorded_dataset",
           "data_folder"]

# The shipped sample of ACDC, the default training data; bundles trained on it record SAMPLE_DATASET.
SAMPLE_DATA = Path(__file__).resolve().parents[1] / "SampleData" / "ACDC"
SAMPLE_DATASET = "acdc-sample"
ACDC_DATASET = "acdc"
# Where readers of a bundle trained on full ACDC look for the data when no --data is given.
ACDC_ENVIRONMENT = "CALIBSEG_ACDC"

# ACDC's case names, as an HDF5 file's stem or a pair that Datasets/convert_acdc.py wrote.
_ACDC_CASE = re.compile(r"^patient\d+_frame\d+$")


def dataset_name(folder: str | Path, files: Sequence[CaseFile]) -> str:
    """The name a bundle records for the data in ``folder`` (whose volumes are ``files``).

    ``acdc-sample`` for the shipped sample, ``acdc`` for ACDC HDF5 files or ``patientNNN_frameMM``
    pairs (the official release after ``Datasets/convert_acdc.py``), else the folder's own name.
    """
    folder = Path(folder).resolve()
    if folder == SAMPLE_DATA:
        return SAMPLE_DATASET
    if files and all(file.kind == "acdc" or _ACDC_CASE.match(file.case_id) for file in files):
        return ACDC_DATASET
    return folder.name


def recorded_dataset(data: dict) -> str:
    """The dataset name a bundle's ``data`` section records; for bundles that recorded an absolute
    ``folder`` instead, the shipped sample's name when that folder was the sample, else its folder name."""
    legacy = data.get("folder")
    if legacy:
        parts = Path(legacy).parts
        if parts[-2:] == SAMPLE_DATA.parts[-2:]:
            return SAMPLE_DATASET
        return ACDC_DATASET if data.get("dataset") == ACDC_DATASET else parts[-1]
    return str(data.get("dataset") or "data")


def data_folder(data: dict, given: str | Path | None = None) -> Path:
    """The folder holding the data a bundle's ``data`` section records.

    ``given`` (``--data``) wins; then the shipped sample for ``acdc-sample``, ``$CALIBSEG_ACDC``
    for ``acdc``, and an absolute folder recorded by older bundles when it exists on this machine.

    Raises:
        DataError: none of these applies (one sentence saying what to pass).
    """
    if given is not None:
        return Path(given)
    name = recorded_dataset(data)
    if name == SAMPLE_DATASET:
        return SAMPLE_DATA
    if name == ACDC_DATASET and os.environ.get(ACDC_ENVIRONMENT):
        return Path(os.environ[ACDC_ENVIRONMENT])
    legacy = data.get("folder")
    if legacy and Path(legacy).is_dir():
        return Path(legacy)
    if name == ACDC_DATASET:
        raise DataError(f"The bundle was trained on ACDC, which is not shipped; pass --data with your ACDC folder "
                        f"or set {ACDC_ENVIRONMENT} to it (README.md, section Data).")
    raise DataError(f"The bundle was trained on dataset {name!r}, whose folder is not known here; "
                    "pass --data with that folder.")
