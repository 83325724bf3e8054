"""What counting the mirrored passes' agreement costs: the mirrored sliding window with and without it.

    python -m benchmarks.mirror_agreement [--repeats 7] [--record docs/records/benchmark_mirror_agreement.json]

Every shipped bundle mirrors at test time (four passes per slice), and the quality models read
``mirror_agreement`` (:class:`CalibSegLib.sliding_window.MirrorAgreement`): each pass's argmax
counted against the average's. Both sides run :func:`~CalibSegLib.sliding_window.window_logits` on
the same ACDC-sized batch (10 slices of 256×256 at the model's 1.5 mm, the default UNet with seeded
random weights, 4 classes, 128×128 windows, ``mirror_axes`` (0, 1)); the reference is the same call
without the agreement, as every prediction ran before it existed. The two alternate, and each side's
fastest of ``--repeats`` after one warm-up counts: the agreement costs a few percent, less than this
machine's run-to-run spread, which only slows runs down. Target: at most 10 % more time.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.inference import benchmark_bundle
from benchmarks.record import caption, make_record, publish
from CalibSegLib.sliding_window import MirrorAgreement, window_logits

TIME_TARGET = 1.1
SLICES, SIDE = 10, 256


def record_table(record: dict) -> list[str]:
    """Markdown lines of a mirror-agreement record. ``results``: ``slices``, ``side`` (voxels), ``passes``,
    ``repeats``, ``reference_s`` (fastest run without the agreement) and ``agreement_s`` (fastest with it)."""
    results = record["results"]
    ratio = results["agreement_s"] / results["reference_s"]
    return [
        "| what | with the agreement | reference (same run) | ratio | target |",
        "|---|---|---|---|---|",
        f"| mirrored sliding window, {results['slices']} slices of {results['side']}×{results['side']}, "
        f"{results['passes']} passes | {results['agreement_s']:.2f} s | without it: {results['reference_s']:.2f} s | "
        f"{ratio:.2f}× time | ≤ {TIME_TARGET:g}× |",
        "",
        caption(record),
    ]


def measure(repeats: int) -> dict[str, Any]:
    """Fastest seconds of ``window_logits`` without and with a :class:`MirrorAgreement`, interleaved."""
    bundle = benchmark_bundle()
    settings = dataclasses.replace(bundle.metadata.sliding_window, mirror_axes=(0, 1))
    model = bundle.build_model().eval()
    images = torch.rand(SLICES, 1, SIDE, SIDE, generator=torch.Generator().manual_seed(0))
    passes = settings.passes
    seconds: dict[str, list[float]] = {"reference_s": [], "agreement_s": []}
    with torch.inference_mode():
        window_logits(model, images, settings, MirrorAgreement(bundle.metadata.num_classes, passes))  # warm-up
        for _ in range(repeats):
            for key in seconds:
                agreement = MirrorAgreement(bundle.metadata.num_classes, passes) if key == "agreement_s" else None
                started = time.perf_counter()
                window_logits(model, images, settings, agreement)
                seconds[key].append(time.perf_counter() - started)
    return {"slices": SLICES, "side": SIDE, "passes": passes, "repeats": repeats,
            **{key: min(values) for key, values in seconds.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--record", type=Path, default=None, help="write the results as a JSON record here")
    arguments = parser.parse_args()
    record = make_record("mirror_agreement", measure(arguments.repeats))
    publish(arguments.record, record, record_table)


if __name__ == "__main__":
    main()
