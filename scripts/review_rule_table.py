"""The review rule's threshold chosen on out-of-fold patients, and its trade-off table (docs/results.md,
"The review rule: written before its numbers").

    python -m scripts.review_rule_table --bundle acdc_ce_dice --data "$CALIBSEG_ACDC" \
        --fold-bundles runs/folds/ce_dice-seed0-fold*/model.calibseg \
        --record docs/records/history/review_rule_acdc_ce_dice.json

The fold networks (the bundle's method, folds of its training patients) predict their own validation
patients (:func:`Training.fit_quality.fold_observations`); each structure's predicted Dice there comes from
a quality model fitted without that patient (:func:`CalibSegLib.quality.held_out_predictions`). For every
threshold of :data:`THRESHOLDS` the table counts the structures it flags (predicted Dice below it, or
predicted nowhere) among the poor ones and among the good ones; the rule itself
(:mod:`CalibSegLib.quality.review_rule`, which ``calibseg-ensemble`` applies too) picks the smallest that flags
its target share of the poor ones. Research only: it reads ACDC from ``--data``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from CalibSegLib.bundle import load_bundle
from CalibSegLib.io import recorded_path, write_json_atomic
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.quality import held_out_predictions
from CalibSegLib.quality.review_rule import (GOOD_ABOVE, POOR_BELOW, TARGET_RECALL, THRESHOLDS,
                                             choose_review_threshold, trade_off)
from Training.fit_quality import fold_observations

__all__ = ["main"]

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
    chosen = choose_review_threshold(rows)
    at_rule = THRESHOLDS.index(chosen["review_below"])
    per_structure = {name: trade_off(predicted[:, index], measured[:, index])[at_rule]
                     for index, name in enumerate(metadata.class_names[1:])}
    print(f"{len(observations)} out-of-fold volumes of {len({item.patient for item in observations})} patients, "
          f"{len(arguments.fold_bundles)} fold networks")
    print("\n".join(_markdown(rows, chosen)))
    print(f"rule: review below {chosen['review_below']:.2f}")
    for name, row in per_structure.items():
        print(f"  {name}: {row['poor_flagged']} / {row['poor']} poor flagged, "
              f"{row['good_flagged']} / {row['good']} good")
    if arguments.record is not None:
        write_json_atomic(arguments.record, {
            "bundle": recorded_path(arguments.bundle),
            "fold_networks": [recorded_path(path) for path in arguments.fold_bundles],
            "volumes": len(observations), "patients": len({item.patient for item in observations}),
            "rule": {"poor_below": POOR_BELOW, "good_above": GOOD_ABOVE, "target_recall": TARGET_RECALL},
            "chosen": chosen, "table": rows, "per_structure": per_structure,
            "held_out": [{"patient": item.patient, "predicted": list(map(float, row)),
                          "measured": list(map(float, item.dice))}
                         for item, row in zip(observations, predicted)]})
    return 0


if __name__ == "__main__":
    main()
