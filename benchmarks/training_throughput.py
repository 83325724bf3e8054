"""Training throughput (crops/s) of the trainer's own step under the CPU/GPU options, as ratios to fp32.

    python -m benchmarks.training_throughput [--steps 30] [--method ce_dice] [--settings fp32,compile,...]
        [--batch-sizes 16,64,256] [--dice] [--record docs/records/benchmark_training_throughput.json]

    # On a GPU machine: every CPU and GPU setting, ratios to the same machine's CPU cores, and the
    # validation Dice of the CPU and the GPU path after the quick schedule's steps
    python -m benchmarks.training_throughput --steps 50
        --settings fp32,compile,cuda,cuda_fp32,cuda_compile,cuda_channels_last --dice
        --record docs/records/benchmark_training_throughput_gpu.json
    # The GPU step at the batches that fill it, with the GPU's busy share (scripts/gpu_check.sh)
    python -m benchmarks.training_throughput --steps 40 --settings fp32,cuda,cuda_eager
        --batch-sizes 16,64,256 --record docs/records/benchmark_training_throughput_gpu.json

Runs the real :class:`Training.trainer.Trainer` (its crop sampler, augmentation and step) on
the shipped ACDC sample, each setting in a fresh process (thread count, ``torch.compile``
caches and peak memory belong to that setting alone); the first steps warm up — for
``torch.compile`` they include the compilation, reported apart — and are not counted.
Settings (the reference is ``fp32``: eager float32 on all CPU threads, MONAI UNet 16–256,
2 residual units, batch 16 of 128×128 crops):

- ``compile``: ``torch.compile`` of the network (the quick and ``--cpu`` schedules use it);
- ``bf16``: bfloat16 autocast (``--amp`` on a CPU; fast only where the CPU has bf16 units);
- ``channels_last``: NHWC memory format for the network and its inputs;
- ``threads1``: one intra-op thread (two such runs share a 2-core machine without contention);
- ``patch160``: 160×160 crops instead of 128×128 (ratio in crops/s; a crop holds 1.56× the voxels);
- ``dynunet``: MONAI DynUNet 16–256 (instance norm, full-resolution first level) instead of UNet;
- ``ddp2``: two gloo processes under torchrun, each with half the threads and half of every batch
  (crops/s of the whole batches);
- ``cuda``: on a GPU, as training runs there by default (bf16 autocast, slices cached on the GPU,
  one batched ``grid_sample`` per batch, fused Adam, the compiled step replayed as CUDA graphs, no host
  synchronisation in the step); ``cuda_eager``: the same without compilation or graphs; ``cuda_fp32``:
  without bf16; ``cuda_compile``: compiled without graphs; ``cuda_channels_last``: with graphs and NHWC;
  ``cuda_ddp``: every GPU of the machine under torchrun (NCCL), with two or more.

``--batch-sizes`` measures every setting at each batch (default 16, the CPU schedules'). On CUDA each
measurement also profiles 10 more steps with ``torch.profiler`` and records the GPU's busy share: the
kernels' time over the wall time of those steps (None where the profiler cannot trace the device). A record
with CUDA settings is the GPU record (``docs/records/benchmark_training_throughput_gpu.json``); no other
machine writes that file.

``--dice`` also trains the quick schedule's steps (``--dice-epochs`` × 100 batches) with ``--method``
on the CPU and on the GPU and records the last validation Dice of each (their difference is the
GPU path's cost in accuracy).

``--record`` writes the numbers as a JSON record (:mod:`benchmarks.record`); docs/performance.md's table
is made from it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.record import caption, make_record, publish, write_record
from Training.schedules import SCHEDULES

ROOT = Path(__file__).resolve().parents[1]

SETTINGS: dict[str, dict] = {
    "fp32": {},
    "compile": {"compile": True},
    "bf16": {"amp": True},
    "channels_last": {"channels_last": True},
    "threads1": {"threads": 1},
    "patch160": {"patch_size": (160, 160)},
    "dynunet": {"network": "dynunet"},
    "ddp2": {"processes": 2},
    "cuda": {"device": "cuda"},
    "cuda_eager": {"device": "cuda", "cuda_graphs": False},
    "cuda_fp32": {"device": "cuda", "amp": False},
    "cuda_compile": {"device": "cuda", "compile": True, "cuda_graphs": False},
    "cuda_channels_last": {"device": "cuda", "channels_last": True},
    "cuda_ddp": {"device": "cuda", "processes": "gpus"},
}
WARMUP_STEPS = 3
# Steps profiled after the timed ones for the GPU's busy share.
PROFILED_STEPS = 10
GPU_RECORD = ROOT / "docs" / "records" / "benchmark_training_throughput_gpu.json"
# The quick schedule's batches per epoch, for --dice.
_DICE_ITERATIONS = SCHEDULES["quick"].iterations_per_epoch


def _process_count(setting: str) -> int:
    """Processes a setting trains with (torchrun's ``--nproc_per_node``; 1 without torchrun)."""
    count = SETTINGS[setting].get("processes", 1)
    return torch.cuda.device_count() if count == "gpus" else int(count)


def available(setting: str) -> bool:
    """Whether this machine can measure ``setting`` (a GPU for the cuda ones, two for ``cuda_ddp``)."""
    if setting.startswith("cuda"):
        return torch.cuda.is_available() and (setting != "cuda_ddp" or torch.cuda.device_count() > 1)
    return True


def measure(setting: str, steps: int, method: str, batch_size: int = 16) -> dict:
    """Crops/s (of the whole batches) and data-wait share of ``steps`` training steps of ``batch_size`` crops
    under ``setting``, in this process (one of torchrun's for the distributed settings: None in all but the
    main one), and on CUDA the GPU's busy share (:func:`gpu_busy_share`).

    The device is waited for only after the warm-up and after the last step, as the training loop does."""
    from dataclasses import replace

    from Datasets.dataset_names import SAMPLE_DATASET
    from Datasets.layouts import find_cases
    from Datasets.loading import load_cases
    from Datasets.splits import SPLITS_DIR, load_split
    from Training.command_line import parser
    from Training.config import train_config
    from Training.distributed import Processes, start_processes, stop_processes
    from Training.plan import make_plan
    from Training.trainer import Trainer

    options = dict(SETTINGS[setting])
    if "threads" in options:
        torch.set_num_threads(options.pop("threads"))
    options.pop("processes", None)
    processes = Processes.from_environment()
    start_processes(processes, torch.device(options.get("device", "cpu")))
    files = find_cases(ROOT / "SampleData" / "ACDC")
    split = load_split(SPLITS_DIR / "acdc_sample.json")
    train = load_cases([f for f in files if f.patient_id in split["train"]], 4)
    val = load_cases([f for f in files if f.patient_id in split["val"][:1]], 4)
    # calibseg-train's configuration of the quick schedule (eager: "compile" is a setting), then the setting
    arguments = parser().parse_args(["--method", method, "--no-compile", "--patch-size", "128",
                                     "--batch-size", str(batch_size),
                                     "--iterations-per-epoch", str(steps + WARMUP_STEPS + PROFILED_STEPS)])
    plan = make_plan(train, SAMPLE_DATASET, arguments, SCHEDULES["quick"].patch_size, None, None)
    config = replace(train_config(plan, SCHEDULES["quick"], arguments), progress=False, **options)
    with tempfile.TemporaryDirectory() as run_dir:  # the trainer writes nothing before fit()
        trainer = Trainer(config, train, val, Path(run_dir), {}, processes)
        batches = iter(trainer.epoch_batches())
        trainer.model.train()
        waiting, started = 0.0, time.perf_counter()
        for step in range(steps + WARMUP_STEPS):
            if step == WARMUP_STEPS:
                _wait_for(trainer.device)
                timed = time.perf_counter()
                warmup = timed - started
            fetching = time.perf_counter()
            images, target = next(batches)
            if step >= WARMUP_STEPS:
                waiting += time.perf_counter() - fetching
            trainer.train_step(images, target)
        _wait_for(trainer.device)
        total = time.perf_counter() - timed
        busy = gpu_busy_share(trainer, batches) if trainer.device.type == "cuda" else None
    stop_processes(processes)
    if not processes.is_main:
        return None
    return {"setting": setting, "batch": config.batch_size, "crops_per_s": steps * config.batch_size / total,
            "data_wait": waiting / total, "warmup_s": warmup, "threads": torch.get_num_threads(),
            "processes": processes.world_size, "gpu_busy": busy, "step": trainer.step_choice.mode}


def gpu_busy_share(trainer, batches) -> float | None:
    """The share of the wall time of :data:`PROFILED_STEPS` more steps in which the GPU runs kernels (their
    summed device time over the steps' wall time, from ``torch.profiler``), in [0, 1]; None where the
    profiler cannot trace the device."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            started = time.perf_counter()
            for _ in range(PROFILED_STEPS):
                trainer.train_step(*next(batches))
            _wait_for(trainer.device)
            wall = time.perf_counter() - started
        kernel_us = sum(getattr(event, "self_device_time_total", 0) for event in profiler.key_averages())
    except RuntimeError as error:  # no CUPTI on this machine: the speed stands without it
        print(f"gpu busy share not measured: {error}", file=sys.stderr)
        return None
    return min(kernel_us / 1e6 / wall, 1.0)


def _wait_for(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure_in_fresh_process(setting: str, steps: int, method: str, batch_size: int) -> dict:
    """:func:`measure` in a new process (under torchrun with the setting's process count)."""
    count = _process_count(setting)
    command = [sys.executable, "-m", "benchmarks.training_throughput", "--one", setting, "--steps", str(steps),
               "--method", method, "--batch-sizes", str(batch_size)]
    environment = dict(os.environ)
    if count > 1:
        command[1:3] = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(count), "-m",
                        "benchmarks.training_throughput"]
        # The machine's threads shared among the processes (torchrun would give each one).
        environment["OMP_NUM_THREADS"] = str(max(1, torch.get_num_threads() // count))
    output = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=environment)
    if output.returncode != 0:
        raise SystemExit(f"error: setting {setting} failed: {output.stderr.strip().splitlines()[-1:]}")
    return json.loads(output.stdout.strip().splitlines()[-1])


def validation_dice(device: str, method: str, epochs: int) -> float:
    """The last validation Dice of ``epochs`` × 100 batches of the quick schedule on ``device``."""
    from Training.records import read_history

    with tempfile.TemporaryDirectory() as run_dir:
        # The run's end (temperature, quality model, bundle) is not what is compared: only the epochs' Dice.
        subprocess.run([sys.executable, "-m", "Training.train", "--device", device, "--method", method,
                        "--epochs", str(epochs), "--iterations-per-epoch", str(_DICE_ITERATIONS), "--no-eval",
                        "--out", str(Path(run_dir) / "run")], cwd=ROOT, capture_output=True, text=True)
        scores = [record.scalars["val/dice"] for record in read_history(Path(run_dir) / "run")
                  if "val/dice" in record.scalars]
    if len(scores) < epochs:
        raise SystemExit(f"error: the {device} run for --dice stopped after {len(scores)} of {epochs} epochs.")
    return scores[-1]


def _busy_text(result: dict) -> str:
    return "–" if result.get("gpu_busy") is None else f"{100 * result['gpu_busy']:.0f} %"


def record_table(record: dict) -> list[str]:
    """Markdown lines of a throughput record. ``results``: ``method``, ``steps``, ``cpu_capability`` and
    ``settings``: one :func:`measure` dict per setting and batch, ``fp32`` at the first batch (the reference)
    first (records made before batches were a setting hold batch 16 only, and no busy share)."""
    results = record["results"]
    reference = results["settings"][0]["crops_per_s"]
    batches = sorted({result.get("batch", 16) for result in results["settings"]})
    gpu = any("gpu_busy" in result for result in results["settings"])
    rows = [f"| {result['setting']} |" + (f" {result.get('batch', 16)} |" if len(batches) > 1 else "")
            + f" {result['crops_per_s']:.1f} | {result['crops_per_s'] / reference:.2f}× | "
            f"{100 * result['data_wait']:.1f} % |" + (f" {_busy_text(result)} |" if gpu else "")
            + f" {result['warmup_s']:.0f} | {result['threads']} |"
            for result in results["settings"]]
    columns = ["setting", *(["batch"] if len(batches) > 1 else []), "crops/s", "ratio to fp32", "data-wait share",
               *(["GPU busy"] if gpu else []), "warm-up (s)", "threads"]
    batch_text = f"batch {batches[0]}" if len(batches) == 1 else f"batches {', '.join(map(str, batches))}"
    lines = [f"{results['method']}, {batch_text}, {results['steps']} timed steps after {WARMUP_STEPS} warm-up "
             f"steps, CPU capability {results['cpu_capability']}.", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *rows, ""]
    if "dice" in results:
        dice = results["dice"]
        lines += [f"Validation Dice after {dice['epochs']} × {_DICE_ITERATIONS} batches: CPU {dice['cpu']:.3f}, "
                  f"GPU {dice['cuda']:.3f} (difference {dice['cuda'] - dice['cpu']:+.3f}).", ""]
    return [*lines, caption(record)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--method", default="ce_dice")
    parser.add_argument("--settings", default=None, help=f"comma-separated subset of {', '.join(SETTINGS)}")
    parser.add_argument("--batch-sizes", default="16", help="comma-separated batches to measure every setting at")
    parser.add_argument("--dice", action="store_true", help="also compare the CPU's and the GPU's validation Dice")
    parser.add_argument("--dice-epochs", type=int, default=10, help="epochs of 100 batches for --dice")
    parser.add_argument("--record", type=Path, default=None, help="write the results as a JSON record here")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: measure one setting, print JSON
    arguments = parser.parse_args()
    try:
        batch_sizes = [int(size) for size in arguments.batch_sizes.split(",")]
    except ValueError:
        batch_sizes = []
    if not batch_sizes or min(batch_sizes) < 1:
        raise SystemExit(f"error: --batch-sizes takes positive whole numbers, got {arguments.batch_sizes!r}.")
    if arguments.one:
        result = measure(arguments.one, arguments.steps, arguments.method, batch_sizes[0])
        if result is not None:
            print(json.dumps(result))
        return
    chosen = arguments.settings.split(",") if arguments.settings else [name for name in SETTINGS if available(name)]
    unknown = [name for name in chosen if name not in SETTINGS]
    if unknown:
        raise SystemExit(f"error: unknown setting(s) {', '.join(unknown)}; choose from {', '.join(SETTINGS)}.")
    missing = [name for name in chosen if not available(name)]
    if missing or (arguments.dice and not torch.cuda.is_available()):
        raise SystemExit(f"error: this machine cannot measure {', '.join(missing) or '--dice'} (it needs "
                         f"{'two GPUs' if missing == ['cuda_ddp'] else 'a GPU'}).")
    device = "cuda" if any(name.startswith("cuda") for name in chosen) else "cpu"
    if arguments.record is not None and arguments.record.resolve() == GPU_RECORD and device != "cuda":
        raise SystemExit(f"error: {GPU_RECORD.name} is the GPU record; only a run with cuda settings on a GPU "
                         "writes it (give --record another path).")
    measured = []
    for setting in ["fp32"] + [name for name in chosen if name != "fp32"]:  # the reference first
        for batch_size in batch_sizes:
            measured.append(_measure_in_fresh_process(setting, arguments.steps, arguments.method, batch_size))
            busy = measured[-1]["gpu_busy"]
            print(f"{setting} batch {batch_size}: {measured[-1]['crops_per_s']:.1f} crops/s"
                  + (f", GPU busy {100 * busy:.0f} %" if busy is not None else ""), flush=True)
    results = {"method": arguments.method, "steps": arguments.steps,
               "cpu_capability": torch.backends.cpu.get_cpu_capability(), "settings": measured}
    if arguments.dice:
        # The throughput record is written before the slower Dice comparison, so that a lease ending during
        # the comparison still leaves the speeds recorded; the record is rewritten with the Dice once measured.
        speeds = make_record("training_throughput", results, device=device)
        write_record(arguments.record, speeds, record_table(speeds))
        results["dice"] = {"epochs": arguments.dice_epochs}
        for dice_device in ("cpu", "cuda"):
            results["dice"][dice_device] = validation_dice(dice_device, arguments.method, arguments.dice_epochs)
            print(f"{dice_device}: validation Dice {results['dice'][dice_device]:.3f}", flush=True)
    record = make_record("training_throughput", results, device=device)
    publish(arguments.record, record, record_table)


if __name__ == "__main__":
    main()
