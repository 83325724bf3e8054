"""Fault catalogue, the ensemble tools: ``python -m Training.sub_ensemble`` and ``calibseg-ship --rerecord`` given an
ensemble bundle whose ``ensemble`` section or ``input_statistics.member_features`` was tampered with, or members the
ensemble lacks, exit with one sentence after ``error:`` and change nothing on disk.

The bundles are tiny ensembles (:func:`tiny_bundles.make_test_ensemble`) with ``bundle.json`` rewritten
(:func:`fault_checks.rewrite_bundle`); every refusal comes before any patient is read."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import pytest

from CalibSegLib.bundle import read_metadata
from CalibSegLib.bundle.ensemble import SelectedFrom
from CalibSegLib.pretrained import resolve_bundle_path
from Reporting import ship
from Training import sub_ensemble
from fault_checks import assert_one_sentence, rewrite_bundle, tree_snapshot
from tiny_bundles import make_test_ensemble

SHIPPED = "tiny"  # the shipped model --rerecord replaces: the five-network ensemble


@pytest.fixture(scope="module")
def ensembles(tmp_path_factory) -> dict[str, Path]:
    """``five``: five networks judged by every member (acdc_crac's classes and input statistics, version 4);
    ``three``: its members 0, 1 and 2 as a sub-ensemble, ``selected_from`` naming it."""
    folder = tmp_path_factory.mktemp("ensembles")
    crac = read_metadata(resolve_bundle_path("acdc_crac"))
    five = make_test_ensemble(folder / "five.calibseg", 5, class_names=crac.class_names,
                              input_statistics=crac.input_statistics)
    origin = SelectedFrom(five.name, read_metadata(five).weights_sha256, (0, 1, 2))
    return {"five": five, "three": make_test_ensemble(folder / "three.calibseg", 3, selected_from=origin)}


def _members(change: Callable[[list], None]) -> Callable[[dict], None]:
    """A ``change_metadata`` editing ``ensemble.members``."""
    return lambda metadata: change(metadata["ensemble"]["members"])


def _origin(change: Callable[[dict], None]) -> Callable[[dict], None]:
    """A ``change_metadata`` editing ``ensemble.selected_from``."""
    return lambda metadata: change(metadata["ensemble"]["selected_from"])


def _judges(change: Callable[[dict], None]) -> Callable[[dict], None]:
    """A ``change_metadata`` editing ``input_statistics.member_features``."""
    return lambda metadata: change(metadata["input_statistics"]["member_features"])


def _ensemble(value) -> Callable[[dict], None]:
    """A ``change_metadata`` replacing the whole ``ensemble`` section."""
    return lambda metadata: metadata.update(ensemble=value)


def _ensemble_fields(**fields) -> Callable[[dict], None]:
    """A ``change_metadata`` replacing fields of the ``ensemble`` section."""
    return lambda metadata: metadata["ensemble"].update(fields)


def _set(key, value) -> Callable[[dict | list], None]:
    return lambda section: section.__setitem__(key, value)


def _unchanged(metadata: dict) -> None:
    """The bundle as made: the case is in the command line."""


MALFORMED = "The bundle's ensemble is malformed"
# case → (the ensemble given, --members, change of its bundle.json, regexes the sentence after "error: " matches)
BAD_SUB_ENSEMBLES: dict[str, tuple[str, list[str], Callable[[dict], None], tuple[str, ...]]] = {
    "members not a list": (
        "five", ["0", "1"], _ensemble_fields(members="0 1 2 3 4"),
        (MALFORMED, r"members must list one object per network, 5 \(its ensemble_size\), got str")),
    "four members for five networks": (
        "five", ["0", "1"], _members(lambda members: members.pop()),
        (r"members must list one object per network, 5 \(its ensemble_size\), got a list of 4 item\(s\)",)),
    "a member that is not an object": (
        "five", ["0", "1"], _members(_set(2, "fold 2")), (r"members\[2\] must be an object, got str",)),
    "a member without weights_sha256": (
        "five", ["0", "1"], _members(lambda members: members[1].pop("weights_sha256")),
        (r"members\[1\] lacks the field\(s\) weights_sha256",)),
    "a member without validation": (
        "five", ["0", "1"], _members(lambda members: members[4].pop("validation")),
        (r"members\[4\] lacks the field\(s\) validation",)),
    "a member with an unknown field": (
        "five", ["0", "1"], _members(lambda members: members[0].update(seed=3)),
        (r"members\[0\] has unknown field\(s\) seed",)),
    "validation not patient ids": (
        "five", ["0", "1"], _members(lambda members: members[3].update(validation=[3])),
        (r"members\[3\]'s validation must be a list of patient ids",)),
    "a fold given twice": (
        "five", ["0", "1"], _members(lambda members: members[1].update(fold=0)),
        ("members' folds must be distinct, got 0, 0, 2, 3, 4",)),
    "a negative own temperature": (
        "five", ["0", "1"], _members(lambda members: members[2].update(own_temperature=-1.0)),
        (r"members\[2\]'s own_temperature must be one positive number or a list of them, got -1.0",)),
    "ensemble a list": (
        "five", ["0", "1"], _ensemble([]), (MALFORMED, r"it must be an object, got a list of 0 item\(s\)")),
    "ensemble without temperature": (
        "five", ["0", "1"], lambda m: m["ensemble"].pop("temperature"), (r"it lacks the field\(s\) temperature",)),
    "no ensemble section on five networks": (
        "five", ["0", "1"], _ensemble(None),
        ("five.calibseg holds 5 networks but no ensemble section saying where they came from; build the ensemble "
         "with calibseg-ensemble",)),
    "selected_from a string": (
        "three", ["0", "1"], _ensemble_fields(selected_from="five.calibseg"),
        ("selected_from must be an object, got str",)),
    "--members 0 5 of five": (
        "five", ["0", "5"], _unchanged,
        ("--members must name at least two distinct members of five.calibseg, numbered 0 to 4; got 0 5",)),
    "--members 1 1": ("five", ["1", "1"], _unchanged, ("--members must name at least two distinct members",)),
    "--members 3": ("five", ["3"], _unchanged, ("--members must name at least two distinct members",)),
    "--members -1 2": ("five", ["-1", "2"], _unchanged, ("numbered 0 to 4; got -1 2",)),
}

# case → (change of the sub-ensemble's bundle.json, regexes the sentence after "error: " matches)
BAD_RERECORDS: dict[str, tuple[Callable[[dict], None], tuple[str, ...]]] = {
    "selected_from a string": (
        _ensemble_fields(selected_from="five.calibseg"), (MALFORMED, "selected_from must be an object, got str")),
    "selected_from a list": (
        _ensemble_fields(selected_from=[0, 1, 2]),
        (r"selected_from must be an object, got a list of 3 item\(s\)",)),
    "selected_from without bundle": (
        _origin(lambda origin: origin.pop("bundle")), (r"selected_from lacks the field\(s\) bundle",)),
    "selected_from without weights_sha256": (
        _origin(lambda origin: origin.pop("weights_sha256")), (r"selected_from lacks the field\(s\) weights_sha256",)),
    "selected_from without members": (
        _origin(lambda origin: origin.pop("members")), (r"selected_from lacks the field\(s\) members",)),
    "selected_from members repeated": (
        _origin(_set("members", [0, 0, 1])),
        (r"selected_from's members must be at least two distinct member numbers 0 to 15, got \[0, 0, 1\]",)),
    "selected_from members not integers": (
        _origin(_set("members", ["0", "1", "2"])), ("selected_from's members must be at least two distinct",)),
    "selected_from members beyond any ensemble": (
        _origin(_set("members", [0, 1, 16])), (r"member numbers 0 to 15, got \[0, 1, 16\]",)),
    "selected_from numbering fewer members": (
        _origin(_set("members", [0, 1])),
        (r"selected_from names 2 members for 3 networks \(its ensemble_size\), not one for each",)),
    "selected_from members beyond the shipped ensemble": (
        _origin(_set("members", [0, 1, 7])),
        ("three.calibseg records keeping members 0 1 7 of the shipped tiny, which holds members 0 to 4; make it again "
         "with python -m Training.sub_ensemble tiny",)),
    "a member without validation": (
        _members(lambda members: members[0].pop("validation")), (r"members\[0\] lacks the field\(s\) validation",)),
}

# case → (change of the five's bundle.json, regexes the sentence after "error: " matches), through both tools
BAD_MEMBER_FEATURES: dict[str, tuple[Callable[[dict], None], tuple[str, ...]]] = {
    "member features of four members for five networks": (
        _judges(lambda judges: judges["members"].pop()),
        ("input_statistics are malformed", "member_features hold 4 members' features for an ensemble of 5")),
    "a member's features not an object": (
        _judges(lambda judges: judges["members"].__setitem__(1, "features")),
        ("member_features' member 1: features must be an object, got str",)),
    "member features without members": (
        _judges(lambda judges: judges.pop("members")),
        ("member_features must be an object with the fields combination and members",)),
    "member features a list": (
        lambda m: m["input_statistics"].update(member_features=[]),
        ("member_features must be an object with the fields combination and members",)),
    "member features combined by any member": (
        _judges(_set("combination", "any")), ("member_features' combination must be one of majority, got 'any'",)),
    "member thresholds not pooled": (
        _judges(lambda judges: judges["members"][0].update(threshold=judges["members"][0]["threshold"] * 2)),
        ("member_features' members must share one threshold",)),
}


def _refused(folder: Path, command: Callable[[], object], patterns: tuple[str, ...]) -> None:
    """``command`` exits with one sentence after ``error: `` matching ``patterns`` and changes nothing in
    ``folder``."""
    before = tree_snapshot(folder)
    with pytest.raises(SystemExit) as caught:
        command()
    assert_one_sentence(str(caught.value.code), "^error: ", *patterns)
    assert tree_snapshot(folder) == before


def _sub_ensemble(bundle: Path, members: list[str], folder: Path) -> Callable[[], object]:
    (folder / "data").mkdir(exist_ok=True)
    return lambda: sub_ensemble.main([str(bundle), "--members", *members, "--out", str(folder / "smaller.calibseg"),
                                      "--data", str(folder / "data"), "--device", "cpu"])


def _rerecord(bundle: Path, ensembles: dict[str, Path], folder: Path) -> Callable[[], object]:
    """``calibseg-ship --rerecord tiny --bundle bundle`` into a models folder shipping the five as ``tiny``."""
    models = folder / "models"
    models.mkdir()
    shutil.copy(ensembles["five"], models / f"{SHIPPED}.calibseg")
    (models / f"{SHIPPED}.metrics.json").write_text('{"source_run": "runs/tiny-cv"}')
    (folder / "data").mkdir(exist_ok=True)
    return lambda: ship.main(["--rerecord", SHIPPED, "--bundle", str(bundle), "--out", str(models),
                              "--data", str(folder / "data"), "--device", "cpu"])


@pytest.mark.parametrize("case", list(BAD_SUB_ENSEMBLES))
def test_sub_ensemble_refuses_a_malformed_ensemble_or_members_in_one_sentence(case, ensembles, tmp_path):
    start, members, change, patterns = BAD_SUB_ENSEMBLES[case]
    bundle = rewrite_bundle(ensembles[start], tmp_path / f"{start}.calibseg", change)
    _refused(tmp_path, _sub_ensemble(bundle, members, tmp_path), patterns)


@pytest.mark.parametrize("case", list(BAD_RERECORDS))
def test_rerecord_refuses_a_malformed_sub_ensemble_in_one_sentence(case, ensembles, tmp_path):
    change, patterns = BAD_RERECORDS[case]
    bundle = rewrite_bundle(ensembles["three"], tmp_path / "three.calibseg", change)
    _refused(tmp_path, _rerecord(bundle, ensembles, tmp_path), patterns)


@pytest.mark.parametrize("tool", ["sub_ensemble", "rerecord"])
@pytest.mark.parametrize("case", list(BAD_MEMBER_FEATURES))
def test_both_tools_refuse_malformed_member_features_in_one_sentence(case, tool, ensembles, tmp_path):
    change, patterns = BAD_MEMBER_FEATURES[case]
    bundle = rewrite_bundle(ensembles["five"], tmp_path / "five.calibseg", change)
    command = (_sub_ensemble(bundle, ["0", "1"], tmp_path) if tool == "sub_ensemble"
               else _rerecord(bundle, ensembles, tmp_path))
    _refused(tmp_path, command, ("input_statistics are malformed", *patterns))


def test_the_untampered_ensembles_pass_every_check_up_to_their_patients(ensembles, tmp_path):
    """The cases above are refused for what was tampered with: as made, both tools get as far as the patients,
    which the empty data folder lacks."""
    _refused(tmp_path, _sub_ensemble(ensembles["five"], ["0", "2"], tmp_path),
             (r"five.calibseg records no training patients \(data\['train'\]\)",))
    _refused(tmp_path, _rerecord(ensembles["three"], ensembles, tmp_path), ("No training volumes in",))
