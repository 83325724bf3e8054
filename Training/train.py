"""Train a segmentation network with a calibration-aware loss and write a model bundle.

    python Training/train.py                      # CRaC on the shipped ACDC sample, CPU-sized schedule
    python Training/train.py --paper --data ../shared/data/acdc --method nacl   # the papers' schedule

Without ``--paper`` the schedule is CPU-sized: a 4-level UNet (16–128 channels) on 128×128
slices for 40 epochs, and on the shipped sample 50 batches per epoch (about the papers'
steps per epoch on full ACDC, so CRaC's once-per-epoch multiplier update sees as much
training between updates). ``--paper``: the papers' 100 epochs at 224×224 with MONAI's
default 5-level UNet, Adam 1e-3 → 1e-4 at epoch 50, batch 16. Any flag overrides either.

Writes into ``--out`` (default: ``runs/<method>``, or the next free ``runs/<method>-N``):
``checkpoint.pt`` (every epoch, atomic), ``history.jsonl``, ``tensorboard/``,
``model.calibseg`` (the best validation-Dice model with its fitted temperature) and
``evaluation/`` (3D test metrics, see Training/evaluate.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from CalibSegLib.bundle import BundleError, load_bundle
from CalibSegLib.inference import resolve_device
from CalibSegLib.io import check_output_folder, os_error_sentence
from CalibSegLib.losses import LOSSES, build_loss
from CalibSegLib.networks import NETWORKS, NetworkOptionsError, build_network_on_meta
from Training.checkpoint import CheckpointError
from Training.data import DATASETS, Case, CaseFile, DataError, default_classes, find_cases, load_cases
from Training.evaluate import evaluate_bundle, print_summary
from Training.splits import default_split_for, load_split, select_patients
from Training.trainer import CHECKPOINT_NAME, TrainConfig, Trainer

__all__ = ["main", "run", "parse_config", "QUICK_NETWORK_KWARGS", "DEFAULT_DATA"]

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT / "SampleData" / "ACDC"
# The CPU-sized default: a 4-level UNet at 128×128 trains on the shipped sample in minutes.
QUICK_NETWORK_KWARGS: dict[str, Any] = {"channels": [16, 32, 64, 128], "strides": [2, 2, 2], "num_res_units": 1}
QUICK_EPOCHS = 40
QUICK_IMAGE_SIZE = 128
# About the papers' steps per epoch on ACDC (≈1,900 slices / batch 16), so CRaC's once-per-epoch
# multiplier update sees as much training between updates as in the paper.
QUICK_ITERATIONS_PER_EPOCH = 50
PAPER_EPOCHS = 100
PAPER_IMAGE_SIZE = 224


def _key_value(text: str) -> tuple[str, Any]:
    """``key=value`` with the value parsed as JSON when it is JSON (``3``, ``0.1``, ``[16,32]``), else a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python Training/train.py", description=__doc__.split("\n\n")[0])
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
    parser.add_argument("--num-classes", type=int, default=4, help="classes including background (ACDC: 4)")
    parser.add_argument("--paper", action="store_true",
                        help="the papers' schedule: 100 epochs, 224×224, lr 1e-3 → 1e-4 at epoch 50, default UNet")
    parser.add_argument("--epochs", type=int, default=None, help=f"default {QUICK_EPOCHS} ({PAPER_EPOCHS} with --paper)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lr-step-to", type=float, default=1e-4)
    parser.add_argument("--lr-step-epoch", type=int, default=None, help="default: half the epochs (50 with --paper)")
    parser.add_argument("--image-size", type=int, default=None,
                        help=f"in-plane size of training slices (default {QUICK_IMAGE_SIZE}, {PAPER_IMAGE_SIZE} with --paper)")
    parser.add_argument("--iterations-per-epoch", type=int, default=None,
                        help=f"batches per epoch (default: one pass over the slices; {QUICK_ITERATIONS_PER_EPOCH} "
                             "on the shipped sample without --paper)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--amp", action="store_true", help="mixed precision (float16 on CUDA, bfloat16 on CPU)")
    parser.add_argument("--workers", type=int, default=0, help="threads assembling batches ahead of the step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val-every", type=int, default=1, help="validate every N epochs (and after the last)")
    parser.add_argument("--deterministic", action="store_true", help="deterministic algorithms (exact resume)")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/<method>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    parser.add_argument("--no-augment", action="store_true", help="no random rotations/flips of training slices")
    parser.add_argument("--no-eval", action="store_true", help="skip the 3D test evaluation at the end")
    return parser


def _positive(name: str, value: int | float | None) -> None:
    if value is not None and value <= 0:
        raise DataError(f"{name} must be positive, got {value}.")


def parse_config(arguments: argparse.Namespace) -> TrainConfig:
    """The training configuration the flags ask for (quick CPU schedule unless ``--paper``)."""
    for name in ("epochs", "batch_size", "lr", "lr_step_to", "lr_step_epoch", "image_size", "iterations_per_epoch",
                 "val_every"):
        _positive("--" + name.replace("_", "-"), getattr(arguments, name))
    if arguments.num_classes < 2 or arguments.workers < 0:
        raise DataError("--num-classes must be at least 2 and --workers at least 0.")
    epochs = arguments.epochs or (PAPER_EPOCHS if arguments.paper else QUICK_EPOCHS)
    size = arguments.image_size or (PAPER_IMAGE_SIZE if arguments.paper else QUICK_IMAGE_SIZE)
    network_kwargs = {} if arguments.paper or arguments.network != "unet" else dict(QUICK_NETWORK_KWARGS)
    network_kwargs.update(dict(arguments.network_arg))
    on_sample = Path(arguments.data).resolve() == DEFAULT_DATA.resolve()
    iterations = arguments.iterations_per_epoch or (
        QUICK_ITERATIONS_PER_EPOCH if on_sample and not arguments.paper else None)
    return TrainConfig(
        method=arguments.method,
        loss_args=dict(arguments.loss_arg),
        network=arguments.network,
        network_kwargs=network_kwargs,
        epochs=epochs,
        batch_size=arguments.batch_size,
        lr=arguments.lr,
        lr_step_to=arguments.lr_step_to,
        lr_step_epoch=arguments.lr_step_epoch or max(epochs // 2, 1),
        image_size=(size, size),
        device=arguments.device,
        amp=arguments.amp,
        seed=arguments.seed,
        val_every=arguments.val_every,
        num_classes=arguments.num_classes,
        iterations_per_epoch=iterations,
        deterministic=arguments.deterministic,
        augment=not arguments.no_augment,
        workers=arguments.workers,
    )


def _run_dir(arguments: argparse.Namespace, method: str) -> Path:
    """``--out``, or the first of ``runs/<method>``, ``runs/<method>-2``, ... not holding a run."""
    if arguments.out is not None:
        return Path(arguments.out)
    if arguments.resume:
        raise CheckpointError("--resume needs --out with the folder of the run to continue.")
    base = REPO_ROOT / "runs" / method
    candidate, number = base, 1
    while (candidate / CHECKPOINT_NAME).exists():
        number += 1
        candidate = base.with_name(f"{method}-{number}")
    return candidate


def _load_split_cases(arguments: argparse.Namespace, num_classes: int
                      ) -> tuple[list[CaseFile], Path, dict[str, list[str]], dict[str, list[Case]]]:
    """Find, split and read every volume, so that bad data stops the run before any training."""
    files = find_cases(arguments.data, arguments.dataset)
    split_file = arguments.split or default_split_for(files)
    if split_file is None:
        raise DataError(
            f"No shipped split covers the cases in {arguments.data}; pass --split with a JSON file "
            '{"train": [...], "val": [...], "test": [...]} of patient/case ids.'
        )
    split = load_split(split_file)
    cases = {side: load_cases(select_patients(files, split[side]), num_classes) for side in ("train", "val", "test")}
    return files, Path(split_file), split, cases


def _check_model(config: TrainConfig) -> None:
    """Build the configured network (on torch's meta device: no memory) and loss, and resolve the
    device, so that a bad --network-arg, --loss-arg or --device stops the run before its folder exists."""
    try:
        build_network_on_meta(config.network, 1, config.num_classes, 2, **config.network_kwargs)
    except NetworkOptionsError as error:
        raise DataError(
            f"--network {config.network} cannot be built with --network-arg {config.network_kwargs} "
            f"({error.reason})."
        ) from None
    build_loss(config.method, config.num_classes, **config.loss_args)  # unknown hyper-parameter: KeyError
    resolve_device(config.device)


def run(arguments: argparse.Namespace, **overrides: Any) -> Path:
    """Train (or resume), evaluate, and return the bundle path; ``overrides`` set TrainConfig fields (tests).

    Everything that can be wrong with the flags, the output folder and the data is checked
    before the run folder is created, so a refused run leaves nothing behind.
    """
    config = parse_config(arguments)
    for key, value in overrides.items():
        setattr(config, key, value)
    _check_model(config)
    run_dir = check_output_folder(_run_dir(arguments, config.method))
    checkpoint = run_dir / CHECKPOINT_NAME
    if checkpoint.exists() and not arguments.resume:
        raise DataError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out.")
    if arguments.resume and not checkpoint.exists():
        raise CheckpointError(f"--resume was given but {checkpoint} does not exist.")
    files, split_file, split, cases = _load_split_cases(arguments, config.num_classes)
    dataset = "acdc" if files[0].kind == "acdc" else "folder"
    config.class_names, config.class_colors = default_classes(config.num_classes, dataset)
    data_description = {"dataset": dataset, "folder": str(Path(arguments.data).resolve()),
                        "split_file": str(split_file.resolve()), **split}
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(config, cases["train"], cases["val"], run_dir, data_description)
    if arguments.resume:
        trainer.resume(checkpoint)
        print(f"resumed {run_dir} after epoch {trainer.epoch}")
    print(f"{config.method}: {len(trainer.train_slices)} training slices, {len(cases['val'])} validation volumes, "
          f"{config.epochs} epochs at {config.image_size[0]}×{config.image_size[1]} on {trainer.device}; run folder {run_dir}",
          flush=True)
    result = trainer.fit()
    print(f"best validation Dice {result.best_validation_dice:.3f} at epoch {result.best_epoch}")
    print(f"bundle: {result.bundle_path}")
    if not arguments.no_eval and cases["test"]:
        evaluation_dir = run_dir / "evaluation"
        summary = evaluate_bundle(load_bundle(result.bundle_path), cases["test"], evaluation_dir,
                                  device=config.device, batch_size=config.batch_size)
        print_summary(summary, evaluation_dir)
    return result.bundle_path


def main(argv: Sequence[str] | None = None) -> Path:
    """Command line entry point; returns the bundle path. Bad input exits with one sentence, no traceback."""
    arguments = _parser().parse_args(argv)
    started = time.perf_counter()
    try:
        bundle_path = run(arguments)
    except (DataError, CheckpointError, BundleError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    except OSError as error:
        raise SystemExit(f"error: {os_error_sentence(error)}") from None
    except KeyError as error:  # unknown loss hyper-parameter: the registry's sentence is its argument
        raise SystemExit(f"error: {error.args[0]}") from None
    except KeyboardInterrupt:
        raise SystemExit("interrupted: the last completed epoch's checkpoint is kept; continue with --resume.") from None
    print(f"total time {time.perf_counter() - started:.0f} s")
    return bundle_path


if __name__ == "__main__":
    main()
