"""Training throughput (slices/s) and the share of step time spent waiting for data.

    python benchmarks/training_throughput.py [--steps 20] [--size 224]

Runs the real Trainer on the shipped ACDC sample (default UNet, batch 16) on CPU, and on
CUDA with and without AMP when a GPU is present. Data time is the batch assembly
(indexing the cached slices, augmentation, host→device copy); the rest is compute.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch

from Training.data import find_cases, load_cases
from Training.splits import SPLITS_DIR, load_split
from Training.trainer import TrainConfig, Trainer


def measure(trainer: Trainer, steps: int) -> tuple[float, float]:
    """Slices per second and the share of wall time spent waiting for the next batch, over ``steps`` steps.

    Uses the trainer's own batch iterator and step (with ``config.workers`` prefetch threads);
    the first two steps warm up allocators and kernels and are not counted.
    """
    batches = iter(trainer.epoch_batches())
    trainer.model.train()
    waiting = computing = 0.0
    for step in range(steps + 2):
        started = time.perf_counter()
        images, target = next(batches)
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        loaded = time.perf_counter()
        trainer.train_step(images, target)
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        if step >= 2:
            waiting += loaded - started
            computing += time.perf_counter() - loaded
    return steps * trainer.config.batch_size / (waiting + computing), waiting / (waiting + computing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--method", default="crac")
    parser.add_argument("--workers", type=int, default=0, help="batch prefetch threads (train.py --workers)")
    arguments = parser.parse_args()
    files = find_cases(ROOT / "SampleData" / "ACDC")
    split = load_split(SPLITS_DIR / "acdc_sample.json")
    train = load_cases([f for f in files if f.patient_id in split["train"]], 4)
    val = load_cases([f for f in files if f.patient_id in split["val"][:1]], 4)
    settings = [("cpu", False)] + ([("cuda", False), ("cuda", True)] if torch.cuda.is_available() else [])
    print(f"{arguments.method}, MONAI UNet (16-256), batch 16, {arguments.size}×{arguments.size}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU threads")
    print("| device | AMP | slices/s | data-wait share |")
    print("|---|---|---|---|")
    for device, amp in settings:
        config = TrainConfig(method=arguments.method, device=device, amp=amp, image_size=(arguments.size,) * 2,
                             progress=False, iterations_per_epoch=arguments.steps + 2, workers=arguments.workers)
        with tempfile.TemporaryDirectory() as run_dir:  # the trainer writes nothing before fit(), but owns a folder
            throughput, waiting = measure(Trainer(config, train, val, Path(run_dir), {}), arguments.steps)
        print(f"| {device} | {'yes' if amp else 'no'} | {throughput:.1f} | {100 * waiting:.1f} % |", flush=True)


if __name__ == "__main__":
    main()
