"""3D evaluation of a model bundle on the test patients of a split.

    python Training/evaluate.py --bundle runs/crac/model.calibseg [--data SampleData/ACDC] [--split test] [--out DIR]

Writes into ``--out`` (default: ``evaluation/`` beside the bundle), atomically:
- ``per_case.csv``: one row per case and temperature variant: Dice/HD95/ASD per class (mm),
  ECE, MCE, CECE, TACE, Brier, NLL (reference foreground), error-detection AUROC and AURC of
  the per-voxel confidence, mean normalised entropy in the predicted foreground;
- ``summary.json``: per variant, mean/std/undefined count of every column, pooled
  calibration over all cases, and the Spearman correlation between per-case mean
  foreground entropy and Dice (does uncertainty flag bad cases?);
- ``reliability.png`` (bundle temperature) and ``reliability_uncalibrated.png`` (T = 1).

Variants: ``scaled`` uses the bundle's fitted temperature, ``uncalibrated`` T = 1 (before/after
temperature scaling).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import math
import sys
from pathlib import Path
from typing import Sequence

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from scipy.stats import spearmanr

from CalibSegLib.bundle import Bundle, BundleError, load_bundle
from CalibSegLib.evaluation import case_metrics_row, predict_and_evaluate
from CalibSegLib.inference import Predictor
from CalibSegLib.metrics import summarize
from CalibSegLib.metrics.calibration import CalibrationStatistics
from CalibSegLib.metrics.plots import reliability_figure
from CalibSegLib.predict import write_json_atomic
from Training.data import Case, DataError, find_cases, load_cases
from Training.splits import load_split, select_patients

__all__ = ["evaluate_bundle", "main"]


def _write_text_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.replace(path)


def _save_figure_atomic(figure, path: Path) -> None:
    temporary = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(temporary, bbox_inches="tight")
    temporary.replace(path)


def _variant_bundles(bundle: Bundle) -> dict[str, Bundle]:
    uncalibrated = dataclasses.replace(bundle, metadata=dataclasses.replace(bundle.metadata, temperature=1.0))
    return {"scaled": bundle, "uncalibrated": uncalibrated}


def evaluate_bundle(
    bundle: Bundle, cases: Sequence[Case], out_dir: str | Path, device: str = "auto", batch_size: int = 16,
) -> dict:
    """Evaluate ``bundle`` on ``cases`` (3D) and write CSV, JSON and PNGs into ``out_dir``; returns the summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = bundle.metadata.class_names
    rows: list[dict] = []
    summary: dict = {"cases": [case.case_id for case in cases], "bundle": str(bundle.path or ""),
                     "temperature": bundle.metadata.temperature}
    for variant, variant_bundle in _variant_bundles(bundle).items():
        predictor = Predictor(variant_bundle, device=device, batch_size=batch_size)
        pooled = CalibrationStatistics(bundle.metadata.num_classes)
        variant_rows = []
        for case in cases:
            evaluation = predict_and_evaluate(predictor, case.image, case.label.astype(np.int64), case.spacing)
            pooled.merge(evaluation.statistics)
            variant_rows.append({"case": case.case_id, "variant": variant, **case_metrics_row(evaluation, names)})
        rows += variant_rows
        columns = [key for key in variant_rows[0] if key not in ("case", "variant")]
        entropy = [row["mean_foreground_entropy"] for row in variant_rows]
        dice_mean = [row["dice_mean"] for row in variant_rows]
        defined = [(e, d) for e, d in zip(entropy, dice_mean) if not (math.isnan(e) or math.isnan(d))]
        correlation = float(spearmanr(*zip(*defined)).statistic) if len(defined) >= 3 else float("nan")
        summary[variant] = {
            "per_metric": {column: summarize([row[column] for row in variant_rows]) for column in columns},
            "pooled_calibration": pooled.metrics(),
            "spearman_entropy_vs_dice": correlation,
        }
        title = "T = {:.2f}".format(variant_bundle.metadata.temperature) if variant == "scaled" else "T = 1"
        figure = reliability_figure(pooled.reliability(), title=f"Reliability, {title}", ece=pooled.ece())
        _save_figure_atomic(figure, out_dir / ("reliability.png" if variant == "scaled" else "reliability_uncalibrated.png"))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    _write_text_atomic(out_dir / "per_case.csv", buffer.getvalue())
    write_json_atomic(out_dir / "summary.json", summary)
    return summary


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python Training/evaluate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, type=Path)
    parser.add_argument("--data", type=Path, default=None, help="data folder (default: the one recorded in the bundle)")
    parser.add_argument("--split-file", type=Path, default=None, help="split JSON (default: the bundle's)")
    parser.add_argument("--split", default="test", choices=("train", "val", "test"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=16)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    try:
        bundle = load_bundle(arguments.bundle)
        recorded = bundle.metadata.data
        data = arguments.data or Path(recorded.get("folder", ""))
        split_file = arguments.split_file or Path(recorded.get("split_file", ""))
        files = select_patients(find_cases(data), load_split(split_file)[arguments.split])
        cases = load_cases(files, bundle.metadata.num_classes)
        out = arguments.out or arguments.bundle.parent / "evaluation"
        summary = evaluate_bundle(bundle, cases, out, arguments.device, arguments.batch_size)
    except (BundleError, DataError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    scaled = summary["scaled"]["per_metric"]
    print(f"{len(cases)} {arguments.split} cases: Dice {scaled['dice_mean']['mean']:.3f}  "
          f"HD95 {scaled['hd95_mean']['mean']:.2f} mm  ECE {scaled['ece']['mean']:.3f}  TACE {scaled['tace']['mean']:.3f}")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
