"""Cross-validation folds: a seeded, patient-level deal of the labelled patients into :data:`FOLDS` folds, with the
test patients kept out of every fold.

A folds file (``acdc_cv.json`` beside this module for full ACDC, else ``folds.json`` in a cross-validation run's
folder, written once and reused by every fold and method) holds ``{"description", "seed", "test": [...],
"folds": [[...], ...]}``. Fold ``k``'s split (:func:`fold_split`) validates on ``folds[k]``, trains on the other
folds' patients and tests on ``test``: every labelled patient is predicted out of fold exactly once, and the test
patients by none of the fold networks, so an ensemble of them still has a test of its own.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable, Sequence

from Datasets.errors import DataError

__all__ = ["FOLDS", "FOLDS_NAME", "SHIPPED_FOLDS", "make_folds", "fold_split", "folds_json", "load_folds",
           "default_folds_for"]

FOLDS = 5
FOLDS_NAME = "folds.json"  # the folds a cross-validation run made, in its parent folder
SHIPPED_FOLDS = Path(__file__).parent / "acdc_cv.json"


def make_folds(patients: Sequence[str], folds: int = FOLDS, seed: int = 0, test: Sequence[str] = (),
               group_of: Callable[[str], str | None] | None = None) -> dict[str, list]:
    """Deal ``patients`` (less ``test``) into ``folds`` folds; the same patients and seed give the same folds on any
    machine (Python's own generator).

    Args:
        patients: every patient id of the data (test patients included or not).
        folds: how many folds (at least 2).
        seed: shuffles the patients.
        test: patients no fold holds (a ``dataset.json`` test list, or a fixed split's test side).
        group_of: a patient's stratum (ACDC's diagnostic group); each stratum is shuffled and dealt in turn,
            continuing the deal across strata so that fold sizes differ by at most one. None: one stratum.

    Returns:
        ``{"test": sorted test patients, "folds": [sorted patient list] * folds}``.

    Raises:
        DataError: fewer labelled patients than folds, or fewer than 2 folds.
    """
    reserved = set(test)
    labelled = sorted(set(patients) - reserved)
    if folds < 2 or len(labelled) < folds:
        raise DataError(f"{folds} folds need at least {max(folds, 2)} patients outside the test list, and the data "
                        f"has {len(labelled)}; add patients or train without --fold.")
    strata: dict[str | None, list[str]] = {}
    for patient in labelled:
        strata.setdefault(group_of(patient) if group_of else None, []).append(patient)
    generator = random.Random(seed)
    dealt: list[list[str]] = [[] for _ in range(folds)]
    position = 0
    for stratum in strata.values():
        generator.shuffle(stratum)
        for patient in stratum:
            dealt[position % folds].append(patient)
            position += 1
    return {"test": sorted(reserved), "folds": [sorted(fold) for fold in dealt]}


def fold_split(folds: dict[str, list], fold: int) -> dict[str, list[str]]:
    """Fold ``fold``'s split: ``{"train": the other folds, "val": this fold, "test": the test patients}``."""
    if not 0 <= fold < len(folds["folds"]):
        raise DataError(f"--fold {fold} does not exist: the folds file has folds 0 to {len(folds['folds']) - 1}.")
    train = sorted(patient for index, members in enumerate(folds["folds"]) if index != fold for patient in members)
    return {"train": train, "val": list(folds["folds"][fold]), "test": list(folds["test"])}


def folds_json(folds: dict[str, list], seed: int, description: str) -> dict:
    """Folds as their file holds them (what :func:`load_folds` reads)."""
    return {"description": description, "seed": seed, "test": list(folds["test"]),
            "folds": [list(members) for members in folds["folds"]]}


def load_folds(path: str | Path) -> dict[str, list]:
    """``{"test": [...], "folds": [[...], ...]}`` from a folds file; raises DataError if it is unusable."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DataError(f"Cannot read folds file {path} ({error}); delete it to deal the folds again.") from None
    folds = payload.get("folds") if isinstance(payload, dict) else None
    test = payload.get("test") if isinstance(payload, dict) else None
    if not (isinstance(folds, list) and len(folds) >= 2 and isinstance(test, list)
            and all(isinstance(members, list) and members for members in folds)
            and all(isinstance(patient, str) for members in [test, *folds] for patient in members)):
        raise DataError(f"Folds file {path} is not of the form {{\"test\": [ids], \"folds\": [[ids], [ids], ...]}} "
                        "with at least 2 non-empty folds; delete it to deal the folds again.")
    named = [patient for members in [test, *folds] for patient in members]
    if len(named) != len(set(named)):
        twice = sorted({patient for patient in named if named.count(patient) > 1})
        raise DataError(f"Folds file {path} names {', '.join(twice[:3])} twice (in two folds, or in a fold and the "
                        "test list); delete it to deal the folds again.")
    return {"test": list(test), "folds": [list(members) for members in folds]}


def default_folds_for(patients: Sequence[str]) -> Path | None:
    """The shipped folds file for these patients (its folds and test list all among them), else None."""
    if not SHIPPED_FOLDS.is_file():
        return None
    shipped = load_folds(SHIPPED_FOLDS)
    named = {patient for members in [shipped["test"], *shipped["folds"]] for patient in members}
    return SHIPPED_FOLDS if named <= set(patients) else None
