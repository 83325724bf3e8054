"""Fixed patient-level splits kept in JSON files beside this module (see make_splits.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from Training.data import CaseFile, DataError

__all__ = ["SPLITS_DIR", "load_split", "select_patients", "default_split_for"]

SPLITS_DIR = Path(__file__).parent


def load_split(path: str | Path) -> dict[str, list[str]]:
    """``{"train", "val", "test"}`` lists of patient ids; raises DataError if the file is unusable."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DataError(f"Cannot read split file {path} ({error}); pass --split with a JSON split file.") from None
    missing = [key for key in ("train", "val", "test") if not isinstance(payload.get(key), list)]
    if missing:
        raise DataError(f"Split file {path} lacks the list(s) {', '.join(missing)}.")
    overlap = set(payload["train"]) & set(payload["val"]) | set(payload["train"]) & set(payload["test"]) \
        | set(payload["val"]) & set(payload["test"])
    if overlap:
        raise DataError(f"Split file {path} puts patient(s) {', '.join(sorted(overlap))} on two sides.")
    return {key: list(payload[key]) for key in ("train", "val", "test")}


def select_patients(files: Sequence[CaseFile], patients: Sequence[str]) -> list[CaseFile]:
    """The volumes of ``patients``; raises DataError for a patient with no volume in the folder."""
    present = {file.patient_id for file in files}
    absent = [patient for patient in patients if patient not in present]
    if absent:
        raise DataError(
            f"The split names {len(absent)} patient(s) not in the data folder (first: {absent[0]}); "
            "use the split file that matches --data."
        )
    wanted = set(patients)
    return [file for file in files if file.patient_id in wanted]


def default_split_for(files: Sequence[CaseFile]) -> Path | None:
    """The shipped split file that covers exactly these patients (sample or full ACDC), if any."""
    patients = {file.patient_id for file in files}
    for name in ("acdc_sample.json", "acdc.json"):
        split = load_split(SPLITS_DIR / name)
        if set(split["train"]) | set(split["val"]) | set(split["test"]) == patients:
            return SPLITS_DIR / name
    return None
