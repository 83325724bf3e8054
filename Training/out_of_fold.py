"""Out-of-fold records of a cross-validation fold: its finished bundle evaluated on the fold's own validation
patients, the patients no other step of that run trained on.

The records are :func:`Evaluation.evaluate.evaluate_bundle`'s files (``per_case.csv`` at the fold's fitted
temperature and at T = 1, ``summary.json``, reliability diagrams) in the fold's ``out_of_fold/`` folder. Over the
folds of a cross-validation every labelled patient is predicted out of fold exactly once, which is what
``calibseg-crossval`` summarises and what the ensemble's choices are made on (:mod:`Training.ensemble`).

The test patients are never read here: a fold's validation side holds none of them (:mod:`Datasets.splits.folds`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from CalibSegLib.bundle import Bundle, load_bundle
from Datasets.cases import Case, DataError
from Evaluation.evaluate import EvaluationResult, evaluate_bundle
from Training.bundle_rewrite import recorded_cases
from Training.records import BUNDLE_NAME, OUT_OF_FOLD_DIR

__all__ = ["out_of_fold_dir", "evaluate_out_of_fold", "complete_out_of_fold"]


def out_of_fold_dir(run_dir: str | Path) -> Path:
    """Where fold run ``run_dir`` keeps its out-of-fold records."""
    return Path(run_dir) / OUT_OF_FOLD_DIR


def evaluate_out_of_fold(bundle: Bundle, validation: Sequence[Case], run_dir: str | Path, device: str = "auto",
                         batch_size: int = 16) -> EvaluationResult:
    """Evaluate fold ``bundle`` on its ``validation`` volumes into ``run_dir``'s out-of-fold folder."""
    if not validation:
        raise DataError(f"The fold in {run_dir} has no validation patients to predict out of fold.")
    return evaluate_bundle(bundle, validation, out_of_fold_dir(run_dir), device=device, batch_size=batch_size)


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
