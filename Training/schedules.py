"""The training schedules: named defaults for the flags a run leaves open (each flag overrides its value).

``quick`` (the default) trains on the shipped sample in minutes on a CPU, ``cpu`` (``--cpu``) the full cardiac
dataset within an hour on a 2-core CPU, ``paper`` (``--paper``) is the papers' 100 epochs of one pass each
with Adam 1e-3 → 1e-4 at epoch 50, on 224×224 crops (docs/training.md has the measurements behind each).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["Schedule", "SCHEDULES", "chosen_schedule"]


@dataclass(frozen=True)
class Schedule:
    """A named set of defaults for the training flags (each flag overrides its value)."""

    description: str
    epochs: int
    iterations_per_epoch: int | None  # None: one pass over the training slices per epoch
    patch_size: int  # the 2D patch side the plan prefers (smaller where the median slice is)
    lr_schedule: str
    lr_step_epoch: int | None  # for the "step" schedule; None: half the epochs
    compile: bool
    val_every: int  # epochs between validations (losses that adapt on validation, CRaC, validate every epoch)
    # Per method, loss hyper-parameters this schedule needs (each --loss-arg overrides its key).
    loss_args: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


SCHEDULES: dict[str, Schedule] = {
    # Measured on the 2-core CPU (docs/training.md): about 5 min of training on the shipped sample.
    # CRaC updates its multipliers once per epoch; 100 steps apart from the start they take over
    # before the network has learned the structures (docs/decisions.md, "CRaC"), so they hold still
    # for the first 3 epochs (300 steps; the full dataset trains well with 250 steps per update).
    "quick": Schedule("quick CPU schedule for the shipped sample", epochs=10, iterations_per_epoch=100,
                      patch_size=128, lr_schedule="poly", lr_step_epoch=None, compile=True, val_every=1,
                      loss_args={"crac": {"warmup_epochs": 3}}),
    # The full cardiac dataset on the 2-core CPU within an hour (docs/training.md has the measurements).
    "cpu": Schedule("CPU schedule for the full dataset", epochs=36, iterations_per_epoch=250, patch_size=128,
                    lr_schedule="poly", lr_step_epoch=None, compile=True, val_every=2),
    "paper": Schedule("the papers' schedule", epochs=100, iterations_per_epoch=None, patch_size=224,
                      lr_schedule="step", lr_step_epoch=50, compile=False, val_every=1),
}


def chosen_schedule(arguments: argparse.Namespace) -> Schedule:
    """The schedule the flags choose: ``--paper``, ``--cpu``, else ``quick``."""
    return SCHEDULES["paper" if arguments.paper else "cpu" if arguments.cpu else "quick"]
