"""A training run's configuration: :class:`TrainConfig`, built once from the run's plan, its schedule and the
flags (:func:`train_config`), and never changed after.

The plan (:mod:`Training.plan`) holds what the data decided: grid, patch, normalisation, classes and channels;
the schedule (:mod:`Training.schedules`) the defaults the flags leave open; the flags everything else. The
class holds no default of its own, so no dataset's classes and no schedule's numbers are written twice.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

import torch

from CalibSegLib.device import resolve_device
from CalibSegLib.losses import build_loss
from CalibSegLib.preprocessing import ChannelNormalization
from Datasets.errors import DataError
from Training.plan import Plan, per_axis
from Training.schedules import REFERENCE_LR, Schedule, UnsetBatch, device_batch_size, scaled_lr, warmup_steps

__all__ = ["TrainConfig", "check_flags", "train_config", "check_config"]

# Flags that must be positive and finite numbers where given.
_POSITIVE_FLAGS = ("epochs", "batch_size", "lr", "lr_step_to", "lr_step_epoch", "iterations_per_epoch",
                   "val_every")


@dataclass(frozen=True)
class TrainConfig:
    """Every choice of a training run (what ``run.json`` records as ``config``, and a checkpoint too: a
    resumed run must repeat the choices that shape its steps, :meth:`Training.trainer.Trainer.resume`)."""

    method: str
    loss_args: dict[str, Any]
    network: str
    network_kwargs: dict[str, Any]
    epochs: int
    iterations_per_epoch: int | None  # None: one pass over the training items per epoch
    batch_size: int
    lr: float
    lr_schedule: str  # "poly": lr·(1 − step/steps)^0.9 per step; "step": × lr_step_to/lr at lr_step_epoch
    lr_step_to: float
    lr_step_epoch: int
    spatial_dims: int  # 2: slice-wise network on (y, x) crops; 3: volumetric network on (z, y, x) crops
    target_spacing: tuple[float, ...]  # mm of the model's grid: (y, x), or (z, y, x) in 3D
    patch_size: tuple[int, ...]  # training crop = inference window, voxels at target_spacing
    foreground_share: float  # crops centred on a foreground voxel
    foreground_sampling: str  # how they are centred: a name of Training.batches.FOREGROUND_SAMPLERS
    augment: bool
    compile: bool  # torch.compile the training forward/backward (CPU: 1.6× faster steps)
    temperature_fit: str  # voxels the temperature is fitted on: all, foreground, or the better
    mirroring: str  # test-time mirroring: chosen on validation ("auto") or never ("off")
    device: str
    amp: bool | None  # bfloat16 autocast; None: on CUDA, not on a CPU (slower there without bf16 units)
    seed: int
    val_every: int
    deterministic: bool
    num_classes: int
    class_names: list[str]
    class_colors: list[tuple[float, float, float]]
    channel_names: list[str] | None  # the input channels in order (None: one, the image)
    # Per channel how it is normalised (None: the per-image percentile scaling of every channel).
    channel_normalization: list[ChannelNormalization] | None
    plan: dict[str, Any] | None  # the plan the data choices came from (Plan.to_json), for the records
    workers: int  # background threads assembling batches ahead of the step (0: in the loop)
    progress: bool = True  # progress bars (on an interactive terminal only)
    # Steps over which the learning rate rises linearly to ``lr`` (0: none, the CPU schedules' and older runs').
    warmup_steps: int = 0
    cuda_graphs: bool | None = None  # replay the step as CUDA graphs; None: on CUDA where the shapes are static
    channels_last: bool = False  # NHWC (NDHWC) memory format for the network and its crops

    @property
    def in_channels(self) -> int:
        """The network's input channels."""
        return len(self.channel_names) if self.channel_names else 1


def check_flags(arguments: argparse.Namespace) -> None:
    """Refuse, before any data is read, flags that no data could make right (one sentence each).

    Raises:
        DataError: a number that must be positive and finite is not, ``--workers`` is negative,
            ``--foreground-share`` lies outside [0, 1], a per-axis flag has the wrong count, or ``--gpu`` is
            asked for where PyTorch sees no CUDA device (or with another ``--device``).
    """
    if getattr(arguments, "gpu", False):
        if not str(arguments.device).startswith(("auto", "cuda")):
            raise DataError(f"--gpu trains on a CUDA device; drop --device {arguments.device}, or train with "
                            "--cpu.")
        if not torch.cuda.is_available():
            raise DataError("--gpu needs a CUDA GPU and PyTorch sees none on this machine; train with --cpu "
                            "here (the full dataset within an hour on 2 cores).")
    for name in _POSITIVE_FLAGS:
        value = getattr(arguments, name)
        # NaN compares False with everything, so it is refused too
        if value is not None and not (math.isfinite(value) and value > 0):
            raise DataError(f"--{name.replace('_', '-')} must be positive and finite, got {value}.")
    if arguments.workers < 0:
        raise DataError(f"--workers must be at least 0, got {arguments.workers}.")
    if not 0 <= arguments.foreground_share <= 1:
        raise DataError(f"--foreground-share must lie in [0, 1], got {arguments.foreground_share}.")
    per_axis("--patch-size", arguments.patch_size, arguments.spatial_dims)
    per_axis("--target-spacing", arguments.target_spacing, arguments.spatial_dims)


def train_config(plan: Plan, schedule: Schedule, arguments: argparse.Namespace) -> TrainConfig:
    """The run's configuration: the data's choices from ``plan``, every other choice from the flags
    (``arguments``), and from ``schedule`` where a flag is left open (``--lr-step-epoch`` then half the
    epochs). A schedule without a batch of its own (``--gpu``) takes the batch that fills the device for the
    plan's patch, the learning rate scaled to that batch with a warm-up, and the epochs its crops budget needs
    at that batch (docs/decisions.md, "The GPU step")."""
    scaled = schedule.batch_size is None
    given = not isinstance(arguments.batch_size, UnsetBatch)
    batch_size = int(arguments.batch_size) if given or not scaled else device_batch_size(plan.patch_size)
    iterations = arguments.iterations_per_epoch or schedule.iterations_per_epoch
    epochs = arguments.epochs or schedule.epochs_for(batch_size, iterations)
    return TrainConfig(
        method=arguments.method,
        loss_args={**schedule.loss_args.get(arguments.method, {}), **dict(arguments.loss_arg)},
        network=arguments.network,
        network_kwargs=dict(arguments.network_arg),
        epochs=epochs,
        iterations_per_epoch=iterations,
        batch_size=batch_size,
        lr=arguments.lr or (scaled_lr(batch_size) if scaled else REFERENCE_LR),
        lr_schedule=arguments.lr_schedule or schedule.lr_schedule,
        lr_step_to=arguments.lr_step_to,
        lr_step_epoch=arguments.lr_step_epoch or schedule.lr_step_epoch or max(epochs // 2, 1),
        spatial_dims=plan.spatial_dims,
        target_spacing=plan.target_spacing,
        patch_size=plan.patch_size,
        foreground_share=arguments.foreground_share,
        foreground_sampling=arguments.foreground_sampling,
        augment=not arguments.no_augment,
        compile=schedule.compile if arguments.compile is None else arguments.compile,
        temperature_fit=arguments.temperature_fit,
        mirroring=arguments.mirroring,
        device=arguments.device,
        amp=arguments.amp,
        seed=arguments.seed,
        val_every=arguments.val_every or schedule.val_every,
        deterministic=arguments.deterministic,
        num_classes=len(plan.class_names),
        class_names=list(plan.class_names),
        class_colors=[tuple(color) for color in plan.class_colors],
        channel_names=None if plan.channel_names is None else list(plan.channel_names),
        channel_normalization=(None if plan.channel_normalization is None
                               else list(plan.channel_normalization)),
        plan=plan.to_json(),
        workers=arguments.workers,
        warmup_steps=warmup_steps(batch_size) if scaled else 0,
        cuda_graphs=getattr(arguments, "cuda_graphs", None),
        channels_last=getattr(arguments, "channels_last", False),
    )


def check_config(config: TrainConfig) -> None:
    """Build the loss and resolve the device of ``config`` (the network was built by the plan), so that a bad
    ``--loss-arg`` or ``--device`` stops the run before its folder exists.

    Raises:
        KeyError: a loss hyper-parameter the loss does not have (its sentence is the argument).
        ValueError: a device that is not there (one sentence).
    """
    build_loss(config.method, config.num_classes, **config.loss_args)
    resolve_device(config.device)
