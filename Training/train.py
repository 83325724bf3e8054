"""Train a segmentation network with a calibration-aware loss and write a model bundle.

    calibseg-train                      # CRaC on the shipped ACDC sample, quick CPU schedule
    calibseg-train --cpu --data "$CALIBSEG_ACDC" --method ce_dice   # full ACDC on a CPU, ≤ 60 min
    calibseg-train --paper --data "$CALIBSEG_ACDC" --method nacl    # the papers' schedule (GPU)

Every schedule trains on random crops of slices resampled to the model's spacing (1.5 mm
in-plane by default: ACDC at its native resolution), a third of them centred on foreground,
with rotation, scaling, mirroring and intensity augmentation, and segments whole slices by
sliding window (:data:`SCHEDULES`). The default *quick* schedule and ``--cpu`` use MONAI's UNet
(16–256 channels, 2 residual units, instance norm) on 128×128 crops with Adam 1e-3 and poly
decay, ``torch.compile``d; ``--paper`` is the papers' 100 epochs of one pass each with Adam
1e-3 → 1e-4 at epoch 50, on 224×224 crops. Any flag overrides its schedule's value.

Several GPUs (or CPU processes) train one run data-parallel under torchrun
(:mod:`Training.distributed`): ``torchrun --standalone --nproc_per_node N -m Training.train ...``;
each process trains on ``--batch-size / N`` crops of every batch, the first one writes the files.

Writes into ``--out`` (default: ``runs/<method>`` under the current folder, or the next free
``runs/<method>-N``), and prints these paths when it starts:
``checkpoint.pt`` (every epoch, atomic), ``history.jsonl``, ``tensorboard/``,
``model.calibseg`` (the best validation-Dice weights with the mirroring, temperature and
post-processing chosen on validation), ``run.json`` (wall time, steps, the choices) and
``evaluation/`` (3D test metrics, see calibseg-evaluate). The bundle records the data by
dataset name (``acdc-sample``, ``acdc`` or the folder's name), the split file by its name when
it is a shipped one, and the patient lists, never a path of this machine
(:func:`Datasets.cases.data_folder` finds the data again).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from torch import nn

from CalibSegLib.bundle import BundleError, load_bundle
from CalibSegLib.device import resolve_device
from CalibSegLib.io import check_output_folder, os_error_sentence, write_json_atomic
from CalibSegLib.losses import LOSSES, build_loss
from CalibSegLib.networks import NETWORKS, NetworkOptionsError, build_network_on_meta, input_size_problem
from Datasets.cases import (ACDC_CLASS_NAMES, ACDC_DATASET, DATASETS, SAMPLE_DATA, SAMPLE_DATASET, Case, CaseFile, DataError,
                           DatasetDescription, dataset_name, default_classes, find_cases, ignored_images,
                           load_cases, read_dataset_description)
from Datasets.splits import (SIDES, SPLIT_FRACTIONS, SPLIT_NAME, default_split_for, load_split, make_split,
                             select_patients, split_json, split_reference)
from Datasets.splits.folds import FOLDS, FOLDS_NAME, default_folds_for, fold_split, folds_json, load_folds, make_folds
from Evaluation.crossval import CROSSVAL_DIR, read_out_of_fold, summary_lines, write_cross_validation
from Evaluation.evaluate import evaluate_bundle, print_summary
from Evaluation.quality_report import DEGRADATIONS
from Evaluation.summary import EVALUATION_DIR
from Training.checkpoint import CheckpointError
from Training.choices import MIRRORING, TEMPERATURE_FITS
from Training.plan import (IMAGE_SCHEMES, PATCH_MULTIPLE, Plan, channel_normalization, default_scheme,
                           largest_extent, make_plan)
from Training.distributed import Processes, start_processes, stop_processes
from Training.out_of_fold import complete_out_of_fold, evaluate_out_of_fold, out_of_fold_dir
from Training.records import BUNDLE_NAME, CHECKPOINT_NAME, HISTORY_NAME, RUN_SUMMARY_NAME
from Training.run_lock import run_folder_lock
from Training.trainer import LR_SCHEDULES, TrainConfig, Trainer, spacing_text

__all__ = ["main", "run", "run_cross_validation", "cross_validation_dir", "fold_folder", "parse_config", "Schedule",
           "SCHEDULES", "DEFAULT_DATA", "ALL_FOLDS"]

DEFAULT_DATA = SAMPLE_DATA
ALL_FOLDS = "all"
# The plan's patch is grown at most this many times (by PATCH_MULTIPLE along its smallest axis) to one the
# network segments: the default UNet halves a window four times and needs more than one voxel left at the
# bottom, and a 3D plan of thin volumes may start at 16 voxels a side.
_PATCH_GROWTH_STEPS = 8
# How the start of a run names each channel's scheme (CalibSegLib.preprocessing.CHANNEL_SCHEMES).
_SCHEME_TEXT = {"percentile": "per image [min, 99th percentile] → [0, 1]",
                "zscore": "per image z-score, not clipped",
                "ct": "training foreground's HU window, then its z-score"}


@dataclass(frozen=True)
class Schedule:
    """A named set of defaults for the training flags (each flag overrides its value)."""

    description: str
    epochs: int
    iterations_per_epoch: int | None  # None: one pass over the training slices per epoch
    patch_size: int
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
    # for the first 3 epochs (300 steps; full ACDC trains well with 250 steps per update).
    "quick": Schedule("quick CPU schedule for the shipped sample", epochs=10, iterations_per_epoch=100,
                      patch_size=128, lr_schedule="poly", lr_step_epoch=None, compile=True, val_every=1,
                      loss_args={"crac": {"warmup_epochs": 3}}),
    # Full ACDC on the 2-core CPU within an hour (docs/training.md has the measurements behind it).
    "cpu": Schedule("CPU schedule for full ACDC", epochs=36, iterations_per_epoch=250, patch_size=128,
                    lr_schedule="poly", lr_step_epoch=None, compile=True, val_every=2),
    "paper": Schedule("the papers' schedule", epochs=100, iterations_per_epoch=None, patch_size=224,
                      lr_schedule="step", lr_step_epoch=50, compile=False, val_every=1),
}


def _key_value(text: str) -> tuple[str, Any]:
    """``key=value`` with the value parsed as JSON when it is JSON (``3``, ``0.1``, ``[16,32]``), else a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _fold(text: str) -> int | str:
    """``--fold``'s value: a fold number 0 … FOLDS - 1, or ``all``."""
    if text == ALL_FOLDS:
        return text
    if text.isdigit() and int(text) < FOLDS:
        return int(text)
    raise argparse.ArgumentTypeError(f"expected a fold 0 to {FOLDS - 1} or '{ALL_FOLDS}', got {text!r}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calibseg-train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="crac", choices=LOSSES, help="loss (default crac)")
    parser.add_argument("--loss-arg", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                        help="loss hyper-parameter, repeatable (e.g. --loss-arg margin=5 --loss-arg kernel=3)")
    parser.add_argument("--network", default="unet", choices=NETWORKS)
    parser.add_argument("--network-arg", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                        help="network option, repeatable (e.g. --network-arg channels=[16,32,64,128,256])")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="ACDC .h5 folder, <case>_image/<case>_label folder, or imagesTr/labelsTr folder")
    parser.add_argument("--dataset", default="auto", choices=DATASETS, help="data layout (default: detected)")
    parser.add_argument("--split", type=Path, default=None, help="split JSON (default: the shipped one for --data)")
    parser.add_argument("--fold", type=_fold, default=None, metavar="K",
                        help=f"train fold K (0-{FOLDS - 1}) of a {FOLDS}-fold cross-validation into --out/fold_K "
                             "(default --out: runs/<method>-cv), validating on fold K's patients and training on the "
                             "other folds', the test patients in no fold; 'all': every fold in turn, then the "
                             "out-of-fold summary in --out/crossval (folds: Datasets/splits/acdc_cv.json for full "
                             "ACDC, else --out/folds.json, dealt once with --seed and reused)")
    parser.add_argument("--num-classes", type=int, default=None,
                        help="classes including background (default: as many as the data folder's dataset.json "
                             "names, else 4, ACDC's)")
    schedule = parser.add_mutually_exclusive_group()
    schedule.add_argument("--cpu", action="store_true",
                          help=f"{SCHEDULES['cpu'].description}: {SCHEDULES['cpu'].epochs} epochs of "
                               f"{SCHEDULES['cpu'].iterations_per_epoch} batches, 128×128 crops, poly lr, compiled")
    schedule.add_argument("--paper", action="store_true",
                          help="the papers' schedule: 100 epochs of one pass, 224×224 crops, lr 1e-3 → 1e-4 at epoch 50")
    parser.add_argument("--epochs", type=int, default=None, help="default: the schedule's")
    parser.add_argument("--iterations-per-epoch", type=int, default=None,
                        help="batches per epoch (default: the schedule's; --paper: one pass over the slices)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=None,
                        help="poly: lr·(1 − step/steps)^0.9; step: × lr-step-to/lr at --lr-step-epoch (default: the schedule's)")
    parser.add_argument("--lr-step-to", type=float, default=1e-4)
    parser.add_argument("--lr-step-epoch", type=int, default=None, help="for --lr-schedule step (default: half the epochs)")
    parser.add_argument("--spatial-dims", type=int, choices=(2, 3), default=2,
                        help="2: a slice-wise network on (y, x) crops (default); 3: a volumetric network on "
                             "(z, y, x) crops, segmenting whole volumes by 3D sliding window")
    parser.add_argument("--patch-size", type=int, nargs="+", default=None, metavar="N",
                        help="training crop = inference window, voxels at the target spacing: N or Y X "
                             "(default: the plan's, 128 or 224 with --paper where the median slice holds it); with "
                             "--spatial-dims 3: N or Z Y X (default: the plan's 3D patch)")
    parser.add_argument("--target-spacing", type=float, nargs="+", default=None, metavar="MM",
                        help="spacing the network works at, mm: S or Y X (default: the plan's, the training cases' "
                             "median; 1.5 for ACDC); with --spatial-dims 3: S or Z Y X")
    parser.add_argument("--normalization", choices=("auto", *IMAGE_SCHEMES), default="auto",
                        help="how each channel not named CT is scaled, per image: zscore (no clipping: a "
                             "lesion brighter than the 99th percentile stays apart), percentile ([min, 99th "
                             "percentile] to [0, 1]); auto: percentile for ACDC (the shipped models' "
                             "recipe), zscore for other data. A CT channel always gets the training "
                             "foreground's HU window")
    parser.add_argument("--foreground-share", type=float, default=1 / 3,
                        help="fraction of crops centred on a foreground voxel (default 1/3)")
    parser.add_argument("--mirroring", choices=MIRRORING, default="auto",
                        help="test-time mirroring: auto (used where it raises the validation Dice, default) or off "
                             "(never: the papers' protocol)")
    parser.add_argument("--temperature-fit", choices=TEMPERATURE_FITS, default="auto",
                        help="validation voxels the temperature is fitted on (none: T = 1); auto: all, foreground "
                             "or none, whichever gives the lowest validation foreground ECE")
    compile_group = parser.add_mutually_exclusive_group()
    compile_group.add_argument("--compile", dest="compile", action="store_true", default=None,
                               help="torch.compile the network for training (default on the quick and --cpu schedules)")
    compile_group.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    amp_group = parser.add_mutually_exclusive_group()
    amp_group.add_argument("--amp", dest="amp", action="store_true", default=None,
                           help="bfloat16 autocast (default on CUDA; on a CPU fast only with bf16 units)")
    amp_group.add_argument("--no-amp", dest="amp", action="store_false", help="float32 throughout")
    parser.add_argument("--workers", type=int, default=0, help="threads assembling batches ahead of the step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val-every", type=int, default=None,
                        help="validate every N epochs and after the last (default: the schedule's; CRaC: every epoch)")
    parser.add_argument("--deterministic", action="store_true", help="deterministic algorithms (exact resume)")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/<method>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    parser.add_argument("--no-augment", action="store_true", help="no spatial or intensity augmentation of crops")
    parser.add_argument("--no-eval", action="store_true", help="skip the 3D test evaluation at the end")
    parser.add_argument("--degraded", action="store_true",
                        help="the final evaluation also measures the quality check on degraded copies of the test "
                             "volumes (3 more predictions per volume)")
    return parser


def _positive(name: str, value: int | float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):  # NaN compares False with everything
        raise DataError(f"{name} must be positive and finite, got {value}.")


def _per_axis(name: str, values: list[float] | None, default: float, dims: int) -> tuple[float, ...]:
    """One value per spatial axis: ``values`` (one for every axis, or ``dims`` of them), else ``default``."""
    values = values or [default]
    if len(values) not in (1, dims):
        raise DataError(f"{name} takes one value or {dims} ({'z y x' if dims == 3 else 'y x'}) with --spatial-dims "
                        f"{dims}, got {len(values)}.")
    return tuple(values) * dims if len(values) == 1 else tuple(values)


def _schedule(arguments: argparse.Namespace) -> Schedule:
    return SCHEDULES["paper" if arguments.paper else "cpu" if arguments.cpu else "quick"]


def parse_config(arguments: argparse.Namespace, class_names: Sequence[str] | None = None) -> TrainConfig:
    """The training configuration the flags ask for (the quick schedule unless ``--cpu`` or ``--paper``);
    ``class_names``: those the data's ``dataset.json`` gives (background first), which set the number of
    classes unless ``--num-classes`` says it, and then must agree."""
    num_classes = arguments.num_classes or (len(class_names) if class_names else len(ACDC_CLASS_NAMES))
    if class_names and num_classes != len(class_names):
        raise DataError(f"--num-classes {num_classes} contradicts the data's dataset.json, which names "
                        f"{len(class_names)} classes ({', '.join(class_names)}); leave --num-classes out.")
    for name in ("epochs", "batch_size", "lr", "lr_step_to", "lr_step_epoch", "iterations_per_epoch", "val_every"):
        _positive("--" + name.replace("_", "-"), getattr(arguments, name))
    if num_classes < 2 or arguments.workers < 0:
        raise DataError("--num-classes must be at least 2 and --workers at least 0.")
    if not 0 <= arguments.foreground_share <= 1:
        raise DataError(f"--foreground-share must lie in [0, 1], got {arguments.foreground_share}.")
    schedule = _schedule(arguments)
    epochs = arguments.epochs or schedule.epochs
    dims = arguments.spatial_dims
    # Placeholders until the plan gives the data's own (apply_plan), where no flag gives them.
    patch = tuple(int(value) for value in _per_axis("--patch-size", arguments.patch_size, schedule.patch_size, dims))
    spacing = _per_axis("--target-spacing", arguments.target_spacing, 1.5, dims)
    for name, values in (("--patch-size", patch), ("--target-spacing", spacing)):
        if not all(math.isfinite(value) and value > 0 for value in values):
            raise DataError(f"{name} must be positive and finite, got {' '.join(map(str, values))}.")
    return TrainConfig(
        method=arguments.method,
        loss_args={**schedule.loss_args.get(arguments.method, {}), **dict(arguments.loss_arg)},
        network=arguments.network,
        network_kwargs=dict(arguments.network_arg),
        epochs=epochs,
        iterations_per_epoch=arguments.iterations_per_epoch or schedule.iterations_per_epoch,
        batch_size=arguments.batch_size,
        lr=arguments.lr,
        lr_schedule=arguments.lr_schedule or schedule.lr_schedule,
        lr_step_to=arguments.lr_step_to,
        lr_step_epoch=arguments.lr_step_epoch or schedule.lr_step_epoch or max(epochs // 2, 1),
        spatial_dims=dims,
        target_spacing=spacing,
        patch_size=patch,
        foreground_share=arguments.foreground_share,
        augment=not arguments.no_augment,
        compile=schedule.compile if arguments.compile is None else arguments.compile,
        temperature_fit=arguments.temperature_fit,
        mirroring=arguments.mirroring,
        device=arguments.device,
        amp=arguments.amp,
        seed=arguments.seed,
        val_every=arguments.val_every or schedule.val_every,
        num_classes=num_classes,
        deterministic=arguments.deterministic,
        workers=arguments.workers,
    )


def _run_dir(arguments: argparse.Namespace, method: str) -> Path:
    """``--out``, or the first of ``runs/<method>``, ``runs/<method>-2``, ... (under the current
    folder, never inside the installed package) not holding a run; with ``--fold K`` its ``fold_K`` folder (the
    cross-validation's folder default ``runs/<method>-cv``)."""
    if arguments.fold is not None:
        return cross_validation_dir(arguments) / fold_folder(arguments.fold)
    if arguments.out is not None:
        return Path(arguments.out)
    if arguments.resume:
        raise CheckpointError("--resume needs --out with the folder of the run to continue.")
    base = Path("runs") / method
    candidate, number = base, 1
    while (candidate / CHECKPOINT_NAME).exists():
        number += 1
        candidate = base.with_name(f"{method}-{number}")
    return candidate


def fold_folder(fold: int) -> str:
    """The folder of cross-validation fold ``fold`` inside the cross-validation's folder."""
    return f"fold_{fold}"


@dataclass(frozen=True)
class SplitChoice:
    """The split a run trains on, and where it came from: ``file`` (recorded in the bundle), and for a split or
    folds the run dealt itself, the JSON to write there once the run folder exists (``new``) and a sentence."""

    split: dict[str, list[str]]
    file: Path
    new: dict | None = None
    announcement: str = ""


def _choose_split(arguments: argparse.Namespace, files: Sequence[CaseFile], run_dir: Path, seed: int,
                  description: DatasetDescription | None, dataset: str) -> SplitChoice:
    """``--split``, else the shipped split of these patients, else the run folder's own ``split.json`` (a resumed
    run), else a new seeded one (:func:`Datasets.splits.make_split`, its test side the test list of the data's
    ``description``, its ``dataset.json``, when there is one). With ``--fold K``: fold K of the shipped folds of
    these patients, else of the cross-validation folder's ``folds.json``, else of new seeded folds
    (:func:`Datasets.splits.folds.make_folds`) whose test patients are the data's test list or its shipped split's
    test side."""
    patients = [file.patient_id for file in files]
    test = description.test_cases if description is not None else ()
    if arguments.fold is not None:
        if arguments.split is not None:
            raise DataError("--fold takes its split from the cross-validation folds; leave --split out, or train "
                            "without --fold.")
        folds_file = default_folds_for(patients) or run_dir.parent / FOLDS_NAME
        if folds_file.is_file():
            return SplitChoice(fold_split(load_folds(folds_file), arguments.fold), folds_file)
        shipped = default_split_for(files)
        test = test or (load_split(shipped)["test"] if shipped else ())
        folds = make_folds(patients, FOLDS, seed, test=test)
        return SplitChoice(fold_split(folds, arguments.fold), folds_file, folds_json(
            folds, seed, f"made by calibseg-train --fold: {FOLDS} folds of {dataset}'s patients outside its test "
                         f"list ({len(folds['test'])}), seed {seed}"),
            f"{FOLDS} seeded patient-level folds of {dataset} are written to {folds_file}; every fold of this "
            "cross-validation trains on them")
    split_file = arguments.split or default_split_for(files)
    if split_file is not None or (run_dir / SPLIT_NAME).is_file():
        split_file = split_file or run_dir / SPLIT_NAME
        return SplitChoice(load_split(split_file), Path(split_file))
    split = make_split(patients, seed, test=test)
    fractions = "/".join(f"{share:.0%}" for share in SPLIT_FRACTIONS)
    return SplitChoice(split, run_dir / SPLIT_NAME, split_json(
        split, f"made by calibseg-train: {fractions} of the patients of {dataset}, seed {seed}"),
        f"no shipped split covers {dataset}: a seeded patient-level split ({fractions}) is written to "
        f"{run_dir / SPLIT_NAME}; pass --split {run_dir / SPLIT_NAME} to repeat it")


def _load_split_cases(arguments: argparse.Namespace, num_classes: int, run_dir: Path, seed: int,
                      description: DatasetDescription | None,
                      ) -> tuple[list[CaseFile], SplitChoice, dict[str, list[Case]]]:
    """Find, split (:func:`_choose_split`) and read every volume, so that bad data stops the run before any
    training."""
    files = find_cases(arguments.data, arguments.dataset)
    choice = _choose_split(arguments, files, run_dir, seed, description, dataset_name(arguments.data, files))
    cases = {side: load_cases(select_patients(files, choice.split[side]), num_classes) for side in SIDES}
    return files, choice, cases


def channel_names(files: Sequence[CaseFile], description: DatasetDescription | None) -> list[str] | None:
    """The input channels' names for a bundle: the ``dataset.json``'s, ``channel k`` for several unnamed channels,
    None for one unnamed channel (the image)."""
    if description is not None and description.channel_names:
        return list(description.channel_names)
    count = len(files[0].channel_paths) if files else 1
    return [f"channel {index}" for index in range(count)] if count > 1 else None


def _describe_start(run_dir: Path, dataset: str, files: Sequence[CaseFile], split_file: Path,
                    split: dict[str, list[str]], cases: dict[str, list[Case]], ignored: Sequence[Path] = ()
                    ) -> list[str]:
    """What the run reads (and the images ``dataset.json``'s ``file_ending`` leaves out, ``ignored``) and
    where it writes, printed before the first epoch."""
    counts = ", ".join(f"{len(split[side])} {label}" for side, label in zip(SIDES, ("training", "validation", "test")))
    unused = len({file.patient_id for file in files} - {patient for side in SIDES for patient in split[side]})
    if unused:
        counts += f" ({unused} more patient(s) in the folder are in no side of the split and not used)"
    volumes = ", ".join(str(len(cases[side])) for side in SIDES)
    frames = " (ACDC has an end-diastole and an end-systole volume per patient)" \
        if dataset in (ACDC_DATASET, SAMPLE_DATASET) else ""
    more = f" and {len(ignored) - 5} more" if len(ignored) > 5 else ""
    names = ", ".join(path.name for path in ignored[:5]) + more
    leftover = [f"data: ignored, as dataset.json's file_ending says: {names}"] if ignored else []
    return [f"data: {dataset}, split {split_reference(split_file)}: {counts} patients = {volumes} volumes{frames}",
            *leftover,
            f"run folder {run_dir}: {CHECKPOINT_NAME} (every epoch; --resume continues it), {HISTORY_NAME} "
            f"(per-epoch losses and validation metrics), tensorboard/ (tensorboard --logdir {run_dir / 'tensorboard'}), "
            f"at the end {BUNDLE_NAME}, {RUN_SUMMARY_NAME} and {EVALUATION_DIR}/"]


def apply_plan(config: TrainConfig, plan: Plan, arguments: argparse.Namespace, dataset: str) -> None:
    """Take the plan's target spacing and patch (2D or 3D, as the network) where no flag gives them, and its channel
    normalisation (``--normalization``, by default :func:`Training.plan.default_scheme` of ``dataset``);
    print the plan and record it in ``config`` (run.json, the bundle)."""
    volumetric = config.spatial_dims == 3
    if arguments.target_spacing is None:
        config.target_spacing = plan.target_spacing if volumetric else plan.target_spacing[1:]
    if arguments.patch_size is None:
        config.patch_size = plan.patch_3d if volumetric else plan.patch_2d
    scheme = default_scheme(dataset) if arguments.normalization == "auto" else arguments.normalization
    config.channel_normalization = channel_normalization(plan.channels, scheme)
    config.plan = plan.to_json()
    print("\n".join(plan.lines()), flush=True)
    schemes = ([item.scheme for item in config.channel_normalization or []]
               or ["percentile"] * len(plan.channels))
    print("normalisation: " + "; ".join(f"{channel.name}: {_SCHEME_TEXT[item]}"
                                         for channel, item in zip(plan.channels, schemes)), flush=True)


def _check_model(config: TrainConfig, arguments: argparse.Namespace, train_cases: Sequence[Case]) -> None:
    """Build the configured network (on torch's meta device: no memory) and loss, check the patch against it
    and the training data (:func:`_check_patch`), and resolve the device, so that a bad --network-arg,
    --patch-size, --loss-arg or --device stops the run before its folder exists."""
    try:
        model = build_network_on_meta(config.network, config.in_channels, config.num_classes, config.spatial_dims,
                                      **config.network_kwargs)
    except NetworkOptionsError as error:
        raise DataError(
            f"--network {config.network} cannot be built with --network-arg {config.network_kwargs} "
            f"({error.reason})."
        ) from None
    largest = largest_extent(train_cases, config.target_spacing)
    _check_patch(model, config, arguments.patch_size is not None, largest)
    build_loss(config.method, config.num_classes, **config.loss_args)  # unknown hyper-parameter: KeyError
    resolve_device(config.device)


def _check_patch(model: nn.Module, config: TrainConfig, given: bool, largest: tuple[int, ...]) -> None:
    """The crop (also the inference window, so one check covers training and validation) must be one the
    network segments and not larger than every training item (``largest``: per axis, voxels at the target
    spacing).

    A patch the user ``given`` is refused in terms of --patch-size; the plan's is first grown, the smallest
    axis by :data:`~Training.plan.PATCH_MULTIPLE` at a time, to the smallest the network takes (printed), and
    where even that exceeds the data the refusal is in terms of the plan and the data, never of a flag not
    given."""
    size = "×".join(map(str, config.patch_size))
    items = "slice" if config.spatial_dims == 2 else "volume"
    extent = f"largest {'×'.join(map(str, largest))} voxels at {spacing_text(config.target_spacing)} mm"
    problem = input_size_problem(model, config.in_channels, config.patch_size, batch=config.batch_size)
    if given:
        if problem:
            raise DataError(f"--patch-size {' '.join(map(str, config.patch_size))} does not fit --network "
                            f"{config.network}: {problem}.")
        if all(patch > side for patch, side in zip(config.patch_size, largest)):
            raise DataError(f"--patch-size {' '.join(map(str, config.patch_size))} is larger than every "
                            f"training {items} ({extent}); choose a smaller --patch-size.")
        return
    patch, grown = list(config.patch_size), 0
    while input_size_problem(model, config.in_channels, patch, batch=config.batch_size) is not None:
        if grown == _PATCH_GROWTH_STEPS:
            raise DataError(f"--network {config.network} cannot segment the plan's {size}-voxel patch nor "
                            f"any within {_PATCH_GROWTH_STEPS} steps of {PATCH_MULTIPLE} voxels ({problem}); "
                            "choose a network with fewer down-sampling steps (--network-arg strides=...) or "
                            "give --patch-size.")
        patch[min(range(len(patch)), key=lambda axis: patch[axis])] += PATCH_MULTIPLE  # the smallest axis
        grown += 1
    if all(side > extent_side for side, extent_side in zip(patch, largest)):
        raise DataError(f"The training {items}s are too small for --network {config.network}: the smallest "
                        f"patch it segments from the plan's {size} is {'×'.join(map(str, patch))} voxels, "
                        f"larger than every training {items} ({extent}); choose a network with fewer "
                        "down-sampling steps (--network-arg strides=...) or a finer --target-spacing.")
    if tuple(patch) != tuple(config.patch_size):
        print(f"plan: patch {size} grown to {'×'.join(map(str, patch))} voxels, the smallest --network "
              f"{config.network} segments", flush=True)
        config.patch_size = tuple(patch)


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, outermost first: what making it creates."""
    missing = []
    while not folder.exists() and folder.parent != folder:
        missing.insert(0, folder)
        folder = folder.parent
    return missing


def _remove_new_entries(folder: Path, before: set[str]) -> None:
    """Remove what appeared in ``folder`` since its entries were ``before`` (a refused or interrupted fresh
    run's split file, TensorBoard folder, history)."""
    for name in set(os.listdir(folder)) - before:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def run(arguments: argparse.Namespace) -> Path | None:
    """Train (or resume), evaluate, and return the bundle path (None in torchrun's other processes).

    Everything that can be wrong with the flags, the output folder and the data is checked
    before the run folder is created, so a refused run leaves nothing behind; a fresh run that fails or is
    interrupted (Ctrl-C) before its first checkpoint removes what it made, folders included.
    """
    description = read_dataset_description(arguments.data)
    class_names = description.class_names if description is not None else None
    config = parse_config(arguments, class_names)
    run_dir = check_output_folder(_run_dir(arguments, config.method))
    checkpoint = run_dir / CHECKPOINT_NAME
    if checkpoint.exists() and not arguments.resume:
        raise DataError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out.")
    if arguments.resume and not checkpoint.exists():
        raise CheckpointError(f"--resume was given but {checkpoint} does not exist.")
    files, choice, cases = _load_split_cases(arguments, config.num_classes, run_dir, config.seed, description)
    config.channel_names = channel_names(files, description)
    plan = make_plan(cases["train"], config.channel_names or ["image"], _schedule(arguments).patch_size,
                     seed=config.seed)
    dataset = dataset_name(arguments.data, files)
    apply_plan(config, plan, arguments, dataset)
    _check_model(config, arguments, cases["train"])
    config.class_names, config.class_colors = default_classes(config.num_classes, dataset, class_names)
    # Names, not paths of this machine: readers find the data again with Datasets.cases.data_folder.
    data_description = {"dataset": dataset, "split_file": split_reference(choice.file), **choice.split}
    if arguments.fold is not None:
        data_description["fold"] = arguments.fold
    print("\n".join(_describe_start(run_dir, dataset, files, choice.file, choice.split, cases,
                                    ignored_images(arguments.data))), flush=True)
    made = _missing_folders(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    processes = Processes.from_environment()
    try:
        # The main process holds the run folder; under torchrun the others train beside it, writing nothing.
        with run_folder_lock(run_dir) if processes.is_main else contextlib.nullcontext():
            before = set(os.listdir(run_dir))
            try:
                if choice.new is not None and processes.is_main:  # the run can be repeated from it
                    write_json_atomic(choice.file, choice.new)
                    print(choice.announcement, flush=True)
                start_processes(processes, resolve_device(config.device))
                try:
                    return _train_and_evaluate(arguments, config, run_dir, cases, data_description, processes)
                finally:
                    stop_processes(processes)
            except BaseException:
                if processes.is_main and not arguments.resume and not checkpoint.exists():
                    # Nothing to resume from: the run leaves nothing, as a refused one does (the lock is held,
                    # so no other run is adding to the folder meanwhile).
                    if choice.new is not None:
                        choice.file.unlink(missing_ok=True)
                    _remove_new_entries(run_dir, before)
                raise
    except BaseException as error:
        for folder in reversed(made):  # the folders it made: empty unless it trained (rmdir keeps the others)
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(error, KeyboardInterrupt):
            raise KeyboardInterrupt(_interrupted_text(checkpoint, run_dir.exists())) from None
        raise


def cross_validation_dir(arguments: argparse.Namespace) -> Path:
    """The folder of the cross-validation ``--fold`` trains into: ``--out``, default ``runs/<method>-cv``."""
    return Path(arguments.out) if arguments.out is not None else Path("runs") / f"{arguments.method}-cv"


def run_cross_validation(arguments: argparse.Namespace) -> Path | None:
    """``--fold all``: every fold in turn (a finished one kept, an interrupted one resumed under ``--resume``), then
    the out-of-fold summary (:mod:`Evaluation.crossval`) in the cross-validation's ``crossval/``; returns that
    folder (None in torchrun's other processes).

    Raises:
        DataError: folds exist already and ``--resume`` was not given.
    """
    folder = cross_validation_dir(arguments)
    started = [fold for fold in range(FOLDS) if (folder / fold_folder(fold) / CHECKPOINT_NAME).exists()]
    if started and not arguments.resume:
        raise DataError(f"{folder} already holds fold(s) {', '.join(map(str, started))} of a cross-validation; pass "
                        "--resume to continue it, or choose another --out.")
    for fold in range(FOLDS):
        fold_dir = folder / fold_folder(fold)
        print(f"cross-validation fold {fold} of {FOLDS} ({fold_dir})", flush=True)
        if (fold_dir / RUN_SUMMARY_NAME).is_file():  # finished earlier: only its out-of-fold records may be missing
            complete_out_of_fold(fold_dir, arguments.data, arguments.device, arguments.batch_size)
            continue
        run(argparse.Namespace(**{**vars(arguments), "fold": fold, "out": folder,
                                  "resume": (fold_dir / CHECKPOINT_NAME).exists()}))
    if not Processes.from_environment().is_main:
        return None
    results = read_out_of_fold([out_of_fold_dir(folder / fold_folder(fold)) for fold in range(FOLDS)],
                               arguments.method)
    summary = write_cross_validation(results, folder / CROSSVAL_DIR)
    print("\n".join(summary_lines(summary)))
    print(f"out-of-fold summary: {folder / CROSSVAL_DIR}")
    return folder / CROSSVAL_DIR


def _interrupted_text(checkpoint: Path, folder_kept: bool) -> str:
    """What a Ctrl-C during training leaves: the last checkpoint to resume from, or nothing (``folder_kept``:
    the run folder existed before the run, or holds other files)."""
    if checkpoint.exists():
        return f"interrupted: the last completed epoch's checkpoint {checkpoint} is kept; continue with --resume."
    kept = "kept as it was" if folder_kept else "removed"
    return (f"interrupted before the first epoch ended: no checkpoint was written, and the run folder "
            f"{checkpoint.parent} is {kept}; start the run again.")


def _train_and_evaluate(arguments: argparse.Namespace, config: TrainConfig, run_dir: Path,
                        cases: dict[str, list[Case]], data_description: dict[str, Any], processes: Processes
                        ) -> Path | None:
    """Train (or resume) in this process, and in the main one evaluate; the bundle path (None elsewhere)."""
    checkpoint = run_dir / CHECKPOINT_NAME
    trainer = Trainer(config, cases["train"], cases["val"], run_dir, data_description, processes)
    if arguments.resume:
        trainer.resume(checkpoint)
        print(f"resumed {run_dir} after epoch {trainer.epoch}")
    loss_text = ", ".join(f"{key}={value}" for key, value in config.loss_args.items())
    method_text = f"{config.method} ({loss_text})" if loss_text else config.method
    items = "training slices" if config.spatial_dims == 2 else "training volumes"
    print(f"{method_text}: {len(trainer.sampler)} {items}, {len(cases['val'])} validation volumes, "
          f"{config.epochs} epochs of {trainer.steps_per_epoch} batches of {config.batch_size} "
          f"{'×'.join(map(str, config.patch_size))} crops at {spacing_text(config.target_spacing)} mm on {trainer.device}"
          + (f", {processes.world_size} processes of {config.batch_size // processes.world_size} crops each"
             if processes.is_distributed else ""), flush=True)
    result = trainer.fit()
    if result is None:  # not the main process: it wrote nothing and evaluates nothing
        return None
    print(f"best validation Dice {result.best_validation_dice:.3f} at epoch {result.best_epoch}")
    print(f"bundle: {result.bundle_path}")
    if arguments.fold is not None:
        out_of_fold = evaluate_out_of_fold(load_bundle(result.bundle_path), cases["val"], run_dir, config.device,
                                           config.batch_size)
        print_summary(out_of_fold.summary, out_of_fold_dir(run_dir), f"out of fold {arguments.fold}")
    if not arguments.no_eval and cases["test"]:
        evaluation_dir = run_dir / EVALUATION_DIR
        evaluation = evaluate_bundle(load_bundle(result.bundle_path), cases["test"], evaluation_dir,
                                     device=config.device, batch_size=config.batch_size,
                                     degradations=tuple(DEGRADATIONS) if arguments.degraded else ())
        print_summary(evaluation.summary, evaluation_dir)
    return result.bundle_path


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibseg-train`` command: prints the bundle's path; returns the exit status 0. Bad input
    exits with one sentence, no traceback."""
    arguments = _parser().parse_args(argv)
    started = time.perf_counter()
    try:
        with contextlib.ExitStack() as outputs:
            if not Processes.from_environment().is_main:  # under torchrun the main process speaks for the run
                outputs.enter_context(contextlib.redirect_stdout(outputs.enter_context(open(os.devnull, "w"))))
            run_cross_validation(arguments) if arguments.fold == ALL_FOLDS else run(arguments)
            print(f"total time {time.perf_counter() - started:.0f} s")
    except (DataError, CheckpointError, BundleError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    except OSError as error:
        raise SystemExit(f"error: {os_error_sentence(error)}") from None
    except KeyError as error:  # unknown loss hyper-parameter: the registry's sentence is its argument
        raise SystemExit(f"error: {error.args[0]}") from None
    except KeyboardInterrupt as interruption:  # run() says what was kept once the run folder exists
        raise SystemExit(str(interruption) or "interrupted before training started: nothing was written.") from None
    return 0


if __name__ == "__main__":
    main()
