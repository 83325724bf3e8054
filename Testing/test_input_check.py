"""The input check (CalibSegLib/input_check/), the class terminology (CalibSegLib/terminology.py), both as
bundle.json sections validated on load, and the refit that stores them (Training/fit_input_check.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import zipfile
from types import SimpleNamespace

import numpy as np
import pytest
from tiny_bundles import make_test_bundle, make_test_metadata

from CalibSegLib.bundle import BundleError, load_bundle, save_bundle
from CalibSegLib.analysis import analyse_case
from CalibSegLib.inference import Predictor
from CalibSegLib.feature_statistics import fit_feature_statistics
from CalibSegLib.input_check import (FAMILIES, FEATURES_NOT_MEASURED, FEATURES_NOT_STORED, QUANTILE_LEVELS,
                                     THRESHOLDS, InputStatistics, check_input, excursions,
                                     fit_input_statistics, input_check_lines, observe_volume)
from CalibSegLib.terminology import parse_class_terminology
from Datasets.acdc import ACDC_CLASS_NAMES, ACDC_TERMINOLOGY
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Datasets.splits import select_patients
from Training.fit_input_check import refit_input_check

NAMES = ["background", "class 1", "class 2", "class 3"]
SPACING = (10.0, 1.5, 1.5)
# what a suitable volume gets from statistics without the network's features
SUITABLE = {"suitable": True, "reasons": [], "features": {"note": FEATURES_NOT_STORED}}


def _case(seed: int, scale: float = 1.0, shape=(4, 40, 48)) -> tuple[np.ndarray, np.ndarray]:
    """A dark volume with three nested bright-to-dark discs (labels 3, 2, 1), intensities scaled by ``scale``."""
    rng = np.random.default_rng(seed)
    k, j, i = np.indices(shape)
    radius = np.hypot(j - shape[1] / 2, i - shape[2] / 2)
    labels = np.select([radius < 5, radius < 8, radius < 11], [3, 2, 1], 0).astype(np.uint8)
    means = np.array([0.1, 0.5, 0.3, 0.8])
    image = means[labels] + rng.normal(0, 0.03, shape)
    return (image * scale).astype(np.float32), labels


def _statistics(thresholds=THRESHOLDS) -> InputStatistics:
    """Training ranges of four :func:`_case` volumes."""
    observations = [observe_volume(image, SPACING, labels, NAMES) for image, labels in map(_case, range(4))]
    return fit_input_statistics(observations, thresholds)


def test_observation_is_the_same_for_a_raw_and_an_already_scaled_volume():
    image, labels = _case(0)
    raw = observe_volume(image * 700.0 + 40.0, SPACING, labels, NAMES)
    scaled = observe_volume(image, SPACING, labels, NAMES)
    np.testing.assert_allclose(raw.quantiles, scaled.quantiles, atol=1e-6)
    assert raw.structure_intensity == pytest.approx(scaled.structure_intensity, abs=1e-6)
    assert raw.quantiles.shape == (1, len(QUANTILE_LEVELS))
    voxel_ml = 10.0 * 1.5 * 1.5 / 1000.0
    assert raw.structure_volume_ml["class 3"] == pytest.approx((labels == 3).sum() * voxel_ml)
    assert raw.field_of_view_mm == (40 * 1.5, 48 * 1.5) and raw.spacing_mm == (1.5, 1.5)


def test_training_like_volumes_have_no_excursion_and_degraded_ones_do():
    statistics = _statistics()
    image, labels = _case(7)
    assert excursions(statistics, observe_volume(image, SPACING, labels, NAMES)) == dict.fromkeys(FAMILIES, 0.0)
    inverted = observe_volume(image.max() + image.min() - image, SPACING, labels, NAMES)
    values = excursions(statistics, inverted)
    assert values["intensity"] > 0.3 and values["structure_intensity"] > 0.3
    # A structure predicted nowhere is always a reason; a volume 4 times the largest seen is log 4 out.
    missing = observe_volume(image, SPACING, np.where(labels == 2, 0, labels), NAMES)
    assert excursions(statistics, missing)["structure_volume"] == math.inf
    thicker = observe_volume(image, (40.0, 1.5, 1.5), labels, NAMES)
    assert excursions(statistics, thicker)["structure_volume"] == pytest.approx(math.log(4.0))
    wide = observe_volume(image, (10.0, 3.0, 3.0), labels, NAMES)
    assert excursions(statistics, wide)["geometry"] == pytest.approx(math.log(2.0))


def _metadata_with_statistics(statistics: InputStatistics):
    return make_test_metadata(input_statistics=statistics.to_dict())


def _with_features(statistics: InputStatistics) -> InputStatistics:
    """``statistics`` with network features fitted on random vectors (10 validation volumes, the largest of
    their distances the threshold)."""
    rng = np.random.default_rng(3)
    volumes = [rng.normal(size=(2, 6)) for _ in range(30)]
    features = fit_feature_statistics("model.1", volumes[:20], volumes[20:])
    return dataclasses.replace(statistics, features=features)


def test_spacing_is_judged_by_the_models_grid_not_by_the_training_volumes():
    """Every training volume at 1.5 mm, the model's grid 1.5 mm: finer pixels down to 1/6 of it and coarser
    ones up to 2.25 times it (a factor 1.5 beyond what resampling takes with little loss) are suitable."""
    statistics = _statistics()
    assert statistics.spacing_mm == (1.5, 1.5)  # a degenerate range, not a rule
    image, labels = _case(7)

    def at(pixel: float) -> dict[str, float]:  # the same field of view at another pixel size
        factor = 1.5 / pixel
        shape = (4, round(40 * factor), round(48 * factor))
        index = tuple(np.minimum((np.indices(shape)[axis] / (factor if axis else 1)).astype(int), size - 1)
                      for axis, size in enumerate(image.shape))
        observation = observe_volume(image[index], (10.0, pixel, pixel), labels[index], NAMES)
        return excursions(statistics, observation)

    for pixel in (0.375, 0.75, 1.5, 2.25):
        assert at(pixel)["geometry"] == pytest.approx(0.0, abs=0.02), pixel  # the field of view rounds
    assert at(3.0)["geometry"] == pytest.approx(math.log(2.0 / 1.5), abs=0.02)  # within log 1.5: suitable
    assert at(4.5)["geometry"] == pytest.approx(math.log(2.0), abs=0.02)  # beyond: unsuitable
    assert at(0.2)["geometry"] == pytest.approx(math.log(0.25 * 1.5 / 0.2), abs=0.02)
    metadata = _metadata_with_statistics(statistics)
    fine = check_input(metadata, np.repeat(np.repeat(image, 10, axis=1), 10, axis=2), (10.0, 0.15, 0.15),
                       np.repeat(np.repeat(labels, 10, axis=1), 10, axis=2))
    assert fine["reasons"] == ["Its in-plane pixel spacing, 0.15 mm, is 0.1 times the model's 1.50 mm grid, "
                               "beyond what resampling to it can take (0.25–3.38 mm pixels)."]


def test_a_3d_models_grid_is_its_in_plane_target_spacing():
    from CalibSegLib.preprocessing import Preprocessing

    image, labels = _case(7)
    grid = Preprocessing(target_spacing=(3.0, 1.0, 1.0))
    observation = observe_volume(image, (3.0, 0.5, 0.5), labels, NAMES, grid)
    assert observation.grid_mm == (1.0, 1.0) and observation.spacing_mm == (0.5, 0.5)


def test_the_network_feature_distance_is_checked_against_its_threshold():
    statistics = _with_features(_statistics())
    threshold = statistics.features.threshold
    metadata = _metadata_with_statistics(statistics)
    image, labels = _case(9)
    like = check_input(metadata, image, SPACING, labels, feature_distance=threshold * 0.5)
    assert like["suitable"] is True and like["features"] == {
        "distance": threshold * 0.5, "threshold": threshold, "false_alarm_rate": 0.05,
        "validation_volumes": 10, "validation_within": 10}
    assert input_check_lines(like) == [
        "input suitable: like the model's training volumes",
        f"network features: distance {threshold * 0.5:.3g}, like the training images the network saw (all 10 "
        f"validation volumes ≤ {threshold:.3g})"]
    unlike = check_input(metadata, image, SPACING, labels, feature_distance=threshold * 2)
    assert unlike["suitable"] is False and unlike["reasons"] == [
        f"Unlike the training images the network saw: feature distance {threshold * 2:.3g}, above all 10 "
        f"validation volumes (≤ {threshold:.3g})."]
    assert input_check_lines(unlike) == [  # the distance said once
        "INPUT UNSUITABLE: unlike the model's training volumes, so no Dice here can be trusted.",
        *unlike["reasons"]]
    # the features' sentence comes first, before those of the statistics
    inverted = check_input(metadata, image.max() + image.min() - image, SPACING, labels,
                           feature_distance=threshold * 2)
    assert inverted["reasons"][0] == unlike["reasons"][0] and len(inverted["reasons"]) == 3
    assert check_input(metadata, image, SPACING, labels)["features"] == {"note": FEATURES_NOT_MEASURED}


def test_statistics_of_version_2_keep_their_checks_and_say_the_features_were_not_checked(tmp_path):
    values, weights = _stored(tmp_path, input_statistics=_statistics().to_dict())
    values["input_statistics"]["version"] = 2
    del values["input_statistics"]["features"]
    values["schema_version"] = 2  # a bundle written before the features
    metadata = load_bundle(_with_metadata(tmp_path, values, weights)).metadata
    image, labels = _case(9)
    assert check_input(metadata, image, SPACING, labels, feature_distance=99.0) == SUITABLE
    inverted = check_input(metadata, image.max() + image.min() - image, SPACING, labels)
    assert inverted["suitable"] is False and input_check_lines(inverted)[-1] == FEATURES_NOT_STORED


def test_check_input_names_each_unsuitable_family_in_one_sentence():
    metadata = _metadata_with_statistics(_statistics())
    image, labels = _case(9, scale=300.0)
    assert check_input(metadata, image, SPACING, labels) == SUITABLE
    inverted = image.max() + image.min() - image
    check = check_input(metadata, inverted, SPACING, np.where(labels == 1, 0, labels))
    assert check["suitable"] is False and len(check["reasons"]) == 3  # intensity, structure intensity, missing
    assert check["reasons"][-1] == "No class 1 was found, though every training volume has it."
    assert all(reason.endswith((".", "?")) and reason.count(". ") == 0 for reason in check["reasons"])
    lines = input_check_lines(check)
    assert lines[0].startswith("INPUT UNSUITABLE") and lines[1:] == [*check["reasons"], FEATURES_NOT_STORED]


def test_thresholds_decide_what_is_unsuitable():
    image, labels = _case(9)
    inverted = (image.max() + image.min() - image, SPACING, labels)
    lenient = dict.fromkeys(FAMILIES, 10.0)
    assert check_input(_metadata_with_statistics(_statistics(lenient)), *inverted)["suitable"] is True
    assert check_input(_metadata_with_statistics(_statistics()), *inverted)["suitable"] is False


def test_a_bundle_without_statistics_is_not_checked():
    image, labels = _case(0)
    check = check_input(make_test_metadata(), image, SPACING, labels)
    assert check["suitable"] is None and check["note"].startswith("input not checked")
    assert input_check_lines(check) == [check["note"]]


def _ct_case(seed: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_case`'s discs as a CT in HU: air (-1000) around fat, muscle and a contrast-filled cavity."""
    image, labels = _case(seed)
    noise = image - np.array([0.1, 0.5, 0.3, 0.8])[labels]  # the case's own noise, sd 0.03: 9 HU here
    hounsfield = np.array([-1000.0, -100.0, 50.0, 200.0])[labels] + noise * 300
    return (hounsfield + shift).astype(np.float32), labels


def test_a_ct_channel_is_checked_in_its_hounsfield_window_so_a_lost_rescale_intercept_is_caught():
    from CalibSegLib.input_check import OUTDATED, statistics_of_cases
    from CalibSegLib.preprocessing import ChannelNormalization, Preprocessing

    window = Preprocessing(channel_normalization=[ChannelNormalization("ct", (-150.0, 250.0), 40.0, 110.0)])
    metadata = make_test_metadata(channel_names=["CT"], preprocessing=window)
    cases = [SimpleNamespace(image=image, label=labels, spacing=SPACING) for image, labels in map(_ct_case, range(4))]
    metadata = dataclasses.replace(metadata, input_statistics=statistics_of_cases(metadata, cases))
    image, labels = _ct_case(9)
    lost_intercept = image + 1024.0  # stored values, the -1024 HU rescale intercept not applied
    assert check_input(metadata, image, SPACING, labels) == SUITABLE
    check = check_input(metadata, lost_intercept, SPACING, labels)
    assert check["suitable"] is False and "intensit" in check["reasons"][0], check
    # scaled per image, as the version-1 statistics did, the shifted CT is indistinguishable from the clean one
    np.testing.assert_allclose(observe_volume(lost_intercept, SPACING, labels, NAMES).quantiles,
                               observe_volume(image, SPACING, labels, NAMES).quantiles, atol=1e-5)
    version_1 = {key: value for key, value in metadata.input_statistics.items() if key != "features"}
    outdated = dataclasses.replace(metadata, input_statistics={**version_1, "version": 1})
    assert check_input(outdated, lost_intercept, SPACING, labels) == {"suitable": None, "reasons": [],
                                                                       "note": OUTDATED}


def _stored(tmp_path, **sections) -> dict:
    path = make_test_bundle(tmp_path / "model.calibseg")
    bundle = load_bundle(path)
    save_bundle(path, bundle.state_dict, dataclasses.replace(bundle.metadata, **sections))
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("bundle.json")), archive.read("weights.safetensors")


def _with_metadata(tmp_path, values: dict, weights: bytes):
    path = tmp_path / "edited.calibseg"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("bundle.json", json.dumps(values))
        archive.writestr("weights.safetensors", weights)
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.update(thresholds={"intensity": 0.1}), "thresholds must give"),
    (lambda s: s["structure_volume_ml"].update({"class 1": [5.0, 1.0]}), "structure_volume_ml of class 1"),
    (lambda s: s["structure_volume_ml"].pop("class 2"), "must name exactly the structures"),
    (lambda s: s.update(intensity=[[[0.0, 1.0]]]), "intensity must hold"),
    (lambda s: s.update(extra=1), "wrong: extra"),
    (lambda s: s.update(volumes=0), "volumes must be a positive integer"),
    (lambda s: s.update(version=5), "version 5 is not 1, 2, 3 or 4"),
    (lambda s: s.update(version=2), "wrong: features"),
    (lambda s: s["features"].update(threshold=-1.0), "features' threshold must be a positive number"),
])
def test_malformed_input_statistics_are_refused_in_one_sentence(tmp_path, edit, message):
    values, weights = _stored(tmp_path, input_statistics=_with_features(_statistics()).to_dict())
    stored = load_bundle(_with_metadata(tmp_path, values, weights)).metadata.input_statistics
    assert stored == values["input_statistics"]
    edit(values["input_statistics"])
    with pytest.raises(BundleError, match="input_statistics are malformed") as error:
        load_bundle(_with_metadata(tmp_path, values, weights))
    assert message in str(error.value) and str(error.value).endswith(".")


TERMINOLOGY = {"class 1": {"category": {"CodingSchemeDesignator": "SCT", "CodeValue": "123037004",
                                        "CodeMeaning": "Anatomical Structure"},
                           "type": {"CodingSchemeDesignator": "SCT", "CodeValue": "53085002",
                                    "CodeMeaning": "Right ventricle"}}}


@pytest.mark.parametrize("edit, message", [
    (lambda t: t["class 1"]["type"].pop("CodeValue"), "exactly CodingSchemeDesignator, CodeValue, CodeMeaning"),
    (lambda t: t["class 1"]["type"].update(CodeMeaning="Right~ventricle"), "without '~' or '^'"),
    (lambda t: t["class 1"]["type"].update(CodingSchemeDesignator="S" * 17), "at most 16 characters"),
    (lambda t: t["class 1"].pop("category"), "must be an object with category and type"),
    (lambda t: t.update({"background": t["class 1"]}), "not foreground classes"),
    (lambda t: t["class 1"].update(region_modifier=t["class 1"]["type"]), "region_modifier but no region"),
])
def test_malformed_terminology_is_refused_in_one_sentence(tmp_path, edit, message):
    values, weights = _stored(tmp_path, class_terminology=json.loads(json.dumps(TERMINOLOGY)))
    assert load_bundle(_with_metadata(tmp_path, values, weights)).metadata.class_terminology == TERMINOLOGY
    edit(values["class_terminology"])
    with pytest.raises(BundleError, match="class_terminology is malformed") as error:
        load_bundle(_with_metadata(tmp_path, values, weights))
    assert message in str(error.value) and str(error.value).endswith("re-export the bundle.")


def test_acdc_terminology_is_specific_snomed_ct_for_every_structure():
    entries = parse_class_terminology(ACDC_TERMINOLOGY, ACDC_CLASS_NAMES)
    assert sorted(entries) == sorted(ACDC_CLASS_NAMES[1:])
    assert {name: (entry.type.scheme, entry.type.value) for name, entry in entries.items()} == {
        "right ventricle": ("SCT", "53085002"), "myocardium": ("SCT", "74281007"),
        "left ventricle": ("SCT", "87878005")}
    assert all(entry.category.value == "123037004" for entry in entries.values())  # not Slicer's "Tissue" 85756007
    assert entries["myocardium"].region.value == "87878005"  # the left ventricle's myocardium


def test_refit_stores_statistics_and_keeps_weights_and_predictions(tmp_path, sample_acdc_dir):
    training = ["patient013", "patient016"]
    source = make_test_bundle(tmp_path / "model.calibseg")
    bundle = load_bundle(source)
    metadata = dataclasses.replace(bundle.metadata, class_names=list(ACDC_CLASS_NAMES),
                                   data={"dataset": "acdc-sample", "train": training, "val": ["patient022"]})
    save_bundle(source, bundle.state_dict, metadata, half=True)
    written = refit_input_check(source, data=sample_acdc_dir, out=tmp_path / "refitted.calibseg")
    before, after = load_bundle(source), load_bundle(written)
    assert after.metadata.weights_sha256 == before.metadata.weights_sha256 and after.metadata.weights_dtype == "float16"
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(written) as new:
        assert old.read("weights.safetensors") == new.read("weights.safetensors")
    assert after.metadata.class_terminology == ACDC_TERMINOLOGY
    statistics = InputStatistics.from_dict(after.metadata.input_statistics, ACDC_CLASS_NAMES)
    cases = load_cases(select_patients(find_cases(sample_acdc_dir), training), 4)
    assert statistics.volumes == len(cases) == 4 and statistics.thresholds == THRESHOLDS
    case = cases[0]
    assert np.array_equal(Predictor(before, device="cpu").predict(case.image, case.spacing).labels,
                          Predictor(after, device="cpu").predict(case.image, case.spacing).labels)
    # A training volume with its own reference labels lies inside the ranges it helped make.
    assert check_input(after.metadata, case.image, case.spacing, case.label) == {
        "suitable": True, "reasons": [], "features": {"note": FEATURES_NOT_MEASURED}}
    # The network's features: fitted on the 4 training volumes, the threshold on the 2 validation ones.
    features = statistics.features
    assert (features.training_volumes, features.validation_volumes, features.validation_within) == (4, 2, 2)
    assert features.layer == "model.1"  # the tiny UNet's skip connection
    check = analyse_case(Predictor(after, device="cpu"), case.image, case.spacing).summary["input_check"]
    assert check["features"]["threshold"] == features.threshold and check["features"]["distance"] > 0


def test_a_multichannel_models_reason_names_the_channel_that_is_unlike_training():
    from CalibSegLib.input_check import statistics_of_cases

    metadata = make_test_metadata(in_channels=2, channel_names=["T1", "FLAIR"])
    cases = [SimpleNamespace(image=np.stack([image, image]), label=labels, spacing=SPACING)
             for image, labels in map(_case, range(4))]
    metadata = dataclasses.replace(metadata, input_statistics=statistics_of_cases(metadata, cases))
    image, labels = _case(9)
    assert check_input(metadata, np.stack([image, image]), SPACING, labels)["suitable"] is True
    check = check_input(metadata, np.stack([image, image.max() + image.min() - image]), SPACING, labels)
    assert check["suitable"] is False and check["reasons"][0].startswith(
        "Its intensity histogram is unlike every training volume's (FLAIR: the "), check["reasons"]
    # one channel needs no name
    single = check_input(_metadata_with_statistics(_statistics()), image.max() + image.min() - image, SPACING, labels)
    assert single["reasons"][0].startswith("Its intensity histogram is unlike every training volume's (the "), single
