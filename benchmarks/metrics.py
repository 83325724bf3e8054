"""Calibration metric cost on a 4-class, 10-million-voxel volume.

    python benchmarks/metrics.py [--voxels 10000000] [--chunks 40]

Times ECE+MCE+CECE+TACE+Brier+NLL in one streaming pass (CalibrationAccumulator fed chunk
by chunk) as a ratio to ECE alone computed with ``np.histogram`` on the same data, and the
peak extra memory of the streaming pass (tracemalloc) as a ratio to the float32
probability array. Targets from the issue: < 2× the time, < 1.5× the memory.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from CalibSegLib.metrics import CalibrationAccumulator


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--voxels", type=int, default=10_000_000)
    parser.add_argument("--chunks", type=int, default=40)
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
    # np.histogram bins are [a, b), DESIGN.md's are (a, b]: values on a float32 edge may land one bin apart.
    assert abs(result.pooled["ece"] - reference) < 1e-4, f"streaming ECE {result.pooled['ece']} disagrees with np.histogram ECE {reference}"
    voxels = int(np.prod(shape))
    print(f"volume {shape} = {voxels / 1e6:.1f} M voxels, 4 classes, mask = foreground ({result.pooled['voxels'] / 1e6:.1f} M)")
    print(f"ECE alone, np.histogram: {reference_time:.2f} s")
    print(f"ECE+MCE+CECE+TACE+Brier+NLL, streaming in {depth} chunks: {streaming_time:.2f} s "
          f"({streaming_time / reference_time:.2f}× ECE alone)")
    print(f"peak extra memory of the streaming pass: {peak / 2**20:.0f} MiB "
          f"({peak / probs.nbytes:.2f}× the {probs.nbytes / 2**20:.0f} MiB float32 probability array)")


if __name__ == "__main__":
    main()
