"""Loss cost: forward+backward time of every loss as a ratio to plain CE, and to a UNet training step.

    python -m benchmarks.losses [--batch 16] [--size 192] [--repeats 3] [--record docs/records/benchmark_losses.json]

All timings are taken in one run on the same machine; the issue's target is that the priors
are vectorised and NACL/CRaC add at most 10 % to a UNet training step on CPU. ``--record``
writes the numbers as a JSON record (:mod:`benchmarks.record`); docs/performance.md's table is made from it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.record import caption, make_record, publish
from CalibSegLib.losses import LOSSES, build_loss
from CalibSegLib.networks import build_network


def best_time(function, repeats: int) -> float:
    function()  # warm-up
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        timings.append(time.perf_counter() - started)
    return min(timings)


STEP_SHARE_TARGET = 0.10  # NACL and CRaC: at most +10 % of a UNet training step


def record_table(record: dict) -> list[str]:
    """Markdown lines of a losses record. ``results``: ``shape`` of the logits (B, C, y, x), ``step_s``
    (a UNet training step with CE), ``losses`` ``{name: fwd+bwd seconds}`` (BWCR's includes its
    second UNet forward)."""
    results = record["results"]
    losses, step = results["losses"], results["step_s"]
    rows = []
    for name, seconds in losses.items():
        share = "includes a 2nd UNet forward" if name == "bwcr" else f"+{100 * (seconds - losses['ce']) / step:.1f} %"
        target = f"≤ +{100 * STEP_SHARE_TARGET:.0f} %" if name in ("nacl", "crac") else ""
        rows.append(f"| {name} | {seconds:.4f} | {seconds / losses['ce']:.2f} | {share} | {target} |")
    return [f"Logits {'×'.join(map(str, results['shape']))}; a UNet training step with CE takes {step:.3f} s.", "",
            "| loss | fwd+bwd (s) | × CE | share of a UNet step | target |", "|---|---|---|---|---|", *rows,
            "", caption(record)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=192)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--record", type=Path, default=None, help="write the results as a JSON record here")
    arguments = parser.parse_args()
    torch.manual_seed(0)
    shape = (arguments.batch, arguments.classes, arguments.size, arguments.size)
    logits = torch.randn(shape, requires_grad=True)
    target = torch.randint(0, arguments.classes, (arguments.batch, arguments.size, arguments.size))
    images = torch.randn(arguments.batch, 1, arguments.size, arguments.size)
    model = build_network("unet", 1, arguments.classes)
    optimizer = torch.optim.Adam(model.parameters())
    ce = build_loss("ce", arguments.classes)

    def unet_step() -> None:
        optimizer.zero_grad()
        ce(model(images), target).backward()
        optimizer.step()

    step_time = best_time(unet_step, arguments.repeats)
    results = {}
    for name in LOSSES:
        loss = build_loss(name, arguments.classes)

        def forward_backward(loss=loss) -> None:
            logits.grad = None
            if loss.needs_model:  # BWCR's second forward pass is part of its cost
                loss(model(images), target, model=model, images=images).backward()
            else:
                loss(logits, target).backward()

        results[name] = best_time(forward_backward, arguments.repeats)
    record = make_record("losses", {"shape": list(shape), "step_s": step_time, "losses": results})
    publish(arguments.record, record, record_table)


if __name__ == "__main__":
    main()
