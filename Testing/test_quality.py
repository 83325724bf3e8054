"""Quality from uncertainty: features against loop references, the fit against lines by hand,
the summary with and without a quality model, and the model's life in a bundle."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import zipfile

import numpy as np
import pytest

from CalibSegLib.bundle import BundleError, load_bundle, save_bundle
from CalibSegLib.quality import (
    FEATURES,
    HOT_SPOT_LEVEL,
    MIRROR_AGREEMENT,
    SIZE_FEATURE,
    UNCERTAINTY_FEATURES,
    Observation,
    QualityModel,
    QualityModelError,
    StructureQuality,
    fit_from_observations,
    held_out_predictions,
    observe_cases,
    quality_summary,
    review_sentence,
    structure_features,
    summary_columns,
    uncertain_slices,
)
from CalibSegLib.prediction import Prediction
from CalibSegLib.quality.model import MEAN_DISAGREEMENT
from CalibSegLib.sliding_window import SlidingWindow
from tiny_bundles import make_test_bundle, make_test_metadata

CLASS_NAMES = ["background", "class 1", "class 2", "class 3"]


def _prediction(shape=(5, 12, 10), seed=0) -> Prediction:
    """Random labels with class 3 absent, confidence in [1/4, 1], entropy in [0, 1]."""
    rng = np.random.default_rng(seed)
    labels = rng.choice([0, 1, 2], size=shape, p=[0.5, 0.3, 0.2]).astype(np.uint8)
    return Prediction(labels, rng.uniform(0.25, 1.0, shape).astype(np.float32),
                      rng.uniform(0.0, 1.0, shape).astype(np.float32))


def _model(**structures) -> QualityModel:
    """A linear model per class: Dice = intercept + slope × mean_entropy; unnamed classes get Dice 0.9."""
    entries = {name: structures.get(name, StructureQuality("mean_entropy", "linear", {"intercept": 0.9, "slope": 0.0},
                                                           (-0.1, 0.05), 0.05, 0.1, 20))
               for name in CLASS_NAMES[1:]}
    return QualityModel(entries, validation={"cases": 20, "patients": 10, "scheme": "leave-one-patient-out"})


# --------------------------------------------------------------------------- features


def test_volume_is_label_count_times_voxel_volume_exactly():
    prediction = _prediction()
    spacing = (2.0, 0.5, 1.25)  # 1.25 mm³: exact in binary, so the product is too
    summary = quality_summary(prediction, spacing, make_test_metadata())
    for label, name in enumerate(CLASS_NAMES[1:], start=1):
        count = int((prediction.labels == label).sum())
        assert summary["structures"][name]["volume_ml"] == count * 1.25 / 1000.0
    assert summary["structures"]["class 3"]["volume_ml"] == 0.0


def _ring_reference(mask: np.ndarray, steps: int) -> np.ndarray:
    """Voxels within ``steps`` city-block steps of ``mask``, by brute force over all voxel pairs."""
    inside = np.argwhere(mask)
    grid = np.indices(mask.shape).reshape(3, -1).T
    distance = np.abs(grid[:, None, :] - inside[None, :, :]).sum(axis=2).min(axis=1)
    return (distance <= steps).reshape(mask.shape)


def test_features_equal_loop_references():
    prediction = _prediction()
    features = structure_features(prediction, 4, low_confidence_threshold=0.6, boundary_ring=2)
    assert features[2] is None  # class 3 is predicted nowhere
    for label in (1, 2):
        mask = prediction.labels == label
        expected = {
            "voxels": mask.sum(),
            "mean_confidence": np.mean(prediction.confidence[mask], dtype=np.float64),
            "mean_entropy": np.mean(prediction.entropy[mask], dtype=np.float64),
            "low_confidence_fraction": np.mean(prediction.confidence[mask] < 0.6),
            "boundary_entropy_ratio": prediction.entropy[_ring_reference(mask, 2)].sum(dtype=np.float64) / mask.sum(),
            "boundary_low_confidence_ratio": np.sum(prediction.confidence[_ring_reference(mask, 2)] < 0.6) / mask.sum(),
        }
        for key, value in expected.items():
            assert features[label - 1][key] == pytest.approx(value, rel=1e-9), (label, key)
        assert "log_volume_ml" not in features[label - 1]  # no spacing, no volume


def test_log_volume_is_the_log_of_the_count_times_the_voxel_volume_in_ml():
    prediction = _prediction()
    spacing = (2.5, 1.25, 0.8)  # 2.5 mm³ per voxel
    features = structure_features(prediction, 4, spacing=spacing)
    by_size = StructureQuality("log_volume_ml", "linear", {"intercept": 1.0, "slope": 0.1}, (-0.1, 0.05), 0.05, 0.1, 20)
    metadata = make_test_metadata(quality_model=_model(**{"class 1": by_size, "class 2": by_size}).to_dict())
    summary = quality_summary(prediction, spacing, metadata)  # the summary gives the model the size it reads
    for label, name in ((1, "class 1"), (2, "class 2")):
        count = int(np.count_nonzero(prediction.labels == label))
        volume_ml = count * 2.5 / 1000
        assert features[label - 1]["log_volume_ml"] == pytest.approx(np.log(volume_ml), rel=1e-12)
        assert summary["structures"][name]["volume_ml"] == pytest.approx(volume_ml, rel=1e-12)
        assert summary["structures"][name]["predicted_dice"] == pytest.approx(1.0 + 0.1 * np.log(volume_ml))


def _probabilistic_prediction(shape=(4, 9, 11), seed=1) -> Prediction:
    """Labels, confidence and entropy derived from random 4-class probabilities, kept with the prediction."""
    probabilities = np.random.default_rng(seed).dirichlet([0.6, 0.5, 0.4, 0.3], size=shape)
    probabilities = np.moveaxis(probabilities, -1, 0).astype(np.float32)
    entropy = -(probabilities * np.log(probabilities)).sum(axis=0) / np.log(4)
    return Prediction(probabilities.argmax(axis=0).astype(np.uint8), probabilities.max(axis=0),
                      entropy.astype(np.float32), probabilities)


def test_expected_dice_is_expected_overlap_over_predicted_plus_expected_size():
    prediction = _probabilistic_prediction()
    from_probabilities = structure_features(prediction, 4)
    summed = dataclasses.replace(prediction, probabilities=None,
                                 probability_sums=prediction.probabilities.sum(axis=(1, 2, 3), dtype=np.float64))
    from_sums = structure_features(summed, 4)
    for label in (1, 2, 3):
        mask = prediction.labels == label
        probability = prediction.probabilities[label].astype(np.float64)
        expected = 2 * probability[mask].sum() / (mask.sum() + probability.sum())
        assert from_probabilities[label - 1]["expected_dice"] == pytest.approx(expected, rel=1e-6)
        assert from_sums[label - 1]["expected_dice"] == pytest.approx(expected, rel=1e-6)
    # certain and right everywhere: the model expects a perfect overlap
    certain = np.zeros((2, 3, 4, 4), np.float32)
    certain[1, :, :2] = certain[0, :, 2:] = 1.0
    sure = Prediction(certain.argmax(axis=0).astype(np.uint8), certain.max(axis=0), np.zeros((3, 4, 4), np.float32),
                      certain)
    assert structure_features(sure, 2)[0]["expected_dice"] == 1.0


def test_mirror_agreement_is_the_predictions_own_and_zero_where_no_pass_drew_the_structure():
    prediction = _prediction()  # class 3 predicted nowhere
    assert all(MIRROR_AGREEMENT not in values for values in structure_features(prediction, 4) if values)
    # class 2: on the input's grid, yet no pass drew it on the network's (NaN): nothing agrees on it
    agreed = dataclasses.replace(prediction, mirror_agreement=np.array([0.99, 0.9, np.nan, 0.5]))
    features = structure_features(agreed, 4)
    assert features[0][MIRROR_AGREEMENT] == 0.9 and features[1][MIRROR_AGREEMENT] == 0.0 and features[2] is None


def test_a_quality_model_reading_the_mirror_agreement_needs_a_bundle_that_mirrors(tmp_path):
    by_agreement = StructureQuality(MIRROR_AGREEMENT, "linear", {"intercept": 0.2, "slope": 0.7}, (-0.1, 0.05), 0.05,
                                    0.1, 20)
    model = _model(**{"class 2": by_agreement}).to_dict()
    mirrored = make_test_bundle(tmp_path / "mirrored.calibseg", quality_model=model,
                                sliding_window=SlidingWindow((64, 64), mirror_axes=(1,)))
    metadata = load_bundle(mirrored).metadata
    prediction = dataclasses.replace(_prediction(), mirror_agreement=np.array([1.0, 0.95, 0.8, np.nan]))
    summary = quality_summary(prediction, (1.0, 1.0, 1.0), metadata)
    assert summary["structures"]["class 2"]["predicted_dice"] == pytest.approx(0.2 + 0.7 * 0.8)
    with pytest.raises(BundleError, match=r"^The bundle's quality model reads mirror_agreement, which needs test-time "
                                          r"mirroring, but its sliding_window has no mirror_axes; refit it") as caught:
        make_test_bundle(tmp_path / "plain.calibseg", quality_model=model)
    assert "\n" not in str(caught.value) and not (tmp_path / "plain.calibseg").exists()


def test_summary_refuses_a_prediction_without_the_feature_its_model_needs():
    prediction = _prediction()  # labels, confidence and entropy only: no probability sums
    assert "expected_dice" not in structure_features(prediction, 4)[0]
    model = _model(**{"class 1": StructureQuality("expected_dice", "linear", {"intercept": 0.0, "slope": 1.0},
                                                  (-0.1, 0.05), 0.05, 0.1, 20)})
    metadata = make_test_metadata(quality_model=model.to_dict())
    with pytest.raises(ValueError, match=r"^The quality model predicts Dice from expected_dice.*Predictor\.$"):
        quality_summary(prediction, (1.0, 1.0, 1.0), metadata)


def test_boundary_ring_reaches_exactly_its_steps_and_the_neighbouring_slices():
    labels = np.zeros((5, 9, 9), np.uint8)
    labels[2, 4, 4] = 1
    entropy = np.zeros(labels.shape, np.float32)
    entropy[0, 4, 4] = 1.0  # two slices away: inside a ring of 2, outside a ring of 1
    entropy[2, 4, 7] = 1.0  # three voxels away in-plane: outside both
    prediction = Prediction(labels, np.ones(labels.shape, np.float32), entropy)
    ring_two = structure_features(prediction, 2, boundary_ring=2)[0]["boundary_entropy_ratio"]
    ring_one = structure_features(prediction, 2, boundary_ring=1)[0]["boundary_entropy_ratio"]
    assert (ring_two, ring_one) == (1.0, 0.0)


def test_uncertain_slices_sum_hot_spots_along_the_slice_axis():
    entropy = np.zeros((4, 6, 5), np.float32)
    entropy[:, 1, :] = [[0.9] * 5, [0.39] * 5, [0.5] * 5, [0.0] * 5]  # per slice along axis 0
    entropy[3, :, 0] = 0.45
    # axis 0: slice 3 = 6 × 0.45 = 2.7, slice 2 = 2.5, slice 0 = 4.5; slice 1 is below the level
    assert uncertain_slices(entropy, 0) == [0, 3, 2]
    assert uncertain_slices(entropy, 0, limit=2) == [0, 3]
    assert uncertain_slices(np.moveaxis(entropy, 0, 2), 2) == [0, 3, 2]
    assert uncertain_slices(np.zeros((3, 8, 8), np.float32)) == []
    assert HOT_SPOT_LEVEL == 0.4


# --------------------------------------------------------------------------- the fit

SIX = UNCERTAINTY_FEATURES


def _observations(dice_of, count=12, seed=0, structures=1, per_patient=2, agreement=False):
    """Observations of ``count`` cases, ``per_patient`` a patient; every structure's Dice is
    ``dice_of(features)`` of its own features, each feature uniform noise in [0.05, 0.5]."""
    rng = np.random.default_rng(seed)
    observations = []
    for index in range(count):
        rows, dice = [], []
        for _ in range(structures):
            names = (*SIX, SIZE_FEATURE, *([MIRROR_AGREEMENT] if agreement else []))
            values = {name: float(rng.uniform(0.05, 0.5)) for name in names}
            rows.append(values)
            dice.append(float(dice_of(values)))
        observations.append(Observation(f"p{index // per_patient}", rows, np.array(dice)))
    return observations


def _line(x, y, direction):
    """The least-squares line through ``(x, y)`` with its slope held to ``direction``, as (intercept, slope)."""
    slope = np.polyfit(x, y, 1)[0]
    slope = slope if slope * direction > 0 else 0.0
    return y.mean() - slope * x.mean(), slope


def _by_hand(observations, keep, at, features):
    """The averaged prediction at ``at`` of the lines fitted on the observations where ``keep`` is True."""
    y = np.array([item.dice[0] for item in observations])
    values = []
    for name in features:
        x = np.array([item.features[0][name] for item in observations])
        intercept, slope = _line(x[keep], y[keep], FEATURES[name])
        values.append(np.clip(intercept + slope * at[name], 0, 1))
    return float(np.mean(values))


def test_fit_is_the_mean_of_per_feature_lines_scored_and_bounded_held_out_by_patient():
    rng = np.random.default_rng(5)
    observations = _observations(
        lambda values: float(np.clip(1.0 - values["mean_entropy"] + rng.normal(0, 0.03), 0, 1)), count=16, seed=5)
    quality = fit_from_observations(observations, CLASS_NAMES[:2]).structures["class 1"]
    assert quality.form == "linear_mean" and quality.inputs == SIX  # the size did not help: left out
    groups = np.array([item.patient for item in observations])
    y = np.array([item.dice[0] for item in observations])
    everyone = np.ones(len(y), dtype=bool)
    for item in observations[:3]:
        assert quality.predict(item.features[0]) == pytest.approx(
            _by_hand(observations, everyone, item.features[0], SIX))
    held_out = [y[i] - _by_hand(observations, groups != groups[i], observations[i].features[0], SIX)
                for i in range(len(y))]
    assert quality.loo_mae == pytest.approx(np.mean(np.abs(held_out)))
    ordered = np.sort(held_out)  # n = 16, 80 %: the 1st smallest and the 16th
    assert quality.interval == pytest.approx((ordered[0], ordered[15]))
    baseline = np.mean([abs(y[i] - y[groups != groups[i]].mean()) for i in range(len(y))])
    assert quality.constant_loo_mae == pytest.approx(baseline) and quality.loo_mae < baseline
    model = fit_from_observations(observations, CLASS_NAMES[:2], validation={"fold_networks": 4})
    assert model.validation == {"cases": 16, "patients": 8, "scheme": "leave-one-patient-out", "fold_networks": 4}


def test_held_out_predictions_are_each_patients_prediction_by_a_fit_without_that_patient():
    rng = np.random.default_rng(11)
    observations = _observations(
        lambda values: float(np.clip(1.0 - values["mean_entropy"] + rng.normal(0, 0.03), 0, 1)), count=16, seed=11)
    absent = Observation("p99", [None], np.array([0.0]))  # predicted nowhere: nothing to say, the summary flags it
    predicted = held_out_predictions([*observations, absent], CLASS_NAMES[:2])
    assert predicted.shape == (17, 1) and np.isnan(predicted[16, 0])
    groups = np.array([item.patient for item in observations])
    for index, item in enumerate(observations):
        assert predicted[index, 0] == pytest.approx(
            _by_hand(observations, groups != groups[index], item.features[0], SIX))


def test_the_fit_adds_the_size_only_to_the_structures_whose_held_out_error_it_lowers():
    """Class 1's Dice follows its size, class 2's its entropy: the fit itself decides, by held-out error."""
    rng = np.random.default_rng(7)
    observations = []
    for index in range(20):
        size, entropy = rng.uniform(0.05, 0.5, 2)
        first = {name: float(rng.uniform(0.05, 0.5)) for name in SIX} | {SIZE_FEATURE: float(size)}
        second = {name: float(rng.uniform(0.05, 0.5)) for name in SIX} | {SIZE_FEATURE: float(rng.uniform(0.05, 0.5)),
                                                                           "mean_entropy": float(entropy)}
        observations.append(Observation(f"p{index // 2}", [first, second], np.array([0.5 + size, 1.0 - entropy])))
    model = fit_from_observations(observations, CLASS_NAMES[:3])
    assert model.structures["class 1"].inputs == (*SIX, SIZE_FEATURE)
    assert model.structures["class 2"].inputs == SIX
    # the structure with the size is exactly the mean of the seven lines
    seven = (*SIX, SIZE_FEATURE)
    single = [Observation(item.patient, [item.features[0]], item.dice[:1]) for item in observations]
    everyone = np.ones(len(single), dtype=bool)
    at = observations[0].features[0]
    assert model.structures["class 1"].predict(at) == pytest.approx(_by_hand(single, everyone, at, seven))


def test_the_mirrored_passes_agreement_is_averaged_where_every_case_has_it():
    with_agreement = _observations(lambda values: values[MIRROR_AGREEMENT], count=12, agreement=True)
    assert MIRROR_AGREEMENT in fit_from_observations(with_agreement, CLASS_NAMES[:2]).structures["class 1"].inputs
    mixed = [*with_agreement, *_observations(lambda values: 0.8, count=4, seed=2)]
    assert MIRROR_AGREEMENT not in fit_from_observations(mixed, CLASS_NAMES[:2]).structures["class 1"].inputs


def test_a_feature_that_barely_varies_gives_a_model_its_own_validator_accepts():
    """A short run's validation cases: one feature nearly constant, so its least-squares line is nearly vertical."""
    observations = _observations(lambda values: 0.3 + values["mean_entropy"] / 10, count=8)
    for offset, item in enumerate(observations):
        item.features[0]["mean_confidence"] = 0.5 + offset * 1e-12
    model = fit_from_observations(observations, CLASS_NAMES[:2])
    assert QualityModel.from_dict(model.to_dict(), CLASS_NAMES[:2]) == model
    terms = {term["feature"]: term for term in model.structures["class 1"].parameters["terms"]}
    assert terms["mean_confidence"]["slope"] == 0.0


def test_an_averaged_quality_model_round_trips_and_predicts_in_the_summary(tmp_path):
    observations = _observations(lambda values: 1.0 - values["mean_entropy"], count=10, structures=3)
    stored = fit_from_observations(observations, CLASS_NAMES)
    assert "feature" not in stored.to_dict()["structures"]["class 1"]
    path = make_test_bundle(tmp_path / "averaged.calibseg", quality_model=stored.to_dict())
    metadata = load_bundle(path).metadata
    assert QualityModel.from_dict(metadata.quality_model, CLASS_NAMES) == stored
    with pytest.raises(ValueError, match=r"^The quality model predicts Dice from expected_dice.*Predictor\.$"):
        quality_summary(_prediction(seed=3), (1.0, 1.0, 1.0), metadata)  # no probability sums: no expected_dice
    prediction = dataclasses.replace(_prediction(seed=3), probability_sums=np.array([200.0, 180.0, 120.0, 100.0]))
    summary = quality_summary(prediction, (1.0, 1.0, 1.0), metadata)
    present = structure_features(prediction, 4, spacing=(1.0, 1.0, 1.0))[0]
    entry = summary["structures"]["class 1"]
    assert entry["predicted_dice"] == pytest.approx(stored.structures["class 1"].predict(present))
    assert entry["review"] is (entry["predicted_dice"] < 0.8)


def test_fit_needs_three_cases_of_two_patients_per_structure_and_some_overlap():
    observations = _observations(lambda values: 1.0 - values["mean_entropy"], count=4, per_patient=4)
    with pytest.raises(QualityModelError, match="Only 4 validation case\\(s\\) of 1 patient\\(s\\) predict 'class 1'"):
        fit_from_observations(observations, CLASS_NAMES[:2])
    observations = _observations(lambda values: 1.0 - values["mean_entropy"], count=4)
    observations[0].features[0] = observations[1].features[0] = None  # predicted nowhere: left out of its fit
    with pytest.raises(QualityModelError, match="Only 2 validation"):
        fit_from_observations(observations, CLASS_NAMES[:2])
    nowhere = _observations(lambda values: 0.0, count=6)
    with pytest.raises(QualityModelError, match=r"^The network's 'class 1' overlaps the reference nowhere .*\.$"):
        fit_from_observations(nowhere, CLASS_NAMES[:2])


# --------------------------------------------------------------------------- the summary


def test_summary_without_a_quality_model_says_so_and_guesses_nothing():
    summary = quality_summary(_prediction(), (1.0, 1.0, 1.0), make_test_metadata())
    assert summary["quality_model"] is None and summary["note"].startswith("no quality model")
    present = summary["structures"]["class 1"]
    assert present["predicted_dice"] is None and present["predicted_dice_interval"] is None
    assert present["review"] is None
    assert summary["structures"]["class 3"]["review"] is True  # predicted nowhere: always flagged
    assert summary["review"] is True
    json.dumps(summary, allow_nan=False)  # plain JSON: null, never NaN


def test_summary_with_a_quality_model_predicts_dice_interval_and_review():
    prediction = _prediction(seed=2)
    prediction.labels[prediction.labels == 0] = 3  # every class present
    falling = StructureQuality("mean_entropy", "linear", {"intercept": 1.2, "slope": -1.0}, (-0.2, 0.3), 0.05, 0.1, 20)
    metadata = make_test_metadata(quality_model=_model(**{"class 2": falling}).to_dict())
    summary = quality_summary(prediction, (1.0, 1.0, 1.0), metadata)
    entropy = float(np.mean(prediction.entropy[prediction.labels == 2], dtype=np.float64))
    entry = summary["structures"]["class 2"]
    assert entry["predicted_dice"] == pytest.approx(1.2 - entropy)
    assert entry["predicted_dice_interval"] == pytest.approx([1.0 - entropy, min(1.5 - entropy, 1.0)])
    assert entry["review"] is (1.2 - entropy < 0.8)
    assert summary["structures"]["class 1"]["predicted_dice"] == 0.9
    assert summary["structures"]["class 1"]["review"] is False
    assert summary["review"] is entry["review"]
    assert summary["quality_model"]["review_below"] == 0.8 and "0.80" in summary["note"]
    columns = summary_columns(summary)
    assert columns["predicted_dice_class_2"] == entry["predicted_dice"]
    assert columns["review_class_1"] == 0.0 and columns["predicted_dice_high_class_1"] == pytest.approx(0.95)


def test_thresholds_per_structure_flag_each_structure_at_its_own_and_round_trip(tmp_path):
    prediction = _prediction(seed=2)
    prediction.labels[prediction.labels == 0] = 3  # every class present; each predicted Dice 0.9
    by_structure = {"class 1": 0.85, "class 2": 0.95, "class 3": 0.88}
    model = dataclasses.replace(_model(), review_below=0.89, review_below_by_structure=by_structure)
    assert [model.review_threshold(name) for name in CLASS_NAMES[1:]] == [0.85, 0.95, 0.88]
    path = make_test_bundle(tmp_path / "q.calibseg", quality_model=model.to_dict())
    metadata = load_bundle(path).metadata
    assert metadata.quality == model
    summary = quality_summary(prediction, (1.0, 1.0, 1.0), metadata)
    assert [summary["structures"][name]["review"] for name in CLASS_NAMES[1:]] == [False, True, False]
    assert summary["quality_model"]["review_below_by_structure"] == by_structure
    assert "0.85 (class 1), 0.95 (class 2), 0.88 (class 3)" in summary["note"]
    unflagged = dataclasses.replace(model, review_below_by_structure={**by_structure, "class 2": 0.9})
    sentence = review_sentence(quality_summary(prediction, (1.0, 1.0, 1.0),
                                               make_test_metadata(quality_model=unflagged.to_dict())))
    assert sentence == ("No structure flagged: every predicted Dice is at or above its own threshold, "
                        "0.85 (class 1), 0.90 (class 2), 0.88 (class 3).")
    # a pooled model stores no per-structure key: bundles written before it read and write the same bytes
    assert "review_below_by_structure" not in _model().to_dict()


def test_summary_columns_are_nan_where_the_summary_is_null():
    columns = summary_columns(quality_summary(_prediction(), (1.0, 1.0, 1.0), make_test_metadata()))
    assert math.isnan(columns["predicted_dice_class_1"]) and math.isnan(columns["review_class_1"])
    assert columns["review_class_3"] == 1.0


# --------------------------------------------------------------------------- in a bundle


def test_quality_model_round_trips_through_a_saved_bundle(tmp_path):
    stored = fit_from_observations(_observations(lambda values: 1.0 - values["mean_entropy"], count=10, structures=3),
                                   CLASS_NAMES)
    path = make_test_bundle(tmp_path / "q.calibseg", half=True, quality_model=stored.to_dict())
    bundle = load_bundle(path)
    assert QualityModel.from_dict(bundle.metadata.quality_model, CLASS_NAMES) == stored
    resaved = save_bundle(tmp_path / "again.calibseg", bundle.state_dict, bundle.metadata, half=True)
    assert load_bundle(resaved).metadata == bundle.metadata  # same weights bytes, same model


def test_bundle_written_before_quality_models_loads_and_says_no_quality_model(tmp_path):
    path = make_test_bundle(tmp_path / "old.calibseg")
    with zipfile.ZipFile(path) as archive:
        stored = json.loads(archive.read("bundle.json"))
        weights = archive.read("weights.safetensors")
    del stored["quality_model"]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("bundle.json", json.dumps(stored))
        archive.writestr("weights.safetensors", weights)
    metadata = load_bundle(path).metadata
    assert metadata.quality_model is None
    assert quality_summary(_prediction(), (1, 1, 1), metadata)["note"].startswith("no quality model")


def _good_model() -> dict:
    isotonic = StructureQuality("boundary_entropy_ratio", "isotonic", {"x": [0.1, 0.2, 0.4], "y": [0.95, 0.9, 0.6]},
                                (-0.1, 0.1), 0.04, 0.09, 20)
    return _model(**{"class 1": isotonic}).to_dict()


MALFORMED = {
    "not an object": (lambda model: [1, 2], "it must be an object"),
    "unknown version": (lambda model: {**model, "version": 99}, "version is 99"),
    "review threshold": (lambda model: {**model, "review_below": "high"}, "review_below must be a number"),
    "thresholds of some structures": (lambda model: {**model, "review_below_by_structure": {"class 1": 0.85}},
                                      "review_below_by_structure must name every structure"),
    "a threshold above one": (lambda model: {**model, "review_below_by_structure": {"class 1": 0.85, "class 2": 1.5,
                                                                                    "class 3": 0.9}},
                              "review_below_by_structure class 2 must be a number"),
    "missing structure": (lambda model: {**model, "structures": {"class 1": model["structures"]["class 1"]}},
                          "not the foreground classes"),
    "unknown feature": (lambda model: _edit(model, "class 2", feature="volume"), "feature 'volume'"),
    "slope against direction": (lambda model: _edit(model, "class 2", slope=0.5), "runs against mean_entropy"),
    "knots not increasing": (lambda model: _edit(model, "class 1", x=[0.1, 0.4, 0.2]), "x increasing"),
    "knots not monotone": (lambda model: _edit(model, "class 1", y=[0.6, 0.9, 0.95]), "y monotone"),
    "dice above one": (lambda model: _edit(model, "class 1", y=[1.5, 0.9, 0.6]), "y must be a non-empty list"),
    "NaN intercept": (lambda model: _edit(model, "class 3", intercept=float("nan")), "intercept must be a number"),
    "interval reversed": (lambda model: _edit(model, "class 3", interval=[0.1, -0.1]), "low <= high"),
    "no case count": (lambda model: _edit(model, "class 3", cases=0), "cases must be a positive integer"),
    "averaged without terms": (lambda model: _edit(model, "class 2", form="linear_mean"), "terms must be a non-empty"),
    "averaged unknown term": (lambda model: _averaged(model, {"feature": "volume", "intercept": 1, "slope": 0}),
                              "distinct features"),
    "averaged repeated term": (lambda model: _averaged(model, {"feature": "mean_confidence", "intercept": 1,
                                                               "slope": 0}), "distinct features"),
    "averaged slope against direction": (lambda model: _averaged(model, {"feature": "mean_entropy", "intercept": 1,
                                                                         "slope": 0.5}), "runs against mean_entropy"),
}


def _averaged(model: dict, term: dict) -> dict:
    """``model`` with class 2 averaged over mean_confidence and ``term``."""
    return _edit(model, "class 2", form="linear_mean",
                 terms=[{"feature": "mean_confidence", "intercept": 0.2, "slope": 0.7}, term])


def _edit(model: dict, name: str, **changes) -> dict:
    edited = json.loads(json.dumps(model))
    edited["structures"][name].update(changes)
    return edited


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_quality_model_is_refused_with_one_sentence(tmp_path, case):
    good = make_test_bundle(tmp_path / "good.calibseg", quality_model=_good_model())
    assert load_bundle(good).metadata.quality_model is not None
    change, message = MALFORMED[case]
    with zipfile.ZipFile(good) as archive:
        stored = json.loads(archive.read("bundle.json"))
        weights = archive.read("weights.safetensors")
    stored["quality_model"] = change(stored["quality_model"])
    bad = tmp_path / "bad.calibseg"
    with zipfile.ZipFile(bad, "w") as archive:
        archive.writestr("bundle.json", json.dumps(stored))
        archive.writestr("weights.safetensors", weights)
    with pytest.raises(BundleError, match=f"quality model is malformed \\(.*{message}") as caught:
        load_bundle(bad)
    text = str(caught.value)
    assert "\n" not in text and text.endswith(".") and text.count(". ") == 0


def test_save_refuses_a_malformed_quality_model(tmp_path):
    metadata = make_test_metadata(quality_model=_edit(_good_model(), "class 2", slope=1.0))
    with pytest.raises(BundleError, match="quality model is malformed"):
        make_test_bundle(tmp_path / "x.calibseg", quality_model=metadata.quality_model)
    assert not (tmp_path / "x.calibseg").exists()


# --------------------------------------------------------------------------- fitting a bundle


def _shipped_copy(tmp_path, sample_acdc_dir, method=None, name="shipped", members=None, **data):
    """The shipped CE+Dice bundle as ``<name>.calibseg`` with other recorded data and, if given, another recorded
    training method (same weights bytes, so the same checksum). ``members``: keep only these of its five networks
    (one: that network alone, as a fold network is), so a test pays for the inference it needs."""
    from safetensors.torch import load as load_weights, save as save_weights

    from CalibSegLib.pretrained import resolve_bundle_path
    from Training.sub_ensemble import member_state

    with zipfile.ZipFile(resolve_bundle_path("acdc_ce_dice")) as archive:
        stored = json.loads(archive.read("bundle.json"))
        weights = archive.read("weights.safetensors")
    if members is not None:
        tensors = load_weights(weights)
        statistics = stored["input_statistics"]
        judges = statistics.get("member_features")  # every member's features: keep the kept members'
        if judges is not None:
            statistics["member_features"] = {**judges, "members": [judges["members"][index] for index in members]}
        if len(members) == 1:
            prefix = f"members.{members[0]}."
            tensors = {key[len(prefix):]: value for key, value in tensors.items() if key.startswith(prefix)}
            if judges is not None:  # one network: its own features, as a fold network stores them
                statistics.update(version=3, features=statistics.pop("member_features")["members"][0])
            statistics["features"]["layer"] = statistics["features"]["layer"].removeprefix("members.0.")
            stored.update(ensemble_size=1, ensemble=None)
        else:
            tensors = member_state(tensors, members)
            ensemble = stored["ensemble"]
            origin = ensemble.get("selected_from")  # one number of the origin's per kept network
            stored.update(ensemble_size=len(members), ensemble={
                **ensemble, "members": [ensemble["members"][index] for index in members],
                **({} if origin is None else {"selected_from": {
                    **origin, "members": [origin["members"][index] for index in members]}})})
        weights = save_weights(dict(sorted(tensors.items())))
        stored["weights_sha256"] = hashlib.sha256(weights).hexdigest()
    stored["data"] = {**stored["data"], "folder": str(sample_acdc_dir), **data}
    stored["quality_model"] = None
    if method is not None:
        stored["training"] = {**stored["training"], "method": method}
    path = tmp_path / f"{name}.calibseg"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("bundle.json", json.dumps(stored))
        archive.writestr("weights.safetensors", weights)
    return path, weights


def test_fit_cli_writes_the_model_into_the_bundle_and_keeps_float16_weights(tmp_path, sample_acdc_dir, capsys):
    from CalibSegLib.inference import Predictor
    from CalibSegLib.quality import fit_quality_model
    from Training import fit_quality
    from Datasets.layouts import find_cases
    from Datasets.loading import load_cases

    path, weights = _shipped_copy(tmp_path, sample_acdc_dir, members=(0, 1), val=["patient013", "patient016"])
    assert fit_quality.main(["--bundle", str(path), "--device", "cpu"]) == 0
    with zipfile.ZipFile(path) as archive:
        assert archive.read("weights.safetensors") == weights  # float16 bytes untouched
    bundle = load_bundle(path)
    assert bundle.metadata.weights_dtype == "float16"
    stored = QualityModel.from_dict(bundle.metadata.quality_model, bundle.metadata.class_names)
    assert stored.validation == {"cases": 4, "patients": 2, "scheme": "leave-one-patient-out"}
    # the six uncertainty features, (the shipped bundles mirror) the mirrored passes' agreement and (the shipped
    # CE+Dice model is a five-fold ensemble, two of its networks here) the networks' mean disagreement averaged, the
    # size where the fit found it lowers the held-out error
    assert bundle.metadata.ensemble_size == 2
    averaged = (*UNCERTAINTY_FEATURES, MIRROR_AGREEMENT, MEAN_DISAGREEMENT)
    assert all(structure.form == "linear_mean" and structure.inputs in (averaged, (*averaged, SIZE_FEATURE))
               for structure in stored.structures.values())
    cases = load_cases([file for file in find_cases(sample_acdc_dir)
                        if file.patient_id in ("patient013", "patient016")], 4)
    assert fit_quality_model(Predictor(path, device="cpu"), cases) == stored  # the trainer's call gives the same
    # a bundle that does not mirror has no agreement to average
    plain = dataclasses.replace(bundle, metadata=dataclasses.replace(
        bundle.metadata, quality_model=None,
        sliding_window=dataclasses.replace(bundle.metadata.sliding_window, mirror_axes=())))
    assert all(MIRROR_AGREEMENT not in structure.inputs
               for structure in fit_quality_model(Predictor(plain, device="cpu"), cases).structures.values())
    printed = capsys.readouterr().out
    assert "leave-one-patient-out on 4 volumes of 2 patients;" in printed and f"bundle: {path}" in printed


def test_fit_cli_with_fold_networks_fits_on_their_out_of_fold_predictions_too(tmp_path, sample_acdc_dir, capsys):
    from CalibSegLib.inference import Predictor
    from Datasets.layouts import find_cases
    from Datasets.loading import load_cases
    from Training import fit_quality

    # one network stands for the bundle and its fold networks alike, so that the test predicts each volume once
    path, _ = _shipped_copy(tmp_path, sample_acdc_dir, members=(0,), val=["patient013", "patient016"],
                            test=["patient036"])
    folds = [_shipped_copy(tmp_path, sample_acdc_dir, members=(0,), name=f"fold{index}", val=patients)[0]
             for index, patients in enumerate([["patient041", "patient068"], ["patient091", "patient094"]])]
    out = tmp_path / "refitted.calibseg"
    assert fit_quality.main(["--bundle", str(path), "--fold-bundles", *map(str, folds), "--out", str(out),
                             "--review-below", "0.9", "--device", "cpu"]) == 0
    names = load_bundle(out).metadata.class_names
    stored = QualityModel.from_dict(load_bundle(out).metadata.quality_model, names)
    assert stored.validation == {"cases": 12, "patients": 6, "scheme": "leave-one-patient-out", "fold_networks": 2,
                                 "fold_patients": 4}
    files = find_cases(sample_acdc_dir)
    observed = [item for patients in (["patient041", "patient068"], ["patient091", "patient094"],
                                      ["patient013", "patient016"])
                for item in observe_cases(Predictor(path, device="cpu"),
                                          load_cases([file for file in files if file.patient_id in patients], 4))]
    expected = fit_from_observations(observed, names, 0.9, validation={"fold_networks": 2, "fold_patients": 4})
    assert stored == expected and stored.review_below == 0.9
    assert "2 fold networks' out-of-fold predictions of 4 patients" in capsys.readouterr().out
    # fold networks of another method, or validating on the bundle's test patients, are refused before predicting
    other, _ = _shipped_copy(tmp_path, sample_acdc_dir, method="crac", name="other", val=["patient041"])
    leaking, _ = _shipped_copy(tmp_path, sample_acdc_dir, name="leaking", val=["patient036"])
    for fold, message in ((other, "was trained with crac, the bundle with ce_dice"),
                          (leaking, "validates on patient036, one of the bundle's test patients")):
        with pytest.raises(SystemExit, match=f"^error: {fold} {message}; pass fold networks"):
            fit_quality.main(["--bundle", str(path), "--fold-bundles", str(fold), "--out", str(tmp_path / "x.calibseg"),
                              "--device", "cpu"])
    assert not (tmp_path / "x.calibseg").exists()


def test_keep_fit_changes_only_the_review_threshold_and_needs_a_fitted_model(tmp_path, sample_acdc_dir, capsys):
    from CalibSegLib.pretrained import resolve_bundle_path
    from Training import fit_quality

    out = tmp_path / "threshold.calibseg"
    # acdc_nacl flags at one threshold per structure: the one given replaces them all
    assert fit_quality.main(["--bundle", "acdc_nacl", "--keep-fit", "--review-below", "0.85",
                             "--out", str(out)]) == 0
    shipped, rewritten = load_bundle(resolve_bundle_path("acdc_nacl")).metadata, load_bundle(out).metadata
    assert rewritten.quality == dataclasses.replace(shipped.quality, review_below=0.85, review_below_by_structure={})
    assert {rewritten.quality.review_threshold(name) for name in shipped.class_names[1:]} == {0.85}
    assert dataclasses.replace(rewritten, quality_model=shipped.quality_model) == shipped  # nothing else changed
    assert "review below predicted Dice 0.85" in capsys.readouterr().out
    unfitted, _ = _shipped_copy(tmp_path, sample_acdc_dir)  # its quality model removed
    with pytest.raises(SystemExit, match="^error: shipped.calibseg has no quality model whose threshold could change"):
        fit_quality.main(["--bundle", str(unfitted), "--keep-fit", "--review-below", "0.85"])


def test_fit_cli_without_validation_patients_exits_with_one_sentence(tmp_path, sample_acdc_dir):
    from Training import fit_quality

    path, _ = _shipped_copy(tmp_path, sample_acdc_dir, val=[])
    with pytest.raises(SystemExit, match="error: shipped.calibseg records no validation patients"):
        fit_quality.main(["--bundle", str(path), "--device", "cpu"])
    with pytest.raises(SystemExit, match=r"^error: --review-below must be a Dice in \[0, 1\], got nan\.$"):
        fit_quality.main(["--bundle", str(path), "--review-below", "nan"])
    validated, _ = _shipped_copy(tmp_path, sample_acdc_dir, name="validated", val=["patient013"])
    with pytest.raises(SystemExit, match="error: Data folder .* does not exist"):
        fit_quality.main(["--bundle", str(validated), "--data", str(tmp_path / "none"),
                          "--out", str(tmp_path / "x.calibseg")])
    assert not (tmp_path / "x.calibseg").exists()


# --------------------------------------------------------------------------- evaluation


def _rows(predicted, measured, review):
    return [{"case": f"c{index}", "dice_class_1": m, "predicted_dice_class_1": p, "predicted_dice_low_class_1": p - 0.1,
             "predicted_dice_high_class_1": p + 0.1, "review_class_1": r}
            for index, (p, m, r) in enumerate(zip(predicted, measured, review))]


def test_quality_statistics_against_hand_counts():
    from Evaluation.bootstrap import spearman_interval
    from Evaluation.quality_report import ALL_STRUCTURES, quality_statistics

    predicted = [0.9, 0.85, 0.7, 0.75, 0.6, float("nan")]
    measured = [0.95, 0.7, 0.72, 0.9, 0.5, 0.0]
    review = [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]  # the last one was predicted nowhere: flagged, no prediction
    report = quality_statistics(_rows(predicted, measured, review), ["background", "class 1"])
    entry = report["class 1"]
    assert entry["cases"] == 5 and entry["mae"] == pytest.approx(np.mean([0.05, 0.15, 0.02, 0.15, 0.1]))
    assert entry["spearman"] == pytest.approx(0.7)  # ranks (5, 4, 2, 3, 1) vs (5, 2, 3, 4, 1): 1 − 6·6/120
    assert entry["interval_coverage"] == pytest.approx(3 / 5)  # 0.7 and 0.9 fall outside ±0.1
    assert (entry["poor"], entry["flagged"], entry["flagged_poor"]) == (4, 4, 3)
    # flag: sensitivity 3/4, specificity 1/2 → AUROC (3/4 + 1/2) / 2
    assert entry["review_auroc"] == pytest.approx(0.625)
    # predicted Dice of the good (0.9, 0.75) above that of the poor (0.85, 0.7, 0.6) in 5 of 6 pairs
    assert entry["predicted_dice_auroc"] == pytest.approx(5 / 6)
    assert report[ALL_STRUCTURES] == entry  # one structure: pooled is the same
    # ρ's interval resamples patients, over the rows where both Dice exist (the last has no prediction)
    patients = ["p1", "p1", "p2", "p2", "p3", "p3"]
    rows = _rows(predicted, measured, review)
    grouped = quality_statistics(rows, ["background", "class 1"], groups=patients)
    expected = spearman_interval(np.array(predicted[:5]), np.array(measured[:5]), np.array(patients[:5]))
    assert grouped["class 1"]["spearman_interval"] == pytest.approx(list(expected))


def test_evaluation_reports_predicted_beside_measured_dice_and_labels_degraded_inputs(tmp_path, sample_acdc_dir):
    import csv

    from CalibSegLib.pretrained import resolve_bundle_path
    from Datasets.layouts import find_cases
    from Datasets.loading import load_cases
    from Evaluation.evaluate import evaluate_bundle
    from Evaluation.quality_report import quality_statistics

    cases = load_cases([file for file in find_cases(sample_acdc_dir) if file.patient_id == "patient041"], 4)
    shipped = load_bundle(resolve_bundle_path("acdc_ce_dice"))
    # A quality model of our own, so the test does not depend on which one the shipped model carries.
    falling = StructureQuality("mean_entropy", "linear", {"intercept": 1.0, "slope": -1.5}, (-0.1, 0.1), 0.05, 0.1, 20)
    names = shipped.metadata.class_names
    model = QualityModel({name: falling for name in names[1:]}).to_dict()
    bundle = dataclasses.replace(shipped, metadata=dataclasses.replace(shipped.metadata, quality_model=model))
    summary = evaluate_bundle(bundle, cases, tmp_path, device="cpu",
                              degradations=("contrast inversion", "noise 10 %")).summary
    with (tmp_path / "per_case.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    header = list(rows[0])
    assert header[header.index("dice_myocardium") + 1] == "predicted_dice_myocardium"
    scaled = [{key: float(value) for key, value in row.items() if key not in ("case", "variant")}
              for row in rows if row["variant"] == "scaled"]
    assert all(0 < row["predicted_dice_myocardium"] <= 1 for row in scaled)
    assert [row["input_suitable"] for row in scaled] == [1.0, 1.0]  # a test patient's cine MRI: checked, suitable
    assert all(row["predicted_dice_myocardium"] == "nan" for row in rows if row["variant"] == "uncalibrated")
    quality = summary.quality
    expected = quality_statistics(scaled, bundle.metadata.class_names)
    assert quality["clean"]["left ventricle"]["mae"] == pytest.approx(expected["left ventricle"]["mae"])
    assert quality["clean"]["left ventricle"]["cases"] == 2
    assert list(quality["degraded"]) == ["contrast inversion", "noise 10 %", "degraded (all)"]
    inverted = quality["degraded"]["contrast inversion"]["all structures"]
    assert inverted["poor"] == 6 and inverted["mean_measured"] < 0.2  # the model fails on inverted contrast
    assert json.loads((tmp_path / "summary.json").read_text())["quality"]["review_below"] == 0.8
    # the Markdown tables of the results page, from the written summary
    from Reporting.quality_tables import main as tables_cli

    lines = tables_cli([str(tmp_path / "summary.json")])
    assert sum(line.startswith("| acdc_ce_dice | ") for line in lines) == 4 + 3  # 3 structures + all; 3 inputs
    assert any(line.startswith("| acdc_ce_dice | contrast inversion | ") and " 6 / 6 " in line for line in lines)


def test_degraded_copies_of_a_multichannel_image_are_made_channel_by_channel():
    from types import SimpleNamespace

    from Evaluation.quality_report import degraded_images

    rng = np.random.default_rng(0)
    wide = rng.uniform(0.0, 1000.0, (3, 8, 8)).astype(np.float32)
    narrow = rng.uniform(0.0, 10.0, (3, 8, 8)).astype(np.float32)
    case = SimpleNamespace(image=np.stack([wide, narrow]))
    (inverted,) = degraded_images([case], "contrast inversion")
    np.testing.assert_allclose(inverted[1], narrow.max() + narrow.min() - narrow, rtol=1e-6)
    (gamma,) = degraded_images([case], "gamma 3")
    assert gamma[1].min() >= narrow.min() - 1e-4 and gamma[1].max() <= narrow.max() + 1e-4
    (noisy,) = degraded_images([case], "noise 10 %")
    assert 0.5 < float(np.std(noisy[1] - narrow)) < 1.5  # 10 % of the narrow channel's own range, not the wide one's
