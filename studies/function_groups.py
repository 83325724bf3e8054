"""Does the function interval rule keep its 90 % in each ACDC group? Read from the store, predicting nothing.

    python -m studies.function_groups --bundle acdc_crac --store store \
        --record docs/records/function_groups/acdc_crac.json

Split-conformal coverage holds for patients exchangeable with the calibration set, not within every subgroup.
Out of fold, each of the bundle's cross-validation patients is judged by the bundle's rule (its estimate, scale and
recalibration) refitted on all the other patients (leave-one-patient-out, as the fit chooses); on the test
patients, by the shipped rule applied to the ensemble. Per part and ACDC group (DCM 001-020, HCM 021-040, MINF
041-060, NOR 061-080, RV 081-100): LV and RV EF mean absolute error, LV EF coverage and median width, each with its
patient-level 95 % bootstrap interval (:func:`Evaluation.function_intervals.summarise`).
"""

from __future__ import annotations

import datetime
from typing import Any, Sequence

from CalibSegLib.io import write_json_atomic
from Datasets.splits.make_splits import GROUPS, group_of
from Evaluation.function_intervals import PatientVolumes, interval_rows, leave_one_out, patient_volumes, summarise
from studies.store_study import function_study, study_arguments

__all__ = ["INDICES", "group_rows", "group_summary", "markdown_table", "main"]

INDICES = ("lv_ef_percent", "rv_ef_percent")


def group_rows(patients: Sequence[PatientVolumes], rows: Sequence[dict[str, Any]]
               ) -> dict[str, list[dict[str, Any]]]:
    """Each patient's row (error, coverage, width per index) under its ACDC group, and every row under ``all``."""
    grouped: dict[str, list[dict[str, Any]]] = {"all": list(rows)}
    for patient, row in zip(patients, rows):
        grouped.setdefault(group_of(patient.patient) or "other", []).append(row)
    return grouped


def group_summary(grouped: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per group its patient count and :func:`summarise` of its rows (``all`` first, then the groups in order)."""
    order = ["all", *GROUPS, "other"]
    return {name: {"patients": len(grouped[name]), **summarise(grouped[name], INDICES)}
            for name in order if grouped.get(name)}


def _cell(entry: dict[str, float], percent: bool = False) -> str:
    scale = 100.0 if percent else 1.0
    return f"{entry['value'] * scale:.1f} ({entry['low'] * scale:.1f}–{entry['high'] * scale:.1f})"


def markdown_table(summary: dict[str, Any], part: str) -> list[str]:
    """One row per group: patients, LV EF MAE, RV EF MAE, LV EF coverage (%) and median width."""
    lines = [f"| group ({part}) | patients | LV EF MAE | RV EF MAE | LV EF coverage (%) | LV EF median width |",
             "|---|---|---|---|---|---|"]
    for name, entry in summary.items():
        lv, rv = entry["lv_ef_percent"], entry["rv_ef_percent"]
        lines.append(f"| {name} | {entry['patients']} | {_cell(lv['mae'])} | {_cell(rv['mae'])} | "
                     f"{_cell(lv['coverage'], True)} | {_cell(lv['median_width'])} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Prints both parts' tables; writes the record with ``--record``. Returns 0; bad input exits with one sentence."""
    arguments = study_arguments("python -m studies.function_groups", __doc__.split("\n\n")[0], argv)
    bundle, rule, records = function_study(arguments)
    out_of_fold = patient_volumes(records, "oof")
    test = [patient for patient in patient_volumes(records, "test") if patient.ensemble is not None]
    parts = {"out_of_fold": (out_of_fold, leave_one_out(out_of_fold, rule.estimate, rule.scale,
                                                        rule.recalibration is not None)),
             "test": (test, [interval_rows(rule, patient.ensemble, patient.reference) for patient in test])}
    summaries = {part: group_summary(group_rows(patients, rows)) for part, (patients, rows) in parts.items() if rows}
    for part, summary in summaries.items():
        print("\n".join(markdown_table(summary, part)) + "\n")
    if arguments.record is not None:
        write_json_atomic(arguments.record, {
            "bundle": arguments.bundle, "weights_sha256": bundle.metadata.weights_sha256,
            "recorded": datetime.date.today().isoformat(),
            "command": f"python -m studies.function_groups --bundle {arguments.bundle} --store <store> --record "
                       f"{arguments.record}",
            "rule": f"{rule.estimate}/{rule.scale}/{'none' if rule.recalibration is None else 'linear'}",
            **summaries})
        print(f"record: {arguments.record}")
    return 0


if __name__ == "__main__":
    main()
