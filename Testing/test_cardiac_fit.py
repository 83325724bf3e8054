"""The interval rule's fit and measurement (Evaluation.function_intervals) on synthetic per-volume records."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from CalibSegLib.bundle import read_metadata
from CalibSegLib.bundle.ensemble import SelectedFrom
from CalibSegLib.interval_rule import INDICES, IntervalRule
from CalibSegLib.quality.fitting import Observation, fit_from_observations
from CalibSegLib.quality.model import APPLIED_TO, MEMBERS
from Datasets.acdc import ACDC_CLASS_NAMES, ACDC_SPACING
from Datasets.errors import DataError
from Evaluation.function_intervals import (attach_observed_dice, fit_and_measure, markdown_table, models_table,
                                           patient_volumes)
from cardiac_standins import cardiac_metadata
from tiny_bundles import ensemble_section

STRUCTURES = ("lv", "rv", "myocardium")


def _phase(rng: np.random.Generator, volumes: dict[str, float], band: float) -> dict[str, dict[str, float]]:
    """A predicted phase: hard volumes off the reference by a band-sized error, soft ones nearer."""
    return {name: {"hard": volumes[name] + band * rng.normal(), "soft": volumes[name] + 0.5 * band * rng.normal(),
                   "spread": band} for name in STRUCTURES}


def _records(rng: np.random.Generator, side: str, patients: int, members: int) -> list[dict]:
    records = []
    for number in range(patients):
        patient = f"{side}{number:03d}"
        reference = {"ed": {"lv": rng.uniform(120, 200), "rv": rng.uniform(120, 200), "myocardium": 100.0},
                     "es": {"lv": rng.uniform(40, 90), "rv": rng.uniform(50, 100), "myocardium": 110.0}}
        for frame, phase in ((1, "ed"), (12, "es")):
            band = rng.uniform(1, 6)
            record = {"case": f"{patient}_frame{frame:02d}", "patient": patient, "side": side,
                      "weights_sha256": "abc", "reference": reference[phase],
                      "members": {str(index): _phase(rng, reference[phase], band)
                                  for index in (range(members) if side == "test" else [number % 5])}}
            if side == "test":
                record["ensemble"] = _phase(rng, reference[phase], band / 2)
            records.append(record)
    return records


def test_fit_chooses_on_out_of_fold_patients_and_measures_the_test_ones():
    rng = np.random.default_rng(0)
    collected = _records(rng, "oof", 40, 1) + _records(rng, "test", 8, 5)
    assert len(patient_volumes(collected, "oof")) == 40
    rule, measured = fit_and_measure(collected)
    assert isinstance(rule, IntervalRule) and set(rule.quantiles) == set(INDICES)
    assert rule.fitted_on["patients"] == 40
    candidates = measured["out_of_fold"]["leave_one_out"]
    assert set(candidates) == {f"{estimate}/{scale}/{recalibration}" for estimate in ("hard", "soft")
                               for scale in ("spread", "constant") for recalibration in ("none", "linear")}
    widths = {name: entry["lv_ef_percent"]["median_width"]["value"] + entry["rv_ef_percent"]["median_width"]["value"]
              for name, entry in candidates.items()}
    recalibration = "none" if rule.recalibration is None else "linear"
    assert measured["out_of_fold"]["chosen"] == min(widths, key=widths.get) == \
        f"{rule.estimate}/{rule.scale}/{recalibration}"
    # soft volumes are the nearer ones here, so the leave-one-out choice must find them
    assert rule.estimate == "soft"
    methods = measured["test"]["methods"]
    assert len(methods) in (4, 5) and "members' min-max" in methods
    for summary in methods.values():
        assert 0.0 <= summary["lv_ef_percent"]["coverage"]["value"] <= 1.0
        assert summary["lv_ef_percent"]["coverage"]["low"] <= summary["lv_ef_percent"]["coverage"]["value"]
    assert measured["test"]["patients"] == [f"test{number:03d}" for number in range(8)]


def test_too_few_patients_is_one_sentence():
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match="^Only 6 out-of-fold patients are stored; a 90 % rule needs at least 10"):
        fit_and_measure(_records(rng, "oof", 6, 1))


def test_the_documented_tables_are_the_recorded_ones(repo_root):
    """docs/function.md shows each committed record's test table and docs/results.md the models' table made of
    them, digit for digit."""
    records = [json.loads(path.read_text())
               for path in sorted((repo_root / "docs" / "records" / "function").glob("*.json"))]
    assert records
    function_page = (repo_root / "docs" / "function.md").read_text()
    for record in records:
        assert "\n".join(markdown_table(record)) in function_page
    assert "\n".join(models_table(records)) in (repo_root / "docs" / "results.md").read_text()


def observations(rng: np.random.Generator, records: list[dict]) -> tuple[list[dict], list[dict]]:
    """Quality observations of the records' predictions, out of fold and on the test volumes, as the store gives
    them (:func:`Evaluation.function_intervals.stored_observations`): features whose voxels are the records' label
    volumes, and a Dice that falls with the entropy."""
    voxel = float(np.prod(ACDC_SPACING)) / 1000.0
    observed: dict[str, list[dict]] = {"oof": [], "test": []}
    for record in records:
        for member, phase in record["members"].items():
            features, dice = [], []
            for structure in ("rv", "myocardium", "lv"):  # ACDC's class order after the background
                entropy = rng.uniform(0.05, 0.4)
                features.append({"voxels": phase[structure]["hard"] / voxel, "mean_confidence": 1 - entropy / 2,
                                 "mean_entropy": entropy, "low_confidence_fraction": entropy / 4,
                                 "boundary_entropy_ratio": 2 * entropy, "boundary_low_confidence_ratio": entropy,
                                 "expected_dice": 1 - entropy / 3, "log_volume_ml": 4.0})
                dice.append(float(np.clip(0.98 - 0.5 * entropy + rng.normal(0, 0.02), 0, 1)))
            observed[record["side"]].append({"case": record["case"], "patient": record["patient"],
                                             "member": int(member), "features": features, "dice": dice})
    return observed["oof"], observed["test"]


def test_predicted_dice_is_held_out_out_of_fold_and_the_members_mean_on_test():
    """Out of fold each volume's predicted Dice is the quality model's fitted without its patient (checked against
    a fit on the other patients); on a test volume each member's is the bundle's model on its features and the
    ensemble's their mean. Observations of another prediction, or a model applied to the average, are refused."""
    rng = np.random.default_rng(5)
    records = _records(rng, "oof", 12, 1) + _records(rng, "test", 2, 5)
    fitted, tested = observations(rng, records)
    fitted_observations = [Observation(item["patient"], item["features"], np.asarray(item["dice"]))
                           for item in fitted]
    model = fit_from_observations(fitted_observations, ACDC_CLASS_NAMES, validation={APPLIED_TO: MEMBERS})
    bundle = SimpleNamespace(metadata=cardiac_metadata(quality_model=model.to_dict()))
    attached = attach_observed_dice(records, fitted, tested, bundle, "the store")
    held = attached[0]  # patient oof000's ED, predicted by member 0
    without = fit_from_observations([item for item in fitted_observations if item.patient != held["patient"]],
                                    ACDC_CLASS_NAMES)
    features = next(item["features"] for item in fitted if item["case"] == held["case"])
    assert held["members"]["0"]["lv"]["predicted_dice"] == pytest.approx(
        without.structures["left ventricle"].predict(features[2]))
    assert held["members"]["0"]["lv"]["predicted_dice"] != pytest.approx(
        model.structures["left ventricle"].predict(features[2]))  # not the in-sample prediction
    test = next(record for record in attached if record["side"] == "test")
    members = {item["member"]: item["features"] for item in tested if item["case"] == test["case"]}
    assert test["ensemble"]["rv"]["predicted_dice"] == pytest.approx(
        np.mean([model.structures["right ventricle"].predict(members[member][0]) for member in range(5)]))
    assert {patient.patient for patient in patient_volumes(attached, "oof")} == {f"oof{n:03d}" for n in range(12)}
    # a sub-ensemble of members 4 and 1 reads their test observations under their numbers in the five
    selected_from = SelectedFrom("five.calibseg", "five", (4, 1))
    sub = SimpleNamespace(metadata=cardiac_metadata(quality_model=model.to_dict(), ensemble_size=2,
                                                    ensemble=ensemble_section(2, selected_from)))
    renumbered = {**test, "members": {"0": test["members"]["4"], "1": test["members"]["1"]}}
    sub_test, = attach_observed_dice([renumbered], fitted, tested, sub, "the store")
    assert sub_test["members"]["0"]["rv"]["predicted_dice"] == pytest.approx(
        test["members"]["4"]["rv"]["predicted_dice"])
    assert sub_test["ensemble"]["rv"]["predicted_dice"] == pytest.approx(np.mean(
        [model.structures["right ventricle"].predict(members[index][0]) for index in (4, 1)]))
    assert patient_volumes(attached, "oof")[0].members[0][0].lv.predicted_dice is not None
    averaged = SimpleNamespace(metadata=cardiac_metadata(quality_model=fit_from_observations(
        fitted_observations, ACDC_CLASS_NAMES).to_dict()))
    with pytest.raises(DataError, match="^The bundle's quality model is absent or applied to the members' average"):
        attach_observed_dice(records, fitted, tested, averaged, "the store")
    moved = [{**item, "features": [*item["features"][:2], {**item["features"][2],
                                                           "voxels": item["features"][2]["voxels"] + 10}]}
             if item["case"] == held["case"] else item for item in fitted]
    with pytest.raises(DataError, match=rf"^The quality observation of {held['case']} by member 0 draws lv at "):
        attach_observed_dice(records, moved, tested, bundle, "the store")
    with pytest.raises(DataError, match=rf"^the store holds no quality observation of {held['case']} by member 0;"):
        attach_observed_dice(records, fitted[1:], tested, bundle, "the store")


def test_each_shipped_bundle_carries_the_rule_its_record_holds(repo_root):
    """The function_intervals of each shipped bundle a record describes are the record's fitted rule (the record
    and the bundle are written by one command; a bundle rewritten since without its record would fail here)."""
    for path in sorted((repo_root / "docs" / "records" / "function").glob("*.json")):
        record = json.loads(path.read_text())
        metadata = read_metadata(repo_root / "CalibSegLib" / "pretrained" / f"{record['bundle']}.calibseg")
        assert IntervalRule.from_dict(metadata.function_intervals) == IntervalRule.from_dict(record["rule"])
