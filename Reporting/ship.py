"""Ship trained runs as ready-to-use models: float16 bundles plus the metrics of that very file.

    calibseg-ship --runs runs/acdc/ce_dice runs/acdc/nacl runs/acdc/crac --prefix acdc

For every run, its bundle is re-saved with float16 weights as ``<out>/<prefix>_<method>.calibseg``
(default ``--out``: :data:`CalibSegLib.pretrained.PRETRAINED_DIR`) and that float16 file is
evaluated in 3D on the test patients of its split, so the recorded numbers are the shipped
model's own, not the float32 run's. ``<prefix>_<method>.metrics.json`` beside it holds every test
case's metric row for both temperature variants, their summary, the run it came from, the
dataset's name and the machine. Shipping is the one tool that writes into the package folder,
on purpose; ``Reporting/readme_tables.py`` then regenerates README.md's table of shipped models.
The float16 file's evaluation (summary.json, per_case.csv, reliability diagrams) also replaces
the run folder's ``evaluation/``, so the results page (``calibseg-results``) reports the shipped
model itself. Everything is written under temporary names and renamed only when the evaluation
succeeded, so a failed ship leaves any earlier model and evaluation in place.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from CalibSegLib.bundle import BUNDLE_SUFFIX, BundleError, load_bundle, save_bundle
from CalibSegLib.io import write_json_atomic
from CalibSegLib.pretrained import METRICS_SUFFIX, PRETRAINED_DIR
from Datasets.cases import DataError, data_folder, find_cases, load_cases, recorded_dataset
from Datasets.splits import recorded_split, select_patients
from Evaluation.evaluate import evaluate_bundle
from Evaluation.quality_report import DEGRADATIONS
from Evaluation.summary import EVALUATION_DIR, VARIANTS
from Training.records import BUNDLE_NAME

__all__ = ["ship_run", "main"]


def _per_case(rows: dict[str, list[dict]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{variant: {case: {metric: value}}}`` from :attr:`EvaluationResult.per_case`."""
    return {variant: {row["case"]: {key: float(value) for key, value in row.items() if key != "case"}
                      for row in variant_rows} for variant, variant_rows in rows.items()}


def ship_run(run_dir: str | Path, prefix: str, out_dir: str | Path, data: str | Path | None = None,
             device: str = "auto") -> tuple[Path, Path]:
    """Ship one run as ``<out_dir>/<prefix>_<method>.calibseg`` (float16) with its metrics JSON; returns both paths.

    Raises:
        BundleError, DataError, ValueError: unreadable run, data or split (one sentence each).
    """
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    bundle = load_bundle(run_dir / BUNDLE_NAME)
    name = f"{prefix}_{bundle.metadata.training.get('method', run_dir.name)}"
    recorded = bundle.metadata.data
    files = select_patients(find_cases(data_folder(recorded, data)), recorded_split(recorded)["test"])
    cases = load_cases(files, bundle.metadata.num_classes)
    out_dir.mkdir(parents=True, exist_ok=True)
    bundle_path, metrics_path = out_dir / f"{name}{BUNDLE_SUFFIX}", out_dir / f"{name}{METRICS_SUFFIX}"
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=f".{name}-") as staging:
        staged = save_bundle(Path(staging) / bundle_path.name, bundle.state_dict, bundle.metadata, half=True)
        shipped = load_bundle(staged)
        # The results page reports the quality check on degraded copies too: the shipped record measures them.
        evaluation = evaluate_bundle(shipped, cases, Path(staging) / "evaluation", device,
                                     degradations=tuple(DEGRADATIONS))
        summary = evaluation.summary
        metrics = {
            "model": name,
            "source_run": str(run_dir),
            "method": shipped.metadata.training.get("method"),
            "weights_dtype": shipped.metadata.weights_dtype,
            "temperature": shipped.metadata.temperature,
            "data": recorded_dataset(recorded),
            "cases": summary.cases,
            "environment": summary.environment,
            "summary": {variant: {key: statistics["mean"] for key, statistics in summary.variants[variant].per_metric.items()}
                        for variant in VARIANTS},
            "spearman_entropy_vs_dice": {variant: summary.variants[variant].spearman_entropy_vs_dice
                                         for variant in VARIANTS},
            "quality": summary.quality,
            "per_case": _per_case(evaluation.per_case),
        }
        os.replace(staged, bundle_path)
        _replace_folder(Path(staging) / "evaluation", run_dir / EVALUATION_DIR)
    write_json_atomic(metrics_path, metrics)
    return bundle_path, metrics_path


def _replace_folder(new: Path, destination: Path) -> None:
    """Put ``new`` in place of ``destination`` with renames only (the old folder is removed last)."""
    retired = destination.with_name(f".{destination.name}.replaced")
    shutil.rmtree(retired, ignore_errors=True)
    if destination.exists():
        os.replace(destination, retired)
    os.replace(new, destination)
    shutil.rmtree(retired, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibseg-ship`` command: prints each shipped file; returns the exit status 0. Bad input
    exits with one sentence, no traceback."""
    parser = argparse.ArgumentParser(prog="calibseg-ship", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", type=Path, required=True, metavar="RUN_DIR", help="finished run folders")
    parser.add_argument("--prefix", default="acdc", help="model names are <prefix>_<method> (default acdc)")
    parser.add_argument("--out", type=Path, default=PRETRAINED_DIR, help=f"default {PRETRAINED_DIR}")
    parser.add_argument("--data", type=Path, default=None,
                        help="data folder (default: found from the dataset each bundle records)")
    parser.add_argument("--device", default="auto")
    arguments = parser.parse_args(argv)
    shipped = []
    try:
        for run_dir in arguments.runs:
            bundle_path, metrics_path = ship_run(run_dir, arguments.prefix, arguments.out, arguments.data,
                                                 arguments.device)
            print(f"{bundle_path} ({bundle_path.stat().st_size / 1e6:.1f} MB, float16); metrics: {metrics_path}")
            shipped.append(bundle_path)
    except (BundleError, DataError, ValueError, OSError) as error:
        raise SystemExit(f"error: {error}") from None
    return 0


if __name__ == "__main__":
    main()
