"""Calibration metric cost on a 4-class, 10-million-voxel volume.

    python -m benchmarks.metrics [--voxels 10000000] [--chunks 40] [--record docs/records/benchmark_metrics.json]

Times ECE+MCE+CECE+TACE+Brier+NLL in one streaming pass (CalibrationAccumulator fed chunk
by chunk) as a ratio to ECE alone computed with ``np.histogram`` on the same data, and the
peak extra memory of the streaming pass (tracemalloc) as a ratio to the float32
probability array. Targets from the issue: < 2× the time, < 1.5× the memory. ``--record``
writes the numbers as a JSON record (:mod:`benchmarks.record`); docs/performance.md's table is made from it.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from pathlib import Path

import numpy as np

from benchmarks.record import caption, make_record, publish
from CalibSegLib.metrics import CalibrationAccumulator

TIME_TARGET, MEMORY_TARGET = 2.0, 1.5


def histogram_ece(probs: np.ndarray, target: np.ndarray, n_bins: int = 15) -> float:
    mask = target > 0
    selected = probs[:, mask]
    confidence = selected.max(axis=0)
    correct = selected.argmax(axis=0) == target[mask]
    edges = np.linspace(0, 1, n_bins + 1)
    counts, _ = np.histogram(confidence, edges)
    confidence_sums, _ = np.histogram(confidence, edges, weights=confidence)
    correct_sums, _ = np.histogram(confidence, edges, weights=correct.astype(np.float64))
    filled = counts > 0
    return float((np.abs(correct_sums[filled] - confidence_sums[filled])).sum() / counts.sum())


def record_table(record: dict) -> list[str]:
    """Markdown lines of a metrics record. ``results``: ``shape`` (z, y, x), ``foreground_voxels``,
    ``chunks``, ``reference_s`` (ECE alone, ``np.histogram``), ``streaming_s`` (all metrics,
    streamed), ``peak_bytes`` (tracemalloc peak of the streaming pass), ``probability_bytes``."""
    results = record["results"]
    voxels = float(np.prod(results["shape"]))
    time_ratio = results["streaming_s"] / results["reference_s"]
    memory_ratio = results["peak_bytes"] / results["probability_bytes"]
    return [
        "| what | CalibSeg | reference (same run) | ratio | target |",
        "|---|---|---|---|---|",
        f"| ECE+MCE+CECE+TACE+Brier+NLL, 4 classes, {voxels / 1e6:.1f} M voxels streamed in {results['chunks']} "
        f"chunks | {results['streaming_s']:.2f} s | ECE alone with `np.histogram`: {results['reference_s']:.2f} s | "
        f"{time_ratio:.2f}× time | < {TIME_TARGET:g}× |",
        f"| peak extra memory of that pass (tracemalloc) | {results['peak_bytes'] / 2**20:.0f} MiB | float32 "
        f"probability array: {results['probability_bytes'] / 2**20:.0f} MiB | {memory_ratio:.2f}× | "
        f"< {MEMORY_TARGET:g}× |",
        "",
        caption(record),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--voxels", type=int, default=10_000_000)
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--record", type=Path, default=None, help="write the results as a JSON record here")
    arguments = parser.parse_args()
    rng = np.random.default_rng(0)
    depth = arguments.chunks
    side = int(np.sqrt(arguments.voxels / depth))
    shape = (depth, side, side)
    logits = rng.normal(size=(4,) + shape).astype(np.float32) * 3
    probs = np.exp(logits - logits.max(0))
    probs /= probs.sum(0)
    del logits
    target = rng.integers(0, 4, size=shape)

    started = time.perf_counter()
    reference = histogram_ece(probs, target)
    reference_time = time.perf_counter() - started

    tracemalloc.start()
    started = time.perf_counter()
    accumulator = CalibrationAccumulator(4)
    for z in range(depth):
        accumulator.update(probs[:, z], target[z])
    result = accumulator.result()
    streaming_time = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # np.histogram bins are [a, b), docs/design.md's are (a, b]: values on a float32 edge may land one bin apart.
    assert abs(result.pooled["ece"] - reference) < 1e-4, (f"streaming ECE {result.pooled['ece']} disagrees with "
                                                           f"np.histogram ECE {reference}")
    record = make_record("metrics", {"shape": list(shape), "foreground_voxels": int(result.pooled["voxels"]),
                                     "chunks": depth, "reference_s": reference_time, "streaming_s": streaming_time,
                                     "peak_bytes": int(peak), "probability_bytes": int(probs.nbytes)})
    publish(arguments.record, record, record_table)


if __name__ == "__main__":
    main()
