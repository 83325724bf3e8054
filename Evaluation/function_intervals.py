"""Fit the interval rule of cardiac function on out-of-fold predictions, and measure it on the test patients.

    calibseg-store --bundle acdc_crac --store store            # the networks, once (resumable)
    python -m Evaluation.function_intervals --bundle acdc_crac --store store \
        --record docs/records/function/acdc_crac.json              # seconds: fit, measure, record
    calibseg-fit --bundle acdc_crac --store store --sections function_intervals --out PATH   # into a bundle

The fit reads the store (:mod:`CalibSegLib.store`), which ``calibseg-store`` fills by running the networks once;
nothing here predicts. The rule goes into a bundle through ``calibseg-fit``, the one rewrite of a bundle's fitted
sections.

1. **Read** the store's records (:func:`stored_records`). Every cross-validation patient's ED and ES volumes, each
   predicted by the one member of the ensemble that never saw it (the bundle's ``ensemble.members[k].validation``):
   each structure's volume from hard labels and from probability sums, and its spread Σ p (1 − p)
   (:mod:`CalibSegLib.cardiac.indices`). Every test patient's volumes predicted by each member and by the ensemble
   (the mean of the members' probabilities, its argmax post-processed: what the shipped bundle gives). The reference
   volumes come from the labels. A sub-ensemble (``python -m Training.sub_ensemble``) keeps the rule of the
   ensemble it was selected from, fitted on that ensemble's five fold networks: its store holds that ensemble's
   out-of-fold records too (:func:`CalibSegLib.store.read_fit_records`).
2. **Fit** (:func:`CalibSegLib.cardiac.intervals.fit_rule`) on the out-of-fold patients; the choice of point
   estimate, scale and recalibration is made there, by the smallest sum of the LV and RV EF intervals' median
   widths when each patient is judged by the rule fitted on the others (leave-one-patient-out). The scales that
   read the quality model's predicted Dice are candidates only with ``--with-predicted-dice``
   (:func:`attach_observed_dice`: the same networks' quality features, out of fold cross-fitted).
3. **Measure** on the test patients (each predicted by the shipped ensemble): EF mean absolute error, coverage
   and median width of each index's interval, beside the members' min–max interval and the other point estimate,
   each with a patient-level bootstrap interval (:mod:`Evaluation.bootstrap`).

ACDC's HDF5 files carry no spacing: every volume here is in mL under the assumed 10 × 1.5 × 1.5 mm voxels
(:data:`Datasets.acdc.ACDC_SPACING`); the ejection fractions do not depend on it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from CalibSegLib.bundle import Bundle, BundleError, load_bundle
from CalibSegLib.cardiac.indices import STRUCTURES, CardiacClasses, PhaseVolumes, cardiac_classes, voxel_volume_ml
from CalibSegLib.cardiac.intervals import RECALIBRATIONS, fit_rule, index_values, rule_indices
from CalibSegLib.device import environment
from CalibSegLib.interval_rule import DICE_SCALES, ESTIMATES, INDICES, SCALES, IntervalRule
from CalibSegLib.io import recorded_path, write_json_atomic
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.quality.fitting import Observation, held_out_predictions
from CalibSegLib.quality.members import combined_predicted_dice, member_predicted_dice
from CalibSegLib.quality.model import QualityModel
from CalibSegLib.store import ENSEMBLE, OUT_OF_FOLD, TEST, StoreRecord, read_fit_records
from Datasets.acdc import ACDC_SPACING
from Datasets.errors import DataError
from Evaluation.bootstrap import group_draws, mean_interval

__all__ = ["REPORTED", "TARGETS", "attach_observed_dice", "stored_collection", "stored_observations", "stored_records",
           "PatientVolumes", "interval_rows",
           "patient_volumes", "leave_one_out", "summarise", "fit_and_measure", "markdown_table", "models_table",
           "main"]

# The indices with targets (docs/function.md), reported with intervals; every index is fitted.
REPORTED = ("lv_ef_percent", "rv_ef_percent", "lv_edv_ml")
TARGETS = {"lv_ef_percent": {"mae_at_most": 5.0, "coverage_at_least": 0.8, "median_width_at_most": 12.0},
           "rv_ef_percent": {"mae_at_most": 8.0}, "lv_edv_ml": {"coverage_at_least": 0.8}}


def stored_collection(records: Sequence[StoreRecord]) -> list[dict[str, Any]]:
    """The store's records (:mod:`CalibSegLib.store`, written by ``calibseg-store``) as the fit's per-volume
    records, one per side and case, sorted: ``{"case", "patient", "side" ("oof" or "test"), "weights_sha256",
    "reference": {structure: mL}, "members": {k: PhaseVolumes}}`` and for a test volume ``"ensemble":
    PhaseVolumes`` (:meth:`~CalibSegLib.cardiac.indices.PhaseVolumes.to_dict` each).

    Raises:
        DataError: a record holds no cardiac volumes (its bundle has no cardiac structures).
    """
    collected: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records:
        if record.volumes is None:
            raise DataError(f"The store's record of {record.case} holds no cardiac volumes: its bundle has no "
                            "cardiac structures to fit function intervals for.")
        side = "oof" if record.role == OUT_OF_FOLD else "test"
        entry = collected.setdefault((side, record.case), {
            "case": record.case, "patient": record.patient, "side": side, "weights_sha256": record.weights_sha256,
            "reference": record.reference_ml, "members": {}})
        if record.member == ENSEMBLE:
            entry["ensemble"] = record.volumes
        else:
            entry["members"][str(record.member)] = record.volumes
    return [collected[key] for key in sorted(collected, key=lambda key: f"{key[0]}_{key[1]}.json")]


def stored_observations(records: Sequence[StoreRecord], role: str) -> list[dict[str, Any]]:
    """The members' quality observations of ``role`` among the store's records, as :func:`attach_observed_dice`
    reads them."""
    return [{"case": record.case, "patient": record.patient, "member": record.member, "features": record.features,
             "dice": record.dice} for record in records if record.role == role and record.member != ENSEMBLE]


def stored_records(bundle: Bundle, store: Path, predicted_dice: bool = False) -> list[dict[str, Any]]:
    """The bundle's out-of-fold and test volumes from ``store`` as collected records (:func:`stored_collection`),
    with (``predicted_dice``) each prediction's predicted Dice from the store's observations of the same
    predictions (:func:`attach_observed_dice`). A sub-ensemble's out-of-fold records are those of the ensemble
    it keeps members of.

    Raises:
        DataError: (``predicted_dice``) the bundle's quality model is absent or applied to the members' average.
        StoreError: the store holds no record of the bundle's weights.
    """
    metadata = bundle.metadata
    if predicted_dice:
        _member_quality_model(bundle)  # a model the observations cannot serve is the first sentence, before reading
    stored = read_fit_records(store, metadata.weights_sha256, metadata.out_of_fold_weights_sha256)
    records = stored_collection(stored)
    if not predicted_dice:
        return records
    # attach_observed_dice numbers test members as the ensemble they were kept of does
    tested = [{**item, "member": metadata.out_of_fold_member(item["member"])}
              for item in stored_observations(stored, TEST)]
    return attach_observed_dice(records, stored_observations(stored, OUT_OF_FOLD), tested, bundle, str(store))


def _structure_dice(dice: np.ndarray, classes: CardiacClasses) -> dict[str, float]:
    """Structure → predicted Dice from a ``(C - 1,)`` row (NaN, drawn nowhere, counts 0 as in the ensemble's
    mean, :func:`~CalibSegLib.quality.members.combined_predicted_dice`)."""
    return {structure: float(np.nan_to_num(dice[classes.index(structure) - 1], nan=0.0)) for structure in STRUCTURES}


def _member_quality_model(bundle: Bundle) -> QualityModel:
    """The bundle's quality model, applied per member as observations of single members can serve it.

    Raises:
        DataError: it is missing or applied to the members' average (one sentence).
    """
    model = bundle.metadata.quality
    if model is None or not model.per_member:
        raise DataError("The bundle's quality model is absent or applied to the members' average, so its predicted "
                        "Dice at inference is not the members' mean these observations give; fit without "
                        "--with-predicted-dice.")
    return model


def attach_observed_dice(records: Sequence[dict[str, Any]], fitted: Sequence[dict[str, Any]],
                         tested: Sequence[dict[str, Any]], bundle: Bundle, source: str) -> list[dict[str, Any]]:
    """``records`` with each prediction's structures given ``predicted_dice``, from the quality observations of the
    same networks' predictions: ``fitted`` out of fold, ``tested`` on the test volumes, each ``{"case", "patient",
    "member", "features", "dice"}`` (read from ``source``).

    Out of fold each volume's predicted Dice comes from the quality model fitted without its patient
    (:func:`~CalibSegLib.quality.fitting.held_out_predictions`): the bundle's own model was fitted on these very
    volumes, so its predictions there would be in-sample, slightly better than on a new patient. A test volume's
    come from the bundle's model applied to each member's features, the ensemble's being their mean (what the
    bundle shows at inference). A sub-ensemble reads the observations of the ensemble it keeps members of (its
    test members by their number there, :meth:`CalibSegLib.bundle.BundleMetadata.out_of_fold_member`).

    Raises:
        DataError: the bundle's quality model is missing or not applied per member, an observation is missing,
            or it is of another prediction than the record's (its label volume differs), one sentence each.
    """
    metadata = bundle.metadata
    model = _member_quality_model(bundle)
    classes = cardiac_classes(metadata.class_names, metadata.class_terminology)
    held_out = held_out_predictions([Observation(item["patient"], item["features"], np.asarray(item["dice"]))
                                     for item in fitted], metadata.class_names) if fitted else np.empty((0, 0))
    applied = member_predicted_dice(model, [item["features"] for item in tested], metadata.class_names) \
        if tested else np.empty((0, 0))
    found = {("oof", item["case"], item["member"]): (item, dice) for item, dice in zip(fitted, held_out)}
    found.update({("test", item["case"], item["member"]): (item, dice) for item, dice in zip(tested, applied)})
    voxel = voxel_volume_ml(ACDC_SPACING)
    attached = []
    for record in records:
        record = json.loads(json.dumps(record))
        per_member = []
        for member, phase in record["members"].items():
            observed = metadata.out_of_fold_member(int(member)) if record["side"] == "test" else int(member)
            if (record["side"], record["case"], observed) not in found:
                raise DataError(f"{source} holds no quality observation of {record['case']} by member "
                                f"{observed}; calibseg-store --bundle <bundle> --store <store> writes it.")
            item, dice = found[(record["side"], record["case"], observed)]
            for structure in STRUCTURES:
                features = item["features"][classes.index(structure) - 1]
                drawn = 0.0 if features is None else features["voxels"] * voxel
                if not math.isclose(drawn, phase[structure]["hard"], rel_tol=1e-9, abs_tol=1e-9):
                    raise DataError(f"The quality observation of {record['case']} by member {member} draws "
                                    f"{structure} at {drawn:.3f} mL where the stored prediction drew "
                                    f"{phase[structure]['hard']:.3f} mL, so they are not of one prediction.")
                phase[structure]["predicted_dice"] = _structure_dice(dice, classes)[structure]
            per_member.append(dice)
        if "ensemble" in record:
            for structure, value in _structure_dice(combined_predicted_dice(np.stack(per_member)), classes).items():
                record["ensemble"][structure]["predicted_dice"] = value
        attached.append(record)
    return attached


@dataclass(frozen=True)
class PatientVolumes:
    """One patient's ED and ES: the reference indices (from the label volumes), each member's predicted phases
    ``{member: (ED, ES)}`` (out of fold: the one member that never saw the patient) and the ensemble's (test)."""

    patient: str
    reference: dict[str, float]
    members: dict[int, tuple[PhaseVolumes, PhaseVolumes]]
    ensemble: tuple[PhaseVolumes, PhaseVolumes] | None


def _frame(record: dict[str, Any]) -> int:
    return int(record["case"].rsplit("_frame", 1)[1])


def patient_volumes(records: Sequence[dict[str, Any]], side: str) -> list[PatientVolumes]:
    """The patients of ``side`` (``oof`` or ``test``) whose two volumes are both collected. ACDC numbers a cycle's
    frames from the R wave, so the patient's lower frame number is ED (frame 1), the other ES."""
    by_patient: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["side"] == side:
            by_patient.setdefault(record["patient"], []).append(record)
    patients = []
    for patient, pair in sorted(by_patient.items()):
        if len(pair) != 2:
            continue
        ed, es = sorted(pair, key=_frame)
        members = {int(key): (PhaseVolumes.from_dict(ed["members"][key]), PhaseVolumes.from_dict(es["members"][key]))
                   for key in ed["members"]}
        ensemble = (PhaseVolumes.from_dict(ed["ensemble"]), PhaseVolumes.from_dict(es["ensemble"])) \
            if "ensemble" in ed else None
        patients.append(PatientVolumes(patient, index_values(ed["reference"], es["reference"]), members, ensemble))
    return patients


def _single(patient: PatientVolumes) -> tuple[PhaseVolumes, PhaseVolumes]:
    """An out-of-fold patient's one prediction (by the member that never saw it)."""
    (phases,) = patient.members.values()
    return phases


def interval_rows(rule: IntervalRule, phases: tuple[PhaseVolumes, PhaseVolumes], reference: dict[str, float]
                   ) -> dict[str, dict[str, float]]:
    """Per index the estimate's absolute error, whether the rule's interval covers the reference, and its width."""
    values, scales = rule_indices(rule, *phases)
    rows = {}
    for index in INDICES:
        low, high = rule.interval(index, values[index], scales[index])
        rows[index] = {"error": abs(values[index] - reference[index]),
                       "covered": float(low <= reference[index] <= high), "width": high - low}
    return rows


def leave_one_out(patients: Sequence[PatientVolumes], estimate: str, scale: str, recalibrate: bool
                  ) -> list[dict[str, dict[str, float]]]:
    """Each out-of-fold patient judged by the rule fitted on all the others (its error, coverage and width per
    index): how the rule would do on a new patient, measured without the test patients."""
    phases = [_single(patient) for patient in patients]
    references = [patient.reference for patient in patients]
    rows = []
    for held in range(len(patients)):
        others = [index for index in range(len(patients)) if index != held]
        rule = fit_rule([phases[index] for index in others], [references[index] for index in others], estimate,
                        scale, recalibrate=recalibrate)
        rows.append(interval_rows(rule, phases[held], references[held]))
    return rows


def _median_interval(values: np.ndarray) -> tuple[float, float, float]:
    """The median of one value per patient and its 95 % percentile bootstrap interval over patients."""
    values = np.asarray(values, np.float64)
    values = values[np.isfinite(values)]
    draws = group_draws(np.arange(len(values)))
    if draws is None:
        return float(np.median(values)) if len(values) else math.nan, math.nan, math.nan
    resampled = np.array([np.median(np.repeat(values, counts.astype(int))) for counts in draws])
    low, high = np.percentile(resampled, [2.5, 97.5])
    return float(np.median(values)), float(low), float(high)


def _triple(value: tuple[float, float, float]) -> dict[str, float]:
    return dict(zip(("value", "low", "high"), value))


def summarise(rows: Sequence[dict[str, dict[str, float]]], indices: Sequence[str] = REPORTED
              ) -> dict[str, dict[str, dict[str, float]]]:
    """Per index the mean absolute error, the coverage and the median width over patients (one row each), each
    with its patient-level 95 % bootstrap interval."""
    patients = np.arange(len(rows))
    summary = {}
    for index in indices:
        column = {key: np.array([row[index][key] for row in rows]) for key in ("error", "covered", "width")}
        summary[index] = {"mae": _triple(mean_interval(column["error"], patients)),
                          "coverage": _triple(mean_interval(column["covered"], patients)),
                          "median_width": _triple(_median_interval(column["width"]))}
    return summary


def _members_min_max(rule: IntervalRule, patient: PatientVolumes) -> dict[str, dict[str, float]]:
    """The naive interval: the members' smallest to largest value (read as ``rule`` reads them), around the
    ensemble's estimate."""
    values = [rule_indices(rule, *phases)[0] for phases in patient.members.values()]
    ensemble = rule_indices(rule, *patient.ensemble)[0]
    rows = {}
    for index in INDICES:
        low, high = min(value[index] for value in values), max(value[index] for value in values)
        rows[index] = {"error": abs(ensemble[index] - patient.reference[index]),
                       "covered": float(low <= patient.reference[index] <= high), "width": high - low}
    return rows


def _members_averaged(rule: IntervalRule, patient: PatientVolumes) -> dict[str, dict[str, float]]:
    """The rule applied to each member as fitted (one network each), the members' interval ends averaged."""
    ends = []
    for phases in patient.members.values():
        values, scales = rule_indices(rule, *phases)
        ends.append({index: rule.interval(index, values[index], scales[index]) for index in INDICES})
    ensemble = rule_indices(rule, *patient.ensemble)[0]
    rows = {}
    for index in INDICES:
        low = float(np.mean([end[index][0] for end in ends]))
        high = float(np.mean([end[index][1] for end in ends]))
        rows[index] = {"error": abs(ensemble[index] - patient.reference[index]),
                       "covered": float(low <= patient.reference[index] <= high), "width": high - low}
    return rows


def _ejection_row(rule: IntervalRule, patient: PatientVolumes) -> dict[str, Any]:
    """A test patient's LV EF: reference, the ensemble's value and the rule's interval."""
    values, scales = rule_indices(rule, *patient.ensemble)
    return {"patient": patient.patient, "reference": patient.reference["lv_ef_percent"],
            "value": values["lv_ef_percent"],
            "interval": list(rule.interval("lv_ef_percent", values["lv_ef_percent"], scales["lv_ef_percent"]))}


def fit_and_measure(records: Sequence[dict[str, Any]]) -> tuple[IntervalRule, dict[str, Any]]:
    """Choose and fit the rule on the out-of-fold patients, measure it on the test patients (module docstring);
    returns the rule and the record's measurements."""
    out_of_fold = patient_volumes(records, "oof")
    test = patient_volumes(records, "test")
    if len(out_of_fold) < 10:
        raise ValueError(f"Only {len(out_of_fold)} out-of-fold patients are stored; a 90 % rule needs at least "
                         "10, so fill the store's out-of-fold part (calibseg-store --part out_of_fold, resumed).")
    with_dice = all(structure.predicted_dice is not None for patient in out_of_fold
                    for phase in _single(patient) for structure in (phase.lv, phase.rv, phase.myocardium))
    scales = [scale for scale in SCALES if with_dice or scale not in DICE_SCALES]
    candidates = {f"{estimate}/{scale}/{recalibration}": summarise(leave_one_out(
        out_of_fold, estimate, scale, recalibration == "linear"))
        for estimate in ESTIMATES for scale in scales for recalibration in RECALIBRATIONS}
    chosen = min(candidates, key=lambda name: sum(candidates[name][index]["median_width"]["value"]
                                                  for index in ("lv_ef_percent", "rv_ef_percent")))
    estimate, scale, recalibration = chosen.split("/")
    phases = [_single(patient) for patient in out_of_fold]
    references = [patient.reference for patient in out_of_fold]
    fitted_on = {"patients": len(out_of_fold), "predicted_by": "each by the ensemble member (fold network) that "
                 "never trained on it", "chosen_by": "smallest sum of the leave-one-patient-out median widths of "
                 f"the LV and RV EF intervals among hard/soft volumes x {'/'.join(scales)} scale x none/linear "
                 "recalibration",
                 "applied_as": "the ensemble's prediction (mean of the members' probabilities) read as fitted"}
    rule = fit_rule(phases, references, estimate, scale, fitted_on=fitted_on,
                    recalibrate=recalibration == "linear")
    other = fit_rule(phases, references, ESTIMATES[1 - ESTIMATES.index(estimate)], scale,
                     recalibrate=recalibration == "linear")
    measured: dict[str, Any] = {
        "out_of_fold": {"patients": [patient.patient for patient in out_of_fold],
                        "leave_one_out": candidates, "chosen": chosen},
        "rule": rule.to_dict()}
    if test:
        recalibrated = ", recalibrated" if rule.recalibration is not None else ""
        rules = {f"rule on the ensemble ({estimate} volumes{recalibrated})": rule,
                 f"rule on the ensemble ({other.estimate} volumes{recalibrated})": other}
        if rule.recalibration is not None:
            rules[f"rule on the ensemble ({estimate} volumes, not recalibrated)"] = fit_rule(phases, references,
                                                                                            estimate, scale)
        methods = {name: [interval_rows(method, patient.ensemble, patient.reference) for patient in test]
                   for name, method in rules.items()}
        methods["rule per member, interval ends averaged"] = [_members_averaged(rule, patient) for patient in test]
        methods["members' min-max"] = [_members_min_max(rule, patient) for patient in test]
        measured["test"] = {"patients": [patient.patient for patient in test],
                            "methods": {name: summarise(rows) for name, rows in methods.items()},
                            "lv_ef_percent": [_ejection_row(rule, patient) for patient in test]}
    return rule, measured


def _cell(entry: dict[str, float], percent: bool = False) -> str:
    """A value with its 95 % interval, ``12.3 (10.1–14.5)``; shares as percentages."""
    scale, unit = (100.0, " %") if percent else (1.0, "")
    return f"{entry['value'] * scale:.1f}{unit} ({entry['low'] * scale:.1f}–{entry['high'] * scale:.1f})"


def _row_cells(summary: dict[str, Any]) -> str:
    """LV and RV EF MAE, LV EF coverage and median width, LV EDV coverage and median width: a table's cells."""
    lv, rv, edv = summary["lv_ef_percent"], summary["rv_ef_percent"], summary["lv_edv_ml"]
    return (f"{_cell(lv['mae'])} | {_cell(rv['mae'])} | {_cell(lv['coverage'], True)} | "
            f"{_cell(lv['median_width'])} | {_cell(edv['coverage'], True)} | {_cell(edv['median_width'])} |")


_COLUMNS = ("LV EF MAE | RV EF MAE | LV EF coverage | LV EF median width | LV EDV coverage | "
            "LV EDV median width (mL) |")


def markdown_table(record: dict[str, Any]) -> list[str]:
    """The test patients' table of a record (docs/function.md): per method the LV and RV EF mean absolute error,
    and the coverage and median width of the LV EF and LV EDV intervals, each with its 95 % patient-level
    bootstrap interval."""
    lines = [f"| interval (test patients) | {_COLUMNS}", "|---|---|---|---|---|---|---|"]
    lines += [f"| {name} | {_row_cells(summary)}" for name, summary in record["test"]["methods"].items()]
    return lines


def models_table(records: Sequence[dict[str, Any]]) -> list[str]:
    """One row per record (docs/results.md): the model, its chosen rule (volumes/scale/recalibration), and the
    test columns of :func:`markdown_table` for that rule applied to the ensemble."""
    lines = [f"| model (test patients) | rule | {_COLUMNS}", "|---|---|---|---|---|---|---|---|"]
    for record in records:
        chosen = next(iter(record["test"]["methods"].values()))  # the chosen rule's row comes first
        lines.append(f"| `{record['bundle']}` | {record['out_of_fold']['chosen']} | {_row_cells(chosen)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Read the store, fit and measure, and write the record (``calibseg-fit --sections function_intervals`` writes
    the rule into the bundle). Returns 0; bad input exits with one sentence."""
    parser = argparse.ArgumentParser(prog="python -m Evaluation.function_intervals",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="acdc_ce_dice", help="an ensemble bundle or a shipped model's name")
    parser.add_argument("--store", type=Path, required=True,
                        help="the store calibseg-store filled for the bundle: read, nothing is predicted")
    parser.add_argument("--record", type=Path, help="where to write the fit's record (JSON)")
    parser.add_argument("--with-predicted-dice", action="store_true",
                        help="the store's quality observations give each prediction the quality model's predicted "
                             "Dice, so the scales that read it are candidates too")
    arguments = parser.parse_args(argv)
    try:
        bundle = load_bundle(resolve_bundle_path(arguments.bundle))
        if bundle.metadata.ensemble is None:
            raise DataError(f"{arguments.bundle} is no cross-validation ensemble, so it has no out-of-fold "
                            "networks to fit the rule on.")
        metadata = bundle.metadata
        records = stored_records(bundle, arguments.store, arguments.with_predicted_dice)
        rule, measured = fit_and_measure(records)
    except (BundleError, ValueError) as error:  # DataError is a ValueError
        raise SystemExit(f"error: {error}") from None
    if arguments.record is not None:
        machine = environment("cpu")
        write_json_atomic(arguments.record, {
            "bundle": arguments.bundle, "weights_sha256": metadata.weights_sha256,
            **({} if metadata.out_of_fold_weights_sha256 == metadata.weights_sha256 else {
                "out_of_fold_weights_sha256": metadata.out_of_fold_weights_sha256}),
            "recorded": datetime.date.today().isoformat(),
            "command": "python -m Evaluation.function_intervals " + shlex.join(
                [recorded_path(item) if Path(item).is_absolute() else item for item in sys.argv[1:]]),
            "machine": f"{machine['cpu_count']} cores ({machine['device']}), torch {machine['torch']}",
            "volumes": f"mL under ACDC's assumed {' x '.join(f'{value:g}' for value in ACDC_SPACING)} mm voxels "
                       "(the HDF5 files carry no spacing); ejection fractions do not depend on it",
            "level": rule.level, "targets": TARGETS,
            **({} if not arguments.with_predicted_dice else {
                "predicted_dice": "out of fold: each volume's from the quality model fitted without its patient "
                                  "(leave-one-patient-out); test: the bundle's quality model on each member, the "
                                  "ensemble's the members' mean"}), **measured})
        print(f"record: {arguments.record}")
    print(f"rule: {measured['out_of_fold']['chosen']} (volumes/scale/recalibration), fitted on "
          f"{rule.fitted_on['patients']} out-of-fold patients")
    if "test" in measured:
        print("\n".join(markdown_table(measured)))
    return 0


if __name__ == "__main__":
    main()
