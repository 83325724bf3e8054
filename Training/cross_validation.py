"""``calibseg-train --fold``: where a cross-validation's folds go, and ``--fold all``'s loop over them.

Each fold is one run of ``calibseg-train`` into the cross-validation folder's ``fold_K``
(:func:`fold_folder`); ``--fold all`` trains every fold in turn, keeps a finished one (completing its
out-of-fold records), resumes an interrupted one under ``--resume``, and ends with the out-of-fold summary
(:mod:`Evaluation.crossval`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from Datasets.errors import DataError
from Datasets.splits.folds import FOLDS
from Evaluation.crossval import CROSSVAL_DIR, read_out_of_fold, summary_lines, write_cross_validation
from Training.distributed import Processes
from Training.out_of_fold import complete_out_of_fold, out_of_fold_dir
from Training.records import CHECKPOINT_NAME, RUN_SUMMARY_NAME

__all__ = ["cross_validation_dir", "fold_folder", "run_cross_validation"]


def cross_validation_dir(arguments: argparse.Namespace) -> Path:
    """The folder of the cross-validation ``--fold`` trains into: ``--out``, default ``runs/<method>-cv``."""
    return Path(arguments.out) if arguments.out is not None else Path("runs") / f"{arguments.method}-cv"


def fold_folder(fold: int) -> str:
    """The folder of cross-validation fold ``fold`` inside the cross-validation's folder."""
    return f"fold_{fold}"


def run_cross_validation(arguments: argparse.Namespace,
                         train_fold: Callable[[argparse.Namespace], Path | None]) -> Path | None:
    """``--fold all``: every fold in turn through ``train_fold`` (calibseg-train's run, given the flags with
    ``--fold K``; a finished fold kept, an interrupted one resumed under ``--resume``), then the out-of-fold
    summary in the cross-validation's ``crossval/``; returns that folder (None in torchrun's other processes,
    and with ``--plan-only``, which plans every fold and trains none).

    Raises:
        DataError: folds exist already and ``--resume`` was not given.
    """
    folder = cross_validation_dir(arguments)
    started = [fold for fold in range(FOLDS) if (folder / fold_folder(fold) / CHECKPOINT_NAME).exists()]
    if started and not arguments.resume:
        raise DataError(f"{folder} already holds fold(s) {', '.join(map(str, started))} of a "
                        "cross-validation; pass --resume to continue it, or choose another --out.")
    for fold in range(FOLDS):
        fold_dir = folder / fold_folder(fold)
        print(f"cross-validation fold {fold} of {FOLDS} ({fold_dir})", flush=True)
        # A fold finished earlier: only its out-of-fold records may be missing.
        if (fold_dir / RUN_SUMMARY_NAME).is_file():
            if not arguments.plan_only:
                complete_out_of_fold(fold_dir, arguments.data, arguments.device, arguments.batch_size)
            continue
        train_fold(argparse.Namespace(**{**vars(arguments), "fold": fold, "out": folder,
                                         "resume": (fold_dir / CHECKPOINT_NAME).exists()}))
    if arguments.plan_only or not Processes.from_environment().is_main:
        return None
    results = read_out_of_fold([out_of_fold_dir(folder / fold_folder(fold)) for fold in range(FOLDS)],
                               arguments.method)
    summary = write_cross_validation(results, folder / CROSSVAL_DIR)
    print("\n".join(summary_lines(summary)))
    print(f"out-of-fold summary: {folder / CROSSVAL_DIR}")
    return folder / CROSSVAL_DIR
