"""Out-of-fold records of a cross-validation fold: its finished bundle evaluated on the fold's own validation
patients, the patients no other step of that run trained on.

The records are :func:`Evaluation.evaluate.evaluate_bundle`'s files (``per_case.csv`` at the fold's fitted
temperature and at T = 1, ``summary.json``, reliability diagrams) and ``observations.json`` (per volume its patient,
the quality features of every structure and the measured Dice, as the fold's bundle segments it:
:func:`CalibSegLib.quality.observe_cases`) in the fold's ``out_of_fold/`` folder. Over the
folds of a cross-validation every labelled patient is predicted out of fold exactly once, which is what
``calibseg-crossval`` summarises and what the ensemble's choices are made on (:mod:`Training.ensemble`).

The test patients are never read here: a fold's validation side holds none of them (:mod:`Datasets.splits.folds`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from CalibSegLib.bundle import Bundle, load_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.io import write_json_atomic
from CalibSegLib.quality import observe_cases
from Datasets.errors import DataError
from Datasets.loading import Case
from Evaluation.evaluate import EvaluationResult, evaluate_bundle
from Training.bundle_rewrite import recorded_cases
from Training.records import BUNDLE_NAME, OUT_OF_FOLD_DIR

__all__ = ["OBSERVATIONS_NAME", "out_of_fold_dir", "evaluate_out_of_fold", "complete_out_of_fold"]

OBSERVATIONS_NAME = "observations.json"


def out_of_fold_dir(run_dir: str | Path) -> Path:
    """Where fold run ``run_dir`` keeps its out-of-fold records."""
    return Path(run_dir) / OUT_OF_FOLD_DIR


def evaluate_out_of_fold(bundle: Bundle, validation: Sequence[Case], run_dir: str | Path, device: str = "auto",
                         batch_size: int = 16) -> EvaluationResult:
    """Evaluate fold ``bundle`` on its ``validation`` volumes into ``run_dir``'s out-of-fold folder, with their
    quality observations; the summary is written last, so its presence means the records are complete."""
    if not validation:
        raise DataError(f"The fold in {run_dir} has no validation patients to predict out of fold.")
    folder = out_of_fold_dir(run_dir)
    observations = observe_cases(Predictor(bundle, device=device, batch_size=batch_size), validation)
    write_json_atomic(folder / OBSERVATIONS_NAME, [
        {"case": case.case_id, "patient": item.patient, "features": item.features, "dice": item.dice.tolist()}
        for case, item in zip(validation, observations)])
    return evaluate_bundle(bundle, validation, folder, device=device, batch_size=batch_size)


def complete_out_of_fold(run_dir: str | Path, data: str | Path | None = None, device: str = "auto",
                         batch_size: int = 16) -> bool:
    """Write the out-of-fold records of the finished fold in ``run_dir`` where they are missing (a fold trained
    before they were written, or interrupted between its bundle and its records); True when it wrote them.

    Raises:
        BundleError, DataError: the fold has no readable bundle, or its validation patients cannot be found.
    """
    if (out_of_fold_dir(run_dir) / "summary.json").is_file():
        return False
    path = Path(run_dir) / BUNDLE_NAME
    bundle = load_bundle(path)
    evaluate_out_of_fold(bundle, recorded_cases(bundle.metadata, str(path), data, "val", "predict out of fold"),
                         run_dir, device, batch_size)
    return True
