"""Train a segmentation network with a calibration-aware loss and write a model bundle.

    python Training/train.py                      # CRaC on the shipped ACDC sample, CPU-sized schedule
    python Training/train.py --paper --data ../shared/data/acdc --method nacl   # the papers' schedule

Writes into ``--out`` (default ``runs/<method>``): ``checkpoint.pt`` (every epoch, atomic),
``history.jsonl``, ``tensorboard/``, ``model.calibseg`` (the best validation-Dice model with
its fitted temperature) and ``evaluation/`` (3D test metrics, see Training/evaluate.py).
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

from CalibSegLib.bundle import load_bundle
from CalibSegLib.losses import LOSSES
from CalibSegLib.networks import NETWORKS
from Training.checkpoint import CheckpointError
from Training.data import DataError, find_cases, load_cases
from Training.evaluate import evaluate_bundle
from Training.splits import default_split_for, load_split, select_patients
from Training.trainer import CHECKPOINT_NAME, TrainConfig, Trainer

__all__ = ["main", "parse_config", "QUICK_NETWORK_KWARGS"]

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT / "SampleData" / "ACDC"
# The CPU-sized default: a 4-level UNet at 128×128 trains on the shipped sample in minutes.
QUICK_NETWORK_KWARGS: dict[str, Any] = {"channels": [16, 32, 64, 128], "strides": [2, 2, 2], "num_res_units": 1}
QUICK_EPOCHS = 40
QUICK_IMAGE_SIZE = 128
# About the papers' steps per epoch on ACDC (≈1,900 slices / batch 16), so CRaC's once-per-epoch
# multiplier update sees as much training between updates as in the paper.
QUICK_ITERATIONS_PER_EPOCH = 50


def _key_value(text: str) -> tuple[str, Any]:
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
                        help="loss hyper-parameter, repeatable (e.g. --loss-arg weight=0.3)")
    parser.add_argument("--network", default="unet", choices=NETWORKS)
    parser.add_argument("--network-arg", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                        help="network option, repeatable (e.g. --network-arg channels=[16,32,64,128,256])")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="ACDC .h5 folder or image/label folder")
    parser.add_argument("--split", type=Path, default=None, help="split JSON (default: the shipped one for --data)")
    parser.add_argument("--paper", action="store_true",
                        help="the papers' schedule: 100 epochs, 224×224, lr 1e-3 → 1e-4 at epoch 50, default UNet")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lr-step-to", type=float, default=1e-4)
    parser.add_argument("--lr-step-epoch", type=int, default=None, help="default: half the epochs")
    parser.add_argument("--image-size", type=int, default=None, help="in-plane size of training slices")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--amp", action="store_true", help="mixed precision (CUDA)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val-every", type=int, default=1)
    parser.add_argument("--iterations-per-epoch", type=int, default=None,
                        help="batches per epoch (default: one pass over the slices; 25 in the quick default)")
    parser.add_argument("--deterministic", action="store_true", help="deterministic algorithms (exact resume)")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/<method>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    parser.add_argument("--no-augment", action="store_true", help="no random rotations/flips of training slices")
    parser.add_argument("--no-eval", action="store_true", help="skip the 3D test evaluation at the end")
    return parser


def parse_config(arguments: argparse.Namespace) -> TrainConfig:
    epochs = arguments.epochs or (100 if arguments.paper else QUICK_EPOCHS)
    size = arguments.image_size or (224 if arguments.paper else QUICK_IMAGE_SIZE)
    network_kwargs = {} if arguments.paper or arguments.network != "unet" else dict(QUICK_NETWORK_KWARGS)
    network_kwargs.update(dict(arguments.network_arg))
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
        iterations_per_epoch=arguments.iterations_per_epoch or (
            None if arguments.paper or arguments.epochs or arguments.data != DEFAULT_DATA else QUICK_ITERATIONS_PER_EPOCH),
        deterministic=arguments.deterministic,
        augment=not arguments.no_augment,
    )


def run(arguments: argparse.Namespace, **overrides: Any) -> Path:
    """Train (or resume), evaluate, and return the bundle path."""
    config = parse_config(arguments)
    for key, value in overrides.items():
        setattr(config, key, value)
    run_dir = arguments.out or REPO_ROOT / "runs" / config.method
    checkpoint = run_dir / CHECKPOINT_NAME
    if checkpoint.exists() and not arguments.resume:
        raise DataError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out.")
    if arguments.resume and not checkpoint.exists():
        raise CheckpointError(f"--resume was given but {checkpoint} does not exist.")
    files = find_cases(arguments.data)
    split_file = arguments.split or default_split_for(files)
    if split_file is None:
        raise DataError(f"No shipped split covers the patients in {arguments.data}; pass --split with a JSON split file.")
    split = load_split(split_file)
    train_cases = load_cases(select_patients(files, split["train"]), config.num_classes)
    val_cases = load_cases(select_patients(files, split["val"]), config.num_classes)
    data_description = {"dataset": "acdc" if files[0].kind == "acdc" else "folder",
                        "folder": str(Path(arguments.data).resolve()), "split_file": str(Path(split_file).resolve()),
                        **split}
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(config, train_cases, val_cases, run_dir, data_description)
    if arguments.resume:
        trainer.resume(checkpoint)
        print(f"resumed {run_dir} at epoch {trainer.epoch}")
    print(f"{config.method}: {len(trainer.train_slices)} training slices, {len(val_cases)} validation volumes, "
          f"{config.epochs} epochs at {config.image_size[0]}×{config.image_size[1]} on {trainer.device}", flush=True)
    result = trainer.fit()
    print(f"best validation Dice {result.best_validation_dice:.3f} at epoch {result.best_epoch}")
    print(f"bundle: {result.bundle_path}")
    if not arguments.no_eval:
        test_cases = load_cases(select_patients(files, split["test"]), config.num_classes)
        summary = evaluate_bundle(load_bundle(result.bundle_path), test_cases, run_dir / "evaluation",
                                  device=config.device, batch_size=config.batch_size)
        scaled = summary["scaled"]["per_metric"]
        print(f"test ({len(test_cases)} volumes, T={summary['temperature']:.2f}): Dice {scaled['dice_mean']['mean']:.3f}  "
              f"HD95 {scaled['hd95_mean']['mean']:.2f} mm  ECE {scaled['ece']['mean']:.3f}  "
              f"CECE {scaled['cece']['mean']:.3f}  TACE {scaled['tace']['mean']:.3f}")
        print(f"metrics: {run_dir / 'evaluation' / 'summary.json'}")
        print(f"reliability diagram: {run_dir / 'evaluation' / 'reliability.png'}")
    return result.bundle_path


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    started = time.perf_counter()
    try:
        run(arguments)
    except (DataError, CheckpointError, ValueError, KeyError) as error:
        print(f"error: {error.args[0] if error.args else error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the last completed epoch's checkpoint is kept; continue with --resume.", file=sys.stderr)
        return 130
    print(f"total time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
