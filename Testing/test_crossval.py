"""Cross-validation: the folds (patient-level, seeded, stratified, test patients in none), ``calibseg-train --fold``,
the out-of-fold records and summary with patient-level intervals, the paired comparisons, and the ensemble built from
the folds (``calibseg-ensemble``) with its quality check fitted out of fold."""

from __future__ import annotations

import json
import shutil
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import friedmanchisquare, wilcoxon

from CalibSegLib.bundle import load_bundle
from CalibSegLib.bundle.ensemble import SelectedFrom
from Datasets.errors import DataError
from Datasets.splits import load_split
from Datasets.splits.folds import SHIPPED_FOLDS, default_folds_for, fold_split, load_folds, make_folds
from Datasets.splits.make_splits import group_of
from Evaluation.bootstrap import group_draws, mean_interval, paired_difference, ratio_interval
from Evaluation.crossval import CaseResults, cross_validation_summary, paired_comparisons
from Evaluation.summary import VARIANTS
from Reporting import crossval as crossval_cli
from Training import ensemble as ensemble_cli
from Training import train as train_cli
from Training import sub_ensemble as sub_ensemble_cli
from Training.fit_input_check import refit_input_check
from Training.sub_ensemble import sub_ensemble
from fault_checks import assert_one_sentence, tree_snapshot

TINY_FLAGS = ["--epochs", "1", "--iterations-per-epoch", "2", "--patch-size", "32", "--batch-size", "2",
              "--network-arg", "channels=[4,8]", "--network-arg", "strides=[2]", "--network-arg", "num_res_units=0",
              "--device", "cpu", "--no-compile", "--no-eval", "--method", "ce_dice"]
SPLITS = Path(__file__).resolve().parents[1] / "Datasets" / "splits"


def _patients(count: int) -> list[str]:
    return [f"patient{number:03d}" for number in range(1, count + 1)]


def test_folds_deal_every_patient_once_and_keep_the_test_patients_out():
    patients, test = _patients(40), ["patient003", "patient017", "patient030"]
    folds = make_folds(patients, 5, seed=7, test=test)
    dealt = [patient for fold in folds["folds"] for patient in fold]
    assert sorted(dealt) == sorted(set(patients) - set(test))
    assert folds["test"] == sorted(test)
    assert max(map(len, folds["folds"])) - min(map(len, folds["folds"])) <= 1
    assert make_folds(list(reversed(patients)), 5, seed=7, test=test) == folds  # the order given does not matter
    assert make_folds(patients, 5, seed=8, test=test) != folds  # the seed does
    for fold in range(5):
        split = fold_split(folds, fold)
        assert not set(split["train"]) & set(split["val"]) and not set(split["train"] + split["val"]) & set(test)
        assert sorted(split["train"] + split["val"]) == sorted(dealt)


def test_folds_are_stratified_by_group():
    patients = _patients(100)
    folds = make_folds(patients, 5, seed=0, group_of=group_of)
    for fold in folds["folds"]:
        assert sorted({group_of(patient) for patient in fold}) == ["DCM", "HCM", "MINF", "NOR", "RV"]
        assert all(sum(group_of(patient) == group for patient in fold) == 4 for group in ("DCM", "RV"))


def test_the_shipped_acdc_folds_split_the_training_and_validation_patients_and_hold_the_test_ones_back():
    full = load_split(SPLITS / "acdc.json")
    shipped = load_folds(SHIPPED_FOLDS)
    assert [len(fold) for fold in shipped["folds"]] == [13] * 5
    assert shipped["test"] == sorted(full["test"])
    assert sorted(patient for fold in shipped["folds"] for patient in fold) == sorted(full["train"] + full["val"])
    # what make_splits.py deals, recomputed: the file is the seeded deal, not a hand-made list
    assert make_folds(full["train"] + full["val"], 5, 2024, full["test"], group_of) == shipped
    assert default_folds_for(_patients(100)) == SHIPPED_FOLDS
    assert default_folds_for(_patients(50)) is None


@pytest.mark.parametrize("payload, pattern", [
    ({"test": ["a"], "folds": [["b"], ["a"]]}, "names a twice"),
    ({"test": [], "folds": [["b", "c"], ["c"]]}, "names c twice"),
    ({"test": [], "folds": [["b"]]}, "at least 2 non-empty folds"),
    ({"folds": [["b"], ["c"]]}, "is not of the form"),
    ([1, 2], "is not of the form"),
], ids=["test patient in a fold", "patient in two folds", "one fold", "no test list", "a list"])
def test_a_bad_folds_file_is_one_sentence(payload, pattern, tmp_path):
    path = tmp_path / "folds.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError) as caught:
        load_folds(path)
    assert_one_sentence(str(caught.value), pattern, "delete it to deal the folds again")


def _materialised(values: np.ndarray, groups: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The resampled means the slow way: every resample built row by row."""
    return np.array([np.concatenate([np.repeat(values[i], int(count)) for i, count in enumerate(row)]).mean()
                     for row in weights])


def test_mean_interval_is_the_percentile_interval_of_materialised_patient_resamples():
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(12), 2)
    values = rng.normal(0.85, 0.05, 24)
    mean, low, high = mean_interval(values, groups, resamples=300, seed=11)
    by_hand = _materialised(values, groups, group_draws(groups, 300, 11))
    assert mean == pytest.approx(values.mean())
    assert (low, high) == pytest.approx(tuple(np.percentile(by_hand, [2.5, 97.5])))
    assert low < mean < high


def test_paired_difference_resamples_patients_and_tests_their_mean_differences():
    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(15), 2)
    first = rng.normal(0.90, 0.03, 30)
    second = first - 0.01 + rng.normal(0, 0.005, 30)
    result = paired_difference(first, second, groups)
    per_patient = (first - second).reshape(15, 2).mean(axis=1)
    assert result["difference"] == pytest.approx((first - second).mean())
    assert result["wilcoxon_p"] == pytest.approx(wilcoxon(per_patient).pvalue)
    assert result["low"] > 0 and result["patients"] == 15


def test_ratio_interval_counts_whole_patients():
    numerator = np.array([1, 0, 1, 1, 0, 1, 1, 1], float)
    denominator = np.ones(8)
    groups = np.repeat(np.arange(4), 2)
    ratio, low, high = ratio_interval(numerator, denominator, groups, resamples=400, seed=2)
    weights = group_draws(groups, 400, 2)
    by_hand = (weights @ numerator) / (weights @ denominator)
    assert ratio == 0.75 and (low, high) == pytest.approx(tuple(np.percentile(by_hand, [2.5, 97.5])))


def _out_of_fold(label: str, dice: np.ndarray, ece: np.ndarray) -> CaseResults:
    cases = [f"p{index // 2}_{index % 2}" for index in range(len(dice))]
    rows = [{"dice_mean": float(d), "ece": float(e)} for d, e in zip(dice, ece)]
    return CaseResults(label, cases, [case.split("_")[0] for case in cases], [index % 3 for index in range(len(dice))],
                     {variant: rows for variant in VARIANTS})


def test_the_summary_and_the_comparison_of_three_methods_by_hand():
    rng = np.random.default_rng(0)
    dice = [rng.uniform(0.7, 0.95, 20) for _ in range(3)]
    ece = [rng.uniform(0.01, 0.1, 20) for _ in range(3)]
    results = [_out_of_fold(name, d, e) for name, d, e in zip(("a", "b", "c"), dice, ece)]
    summary = cross_validation_summary(results[0])
    assert (summary["volumes"], summary["patients"], summary["folds"]) == (20, 10, 3)
    entry = summary["variants"]["scaled"]["dice_mean"]
    assert entry["mean"] == pytest.approx(dice[0].mean()) and entry["low"] < entry["mean"] < entry["high"]
    assert entry["folds"] == pytest.approx([dice[0][np.arange(20) % 3 == fold].mean() for fold in range(3)])
    comparison = paired_comparisons(results, "scaled")
    metric = comparison["metrics"]["ece"]
    assert metric["pairs"]["a - b"]["difference"] == pytest.approx((ece[0] - ece[1]).mean())
    per_patient = np.stack([values.reshape(10, 2).mean(axis=1) for values in ece], axis=1)
    assert metric["friedman_p"] == pytest.approx(friedmanchisquare(*per_patient.T).pvalue)
    # ECE: lower is better, so the method with the smallest ECE per patient ranks 1
    ranks = np.argsort(np.argsort(per_patient, axis=1), axis=1) + 1
    assert list(metric["mean_rank"].values()) == pytest.approx(ranks.mean(axis=0).tolist())
    dice_ranks = np.argsort(np.argsort(-np.stack([v.reshape(10, 2).mean(axis=1) for v in dice], axis=1), axis=1),
                            axis=1) + 1
    assert list(comparison["metrics"]["dice_mean"]["mean_rank"].values()) == pytest.approx(
        dice_ranks.mean(axis=0).tolist())


@pytest.fixture(scope="module")
def cross_validation(sample_acdc_dir, tmp_path_factory):
    """``calibseg-train --fold all`` on the shipped sample with a tiny network (one step per fold)."""
    folder = tmp_path_factory.mktemp("cv") / "ce_dice-cv"
    assert train_cli.main(["--data", str(sample_acdc_dir), "--fold", "all", *TINY_FLAGS, "--out", str(folder)]) == 0
    return folder


@pytest.fixture(scope="module")
def ensembled(cross_validation, tmp_path_factory):
    """A copy of :func:`cross_validation` with its ensemble: ``calibseg-ensemble`` run on it once, into the folder
    (``ensemble.calibseg``, ``ensemble.json``), for the tests that read the ensemble and the one that ships it."""
    folder = tmp_path_factory.mktemp("ensembled") / "ce_dice-cv"
    shutil.copytree(cross_validation, folder)
    assert ensemble_cli.main([str(folder), "--device", "cpu"]) == 0
    return folder


def test_fold_all_predicts_every_labelled_patient_once_out_of_fold(cross_validation, sample_acdc_dir):
    folds = load_folds(cross_validation / "folds.json")
    sample = load_split(SPLITS / "acdc_sample.json")
    assert folds["test"] == sorted(sample["test"])
    predicted = []
    for fold in range(5):
        summary = json.loads((cross_validation / f"fold_{fold}" / "out_of_fold" / "summary.json").read_text())
        assert sorted(summary["patients"]) == sorted(folds["folds"][fold])
        records = cross_validation / f"fold_{fold}" / "out_of_fold"
        observations = json.loads((records / "observations.json").read_text())
        assert sorted({item["patient"] for item in observations}) == sorted(folds["folds"][fold])
        assert all(len(item["dice"]) == 3 and len(item["features"]) == 3 for item in observations)
        assert set(summary["case_patients"].values()) == set(folds["folds"][fold])
        bundle = load_bundle(cross_validation / f"fold_{fold}" / "model.calibseg")
        assert bundle.metadata.data["val"] == folds["folds"][fold] and bundle.metadata.data["fold"] == fold
        assert not set(bundle.metadata.data["train"]) & set(folds["folds"][fold] + folds["test"])
        predicted += summary["patients"]
    assert sorted(predicted) == sorted(sample["train"] + sample["val"])
    summary = json.loads((cross_validation / "crossval" / "summary.json").read_text())
    assert (summary["patients"], summary["volumes"], summary["folds"]) == (8, 16, 5)
    table = (cross_validation / "crossval" / "out_of_fold_cases.csv").read_text().splitlines()
    assert table[0].startswith("case,patient,fold,variant,") and len(table) == 1 + 16 * len(VARIANTS)


def test_fold_all_again_is_refused_without_resume_and_continues_nothing_with_it(cross_validation, capsys):
    before = [tree_snapshot(cross_validation / f"fold_{fold}") for fold in range(5)]
    with pytest.raises(SystemExit) as caught:
        train_cli.main(["--fold", "all", *TINY_FLAGS, "--out", str(cross_validation)])
    assert_one_sentence(str(caught.value.code), "^error: ", "already holds fold", "--resume")
    assert train_cli.main(["--fold", "all", "--resume", *TINY_FLAGS, "--out", str(cross_validation)]) == 0
    # the finished folds stay as they were
    assert [tree_snapshot(cross_validation / f"fold_{fold}") for fold in range(5)] == before
    assert "out-of-fold summary" in capsys.readouterr().out


def test_fold_and_split_together_are_one_sentence(tmp_path, sample_acdc_dir):
    with pytest.raises(SystemExit) as caught:
        train_cli.main(["--fold", "0", "--split", str(SPLITS / "acdc_sample.json"), *TINY_FLAGS,
                        "--out", str(tmp_path / "cv")])
    assert_one_sentence(str(caught.value.code), "^error: ", "--fold takes its split")
    assert list(tmp_path.iterdir()) == []


def test_crossval_command_compares_two_cross_validations(cross_validation, tmp_path, capsys):
    record = tmp_path / "record.json"
    assert crossval_cli.main([str(cross_validation), str(cross_validation), "--record", str(record)]) == 0
    written = json.loads(record.read_text())
    pair = written["comparisons"]["uncalibrated"]["metrics"]["ece"]["pairs"]["ce_dice-cv - ce_dice-cv"]
    assert pair["difference"] == 0 and math.isnan(pair["wilcoxon_p"])  # a method against itself differs nowhere
    printed = capsys.readouterr().out
    assert "| `ce_dice-cv` |" in printed and "Paired differences at T = 1" in printed


def test_ensemble_of_the_folds_predicts_their_average_and_records_its_out_of_fold_choices(cross_validation, ensembled,
                                                                                        sample_acdc_dir, tmp_path):
    from CalibSegLib.inference import Predictor
    from Datasets.layouts import find_cases
    from Datasets.loading import load_cases
    from Datasets.splits import select_patients

    out = ensembled / "ensemble.calibseg"
    ensemble = load_bundle(out)
    metadata = ensemble.metadata
    folds = [load_bundle(cross_validation / f"fold_{fold}" / "model.calibseg") for fold in range(5)]
    assert metadata.ensemble_size == 5 and metadata.schema_version == 3
    assert [member.weights_sha256 for member in metadata.ensemble.members] == \
        [fold.metadata.weights_sha256 for fold in folds]
    assert sorted(metadata.data["train"]) == sorted(p for fold in folds for p in fold.metadata.data["val"])
    assert metadata.data["val"] == [] and metadata.data["test"] == folds[0].metadata.data["test"]
    # the input check: the four families from the first member's training patients; the features from every
    # member, each its own Gaussian of the patients it trained on, one threshold pooled over the folds they never saw
    statistics = metadata.input_statistics
    assert statistics["version"] == 4 and statistics["features"] is None
    assert statistics["volumes"] == 2 * len(folds[0].metadata.data["train"])
    judges = statistics["member_features"]
    assert judges["combination"] == "majority" and len(judges["members"]) == 5
    assert [member["training_volumes"] for member in judges["members"]] == [
        2 * len(fold.metadata.data["train"]) for fold in folds]
    assert {member["validation_volumes"] for member in judges["members"]} == {16}  # every out-of-fold volume
    assert not any(member["layer"].startswith("members.") for member in judges["members"])  # a member's own
    # the refit judges alike: the same layers, patients and pooled threshold
    refitted = load_bundle(refit_input_check(out, sample_acdc_dir, tmp_path / "refit.calibseg", "cpu")).metadata
    again = refitted.input_statistics["member_features"]["members"]
    assert [(member["layer"], member["training_volumes"], member["validation_volumes"]) for member in again] == [
        (member["layer"], member["training_volumes"], member["validation_volumes"]) for member in judges["members"]]
    assert again[0]["threshold"] == pytest.approx(judges["members"][0]["threshold"], rel=1e-4)
    record = json.loads((ensembled / "ensemble.json").read_text())
    assert record["choices"]["volumes"] == 16 and record["choices"]["temperature"]["fitted_on"] in (
        "none", "all", "foreground")
    assert metadata.temperature == pytest.approx(record["choices"]["temperature"]["candidates"][
        record["choices"]["temperature"]["fitted_on"]]["temperature"])
    # the ensemble's probabilities are the mean of its members', each at the ensemble's settings
    case = load_cases(select_patients(find_cases(sample_acdc_dir), metadata.data["test"][:1]), 4)[0]
    averaged = Predictor(ensemble, device="cpu").predict(case.image, case.spacing, keep_probabilities=True)
    single = ensemble_cli.member_metadata(metadata)
    members = [Predictor(type(fold)(single, fold.state_dict), device="cpu").predict(
        case.image, case.spacing, keep_probabilities=True).probabilities for fold in folds]
    np.testing.assert_allclose(averaged.probabilities, np.mean(members, axis=0), atol=1e-5)
    assert averaged.disagreement is not None and averaged.disagreement.shape == case.image.shape
    # three of the five: their weights, their average, everything chosen out of fold kept, the input check refitted
    kept = [0, 2, 4]
    three_path = sub_ensemble(out, kept, tmp_path / "three.calibseg", sample_acdc_dir, "cpu")
    three = load_bundle(three_path)
    assert three.metadata.ensemble_size == 3 and three.metadata.test_metrics == {}
    assert three.metadata.ensemble.members == tuple(metadata.ensemble.members[index] for index in kept)
    assert three.metadata.selected_from == SelectedFrom("ensemble.calibseg", metadata.weights_sha256, tuple(kept))
    assert (three.metadata.quality_model, three.metadata.temperature, three.metadata.postprocessing) == (
        metadata.quality_model, metadata.temperature, metadata.postprocessing)
    smaller = Predictor(three, device="cpu").predict(case.image, case.spacing, keep_probabilities=True)
    np.testing.assert_allclose(smaller.probabilities, np.mean([members[index] for index in kept], axis=0), atol=1e-5)
    three_judges = three.metadata.input_statistics["member_features"]
    for member, index in zip(three_judges["members"], kept):  # each kept member's Gaussian, as before
        np.testing.assert_allclose(member["mean"], judges["members"][index]["mean"], rtol=1e-4)
    assert {member["validation_volumes"] for member in three_judges["members"]} == {
        2 * sum(len(metadata.ensemble.members[index].validation) for index in kept)}  # the kept folds only
    with pytest.raises(SystemExit) as caught:
        sub_ensemble_cli.main([str(out), "--members", "1", "1", "--out", str(tmp_path / "twice.calibseg")])
    assert_one_sentence(str(caught.value.code), "^error: ", "--members must name at least two distinct members")
    assert not (tmp_path / "twice.calibseg").exists()


def test_shipping_a_cross_validation_ships_its_ensemble_with_what_the_folds_measured(ensembled, sample_acdc_dir,
                                                                                      tmp_path):
    from Reporting import ship as ship_cli

    folder = tmp_path / "ce_dice-cv"
    shutil.copytree(ensembled, folder)
    models = tmp_path / "models"
    record = folder / "ensemble.json"
    kept = record.read_bytes()
    record.unlink()
    with pytest.raises(SystemExit) as caught:  # no ensemble.json: one sentence, nothing shipped
        ship_cli.main(["--runs", str(folder), "--prefix", "tiny", "--out", str(models)])
    assert_one_sentence(str(caught.value.code), "^error: ", "ensemble.json is missing", "run calibseg-ensemble")
    assert not models.exists() or not list(models.iterdir())
    record.write_bytes(kept)
    assert ship_cli.main(["--runs", str(folder), "--prefix", "tiny", "--out", str(models),
                          "--data", str(sample_acdc_dir)]) == 0
    shipped = load_bundle(models / "tiny_ce_dice.calibseg")
    assert shipped.metadata.ensemble_size == 5 and shipped.metadata.weights_dtype == "float16"
    recorded = json.loads((models / "tiny_ce_dice.metrics.json").read_text())
    assert recorded["out_of_fold"]["summary"]["patients"] == 8
    assert recorded["out_of_fold"]["ensemble"]["choices"]["volumes"] == 16
    assert sorted(recorded["case_patients"].values()) == sorted(2 * load_split(SPLITS / "acdc_sample.json")["test"])
    # three of its members ship in its place, measured again, what the folds measured kept; the same bytes as given
    three = sub_ensemble(models / "tiny_ce_dice.calibseg", [0, 1, 2], tmp_path / "tiny_ce_dice.calibseg",
                         sample_acdc_dir, "cpu")
    assert ship_cli.main(["--rerecord", "tiny_ce_dice", "--bundle", str(three), "--out", str(models),
                          "--data", str(sample_acdc_dir)]) == 0
    assert (models / "tiny_ce_dice.calibseg").read_bytes() == three.read_bytes()
    again = json.loads((models / "tiny_ce_dice.metrics.json").read_text())
    assert again["out_of_fold"] == recorded["out_of_fold"] and again["source_run"] == recorded["source_run"]
    assert again["per_case"] != recorded["per_case"] and again["cases"] == recorded["cases"]
    with pytest.raises(SystemExit) as caught:  # the five are no sub-ensemble of the three now shipped
        ship_cli.main(["--rerecord", "tiny_ce_dice", "--bundle", str(folder / "ensemble.calibseg"), "--out",
                       str(models), "--data", str(sample_acdc_dir)])
    assert_one_sentence(str(caught.value.code), "^error: ", "holds other weights than the shipped tiny_ce_dice")
