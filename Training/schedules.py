"""The training schedules: named defaults for the flags a run leaves open (each flag overrides its value).

``quick`` (the default) trains on the shipped sample in minutes on a CPU, ``cpu`` (``--cpu``) the full cardiac
dataset within an hour on a 2-core CPU, ``paper`` (``--paper``) is the papers' 100 epochs of one pass each
with Adam 1e-3 → 1e-4 at epoch 50, on 224×224 crops, and ``gpu`` (``--gpu``) nnU-Net 2D's budget of crops
on one CUDA GPU, with a batch that fills it and the learning rate scaled to that batch
(docs/training.md has the measurements behind each, docs/decisions.md the GPU rules).

The CPU schedules train batches of :data:`REFERENCE_BATCH` at :data:`REFERENCE_LR`; the GPU schedule's batch
comes from :func:`device_batch_size`, its learning rate from :func:`scaled_lr` and its warm-up from
:func:`warmup_steps`, so that a larger batch trains the same number of crops as well.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["Schedule", "SCHEDULES", "chosen_schedule", "UnsetBatch", "REFERENCE_BATCH", "REFERENCE_LR",
           "GPU_BATCH_VOXELS", "GPU_CROPS", "WARMUP_CROPS", "device_batch_size", "scaled_lr", "warmup_steps"]

# The CPU schedules' batch and Adam learning rate: the recipe every shipped network was trained with.
REFERENCE_BATCH = 16
REFERENCE_LR = 1e-3
# Voxels per batch that fill one H200 with the 2D UNet: 256 crops of 128×128 (issue 61: 13,903 crops/s at
# batch 256 against 2,993 at 64 and 876 at 16; the step is launch-bound below that).
GPU_BATCH_VOXELS = 256 * 128 * 128
# The largest batch the rule gives: past it a step is no longer launch-bound and more crops only need memory.
_LARGEST_BATCH = 256


class UnsetBatch(int):
    """``--batch-size`` left open: the reference batch wherever it is read before the plan, and a value a schedule
    without a batch of its own (``--gpu``) replaces with the batch that fills the device
    (:func:`Training.config.train_config`)."""


# The GPU schedule's budget: nnU-Net 2D's 1,000 epochs × 250 batches, about a hundred times the pixels of the
# CPU schedule's 144,000 crops of 128×128 (issue 61), in crops of 128×128: 14.4 million. The papers' 100
# epochs of one pass over the ~1,900 training slices of 224×224 are about 0.6 million such crops, so nnU-Net's
# is the larger. At the 13,903 crops/s measured at batch 256 on an H200 that is 17 min of steps.
GPU_CROPS = 100 * 36 * 250 * REFERENCE_BATCH
# Crops over which the learning rate rises linearly to its scaled value when the batch is larger than the
# reference one: the reference recipe's first 1,000 steps (11 % of the CPU schedule, 0.1 % of the GPU one; 63
# steps of 256), while Adam's moment estimates settle. Chosen, not tuned: scripts/gpu_check.sh measures the rule.
WARMUP_CROPS = 1000 * REFERENCE_BATCH


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
    # None: the batch that fills the device (device_batch_size), the learning rate scaled to it (scaled_lr)
    # with a warm-up (warmup_steps), and as many epochs as hold the crops budget (epochs_for).
    batch_size: int | None = REFERENCE_BATCH
    crops: int | None = None  # the budget of crops; None: ``epochs`` whatever the batch

    def epochs_for(self, batch_size: int, iterations_per_epoch: int | None) -> int:
        """Epochs of ``iterations_per_epoch`` batches of ``batch_size`` that train the schedule's crops (its
        ``epochs`` when it has no crops budget or the epochs are passes)."""
        if self.crops is None or iterations_per_epoch is None:
            return self.epochs
        return max(1, math.ceil(self.crops / (batch_size * iterations_per_epoch)))


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
    # One CUDA GPU: 14.4 M crops (225 epochs of 250 batches of 256 on 128×128 crops), CUDA graphs, validated
    # every 25 epochs (a validation on the GPU takes seconds; CRaC still validates every epoch).
    "gpu": Schedule("GPU schedule (one CUDA device)", epochs=GPU_CROPS // (250 * 256), iterations_per_epoch=250,
                    patch_size=128, lr_schedule="poly", lr_step_epoch=None, compile=True, val_every=25,
                    loss_args={"crac": {"warmup_epochs": 3}}, batch_size=None, crops=GPU_CROPS),
}


def device_batch_size(patch_size: Sequence[int]) -> int:
    """The batch that fills a GPU for crops of ``patch_size`` voxels (2D or 3D): the largest power of two whose
    crops hold at most :data:`GPU_BATCH_VOXELS` voxels, from 2 (instance norm needs no batch, but a batch of
    one is a 3D network's worst case) to 256 (256 for 128×128 crops, 64 for 224×224, 16 for 16×128×128)."""
    crops = GPU_BATCH_VOXELS // math.prod(patch_size)
    return max(2, min(_LARGEST_BATCH, 1 << max(crops, 1).bit_length() - 1))


def scaled_lr(batch_size: int) -> float:
    """Adam's learning rate for batches of ``batch_size``: :data:`REFERENCE_LR` × √(batch / 16). The square root
    keeps the update's noise scale (lr / √batch for Adam) of the reference recipe (docs/decisions.md)."""
    return REFERENCE_LR * math.sqrt(batch_size / REFERENCE_BATCH)


def warmup_steps(batch_size: int) -> int:
    """Steps of linear warm-up for batches of ``batch_size``: those of :data:`WARMUP_CROPS` crops when the batch
    is larger than the reference one (its learning rate is then scaled up), else none."""
    return math.ceil(WARMUP_CROPS / batch_size) if batch_size > REFERENCE_BATCH else 0


def chosen_schedule(arguments: argparse.Namespace) -> Schedule:
    """The schedule the flags choose: ``--gpu``, ``--paper``, ``--cpu``, else ``quick``."""
    if getattr(arguments, "gpu", False):
        return SCHEDULES["gpu"]
    return SCHEDULES["paper" if arguments.paper else "cpu" if arguments.cpu else "quick"]
