"""calibseg-train's command line: every flag, its default and its help. A flag left open takes the chosen
schedule's value (:mod:`Training.schedules`) or the plan's (:mod:`Training.plan`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from CalibSegLib.losses import LOSSES
from CalibSegLib.networks import NETWORKS
from Datasets.dataset_defaults import DEFAULT_CLASS_COUNT
from Datasets.dataset_names import SAMPLE_DATA
from Datasets.layouts import DATASETS
from Datasets.splits.folds import FOLDS, SHIPPED_FOLDS
from Training.batches import DEFAULT_FOREGROUND_SAMPLING, FOREGROUND_SAMPLERS
from Training.choices import MIRRORING, TEMPERATURE_FITS
from Training.plan import IMAGE_SCHEMES
from Training.schedules import REFERENCE_BATCH, REFERENCE_LR, SCHEDULES, UnsetBatch
from Training.trainer import LR_SCHEDULES

__all__ = ["DEFAULT_DATA", "ALL_FOLDS", "parser"]

DEFAULT_DATA = SAMPLE_DATA
ALL_FOLDS = "all"


def _key_value(text: str) -> tuple[str, Any]:
    """``key=value`` with the value parsed as JSON when it is JSON (``3``, ``0.1``, ``[16,32]``), else a
    string."""
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


def _schedule_help(name: str) -> str:
    """A schedule flag's help, from the schedule itself."""
    schedule = SCHEDULES[name]
    steps = (f"{schedule.iterations_per_epoch} batches" if schedule.iterations_per_epoch else "one pass")
    size = (f"{schedule.epochs} epochs of {steps} {'of' if schedule.iterations_per_epoch else 'in batches of'} "
            f"{schedule.batch_size}" if schedule.batch_size else
            f"{schedule.crops:,} crops in epochs of {steps} of the batch that fills the GPU (256 for 128×128 crops: "
            f"{schedule.epochs} epochs), lr scaled to the batch after a warm-up")
    return (f"{schedule.description}: {size}, {schedule.patch_size}×"
            f"{schedule.patch_size} crops where the slices hold them, lr {schedule.lr_schedule}"
            + (f" at epoch {schedule.lr_step_epoch}" if schedule.lr_step_epoch else "")
            + (", compiled" if schedule.compile else ""))


def parser() -> argparse.ArgumentParser:
    """calibseg-train's flags."""
    flags = argparse.ArgumentParser(prog="calibseg-train", description="Train a segmentation network with a "
                                    "calibration-aware loss and write a model bundle.")
    # CE+Dice by default: after the temperature every bundle applies, it calibrated the cross-validated cardiac
    # patients better than CRaC and learnt the small structures CRaC dropped in the quick schedule (docs/decisions.md).
    flags.add_argument("--method", default="ce_dice", choices=LOSSES, help="loss (default ce_dice)")
    flags.add_argument("--loss-arg", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                       help="loss hyper-parameter, repeatable (e.g. --loss-arg margin=5 --loss-arg kernel=3)")
    flags.add_argument("--network", default="unet", choices=NETWORKS)
    flags.add_argument("--network-arg", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                       help="network option, repeatable (e.g. --network-arg channels=[16,32,64,128,256])")
    flags.add_argument("--data", type=Path, default=DEFAULT_DATA,
                       help="a folder of .h5 volumes (image, label), of <case>_image/<case>_label pairs, or "
                            "imagesTr/labelsTr (default: the shipped sample)")
    flags.add_argument("--dataset", default="auto", choices=DATASETS, help="data layout (default: detected)")
    flags.add_argument("--split", type=Path, default=None,
                       help="split JSON (default: the shipped one for --data)")
    flags.add_argument("--fold", type=_fold, default=None, metavar="K",
                       help=f"train fold K (0-{FOLDS - 1}) of a {FOLDS}-fold cross-validation into "
                            "--out/fold_K (default --out: runs/<method>-cv), validating on fold K's patients "
                            "and training on the other folds', the test patients in no fold; 'all': every "
                            "fold in turn, then the out-of-fold summary in --out/crossval (folds: "
                            f"{SHIPPED_FOLDS.name} for the data it covers, else --out/folds.json, dealt once "
                            "with --seed and reused)")
    flags.add_argument("--num-classes", type=int, default=None,
                       help="classes including background (default: as many as the data folder's "
                            f"dataset.json names, else {DEFAULT_CLASS_COUNT}, the shipped sample's)")
    schedule = flags.add_mutually_exclusive_group()
    schedule.add_argument("--cpu", action="store_true", help=_schedule_help("cpu"))
    schedule.add_argument("--paper", action="store_true", help=_schedule_help("paper"))
    schedule.add_argument("--gpu", action="store_true", help=_schedule_help("gpu") + " (needs CUDA)")
    flags.add_argument("--epochs", type=int, default=None, help="default: the schedule's")
    flags.add_argument("--iterations-per-epoch", type=int, default=None,
                       help="batches per epoch (default: the schedule's; --paper: one pass over the slices)")
    flags.add_argument("--batch-size", type=int, default=UnsetBatch(REFERENCE_BATCH),
                       help=f"crops per step (default {REFERENCE_BATCH}; --gpu: the batch that fills the GPU)")
    flags.add_argument("--lr", type=float, default=None,
                       help=f"Adam's learning rate (default {REFERENCE_LR:g}; --gpu: {REFERENCE_LR:g} × "
                            f"√(batch / {REFERENCE_BATCH}) after a linear warm-up)")
    flags.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=None,
                       help="poly: lr·(1 − step/steps)^0.9; step: × lr-step-to/lr at --lr-step-epoch "
                            "(default: the schedule's)")
    flags.add_argument("--lr-step-to", type=float, default=1e-4)
    flags.add_argument("--lr-step-epoch", type=int, default=None,
                       help="for --lr-schedule step (default: half the epochs)")
    flags.add_argument("--spatial-dims", type=int, choices=(2, 3), default=2,
                       help="2: a slice-wise network on (y, x) crops (default); 3: a volumetric network on "
                            "(z, y, x) crops, segmenting whole volumes by 3D sliding window")
    flags.add_argument("--patch-size", type=int, nargs="+", default=None, metavar="N",
                       help="training crop = inference window, voxels at the target spacing: N or Y X "
                            "(default: the plan's, the schedule's side where the median slice holds it); "
                            "with --spatial-dims 3: N or Z Y X (default: the plan's 3D patch)")
    flags.add_argument("--target-spacing", type=float, nargs="+", default=None, metavar="MM",
                       help="spacing the network works at, mm: S or Y X (default: the plan's, the training "
                            "cases' median); with --spatial-dims 3: S or Z Y X")
    flags.add_argument("--normalization", choices=("auto", *IMAGE_SCHEMES), default="auto",
                       help="how each channel not named CT is scaled, per image: zscore (no clipping: a "
                            "lesion brighter than the 99th percentile stays apart), percentile ([min, 99th "
                            "percentile] to [0, 1]); auto: the dataset's own (percentile for the shipped "
                            "models' data, zscore for other data). A CT channel always gets the training "
                            "foreground's HU window")
    flags.add_argument("--foreground-share", type=float, default=1 / 3,
                       help="fraction of crops centred on a foreground voxel (default 1/3)")
    flags.add_argument("--foreground-sampling", choices=tuple(FOREGROUND_SAMPLERS), default=DEFAULT_FOREGROUND_SAMPLING,
                       help="how those crops are centred: class (a class present in the volume, then a voxel of it, "
                            "as nnU-Net; default) or slice (a slice holding foreground, then a class in it)")
    flags.add_argument("--mirroring", choices=MIRRORING, default="auto",
                       help="test-time mirroring: auto (used where it raises the validation Dice, default) "
                            "or off (never: the papers' protocol)")
    flags.add_argument("--temperature-fit", choices=TEMPERATURE_FITS, default="auto",
                       help="validation voxels the temperature is fitted on (none: T = 1); auto: all, "
                            "foreground or none, whichever gives the lowest validation foreground ECE")
    compile_group = flags.add_mutually_exclusive_group()
    compile_group.add_argument("--compile", dest="compile", action="store_true", default=None,
                               help="torch.compile the network for training (default on the quick and --cpu "
                                    "schedules)")
    compile_group.add_argument("--no-compile", dest="compile", action="store_false")
    graphs_group = flags.add_mutually_exclusive_group()
    graphs_group.add_argument("--cuda-graphs", dest="cuda_graphs", action="store_true", default=None,
                              help="replay the compiled step as CUDA graphs (torch.compile mode "
                                   "reduce-overhead; default on CUDA where every batch has the same shape); "
                                   "where it cannot, the step runs without, and the log says why once")
    graphs_group.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false")
    flags.add_argument("--channels-last", action="store_true",
                       help="NHWC (NDHWC in 3D) memory format for the network and its crops")
    flags.add_argument("--device", default="auto", help="auto, cpu or cuda")
    amp_group = flags.add_mutually_exclusive_group()
    amp_group.add_argument("--amp", dest="amp", action="store_true", default=None,
                           help="bfloat16 autocast (default on CUDA; on a CPU fast only with bf16 units)")
    amp_group.add_argument("--no-amp", dest="amp", action="store_false", help="float32 throughout")
    flags.add_argument("--workers", type=int, default=0, help="threads assembling batches ahead of the step")
    flags.add_argument("--seed", type=int, default=0)
    flags.add_argument("--val-every", type=int, default=None,
                       help="validate every N epochs and after the last (default: the schedule's; CRaC: "
                            "every epoch)")
    flags.add_argument("--deterministic", action="store_true", help="deterministic algorithms (exact resume)")
    flags.add_argument("--out", type=Path, default=None, help="run folder (default runs/<method>)")
    flags.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    flags.add_argument("--plan-only", action="store_true",
                       help="plan from the training cases and write the run folder's plan.json, nothing else")
    flags.add_argument("--no-augment", action="store_true",
                       help="no spatial or intensity augmentation of crops")
    flags.add_argument("--no-eval", action="store_true", help="skip the 3D test evaluation at the end")
    flags.add_argument("--degraded", action="store_true",
                       help="the final evaluation also measures the quality check on degraded copies of the "
                            "test volumes (3 more predictions per volume)")
    return flags
