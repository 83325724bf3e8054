"""Inference speed and memory: CalibSeg's Predictor against the same job written with MONAI on the whole volume.

    python -m benchmarks.inference                # ACDC-sized 10×256×256 volume, CPU (and CUDA when present)
    python -m benchmarks.inference --ct           # also the CT-sized 300×512×512 volume
    python -m benchmarks.inference --device cpu --batch-size 16 --repeats 3
    python -m benchmarks.inference --ct --record docs/records/benchmark_inference.json   # docs/performance.md

Both pipelines do the same job on the same random int16 volume with the same weights
(the default 2D UNet, 4 classes, model spacing 1.5 mm, 128×128 windows with overlap 0.5 and
Gaussian blending, temperature 1.5): percentile normalisation → slices resampled from the
volume's spacing to 1.5 mm → sliding-window network → temperature → softmax → probabilities
back to the input grid → labels, confidence, normalised entropy. CalibSeg streams batch by
batch (:class:`CalibSegLib.inference.Predictor`, probabilities not kept); the reference is
what one writes with MONAI: the whole volume normalised and resampled as one tensor,
``SlidingWindowInferer`` over all its slices, then the same post-processing.

Every measurement runs in a fresh process, so peak RSS (``ru_maxrss``) belongs to that
pipeline alone; a one-batch warm-up runs first and is not timed. Ratios are CalibSeg /
MONAI from the same run (< 1 is better). Targets: time ratio <= 1, and peak RSS of the
CT-sized volume < 2.5 GB. ``--record`` writes the numbers as a JSON record
(:mod:`benchmarks.record`); docs/performance.md's table is made from it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.record import caption, make_record, publish

from CalibSegLib.bundle import Bundle, BundleMetadata
from CalibSegLib.device import resolve_device
from CalibSegLib.inference import Predictor, confidence_maps
from CalibSegLib.networks import build_network
from CalibSegLib.prediction import Prediction
from CalibSegLib.preprocessing import (Preprocessing, in_plane_spacing, network_grid_shape, normalize_intensity,
                                       resample_slices)
from CalibSegLib.sliding_window import SlidingWindow
from CalibSegLib.temperature import apply_temperature

# (shape (z, y, x), spacing (z, y, x) mm): an ACDC cine volume at its model spacing, and a CT-sized
# volume at 0.8 mm resampled to the model's 1.5 mm.
CASES: dict[str, tuple[tuple[int, int, int], tuple[float, float, float]]] = {
    "acdc": ((10, 256, 256), (10.0, 1.5, 1.5)), "ct": ((300, 512, 512), (2.5, 0.8, 0.8))}
PIPELINES: tuple[str, ...] = ("calibseg", "monai")
RSS_TARGET_GB = 2.5


def benchmark_bundle(num_classes: int = 4, seed: int = 0) -> Bundle:
    """The default CalibSeg network (``unet``) with seeded random weights, as an in-memory bundle."""
    torch.manual_seed(seed)
    model = build_network("unet", 1, num_classes)
    metadata = BundleMetadata(
        network="unet",
        network_kwargs={},
        in_channels=1,
        num_classes=num_classes,
        spatial_dims=2,
        class_names=[f"class {index}" for index in range(num_classes)],
        class_colors=[(index / num_classes,) * 3 for index in range(num_classes)],
        preprocessing=Preprocessing(target_spacing=(1.5, 1.5)),
        sliding_window=SlidingWindow(patch_size=(128, 128), overlap=0.5),
        temperature=1.5,
    )
    return Bundle(metadata, model.state_dict())


def random_volume(shape: tuple[int, int, int], seed: int = 0) -> np.ndarray:
    """CT-like int16 noise ``(z, y, x)``, drawn without float64 temporaries that would inflate peak RSS."""
    return np.random.default_rng(seed).integers(-1000, 2000, size=shape, dtype=np.int16)


def predict_with_monai(
    bundle: Bundle, volume: np.ndarray, spacing: tuple[float, float, float], device: torch.device, batch_size: int
) -> Prediction:
    """The same prediction the MONAI way: whole-volume tensors through ``SlidingWindowInferer``, then
    post-processing."""
    from monai.inferers import SlidingWindowInferer

    metadata = bundle.metadata
    network = bundle.build_model().to(device)
    normalized = normalize_intensity(
        volume, metadata.preprocessing.normalization, metadata.preprocessing.upper_percentile
    )
    grid = network_grid_shape(volume.shape[1:], in_plane_spacing(spacing), metadata.preprocessing.target_spacing)
    window = metadata.sliding_window
    inferer = SlidingWindowInferer(roi_size=window.patch_size, sw_batch_size=window.batch_size,
                                   overlap=window.overlap, mode="gaussian", progress=False)
    with torch.inference_mode():
        slices = resample_slices(torch.from_numpy(normalized).unsqueeze(1), grid).to(device)
        logits = inferer(slices, network)
        probabilities = torch.softmax(apply_temperature(logits, metadata.temperature), dim=1)
        del logits
        probabilities = resample_slices(probabilities, volume.shape[1:])
        labels, confidence, entropy = (values.cpu().numpy() for values in confidence_maps(probabilities))
    return Prediction(labels, confidence, entropy)


def predict_with_calibseg(
    bundle: Bundle, volume: np.ndarray, spacing: tuple[float, float, float], device: torch.device, batch_size: int
) -> Prediction:
    return Predictor(bundle, device=device, batch_size=batch_size).predict(volume, spacing)


_RUNNERS = {"calibseg": predict_with_calibseg, "monai": predict_with_monai}


def measure(
    pipeline: str, case: str, device: str, batch_size: int, repeats: int
) -> dict[str, Any]:
    """Run one pipeline in this process: wall time (best of ``repeats``), peak RSS/GPU memory, outputs."""
    run = _RUNNERS[pipeline]
    shape, spacing = CASES[case]
    torch_device = resolve_device(device)
    bundle = benchmark_bundle()
    run(
        bundle, random_volume((min(batch_size, shape[0]), 64, 64), seed=1), spacing, torch_device, batch_size
    )  # warm-up
    volume = random_volume(shape)
    if torch_device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        prediction = None  # free the previous run's outputs before the next one allocates its own
        started = time.perf_counter()
        prediction = run(bundle, volume, spacing, torch_device, batch_size)
        if torch_device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    label_fractions = (
        np.bincount(prediction.labels.ravel(), minlength=bundle.metadata.num_classes) / prediction.labels.size
    )
    return {
        "pipeline": pipeline,
        "seconds": min(times),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
        "peak_gpu_gb": torch.cuda.max_memory_allocated() / 1024**3 if torch_device.type == "cuda" else None,
        "mean_confidence": float(prediction.confidence.mean(dtype=np.float64)),
        "label_fractions": label_fractions.round(6).tolist(),
        "device": str(torch_device),
        "threads": torch.get_num_threads(),
    }


def measure_in_subprocess(
    pipeline: str, case: str, device: str, batch_size: int, repeats: int
) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "benchmarks.inference",
        "--worker",
        pipeline,
        "--case",
        case,
        "--device",
        device,
        "--batch-size",
        str(batch_size),
        "--repeats",
        str(repeats),
    ]
    completed = subprocess.run(command, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{pipeline} on {case} failed:\n{completed.stderr}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _same_outputs(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    return abs(ours["mean_confidence"] - theirs["mean_confidence"]) < 1e-4 and bool(np.allclose(
        ours["label_fractions"], theirs["label_fractions"], atol=1e-4))


def volume_cell(run: dict) -> str:
    """How a benchmark table names a run's volume: its case and shape (``ct, 300×512×512``)."""
    return f"{run['case']}, {'×'.join(map(str, run['shape']))}"


def rss_check(peak_rss_gb: float) -> str:
    """The CT-sized volume's peak-memory check against :data:`RSS_TARGET_GB`."""
    return f"RSS {'<' if peak_rss_gb < RSS_TARGET_GB else '≥'} {RSS_TARGET_GB} GB"


def record_table(record: dict) -> list[str]:
    """Markdown lines of an inference record. ``results``: ``batch_size``, ``repeats`` and ``runs``, each
    ``{"case", "shape", "calibseg": measure(), "monai": measure()}`` (:func:`measure`'s dict: seconds,
    peak_rss_gb, peak_gpu_gb, device, ...)."""
    results = record["results"]
    rows = []
    for run in results["runs"]:
        ours, theirs = run["calibseg"], run["monai"]
        gpu = "" if ours["peak_gpu_gb"] is None else f"{ours['peak_gpu_gb']:.2f} / {theirs['peak_gpu_gb']:.2f} GB"
        checks = ["same outputs" if _same_outputs(ours, theirs) else "OUTPUTS DIFFER"]
        if run["case"] == "ct":
            checks.append(rss_check(ours["peak_rss_gb"]))
        rows.append(f"| {volume_cell(run)} | {ours['device']} | {ours['seconds']:.2f} s | "
                    f"{theirs['seconds']:.2f} s | {ours['seconds'] / theirs['seconds']:.2f}× | "
                    f"{ours['peak_rss_gb']:.2f} / {theirs['peak_rss_gb']:.2f} GB | {gpu} | {', '.join(checks)} |")
    return [f"Batch {results['batch_size']}, best of {results['repeats']}; ratio = CalibSeg / MONAI "
            "`SlidingWindowInferer` on the same network, weights and volume (< 1 is better, target ≤ 1).", "",
            ("| volume | device | CalibSeg | MONAI | time ratio | peak RSS CalibSeg / MONAI | "
             "peak GPU memory | checks |"),
            "|---|---|---|---|---|---|---|---|", *rows, "", caption(record)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ct", action="store_true", help="also run the CT-sized 300×512×512 volume (slow on a CPU)"
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda", "all"),
        default="all",
        help="all (default): CPU, and CUDA when present",
    )
    parser.add_argument("--batch-size", type=int, default=16, help="slices per forward pass, both pipelines")
    parser.add_argument(
        "--repeats", type=int, default=1, help="timed runs per measurement (best is reported)"
    )
    parser.add_argument("--record", type=Path, default=None, help="write the results as a JSON record here")
    parser.add_argument("--worker", choices=PIPELINES, help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=tuple(CASES), help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.worker:
        print(
            json.dumps(
                measure(arguments.worker, arguments.case, arguments.device, arguments.batch_size, arguments.repeats)
            )
        )
        return 0
    devices = ["cpu", "cuda"] if arguments.device == "all" else [arguments.device]
    devices = [device for device in devices if device != "cuda" or torch.cuda.is_available()]
    cases = ["acdc", "ct"] if arguments.ct else ["acdc"]
    runs = []
    for case in cases:
        for device in devices:
            ours, theirs = (measure_in_subprocess(pipeline, case, device, arguments.batch_size, arguments.repeats)
                            for pipeline in PIPELINES)
            runs.append({"case": case, "shape": list(CASES[case][0]), "calibseg": ours, "monai": theirs})
            print(f"{case} on {device}: CalibSeg {ours['seconds']:.2f} s, MONAI {theirs['seconds']:.2f} s", flush=True)
    record = make_record("inference", {"batch_size": arguments.batch_size, "repeats": arguments.repeats, "runs": runs},
                         argv, device="cuda" if "cuda" in devices else "cpu")
    publish(arguments.record, record, record_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
