"""Writes CalibSeg's fixed, patient-level ACDC splits (stratified by diagnostic group).

    python -m Datasets.splits.make_splits /path/to/acdc SampleData/ACDC

ACDC numbers patients in five diagnostic groups of 20 consecutive ids (001–020 DCM,
021–040 HCM, 041–060 MINF, 061–080 NOR, 081–100 RV). Each group's patients present in the
folder are shuffled with a fixed seed and dealt into train/val/test in proportion
11/2/3 of 16 (the full set: 55/10/15 patients); the shipped 2-per-group sample is split
6/2/2 (one val and one test patient from alternating groups). The output is committed,
so the split never changes unless this script is rerun on purpose.

``acdc_folds/fold<k>.json`` deal the full split's *training* patients into :data:`FOLDS` folds,
stratified by group the same way: fold k is a run's validation side and the other folds its
training side; no fold file names a test patient. Networks trained on them predict every
training patient out of fold, which gives the quality model's fit more patients than the 10
of the validation split (``calibseg-fit-quality --fold-bundles``).

``acdc_unseen.json`` names the official release's patients that our copy lacks (the last four of
each training group and the 50 of its testing set), all on the test side: nothing was trained,
validated, chosen or read on them, so they are where the shipped models and their quality models
can be checked afresh (``calibseg-convert-acdc`` on the release, then ``calibseg-evaluate
--split-file Datasets/splits/acdc_unseen.json``; docs/usage.md, *Checking the shipped models on
patients this copy lacks*).
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

from Datasets.splits.folds import FOLDS as CV_FOLDS, SHIPPED_FOLDS, fold_split, folds_json, make_folds

GROUPS = ("DCM", "HCM", "MINF", "NOR", "RV")
GROUP_PATIENTS = 20
FOLDS = 4
# The official release: training patients 001-100 (GROUP_PATIENTS consecutive ids per group), testing patients 101-150.
TRAINING_PATIENTS = len(GROUPS) * GROUP_PATIENTS
RELEASE_PATIENTS = 150


def group_of(patient_id: str) -> str | None:
    """The diagnostic group of a training patient; None for a testing patient (its group is in its Info.cfg only)."""
    number = int(re.sub(r"\D", "", patient_id))
    return GROUPS[(number - 1) // GROUP_PATIENTS] if number <= TRAINING_PATIENTS else None


def patients_in(folder: Path) -> list[str]:
    return sorted({path.name.split("_")[0] for path in folder.glob("patient*_frame*.h5")})


def split_full(patients: list[str], seed: int = 2024) -> dict[str, list[str]]:
    split: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    generator = random.Random(seed)
    for group in GROUPS:
        members = [patient for patient in patients if group_of(patient) == group]
        generator.shuffle(members)
        n_test = round(len(members) * 3 / 16)
        n_val = round(len(members) * 2 / 16)
        split["test"] += members[:n_test]
        split["val"] += members[n_test:n_test + n_val]
        split["train"] += members[n_test + n_val:]
    return {key: sorted(value) for key, value in split.items()}


def split_sample(patients: list[str]) -> dict[str, list[str]]:
    split: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for index, group in enumerate(GROUPS):
        members = sorted(patient for patient in patients if group_of(patient) == group)
        if group == "RV":  # five groups cannot share two held-out patients each; RV trains only
            split["train"] += members
            continue
        split["val" if index % 2 else "test"].append(members[-1])
        split["train"] += members[:-1]
    return {key: sorted(value) for key, value in split.items()}


def split_folds(training: list[str], folds: int = FOLDS, seed: int = 2024) -> list[dict[str, list[str]]]:
    """``folds`` splits of the ``training`` patients, stratified by group (:func:`Datasets.splits.folds.make_folds`),
    one fold as ``val``, the others as ``train``, ``test`` empty."""
    dealt = make_folds(training, folds, seed, group_of=group_of)
    return [fold_split(dealt, index) for index in range(folds)]


def split_unseen(copy: list[str]) -> dict[str, list[str]]:
    """The release's patients not in ``copy`` (our copy's patients), all as ``test``."""
    present = set(copy)
    release = (f"patient{number:03d}" for number in range(1, RELEASE_PATIENTS + 1))
    return {"train": [], "val": [], "test": [patient for patient in release if patient not in present]}


def write(path: Path, dataset: str, split: dict[str, list[str]], description: str) -> None:
    groups = {patient: group for values in split.values() for patient in values if (group := group_of(patient))}
    payload = {"dataset": dataset, "description": description, **split, "groups": groups}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"{path}: " + ", ".join(f"{key} {len(value)}" for key, value in split.items()))


def main(full_folder: str, sample_folder: str) -> None:
    here = Path(__file__).parent
    copy = patients_in(Path(full_folder))
    full = split_full(copy)
    write(here / "acdc.json", "acdc", full,
          "ACDC (80 patients of the WSL4MIS copy), patient-level, stratified by diagnostic group, seed 2024")
    write(here / "acdc_unseen.json", "acdc", split_unseen(copy),
          f"The {RELEASE_PATIENTS - len(copy)} patients of the official ACDC release that the WSL4MIS copy lacks, all "
          "test: no shipped model was trained, validated or chosen on them (groups: the training patients'; the "
          "testing patients' are in their Info.cfg)")
    (here / "acdc_folds").mkdir(exist_ok=True)
    for index, fold in enumerate(split_folds(full["train"])):
        write(here / "acdc_folds" / f"fold{index}.json", "acdc", fold,
              f"Fold {index} of {FOLDS} of acdc.json's training patients (validation = this fold; no test patients)")
    cross_validation = make_folds(full["train"] + full["val"], CV_FOLDS, seed=2024, test=full["test"],
                                  group_of=group_of)
    SHIPPED_FOLDS.write_text(json.dumps(folds_json(
        cross_validation, 2024, f"{CV_FOLDS} folds of acdc.json's {len(full['train'] + full['val'])} training and "
        f"validation patients, stratified by diagnostic group, seed 2024; test: acdc.json's {len(full['test'])} test "
        "patients, in no fold"), indent=2) + "\n")
    print(f"{SHIPPED_FOLDS}: folds of " + ", ".join(str(len(members)) for members in cross_validation["folds"]))
    write(here / "acdc_sample.json", "acdc", split_sample(patients_in(Path(sample_folder))),
          "Shipped ACDC sample (SampleData/ACDC), 2 patients per group: 6 train, 2 val, 2 test")


if __name__ == "__main__":
    main(*sys.argv[1:3])
