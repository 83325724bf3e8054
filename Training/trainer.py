"""The training loop: random crops at the model's spacing, Adam with a poly or step schedule, validation on
whole validation slices through the predictor's own sliding window, the loss's epoch hook (CRaC's ALM
schedule), atomic checkpoints with exact resume; at the end the choices made on validation
(``Training/choices.py``) and the bundle and ``run.json`` (``Training/records.py``)."""

from __future__ import annotations

import copy
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from CalibSegLib.bundle import BundleMetadata, save_bundle
from CalibSegLib.device import environment, resolve_device
from CalibSegLib.inference import Predictor
from CalibSegLib.io import atomic_output, write_json_atomic
from CalibSegLib.losses import build_loss
from CalibSegLib.networks import build_network
from CalibSegLib.postprocessing import Postprocessing
from CalibSegLib.preprocessing import Preprocessing
from CalibSegLib.sliding_window import SlidingWindow, windows_per_pass
from Datasets.dataset_defaults import default_terminology
from Datasets.errors import DataError
from Datasets.loading import Case
from Datasets.model_grid import GridVolume, to_model_grid
from Training.batches import DEFAULT_AUGMENTATION, NO_AUGMENTATION, CropSampler, iterate_batches, plan_epoch
from Training.checkpoint import CheckpointError, capture_rng_state, load_checkpoint, restore_rng_state, save_checkpoint
from Training.choices import TEMPERATURE_FITS, foreground_ece, make_choices, validation_pass, volume_dice
from Training.config import TrainConfig
from Training.distributed import SINGLE_PROCESS, Processes
from Training.records import BUNDLE_NAME, CHECKPOINT_NAME, HISTORY_NAME, RUN_SUMMARY_NAME, EpochRecord, RunSummary
from Training.step_mode import StepChoice, build_optimizer, choose_step

__all__ = ["TrainResult", "EpochStatistics", "Trainer", "LR_SCHEDULES"]

LR_SCHEDULES: tuple[str, ...] = ("poly", "step")
# Steps between progress-bar updates of the loss (each update waits for the device to finish the step).
_PROGRESS_EVERY = 10
# Resuming with any of these changed would not continue the same run.
_RESUME_MUST_MATCH = ("method", "loss_args", "network", "network_kwargs", "spatial_dims", "target_spacing",
                      "patch_size", "channel_normalization", "batch_size", "lr", "lr_schedule", "lr_step_to",
                      "lr_step_epoch", "seed", "num_classes",
                      "iterations_per_epoch", "augment", "foreground_share", "foreground_sampling", "epochs",
                      "warmup_steps")
# What runs recorded before a key existed meant by it (a checkpoint without the key resumes as that).
_RESUME_DEFAULTS: dict[str, Any] = {"warmup_steps": 0, "foreground_sampling": "slice"}
# The first steps of a process in which a CUDA-graph capture error falls back to the step without graphs
# (torch.compile warms up, then records, within them).
_CAPTURE_STEPS = 3


@dataclass
class TrainResult:
    bundle_path: Path
    best_epoch: int
    best_validation_dice: float
    history: list[dict[str, Any]]


@dataclass
class EpochStatistics:
    """One epoch of training: mean ``loss`` per crop, ``slices_per_second`` and ``data_wait_share``
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
    else:  # every training batch has the same shape: cuDNN's fastest convolutions are worth timing once
        torch.backends.cudnn.benchmark = True


def _progress_enabled(requested: bool) -> bool:
    """Progress bars only on an interactive terminal: logs and CI get the per-epoch lines alone."""
    return requested and sys.stderr.isatty()


def _data_parallel(model: torch.nn.Module, processes: Processes, device: torch.device) -> torch.nn.Module:
    """``model`` in DDP when several processes train (gradients averaged over them in the backward pass)."""
    if not processes.is_distributed:
        return model
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)


def _compiled(model: torch.nn.Module, step: StepChoice) -> torch.nn.Module:
    """``model`` as ``step`` runs it: ``torch.compile``d (for CUDA graphs with ``mode="reduce-overhead"``) when
    asked and possible; the eager model otherwise (said once on stdout)."""
    if step.mode == "eager":
        return model
    try:
        import torch._inductor.cpp_builder  # noqa: F401  (fails early where inductor cannot work)

        return torch.compile(model, mode="reduce-overhead" if step.mode == "cuda_graphs" else None)
    except Exception as error:  # no C++ compiler, unsupported platform: train eagerly, just slower
        print(f"torch.compile unavailable ({type(error).__name__}); training without it.", flush=True)
        return model


def _cache_device(device: torch.device, volumes: list[GridVolume]) -> torch.device:
    """Where the training slices are cached: on the GPU when they take at most half its free memory
    (batches are then cut without the host), else in host memory."""
    if device.type != "cuda":
        return device
    free, _ = torch.cuda.mem_get_info(device)
    return device if CropSampler.stack_bytes(volumes) <= free // 2 else torch.device("cpu")


class Trainer:
    """Trains one network on crops of cached volumes and writes checkpoints, logs and the bundle into ``run_dir``.

    ``processes``: this process's place among torchrun's (:mod:`Training.distributed`); with several,
    each trains on its share of every batch, and only the main one validates and writes files.
    """

    def __init__(self, config: TrainConfig, train_cases: list[Case], val_cases: list[Case], run_dir: Path,
                 data_description: dict[str, Any], processes: Processes = SINGLE_PROCESS) -> None:
        if not train_cases or not val_cases:
            raise DataError("The split must give at least one training and one validation volume.")
        if config.batch_size % processes.world_size:
            raise DataError(f"--batch-size {config.batch_size} does not split evenly over {processes.world_size} "
                            f"processes; choose a multiple of {processes.world_size}.")
        if config.lr_schedule not in LR_SCHEDULES:
            raise DataError(f"Unknown learning-rate schedule {config.lr_schedule!r}; use {' or '.join(LR_SCHEDULES)}.")
        if config.temperature_fit not in TEMPERATURE_FITS:
            raise DataError(f"Unknown temperature fit {config.temperature_fit!r}; use {', '.join(TEMPERATURE_FITS)}.")
        self.config = config
        self.processes = processes
        self.run_dir = Path(run_dir)
        self.train_cases, self.val_cases = train_cases, val_cases
        self.data_description = data_description
        _seed_everything(config.seed, config.deterministic)
        self.device = processes.device(resolve_device(config.device))
        self.amp = self.device.type == "cuda" if config.amp is None else config.amp
        self.preprocessing = Preprocessing(target_spacing=tuple(config.target_spacing),
                                           channel_normalization=config.channel_normalization)
        patch_size = tuple(config.patch_size)
        self.sliding_window = SlidingWindow(patch_size=patch_size, batch_size=windows_per_pass(patch_size))
        try:
            self.preprocessing.validate()
            self.sliding_window.validate()
        except ValueError as error:
            raise DataError(str(error)) from None
        train_volumes = to_model_grid(train_cases, self.preprocessing, config.num_classes)
        self.val_volumes: list[GridVolume] = to_model_grid(val_cases, self.preprocessing, config.num_classes)
        unit_range = all(item.scheme == "percentile" for item in config.channel_normalization or [])
        self.sampler = CropSampler(train_volumes, config.num_classes, _cache_device(self.device, train_volumes),
                                   unit_range)
        self.model = build_network(config.network, config.in_channels, config.num_classes, config.spatial_dims,
                                   **config.network_kwargs).to(self.device)
        self.memory_format = ((torch.channels_last if config.spatial_dims == 2 else torch.channels_last_3d)
                              if config.channels_last else torch.contiguous_format)
        self.model.to(memory_format=self.memory_format)
        self.loss = build_loss(config.method, config.num_classes, **config.loss_args).to(self.device)
        self.step_choice = choose_step(self.device, config.compile, config.cuda_graphs,
                                       config.iterations_per_epoch is not None, self.loss.needs_model,
                                       processes.is_distributed)
        if self.step_choice.note and processes.is_main:
            print(self.step_choice.note, flush=True)
        self.parallel_model = _data_parallel(self.model, processes, self.device)
        self.training_model = _compiled(self.parallel_model, self.step_choice)
        self.graph_steps = 0  # steps this process ran with CUDA graphs (a capture error falls back in the first)
        self.optimizer = build_optimizer(self.model.parameters(), config.lr, self.device)
        self.steps_per_epoch = config.iterations_per_epoch or -(-len(self.sampler) // config.batch_size)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
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
        # their borders and scored 0.07 Dice lower on the cardiac validation patients (docs/training.md).
        self.validator = Predictor.from_network(self.model, self._metadata(), device=self.device,
                                                batch_size=config.batch_size)

    def _lr_factor(self, step: int) -> float:
        """Learning-rate multiplier after ``step`` optimiser steps (the scheduler steps once per batch): the
        schedule's, times a linear warm-up from 1/W to 1 over the first ``config.warmup_steps`` = W steps."""
        warmup = min(1.0, (step + 1) / self.config.warmup_steps) if self.config.warmup_steps else 1.0
        if self.config.lr_schedule == "poly":
            return warmup * max(1.0 - step / (self.config.epochs * self.steps_per_epoch), 0.0) ** 0.9
        milestone = self.config.lr_step_epoch * self.steps_per_epoch
        return warmup * (1.0 if step < milestone else self.config.lr_step_to / self.config.lr)

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
            "loss": self.loss.state_dict(),
            "best_dice": self.best_dice,
            "best_epoch": self.best_epoch,
            "best_state": self.best_state,
            "rng": capture_rng_state(self.data_order),
            "history": json.dumps(self.history),
            "config": json.dumps(asdict(self.config), default=str),
            "world_size": self.processes.world_size,
        }

    def _check_same_run(self, saved_config: str, checkpoint_path: Path) -> None:
        saved = json.loads(saved_config)
        current = json.loads(json.dumps(asdict(self.config), default=str))
        saved = {**_RESUME_DEFAULTS, **saved}
        changed = [key for key in _RESUME_MUST_MATCH if saved.get(key) != current.get(key)]
        if changed:
            key = changed[0]
            raise CheckpointError(
                f"{checkpoint_path} was trained with {key}={saved.get(key)!r} but this run asks for "
                f"{current.get(key)!r}; resume with the run's original flags or choose another --out."
            )

    def resume(self, checkpoint_path: Path) -> None:
        """Continue from ``checkpoint_path``; raises :class:`CheckpointError` if it is damaged, another run's,
        or trained by another number of processes (each trained on another share of the batches)."""
        state = load_checkpoint(checkpoint_path)
        self._check_same_run(state.get("config", "{}"), checkpoint_path)
        saved_world = int(state.get("world_size", 1))
        if saved_world != self.processes.world_size:
            raise CheckpointError(
                f"{checkpoint_path} was trained by {saved_world} process(es) but this run has "
                f"{self.processes.world_size}; resume it with torchrun --nproc_per_node {saved_world}"
                f"{' (or without torchrun)' if saved_world == 1 else ''}."
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
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
        # The loss's compute without its input checks: they read the device twice a step, and the batches
        # are valid by construction (labels checked when read; non-finite values caught once an epoch).
        # Only two-view losses (BWCR) get the model and the batch; the others take (logits, target).
        if self.loss.needs_model:
            return self.loss.compute(logits, target, model=self.training_model, images=images)
        return self.loss.compute(logits, target)

    def _forward_backward(self, images: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.step_choice.mode == "cuda_graphs":  # the previous step's graph outputs are no longer read
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            logits = self.training_model(images)
            value = self._loss_value(logits.float(), target, images)
        self.optimizer.zero_grad(set_to_none=True)
        value.backward()  # bfloat16 keeps float32's range: no loss scaling (which would read the device)
        return value.detach()

    def _leave_graphs(self, error: Exception) -> None:
        """Run the step without CUDA graphs from now on (said once): their capture failed with ``error``."""
        self.step_choice = StepChoice("compiled" if self.config.compile else "eager")
        print(f"CUDA graphs off: their capture failed ({type(error).__name__}: {str(error)[:200]}); the step "
              f"runs {self.step_choice.mode}.", flush=True)
        self.training_model = _compiled(self.parallel_model, self.step_choice)

    def train_step(self, images: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """One optimiser step on ``images (B, K, *patch)`` and ``target (B, *patch)`` int64 (on the device); returns
        the loss, a 0-d tensor on the device (reading it waits for the step: the loop sums them on the device).
        With CUDA graphs, an error in the first steps (the capture) repeats the step once without them."""
        images = images.contiguous(memory_format=self.memory_format)
        try:
            value = self._forward_backward(images, target)
        except Exception as error:  # capture errors have no common type; later ones are the step's own
            if self.step_choice.mode != "cuda_graphs" or self.graph_steps >= _CAPTURE_STEPS:
                raise
            self._leave_graphs(error)
            value = self._forward_backward(images, target)
        self.graph_steps += self.step_choice.mode == "cuda_graphs"
        self.optimizer.step()
        self.scheduler.step()
        return value

    def epoch_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of the next epoch (advances the data-order generator)."""
        augmentation = DEFAULT_AUGMENTATION if self.config.augment else NO_AUGMENTATION
        plans = plan_epoch(self.sampler, self.config.batch_size, self.config.iterations_per_epoch, self.data_order,
                           self.config.patch_size, augmentation, self.config.foreground_share,
                           self.config.foreground_sampling)
        shares = [plan.share(self.processes.rank, self.processes.world_size) for plan in plans]
        return iterate_batches(self.sampler, [share for share in shares if share is not None], self.config.patch_size,
                               self.device, self.config.workers)

    def train_epoch(self) -> EpochStatistics:
        """One epoch of optimiser steps (the learning rate follows its schedule step by step)."""
        from tqdm import tqdm

        self.model.train()
        total, seen, waited = torch.zeros((), device=self.device), 0, 0.0
        started = ready = time.perf_counter()
        shown = _progress_enabled(self.config.progress) and self.processes.is_main
        bar = tqdm(self.epoch_batches(), desc=f"epoch {self.epoch + 1}/{self.config.epochs}", unit="batch",
                   total=self.steps_per_epoch, leave=False, disable=not shown)
        for images, target in bar:
            waited += time.perf_counter() - ready
            total += self.train_step(images, target) * len(images)
            seen += len(images)
            self.steps += 1
            ready = time.perf_counter()
            if shown and self.steps % _PROGRESS_EVERY == 0:  # reading the loss waits for the device
                bar.set_postfix(loss=f"{float(total) / seen:.4f}", slices_s=f"{seen / (ready - started):.1f}",
                                data=f"{100 * waited / (ready - started):.0f}%")
        # Every process's crops: the epoch's mean loss over the whole batches, and the run's crops/s.
        counted = torch.stack([total.float(), torch.tensor(float(seen), device=self.device)])
        total, seen_everywhere = self.processes.sum(counted).tolist()
        if not math.isfinite(total):
            raise ValueError(f"The training loss became NaN or infinite in epoch {self.epoch + 1}; the last "
                             "checkpoint is kept: lower --lr, or train with --no-amp.")
        elapsed = max(time.perf_counter() - started, 1e-9)
        return EpochStatistics(total / max(seen_everywhere, 1), seen_everywhere / elapsed, waited / elapsed)

    def validate(self) -> dict[str, float]:
        """Mean 3D foreground Dice and pooled foreground ECE (T = 1) over the validation volumes, the loss's
        epoch hook fed with the same logits, and its scalars.

        With several processes the main one validates (and returns the scalars; the others return none)
        and hands the loss's statistics to every process, so that all update the loss alike.
        """
        scalars: dict[str, float] = {}
        totals: dict[str, torch.Tensor] = {}
        if self.processes.is_main:
            validation = validation_pass(self.validator, self.val_volumes, self.config.batch_size)
            if self.loss.uses_validation_statistics:
                for logits, labels in zip(validation.logits, validation.labels):
                    for key, value in self.loss.validation_statistics(logits.to(self.device),
                                                                      labels.to(self.device)).items():
                        totals[key] = totals[key] + value if key in totals else value
            scores = volume_dice(validation, Postprocessing(), self.config.num_classes)
            scalars = {"val/dice": float(np.nanmean(scores)), "val/ece": foreground_ece(validation, 1.0)}
        if self.loss.uses_validation_statistics:
            self.loss.end_epoch(self.processes.from_main(totals, self.device))
        if self.processes.is_main:
            scalars.update(self.loss.epoch_scalars(self.config.class_names))
        return scalars

    def fit(self) -> TrainResult | None:
        """Train until ``config.epochs``, checkpointing every epoch; returns the best model's bundle (None in a
        process other than the main one, which writes nothing)."""
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
                if scalars.get("val/dice", -math.inf) > self.best_dice:
                    self.best_dice, self.best_epoch = scalars["val/dice"], self.epoch
                    self.best_state = copy.deepcopy(self.model.state_dict())
            scalars["time/epoch_s"] = time.perf_counter() - started
            self.training_seconds += scalars["time/epoch_s"]
            if self.processes.is_main:
                self._log(scalars)
                self.history.append(EpochRecord(self.epoch + 1, self.steps, scalars,
                                                self.loss.state_summary()).to_json())
                # Rewritten whole from the checkpointed history, so a resumed run never repeats an epoch.
                with atomic_output(self.run_dir / HISTORY_NAME) as temporary:
                    temporary.write_text("".join(json.dumps(row) + "\n" for row in self.history))
            self.epoch += 1
            if self.processes.is_main:
                save_checkpoint(checkpoint, self.state())
                self._print_epoch(scalars)
        return self.finish() if self.processes.is_main else None

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
            "foreground_sampling": self.config.foreground_sampling,
            "augment": self.config.augment,
            "mirroring": self.config.mirroring,
            "optimizer": "adam",
            "lr": self.config.lr,
            "warmup_steps": self.config.warmup_steps,
            "step": self.step_choice.mode,
            "lr_schedule": self.config.lr_schedule,
            "lr_step_to": self.config.lr_step_to,
            "lr_step_epoch": self.config.lr_step_epoch,
            "seed": self.config.seed,
            "amp": self.amp,
            "loss_state": self.loss.state_summary(),
            "plan": self.config.plan,
        }
        values = dict(
            network=self.config.network,
            network_kwargs=self.config.network_kwargs,
            in_channels=self.config.in_channels,
            channel_names=self.config.channel_names,
            num_classes=self.config.num_classes,
            spatial_dims=self.config.spatial_dims,
            class_names=self.config.class_names,
            class_colors=self.config.class_colors,
            class_terminology=default_terminology(self.config.class_names),
            preprocessing=self.preprocessing,
            sliding_window=self.sliding_window,
            training=training,
            data=self.data_description,
        )
        values.update(fields_)
        return BundleMetadata(**values)

    def finish(self) -> TrainResult:
        """Make the end-of-run choices on validation for the best weights (``Training/choices.py``); write the
        bundle and ``run.json``."""
        started = time.perf_counter()
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)
        best = dict(self.history[self.best_epoch]) if self.best_epoch >= 0 else {}
        metadata, choices = make_choices(self.model, self._metadata(validation_metrics={"best_epoch": best}),
                                         self.val_volumes, self.val_cases, self.train_cases, self.device,
                                         self.config.batch_size, self.config.temperature_fit, self.config.seed,
                                         self.config.mirroring)
        path = save_bundle(self.run_dir / BUNDLE_NAME, self.model.state_dict(), metadata)
        if self.writer is not None:
            self.writer.close()
        summary = RunSummary(
            method=self.config.method, config=json.loads(json.dumps(asdict(self.config), default=str)),
            bundle=str(path), best_epoch=self.best_epoch + 1, best_validation_dice=self.best_dice,
            epochs=self.epoch, steps=self.steps, training_wall_s=self.training_seconds,
            finish_wall_s=time.perf_counter() - started, choices=choices, loss_state=self.loss.state_summary(),
            environment=environment(self.device), world_size=self.processes.world_size)
        write_json_atomic(self.run_dir / RUN_SUMMARY_NAME, summary.to_json())
        return TrainResult(path, self.best_epoch + 1, self.best_dice, self.history)
