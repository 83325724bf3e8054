"""The studies of the quality model and its review rule read from a small store (studies/ensemble_rules.py,
studies/review_rule_table.py and their shared reading in studies/store_study.py): a tiny five-member ensemble whose
quality model was fitted on its synthetic out-of-fold records, each number checked against a count or mean made
here from the records themselves."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from CalibSegLib.bundle import load_bundle
from CalibSegLib.bundle.ensemble import SelectedFrom
from CalibSegLib.quality import Observation
from CalibSegLib.quality.fitting import fit_from_observations
from CalibSegLib.quality.model import APPLIED_TO, MEMBERS
from CalibSegLib.quality.review_rule import THRESHOLDS, choose_review_threshold, fold_numbers, trade_off
from CalibSegLib.store import ENSEMBLE, OUT_OF_FOLD, TEST, record_path, write_record
from Datasets.acdc import ACDC_CLASS_NAMES, ACDC_TERMINOLOGY
from fault_checks import assert_one_sentence
from studies import ensemble_rules, review_rule_nested, review_rule_table
from studies.store_study import held_out
from Training.fit import out_of_fold_folds
from test_store import _fixture_store
from tiny_bundles import make_test_ensemble

SHIPPED_REVIEW_BELOW = 0.88
LV = 2  # the left ventricle's column among ACDC's structures (RV, myocardium, LV)


def _ensemble(path, **overrides):
    """A tiny five-member ensemble over ACDC's classes whose members never saw the fixture's out-of-fold patients
    ``oof<n>`` with n % 5 = m, tested on ``test000``-``test002``."""
    return make_test_ensemble(path, size=overrides.pop("size", 5), validation=overrides.pop("validation", [
        [f"oof{number:03d}" for number in range(14) if number % 5 == member] for member in range(5)]),
        class_names=list(ACDC_CLASS_NAMES), class_colors=[(0, 0, 0)] * 4, class_terminology=ACDC_TERMINOLOGY,
        data={"dataset": "acdc", "train": [f"oof{number:03d}" for number in range(14)], "val": [],
              "test": [f"test{number:03d}" for number in range(3)]}, **overrides)


@pytest.fixture
def study(tmp_path):
    """The bundle (its quality model fitted on the out-of-fold records, flagging below 0.88), its store, and the
    records: test000-002 by each member and by the ensemble, whose measured Dice is the members' mean + 0.01."""
    synthetic = _fixture_store(tmp_path / "synthetic", np.random.default_rng(11))[1]
    members = {}
    for record in synthetic:
        members.setdefault(record.case, []).append(record)
    records = [record if record.member != ENSEMBLE else dataclasses.replace(record, dice=list(
        np.mean([other.dice for other in members[record.case] if other.member != ENSEMBLE], axis=0) + 0.01))
        for record in synthetic]
    observations = [Observation(record.patient, record.features, np.asarray(record.dice))
                    for record in records if record.role == OUT_OF_FOLD]
    model = fit_from_observations(observations, ACDC_CLASS_NAMES, review_below=SHIPPED_REVIEW_BELOW,
                                  validation={APPLIED_TO: MEMBERS})
    path = _ensemble(tmp_path / "tiny.calibseg", quality_model=model.to_dict())
    sha = load_bundle(path).metadata.weights_sha256
    records = [dataclasses.replace(record, weights_sha256=sha) for record in records]
    for record in records:
        write_record(tmp_path / "store", record)
    return path, tmp_path / "store", records


def _run(main, path, store, record, capsys) -> tuple[dict, str]:
    assert main(["--bundle", str(path), "--store", str(store), "--record", str(record)]) == 0
    return json.loads(record.read_text()), capsys.readouterr().out


def _out_of_fold(records):
    """The out-of-fold records in the quality fit's order: member by member, then case."""
    return sorted((record for record in records if record.role == OUT_OF_FOLD),
                  key=lambda record: (record.member, record.case))


def test_each_out_of_fold_volume_is_predicted_by_a_fit_without_its_patient(study):
    _, _, records = study
    held = held_out(records, ACDC_CLASS_NAMES)
    out_of_fold = _out_of_fold(records)
    assert len(held.observations) == len(out_of_fold) == 28 and len(set(held.patients)) == 14
    np.testing.assert_array_equal(held.measured, [record.dice for record in out_of_fold])
    first = out_of_fold[0]
    without = fit_from_observations([Observation(record.patient, record.features, np.asarray(record.dice))
                                     for record in out_of_fold if record.patient != first.patient], ACDC_CLASS_NAMES)
    assert held.predicted[0, LV] == pytest.approx(without.structures["left ventricle"].predict(first.features[LV]))
    assert held_out([record for record in records if record.role == TEST], ACDC_CLASS_NAMES) is None


def test_the_rules_study_counts_flags_and_means_as_the_records_give_them(study, tmp_path, capsys):
    path, store, records = study
    result, printed = _run(ensemble_rules.main, path, store, tmp_path / "rules.json", capsys)
    out_of_fold = result["out_of_fold"]
    assert (out_of_fold["volumes"], out_of_fold["patients"]) == (28, 14)
    # the shipped model was fitted on exactly these records: the refit predicts what it predicts
    assert out_of_fold["refit_largest_predicted_dice_difference"] < 1e-9
    held = held_out(records, ACDC_CLASS_NAMES)
    marked = np.isnan(held.predicted) | (held.predicted < SHIPPED_REVIEW_BELOW)
    shipped = out_of_fold["flags"]["shipped"]
    assert shipped["poor"] == int((held.measured < 0.8).sum())
    assert shipped["poor_flagged"] == int((marked & (held.measured < 0.8)).sum())
    assert shipped["good_flagged"] == int((marked & (held.measured > 0.9)).sum())
    recalls = {threshold: ((np.isnan(held.predicted) | (held.predicted < threshold)) & (held.measured < 0.8)).sum()
               / max((held.measured < 0.8).sum(), 1) for threshold in THRESHOLDS}
    smallest = next((threshold for threshold in THRESHOLDS if recalls[threshold] >= 0.9), THRESHOLDS[-1])
    assert out_of_fold["review_rule"]["pooled"]["review_below"] == smallest
    assert out_of_fold["flags"]["pooled"]["review_below"] == smallest

    test = result["test"]
    assert (test["volumes"], test["patients"]) == (6, 3)
    model = load_bundle(path).metadata.quality
    cases = sorted({record.case for record in records if record.role == TEST})
    errors, gains = [], []
    for case in cases:
        by_member = {record.member: record for record in records if record.case == case}
        members = [by_member[member] for member in range(5)]
        predicted = np.mean([model.structures["left ventricle"].predict(member.features[LV]) for member in members])
        errors.append(predicted - by_member[ENSEMBLE].dice[LV])
        gains.append(by_member[ENSEMBLE].dice[LV] - np.mean([member.dice[LV] for member in members]))
    assert test["members_mean"]["left_ventricle"]["bias"][0] == pytest.approx(np.mean(errors))
    assert test["members_mean"]["left_ventricle"]["mae"][0] == pytest.approx(np.mean(np.abs(errors)))
    assert test["ensemble_minus_members_mean_dice"]["left_ventricle"][0] == pytest.approx(0.01)
    assert test["each_member_own_dice"]["left_ventricle"]["volumes"] == 30
    assert f"| out of fold | shipped: {SHIPPED_REVIEW_BELOW:.2f} | {shipped['poor_flagged']} / {shipped['poor']} (" \
        in printed

    # a test volume the ensemble has not predicted yet is left out, not half judged
    record_path(store, load_bundle(path).metadata.weights_sha256, cases[0], ENSEMBLE).unlink()
    result, _ = _run(ensemble_rules.main, path, store, tmp_path / "rules.json", capsys)
    assert result["test"]["volumes"] == 5


def test_the_trade_off_table_counts_every_threshold(study, tmp_path, capsys):
    path, store, records = study
    result, printed = _run(review_rule_table.main, path, store, tmp_path / "table.json", capsys)
    held = held_out(records, ACDC_CLASS_NAMES)
    poor, good = held.measured < 0.8, held.measured > 0.9
    assert [row["review_below"] for row in result["table"]] == list(THRESHOLDS)
    for row in result["table"]:
        marked = np.isnan(held.predicted) | (held.predicted < row["review_below"])
        assert (row["poor_flagged"], row["good_flagged"]) == ((marked & poor).sum(), (marked & good).sum())
    chosen = result["chosen"]
    assert sum(row["poor_flagged"] for row in result["per_structure"].values()) == chosen["poor_flagged"]
    assert sum(row["good"] for row in result["per_structure"].values()) == chosen["good"]
    assert len(result["held_out"]) == 28
    assert f"| {chosen['review_below']:.2f} **(rule)** |" in printed


def test_each_choice_is_judged_on_folds_it_was_not_chosen_on(study, tmp_path, capsys):
    path, store, records = study
    held = held_out(records, ACDC_CLASS_NAMES)
    folds = out_of_fold_folds(records)
    assert held.folds == folds == [[f"oof{number:03d}" for number in range(14) if number % 5 == member]
                                   for member in range(5)]
    names = list(ACDC_CLASS_NAMES[1:])
    numbers = fold_numbers(held.patients, folds)
    assert held.volume_folds.tolist() == numbers.tolist()
    pooled = review_rule_nested.nested(held, review_rule_nested.CHOICES["pooled"], names)
    for fold in folds:
        inside = np.isin(held.patients, fold)
        chosen = choose_review_threshold(trade_off(held.predicted[~inside], held.measured[~inside]))
        assert (pooled[inside] == chosen["review_below"]).all()
    own = review_rule_nested.CHOICES["per_structure"](held.predicted, held.measured, names, numbers)
    poor = (held.measured < 0.8).sum(axis=0)
    pooled_all = review_rule_nested.CHOICES["pooled"](held.predicted, held.measured, names, numbers)
    pulled = pooled_all + poor / (poor + review_rule_nested.PRIOR_POOR) * (own - pooled_all)
    shrunk = review_rule_nested.CHOICES["shrunk"](held.predicted, held.measured, names, numbers)
    assert np.abs(shrunk - pulled).max() <= 0.005 + 1e-12 and set(shrunk) <= set(THRESHOLDS)
    result, printed = _run(review_rule_nested.main, path, store, tmp_path / "nested.json", capsys)
    marked = np.isnan(held.predicted) | (held.predicted < pooled)
    nested = result["nested"]["pooled"]
    assert nested["poor_flagged"] == int((marked & (held.measured < 0.8)).sum())
    assert nested["good_flagged"] == int((marked & (held.measured > 0.9)).sum())
    assert set(result["nested"]) == set(result["test"]["flags_members_mean"]) == set(review_rule_nested.CHOICES)
    assert f"| pooled | {result['thresholds']['pooled']['review_below']:.2f} | nested out of fold | " in printed


def test_a_sub_ensemble_is_judged_on_the_out_of_fold_records_of_its_ensemble(study, tmp_path, capsys):
    """Its quality model was fitted on the five's out-of-fold volumes: those are read with its own test volumes,
    not the five's test volumes."""
    path, store, records = study
    five = load_bundle(path).metadata
    sub = _ensemble(tmp_path / "sub.calibseg", size=2, validation=[["oof000"], ["oof001"]],
                    quality_model=five.quality_model,
                    selected_from=SelectedFrom("tiny.calibseg", five.weights_sha256, (4, 1)))
    sha = load_bundle(sub).metadata.weights_sha256
    for record in records:
        if record.role == TEST and record.member in (4, 1, ENSEMBLE) and record.patient != "test002":
            member = {4: 0, 1: 1}.get(record.member, ENSEMBLE)
            write_record(store, dataclasses.replace(record, weights_sha256=sha, member=member))
    result, _ = _run(ensemble_rules.main, sub, store, tmp_path / "sub.json", capsys)
    assert result["out_of_fold"]["volumes"] == 28
    assert result["test"]["volumes"] == 4  # its own two test patients, not the five's three


def test_bad_input_is_one_sentence(study, tmp_path):
    path, store, records = study
    without_model = _ensemble(tmp_path / "plain.calibseg")
    tested_only = tmp_path / "tested_only"
    for record in records:
        if record.role == TEST:
            write_record(tested_only, record)
    for main, bundle, folder, pattern in (
            (ensemble_rules.main, without_model, store, r"is no cross-validation ensemble with a quality model"),
            (ensemble_rules.main, path, tmp_path / "empty", r"holds no record of the weights"),
            (review_rule_table.main, path, tested_only, r"holds no out-of-fold record of .*--part out_of_fold\.$")):
        with pytest.raises(SystemExit) as exit_status:
            main(["--bundle", str(bundle), "--store", str(folder)])
        message = str(exit_status.value.code)
        assert message.startswith("error: ")
        assert_one_sentence(message[len("error: "):], pattern)
