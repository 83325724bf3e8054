"""The training loop: random crops at the model's spacing, Adam with a poly or step schedule, validation on
whole validation slices through the predictor's own sliding window, the loss's epoch hook (CRaC's ALM
schedule), atomic checkpoints with exact resume, and the choices made on validation at the end
(test-time mirroring, temperature, largest-component post-processing) written into the bundle."""

from __future__ import annotations

import copy
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from CalibSegLib.bundle import BundleMetadata, save_bundle
from CalibSegLib.device import environment, resolve_device
from CalibSegLib.inference import Predictor
from CalibSegLib.input_check import InputStatisticsError, statistics_of_cases
from CalibSegLib.io import atomic_output, write_json_atomic
from CalibSegLib.losses import build_loss
from CalibSegLib.metrics import CalibrationStatistics, dice
from CalibSegLib.metrics.calibration import masked_probabilities
from CalibSegLib.networks import build_network
from CalibSegLib.postprocessing import Postprocessing, choose_postprocessing
from CalibSegLib.preprocessing import Preprocessing
from CalibSegLib.quality import QualityModelError, fit_quality_model
from CalibSegLib.sliding_window import SlidingWindow, windows_per_pass
from CalibSegLib.temperature import apply_temperature, fit_temperature
from Datasets.cases import (ACDC_CLASS_COLORS, ACDC_CLASS_NAMES, Case, DataError, GridVolume, default_terminology,
                            to_model_grid)
from Training.batches import DEFAULT_AUGMENTATION, NO_AUGMENTATION, CropSampler, iterate_batches, plan_epoch
from Training.checkpoint import CheckpointError, capture_rng_state, load_checkpoint, restore_rng_state, save_checkpoint

__all__ = ["TrainConfig", "TrainResult", "RunSummary", "EpochRecord", "read_history", "EpochStatistics", "Trainer",
           "CHECKPOINT_NAME", "BUNDLE_NAME", "HISTORY_NAME", "RUN_SUMMARY_NAME", "TEMPERATURE_FITS", "LR_SCHEDULES"]

CHECKPOINT_NAME = "checkpoint.pt"
BUNDLE_NAME = "model.calibseg"
HISTORY_NAME = "history.jsonl"
RUN_SUMMARY_NAME = "run.json"
# Temperature scaling fits one number: a million validation voxels pin it down to well under 1 %.
_TEMPERATURE_VOXELS = 1_000_000
# "none" ships T = 1: a fitted temperature is only worth shipping where it lowers the validation foreground ECE.
TEMPERATURE_FITS: tuple[str, ...] = ("auto", "all", "foreground", "none")
LR_SCHEDULES: tuple[str, ...] = ("poly", "step")
# Resuming with any of these changed would not continue the same run.
_RESUME_MUST_MATCH = ("method", "loss_args", "network", "network_kwargs", "target_spacing", "patch_size",
                      "batch_size", "lr", "lr_schedule", "lr_step_to", "lr_step_epoch", "seed", "num_classes",
                      "iterations_per_epoch", "augment", "foreground_share", "epochs")


@dataclass
class TrainConfig:
    """Every training choice (the CLI flags of ``Training/train.py``)."""

    method: str = "crac"
    loss_args: dict[str, Any] = field(default_factory=dict)
    network: str = "unet"
    network_kwargs: dict[str, Any] = field(default_factory=dict)
    epochs: int = 100
    iterations_per_epoch: int | None = None  # None: one pass over the slices
    batch_size: int = 16
    lr: float = 1e-3
    lr_schedule: str = "step"  # "poly": lr·(1 − step/steps)^0.9 per step; "step": × lr_step_to/lr at lr_step_epoch
    lr_step_to: float = 1e-4
    lr_step_epoch: int = 50
    target_spacing: tuple[float, float] = (1.5, 1.5)  # in-plane (y, x) mm of the model's grid
    patch_size: tuple[int, int] = (224, 224)  # training crop = inference window, voxels at target_spacing
    foreground_share: float = 1 / 3  # crops centred on a foreground voxel
    augment: bool = True
    compile: bool = False  # torch.compile the training forward/backward (CPU: 1.6× faster steps)
    temperature_fit: str = "auto"  # voxels the temperature is fitted on: all, foreground, or the better
    device: str = "auto"
    amp: bool = False
    seed: int = 0
    val_every: int = 1
    deterministic: bool = False
    num_classes: int = 4
    class_names: list[str] = field(default_factory=lambda: list(ACDC_CLASS_NAMES))
    class_colors: list[tuple[float, float, float]] = field(default_factory=lambda: list(ACDC_CLASS_COLORS))
    workers: int = 0  # background threads assembling batches ahead of the step (0: in the loop)
    progress: bool = True


@dataclass
class TrainResult:
    bundle_path: Path
    best_epoch: int
    best_validation_dice: float
    history: list[dict[str, Any]]


@dataclass
class RunSummary:
    """``run.json`` of a finished run: what was trained, for how long, and what validation chose.

    ``training_wall_s`` is the wall time of the epochs (training and validation, resumed runs
    summed), ``finish_wall_s`` that of the end-of-run choices and the bundle; ``choices`` holds
    each validation decision with the numbers behind it.
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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> "RunSummary":
        return cls(**{item.name: values[item.name] for item in fields(cls)})

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


@dataclass
class EpochStatistics:
    """One epoch of training: mean ``loss`` per crop, ``slices_per_second`` and ``data_wait_share``
    (fraction of the epoch's wall time spent waiting for the next batch, in [0, 1])."""

    loss: float
    slices_per_second: float
    data_wait_share: float


@dataclass
class ValidationPass:
    """Logits of every validation volume on the model's grid, with the labels they are scored against."""

    logits: list[torch.Tensor]  # per volume (z, C, y, x) float32, CPU
    labels: list[torch.Tensor]  # per volume (z, y, x) int64, CPU


def _seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def _progress_enabled(requested: bool) -> bool:
    """Progress bars only on an interactive terminal: logs and CI get the per-epoch lines alone."""
    return requested and sys.stderr.isatty()


def _compiled(model: torch.nn.Module, enabled: bool) -> torch.nn.Module:
    """``torch.compile(model)`` when asked and possible; the eager model otherwise (said once on stdout)."""
    if not enabled:
        return model
    try:
        import torch._inductor.cpp_builder  # noqa: F401  (fails early where inductor cannot work)

        return torch.compile(model)
    except Exception as error:  # no C++ compiler, unsupported platform: train eagerly, just slower
        print(f"torch.compile unavailable ({type(error).__name__}); training without it.", flush=True)
        return model


class Trainer:
    """Trains one network on crops of cached volumes and writes checkpoints, logs and the bundle into ``run_dir``."""

    def __init__(self, config: TrainConfig, train_cases: list[Case], val_cases: list[Case], run_dir: Path,
                 data_description: dict[str, Any]) -> None:
        if not train_cases or not val_cases:
            raise DataError("The split must give at least one training and one validation volume.")
        if config.lr_schedule not in LR_SCHEDULES:
            raise DataError(f"Unknown learning-rate schedule {config.lr_schedule!r}; use {' or '.join(LR_SCHEDULES)}.")
        if config.temperature_fit not in TEMPERATURE_FITS:
            raise DataError(f"Unknown temperature fit {config.temperature_fit!r}; use {', '.join(TEMPERATURE_FITS)}.")
        self.config = config
        self.run_dir = Path(run_dir)
        self.train_cases, self.val_cases = train_cases, val_cases
        self.data_description = data_description
        _seed_everything(config.seed, config.deterministic)
        self.device = resolve_device(config.device)
        self.preprocessing = Preprocessing(target_spacing=tuple(config.target_spacing))
        patch_size = tuple(config.patch_size)
        self.sliding_window = SlidingWindow(patch_size=patch_size, batch_size=windows_per_pass(patch_size))
        try:
            self.preprocessing.validate()
            self.sliding_window.validate()
        except ValueError as error:
            raise DataError(str(error)) from None
        # On a GPU the volumes live in its memory, so assembling a batch never waits for the host.
        cache_device = self.device if self.device.type == "cuda" else torch.device("cpu")
        self.train_volumes = [volume.to(cache_device)
                              for volume in to_model_grid(train_cases, self.preprocessing, config.num_classes)]
        self.val_volumes: list[GridVolume] = to_model_grid(val_cases, self.preprocessing, config.num_classes)
        self.sampler = CropSampler(self.train_volumes, config.num_classes)
        largest = self.sampler.largest_slice
        if all(patch > size for patch, size in zip(config.patch_size, largest)):
            raise DataError(
                f"The crop size {config.patch_size[0]}×{config.patch_size[1]} is larger than every training slice "
                f"(largest {largest[0]}×{largest[1]} voxels at {config.target_spacing[0]:g} mm); choose a smaller "
                "--patch-size."
            )
        self.model = build_network(config.network, 1, config.num_classes, 2, **config.network_kwargs).to(self.device)
        self.training_model = _compiled(self.model, config.compile)
        self.loss = build_loss(config.method, config.num_classes, **config.loss_args).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr)
        self.steps_per_epoch = config.iterations_per_epoch or -(-len(self.sampler) // config.batch_size)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.amp and self.device.type == "cuda")
        self.data_order = torch.Generator().manual_seed(config.seed)
        self.epoch = 0
        self.best_dice = -math.inf
        self.best_epoch = -1
        self.best_state: dict[str, torch.Tensor] | None = None
        self.steps = 0
        self.training_seconds = 0.0
        self.history: list[dict[str, Any]] = []
        self.writer = None
        # One predictor around the live network for every validation: no weights copied, no bundle written.
        # It runs the shipped windows (overlap 0.5): windows that only tile the slice cut structures at
        # their borders and scored 0.07 Dice lower on ACDC validation (docs/training.md).
        self.validator = Predictor.from_network(self.model, self._metadata(), device=self.device,
                                                batch_size=config.batch_size)

    def _lr_factor(self, step: int) -> float:
        """Learning-rate multiplier after ``step`` optimiser steps (the scheduler steps once per batch)."""
        if self.config.lr_schedule == "poly":
            return max(1.0 - step / (self.config.epochs * self.steps_per_epoch), 0.0) ** 0.9
        milestone = self.config.lr_step_epoch * self.steps_per_epoch
        return 1.0 if step < milestone else self.config.lr_step_to / self.config.lr

    # ----------------------------------------------------------------- state
    def state(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit for bit (tensors and plain values only)."""
        return {
            "epoch": self.epoch,
            "steps": self.steps,
            "training_seconds": self.training_seconds,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "loss": self.loss.state_dict(),
            "best_dice": self.best_dice,
            "best_epoch": self.best_epoch,
            "best_state": self.best_state,
            "rng": capture_rng_state(self.data_order),
            "history": json.dumps(self.history),
            "config": json.dumps(asdict(self.config), default=str),
        }

    def _check_same_run(self, saved_config: str, checkpoint_path: Path) -> None:
        saved = json.loads(saved_config)
        current = json.loads(json.dumps(asdict(self.config), default=str))
        changed = [key for key in _RESUME_MUST_MATCH if saved.get(key) != current.get(key)]
        if changed:
            key = changed[0]
            raise CheckpointError(
                f"{checkpoint_path} was trained with {key}={saved.get(key)!r} but this run asks for "
                f"{current.get(key)!r}; resume with the run's original flags or choose another --out."
            )

    def resume(self, checkpoint_path: Path) -> None:
        """Continue from ``checkpoint_path``; raises :class:`CheckpointError` if it is damaged or another run's."""
        state = load_checkpoint(checkpoint_path)
        self._check_same_run(state.get("config", "{}"), checkpoint_path)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.loss.load_state_dict(state["loss"])
        self.epoch = int(state["epoch"])
        self.steps = int(state.get("steps", 0))
        self.training_seconds = float(state.get("training_seconds", 0.0))
        self.best_dice = float(state["best_dice"])
        self.best_epoch = int(state["best_epoch"])
        self.best_state = state["best_state"]
        self.history = json.loads(state["history"])
        restore_rng_state(state["rng"], self.data_order)

    # ----------------------------------------------------------------- loop
    def _log(self, scalars: dict[str, float]) -> None:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, self.epoch + 1)
        self.writer.flush()

    def _loss_value(self, logits: torch.Tensor, target: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        # Only two-view losses (BWCR) get the model and the batch; the others take (logits, target).
        if self.loss.needs_model:
            return self.loss(logits, target, model=self.training_model, images=images)
        return self.loss(logits, target)

    def train_step(self, images: torch.Tensor, target: torch.Tensor) -> float:
        """One optimiser step on ``images (B, 1, H, W)`` and ``target (B, H, W)`` int64 (on the device); returns the loss."""
        with torch.autocast(self.device.type, enabled=self.config.amp):
            logits = self.training_model(images)
            value = self._loss_value(logits.float(), target, images)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(value).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return value.item()

    def epoch_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of the next epoch (advances the data-order generator)."""
        augmentation = DEFAULT_AUGMENTATION if self.config.augment else NO_AUGMENTATION
        plans = plan_epoch(self.sampler, self.config.batch_size, self.config.iterations_per_epoch, self.data_order,
                           self.config.patch_size, augmentation, self.config.foreground_share)
        return iterate_batches(self.sampler, plans, self.config.patch_size, self.device, self.config.workers)

    def train_epoch(self) -> EpochStatistics:
        """One epoch of optimiser steps (the learning rate follows its schedule step by step)."""
        from tqdm import tqdm

        self.model.train()
        total, seen, waited = 0.0, 0, 0.0
        started = ready = time.perf_counter()
        bar = tqdm(self.epoch_batches(), desc=f"epoch {self.epoch + 1}/{self.config.epochs}", unit="batch",
                   total=self.steps_per_epoch, leave=False, disable=not _progress_enabled(self.config.progress))
        for images, target in bar:
            waited += time.perf_counter() - ready
            total += self.train_step(images, target) * len(images)
            seen += len(images)
            self.steps += 1
            ready = time.perf_counter()
            bar.set_postfix(loss=f"{total / seen:.4f}", slices_s=f"{seen / (ready - started):.1f}",
                            data=f"{100 * waited / (ready - started):.0f}%")
        elapsed = max(time.perf_counter() - started, 1e-9)
        return EpochStatistics(total / max(seen, 1), seen / elapsed, waited / elapsed)

    def validation_pass(self, predictor: Predictor | None = None) -> ValidationPass:
        """Logits of every validation volume, whole slices through ``predictor``'s sliding window."""
        predictor = predictor or self.validator
        logits, labels = [], []
        for volume in self.val_volumes:
            volume_logits = [predictor.network_logits(volume.images[start:start + self.config.batch_size]).cpu()
                             for start in range(0, volume.images.shape[0], self.config.batch_size)]
            logits.append(torch.cat(volume_logits))
            labels.append(volume.labels.long())
        return ValidationPass(logits, labels)

    def validate(self) -> dict[str, float]:
        """Mean 3D foreground Dice and pooled foreground ECE (T = 1) over the validation volumes, the loss's
        epoch hook fed with the same logits, and its scalars."""
        validation = self.validation_pass()
        if self.loss.uses_validation_statistics:
            totals: dict[str, torch.Tensor] = {}
            for logits, labels in zip(validation.logits, validation.labels):
                for key, value in self.loss.validation_statistics(logits.to(self.device), labels.to(self.device)).items():
                    totals[key] = totals[key] + value if key in totals else value
            self.loss.end_epoch(totals)
        scores = _volume_dice(validation, Postprocessing(), self.config.num_classes)
        scalars = {"val/dice": float(np.nanmean(scores)), "val/ece": _foreground_ece(validation, 1.0)}
        scalars.update(self.loss.epoch_scalars(self.config.class_names))
        return scalars

    def fit(self) -> TrainResult:
        """Train until ``config.epochs``, checkpointing every epoch; returns the best model's bundle."""
        checkpoint = self.run_dir / CHECKPOINT_NAME
        while self.epoch < self.config.epochs:
            started = time.perf_counter()
            statistics = self.train_epoch()
            scalars = {"train/loss": statistics.loss, "train/lr": self.optimizer.param_groups[0]["lr"],
                       "speed/slices_per_s": statistics.slices_per_second,
                       "speed/data_wait_share": statistics.data_wait_share}
            is_last = self.epoch + 1 == self.config.epochs
            if (self.epoch + 1) % self.config.val_every == 0 or is_last or self.loss.uses_validation_statistics:
                scalars.update(self.validate())
                if scalars["val/dice"] > self.best_dice:
                    self.best_dice, self.best_epoch = scalars["val/dice"], self.epoch
                    self.best_state = copy.deepcopy(self.model.state_dict())
            scalars["time/epoch_s"] = time.perf_counter() - started
            self.training_seconds += scalars["time/epoch_s"]
            self._log(scalars)
            self.history.append(EpochRecord(self.epoch + 1, self.steps, scalars, self.loss.state_summary()).to_json())
            # Rewritten whole from the checkpointed history, so a resumed run never repeats an epoch.
            with atomic_output(self.run_dir / HISTORY_NAME) as temporary:
                temporary.write_text("".join(json.dumps(row) + "\n" for row in self.history))
            self.epoch += 1
            save_checkpoint(checkpoint, self.state())
            self._print_epoch(scalars)
        return self.finish()

    def _print_epoch(self, scalars: dict[str, float]) -> None:
        parts = [f"epoch {self.epoch}/{self.config.epochs}", f"loss {scalars['train/loss']:.4f}"]
        if "val/dice" in scalars:
            parts += [f"val Dice {scalars['val/dice']:.3f}", f"val ECE {scalars['val/ece']:.3f}"]
        parts.append(f"{scalars['speed/slices_per_s']:.0f} slices/s")
        parts.append(f"{scalars['time/epoch_s']:.1f}s")
        print("  ".join(parts), flush=True)

    # ----------------------------------------------------------------- the end of a run
    def _metadata(self, **fields_: Any) -> BundleMetadata:
        training = {
            "method": self.config.method,
            "loss_hyperparameters": self.config.loss_args,
            "epochs": self.config.epochs,
            "best_epoch": self.best_epoch + 1,
            "iterations_per_epoch": self.steps_per_epoch,
            "batch_size": self.config.batch_size,
            "patch_size": list(self.config.patch_size),
            "foreground_share": self.config.foreground_share,
            "augment": self.config.augment,
            "optimizer": "adam",
            "lr": self.config.lr,
            "lr_schedule": self.config.lr_schedule,
            "lr_step_to": self.config.lr_step_to,
            "lr_step_epoch": self.config.lr_step_epoch,
            "seed": self.config.seed,
            "amp": self.config.amp,
            "loss_state": self.loss.state_summary(),
        }
        values = dict(
            network=self.config.network,
            network_kwargs=self.config.network_kwargs,
            in_channels=1,
            num_classes=self.config.num_classes,
            spatial_dims=2,
            class_names=self.config.class_names,
            class_colors=self.config.class_colors,
            preprocessing=self.preprocessing,
            sliding_window=self.sliding_window,
            training=training,
            data=self.data_description,
        )
        values.update(fields_)
        return BundleMetadata(**values)

    def _temperature_samples(self, validation: ValidationPass, foreground: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """At most about ``_TEMPERATURE_VOXELS`` validation ``(N, C)`` logits and ``(N,)`` labels, drawn with a
        fixed seed (reproducible, bounded memory); ``foreground``: reference-foreground voxels only."""
        flat_logits = [logits.movedim(1, -1).reshape(-1, self.config.num_classes) for logits in validation.logits]
        flat_labels = [labels.reshape(-1) for labels in validation.labels]
        if foreground:
            keep = [labels > 0 for labels in flat_labels]
            flat_logits = [logits[mask] for logits, mask in zip(flat_logits, keep)]
            flat_labels = [labels[mask] for labels, mask in zip(flat_labels, keep)]
        total = sum(len(labels) for labels in flat_labels)
        keep_fraction = min(1.0, _TEMPERATURE_VOXELS / max(total, 1))
        sampler = torch.Generator().manual_seed(self.config.seed)
        kept = [torch.rand(len(labels), generator=sampler) < keep_fraction for labels in flat_labels]
        return (torch.cat([logits[mask] for logits, mask in zip(flat_logits, kept)]),
                torch.cat([labels[mask] for labels, mask in zip(flat_labels, kept)]))

    def choose_temperature(self, validation: ValidationPass) -> tuple[float, dict[str, Any]]:
        """The temperature to ship: fitted by NLL on all or on reference-foreground validation voxels, or
        1 (``"none"``) — ``config.temperature_fit``, or with ``"auto"`` the candidate with the lowest validation
        foreground ECE (T = 1 on a tie)."""
        fits = ("none", "all", "foreground") if self.config.temperature_fit == "auto" else (self.config.temperature_fit,)
        foreground_ece_t1 = _foreground_ece(validation, 1.0)
        candidates = {"none": {"temperature": 1.0, "foreground_ece": foreground_ece_t1}} if "none" in fits else {}
        for fit in fits:
            if fit != "none":
                temperature = float(fit_temperature(*self._temperature_samples(validation, fit == "foreground")))
                candidates[fit] = {"temperature": temperature, "foreground_ece": _foreground_ece(validation, temperature)}
        chosen = min(candidates, key=lambda fit: candidates[fit]["foreground_ece"])
        return candidates[chosen]["temperature"], {"fitted_on": chosen, "candidates": candidates,
                                                   "foreground_ece_t1": foreground_ece_t1}

    def fit_quality(self, metadata: BundleMetadata, choices: dict[str, Any]) -> dict[str, Any] | None:
        """The quality model (predicted Dice from uncertainty) fitted on the validation volumes as the shipped
        bundle segments them, or None (with the reason in ``choices``) when they are too few to fit one."""
        predictor = Predictor.from_network(self.model, metadata, device=self.device, batch_size=self.config.batch_size)
        try:
            quality = fit_quality_model(predictor, self.val_cases, metadata.class_names)
        except QualityModelError as error:
            choices["quality_model"] = f"none: {error}"
            print(f"no quality model: {error}", flush=True)
            return None
        choices["quality_model"] = "fitted on the validation volumes"
        return quality.to_dict()

    def input_statistics(self, metadata: BundleMetadata, choices: dict[str, Any]) -> dict[str, Any] | None:
        """What the training volumes looked like, for the input check; None (said in ``choices``) when it cannot
        be computed, e.g. a structure absent from every training volume."""
        try:
            statistics = statistics_of_cases(metadata, self.train_cases)
        except InputStatisticsError as error:
            choices["input_statistics"] = f"none: {error}"
            return None
        choices["input_statistics"] = f"from the {statistics['volumes']} training volumes"
        return statistics

    def finish(self) -> TrainResult:
        """Choose mirroring, temperature and post-processing on validation for the best weights; write the bundle."""
        started = time.perf_counter()
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)
        choices: dict[str, Any] = {}
        # Test-time mirroring only where validation shows it helps: it costs 4× the inference time.
        plain = self.validation_pass()
        mirrored_window = replace(self.sliding_window, mirror_axes=(0, 1))
        mirrored = self.validation_pass(Predictor.from_network(
            self.model, self._metadata(sliding_window=mirrored_window), device=self.device,
            batch_size=self.config.batch_size))
        dice_plain = float(np.nanmean(_volume_dice(plain, Postprocessing(), self.config.num_classes)))
        dice_mirrored = float(np.nanmean(_volume_dice(mirrored, Postprocessing(), self.config.num_classes)))
        use_mirroring = dice_mirrored > dice_plain
        validation = mirrored if use_mirroring else plain
        window = mirrored_window if use_mirroring else self.sliding_window
        choices["mirroring"] = {"used": use_mirroring, "val_dice_without": dice_plain, "val_dice_with": dice_mirrored}
        temperature, choices["temperature"] = self.choose_temperature(validation)
        without = _volume_dice(validation, Postprocessing(), self.config.num_classes, per_class=True)
        with_component = [
            _volume_dice(validation, Postprocessing((class_id,)), self.config.num_classes, per_class=True)[:, class_id - 1]
            for class_id in range(1, self.config.num_classes)]
        postprocessing = choose_postprocessing(without, np.stack(with_component, axis=1))
        processed = _volume_dice(validation, postprocessing, self.config.num_classes)
        choices["postprocessing"] = {"largest_component": list(postprocessing.largest_component),
                                     "val_dice_per_class_without": np.nanmean(without, axis=0).tolist(),
                                     "val_dice_per_class_largest_component":
                                         np.nanmean(np.stack(with_component, axis=1), axis=0).tolist(),
                                     "val_dice_final": float(np.nanmean(processed))}
        best = dict(self.history[self.best_epoch]) if self.best_epoch >= 0 else {}
        chosen_fit = choices["temperature"]["candidates"][choices["temperature"]["fitted_on"]]
        validation_metrics = {"best_epoch": best, "dice": float(np.nanmean(processed)),
                              "foreground_ece": chosen_fit["foreground_ece"], "choices": choices}
        metadata = self._metadata(sliding_window=window, postprocessing=postprocessing, temperature=temperature,
                                  validation_metrics=validation_metrics)
        metadata = replace(metadata, quality_model=self.fit_quality(metadata, choices),
                           input_statistics=self.input_statistics(metadata, choices),
                           class_terminology=default_terminology(metadata.class_names))
        path = save_bundle(self.run_dir / BUNDLE_NAME, self.model.state_dict(), metadata)
        if self.writer is not None:
            self.writer.close()
        summary = RunSummary(
            method=self.config.method, config=json.loads(json.dumps(asdict(self.config), default=str)),
            bundle=str(path), best_epoch=self.best_epoch + 1, best_validation_dice=self.best_dice,
            epochs=self.epoch, steps=self.steps, training_wall_s=self.training_seconds,
            finish_wall_s=time.perf_counter() - started, choices=choices, loss_state=self.loss.state_summary(),
            environment=environment(self.config.device))
        write_json_atomic(self.run_dir / RUN_SUMMARY_NAME, summary.to_json())
        return TrainResult(path, self.best_epoch + 1, self.best_dice, self.history)


def _volume_labels(logits: torch.Tensor, postprocessing: Postprocessing) -> np.ndarray:
    """``(z, y, x)`` uint8 labels of one volume's logits after ``postprocessing``."""
    return postprocessing.apply(logits.argmax(dim=1).to(torch.uint8).numpy())


def _volume_dice(validation: ValidationPass, postprocessing: Postprocessing, num_classes: int,
                 per_class: bool = False) -> np.ndarray:
    """Per validation volume: mean foreground Dice ``(V,)``, or per class ``(V, C - 1)`` with ``per_class``."""
    scores = np.stack([dice(_volume_labels(logits, postprocessing), labels.numpy(), num_classes)
                       for logits, labels in zip(validation.logits, validation.labels)])
    return scores if per_class else np.nanmean(scores, axis=1)


def _foreground_ece(validation: ValidationPass, temperature: float) -> float:
    """Pooled ECE over the reference-foreground validation voxels at ``temperature``."""
    statistics = CalibrationStatistics(validation.logits[0].shape[1])
    for logits, labels in zip(validation.logits, validation.labels):
        probabilities = torch.softmax(apply_temperature(logits, temperature), dim=1).movedim(1, 0).numpy()
        statistics.add(*masked_probabilities(probabilities, labels.numpy()))
    return statistics.ece()
