"""The review rule's threshold chosen on out-of-fold patients, and its trade-off table (docs/results.md,
"The review rule: written before its numbers").

    python -m scripts.review_rule_table --bundle acdc_ce_dice --data "$CALIBSEG_ACDC" \
        --fold-bundles runs/folds/ce_dice-seed0-fold*/model.calibseg --record docs/records/review_rule_acdc_ce_dice.json

The fold networks (the bundle's method, folds of its training patients) predict their own validation
patients (:func:`Training.fit_quality.fold_observations`); each structure's predicted Dice there comes from
a quality model fitted without that patient (:func:`CalibSegLib.quality.held_out_predictions`). For every
threshold of :data:`THRESHOLDS` the table counts the structures it flags (predicted Dice below it, or
predicted nowhere) among the poor ones (measured Dice below :data:`POOR_BELOW`) and among the good ones
(above :data:`GOOD_ABOVE`); the chosen threshold is the smallest that flags :data:`TARGET_RECALL` of the
poor ones (the largest when none does). Research only: it reads ACDC from ``--data``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from CalibSegLib.bundle import load_bundle
from CalibSegLib.io import write_json_atomic
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.quality import held_out_predictions
from Evaluation.quality_report import GOOD_ABOVE, POOR_BELOW
from Training.fit_quality import fold_observations

__all__ = ["THRESHOLDS", "TARGET_RECALL", "trade_off", "choose", "main"]

THRESHOLDS: tuple[float, ...] = tuple(round(0.80 + 0.01 * step, 2) for step in range(16))  # 0.80 ... 0.95
TARGET_RECALL = 0.80


def trade_off(predicted: np.ndarray, measured: np.ndarray) -> list[dict[str, Any]]:
    """One row per threshold of :data:`THRESHOLDS` over ``predicted`` and ``measured`` Dice (same shape; NaN
    predicted = predicted nowhere, always flagged): counts and shares of poor and good structures flagged."""
    predicted, measured = predicted.ravel(), measured.ravel()
    poor, good = measured < POOR_BELOW, measured > GOOD_ABOVE
    rows = []
    for threshold in THRESHOLDS:
        flagged = np.isnan(predicted) | (np.nan_to_num(predicted, nan=0.0) < threshold)
        rows.append({"review_below": threshold, "poor": int(poor.sum()), "poor_flagged": int((flagged & poor).sum()),
                     "recall": float((flagged & poor).sum() / max(poor.sum(), 1)), "good": int(good.sum()),
                     "good_flagged": int((flagged & good).sum()),
                     "false_flag_share": float((flagged & good).sum() / max(good.sum(), 1)),
                     "flagged_share": float(flagged.mean())})
    return rows


def choose(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rule's row: the smallest threshold whose recall reaches :data:`TARGET_RECALL`, else the largest."""
    return next((row for row in rows if row["recall"] >= TARGET_RECALL), rows[-1])


def _markdown(rows: Sequence[dict[str, Any]], chosen: dict[str, Any]) -> list[str]:
    lines = ["| review below | poor flagged / poor | recall | good flagged / good | false-flag share | all flagged |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        mark = " **(rule)**" if row is chosen else ""
        lines.append(f"| {row['review_below']:.2f}{mark} | {row['poor_flagged']} / {row['poor']} | {row['recall']:.0%} "
                     f"| {row['good_flagged']} / {row['good']} | {row['false_flag_share']:.0%} "
                     f"| {row['flagged_share']:.0%} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.review_rule_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, help="the model whose rule is chosen (file or shipped name)")
    parser.add_argument("--fold-bundles", nargs="+", required=True, metavar="BUNDLE")
    parser.add_argument("--data", type=Path, default=None, help="the data folder (default: the bundle's dataset)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--record", type=Path, default=None, help="write the table and the choice as JSON here")
    arguments = parser.parse_args(argv)
    metadata = load_bundle(resolve_bundle_path(arguments.bundle)).metadata
    observations = fold_observations(arguments.fold_bundles, metadata, arguments.data, arguments.device)
    predicted = held_out_predictions(observations, metadata.class_names)
    measured = np.array([item.dice for item in observations])
    rows = trade_off(predicted, measured)
    chosen = choose(rows)
    at_rule = THRESHOLDS.index(chosen["review_below"])
    per_structure = {name: trade_off(predicted[:, index], measured[:, index])[at_rule]
                     for index, name in enumerate(metadata.class_names[1:])}
    print(f"{len(observations)} out-of-fold volumes of {len({item.patient for item in observations})} patients, "
          f"{len(arguments.fold_bundles)} fold networks")
    print("\n".join(_markdown(rows, chosen)))
    print(f"rule: review below {chosen['review_below']:.2f}")
    for name, row in per_structure.items():
        print(f"  {name}: {row['poor_flagged']} / {row['poor']} poor flagged, {row['good_flagged']} / {row['good']} good")
    if arguments.record is not None:
        write_json_atomic(arguments.record, {
            "bundle": str(arguments.bundle), "fold_networks": [str(path) for path in arguments.fold_bundles],
            "volumes": len(observations), "patients": len({item.patient for item in observations}),
            "rule": {"poor_below": POOR_BELOW, "good_above": GOOD_ABOVE, "target_recall": TARGET_RECALL},
            "chosen": chosen, "table": rows, "per_structure": per_structure,
            "held_out": [{"patient": item.patient, "predicted": list(map(float, row)), "measured": list(map(float, item.dice))}
                         for item, row in zip(observations, predicted)]})
    return 0


if __name__ == "__main__":
    main()
