"""Ship trained runs as ready-to-use models: float16 bundles plus the metrics of that very file.

    calibseg-ship --runs runs/acdc/ce_dice runs/acdc/nacl runs/acdc/crac --prefix acdc
    calibseg-ship --runs runs/cv/ce_dice runs/cv/crac --prefix acdc     # cross-validations: their ensembles
    calibseg-ship --rerecord acdc_ce_dice --bundle runs/acdc_ce_dice/acdc_ce_dice.calibseg   # metadata or members
    calibseg-ship --rerecord acdc_nacl --bundle runs/acdc_nacl/acdc_nacl.calibseg --store store  # quality model

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

A cross-validation folder (``calibseg-train --fold all``) ships its ensemble (``calibseg-ensemble``'s
``ensemble.calibseg``), and its metrics JSON also records what was measured out of fold: the ensemble's out-of-fold
choices and quality check (``ensemble.json``) and the folds' out-of-fold summary with its intervals
(``crossval/summary.json``).

A re-record whose bundle differs from the shipped one only in its quality model (and function intervals, which the
metrics do not measure) reads the store with ``--store`` instead of running the networks: every metric row stays as
measured, and the quality columns and the quality section are measured again from the stored member features of the
test volumes and their degraded copies (:mod:`Evaluation.stored_quality`), in seconds. The store's own measured Dice
must equal the recorded rows', so a store of other predictions is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from CalibSegLib.bundle import BUNDLE_SUFFIX, Bundle, BundleError, load_bundle
from CalibSegLib.io import recorded_path, write_json_atomic
from CalibSegLib.metrics import summarize
from CalibSegLib.pretrained import METRICS_SUFFIX, PRETRAINED_DIR
from Datasets.dataset_names import data_folder, recorded_dataset
from Datasets.errors import DataError
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Datasets.splits import recorded_split, select_patients
from Evaluation.evaluate import evaluate_bundle
from Evaluation.quality_report import DEGRADATIONS
from Evaluation.crossval import CROSSVAL_DIR
from Evaluation.stored_quality import stored_quality
from Evaluation.summary import EVALUATION_DIR, SUMMARY_NAME, VARIANTS
from Training.bundle_rewrite import rewrite_bundle
from Training.ensemble import ENSEMBLE_NAME, ENSEMBLE_RECORD
from Training.records import BUNDLE_NAME

__all__ = ["ROW_SECTIONS", "ship_run", "rerecord", "main"]

# What a bundle's metric rows depend on beyond its quality model: a re-record from the store keeps the rows, so these
# must be the shipped bundle's.
ROW_SECTIONS = ("network", "network_kwargs", "in_channels", "num_classes", "spatial_dims", "class_names",
                "preprocessing", "sliding_window", "postprocessing", "temperature", "input_statistics",
                "ensemble_size", "weights_sha256")


def _per_case(rows: dict[str, list[dict]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{variant: {case: {metric: value}}}`` from :attr:`EvaluationResult.per_case`."""
    return {variant: {row["case"]: {key: float(value) for key, value in row.items() if key != "case"}
                      for row in variant_rows} for variant, variant_rows in rows.items()}


def _shipped_metrics(shipped: Bundle, name: str, source_run: str, cases: list, staging: Path, device: str) -> dict:
    """Evaluate the staged float16 file ``shipped`` on ``cases`` into ``staging/evaluation`` (clean and degraded:
    the results page reports the quality check on degraded copies too) and return its metrics record."""
    evaluation = evaluate_bundle(shipped, cases, staging / "evaluation", device, degradations=tuple(DEGRADATIONS))
    summary = evaluation.summary
    return {
        "model": name,
        "source_run": source_run,
        "method": shipped.metadata.training.get("method"),
        "weights_dtype": shipped.metadata.weights_dtype,
        "temperature": shipped.metadata.temperature,
        "data": recorded_dataset(shipped.metadata.data),
        "cases": summary.cases,
        "environment": summary.environment,
        "summary": {variant: {key: statistics["mean"]
                              for key, statistics in summary.variants[variant].per_metric.items()}
                    for variant in VARIANTS},
        "spearman_entropy_vs_dice": {variant: summary.variants[variant].spearman_entropy_vs_dice
                                     for variant in VARIANTS},
        "quality": summary.quality,
        "per_case": _per_case(evaluation.per_case),
        "case_patients": evaluation.summary.case_patients,
    }


def _test_cases(bundle: Bundle, data: str | Path | None) -> list:
    recorded = bundle.metadata.data
    files = select_patients(find_cases(data_folder(recorded, data)), recorded_split(recorded)["test"])
    return load_cases(files, bundle.metadata.num_classes)


def _out_of_fold_record(cross_validation: Path) -> dict:
    """What a cross-validation measured out of fold: ``ensemble.json`` and ``crossval/summary.json``.

    Raises:
        ValueError: either is missing (one sentence saying which command writes it).
    """
    ensemble, summary = cross_validation / ENSEMBLE_RECORD, cross_validation / CROSSVAL_DIR / SUMMARY_NAME
    for path, command in ((ensemble, "calibseg-ensemble"), (summary, "calibseg-crossval")):
        if not path.is_file():
            raise ValueError(f"{path} is missing; run {command} {cross_validation} before shipping its ensemble.")
    return {"ensemble": json.loads(ensemble.read_text()), "summary": json.loads(summary.read_text())}


def ship_run(run_dir: str | Path, prefix: str, out_dir: str | Path, data: str | Path | None = None,
             device: str = "auto") -> tuple[Path, Path]:
    """Ship one run (or a cross-validation folder's ensemble) as ``<out_dir>/<prefix>_<method>.calibseg``
    (float16) with its metrics JSON; returns both paths.

    Raises:
        BundleError, DataError, ValueError: unreadable run, data or split (one sentence each).
    """
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    ensemble = (run_dir / ENSEMBLE_NAME).is_file()
    out_of_fold = _out_of_fold_record(run_dir) if ensemble else None
    bundle = load_bundle(run_dir / (ENSEMBLE_NAME if ensemble else BUNDLE_NAME))
    name = f"{prefix}_{bundle.metadata.training.get('method', run_dir.name)}"
    cases = _test_cases(bundle, data)
    out_dir.mkdir(parents=True, exist_ok=True)
    bundle_path, metrics_path = out_dir / f"{name}{BUNDLE_SUFFIX}", out_dir / f"{name}{METRICS_SUFFIX}"
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=f".{name}-") as staging:
        staged = rewrite_bundle(bundle, bundle.metadata, Path(staging) / bundle_path.name, half=True)
        metrics = _shipped_metrics(load_bundle(staged), name, recorded_path(run_dir), cases, Path(staging), device)
        if out_of_fold is not None:
            metrics["out_of_fold"] = out_of_fold
        os.replace(staged, bundle_path)
        _replace_folder(Path(staging) / "evaluation", run_dir / EVALUATION_DIR)
    write_json_atomic(metrics_path, metrics)
    return bundle_path, metrics_path


def rerecord(name: str, bundle: str | Path | None = None, out_dir: str | Path = PRETRAINED_DIR,
             data: str | Path | None = None, device: str = "auto",
             store: str | Path | None = None) -> tuple[Path, Path]:
    """Re-ship the shipped model ``name`` after a change to its metadata or members: ``bundle`` (a rewrite of it
    with the same weights, e.g. by ``calibseg-fit-quality --keep-fit``, or some of its members,
    ``python -m Training.sub_ensemble``; default the shipped file itself) replaces the shipped file in ``out_dir``
    and its metrics JSON is measured again; the run it came from and what its folds measured stay recorded. With
    ``store``, only the quality model may differ, and its columns are measured from the store (module docstring).

    Raises:
        BundleError, DataError, ValueError: an unknown name, a bundle with other weights, a sub-ensemble keeping
            members the shipped ensemble lacks, missing data.
    """
    out_dir = Path(out_dir)
    bundle_path, metrics_path = out_dir / f"{name}{BUNDLE_SUFFIX}", out_dir / f"{name}{METRICS_SUFFIX}"
    if not bundle_path.is_file() or not metrics_path.is_file():
        raise ValueError(f"{name} is not a shipped model in {out_dir}; give the name of one with its metrics JSON.")
    shipped = load_bundle(bundle_path)
    replacement = load_bundle(bundle if bundle is not None else bundle_path)
    if shipped.metadata.weights_sha256 not in (replacement.metadata.weights_sha256,
                                               replacement.metadata.out_of_fold_weights_sha256):
        raise ValueError(f"{bundle} holds other weights than the shipped {name} and is no sub-ensemble of it; ship a "
                         "new run with --runs instead.")
    origin, size = replacement.metadata.selected_from, shipped.metadata.ensemble_size
    # The checksum says which ensemble it came from, not that the member numbers it records are that ensemble's.
    if origin is not None and origin.weights_sha256 == shipped.metadata.weights_sha256 and max(origin.members) >= size:
        raise ValueError(f"{bundle} records keeping members {' '.join(map(str, origin.members))} of the shipped "
                         f"{name}, which holds members 0 to {size - 1}; make it again with python -m "
                         f"Training.sub_ensemble {name}.")
    previous = json.loads(metrics_path.read_text())
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=f".{name}-") as staging:
        staged = rewrite_bundle(replacement, replacement.metadata, Path(staging) / bundle_path.name, half=True)
        if store is not None:
            metrics = _requalified(previous, shipped, load_bundle(staged), store)
        else:
            metrics = _shipped_metrics(load_bundle(staged), name, previous.get("source_run", ""),
                                       _test_cases(replacement, data), Path(staging), device)
            if "out_of_fold" in previous:  # what the folds measured does not change with the metadata
                metrics["out_of_fold"] = previous["out_of_fold"]
        os.replace(staged, bundle_path)
    write_json_atomic(metrics_path, metrics)
    return bundle_path, metrics_path


def _requalified(previous: dict, shipped: Bundle, replacement: Bundle, store: str | Path) -> dict:
    """The metrics record ``previous`` of ``shipped`` with the quality columns of its test rows, their means and
    its quality section measured again for ``replacement``'s quality model from ``store`` (module docstring).

    Raises:
        ValueError, StoreError: a section that moves the rows changed, or the store lacks a record or holds other
            predictions than the recorded rows (one sentence each).
    """
    changed = [section for section in ROW_SECTIONS
               if getattr(shipped.metadata, section) != getattr(replacement.metadata, section)]
    if changed:
        raise ValueError(f"The bundle changes {', '.join(changed)}, which the recorded metric rows depend on; "
                         "re-record it with its networks (without --store), or refit the quality model alone "
                         "(calibseg-fit --sections quality_model).")
    cases = previous["cases"]
    rows, quality = stored_quality(replacement.metadata, str(store), cases,
                                   [previous["case_patients"][case] for case in cases])
    recorded = previous["per_case"]["scaled"]
    for case, row in zip(cases, rows):
        moved = [key for key, value in row.items() if key.startswith("dice_")
                 and not math.isclose(value, recorded[case][key], rel_tol=0.0, abs_tol=1e-9)
                 and not (math.isnan(value) and math.isnan(recorded[case][key]))]
        if moved:
            raise ValueError(f"The store's ensemble measures another {moved[0]} on {case} than the recorded "
                             f"metrics; it holds other predictions, so fill a store for this bundle with "
                             "calibseg-store.")
    scaled = {case: {key: row.get(key, value) for key, value in recorded[case].items()}
              for case, row in zip(cases, rows)}
    columns = next(iter(scaled.values())).keys()
    return {**previous, "per_case": {**previous["per_case"], "scaled": scaled},
            "summary": {**previous["summary"], "scaled": {column: summarize([row[column] for row in scaled.values()])
                                                          ["mean"] for column in columns}},
            "quality": quality, "quality_measured_from": "store"}


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
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--runs", nargs="+", type=Path, metavar="RUN_DIR", help="finished run folders")
    source.add_argument("--rerecord", metavar="NAME",
                        help="a shipped model whose metadata or members changed: replace it by --bundle (same "
                             "weights, or a sub-ensemble of them) and measure its metrics again")
    parser.add_argument("--bundle", type=Path, default=None,
                        help="with --rerecord: the rewritten bundle or the sub-ensemble")
    parser.add_argument("--store", type=Path, default=None,
                        help="with --rerecord: a bundle whose quality model alone changed is measured from this store "
                             "(calibseg-store --part test and --part degraded) instead of its networks")
    parser.add_argument("--prefix", default="acdc", help="model names are <prefix>_<method> (default acdc)")
    parser.add_argument("--out", type=Path, default=PRETRAINED_DIR, help=f"default {PRETRAINED_DIR}")
    parser.add_argument("--data", type=Path, default=None,
                        help="data folder (default: found from the dataset each bundle records)")
    parser.add_argument("--device", default="auto")
    arguments = parser.parse_args(argv)
    if arguments.store is not None and not arguments.rerecord:
        parser.error("--store measures a re-record (--rerecord NAME); a new run is shipped with its networks")
    def ship_each():  # yields as it ships, so each shipped file is printed even when a later one fails
        if arguments.rerecord:
            yield rerecord(arguments.rerecord, arguments.bundle, arguments.out, arguments.data, arguments.device,
                           arguments.store)
        for run_dir in arguments.runs or ():
            yield ship_run(run_dir, arguments.prefix, arguments.out, arguments.data, arguments.device)

    try:
        for bundle_path, metrics_path in ship_each():
            print(f"{bundle_path} ({bundle_path.stat().st_size / 1e6:.1f} MB, float16); metrics: {metrics_path}")
    except (BundleError, DataError, ValueError, OSError) as error:
        raise SystemExit(f"error: {error}") from None
    return 0


if __name__ == "__main__":
    main()
