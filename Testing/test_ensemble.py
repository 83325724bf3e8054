"""Ensemble bundles: several networks in one bundle, their probabilities averaged and their disagreement (the mutual
information between prediction and member) checked against an independent NumPy computation, in 2D and 3D; the
bundle's checks; the disagreement in calibseg-predict's outputs and in the metrics. The Slicer overlay is a check of
CalibSeg/CalibSegTesting/segmentation_checks.py (``an_ensemble_adds_its_disagreement_overlay``)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from CalibSegLib.bundle import BundleError, load_bundle, save_bundle
from CalibSegLib.bundle.schema import SINGLE_NETWORK_SCHEMA_VERSION
from CalibSegLib.evaluation import predict_and_evaluate
from CalibSegLib.inference import Predictor
from CalibSegLib.io import ImageGeometry, write_image
from CalibSegLib.predict import main as predict_main
from CalibSegLib.postprocessing import Postprocessing
from CalibSegLib.preprocessing import Preprocessing
from CalibSegLib.quality import MIRROR_AGREEMENT
from CalibSegLib.sliding_window import MirrorAgreement, SlidingWindow, window_logits
from fault_checks import assert_one_sentence
from tiny_bundles import make_test_bundle

SPACING = (4.0, 1.5, 1.5)


def _members(tmp_path, count: int = 3, **overrides) -> list:
    return [load_bundle(make_test_bundle(tmp_path / f"member{seed}.calibseg", seed=seed, **overrides))
            for seed in range(count)]


def _ensemble(tmp_path, members: list, temperature: float = 1.0, name: str = "ensemble.calibseg"):
    state = {f"members.{index}.{key}": tensor for index, member in enumerate(members)
             for key, tensor in member.state_dict.items()}
    metadata = dataclasses.replace(members[0].metadata, ensemble_size=len(members), temperature=temperature)
    return load_bundle(save_bundle(tmp_path / name, state, metadata))


def _entropy(probabilities: np.ndarray) -> np.ndarray:
    """Normalised entropy over axis 0, written out with NumPy."""
    safe = np.where(probabilities > 0, probabilities, 1.0)
    return -(probabilities * np.log(safe)).sum(axis=0) / np.log(len(probabilities))


def _by_hand(members: list, image: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """Each member alone at ``temperature``, averaged; the disagreement as entropy of the mean minus mean entropy."""
    probabilities = [Predictor(dataclasses.replace(member, metadata=dataclasses.replace(
        member.metadata, temperature=temperature)), device="cpu").predict(
        image, SPACING, keep_probabilities=True).probabilities for member in members]
    mean = np.mean(probabilities, axis=0)
    return mean, _entropy(mean) - np.mean([_entropy(p) for p in probabilities], axis=0)


def test_an_ensemble_averages_its_members_probabilities_and_maps_their_disagreement(tmp_path):
    members = _members(tmp_path)
    ensemble = _ensemble(tmp_path, members, temperature=1.3)
    assert ensemble.metadata.schema_version == 3 and ensemble.metadata.ensemble_size == 3
    image = np.random.default_rng(0).normal(100, 20, (4, 70, 52)).astype(np.float32)
    prediction = Predictor(ensemble, device="cpu").predict(image, SPACING, keep_probabilities=True)
    mean, disagreement = _by_hand(members, image, 1.3)
    np.testing.assert_allclose(prediction.probabilities, mean, atol=1e-6)
    np.testing.assert_allclose(prediction.disagreement, disagreement, atol=1e-5)
    np.testing.assert_array_equal(prediction.labels, mean.argmax(axis=0))
    assert prediction.disagreement.max() > 0.01  # differently drawn members do disagree
    assert np.all(prediction.disagreement <= prediction.entropy + 1e-6)  # the epistemic part of the entropy


def test_a_3d_ensemble_averages_and_disagrees_the_same_way(tmp_path):
    window = SlidingWindow(patch_size=(8, 32, 32), mirror_axes=(1, 2))
    members = _members(tmp_path, 2, num_classes=3, patch_size=(8, 32, 32), spatial_dims=3,
                       preprocessing=Preprocessing(target_spacing=(4.0, 1.5, 1.5)), sliding_window=window)
    ensemble = _ensemble(tmp_path, members, temperature=0.8)
    image = np.random.default_rng(1).normal(100, 20, (9, 30, 27)).astype(np.float32)
    prediction = Predictor(ensemble, device="cpu", batch_size=4).predict(image, SPACING, keep_probabilities=True)
    mean, disagreement = _by_hand(members, image, 0.8)
    np.testing.assert_allclose(prediction.probabilities, mean, atol=1e-5)
    np.testing.assert_allclose(prediction.disagreement, disagreement, atol=1e-5)


def test_a_single_network_has_no_disagreement_and_keeps_the_schema_older_readers_take(tmp_path):
    member = _members(tmp_path, 1)[0]
    assert member.metadata.schema_version == SINGLE_NETWORK_SCHEMA_VERSION and member.metadata.ensemble_size == 1
    assert Predictor(member, device="cpu").predict(np.ones((3, 40, 40), np.float32) * np.arange(40), SPACING
                                                   ).disagreement is None


def test_mirroring_agreement_counts_each_member_by_its_own_classes(tmp_path):
    member = _members(tmp_path, 1)[0]
    twice = _ensemble(tmp_path, [member, member])
    images = torch.from_numpy(np.random.default_rng(2).normal(0, 1, (3, 1, 48, 40)).astype(np.float32))
    settings = SlidingWindow(patch_size=(64, 64), mirror_axes=(0, 1))
    alone, together = MirrorAgreement(4, settings.passes), MirrorAgreement(4, settings.passes)
    window_logits(member.build_model(), images, settings, alone)
    window_logits(twice.build_model(), images, settings, together)
    np.testing.assert_allclose(together.dice(), alone.dice())


@pytest.mark.parametrize("size, pattern", [(0, "ensemble_size=0"), (17, "1 to 16 networks")])
def test_an_ensemble_size_out_of_range_is_one_sentence(size, pattern, tmp_path):
    member = _members(tmp_path, 1)[0]
    with pytest.raises(BundleError) as caught:
        save_bundle(tmp_path / "bad.calibseg", member.state_dict, dataclasses.replace(member.metadata,
                                                                                       ensemble_size=size))
    assert_one_sentence(str(caught.value), pattern)
    assert not (tmp_path / "bad.calibseg").exists()


def test_an_ensemble_missing_a_members_weights_is_one_sentence(tmp_path):
    members = _members(tmp_path, 2)
    state = {f"members.0.{key}": tensor for key, tensor in members[0].state_dict.items()}
    with pytest.raises(BundleError) as caught:
        save_bundle(tmp_path / "bad.calibseg", state, dataclasses.replace(members[0].metadata, ensemble_size=2))
    assert_one_sentence(str(caught.value), "do not fit the declared network", "missing members.1.")


def test_predict_writes_the_disagreement_map_of_an_ensemble_only(tmp_path):
    from CalibSegLib.io import read_image

    image = np.random.default_rng(3).normal(100, 20, (4, 50, 44)).astype(np.float32)
    image_path = write_image(tmp_path / "case.nii.gz", image, ImageGeometry(spacing=SPACING))
    ensemble = _ensemble(tmp_path, _members(tmp_path, 2))
    assert predict_main(["--bundle", str(ensemble.path), "--image", str(image_path), "--out-dir",
                         str(tmp_path / "out"), "--device", "cpu"]) == 0
    written, _ = read_image(tmp_path / "out" / "case_disagreement.nii.gz")
    expected = Predictor(ensemble, device="cpu").predict(image, SPACING).disagreement
    np.testing.assert_allclose(written, expected, atol=1e-6)
    summary = json.loads((tmp_path / "out" / "case_summary.json").read_text())
    present = [entry for entry in summary["structures"].values() if entry["mean_confidence"] is not None]
    assert present and all(0 <= entry["mean_disagreement"] <= 1 for entry in present)
    single = _members(tmp_path, 1)[0]
    assert predict_main(["--bundle", str(single.path), "--image", str(image_path), "--out-dir",
                         str(tmp_path / "single"), "--device", "cpu"]) == 0
    assert not (tmp_path / "single" / "case_disagreement.nii.gz").exists()


def test_an_ensembles_metrics_score_its_disagreement_as_an_error_detector(tmp_path):
    from CalibSegLib.metrics import error_detection_auroc

    ensemble = _ensemble(tmp_path, _members(tmp_path, 2))
    image = np.random.default_rng(4).normal(100, 20, (4, 40, 36)).astype(np.float32)
    reference = (np.indices(image.shape)[1] // 10 % 4).astype(np.int64)
    evaluation = predict_and_evaluate(Predictor(ensemble, device="cpu"), image, reference, SPACING)
    correct = evaluation.prediction.labels == reference
    assert evaluation.confidence["disagreement_auroc"] == pytest.approx(
        error_detection_auroc(1.0 - evaluation.prediction.disagreement, correct))


def _averaged_model(class_names: list[str]):
    """A quality model that reads every per-member feature the fit averages, mirror agreement included."""
    from CalibSegLib.quality import UNCERTAINTY_FEATURES, QualityModel, StructureQuality
    from CalibSegLib.quality.model import AVERAGED, AVERAGED_FEATURES, FEATURES

    terms = [{"feature": name, "intercept": 0.5, "slope": 0.3 * FEATURES[name]}
             for name in (*UNCERTAINTY_FEATURES, MIRROR_AGREEMENT)]
    return QualityModel({name: StructureQuality(AVERAGED_FEATURES, AVERAGED, {"terms": terms}, (-0.1, 0.1), 0.05, 0.1,
                                                20) for name in class_names[1:]},
                        validation={"fold_networks": 3, "applied_to": "members"})


def _quality_ensemble(tmp_path, **overrides):
    """Three tiny members, mirrored and post-processed like the shipped ensembles, with a quality model."""
    members = _members(tmp_path, 3, sliding_window=SlidingWindow(patch_size=(64, 64), mirror_axes=(0, 1)),
                       postprocessing=Postprocessing(largest_component=(1, 2)), **overrides)
    ensemble = _ensemble(tmp_path, members, temperature=1.3)
    metadata = dataclasses.replace(ensemble.metadata, quality_model=_averaged_model(ensemble.metadata.class_names)
                                   .to_dict())
    return load_bundle(save_bundle(tmp_path / "quality.calibseg", ensemble.state_dict, metadata))


def _fold_case(seed: int, shape=(4, 56, 48)):
    from Datasets.loading import Case

    image = np.random.default_rng(seed).normal(100, 20, shape).astype(np.float32)
    label = (np.indices(shape)[1] // 14 % 4).astype(np.uint8)
    return Case("case0", "patient0", image, label, SPACING)


@pytest.mark.parametrize("three_d", [False, True])
def test_each_kept_member_is_what_that_member_alone_gives_under_the_ensembles_settings(tmp_path, three_d):
    from Training.ensemble import member_metadata

    overrides = {}
    if three_d:
        overrides = {"num_classes": 3, "patch_size": (8, 32, 32), "spatial_dims": 3,
                     "preprocessing": Preprocessing(target_spacing=(4.0, 1.5, 1.5))}
    members = _members(tmp_path, 2, sliding_window=SlidingWindow(patch_size=overrides.get("patch_size", (64, 64)),
                                                                 mirror_axes=(0, 1)), **overrides)
    ensemble = _ensemble(tmp_path, members, temperature=1.3)
    image = _fold_case(5, (9, 30, 27) if three_d else (4, 56, 48)).image
    prediction = Predictor(ensemble, device="cpu", batch_size=4).predict(image, SPACING, keep_members=True)
    assert len(prediction.members) == 2
    settings = member_metadata(ensemble.metadata)
    for member, network in zip(prediction.members, ensemble.build_model().members):
        alone = Predictor.from_network(network, settings, device="cpu", batch_size=4).predict(image, SPACING)
        np.testing.assert_array_equal(member.labels, alone.labels)
        np.testing.assert_allclose(member.confidence, alone.confidence, atol=1e-6)
        np.testing.assert_allclose(member.entropy, alone.entropy, atol=1e-6)
        np.testing.assert_allclose(member.probability_sums, alone.probability_sums, rtol=1e-6)
        np.testing.assert_allclose(member.mirror_agreement, alone.mirror_agreement)
    # The members differ, so the ensemble's own maps are not any one member's.
    assert not np.allclose(prediction.confidence, prediction.members[0].confidence)


def test_a_members_quality_features_at_inference_are_those_the_out_of_fold_fit_computed(tmp_path):
    from CalibSegLib.quality import observe_cases, quality_summary, structure_features
    from CalibSegLib.quality.members import member_predicted_dice
    from Training.ensemble import member_metadata

    ensemble = _quality_ensemble(tmp_path)
    case = _fold_case(6)
    prediction = Predictor(ensemble, device="cpu").predict(case.image, SPACING)  # a quality model: members kept
    model = ensemble.metadata.quality
    at_inference = [structure_features(member, 4, model.low_confidence_threshold, model.boundary_ring, SPACING)
                    for member in prediction.members]
    # What Training.ensemble.out_of_fold_quality fitted on: each fold network alone under member_metadata.
    settings = member_metadata(ensemble.metadata)
    fitted = [observe_cases(Predictor.from_network(network, settings, device="cpu"), [case])[0].features
              for network in ensemble.build_model().members]
    assert any(MIRROR_AGREEMENT in values for features in fitted for values in features if values)
    for inference_features, fit_features in zip(at_inference, fitted):
        assert [values is None for values in inference_features] == [values is None for values in fit_features]
        for ours, theirs in zip(inference_features, fit_features):
            if theirs is not None:
                assert ours.keys() == theirs.keys()
                np.testing.assert_allclose([ours[key] for key in theirs], list(theirs.values()), rtol=1e-6)
    # The summary's predicted Dice is the mean of the members' predictions from those features.
    expected = np.nan_to_num(member_predicted_dice(model, fitted, ensemble.metadata.class_names)).mean(axis=0)
    summary = quality_summary(prediction, SPACING, ensemble.metadata)
    shown = [entry["predicted_dice"] for entry in summary["structures"].values()]
    present = [entry["volume_ml"] > 0 for entry in summary["structures"].values()]
    np.testing.assert_allclose([value for value, kept in zip(shown, present) if kept],
                               [value for value, kept in zip(expected, present) if kept], rtol=1e-6)
    assert "the mean of the members' predicted Dice" in summary["note"]
    # ... and not what the model says of the average's smoother features.
    own = model.structures["class 1"].predict(structure_features(prediction, 4, spacing=SPACING)[0])
    assert shown[0] != pytest.approx(own, abs=1e-6)


def test_an_ensemble_prediction_without_its_members_gets_no_guessed_dice(tmp_path):
    from CalibSegLib.quality import quality_summary, structure_features

    ensemble = _quality_ensemble(tmp_path)
    image = _fold_case(7).image
    prediction = Predictor(ensemble, device="cpu").predict(image, SPACING, keep_members=False)
    assert prediction.members is None
    with pytest.raises(ValueError) as caught:
        quality_summary(prediction, SPACING, ensemble.metadata)
    assert_one_sentence(str(caught.value), "each member's own prediction")
    # A model fitted on the ensemble's own predictions (its validation patients) reads the average, not the members.
    own_model = dataclasses.replace(ensemble.metadata.quality, validation={"cases": 2})
    own = dataclasses.replace(ensemble.metadata, quality_model=own_model.to_dict())
    for metadata in (own, dataclasses.replace(ensemble.metadata, quality_model=None)):
        plain = Predictor(dataclasses.replace(ensemble, metadata=metadata), device="cpu").predict(image, SPACING)
        assert plain.members is None  # nothing reads them: no memory spent
    averaged = Predictor(dataclasses.replace(ensemble, metadata=own), device="cpu").predict(image, SPACING)
    summary = quality_summary(averaged, SPACING, own)
    expected = own_model.structures["class 1"].predict(structure_features(averaged, 4, spacing=SPACING)[0])
    assert summary["structures"]["class 1"]["predicted_dice"] == pytest.approx(expected)
