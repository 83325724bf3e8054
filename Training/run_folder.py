"""A run's folder: where ``calibseg-train`` writes, and what a refused or interrupted fresh run leaves there
(nothing it made: the folder and its parents it created, the files it added)."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from Training.checkpoint import CheckpointError
from Training.cross_validation import cross_validation_dir, fold_folder
from Training.records import CHECKPOINT_NAME

__all__ = ["run_folder", "missing_folders", "remove_new_entries", "interrupted_text"]


def run_folder(arguments: argparse.Namespace) -> Path:
    """``--out``, or the first of ``runs/<method>``, ``runs/<method>-2``, ... (under the current folder, never
    inside the installed package) not holding a run; with ``--fold K`` its ``fold_K`` folder (the
    cross-validation's folder default ``runs/<method>-cv``).

    Raises:
        CheckpointError: ``--resume`` without ``--out``.
    """
    if arguments.fold is not None:
        return cross_validation_dir(arguments) / fold_folder(arguments.fold)
    if arguments.out is not None:
        return Path(arguments.out)
    if arguments.resume:
        raise CheckpointError("--resume needs --out with the folder of the run to continue.")
    base = Path("runs") / arguments.method
    candidate, number = base, 1
    while (candidate / CHECKPOINT_NAME).exists():
        number += 1
        candidate = base.with_name(f"{arguments.method}-{number}")
    return candidate


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, outermost first: what making it creates."""
    missing = []
    while not folder.exists() and folder.parent != folder:
        missing.insert(0, folder)
        folder = folder.parent
    return missing


def remove_new_entries(folder: Path, before: set[str]) -> None:
    """Remove what appeared in ``folder`` since its entries were ``before`` (a refused or interrupted fresh
    run's plan and split files, TensorBoard folder, history)."""
    for name in set(os.listdir(folder)) - before:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def interrupted_text(checkpoint: Path, folder_kept: bool) -> str:
    """What a Ctrl-C during training leaves: the last checkpoint to resume from, or nothing (``folder_kept``:
    the run folder existed before the run, or holds other files)."""
    if checkpoint.exists():
        return (f"interrupted: the last completed epoch's checkpoint {checkpoint} is kept; continue with "
                "--resume.")
    kept = "kept as it was" if folder_kept else "removed"
    return (f"interrupted before the first epoch ended: no checkpoint was written, and the run folder "
            f"{checkpoint.parent} is {kept}; start the run again.")
