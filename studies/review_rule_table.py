"""The review rule's trade-off table on an ensemble's out-of-fold patients (docs/results.md, "The review rule:
written before its numbers"). Read from the store.

    python -m studies.review_rule_table --bundle acdc_crac --store store --record PATH

Each out-of-fold volume is predicted by the member that never trained on its patient (the store's ``out_of_fold``
records) and its structures' predicted Dice come from a quality model fitted without that patient
(:func:`studies.store_study.held_out`). For every threshold of :data:`THRESHOLDS` the table counts the structures it
flags (predicted Dice below it, or predicted nowhere) among the poor ones and among the good ones; the rule's pooled
threshold (:func:`CalibSegLib.quality.review_rule.choose_review_threshold`, the one ``calibseg-fit`` starts from) is
the smallest that flags its target share of the poor ones, and each structure's row at it follows. The records in
``docs/records/history/review_rule_*.json`` were made by the former ``scripts.review_rule_table`` from the fold
networks of 10-epoch runs, which predicted their validation patients themselves.
"""

from __future__ import annotations

from typing import Any, Sequence

from CalibSegLib.io import write_json_atomic
from CalibSegLib.quality.review_rule import (GOOD_ABOVE, POOR_BELOW, TARGET_RECALL, THRESHOLDS,
                                             choose_review_threshold, trade_off)
from studies.store_study import held_out_study, study_arguments

__all__ = ["markdown", "main"]


def markdown(rows: Sequence[dict[str, Any]], chosen: dict[str, Any]) -> list[str]:
    """The trade-off table, one row per threshold, the rule's marked."""
    lines = ["| review below | poor flagged / poor | recall | good flagged / good | false-flag share | all flagged |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        mark = " **(rule)**" if row["review_below"] == chosen["review_below"] else ""
        lines.append(f"| {row['review_below']:.2f}{mark} | {row['poor_flagged']} / {row['poor']} | {row['recall']:.0%} "
                     f"| {row['good_flagged']} / {row['good']} | {row['false_flag_share']:.0%} "
                     f"| {row['flagged_share']:.0%} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the table and the rule's threshold; writes the record with ``--record``. Returns 0; bad input exits
    with one sentence."""
    arguments = study_arguments("python -m studies.review_rule_table", __doc__.split("\n\n")[0], argv)
    bundle, _, held = held_out_study(arguments)
    metadata = bundle.metadata
    rows = trade_off(held.predicted, held.measured)
    chosen = choose_review_threshold(rows)
    at_rule = THRESHOLDS.index(chosen["review_below"])
    per_structure = {name: trade_off(held.predicted[:, index], held.measured[:, index])[at_rule]
                     for index, name in enumerate(metadata.class_names[1:])}
    print(f"{len(held.observations)} out-of-fold volumes of {len(set(held.patients))} patients")
    print("\n".join(markdown(rows, chosen)))
    print(f"rule: review below {chosen['review_below']:.2f}")
    for name, row in per_structure.items():
        print(f"  {name}: {row['poor_flagged']} / {row['poor']} poor flagged, "
              f"{row['good_flagged']} / {row['good']} good")
    if arguments.record is not None:
        write_json_atomic(arguments.record, {
            "bundle": arguments.bundle, "weights_sha256": metadata.weights_sha256,
            "command": f"python -m studies.review_rule_table --bundle {arguments.bundle} --store <store> --record "
                       f"{arguments.record}",
            "volumes": len(held.observations), "patients": len(set(held.patients)),
            "rule": {"poor_below": POOR_BELOW, "good_above": GOOD_ABOVE, "target_recall": TARGET_RECALL},
            "chosen": chosen, "table": rows, "per_structure": per_structure,
            "held_out": [{"patient": item.patient, "predicted": list(map(float, predicted)),
                          "measured": list(map(float, item.dice))}
                         for item, predicted in zip(held.observations, held.predicted)]})
        print(f"record: {arguments.record}")
    return 0


if __name__ == "__main__":
    main()
