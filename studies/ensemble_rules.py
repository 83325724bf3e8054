"""An ensemble's quality model and review rule, judged out of fold and on the test patients. Read from the store.

    python -m studies.ensemble_rules --bundle acdc_crac --store store \
        --record docs/records/quality/acdc_crac_ensemble_rules.json

- **Out of fold** (the quality model's own fit data): each volume predicted by the member that never trained on it
  (the store's ``out_of_fold`` records), its predicted Dice from a fit without its patient
  (:func:`studies.store_study.held_out`). The refit of all of them (:func:`Training.ensemble.quality_from_observations`,
  what ``calibseg-fit`` writes, with its record) is compared with the shipped model's predictions on the same
  volumes, so the records are shown to be what the shipped fit saw.
- **Test patients**: the shipped model applied as fitted, to each member's own prediction, the mean of the members'
  predicted Dice (:mod:`CalibSegLib.quality.members`), against the ensemble's measured Dice (the store's
  ``ensemble`` record); each member's own predicted against its own measured Dice; the ensemble's Dice minus its
  members' mean.
- **The review rule** (:func:`CalibSegLib.quality.review_rule.choose_review_rule`, pooled or per structure) on the
  out-of-fold predictions; recall and false flags (:func:`Training.ensemble.flag_record`, patient-bootstrap
  intervals) at the shipped thresholds, the pooled and the per-structure ones, out of fold and on the test patients.

Not here, though the records of the former ``scripts.ensemble_rules_report`` hold them: the input check from every
member (each member's feature Gaussian and the pooled threshold) reads the members' encoder vectors, which the store's
prediction records do not hold (``calibseg-fit`` fits those statistics); and the model applied to the members'
average's features, which the store does not keep (the ensemble's predicted Dice is its members' mean). Bundles are
written by ``calibseg-fit`` alone.
"""

from __future__ import annotations

import datetime
from typing import Any, Sequence

import numpy as np
from scipy.stats import spearmanr

from CalibSegLib.bundle import BundleMetadata
from CalibSegLib.quality import QualityModel, structure_key
from CalibSegLib.quality.members import combined_predicted_dice, member_predicted_dice
from CalibSegLib.quality.model import thresholds_text
from CalibSegLib.quality.review_rule import TARGET_FALSE_FLAGS, choose_review_rule
from CalibSegLib.store import ENSEMBLE, TEST, StoreRecord
from Evaluation.bootstrap import mean_interval, spearman_interval
from Training.ensemble import flag_record, quality_from_observations  # calibseg-ensemble's and calibseg-fit's
from studies.store_study import HeldOut, flag_cells, held_out, quality_study, report_study, study_arguments

__all__ = ["shipped_rule", "agreement", "judged_out_of_fold", "judged_on_test", "markdown", "main"]


def shipped_rule(model: QualityModel) -> dict[str, Any]:
    """The review thresholds ``model`` flags at, as :func:`~CalibSegLib.quality.review_rule.choose_review_rule`
    gives them."""
    return {"review_below": model.review_below, "review_below_by_structure": dict(model.review_below_by_structure)}


def agreement(predicted: np.ndarray, measured: np.ndarray, patients: np.ndarray) -> dict[str, Any]:
    """Bias (mean predicted − measured), MAE and Spearman ρ of ``(volumes,)`` predicted and measured Dice (NaN
    predicted: the structure drawn nowhere, left out), each ``[value, low, high]`` with a patient-bootstrap 95 %
    interval."""
    kept = ~np.isnan(predicted)
    predicted, measured, patients = predicted[kept], measured[kept], patients[kept]
    return {"volumes": int(kept.sum()), "bias": list(mean_interval(predicted - measured, patients)),
            "mae": list(mean_interval(np.abs(predicted - measured), patients)),
            "spearman": [float(spearmanr(predicted, measured).statistic),
                         *spearman_interval(predicted, measured, patients)]}


def _by_structure(names: Sequence[str], predicted: np.ndarray, measured: np.ndarray, patients: np.ndarray
                  ) -> dict[str, Any]:
    return {structure_key(name): agreement(predicted[:, index], measured[:, index], patients)
            for index, name in enumerate(names)}


def _flags(rules: dict[str, dict[str, Any]], predicted: np.ndarray, measured: np.ndarray, patients: np.ndarray,
           names: Sequence[str]) -> dict[str, Any]:
    """Recall and false flags over ``(volumes, structures)`` arrays at each of ``rules``."""
    return {name: flag_record(predicted, measured, patients, rule, names) for name, rule in rules.items()}


def judged_out_of_fold(metadata: BundleMetadata, held: HeldOut) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The out-of-fold judgement (module docstring) and the three rules it judges (shipped, pooled, per
    structure), which the test part applies too.

    Raises:
        QualityModelError: too few out-of-fold volumes show some structure.
    """
    names = list(metadata.class_names[1:])
    shipped = metadata.quality
    refit, fit_record = quality_from_observations(held.observations, metadata.class_names, held.folds)
    # The shipped model was fitted on these volumes: refitted on the records, it must predict what it predicts.
    refit_difference = max(abs(refit.structures[name].predict(values) - shipped.structures[name].predict(values))
                           for item in held.observations for name, values in zip(names, item.features)
                           if values is not None)
    rule = choose_review_rule(held.predicted, held.measured, names, held.volume_folds)
    rules = {"shipped": shipped_rule(shipped), "pooled": {"review_below": rule["review_below"],
                                                          "review_below_by_structure": {}},
             "per_structure": {"review_below": rule["review_below"], "review_below_by_structure": {
                 name: row["review_below"] for name, row in rule["per_structure"].items()}}}
    part = {"volumes": len(held.observations), "patients": len(set(held.patients)),
            "refit_largest_predicted_dice_difference": refit_difference, "refit": fit_record,
            "held_out": _by_structure(names, held.predicted, held.measured, held.patients),
            "review_rule": {"target_false_flags": TARGET_FALSE_FLAGS, "pooled": rule["pooled"],
                            "per_structure": {structure_key(name): row for name, row in rule["per_structure"].items()},
                            "by_structure": rule["by_structure"],
                            "review_below_by_structure": rule["review_below_by_structure"]},
            "flags": _flags(rules, held.predicted, held.measured, held.patients, names)}
    return part, rules


def judged_on_test(metadata: BundleMetadata, records: Sequence[StoreRecord], rules: dict[str, dict[str, Any]]
              ) -> dict[str, Any] | None:
    """The test judgement (module docstring) on the test volumes the store holds by every member and the ensemble,
    the shipped model applied per member and flagging at each of ``rules``; None: no such volume."""
    names, model = list(metadata.class_names[1:]), metadata.quality
    by_case: dict[str, dict[Any, StoreRecord]] = {}
    for record in records:
        if record.role == TEST:
            by_case.setdefault(record.case, {})[record.member] = record
    members = list(range(metadata.ensemble_size))
    complete = sorted(case for case, found in by_case.items() if set(found) == {*members, ENSEMBLE})
    if not complete:
        return None
    member_rows = [by_case[case][member] for case in complete for member in members]
    member_predicted = member_predicted_dice(model, [record.features for record in member_rows], metadata.class_names)
    member_measured = np.array([record.dice for record in member_rows])
    per_case = (len(complete), len(members), -1)
    members_mean = np.array([combined_predicted_dice(rows) for rows in member_predicted.reshape(per_case)])
    measured = np.array([by_case[case][ENSEMBLE].dice for case in complete])
    patients = np.array([by_case[case][ENSEMBLE].patient for case in complete])
    difference = measured - member_measured.reshape(per_case).mean(axis=1)
    return {"volumes": len(complete), "patients": len(set(patients)),
            "members_mean": _by_structure(names, members_mean, measured, patients),
            "each_member_own_dice": _by_structure(names, member_predicted, member_measured,
                                                  np.array([record.patient for record in member_rows])),
            "ensemble_minus_members_mean_dice": {structure_key(name): list(mean_interval(difference[:, index],
                                                                                         patients))
                                                 for index, name in enumerate(names)},
            "flags_members_mean": _flags(rules, members_mean, measured, patients, names)}


def _triple(values: Sequence[float], digits: int = 3) -> str:
    value, low, high = values
    return f"{value:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def markdown(result: dict[str, Any]) -> list[str]:
    """The study's two tables: the predicted Dice against the measured, and the flags at each rule."""
    lines = ["| Where | Predicted from | Structure | bias | MAE | Spearman ρ |",
             "| --- | --- | --- | --- | --- | --- |"]
    sources = [(part, source, result[part][key]) for part, source, key in (
        ("out_of_fold", "the unseen member, held out", "held_out"), ("test", "each member's own, mean", "members_mean"))
        if part in result]
    for part, source, table in sources:
        for structure, entry in table.items():
            lines.append(f"| {part.replace('_', ' ')} | {source} | {structure.replace('_', ' ')} | "
                         f"{_triple(entry['bias'])} | {_triple(entry['mae'])[1:]} | {_triple(entry['spearman'], 2)} |")
    lines += ["", "| Where | Flag below | poor flagged / poor | good flagged / good |", "| --- | --- | --- | --- |"]
    for part, key in (("out_of_fold", "flags"), ("test", "flags_members_mean")):
        for name, counts in result.get(part, {}).get(key, {}).items():
            thresholds = thresholds_text(counts["review_below"], counts["review_below_by_structure"])
            lines.append(f"| {part.replace('_', ' ')} | {name.replace('_', ' ')}: {thresholds} | "
                         f"{flag_cells(counts)} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the tables; writes the record with ``--record``. Returns 0; bad input exits with one sentence."""
    arguments = study_arguments("python -m studies.ensemble_rules", __doc__.split("\n\n")[0], argv)
    bundle, records = quality_study(arguments)
    metadata = bundle.metadata
    result: dict[str, Any] = {
        "bundle": arguments.bundle, "weights_sha256": metadata.weights_sha256,
        "recorded": datetime.date.today().isoformat(),
        "command": f"python -m studies.ensemble_rules --bundle {arguments.bundle} --store <store>"
                   + ("" if arguments.record is None else f" --record {arguments.record}")}
    rules = {"shipped": shipped_rule(metadata.quality)}
    try:
        held = held_out(records, metadata.class_names)
        if held is not None:
            result["out_of_fold"], rules = judged_out_of_fold(metadata, held)
    except ValueError as error:  # QualityModelError: too few out-of-fold volumes show a structure
        raise SystemExit(f"error: {error}") from None
    tested = judged_on_test(metadata, records, rules)
    if tested is not None:
        result["test"] = tested
    return report_study(markdown(result), result, arguments.record)


if __name__ == "__main__":
    main()
