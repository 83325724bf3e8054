"""What a training run leaves in its folder, typed: the file names, ``run.json`` (:class:`RunSummary`) and
``history.jsonl`` (:class:`EpochRecord` a line); ``plan.json`` is :class:`Training.plan.Plan`'s.

The later stages (``Reporting/``) read runs through these alone, never through the trainer.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from CalibSegLib.io import recorded_path

__all__ = ["CHECKPOINT_NAME", "BUNDLE_NAME", "HISTORY_NAME", "RUN_SUMMARY_NAME", "PLAN_NAME",
           "OUT_OF_FOLD_DIR", "RunSummary", "EpochRecord", "read_history"]

CHECKPOINT_NAME = "checkpoint.pt"
BUNDLE_NAME = "model.calibseg"
HISTORY_NAME = "history.jsonl"
RUN_SUMMARY_NAME = "run.json"
PLAN_NAME = "plan.json"  # written before the first step; a run's configuration is built from it
# A cross-validation fold's bundle evaluated on its own validation patients (calibseg-evaluate's files).
OUT_OF_FOLD_DIR = "out_of_fold"


@dataclass
class RunSummary:
    """``run.json`` of a finished run: what was trained, for how long, and what validation chose.

    ``training_wall_s`` is the wall time of the epochs (training and validation, resumed runs
    summed), ``finish_wall_s`` that of the end-of-run choices and the bundle; ``choices`` holds
    each validation decision with the numbers behind it (or ``"none: <why>"`` where one could not be made);
    ``world_size`` the number of processes that trained (torchrun's, 1 without it).
    """

    method: str
    config: dict[str, Any]
    bundle: str
    best_epoch: int
    best_validation_dice: float
    epochs: int
    steps: int
    training_wall_s: float
    finish_wall_s: float
    choices: dict[str, Any]
    loss_state: dict[str, Any]
    environment: dict[str, Any]
    world_size: int = 1

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "bundle": recorded_path(self.bundle)}

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> "RunSummary":
        # Runs written before a field existed keep its default (world_size: one process).
        return cls(**{item.name: values[item.name] for item in fields(cls) if item.name in values})

    @classmethod
    def read(cls, run_dir: str | Path) -> "RunSummary":
        """The summary of the finished run in ``run_dir``; raises ``ValueError`` if there is none."""
        path = Path(run_dir) / RUN_SUMMARY_NAME
        if not path.is_file():
            raise ValueError(f"{run_dir} holds no finished run ({RUN_SUMMARY_NAME} is missing); train it to the end.")
        return cls.from_json(json.loads(path.read_text()))


@dataclass
class EpochRecord:
    """One line of ``history.jsonl``: the epoch (1-based), the optimiser steps taken so far, the scalars logged
    that epoch (``train/loss``, ``val/dice``, ``time/epoch_s``, the loss's own ...) and the loss's
    :meth:`~CalibSegLib.losses.SegmentationLoss.state_summary` after it (CRaC: its multipliers)."""

    epoch: int
    steps: int
    scalars: dict[str, float]
    loss_state: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "steps": self.steps, **self.scalars, "loss_state": self.loss_state}

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> "EpochRecord":
        scalars = {key: value for key, value in values.items() if key not in ("epoch", "steps", "loss_state")}
        return cls(int(values["epoch"]), int(values.get("steps", 0)), scalars, dict(values.get("loss_state", {})))


def read_history(run_dir: str | Path) -> list[EpochRecord]:
    """The epochs logged in ``run_dir``'s ``history.jsonl`` (none when it has no history)."""
    path = Path(run_dir) / HISTORY_NAME
    if not path.is_file():
        return []
    return [EpochRecord.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
