"""One volume against its reference: temperature variants from one pass, the papers' protocol columns, regions."""

from __future__ import annotations

import numpy as np
import pytest

from CalibSegLib.bundle import load_bundle
from CalibSegLib.evaluation import case_metrics_row, evaluate_variants, predict_and_evaluate, reference_regions
from CalibSegLib.inference import Predictor
from CalibSegLib.metrics import hd95
from tiny_bundles import make_test_bundle

SPACING = (4.0, 1.5, 1.5)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    bundle = load_bundle(make_test_bundle(tmp_path_factory.mktemp("bundle") / "tiny.calibseg", temperature=2.0))
    rng = np.random.default_rng(0)
    image = rng.normal(100, 20, size=(3, 40, 44)).astype(np.float32)
    reference = np.zeros(image.shape, np.int64)
    reference[:, 10:30, 12:32] = 1
    reference[:, 15:25, 17:27] = 2
    return Predictor(bundle, device="cpu"), image, reference


def test_regions_split_the_reference_by_its_3x3_windows():
    reference = np.zeros((1, 9, 9), np.int64)
    reference[0, 2:7, 2:7] = 1
    regions = reference_regions(reference)
    assert regions["inner_foreground"][0, 3:6, 3:6].all() and regions["inner_foreground"].sum() == 9
    assert regions["boundary"][0, 2, 2] and regions["boundary"][0, 1, 4] and not regions["boundary"][0, 4, 4]
    assert regions["inner_background"][0, 0, 0] and not regions["inner_background"][0, 1, 1]
    total = sum(mask.astype(int) for mask in regions.values())
    assert (total == 1).all()  # a partition


def test_variants_from_one_pass_equal_separate_predictions(case):
    predictor, image, reference = case
    scaled, plain = evaluate_variants(predictor, image, reference, SPACING, [2.0, 1.0])
    alone = predict_and_evaluate(predictor, image, reference, SPACING)  # the bundle's T = 2
    np.testing.assert_array_equal(scaled.prediction.labels, plain.prediction.labels)  # T keeps the argmax
    np.testing.assert_allclose(scaled.prediction.confidence, alone.prediction.confidence)
    assert scaled.calibration["ece"] == pytest.approx(alone.calibration["ece"])
    assert plain.prediction.confidence.mean() > scaled.prediction.confidence.mean()  # T = 2 softens


def test_papers_protocol_columns_and_region_confidence(case):
    predictor, image, reference = case
    evaluation = predict_and_evaluate(predictor, image, reference, SPACING)
    row = case_metrics_row(evaluation, predictor.metadata.class_names)
    labels = evaluation.prediction.labels
    expected_voxels = hd95(labels, reference, 4, (1.0, 1.0, 1.0))
    np.testing.assert_allclose([row["hd95_voxels_class_1"], row["hd95_voxels_class_2"]], expected_voxels[:2])
    assert 0 <= row["ece_all"] <= 1 and 0 <= row["tace_authors"] <= 1
    regions = reference_regions(reference)
    boundary = regions["boundary"]
    assert row["confidence_boundary"] == pytest.approx(float(evaluation.prediction.confidence[boundary].mean()))
    assert row["accuracy_inner_background"] == pytest.approx(
        float((labels == reference)[regions["inner_background"]].mean()))


def test_console_and_diagram_say_which_ece_is_pooled(tmp_path, capsys):
    from CalibSegLib.metrics.calibration import Reliability
    from CalibSegLib.metrics.plots import reliability_figure
    from Evaluation.evaluate import print_summary
    from Evaluation.summary import EvaluationSummary

    metric = {name: {"mean": value} for name, value in
              (("dice_mean", 0.5), ("hd95_mean", 9.0), ("asd_mean", 2.0), ("ece", 0.2), ("cece", 0.1), ("tace", 0.1),
               ("brier", 0.3), ("nll", 0.4))}
    metric["hd95_mean"]["undefined"] = 0
    variant = {"per_metric": metric, "pooled_calibration": {"ece": 0.125}}
    summary = EvaluationSummary.from_json({"cases": ["a_frame01", "a_frame12", "b_frame01", "b_frame12"],
                                           "patients": ["a", "b"], "temperature": 1.5, "scaled": variant,
                                           "uncalibrated": variant})
    print_summary(summary, tmp_path)
    printed = capsys.readouterr().out
    assert printed.startswith("test, 4 volumes of 2 patients (means over the volumes): Dice 0.500")
    assert "ECE 0.200 (pooled 0.125)" in printed
    print_summary(summary, tmp_path, "val")
    assert capsys.readouterr().out.startswith("val, 4 volumes of 2 patients")
    bins = Reliability(np.array([3, 1]), np.array([0.25, 0.75]), np.array([0.5, 1.0]), np.array([0.0, 0.5, 1.0]))
    title = reliability_figure(bins, title="Reliability", ece=0.125).axes[0].get_title()
    assert title == "Reliability (pooled ECE 0.125)"
