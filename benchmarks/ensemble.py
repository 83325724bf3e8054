"""What an ensemble costs at inference: an M-member ensemble bundle against one of its networks, same volume.

    python -m benchmarks.ensemble                     # ACDC-sized 10×256×256 volume, 5 members, CPU
    python -m benchmarks.ensemble --ct                # also the CT-sized 300×512×512 volume (peak memory)
    python -m benchmarks.ensemble --ct --record docs/records/benchmark_ensemble.json   # docs/performance.md

The networks are :func:`benchmarks.inference.benchmark_bundle`'s default 2D UNet with seeded random weights (seed
m for member m); the single network is member 0 alone. Both run CalibSeg's own
:class:`~CalibSegLib.inference.Predictor` on the same random int16 volume, each measurement in a fresh process (so
peak RSS belongs to that run alone) after an untimed warm-up. The ensemble does M network passes per window and,
per batch, brings each member's probabilities to the input grid in turn, keeping running sums only, and writes
the disagreement map beside labels, confidence and entropy. Targets (issue: the fold ensemble): time ratio
ensemble / single ≤ 6 for 5 members on the ACDC-sized volume, and the CT-sized volume's peak RSS < 2.5 GB.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.inference import CASES, benchmark_bundle, random_volume, rss_check, volume_cell
from benchmarks.record import caption, make_record, publish

from CalibSegLib.bundle import Bundle
from CalibSegLib.inference import Predictor

TIME_RATIO_TARGET = 6.0


def ensemble_bundle(members: int) -> Bundle:
    """``members`` seeded benchmark networks as one in-memory ensemble bundle."""
    networks = [benchmark_bundle(seed=seed) for seed in range(members)]
    state = {f"members.{index}.{name}": tensor for index, network in enumerate(networks)
             for name, tensor in network.state_dict.items()}
    return Bundle(dataclasses.replace(networks[0].metadata, ensemble_size=members), state)


def measure(members: int, case: str, batch_size: int, repeats: int) -> dict[str, Any]:
    """One bundle (``members`` 1: a single network) on one case in this process: best wall time, peak RSS."""
    shape, spacing = CASES[case]
    predictor = Predictor(benchmark_bundle() if members == 1 else ensemble_bundle(members), device="cpu",
                          batch_size=batch_size)
    predictor.predict(random_volume((min(batch_size, shape[0]), 64, 64), seed=1), spacing)  # warm-up
    volume = random_volume(shape)
    times = []
    for _ in range(repeats):
        prediction = None  # free the previous outputs before the next run allocates its own
        started = time.perf_counter()
        prediction = predictor.predict(volume, spacing)
        times.append(time.perf_counter() - started)
    disagreement = prediction.disagreement
    return {"members": members, "seconds": min(times),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
            "mean_confidence": float(prediction.confidence.mean(dtype=np.float64)),
            "mean_disagreement": None if disagreement is None else float(disagreement.mean(dtype=np.float64))}


def _in_subprocess(members: int, case: str, batch_size: int, repeats: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.ensemble", "--worker", str(members), "--case", case,
               "--batch-size", str(batch_size), "--repeats", str(repeats)]
    completed = subprocess.run(command, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{members} member(s) on {case} failed:\n{completed.stderr}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def record_table(record: dict) -> list[str]:
    """Markdown lines of an ensemble record: per case the single network's and the ensemble's time and peak RSS,
    their ratio and the targets' checks."""
    results = record["results"]
    rows = []
    for run in results["runs"]:
        single, ensemble = run["single"], run["ensemble"]
        ratio = ensemble["seconds"] / single["seconds"]
        checks = [f"ratio {'≤' if ratio <= TIME_RATIO_TARGET else '>'} {TIME_RATIO_TARGET:g}"]
        if run["case"] == "ct":
            checks.append(rss_check(ensemble["peak_rss_gb"]))
        rows.append(f"| {volume_cell(run)} | {single['seconds']:.2f} s | "
                    f"{ensemble['seconds']:.2f} s | {ratio:.2f}× | {single['peak_rss_gb']:.2f} / "
                    f"{ensemble['peak_rss_gb']:.2f} GB | {', '.join(checks)} |")
    return [f"{results['members']} members against one network, CPU, batch {results['batch_size']}, best of "
            f"{results['repeats']}; ratio = ensemble / single network (target ≤ {TIME_RATIO_TARGET:g}).", "",
            "| volume | one network | ensemble | time ratio | peak RSS one / ensemble | checks |",
            "|---|---|---|---|---|---|", *rows, "", caption(record)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ct", action="store_true", help="also the CT-sized 300×512×512 volume (slow on a CPU)")
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16, help="slices per forward pass")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per measurement (best is reported)")
    parser.add_argument("--record", type=Path, default=None, help="write the results as a JSON record here")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=tuple(CASES), help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.worker:
        print(json.dumps(measure(arguments.worker, arguments.case, arguments.batch_size, arguments.repeats)))
        return 0
    runs = []
    for case in ["acdc", "ct"] if arguments.ct else ["acdc"]:
        single, ensemble = (_in_subprocess(members, case, arguments.batch_size, arguments.repeats)
                            for members in (1, arguments.members))
        runs.append({"case": case, "shape": list(CASES[case][0]), "single": single, "ensemble": ensemble})
        print(f"{case}: one network {single['seconds']:.2f} s, {arguments.members} members "
              f"{ensemble['seconds']:.2f} s", flush=True)
    record = make_record("ensemble", {"members": arguments.members, "batch_size": arguments.batch_size,
                                      "repeats": arguments.repeats, "runs": runs}, argv)
    publish(arguments.record, record, record_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
