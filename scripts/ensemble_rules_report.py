"""An ensemble's quality model and review rule, judged out of fold and on the test patients, from the per-volume
records of :mod:`scripts.ensemble_quality_pass`.

    python -m scripts.ensemble_rules_report acdc_ce_dice --records /tmp/pass --out docs/records/quality/X.json
    flock /tmp/pretrained.lock python -m scripts.ensemble_rules_report acdc_ce_dice --records /tmp/pass \
        --write-bundle CalibSegLib/pretrained/acdc_ce_dice.calibseg

- **Out of fold** (the quality model's own fit data): each of the 130 volumes predicted by the member that never
  trained on it; its predicted Dice from a fit without its patient (:func:`CalibSegLib.quality.held_out_predictions`,
  the fit ``calibseg-ensemble`` made). The refit of all of them is compared with the shipped model's parameters, so
  the records are shown to be what the fit saw.
- **Test patients**: the shipped model applied as fitted, to each member's own prediction, the mean of the members'
  predicted Dice (:mod:`CalibSegLib.quality.members`), against the ensemble's measured Dice; beside it, today's
  numbers (the model applied to the average's features), from the shipped metrics file.
- **The review rule** (:func:`CalibSegLib.quality.review_rule.choose_review_rule`, pooled or per structure) on the
  out-of-fold predictions, and the chosen thresholds on the test patients, recall and false flags with
  patient-bootstrap intervals (:mod:`Evaluation.bootstrap`).
- **The input check from every member**: each member's feature Gaussian from the volumes of the patients it trained
  on (:func:`CalibSegLib.feature_statistics.fit_feature_statistics`), its distances of the volumes it never saw; the
  threshold per member (its 26) or pooled (all 130), and the members' verdicts on the test volumes combined by
  majority, any or all; beside the first member's alone (its Gaussian and its fold's threshold).

``--write-bundle PATH`` writes the bundle with these member statistics (the pooled threshold, the majority) as its
``input_statistics["member_features"]`` (:class:`CalibSegLib.feature_statistics.MemberFeatureStatistics`; version 4,
``features`` null), the rest of the bundle as it was (the weights byte-identical; temporary file, then rename). Each
member's layer is its own bottleneck (:func:`CalibSegLib.features.bottleneck_layer`), where
``scripts.ensemble_quality_pass --part encoders`` read the vectors.

``--write-quality PATH`` writes the bundle with its quality model applied as it was fitted (to each member,
``validation["applied_to"] = "members"``) and its review thresholds chosen by the rule on the out-of-fold records
(pooled, or per structure), the structures' fits unchanged (they are what the records refit to), the rest of the
bundle as it was; then ``calibseg-ship --rerecord`` measures its metrics again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy.stats import spearmanr

from CalibSegLib.bundle import BundleError, load_bundle
from CalibSegLib.feature_statistics import (FeatureStatistics, MemberFeatureStatistics, fit_feature_statistics,
                                            pool_member_statistics)
from CalibSegLib.features import bottleneck_layer
from CalibSegLib.input_check import InputStatistics, with_features
from CalibSegLib.io import write_json_atomic
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.quality import Observation, fit_from_observations, held_out_predictions, structure_key
from CalibSegLib.quality.members import combined_predicted_dice, member_predicted_dice
from CalibSegLib.quality.model import APPLIED_TO, MEMBERS, thresholds_text
from CalibSegLib.quality.review_rule import (GOOD_ABOVE, POOR_BELOW, TARGET_FALSE_FLAGS, TARGET_RECALL,
                                             choose_review_rule, flagged, trade_off)
from Evaluation.bootstrap import mean_interval, ratio_interval, spearman_interval
from Training.bundle_rewrite import rewrite_bundle
from Training.ensemble import member_patients

__all__ = ["agreement", "flag_counts", "member_statistics", "write_member_statistics", "write_quality_rule", "report",
           "markdown", "main"]


def _encoder_vectors(folder: Path) -> dict[str, dict[str, Any]]:
    """The records of ``ensemble_quality_pass --part encoders`` by case: ``patient`` and ``encoder_vectors``, one
    ``(F,)`` list per member."""
    return {item["case"]: item for item in map(json.loads, map(Path.read_text, sorted(folder.glob("*.json"))))}


def member_statistics(metadata: Any, vectors: dict[str, dict[str, Any]], layers: Sequence[str]
                      ) -> tuple[MemberFeatureStatistics, list[FeatureStatistics], list[tuple[str, int, float]]]:
    """Every member's Gaussian from the vectors of the patients it trained on, the threshold pooled over each
    member's distances of the volumes it never saw (:func:`CalibSegLib.feature_statistics.pool_member_statistics`);
    also each member's own fit (its own threshold from its 26 volumes) and the out-of-fold ``(case, member,
    distance)`` rows. ``layers``: each member's bottleneck, stored with its statistics."""
    fits, held_out = [], []
    for index, (trained, unseen) in enumerate(member_patients(metadata)):
        training = [np.array([item["encoder_vectors"][index]]) for item in vectors.values()
                    if item["patient"] in trained]
        validation = [(case, np.array([item["encoder_vectors"][index]])) for case, item in vectors.items()
                      if item["patient"] in unseen]
        gaussian = fit_feature_statistics(layers[index], training, [vector for _, vector in validation])
        fits.append(gaussian)
        held_out += [(case, index, gaussian.distance(vector)) for case, vector in validation]
    pooled = pool_member_statistics(fits, [[distance for _, member, distance in held_out if member == index]
                                           for index in range(len(fits))])
    return pooled, fits, held_out


def _input_check(metadata: Any, folder: Path, metrics: dict[str, Any] | None) -> dict[str, Any]:
    """The input check from every member (module docstring) on the encoder vectors under ``folder``."""
    vectors = _encoder_vectors(folder)
    tested = set(metadata.data["test"])
    members = metadata.ensemble["members"]
    pooled, statistics, held_out = member_statistics(metadata, vectors, [f"member {index}"
                                                                         for index in range(len(members))])
    own = [gaussian.threshold for gaussian in statistics]
    test_cases = sorted(case for case, item in vectors.items() if item["patient"] in tested)
    distances = np.array([[gaussian.distance(np.array([vectors[case]["encoder_vectors"][index]]))
                           for index, gaussian in enumerate(statistics)] for case in test_cases])
    result: dict[str, Any] = {
        "out_of_fold_volumes": len(held_out),
        "training_volumes": [gaussian.training_volumes for gaussian in statistics],
        "own_thresholds": own, "pooled_threshold": pooled.threshold,
        "pooled_within": pooled.members[0].validation_within,
        "held_out_distances": [{"case": case, "member": index, "distance": distance}
                               for case, index, distance in held_out],
        "test_volumes": len(test_cases),
        "test_distances": {case: row.tolist() for case, row in zip(test_cases, distances)}}
    for name, thresholds in (("pooled", np.full(len(members), pooled.threshold)), ("own", np.array(own))):
        above = distances > thresholds[None, :]
        result[f"test_unsuitable_{name}"] = {"majority": int((above.sum(axis=1) * 2 > len(members)).sum()),
                                             "any": int(above.any(axis=1).sum()), "all": int(above.all(axis=1).sum()),
                                             "per_member": above.sum(axis=0).tolist()}
    first_member = metadata.input_statistics.get("features")
    if metrics is not None and first_member is not None:  # the bundle still judged through its first member
        recorded = metrics["per_case"]["scaled"]
        today = first_member["threshold"]
        result["today"] = {"threshold": today, "unsuitable": sum(recorded[case]["feature_distance"] > today
                                                                 for case in test_cases),
                           "first_member_distances": {case: recorded[case]["feature_distance"] for case in test_cases}}
    return result


def write_member_statistics(bundle_name: str, encoders: Path, out: Path) -> MemberFeatureStatistics:
    """Write the bundle ``bundle_name`` to ``out`` judged by every member (module docstring) from the encoder
    vectors under ``encoders``; only ``input_statistics``' features change (the four families stay)."""
    bundle = load_bundle(resolve_bundle_path(bundle_name))
    metadata = bundle.metadata
    if metadata.ensemble_size < 2 or metadata.input_statistics is None:
        raise BundleError(f"{bundle_name} is not an ensemble with input statistics.")
    patch = metadata.sliding_window.patch_size
    layers = [bottleneck_layer(member, metadata.in_channels, patch) for member in bundle.build_model().members]
    vectors = _encoder_vectors(encoders)
    wanted = {patient for trained, unseen in member_patients(metadata) for patient in (*trained, *unseen)}
    missing = sorted(wanted - {item["patient"] for item in vectors.values()})
    if missing:
        raise BundleError(f"{encoders} holds no encoder vectors of {len(missing)} patients ({missing[0]} first); run "
                          f"python -m scripts.ensemble_quality_pass {bundle_name} --part encoders first.")
    pooled, _, _ = member_statistics(metadata, vectors, layers)
    statistics = InputStatistics.from_dict(metadata.input_statistics, metadata.class_names, metadata.in_channels)
    stored = with_features(statistics, pooled).to_dict()
    rewrite_bundle(bundle, dataclasses.replace(metadata, input_statistics=stored), out)
    return pooled


def write_quality_rule(bundle_name: str, records: Path, out: Path) -> dict[str, Any]:
    """Write the bundle ``bundle_name`` to ``out`` with its quality model applied per member and its review
    thresholds chosen on the out-of-fold records under ``records`` (module docstring); returns the rule."""
    bundle = load_bundle(resolve_bundle_path(bundle_name))
    metadata = bundle.metadata
    if metadata.ensemble_size < 2 or metadata.quality_model is None:
        raise BundleError(f"{bundle_name} is not an ensemble with a quality model.")
    out_of_fold = _records(records / "out_of_fold")
    if not out_of_fold:
        raise BundleError(f"{records / 'out_of_fold'} holds no records; run python -m scripts.ensemble_quality_pass "
                          f"{bundle_name} --part out_of_fold first.")
    observations = [Observation(item["patient"], item["features"], np.array(item["dice"])) for item in out_of_fold]
    rule = choose_review_rule(held_out_predictions(observations, metadata.class_names),
                              np.array([item.dice for item in observations]), metadata.class_names[1:])
    model = dataclasses.replace(metadata.quality, review_below=rule["review_below"],
                                review_below_by_structure=rule["review_below_by_structure"],
                                validation={**metadata.quality.validation, APPLIED_TO: MEMBERS})
    rewrite_bundle(bundle, dataclasses.replace(metadata, quality_model=model.to_dict()), out)
    return rule


def _records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.member*.json"))]


def agreement(predicted: np.ndarray, measured: np.ndarray, patients: np.ndarray) -> dict[str, Any]:
    """Bias (mean predicted − measured), MAE and Spearman ρ of ``(volumes,)`` predicted and measured Dice (NaN
    predicted: the structure drawn nowhere, left out), each with a patient-bootstrap 95 % interval."""
    kept = ~np.isnan(predicted)
    predicted, measured, patients = predicted[kept], measured[kept], patients[kept]
    bias, mae = mean_interval(predicted - measured, patients), mean_interval(np.abs(predicted - measured), patients)
    return {"volumes": int(kept.sum()), "bias": list(bias), "mae": list(mae),
            "spearman": [float(spearmanr(predicted, measured).statistic),
                         *spearman_interval(predicted, measured, patients)]}


def flag_counts(predicted: np.ndarray, measured: np.ndarray, patients: np.ndarray, review_below: np.ndarray
                ) -> dict[str, Any]:
    """Recall of poor structures and false flags among good ones over ``(volumes, structures)`` arrays at
    ``review_below`` (one per structure), with patient-bootstrap intervals."""
    marked = flagged(predicted, review_below[None, :])
    poor, good = measured < POOR_BELOW, measured > GOOD_ABOVE
    rows = np.repeat(patients, measured.shape[1])
    return {"poor": int(poor.sum()), "poor_flagged": int((marked & poor).sum()),
            "recall": list(ratio_interval((marked & poor).ravel(), poor.ravel(), rows)),
            "good": int(good.sum()), "good_flagged": int((marked & good).sum()),
            "false_flag_share": list(ratio_interval((marked & good).ravel(), good.ravel(), rows))}


def _by_structure(names: Sequence[str], predicted: np.ndarray, measured: np.ndarray, patients: np.ndarray
                  ) -> dict[str, Any]:
    return {structure_key(name): agreement(predicted[:, index], measured[:, index], patients)
            for index, name in enumerate(names)}


def report(bundle_name: str, records: Path, metrics: Path | None = None) -> dict[str, Any]:
    """Every number of the module docstring, as JSON; with only ``<records>/encoders`` (no quality pass), the input
    check alone."""
    metadata = load_bundle(resolve_bundle_path(bundle_name)).metadata
    if not (records / "out_of_fold").is_dir():
        return {"bundle": bundle_name, "command": f"python -m scripts.ensemble_rules_report {bundle_name}",
                "input_check": _input_check(metadata, records / "encoders", None)}
    model, names = metadata.quality, list(metadata.class_names[1:])
    out_of_fold = _records(records / "out_of_fold")
    observations = [Observation(item["patient"], item["features"], np.array(item["dice"])) for item in out_of_fold]
    held_out = held_out_predictions(observations, metadata.class_names)
    measured = np.array([item.dice for item in observations])
    patients = np.array([item.patient for item in observations])
    refit = fit_from_observations(observations, metadata.class_names)
    # The shipped model was fitted on these volumes: refitted on the records, it must predict what it predicts.
    refit_difference = max(abs(refit.structures[name].predict(values) - model.structures[name].predict(values))
                           for item in observations for name, values in zip(names, item.features)
                           if values is not None)
    rows = trade_off(held_out, measured)
    rule = choose_review_rule(held_out, measured, names)
    pooled = rule["pooled"]
    per_structure = {structure_key(name): row for name, row in rule["per_structure"].items()}
    shipped_thresholds = np.array([model.review_threshold(name) for name in names])
    result: dict[str, Any] = {
        "bundle": bundle_name, "command": f"python -m scripts.ensemble_rules_report {bundle_name}",
        "out_of_fold": {"volumes": len(observations), "patients": len(set(patients)),
                        "refit_largest_predicted_dice_difference": refit_difference,
                        "held_out": _by_structure(names, held_out, measured, patients),
                        "review_rule": {"poor_below": POOR_BELOW, "good_above": GOOD_ABOVE,
                                        "target_recall": TARGET_RECALL, "target_false_flags": TARGET_FALSE_FLAGS,
                                        "table": rows, "pooled": pooled, "per_structure": per_structure,
                                        "by_structure": rule["by_structure"],
                                        "review_below_by_structure": rule["review_below_by_structure"]},
                        "flags_at_shipped": flag_counts(held_out, measured, patients, shipped_thresholds),
                        "flags_at_pooled": flag_counts(held_out, measured, patients,
                                                       np.full(len(names), pooled["review_below"])),
                        "flags_at_per_structure": flag_counts(held_out, measured, patients, np.array(
                            [per_structure[structure_key(name)]["review_below"] for name in names]))}}
    shipped = None if metrics is None else json.loads(metrics.read_text())
    if (records / "encoders").is_dir():
        result["input_check"] = _input_check(metadata, records / "encoders", shipped)
    tested = _records(records / "test")
    cases = sorted({item["case"] for item in tested})
    complete = [case for case in cases
                if sum(item["case"] == case for item in tested) == metadata.ensemble_size]
    if shipped is None or not complete:  # no test volume yet predicted by every member
        return result
    per_case = shipped["per_case"]["scaled"]
    by_case = {case: sorted((item for item in tested if item["case"] == case), key=lambda item: item["member"])
               for case in complete}
    members_mean = np.array([combined_predicted_dice(member_predicted_dice(
        model, [item["features"] for item in by_case[case]], metadata.class_names)) for case in complete])
    ensemble_dice = np.array([[per_case[case][f"dice_{structure_key(name)}"] for name in names] for case in complete])
    today = np.array([[per_case[case][f"predicted_dice_{structure_key(name)}"] for name in names]
                      for case in complete])
    test_patients = np.array([shipped["case_patients"][case] for case in complete])
    member_rows = [item for case in complete for item in by_case[case]]
    member_predicted = np.array([member_predicted_dice(model, [item["features"]], metadata.class_names)[0]
                                 for item in member_rows])
    member_measured = np.array([item["dice"] for item in member_rows])
    member_patients = np.array([item["patient"] for item in member_rows])
    result["test"] = {
        "volumes": len(complete), "patients": len(set(test_patients)),
        "members_mean": _by_structure(names, members_mean, ensemble_dice, test_patients),
        "today_average_features": _by_structure(names, today, ensemble_dice, test_patients),
        "each_member_own_dice": _by_structure(names, member_predicted, member_measured, member_patients),
        "ensemble_minus_members_mean_dice": {
            structure_key(name): list(mean_interval(ensemble_dice[:, index] - np.mean(
                [[item["dice"][index] for item in by_case[case]] for case in complete], axis=1), test_patients))
            for index, name in enumerate(names)},
        "flags_members_mean_at_shipped": flag_counts(members_mean, ensemble_dice, test_patients, shipped_thresholds),
        "flags_today_at_shipped": flag_counts(today, ensemble_dice, test_patients, shipped_thresholds),
        "flags_members_mean_at_pooled": flag_counts(members_mean, ensemble_dice, test_patients,
                                                    np.full(len(names), pooled["review_below"])),
        "flags_members_mean_at_per_structure": flag_counts(members_mean, ensemble_dice, test_patients, np.array(
            [per_structure[structure_key(name)]["review_below"] for name in names]))}
    return result


def _triple(values: Sequence[float], digits: int = 3) -> str:
    value, low, high = values
    return f"{value:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def _flags(counts: dict[str, Any]) -> str:
    recall, false_flags = counts["recall"], counts["false_flag_share"]
    return (f"{counts['poor_flagged']} / {counts['poor']} ({recall[0]:.0%} [{recall[1]:.0%}, {recall[2]:.0%}]) | "
            f"{counts['good_flagged']} / {counts['good']} ({false_flags[0]:.0%} [{false_flags[1]:.0%}, "
            f"{false_flags[2]:.0%}])")


def markdown(result: dict[str, Any]) -> list[str]:
    """The report's tables as docs/results.md shows them."""
    lines = ["| Where | Predicted from | Structure | bias | MAE | Spearman ρ |",
             "| --- | --- | --- | --- | --- | --- |"]
    sources = [("out of fold", "the unseen member (held out)", result["out_of_fold"]["held_out"])]
    if "test" in result:
        sources += [("test", "the average's features (until now)", result["test"]["today_average_features"]),
                    ("test", "each member's own, mean", result["test"]["members_mean"])]
    for where, source, table in sources:
        for structure, entry in table.items():
            lines.append(f"| {where} | {source} | {structure.replace('_', ' ')} | {_triple(entry['bias'])} | "
                         f"{_triple(entry['mae'])[1:]} | {_triple(entry['spearman'], 2)} |")
    lines += ["", "| Where | Flag | poor flagged / poor | good flagged / good |", "| --- | --- | --- | --- |"]
    out_of_fold = result["out_of_fold"]
    pooled = out_of_fold["review_rule"]["pooled"]["review_below"]
    choice = " (the rule's choice)"
    chosen = ("", choice) if out_of_fold["review_rule"].get("by_structure") else (choice, "")
    lines.append(f"| out of fold | below {pooled:.2f}, pooled{chosen[0]} | {_flags(out_of_fold['flags_at_pooled'])} |")
    lines.append(f"| out of fold | per structure{chosen[1]} | {_flags(out_of_fold['flags_at_per_structure'])} |")
    if "test" in result:
        test = result["test"]
        lines.append(f"| test | average's features, shipped threshold | {_flags(test['flags_today_at_shipped'])} |")
        lines.append(f"| test | members' mean, shipped threshold | {_flags(test['flags_members_mean_at_shipped'])} |")
        lines.append(f"| test | members' mean, below {pooled:.2f} | {_flags(test['flags_members_mean_at_pooled'])} |")
        lines.append(f"| test | members' mean, per structure | {_flags(test['flags_members_mean_at_per_structure'])} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Writes the report (atomically) and prints it; returns 0. Bad input exits with one sentence."""
    parser = argparse.ArgumentParser(prog="python -m scripts.ensemble_rules_report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", help="a shipped ensemble's name or a .calibseg path")
    parser.add_argument("--records", type=Path, required=True, help="the pass's folder (out_of_fold/, test/)")
    parser.add_argument("--metrics", type=Path, default=None, help="the shipped metrics file (today's numbers)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--markdown", action="store_true", help="print the tables instead of the JSON")
    parser.add_argument("--write-bundle", type=Path, default=None, metavar="PATH",
                        help="write the bundle judged by every member (from <records>/encoders) here and stop")
    parser.add_argument("--write-quality", type=Path, default=None, metavar="PATH",
                        help="write the bundle with its quality model applied per member and the review rule's "
                             "thresholds (from <records>/out_of_fold) here and stop")
    arguments = parser.parse_args(argv)
    if arguments.write_quality is not None:
        try:
            rule = write_quality_rule(arguments.bundle, arguments.records, arguments.write_quality)
        except (BundleError, OSError, ValueError) as error:
            raise SystemExit(f"error: {error}") from None
        print(f"{arguments.write_quality}: quality model applied per member, review below "
              f"{thresholds_text(rule['review_below'], rule['review_below_by_structure'])}")
        return 0
    if arguments.write_bundle is not None:
        try:
            pooled = write_member_statistics(arguments.bundle, arguments.records / "encoders", arguments.write_bundle)
        except (BundleError, OSError, ValueError) as error:
            raise SystemExit(f"error: {error}") from None
        first = pooled.members[0]
        print(f"{arguments.write_bundle}: {len(pooled.members)} members' feature statistics, threshold "
              f"{pooled.threshold:.1f} pooled over {first.validation_volumes} out-of-fold volumes "
              f"({first.validation_within} within), {pooled.combination} deciding")
        return 0
    try:
        result = report(arguments.bundle, arguments.records, arguments.metrics)
    except (BundleError, OSError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    text = json.dumps(result, indent=1, default=float)
    if arguments.out is not None:
        write_json_atomic(arguments.out, result)
    print("\n".join(markdown(result)) if arguments.markdown and "out_of_fold" in result else text)
    return 0


if __name__ == "__main__":
    main()
