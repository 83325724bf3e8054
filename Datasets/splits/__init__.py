"""Fixed patient-level splits kept in JSON files beside this module (see make_splits.py), and the seeded split
a training run makes for data no shipped split covers (:func:`make_split`, written into the run folder).

Bundles record a shipped split by its file name (``acdc.json``), any other by the path given,
and always the patient lists themselves (:func:`split_reference`, :func:`recorded_split`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Sequence

from Datasets.errors import DataError
from Datasets.layouts import CaseFile

__all__ = ["SPLITS_DIR", "SIDES", "SPLIT_NAME", "SPLIT_FRACTIONS", "load_split", "make_split", "split_json",
           "select_patients", "default_split_for", "split_reference", "recorded_split"]

SPLITS_DIR = Path(__file__).parent
SIDES: tuple[str, ...] = ("train", "val", "test")
_SHIPPED = ("acdc_sample.json", "acdc.json")
SPLIT_NAME = "split.json"  # the split a run made, in its run folder
SPLIT_FRACTIONS: tuple[float, float, float] = (0.7, 0.1, 0.2)  # train, validation, test share of the patients
# How a split file's top-level JSON value is named in a sentence (anything else is a number).
_JSON_KINDS = {list: "an array", str: "a string", type(None): "null", bool: "true or false"}


def load_split(path: str | Path) -> dict[str, list[str]]:
    """``{"train", "val", "test"}`` lists of patient ids; raises DataError if the file is unusable."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DataError(f"Cannot read split file {path} ({error}); pass --split with a JSON split file.") from None
    if not isinstance(payload, dict):
        raise DataError(f"Split file {path} holds {_JSON_KINDS.get(type(payload), 'a number')}, not an object "
                        '{"train": [...], "val": [...], "test": [...]}; pass a split file of that shape.')
    missing = [key for key in SIDES if not isinstance(payload.get(key), list)]
    if missing:
        raise DataError(f"Split file {path} lacks the list(s) {', '.join(missing)}.")
    not_ids = [key for key in SIDES if not all(isinstance(patient, str) for patient in payload[key])]
    if not_ids:
        raise DataError(f"Split file {path} lists something other than patient ids (strings) in "
                        f"{', '.join(not_ids)}; list each patient by its id, e.g. \"patient001\".")
    overlap = set(payload["train"]) & set(payload["val"]) | set(payload["train"]) & set(payload["test"]) \
        | set(payload["val"]) & set(payload["test"])
    if overlap:
        raise DataError(f"Split file {path} puts patient(s) {', '.join(sorted(overlap))} on two sides.")
    return {key: list(payload[key]) for key in ("train", "val", "test")}


def make_split(patients: Sequence[str], seed: int = 0,
               fractions: tuple[float, float, float] = SPLIT_FRACTIONS,
               test: Sequence[str] = ()) -> dict[str, list[str]]:
    """A seeded patient-level split of ``patients``: validation and test get their ``fractions`` of the patients
    rounded, at least one each, training the rest; each side sorted. ``test``: the patients the data's own
    description reserves for testing (a ``dataset.json`` test list); those among ``patients`` are the test side and
    validation gets its fraction of all patients from the others. The same patients and seed give the same split
    on any machine (Python's own generator, not NumPy's or torch's).

    Raises:
        DataError: fewer than 3 patients (each side needs one), or a test list leaving fewer than 2 for training
            and validation.
    """
    unique = sorted(set(patients))
    if len(unique) < 3:
        raise DataError(f"The data holds {len(unique)} patient(s); a split needs at least 3 (training, validation, "
                        "test), so add patients or pass --split.")
    reserved = sorted(set(test) & set(unique))
    rest = [patient for patient in unique if patient not in reserved]
    if reserved and len(rest) < 2:
        raise DataError(f"dataset.json's test list holds {len(reserved)} of the {len(unique)} patients, leaving "
                        f"{len(rest)} for training and validation; shorten the list or pass --split.")
    shuffled = rest.copy()
    random.Random(seed).shuffle(shuffled)
    validation = max(1, min(round(fractions[1] * len(unique)), len(shuffled) - 1))
    test_count = 0 if reserved else max(1, min(round(fractions[2] * len(unique)), len(unique) - validation - 1))
    return {"train": sorted(shuffled[validation + test_count:]), "val": sorted(shuffled[:validation]),
            "test": reserved or sorted(shuffled[validation:validation + test_count])}


def split_json(split: dict[str, list[str]], description: str) -> dict:
    """A split as its file holds it (what :func:`load_split` reads), with a ``description`` of how it was made."""
    return {"description": description, **{side: list(split[side]) for side in SIDES}}


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
    """The shipped split file for these patients: the one naming exactly them (sample or full
    ACDC), else the largest one whose patients are all among them (the official ACDC release
    holds more patients than our copy), else None."""
    patients = {file.patient_id for file in files}
    covered = []
    for name in _SHIPPED:
        split = load_split(SPLITS_DIR / name)
        named = set(split["train"]) | set(split["val"]) | set(split["test"])
        if named == patients:
            return SPLITS_DIR / name
        if named <= patients:
            covered.append((len(named), name))
    return SPLITS_DIR / max(covered)[1] if covered else None


def split_reference(path: str | Path) -> str:
    """How a bundle records a split (or folds) file: a shipped one (a file beside this module) by its name, any other
    by the path as given."""
    path = Path(path)
    return path.name if path.resolve().parent == SPLITS_DIR.resolve() else str(path)


def recorded_split(data: dict, split_file: str | Path | None = None) -> dict[str, list[str]]:
    """The split a bundle's ``data`` section records: its patient lists, or, for bundles without
    them, its split file (a shipped file's name is looked up beside this module). ``split_file``
    (``--split-file``) replaces both.

    Raises:
        DataError: no split given or recorded, or an unreadable split file.
    """
    if split_file is not None:
        return load_split(split_file)
    if all(isinstance(data.get(side), list) for side in SIDES):
        return {side: list(data[side]) for side in SIDES}
    recorded = data.get("split_file")
    if not recorded:
        raise DataError("The bundle records neither its split nor its split file; pass --split-file.")
    shipped = SPLITS_DIR / Path(recorded).name
    return load_split(recorded if Path(recorded).is_file() or not shipped.is_file() else shipped)
