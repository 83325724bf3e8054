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
from typing import Any

import numpy as np
import torch
from torch import nn

from CalibSegLib.bundle import Bundle, BundleMetadata, Preprocessing, save_bundle
from CalibSegLib.inference import Predictor, resolve_device
from CalibSegLib.losses import build_loss
from CalibSegLib.metrics import dice
from CalibSegLib.metrics.calibration import CalibrationStatistics, masked_probabilities
from CalibSegLib.networks import build_network
from CalibSegLib.temperature import fit_temperature
from Training.checkpoint import capture_rng_state, load_checkpoint, restore_rng_state, save_checkpoint
from Training.data import ACDC_CLASS_COLORS, ACDC_CLASS_NAMES, Case, DataError, SliceData, make_slices

__all__ = ["TrainConfig", "TrainResult", "Trainer", "CHECKPOINT_NAME", "BUNDLE_NAME"]

CHECKPOINT_NAME = "checkpoint.pt"
BUNDLE_NAME = "model.calibseg"
HISTORY_NAME = "history.jsonl"
_TEMPERATURE_VOXELS = 1_000_000


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
    progress: bool = True
    stop_after_steps: int | None = None  # simulates a killed run (tests): KeyboardInterrupt after N steps


@dataclass
class TrainResult:
    bundle_path: Path
    best_epoch: int
    best_validation_dice: float
    history: list[dict[str, Any]]


def _seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


class Trainer:
    """Trains one network on cached slices and writes checkpoints, logs and the bundle into ``run_dir``."""

    def __init__(self, config: TrainConfig, train_cases: list[Case], val_cases: list[Case], run_dir: Path,
                 data_description: dict[str, Any]) -> None:
        if not train_cases or not val_cases:
            raise DataError("The split must give at least one training and one validation volume.")
        self.config = config
        self.run_dir = run_dir
        self.val_cases = val_cases
        self.data_description = data_description
        _seed_everything(config.seed, config.deterministic)
        self.device = resolve_device(config.device)
        self.preprocessing = Preprocessing(target_size=tuple(config.image_size))
        self.train_slices = make_slices(train_cases, self.preprocessing)
        self.val_slices = make_slices(val_cases, self.preprocessing)
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

    def resume(self, checkpoint_path: Path) -> None:
        state = load_checkpoint(checkpoint_path)
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
            self.writer.add_scalar(name, value, self.epoch)
        self.writer.flush()

    def train_epoch(self) -> float:
        """One pass over the shuffled training slices; returns the mean loss."""
        from tqdm import tqdm

        self.model.train()
        batches = self._epoch_batches()
        total, seen = 0.0, 0
        bar = tqdm(batches, desc=f"epoch {self.epoch + 1}/{self.config.epochs}", unit="batch", leave=False,
                   disable=not (self.config.progress and sys.stderr.isatty()))
        for indices in bar:
            images, target = self.train_slices.images[indices], self.train_slices.labels[indices]
            if self.config.augment:
                images, target = self._augment(images, target)
            images, target = images.to(self.device), target.to(self.device)
            with torch.autocast(self.device.type, enabled=self.config.amp):
                logits = self.model(images)
                value = self.loss(logits.float(), target, model=self.model, images=images)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(value).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            total += value.item() * len(indices)
            seen += len(indices)
            self.steps += 1
            bar.set_postfix(loss=f"{total / seen:.4f}")
            if self.config.stop_after_steps is not None and self.steps >= self.config.stop_after_steps:
                raise KeyboardInterrupt(f"stopped after {self.steps} steps")
        self.scheduler.step()
        return total / max(seen, 1)

    def _augment(self, images: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per slice: rotate by k·90° and maybe flip, drawn from the checkpointed data-order generator."""
        turns = torch.randint(0, 4, (len(images),), generator=self.data_order).tolist()
        flips = torch.randint(0, 2, (len(images),), generator=self.data_order).tolist()
        out_images, out_target = [], []
        for image, label, turn, flip in zip(images, target, turns, flips):
            image, label = torch.rot90(image, turn, (-2, -1)), torch.rot90(label, turn, (-2, -1))
            if flip:
                image, label = image.flip(-1), label.flip(-1)
            out_images.append(image)
            out_target.append(label)
        return torch.stack(out_images), torch.stack(out_target)

    def _epoch_batches(self) -> list[torch.Tensor]:
        """Index batches of one epoch: one shuffled pass, or ``iterations_per_epoch`` batches drawn
        from consecutive shuffled passes (so a small dataset still gets enough steps per ALM update)."""
        count = len(self.train_slices)
        if self.config.iterations_per_epoch is None:
            return list(torch.randperm(count, generator=self.data_order).split(self.config.batch_size))
        needed = self.config.iterations_per_epoch * self.config.batch_size
        passes = [torch.randperm(count, generator=self.data_order) for _ in range(-(-needed // count))]
        return list(torch.cat(passes)[:needed].split(self.config.batch_size))

    @torch.no_grad()
    def _slice_logits(self, slices: SliceData):
        self.model.eval()
        for start in range(0, len(slices), self.config.batch_size):
            images = slices.images[start:start + self.config.batch_size].to(self.device)
            yield self.model(images).float(), slices.labels[start:start + self.config.batch_size].to(self.device)

    def update_constraints(self) -> dict[str, float]:
        """CRaC (any loss with ``constraint_statistics``): one ALM step from the validation slices."""
        if not hasattr(self.loss, "constraint_statistics"):
            return {}
        totals: dict[str, torch.Tensor] = {}
        for logits, target in self._slice_logits(self.val_slices):
            for key, value in self.loss.constraint_statistics(logits, target).items():
                totals[key] = totals.get(key, 0) + value
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
        """3D validation: mean foreground Dice and pooled ECE over the validation volumes."""
        predictor = Predictor(self._bundle(self.model.state_dict()), device=self.device, batch_size=self.config.batch_size)
        statistics = CalibrationStatistics(self.config.num_classes)
        scores = []
        for case in self.val_cases:
            reference = case.label.astype(np.int64)

            def stream(slices: slice, probabilities: np.ndarray) -> None:
                statistics.add(*masked_probabilities(probabilities, reference[slices]))

            prediction = predictor.predict(case.image, case.spacing, probability_sink=stream)
            scores.append(dice(prediction.labels, reference, self.config.num_classes).mean())
        return {"val/dice": float(np.mean(scores)), "val/ece": statistics.ece()}

    def fit(self) -> TrainResult:
        """Train until ``config.epochs``, checkpointing every epoch; returns the best model's bundle."""
        checkpoint = self.run_dir / CHECKPOINT_NAME
        while self.epoch < self.config.epochs:
            started = time.perf_counter()
            train_loss = self.train_epoch()
            scalars = {"train/loss": train_loss, "train/lr": self.optimizer.param_groups[0]["lr"]}
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
            history_file = self.run_dir / HISTORY_NAME
            history_file.with_suffix(".tmp").write_text("".join(json.dumps(row) + "\n" for row in self.history))
            history_file.with_suffix(".tmp").replace(history_file)
            self.epoch += 1
            save_checkpoint(checkpoint, self.state())
            self._print_epoch(scalars)
        return self.finish()

    def _print_epoch(self, scalars: dict[str, float]) -> None:
        parts = [f"epoch {self.epoch}/{self.config.epochs}", f"loss {scalars['train/loss']:.4f}"]
        if "val/dice" in scalars:
            parts += [f"val Dice {scalars['val/dice']:.3f}", f"val ECE {scalars['val/ece']:.3f}"]
        parts.append(f"{scalars['time/epoch_s']:.1f}s")
        print("  ".join(parts), flush=True)

    def fitted_temperature(self, state_dict: dict[str, torch.Tensor]) -> float:
        """Temperature minimising validation NLL of the given weights (a fixed voxel subsample)."""
        self.model.load_state_dict(state_dict)
        logits, labels = [], []
        for batch_logits, target in self._slice_logits(self.val_slices):
            logits.append(batch_logits.movedim(1, -1).reshape(-1, self.config.num_classes).cpu())
            labels.append(target.reshape(-1).cpu())
        logits, labels = torch.cat(logits), torch.cat(labels)
        if len(labels) > _TEMPERATURE_VOXELS:
            keep = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))[:_TEMPERATURE_VOXELS]
            logits, labels = logits[keep], labels[keep]
        return float(fit_temperature(logits, labels))

    def finish(self) -> TrainResult:
        best_state = self.best_state if self.best_state is not None else self.model.state_dict()
        temperature = self.fitted_temperature(best_state)
        validation = {key: value for key, value in self.history[self.best_epoch].items()} if self.best_epoch >= 0 else {}
        bundle = self._bundle(best_state, temperature, validation)
        path = save_bundle(self.run_dir / BUNDLE_NAME, bundle.state_dict, bundle.metadata)
        if self.writer is not None:
            self.writer.close()
        return TrainResult(path, self.best_epoch + 1, self.best_dice, self.history)
