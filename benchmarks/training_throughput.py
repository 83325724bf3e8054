"""Training throughput (crops/s) of the trainer's own step under the CPU/GPU options, as ratios to fp32.

    python -m benchmarks.training_throughput [--steps 30] [--method ce_dice] [--settings fp32,compile,...]
        [--record docs/records/benchmark_training_throughput.json]

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
- ``cuda``/``cuda_amp``: on a GPU when one is present.

``--record`` writes the numbers as a JSON record (:mod:`benchmarks.record`); docs/performance.md's table
is made from it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import torch

from benchmarks.record import caption, make_record, write_record

SETTINGS: dict[str, dict] = {
    "fp32": {},
    "compile": {"compile": True},
    "bf16": {"amp": True},
    "channels_last": {"channels_last": True},
    "threads1": {"threads": 1},
    "patch160": {"patch_size": (160, 160)},
    "dynunet": {"network": "dynunet"},
    "cuda": {"device": "cuda"},
    "cuda_amp": {"device": "cuda", "amp": True},
}
WARMUP_STEPS = 3


def measure(setting: str, steps: int, method: str) -> dict:
    """Crops/s and data-wait share of ``steps`` training steps under ``setting`` (run in this process)."""
    from Datasets.cases import find_cases, load_cases
    from Datasets.splits import SPLITS_DIR, load_split
    from Training.trainer import TrainConfig, Trainer

    options = dict(SETTINGS[setting])
    if "threads" in options:
        torch.set_num_threads(options.pop("threads"))
    channels_last = options.pop("channels_last", False)
    files = find_cases(ROOT / "SampleData" / "ACDC")
    split = load_split(SPLITS_DIR / "acdc_sample.json")
    train = load_cases([f for f in files if f.patient_id in split["train"]], 4)
    val = load_cases([f for f in files if f.patient_id in split["val"][:1]], 4)
    config = TrainConfig(method=method, patch_size=options.pop("patch_size", (128, 128)), progress=False,
                         iterations_per_epoch=steps + WARMUP_STEPS, **options)
    with tempfile.TemporaryDirectory() as run_dir:  # the trainer writes nothing before fit()
        trainer = Trainer(config, train, val, Path(run_dir), {})
        if channels_last:
            trainer.model.to(memory_format=torch.channels_last)
        batches = iter(trainer.epoch_batches())
        trainer.model.train()
        waiting = computing = warmup = 0.0
        for step in range(steps + WARMUP_STEPS):
            started = time.perf_counter()
            images, target = next(batches)
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            loaded = time.perf_counter()
            trainer.train_step(images, target)
            if trainer.device.type == "cuda":
                torch.cuda.synchronize()
            if step < WARMUP_STEPS:
                warmup += time.perf_counter() - started
            else:
                waiting += loaded - started
                computing += time.perf_counter() - loaded
    total = waiting + computing
    return {"setting": setting, "crops_per_s": steps * config.batch_size / total, "data_wait": waiting / total,
            "warmup_s": warmup, "threads": torch.get_num_threads()}


def record_table(record: dict) -> list[str]:
    """Markdown lines of a throughput record. ``results``: ``method``, ``steps``, ``cpu_capability`` and
    ``settings``: one :func:`measure` dict per setting, ``fp32`` (the reference) first."""
    results = record["results"]
    reference = results["settings"][0]["crops_per_s"]
    rows = [f"| {result['setting']} | {result['crops_per_s']:.1f} | {result['crops_per_s'] / reference:.2f}× | "
            f"{100 * result['data_wait']:.1f} % | {result['warmup_s']:.0f} | {result['threads']} |"
            for result in results["settings"]]
    return [f"{results['method']}, batch 16, {results['steps']} timed steps after {WARMUP_STEPS} warm-up steps, "
            f"CPU capability {results['cpu_capability']}.", "",
            "| setting | crops/s | ratio to fp32 | data-wait share | warm-up (s) | threads |",
            "|---|---|---|---|---|---|", *rows, "", caption(record)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--method", default="ce_dice")
    parser.add_argument("--settings", default=None, help=f"comma-separated subset of {', '.join(SETTINGS)}")
    parser.add_argument("--record", type=Path, default=None, help="write the results as a JSON record here")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: measure one setting, print JSON
    arguments = parser.parse_args()
    if arguments.one:
        print(json.dumps(measure(arguments.one, arguments.steps, arguments.method)))
        return
    chosen = arguments.settings.split(",") if arguments.settings else [
        name for name in SETTINGS if torch.cuda.is_available() or not name.startswith("cuda")]
    unknown = [name for name in chosen if name not in SETTINGS]
    if unknown:
        raise SystemExit(f"error: unknown setting(s) {', '.join(unknown)}; choose from {', '.join(SETTINGS)}.")
    measured = []
    for setting in ["fp32"] + [name for name in chosen if name != "fp32"]:  # the reference first
        output = subprocess.run([sys.executable, "-m", "benchmarks.training_throughput", "--one", setting, "--steps",
                                 str(arguments.steps), "--method", arguments.method], cwd=ROOT, capture_output=True,
                                text=True, check=True)
        measured.append(json.loads(output.stdout.strip().splitlines()[-1]))
        print(f"{setting}: {measured[-1]['crops_per_s']:.1f} crops/s", flush=True)
    results = {"method": arguments.method, "steps": arguments.steps,
               "cpu_capability": torch.backends.cpu.get_cpu_capability(), "settings": measured}
    record = make_record("training_throughput", results,
                         device="cuda" if any(name.startswith("cuda") for name in chosen) else "cpu")
    print("\n".join(record_table(record)))
    write_record(arguments.record, record)


if __name__ == "__main__":
    main()
