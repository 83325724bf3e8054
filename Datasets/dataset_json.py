"""The ``dataset.json`` of a Medical Segmentation Decathlon / nnU-Net v2 folder, read in either form: the names of
its classes and channels, the ending of its image files, its test cases and how many training cases it has.

nnU-Net v2 writes ``channel_names``, ``labels`` as name → id and ``file_ending``; the Decathlon writes
``modality``, ``labels`` as id → name and a ``test`` list. A folder without the file names none of these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from CalibSegLib.io import WRITE_SUFFIXES, case_and_channel
from Datasets.case_names import image_file_stem
from Datasets.errors import DataError

__all__ = ["DATASET_DESCRIPTION", "DatasetDescription", "read_dataset_description"]

DATASET_DESCRIPTION = "dataset.json"  # nnU-Net v2 / Decathlon: the classes' names


@dataclass(frozen=True)
class DatasetDescription:
    """What a folder's ``dataset.json`` says: ``class_names`` (background, id 0, first), ``channel_names`` (channel
    0 first; None when it names none), ``file_ending`` (None when not given), ``test_cases``, the case ids of
    its ``test`` list (empty without one), and ``num_training``, its ``numTraining`` (None when not given)."""

    class_names: list[str]
    channel_names: list[str] | None
    file_ending: str | None
    test_cases: list[str]
    num_training: int | None = None


def _numbered_names(path: Path, key: str, value: Any) -> list[str]:
    """The names of an ``{"0": name, "1": name, ...}`` object (Decathlon's labels and modality, nnU-Net's
    channel_names) in id order."""
    if not isinstance(value, dict) or not value or not all(isinstance(name, str) for name in value.values()) \
            or sorted(value) != sorted(str(index) for index in range(len(value))):
        raise DataError(f"{path}'s {key} must give the ids 0 to {len(value) - 1 if isinstance(value, dict) else 'K'} "
                        f"one name each, e.g. {{\"0\": \"CT\"}}; got {value!r}.")
    return [value[str(index)] for index in range(len(value))]


def _class_names(path: Path, labels: Any) -> list[str]:
    """``labels`` in either form (nnU-Net v2's name → id, the Decathlon's id → name) as names in id order."""
    if not isinstance(labels, dict) or not labels:
        raise DataError(f"{path} has no \"labels\" object naming the classes; add one, e.g. "
                        '{"background": 0, "liver": 1}.')
    by_name = all(isinstance(value, int) and not isinstance(value, bool) for value in labels.values())
    pairs = ([(value, name) for name, value in labels.items()] if by_name
             else [(int(key), value) for key, value in labels.items() if key.isdigit() and isinstance(value, str)])
    ids = sorted(identifier for identifier, _ in pairs)
    if len(pairs) != len(labels) or ids != list(range(len(labels))):
        raise DataError(f"{path}'s labels must give the ids 0 to {len(labels) - 1} one name each (background 0); "
                        f"got {labels}.")
    return [name for _, name in sorted(pairs)]


def _test_case(entry: Any) -> str | None:
    """The case id of one entry of a Decathlon ``test`` list (a path, or an object with an ``image`` path)."""
    path = entry.get("image") if isinstance(entry, dict) else entry
    if not isinstance(path, str):
        return None
    return case_and_channel(image_file_stem(Path(path).name) or Path(path).name)[0]


def read_dataset_description(folder: str | Path) -> DatasetDescription | None:
    """The ``dataset.json`` of ``folder`` in either form (nnU-Net v2: ``channel_names``, ``labels`` name → id,
    ``file_ending``; Medical Segmentation Decathlon: ``modality``, ``labels`` id → name, ``test``); None without one.

    Raises:
        DataError: the file is unreadable, its labels are not the ids 0, 1, ..., C - 1 each named once (nnU-Net's
            region labels, lists of ids, included), its channels are not numbered 0, 1, ..., K - 1, its
            ``file_ending`` is not an image format CalibSeg reads, or its ``numTraining`` not a whole number.
    """
    path = Path(folder) / DATASET_DESCRIPTION
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"Cannot read {path} ({error}); give it a \"labels\" object or remove it.") from None
    if not isinstance(values, dict):
        raise DataError(f"{path} must hold a JSON object with a \"labels\" object naming the classes.")
    channel_key = next((key for key in ("channel_names", "modality") if key in values), None)
    channels = _numbered_names(path, channel_key, values[channel_key]) if channel_key else None
    ending = values.get("file_ending")
    if ending is not None and (not isinstance(ending, str) or ending.lower() not in WRITE_SUFFIXES):
        raise DataError(f"{path}'s file_ending {ending!r} is not an image format CalibSeg reads; give one of "
                        f"{', '.join(WRITE_SUFFIXES)} (with its dot).")
    count = values.get("numTraining")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise DataError(f"{path}'s numTraining must be the number of training cases, got {count!r}.")
    tests = [case for case in map(_test_case, values.get("test") or []) if case]
    return DatasetDescription(_class_names(path, values.get("labels")), channels, ending, tests, count)

