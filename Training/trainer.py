"""The training loop: 2D slices, Adam with one learning-rate step, validation in 3D, CRaC's ALM
schedule, atomic checkpoints with exact resume, temperature scaling, and the model bundle."""

from __future__ import annotations

import copy
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from CalibSegLib.bundle import Bundle, BundleMetadata, Preprocessing, save_bundle
from CalibSegLib.inference import Predictor, resolve_device
from CalibSegLib.io import atomic_output
from CalibSegLib.losses import build_loss
from CalibSegLib.metrics import CalibrationAccumulator, dice
from CalibSegLib.networks import build_network
from CalibSegLib.temperature import fit_temperature
from Training.batches import iterate_batches, plan_epoch
from Training.checkpoint import CheckpointError, capture_rng_state, load_checkpoint, restore_rng_state, save_checkpoint
from Training.data import ACDC_CLASS_COLORS, ACDC_CLASS_NAMES, Case, DataError, SliceData, make_slices

__all__ = ["TrainConfig", "TrainResult", "EpochStatistics", "Trainer", "CHECKPOINT_NAME", "BUNDLE_NAME", "HISTORY_NAME"]

CHECKPOINT_NAME = "checkpoint.pt"
BUNDLE_NAME = "model.calibseg"
HISTORY_NAME = "history.jsonl"
# Temperature scaling fits one number: a million validation voxels pin it down to well under 1 %.
_TEMPERATURE_VOXELS = 1_000_000
# Resuming with any of these changed would not continue the same run.
_RESUME_MUST_MATCH = ("method", "loss_args", "network", "network_kwargs", "image_size", "batch_size", "lr",
                      "lr_step_to", "lr_step_epoch", "seed", "num_classes", "iterations_per_epoch", "augment")


@dataclass
class TrainConfig:
    """Every training choice (the CLI flags of ``Training/train.py``)."""

    method: str = "crac"
    loss_args: dict[str, Any] = field(default_factory=dict)
    network: str = "unet"
    network_kwargs: dict[str, Any] = field(default_factory=dict)
    epochs: int = 100
    batch_size: int = 16
    lr: float = 1e-3
    lr_step_to: float = 1e-4
    lr_step_epoch: int = 50
    image_size: tuple[int, int] = (224, 224)
    device: str = "auto"
    amp: bool = False
    seed: int = 0
    val_every: int = 1
    deterministic: bool = False
    num_classes: int = 4
    class_names: list[str] = field(default_factory=lambda: list(ACDC_CLASS_NAMES))
    class_colors: list[tuple[float, float, float]] = field(default_factory=lambda: list(ACDC_CLASS_COLORS))
    iterations_per_epoch: int | None = None  # None: one pass over the slices
    augment: bool = True  # random 90° rotations and flips of training slices (standard for ACDC)
    workers: int = 0  # background threads assembling batches ahead of the step (0: in the loop)
    progress: bool = True
    stop_after_steps: int | None = None  # simulates a killed run (tests): KeyboardInterrupt after N steps


@dataclass
class TrainResult:
    bundle_path: Path
    best_epoch: int
    best_validation_dice: float
    history: list[dict[str, Any]]


@dataclass
class EpochStatistics:
    """One epoch of training: mean ``loss`` per slice, ``slices_per_second`` and ``data_wait_share``
    (fraction of the epoch's wall time spent waiting for the next batch, in [0, 1])."""

    loss: float
    slices_per_second: float
    data_wait_share: float


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


class Trainer:
    """Trains one network on cached slices and writes checkpoints, logs and the bundle into ``run_dir``."""

    def __init__(self, config: TrainConfig, train_cases: list[Case], val_cases: list[Case], run_dir: Path,
                 data_description: dict[str, Any]) -> None:
        if not train_cases or not val_cases:
            raise DataError("The split must give at least one training and one validation volume.")
        self.config = config
        self.run_dir = Path(run_dir)
        self.val_cases = val_cases
        self.data_description = data_description
        _seed_everything(config.seed, config.deterministic)
        self.device = resolve_device(config.device)
        self.preprocessing = Preprocessing(target_size=tuple(config.image_size))
        # On a GPU the slices live in its memory, so assembling a batch never waits for the host.
        cache_device = self.device if self.device.type == "cuda" else torch.device("cpu")
        self.train_slices = make_slices(train_cases, self.preprocessing).to(cache_device)
        self.val_slices = make_slices(val_cases, self.preprocessing).to(cache_device)
        self.model = build_network(config.network, 1, config.num_classes, 2, **config.network_kwargs).to(self.device)
        self.loss = build_loss(config.method, config.num_classes, **config.loss_args).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr)
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(
            self.optimizer, milestones=[config.lr_step_epoch], gamma=config.lr_step_to / config.lr
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.amp and self.device.type == "cuda")
        self.data_order = torch.Generator().manual_seed(config.seed)
        self.epoch = 0
        self.best_dice = -math.inf
        self.best_epoch = -1
        self.best_state: dict[str, torch.Tensor] | None = None
        self.steps = 0
        self.history: list[dict[str, Any]] = []
        self.writer = None

    # ----------------------------------------------------------------- state
    def state(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit for bit (tensors and plain values only)."""
        return {
            "epoch": self.epoch,
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
        if getattr(self.loss, "needs_model", False):
            return self.loss(logits, target, model=self.model, images=images)
        return self.loss(logits, target)

    def train_step(self, images: torch.Tensor, target: torch.Tensor) -> float:
        """One optimiser step on ``images (B, 1, H, W)`` and ``target (B, H, W)`` int64 (on the device); returns the loss."""
        with torch.autocast(self.device.type, enabled=self.config.amp):
            logits = self.model(images)
            value = self._loss_value(logits.float(), target, images)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(value).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return value.item()

    def epoch_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of the next epoch (advances the data-order generator)."""
        height, width = self.config.image_size
        plans = plan_epoch(len(self.train_slices), self.config.batch_size, self.data_order,
                           self.config.iterations_per_epoch, self.config.augment, square=height == width)
        return iterate_batches(self.train_slices, plans, self.device, self.config.workers)

    def train_epoch(self) -> EpochStatistics:
        """One epoch of optimiser steps, then the learning-rate schedule's step."""
        from tqdm import tqdm

        self.model.train()
        total, seen, waited = 0.0, 0, 0.0
        started = ready = time.perf_counter()
        bar = tqdm(self.epoch_batches(), desc=f"epoch {self.epoch + 1}/{self.config.epochs}", unit="batch",
                   leave=False, disable=not _progress_enabled(self.config.progress))
        for images, target in bar:
            waited += time.perf_counter() - ready
            total += self.train_step(images, target) * len(images)
            seen += len(images)
            self.steps += 1
            ready = time.perf_counter()
            bar.set_postfix(loss=f"{total / seen:.4f}", slices_s=f"{seen / (ready - started):.1f}",
                            data=f"{100 * waited / (ready - started):.0f}%")
            if self.config.stop_after_steps is not None and self.steps >= self.config.stop_after_steps:
                raise KeyboardInterrupt(f"stopped after {self.steps} steps")
        self.scheduler.step()
        elapsed = max(time.perf_counter() - started, 1e-9)
        return EpochStatistics(total / max(seen, 1), seen / elapsed, waited / elapsed)

    @torch.no_grad()
    def _slice_logits(self, model: nn.Module, slices: SliceData) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(B, C, H, W)`` float32 logits and ``(B, H, W)`` int64 targets of cached slices, batch by batch."""
        model.eval()
        for start in range(0, len(slices), self.config.batch_size):
            images = slices.images[start:start + self.config.batch_size].to(self.device)
            target = slices.labels[start:start + self.config.batch_size].to(self.device).long()
            with torch.autocast(self.device.type, enabled=self.config.amp):
                logits = model(images)
            yield logits.float(), target

    def update_constraints(self) -> dict[str, float]:
        """CRaC (any loss with ``constraint_statistics``): one ALM step from the validation slices.

        Returns the multipliers λ and penalties ρ per region × class as TensorBoard scalars.
        """
        if not hasattr(self.loss, "constraint_statistics"):
            return {}
        totals: dict[str, torch.Tensor] = {}
        for logits, target in self._slice_logits(self.model, self.val_slices):
            for key, value in self.loss.constraint_statistics(logits, target).items():
                totals[key] = totals[key] + value if key in totals else value
        self.loss.update_multipliers(totals)
        scalars = {}
        for region_index, region in enumerate(("outer", "inner")):
            for class_index, name in enumerate(self.config.class_names):
                scalars[f"crac/lambda_{region}/{name}"] = float(self.loss.multipliers[region_index, class_index])
                scalars[f"crac/rho_{region}/{name}"] = float(self.loss.penalty[region_index, class_index])
        return scalars

    def _bundle(self, state_dict: dict[str, torch.Tensor], temperature: float | list[float] = 1.0,
                validation_metrics: dict | None = None) -> Bundle:
        training = {
            "method": self.config.method,
            "loss_hyperparameters": self.config.loss_args,
            "epochs": self.config.epochs,
            "best_epoch": self.best_epoch + 1,
            "batch_size": self.config.batch_size,
            "iterations_per_epoch": self.config.iterations_per_epoch,
            "augment": self.config.augment,
            "optimizer": "adam",
            "lr": self.config.lr,
            "lr_step_to": self.config.lr_step_to,
            "lr_step_epoch": self.config.lr_step_epoch,
            "seed": self.config.seed,
            "amp": self.config.amp,
        }
        if hasattr(self.loss, "multiplier_table"):
            training["crac_multipliers"] = self.loss.multiplier_table()
            training["crac_penalty"] = {region: self.loss.penalty[index].tolist()
                                        for index, region in enumerate(("outer", "inner"))}
        metadata = BundleMetadata(
            network=self.config.network,
            network_kwargs=self.config.network_kwargs,
            in_channels=1,
            num_classes=self.config.num_classes,
            spatial_dims=2,
            class_names=self.config.class_names,
            class_colors=self.config.class_colors,
            preprocessing=self.preprocessing,
            training=training,
            temperature=temperature,
            data=self.data_description,
            validation_metrics=validation_metrics or {},
        )
        return Bundle(metadata=metadata, state_dict={k: v.detach().cpu() for k, v in state_dict.items()})

    def validate(self) -> dict[str, float]:
        """3D validation through the predictor: mean foreground Dice and pooled ECE (T = 1) over the validation volumes."""
        predictor = Predictor(self._bundle(self.model.state_dict()), device=self.device, batch_size=self.config.batch_size)
        calibration = CalibrationAccumulator(self.config.num_classes)
        scores = []
        for case in self.val_cases:
            reference = case.label.astype(np.int64)

            def stream(slices: slice, probabilities: np.ndarray) -> None:
                calibration.update(probabilities, reference[slices])

            prediction = predictor.predict(case.image, case.spacing, probability_sink=stream)
            calibration.end_volume()
            scores.append(dice(prediction.labels, reference, self.config.num_classes).mean())
        return {"val/dice": float(np.mean(scores)), "val/ece": calibration.result().pooled["ece"]}

    def fit(self) -> TrainResult:
        """Train until ``config.epochs``, checkpointing every epoch; returns the best model's bundle."""
        checkpoint = self.run_dir / CHECKPOINT_NAME
        while self.epoch < self.config.epochs:
            started = time.perf_counter()
            statistics = self.train_epoch()
            scalars = {"train/loss": statistics.loss, "train/lr": self.optimizer.param_groups[0]["lr"],
                       "speed/slices_per_s": statistics.slices_per_second,
                       "speed/data_wait_share": statistics.data_wait_share}
            scalars.update(self.update_constraints())
            is_last = self.epoch + 1 == self.config.epochs
            if (self.epoch + 1) % self.config.val_every == 0 or is_last:
                scalars.update(self.validate())
                if scalars["val/dice"] > self.best_dice:
                    self.best_dice, self.best_epoch = scalars["val/dice"], self.epoch
                    self.best_state = copy.deepcopy(self.model.state_dict())
            scalars["time/epoch_s"] = time.perf_counter() - started
            self._log(scalars)
            self.history.append({"epoch": self.epoch + 1, **scalars})
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

    def fitted_temperature(self, state_dict: dict[str, torch.Tensor]) -> float:
        """Temperature minimising the NLL of the given weights on the validation slices.

        At most about ``_TEMPERATURE_VOXELS`` voxels are used, drawn with a fixed seed, so the
        fit is reproducible and its memory bounded whatever the validation set's size.
        """
        model = copy.deepcopy(self.model)
        model.load_state_dict(state_dict)
        height, width = self.config.image_size
        keep_fraction = min(1.0, _TEMPERATURE_VOXELS / (len(self.val_slices) * height * width))
        sampler = torch.Generator().manual_seed(self.config.seed)
        logits, labels = [], []
        for batch_logits, target in self._slice_logits(model, self.val_slices):
            flat_logits = batch_logits.movedim(1, -1).reshape(-1, self.config.num_classes).cpu()
            flat_labels = target.reshape(-1).cpu()
            keep = torch.rand(len(flat_labels), generator=sampler) < keep_fraction
            logits.append(flat_logits[keep])
            labels.append(flat_labels[keep])
        return float(fit_temperature(torch.cat(logits), torch.cat(labels)))

    def finish(self) -> TrainResult:
        """Fit the temperature of the best-validation-Dice weights and write the bundle."""
        best_state = self.best_state if self.best_state is not None else self.model.state_dict()
        temperature = self.fitted_temperature(best_state)
        validation = dict(self.history[self.best_epoch]) if self.best_epoch >= 0 else {}
        bundle = self._bundle(best_state, temperature, validation)
        path = save_bundle(self.run_dir / BUNDLE_NAME, bundle.state_dict, bundle.metadata)
        if self.writer is not None:
            self.writer.close()
        return TrainResult(path, self.best_epoch + 1, self.best_dice, self.history)
