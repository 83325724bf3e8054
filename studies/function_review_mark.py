"""How well ``function.json``'s review list marks the patients whose LV ejection fraction is off, out of fold and on
the test patients.

    python -m studies.function_review_mark --bundle acdc_ce_dice --data ../shared/data/acdc \
        --record docs/records/function_review/acdc_ce_dice.json

Out of fold, each of the bundle's members measures the patients it never saw (its ``ensemble.members[m].validation``)
alone, under the bundle's temperature, post-processing, quality model (applied to that member, as it was fitted) and
interval rule, through :func:`CalibSegLib.cardiac.function.measure_function` (the command's path; the input check
is the ensemble's and is not applied to a single member). On the test patients (``--split``'s ``test``) the shipped
bundle measures each patient as ``calibseg-function`` does. Each patient's LV EF error is the measured EF minus the
one the reference labels give (ACDC's assumed spacing; an EF does not depend on it). A patient is *marked* when the
review list is not empty (``review_list``), or, for the wider mark it was chosen against, when the review flag marks
any structure at a phase an index is made of (``any_flagged_volume``); a refused measurement counts as marked
(nothing would be signed).

The record holds every patient's row (group, part, member, reference and measured EF, the review list or the
refusal, the LV's voxels at ED and ES as predicted and as drawn by the reference, and the holes a per-slice filling
of the predicted cavity would add) and, per part and mark, the marked share among patients off by more than 8
points and among those within 3, with Clopper-Pearson 95 % intervals, overall and per ACDC group. The quality model
was fitted on these same out-of-fold predictions (its threshold too), so the out-of-fold share is optimistic; the
test share is not.

It runs the networks rather than reading the store: what it measures is the command's own path (the review list as
``function.json`` writes it, a refusal by that path, the cavity's holes from the label maps), none of which the
store's records hold. Its store reader is :mod:`studies.function_review` (the same marks from the stored volumes,
each out-of-fold predicted Dice held out).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy import ndimage, stats

from CalibSegLib.bundle import BundleMetadata, load_bundle, member_metadata
from CalibSegLib.cardiac.function import measure_function
from CalibSegLib.cardiac.indices import CardiacError, cardiac_classes, label_volumes_ml
from CalibSegLib.cardiac.intervals import index_values
from CalibSegLib.interval_rule import VOLUMES
from CalibSegLib.inference import Predictor
from CalibSegLib.io import ImageGeometry, recorded_path, write_json_atomic
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.quality.review_rule import flagged
from Datasets.acdc import ACDC_SPACING
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Datasets.splits.make_splits import GROUPS, group_of

__all__ = ["OFF_ABOVE", "WITHIN", "MARKS", "measure_patients", "marked_share", "summarise", "main"]

OFF_ABOVE, WITHIN = 8.0, 3.0  # LV EF points: the patients the mark must catch, and those it should leave alone


def _single_member(metadata: BundleMetadata) -> BundleMetadata:
    """A member alone, with the ensemble's quality model (fitted on single networks) and interval rule kept."""
    import dataclasses

    return dataclasses.replace(member_metadata(metadata), quality_model=metadata.quality_model)


def _flags(metadata: BundleMetadata, result: Any, classes) -> list[str]:
    """Every volume an index is made of (:data:`~CalibSegLib.interval_rule.VOLUMES`) whose structure the
    bundle's review flag marks at its phase: the wider mark the shipped list was chosen against."""
    model = metadata.quality
    marked = []
    for volume in VOLUMES:
        structure, phase = volume.rsplit("_", 1)
        dice = (result.ed_volumes if phase == "ed" else result.es_volumes).structure(structure).predicted_dice
        threshold = model.review_threshold(metadata.class_names[classes.index(structure)])
        if dice is not None and bool(flagged(dice, threshold)):
            marked.append(volume)
    return marked


def _cavity(labels: np.ndarray, reference: np.ndarray, lv: int) -> dict[str, int]:
    """An LV's voxels as predicted and as the reference draws them, and the voxels a per-slice filling of the predicted
    cavity's holes would add (what the ACDC convention, papillary muscles counted as cavity, would give it)."""
    cavity = labels == lv
    holes = sum(int((ndimage.binary_fill_holes(plane) & ~plane).sum()) for plane in cavity)
    return {"predicted": int(cavity.sum()), "reference": int((reference == lv).sum()), "holes": holes}


def _patient_row(predictor: Predictor, cases: Sequence[Any], classes) -> dict[str, Any]:
    """One patient's ED and ES (cases sorted by frame: ED first) measured: reference and measured LV EF, the review
    list and every flagged volume, or the refusal's sentence."""
    ed, es = cases
    geometry = ImageGeometry(spacing=ACDC_SPACING)
    reference = index_values(label_volumes_ml(ed.label, ACDC_SPACING, classes),
                             label_volumes_ml(es.label, ACDC_SPACING, classes))["lv_ef_percent"]
    row: dict[str, Any] = {"patient": ed.patient_id, "group": group_of(ed.patient_id), "reference_lv_ef": reference}
    try:
        result = measure_function(predictor, (ed.image, geometry), (es.image, geometry))
    except CardiacError as error:
        return {**row, "measured_lv_ef": None, "error": None, "review": [], "flags": [], "refused": str(error)}
    measured = result.values["lv_ef_percent"]
    return {**row, "measured_lv_ef": measured, "error": measured - reference, "review": result.review,
            "flags": _flags(predictor.metadata, result, classes), "refused": None,
            "lv_voxels": {phase: _cavity(result.predictions[phase].labels, case.label, classes.lv)
                          for phase, case in (("ed", ed), ("es", es))}}


def measure_patients(bundle_path: Path, data: Path, test_patients: Sequence[str]) -> list[dict[str, Any]]:
    """Every out-of-fold patient by the member that never saw it, and every test patient by the bundle."""
    bundle = load_bundle(bundle_path)
    metadata = bundle.metadata
    classes = cardiac_classes(metadata.class_names, metadata.class_terminology)
    by_patient: dict[str, list] = {}
    for file in sorted(find_cases(data), key=lambda item: item.case_id):
        by_patient.setdefault(file.patient_id, []).append(file)
    rows = []
    members = bundle.build_model().members if metadata.ensemble_size > 1 else [bundle.build_model()]
    for number, (member, entry) in enumerate(zip(members, metadata.ensemble.members)):
        predictor = Predictor.from_network(member, _single_member(metadata), device="cpu")
        for patient in entry.validation:
            cases = load_cases(by_patient[patient], metadata.num_classes)
            rows.append({"part": "out_of_fold", "member": number, **_patient_row(predictor, cases, classes)})
            print(f"out of fold, member {number}: {patient}", file=sys.stderr, flush=True)
    predictor = Predictor(bundle_path, device="cpu")
    for patient in test_patients:
        cases = load_cases(by_patient[patient], metadata.num_classes)
        rows.append({"part": "test", "member": None, **_patient_row(predictor, cases, classes)})
        print(f"test: {patient}", file=sys.stderr, flush=True)
    return rows


def marked_share(marked: int, count: int) -> dict[str, Any]:
    """``marked`` of ``count`` with its Clopper-Pearson 95 % interval."""
    low = float(stats.beta.ppf(0.025, marked, count - marked + 1)) if marked else 0.0
    high = float(stats.beta.ppf(0.975, marked + 1, count - marked)) if marked < count else 1.0
    return {"marked": marked, "of": count, "share": marked / count if count else None, "interval": [low, high]}


# How a patient counts as marked: by the review list the bundle writes, or by a flag on any volume an index is made of.
MARKS = {"review_list": "review", "any_flagged_volume": "flags"}


def _marks(rows: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    def marked(row):
        return bool(row[key]) or row["refused"] is not None

    errors = [abs(row["error"]) if row["error"] is not None else np.inf for row in rows]
    off = [row for row, error in zip(rows, errors) if error > OFF_ABOVE]
    within = [row for row, error in zip(rows, errors) if error <= WITHIN]
    measured = [error for error in errors if np.isfinite(error)]
    return {"patients": len(rows), "lv_ef_mae": float(np.mean(measured)) if measured else None,
            "off_marked": marked_share(sum(map(marked, off)), len(off)),
            "within_marked": marked_share(sum(map(marked, within)), len(within)), "marked": sum(map(marked, rows))}


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per part (out of fold, test): the marks overall and per group (module docstring)."""
    summary = {}
    for part in ("out_of_fold", "test"):
        chosen = [row for row in rows if row["part"] == part]
        summary[part] = {mark: {"all": _marks(chosen, key), "groups": {
            group: _marks([row for row in chosen if row["group"] == group], key) for group in GROUPS
            if any(row["group"] == group for row in chosen)}} for mark, key in MARKS.items()}
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.function_review_mark",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="acdc_ce_dice", help="a bundle or a shipped model's name")
    parser.add_argument("--data", type=Path, required=True, help="the ACDC HDF5 folder")
    parser.add_argument("--split", type=Path, default=Path("Datasets/splits/acdc.json"),
                        help="the split whose test patients are measured (default: Datasets/splits/acdc.json)")
    parser.add_argument("--record", type=Path, required=True, help="where the JSON record goes")
    arguments = parser.parse_args(argv)
    test_patients = json.loads(arguments.split.read_text())["test"]
    bundle_path = resolve_bundle_path(arguments.bundle)
    rows = measure_patients(bundle_path, arguments.data, test_patients)
    record = {"bundle": arguments.bundle, "command": "python -m studies.function_review_mark " + " ".join(
        argv if argv is not None else sys.argv[1:]), "data": recorded_path(arguments.data),
        "off_above": OFF_ABOVE, "within": WITHIN, "summary": summarise(rows), "patients": rows}
    write_json_atomic(arguments.record, record)
    for part, values in record["summary"].items():
        for mark, summary in values.items():
            marks = summary["all"]
            print(f"{part}, {mark}: {marks['patients']} patients, LV EF MAE {marks['lv_ef_mae']:.2f}; marked "
                  f"{marks['off_marked']['marked']} of {marks['off_marked']['of']} off by > {OFF_ABOVE:g}, "
                  f"{marks['within_marked']['marked']} of {marks['within_marked']['of']} within {WITHIN:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
