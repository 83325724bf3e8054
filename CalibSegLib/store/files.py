"""Where a store keeps its records, and reading a bundle's back.

``<store>/<weights_sha256[:16]>/<case>.<member>.json``: one folder per bundle weights (a rewritten bundle with new
weights gets a new folder, its old records stay for the weights they describe), one small JSON file per record,
written under a temporary name and renamed, so an interrupted pass leaves whole records only and resumes. The input
check's records (:class:`~CalibSegLib.store.inputs.InputRecord`, one per case) lie in its ``inputs/`` subfolder, and
the records of a degraded copy of the test volumes in ``degraded/<degradation>/`` (the name in lower case, each run
of other characters one hyphen): apart, so that no fit of clean volumes can read them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, TypeVar

from CalibSegLib.io import atomic_output, write_json_atomic
from CalibSegLib.store.inputs import InputRecord
from CalibSegLib.store.record import OUT_OF_FOLD, StoreError, StoreRecord

__all__ = ["record_path", "write_record", "read_record", "read_records", "read_fit_records", "stored_keys",
           "input_record_path", "write_input_record", "read_input_records", "stored_input_cases"]

INPUTS = "inputs"  # the subfolder of a weights folder holding its input records
DEGRADED = "degraded"  # the subfolder holding one folder of records per degradation
Record = TypeVar("Record", StoreRecord, InputRecord)

_DIGEST_CHARACTERS = 16  # 64 bits of the SHA-256 name a folder; the records inside carry the whole digest


def _folder(store: str | Path, weights_sha256: str) -> Path:
    return Path(store) / weights_sha256[:_DIGEST_CHARACTERS]


def _records_folder(store: str | Path, weights_sha256: str, degradation: str | None) -> Path:
    """Where the prediction records of the volumes as they are (``degradation`` None) or of a degraded copy lie."""
    folder = _folder(store, weights_sha256)
    if degradation is None:
        return folder
    return folder / DEGRADED / re.sub(r"[^a-z0-9]+", "-", degradation.lower()).strip("-")


def record_path(store: str | Path, weights_sha256: str, case: str, member: int | str,
                degradation: str | None = None) -> Path:
    """The file of the record of ``case`` (or its ``degradation``'s copy) by ``member`` of the bundle weights
    ``weights_sha256``."""
    return _records_folder(store, weights_sha256, degradation) / f"{case}.{member}.json"


def write_record(store: str | Path, record: StoreRecord) -> Path:
    """Write ``record`` atomically to its file; returns the path."""
    path = record_path(store, record.weights_sha256, record.case, record.member, record.degradation)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(path, record.to_dict())


def _record_files(folder: Path) -> list[Path]:
    """The finished record files of a folder (a pass's temporary files start with a dot)."""
    return sorted(path for path in folder.glob("*.json") if not path.name.startswith(".")) if folder.is_dir() \
        else []


def _json(path: Path) -> Any:
    """The JSON value of one record file.

    Raises:
        StoreError: unreadable or no JSON (one sentence).
    """
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise StoreError(f"{path} cannot be read as JSON ({error}); delete it and run calibseg-store again, "
                         "which writes it anew.") from None


def read_record(path: str | Path) -> StoreRecord:
    """The one prediction record in the file ``path``, validated.

    Raises:
        StoreError: unreadable, or not a record of this version (one sentence).
    """
    return StoreRecord.from_dict(_json(Path(path)), str(path))


def _read_folder(paths: list[Path], weights_sha256: str, parse: Callable[[Any, str], Record]) -> list[Record]:
    """The records of ``paths``, each checked to be of ``weights_sha256``."""
    records = []
    for path in paths:
        record = parse(_json(path), str(path))
        if record.weights_sha256 != weights_sha256:
            raise StoreError(f"{path} is a record of other weights ({record.weights_sha256[:12]}…); delete it and "
                             "run calibseg-store again.")
        records.append(record)
    return records


def read_records(store: str | Path, weights_sha256: str, degradation: str | None = None) -> list[StoreRecord]:
    """Every record of the bundle weights ``weights_sha256`` of the volumes as they are (or of the copies
    ``degradation`` made of the test volumes), sorted by case and member.

    Raises:
        StoreError: the store holds no such record of these weights, or one cannot be read (one sentence).
    """
    paths = _record_files(_records_folder(store, weights_sha256, degradation))
    if not paths:
        part = "" if degradation is None else f" of the copies {degradation!r} makes"
        raise StoreError(f"{store} holds no record{part} of the weights {weights_sha256[:12]}…; fill it with "
                         f"calibseg-store --bundle <bundle> --store {store}"
                         f"{'' if degradation is None else ' --part degraded'}.")
    records = _read_folder(paths, weights_sha256, StoreRecord.from_dict)
    for path, record in zip(paths, records):
        if record.degradation != degradation:
            raise StoreError(f"{path} is a record of {record.degradation or 'the volume as it is'}, not of "
                             f"{degradation or 'the volume as it is'}; delete it and run calibseg-store again.")
    return sorted(records, key=lambda record: (record.case, str(record.member)))


def read_fit_records(store: str | Path, weights_sha256: str, out_of_fold_weights_sha256: str) -> list[StoreRecord]:
    """The prediction records a bundle's fits read: its own, except that a sub-ensemble (whose
    ``out_of_fold_weights_sha256``, the ensemble it keeps members of, differs from its weights) reads that
    ensemble's out-of-fold records in place of its own: its out-of-fold choices were made on all of that ensemble's
    folds. Sorted by case and member.

    Raises:
        StoreError: the store holds no record of the bundle's weights, none of a sub-ensemble's origin out of fold,
            or one cannot be read (one sentence).
    """
    records = read_records(store, weights_sha256)
    if out_of_fold_weights_sha256 == weights_sha256:
        return records
    origin = read_records(store, out_of_fold_weights_sha256) \
        if _record_files(_records_folder(store, out_of_fold_weights_sha256, None)) else []
    out_of_fold = [record for record in origin if record.role == OUT_OF_FOLD]
    if not out_of_fold:
        raise StoreError(f"{store} holds no record of the ensemble these members were selected from (weights "
                         f"{out_of_fold_weights_sha256[:12]}…), whose out-of-fold predictions the fits read; fill it "
                         f"with calibseg-store --bundle <that ensemble's file> --store {store} --part out_of_fold "
                         "(docs/training.md, \"The store\").")
    return sorted([record for record in records if record.role != OUT_OF_FOLD] + out_of_fold,
                  key=lambda record: (record.case, str(record.member)))


def stored_keys(store: str | Path, weights_sha256: str, degradation: str | None = None) -> set[tuple[str, str]]:
    """``(case, member)`` (the member as its file names it) of every record file of these weights (of the volumes
    as they are, or of ``degradation``'s copies): what a resumed pass skips."""
    return {tuple(path.name[:-len(".json")].rsplit(".", 1))
            for path in _record_files(_records_folder(store, weights_sha256, degradation))}


def input_record_path(store: str | Path, weights_sha256: str, case: str) -> Path:
    """The file of the input record of ``case`` for the bundle weights ``weights_sha256``."""
    return _folder(store, weights_sha256) / INPUTS / f"{case}.json"


def write_input_record(store: str | Path, record: InputRecord) -> Path:
    """Write ``record`` atomically to its file, compact (every member's vector: a few hundred numbers); its path."""
    path = input_record_path(store, record.weights_sha256, record.case)
    with atomic_output(path) as temporary:
        temporary.write_text(json.dumps(record.to_dict(), separators=(",", ":")))
    return path


def read_input_records(store: str | Path, weights_sha256: str) -> list[InputRecord]:
    """Every input record of the bundle weights ``weights_sha256``, sorted by case.

    Raises:
        StoreError: the store holds no input record of these weights, or one cannot be read (one sentence).
    """
    paths = _record_files(_folder(store, weights_sha256) / INPUTS)
    if not paths:
        raise StoreError(f"{store} holds no input record of the weights {weights_sha256[:12]}…; fill them with "
                         f"calibseg-store --bundle <bundle> --store {store} --part inputs.")
    return sorted(_read_folder(paths, weights_sha256, InputRecord.from_dict), key=lambda record: record.case)


def stored_input_cases(store: str | Path, weights_sha256: str) -> set[str]:
    """The cases whose input record these weights have: what a resumed pass skips."""
    return {path.name[:-len(".json")] for path in _record_files(_folder(store, weights_sha256) / INPUTS)}
