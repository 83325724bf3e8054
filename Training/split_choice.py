"""Which patients a run trains, validates and tests on, and their volumes read: ``--split``, a shipped split
or fold of these patients, the run folder's own, or one the run deals itself (written once the run folder
exists).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from Datasets.dataset_json import DatasetDescription
from Datasets.dataset_names import dataset_name
from Datasets.errors import DataError
from Datasets.layouts import CaseFile, find_cases
from Datasets.loading import Case, load_cases
from Datasets.splits import (SIDES, SPLIT_FRACTIONS, SPLIT_NAME, default_split_for, load_split, make_split,
                             select_patients, split_json)
from Datasets.splits.folds import (FOLDS, FOLDS_NAME, default_folds_for, fold_split, folds_json, load_folds,
                                   make_folds)

__all__ = ["SplitChoice", "choose_split", "load_split_cases"]


@dataclass(frozen=True)
class SplitChoice:
    """The split a run trains on, and where it came from: ``file`` (recorded in the bundle), and for a split
    or folds the run dealt itself, the JSON to write there once the run folder exists (``new``) and a
    sentence."""

    split: dict[str, list[str]]
    file: Path
    new: dict | None = None
    announcement: str = ""


def choose_split(arguments: argparse.Namespace, files: Sequence[CaseFile], run_dir: Path,
                 description: DatasetDescription | None, dataset: str) -> SplitChoice:
    """``--split``, else the shipped split of these patients, else the run folder's own ``split.json`` (a
    resumed run), else a new seeded one (:func:`Datasets.splits.make_split`, its test side the test list of
    the data's ``description``, its ``dataset.json``, when there is one). With ``--fold K``: fold K of the
    shipped folds of these patients, else of the cross-validation folder's ``folds.json``, else of new seeded
    folds (:func:`Datasets.splits.folds.make_folds`) whose test patients are the data's test list or its
    shipped split's test side."""
    patients, seed = [file.patient_id for file in files], arguments.seed
    test = description.test_cases if description is not None else ()
    if arguments.fold is not None:
        if arguments.split is not None:
            raise DataError("--fold takes its split from the cross-validation folds; leave --split out, or "
                            "train without --fold.")
        folds_file = default_folds_for(patients) or run_dir.parent / FOLDS_NAME
        if folds_file.is_file():
            return SplitChoice(fold_split(load_folds(folds_file), arguments.fold), folds_file)
        shipped = default_split_for(files)
        test = test or (load_split(shipped)["test"] if shipped else ())
        folds = make_folds(patients, FOLDS, seed, test=test)
        return SplitChoice(fold_split(folds, arguments.fold), folds_file, folds_json(
            folds, seed, f"made by calibseg-train --fold: {FOLDS} folds of {dataset}'s patients outside its "
                         f"test list ({len(folds['test'])}), seed {seed}"),
            f"{FOLDS} seeded patient-level folds of {dataset} are written to {folds_file}; every fold of "
            "this cross-validation trains on them")
    split_file = arguments.split or default_split_for(files)
    if split_file is not None or (run_dir / SPLIT_NAME).is_file():
        split_file = split_file or run_dir / SPLIT_NAME
        return SplitChoice(load_split(split_file), Path(split_file))
    split = make_split(patients, seed, test=test)
    fractions = "/".join(f"{share:.0%}" for share in SPLIT_FRACTIONS)
    return SplitChoice(split, run_dir / SPLIT_NAME, split_json(
        split, f"made by calibseg-train: {fractions} of the patients of {dataset}, seed {seed}"),
        f"no shipped split covers {dataset}: a seeded patient-level split ({fractions}) is written to "
        f"{run_dir / SPLIT_NAME}; pass --split {run_dir / SPLIT_NAME} to repeat it")


def load_split_cases(arguments: argparse.Namespace, num_classes: int, run_dir: Path,
                     description: DatasetDescription | None,
                     ) -> tuple[list[CaseFile], SplitChoice, dict[str, list[Case]]]:
    """Find ``--data``'s volumes, split them (:func:`choose_split`) and read every one (labels checked against
    ``num_classes``), so that bad data stops the run before any training."""
    files = find_cases(arguments.data, arguments.dataset)
    choice = choose_split(arguments, files, run_dir, description, dataset_name(arguments.data, files))
    cases = {side: load_cases(select_patients(files, choice.split[side]), num_classes) for side in SIDES}
    return files, choice, cases
