"""An ensemble's input judged by every member (CalibSegLib/feature_statistics.py ``MemberFeatureStatistics``): the
stored form read back and refused when malformed, the pooled threshold, the majority verdict in check_input and its
line, each member's distance read at its own bottleneck at inference, and an ensemble stored before (its first
member's features) still judged through that member."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from fault_checks import assert_one_sentence
from tiny_bundles import disc_case, make_test_bundle

from CalibSegLib.analysis import analyse_case
from CalibSegLib.bundle import BundleError, load_bundle, save_bundle
from CalibSegLib.bundle.schema import SCHEMA_VERSION
from CalibSegLib.feature_statistics import (FeatureStatisticsError, MemberFeatureStatistics, conformal_threshold,
                                            fit_feature_statistics, pool_member_statistics)
from CalibSegLib.features import bottleneck_layer, feature_distance, fit_member_features, fit_network_features, \
    volume_features
from CalibSegLib.inference import Predictor
from CalibSegLib.input_check import (InputStatistics, check_input, feature_lines, input_check_lines,
                                     statistics_of_cases)

PATCH = (64, 64)
SPACING = (10.0, 1.5, 1.5)


def _pooled(members: int = 3, seed: int = 0) -> tuple[MemberFeatureStatistics, list[list[float]]]:
    """Member statistics fitted on random vectors: each member's 20 training volumes, 8 it never saw; with every
    member's distances of its unseen volumes."""
    rng = np.random.default_rng(seed)
    fits, distances = [], []
    for index in range(members):
        volumes = [rng.normal(loc=index, size=(2, 6)) for _ in range(28)]
        fit = fit_feature_statistics(f"model.{index}", volumes[:20], volumes[20:])
        fits.append(fit)
        distances.append([fit.distance(volume) for volume in volumes[20:]])
    return pool_member_statistics(fits, distances), distances


def test_the_pooled_threshold_is_the_conformal_quantile_of_every_members_unseen_distances():
    pooled, distances = _pooled(members=5)
    everyone = [distance for member in distances for distance in member]
    threshold, within = conformal_threshold(everyone)
    assert pooled.threshold == threshold and within == math.ceil(41 * 0.95) == 39
    assert all((member.threshold, member.validation_volumes, member.validation_within) == (threshold, 40, 39)
               for member in pooled.members)
    # each member keeps its own Gaussian: the pooled threshold differs from what its own 8 volumes would set
    assert len({member.mean.tobytes() for member in pooled.members}) == 5
    assert any(max(member) != threshold for member in distances)


def test_member_statistics_come_back_as_stored():
    pooled, _ = _pooled()
    again = MemberFeatureStatistics.from_dict(json.loads(json.dumps(pooled.to_dict())), members=3)
    assert again.combination == "majority" and again.threshold == pooled.threshold
    vector = np.random.default_rng(9).normal(size=(3, 6))
    assert [member.distance(vector) for member in again.members] == pytest.approx(
        [member.distance(vector) for member in pooled.members], rel=1e-6)
    assert [member.layer for member in again.members] == ["model.0", "model.1", "model.2"]


def _stored(**changes) -> dict:
    values = _pooled()[0].to_dict()
    return {**values, **changes}


def _member_change(index: int, **changes) -> dict:
    values = _pooled()[0].to_dict()
    values["members"][index] = {**values["members"][index], **changes}
    return values


MALFORMED = {
    "not an object": ([1, 2], "member_features must be an object with the fields combination and members"),
    "an unknown field": (_stored(threshold=3.0), "member_features must be an object with the fields"),
    "the any-member rule": (_stored(combination="any"),
                            "member_features' combination must be one of majority, got 'any'"),
    "one member": (_stored(members=_stored()["members"][:1]), "members must be a list of 2 to 16 members' features"),
    "another number of members": (_stored(), "member_features hold 3 members' features for an ensemble of 5"),
    "a member's malformed mean": (_member_change(1, mean=[float("nan")] * 6),
                                  "member_features' member 1: features' mean must be a list of 1 to 2048 finite"),
    "members with their own thresholds": (_member_change(2, threshold=99.0),
                                          "members must share one threshold, false_alarm_rate and validation counts"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_member_statistics_are_refused_in_one_phrase(case):
    values, message = MALFORMED[case]
    with pytest.raises(FeatureStatisticsError) as caught:
        MemberFeatureStatistics.from_dict(values, members=5 if case == "another number of members" else 3)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory):
    """A tiny three-member ensemble bundle, its members' statistics fitted on disc volumes: each member trained on
    6 of 9 patients and never saw the other 3 (its fold), as a cross-validation's members."""
    folder = tmp_path_factory.mktemp("members")
    members = [load_bundle(make_test_bundle(folder / f"member{seed}.calibseg", seed=seed, patch_size=PATCH))
               for seed in range(3)]
    state = {f"members.{index}.{key}": tensor for index, member in enumerate(members)
             for key, tensor in member.state_dict.items()}
    metadata = dataclasses.replace(members[0].metadata, ensemble_size=3)
    cases = [disc_case(seed) for seed in range(9)]
    folds = [cases[3 * index:3 * index + 3] for index in range(3)]
    trained = [cases[:3 * index] + cases[3 * index + 3:] for index in range(3)]
    networks = list(load_bundle(save_bundle(folder / "plain.calibseg", state, metadata)).build_model().members)
    judges = fit_member_features(networks, metadata, trained, folds)
    statistics = statistics_of_cases(metadata, cases[3:], features=judges)
    return load_bundle(save_bundle(folder / "ensemble.calibseg", state,
                                   dataclasses.replace(metadata, input_statistics=statistics)))


def test_an_ensemble_bundle_stores_every_members_statistics_as_version_4(ensemble):
    statistics = ensemble.metadata.input_statistics
    assert statistics["version"] == 4 and statistics["features"] is None
    assert ensemble.metadata.schema_version == SCHEMA_VERSION
    judges = InputStatistics.from_dict(statistics, ensemble.metadata.class_names, 1, 3).member_features
    assert [member.training_volumes for member in judges.members] == [6, 6, 6]
    assert judges.members[0].validation_volumes == 9  # every member's 3 unseen volumes, pooled
    # a single network's statistics stay version 3, readable by a CalibSeg that reads 3
    single = InputStatistics.from_dict(statistics, ensemble.metadata.class_names, 1, 3)
    assert dataclasses.replace(single, member_features=None).to_dict()["version"] == 3


def test_the_majority_of_the_members_decides(ensemble):
    metadata = ensemble.metadata
    threshold = MemberFeatureStatistics.from_dict(metadata.input_statistics["member_features"]).threshold
    case = disc_case(20)
    low, high = threshold * 0.5, threshold * 2.0
    one = check_input(metadata, case.image, SPACING, case.label, [low, high, low])
    two = check_input(metadata, case.image, SPACING, case.label, [high, low, high])
    assert one["suitable"] is True and two["suitable"] is False  # 1 of 3 above: suitable; 2 of 3: not
    assert (one["features"]["members_above"], two["features"]["members_above"]) == (1, 2)
    assert one["features"]["distance"] == low and two["features"]["distance"] == high  # the majority's
    share = f"all 9 out-of-fold volumes ≤ {threshold:.3g}"
    assert input_check_lines(one)[1] == (f"network features: 1 of 3 members find it unlike their training images "
                                         f"(distances {low:.3g}, {high:.3g}, {low:.3g}; {share})")
    assert two["reasons"][0] == (f"Unlike the training images the networks saw: 2 of 3 members find it so, a "
                                 f"majority (feature distances {high:.3g}, {low:.3g}, {high:.3g}; {share}).")
    with pytest.raises(ValueError, match="take one distance per member, got"):
        check_input(metadata, case.image, SPACING, case.label, low)


def test_each_members_distance_is_read_at_its_own_bottleneck(ensemble):
    """At inference every member's distance is what its own encoder and Gaussian give; new clean volumes are like
    the training ones, inverted ones are not, to every member."""
    metadata, network = ensemble.metadata, ensemble.build_model()
    judges = MemberFeatureStatistics.from_dict(metadata.input_statistics["member_features"]).members
    case = disc_case(21)
    distances = feature_distance(network, metadata, case.image, SPACING)
    by_hand = [judge.distance(volume_features(member, bottleneck_layer(member, 1, PATCH), case.image, SPACING,
                                              metadata.preprocessing, metadata.sliding_window))
               for member, judge in zip(network.members, judges)]
    assert distances == pytest.approx(by_hand, rel=1e-9) and len(set(distances)) == 3
    analysis = analyse_case(Predictor(ensemble, device="cpu"), case.image, SPACING)
    assert analysis.summary["input_check"]["features"]["member_distances"] == pytest.approx(distances, rel=1e-5)
    inverted = disc_case(21, invert=True)
    check = analyse_case(Predictor(ensemble, device="cpu"), inverted.image, SPACING).summary["input_check"]
    assert check["suitable"] is False and check["features"]["members_above"] == 3


def test_member_statistics_for_another_number_of_networks_are_one_sentence(ensemble, tmp_path):
    metadata = ensemble.metadata
    state = {key: tensor for key, tensor in ensemble.state_dict.items() if not key.startswith("members.2.")}
    with pytest.raises(BundleError) as caught:
        save_bundle(tmp_path / "two.calibseg", state, dataclasses.replace(metadata, ensemble_size=2))
    assert_one_sentence(str(caught.value), "input_statistics are malformed",
                        "member_features hold 3 members' features for an ensemble of 2")


def test_an_ensemble_stored_with_its_first_members_features_is_still_judged_through_it(ensemble, tmp_path):
    """Bundles written before every member judged: ``features`` read from the whole ensemble network at the first
    member's bottleneck (``members.0. ...``), one distance, against that one threshold."""
    network, cases = ensemble.build_model(), [disc_case(seed) for seed in range(9)]
    first = fit_network_features(network, ensemble.metadata, cases[3:], cases[:3])
    assert first.layer.startswith("members.0.")
    statistics = statistics_of_cases(ensemble.metadata, cases[3:], features=first)
    assert statistics["version"] == 3 and "member_features" not in statistics
    old = load_bundle(save_bundle(tmp_path / "old.calibseg", ensemble.state_dict,
                                  dataclasses.replace(ensemble.metadata, input_statistics=statistics)))
    case = disc_case(22)
    distance = feature_distance(old.build_model(), old.metadata, case.image, SPACING)
    member = network.members[0]
    assert distance == pytest.approx(first.distance(volume_features(
        member, bottleneck_layer(member, 1, PATCH), case.image, SPACING, old.metadata.preprocessing,
        old.metadata.sliding_window)), rel=1e-9)
    check = analyse_case(Predictor(old, device="cpu"), case.image, SPACING).summary["input_check"]
    assert set(check["features"]) == {"distance", "threshold", "false_alarm_rate", "validation_volumes",
                                      "validation_within"}
    assert check["features"]["distance"] == pytest.approx(distance, rel=1e-5)
    said = feature_lines(check["features"])[0]  # one network's sentence, like or unlike
    assert said.startswith((f"network features: distance {distance:.3g}, like the training images the network saw",
                            f"Unlike the training images the network saw: feature distance {distance:.3g},"))
