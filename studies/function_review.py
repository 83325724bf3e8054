"""Which review mark on the function catches the patients whose LV ejection fraction is off? Read from the store.

    python -m studies.function_review --bundle acdc_crac --store store \
        --record docs/records/function_review/acdc_crac_store.json

Per patient, out of fold (by the member that never trained on it, each volume's predicted Dice from the quality
model fitted without its patient: :func:`Evaluation.function_intervals.stored_records`) and on the test patients
(the shipped ensemble, the members' predicted Dice averaged), the bundle's interval rule gives the LV EF and its
interval. Three marks:

- ``lv_flagged``: the LV flagged for review at ED or ES (what ``function.json``'s review list holds today);
- ``any_flagged``: any of the three structures flagged at ED or ES;
- ``lv_flagged_or_wide``: ``lv_flagged``, or the LV EF interval wider than a limit chosen out of fold: the largest
  width at which at least 90 % of the out-of-fold patients off by more than 8 points are marked.

Each mark's share among patients off by more than 8 points and among those within 3, with Clopper-Pearson 95 %
intervals (:func:`studies.function_review_mark.marked_share`).
"""

from __future__ import annotations

import datetime
import math
from typing import Any, Sequence

from CalibSegLib.bundle import BundleMetadata
from CalibSegLib.cardiac.indices import STRUCTURES, PhaseVolumes, cardiac_classes
from CalibSegLib.cardiac.intervals import rule_indices
from CalibSegLib.interval_rule import IntervalRule
from CalibSegLib.io import write_json_atomic
from CalibSegLib.quality.review_rule import flagged
from Datasets.splits.make_splits import group_of
from Evaluation.function_intervals import patient_volumes
from studies.function_review_mark import OFF_ABOVE, WITHIN, marked_share
from studies.store_study import function_study, study_arguments

__all__ = ["TARGET_RECALL", "patient_row", "wide_limit", "mark_summary", "main"]

TARGET_RECALL = 0.9  # of the patients off by more than OFF_ABOVE points, as issue targets ask of the mark


def _flagged(metadata: BundleMetadata, phases: tuple[PhaseVolumes, PhaseVolumes], structures: Sequence[str]) -> bool:
    classes = cardiac_classes(metadata.class_names, metadata.class_terminology)
    model = metadata.quality
    return any(bool(flagged(phase.structure(structure).predicted_dice,
                            model.review_threshold(metadata.class_names[classes.index(structure)])))
               for structure in structures for phase in phases)


def patient_row(metadata: BundleMetadata, rule: IntervalRule, patient: str, reference: dict[str, float],
                phases: tuple[PhaseVolumes, PhaseVolumes], part: str) -> dict[str, Any]:
    """One patient's LV EF error and interval width under ``rule``, and whether the LV or any structure is flagged."""
    values, scales = rule_indices(rule, *phases)
    low, high = rule.interval("lv_ef_percent", values["lv_ef_percent"], scales["lv_ef_percent"])
    return {"patient": patient, "group": group_of(patient), "part": part,
            "error": values["lv_ef_percent"] - reference["lv_ef_percent"], "width": high - low,
            "lv_flagged": _flagged(metadata, phases, ("lv",)), "any_flagged": _flagged(metadata, phases, STRUCTURES)}


def wide_limit(rows: Sequence[dict[str, Any]]) -> float:
    """The largest LV EF interval width at which ``lv_flagged`` or a wider interval marks at least
    :data:`TARGET_RECALL` of ``rows``' patients off by more than :data:`OFF_ABOVE` points (inf: none is off, or
    the LV flag alone does it)."""
    off = [row for row in rows if abs(row["error"]) > OFF_ABOVE]
    if not off:
        return math.inf
    for limit in [math.inf, *sorted({row["width"] for row in off}, reverse=True)]:
        if sum(row["lv_flagged"] or row["width"] >= limit for row in off) >= TARGET_RECALL * len(off):
            return limit
    return 0.0


def mark_summary(rows: Sequence[dict[str, Any]], mark: str) -> dict[str, Any]:
    """``mark``'s share among ``rows``' patients off by more than 8 points and among those within 3."""
    off = [row for row in rows if abs(row["error"]) > OFF_ABOVE]
    within = [row for row in rows if abs(row["error"]) <= WITHIN]
    return {"patients": len(rows), "off_marked": marked_share(sum(row[mark] for row in off), len(off)),
            "within_marked": marked_share(sum(row[mark] for row in within), len(within))}


def main(argv: Sequence[str] | None = None) -> int:
    """Prints each part's marks; writes the record with ``--record``. Returns 0; bad input exits with one sentence."""
    arguments = study_arguments("python -m studies.function_review", __doc__.split("\n\n")[0], argv)
    bundle, rule, records = function_study(arguments, predicted_dice=True)
    metadata = bundle.metadata
    rows = [patient_row(metadata, rule, patient.patient, patient.reference, next(iter(patient.members.values())),
                        "out_of_fold") for patient in patient_volumes(records, "oof")]
    rows += [patient_row(metadata, rule, patient.patient, patient.reference, patient.ensemble, "test")
             for patient in patient_volumes(records, "test") if patient.ensemble is not None]
    limit = wide_limit([row for row in rows if row["part"] == "out_of_fold"])
    for row in rows:
        row["lv_flagged_or_wide"] = row["lv_flagged"] or row["width"] >= limit
    summary = {part: {mark: mark_summary([row for row in rows if row["part"] == part], mark)
                      for mark in ("lv_flagged", "any_flagged", "lv_flagged_or_wide")}
               for part in ("out_of_fold", "test")}
    print(f"width limit chosen out of fold: {limit:.1f} LV EF points")
    for part, marks in summary.items():
        for mark, entry in marks.items():
            off, within = entry["off_marked"], entry["within_marked"]
            print(f"{part:12s} {mark:19s} off > 8: {off['marked']}/{off['of']}   within 3: "
                  f"{within['marked']}/{within['of']}")
    if arguments.record is not None:
        write_json_atomic(arguments.record, {
            "bundle": arguments.bundle, "weights_sha256": metadata.weights_sha256,
            "recorded": datetime.date.today().isoformat(),
            "command": f"python -m studies.function_review --bundle {arguments.bundle} --store <store> --record "
                       f"{arguments.record}",
            "width_limit": limit, "summary": summary, "rows": rows})
        print(f"record: {arguments.record}")
    return 0


if __name__ == "__main__":
    main()
