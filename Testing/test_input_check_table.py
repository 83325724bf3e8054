"""studies/input_check_table.py's record: one table row per kind in the split's order with the kinds still to measure
named, a record of other weights refused in one sentence, docs/input_check.md's block copied from the record, and an
earlier record's predictions judged again by the bundle's feature statistics (``--reuse-predictions``)."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest

from CalibSegLib.feature_statistics import FeatureStatistics, MemberFeatureStatistics
from CalibSegLib.io import write_json_atomic
from Reporting import readme_tables
from studies import input_check_table
from studies.input_check_table import (Outcome, features_only, input_kinds, make_record, read_record, reused_outcomes,
                                       table)

NAN = math.nan


def _outcomes() -> list[Outcome]:
    """Two clean volumes (one called unsuitable), two inverted copies that failed (one caught), one noise volume."""
    return [Outcome("contrast inversion", "p1_f1", False, True, True, 60.0, 0.1),
            Outcome("clean", "p1_f1", True, False, False, 20.0, 0.9),
            Outcome("clean", "p2_f1", False, True, False, 45.0, 0.8),
            Outcome("contrast inversion", "p2_f1", True, False, False, 30.0, 0.5),
            Outcome("uniform noise", "noise0", False, True, True, 90.0, NAN)]


def test_table_rows_follow_the_split_order_and_name_the_kinds_not_measured():
    lines = table(_outcomes(), input_kinds("test"))
    rows = [line.split(" | ")[0].lstrip("| ") for line in lines[2:5]]
    assert rows == ["clean", "contrast inversion", "uniform noise"]
    assert lines[2] == "| clean | 2 | **1** | 1 | 0 | 0.850 (0.800) | 0: 0 unsuitable |"
    assert lines[3] == "| contrast inversion | 2 | **1** | 1 | 1 | 0.300 (0.100) | 2: 1 unsuitable |"
    assert lines[4] == "| uniform noise | 1 | **1** | 1 | 1 | no heart | – |"
    assert ("Clean volumes called unsuitable: 1 of 2; shifted volumes with Dice < 0.7 called unsuitable: 1 of 2."
            in lines)
    assert lines[-1].startswith("Not measured yet: gamma 3; noise 10 %;") and "CT-like abdomen (HU)." in lines[-1]
    assert not any(line.startswith("Not measured") for line in table(_outcomes()))


def test_a_record_gives_back_its_outcomes_and_refuses_other_weights(tmp_path):
    path = tmp_path / "record.json"
    assert read_record(path, "abc", "test") == ([], 0.0)
    write_json_atomic(path, make_record("acdc_x", "abc", "test", _outcomes(), 41.8, {"intensity": 0.08}, 125.0))
    outcomes, seconds = read_record(path, "abc", "test")
    assert seconds == 125.0 and [(o.kind, o.name) for o in outcomes] == [(o.kind, o.name) for o in _outcomes()]
    assert math.isnan(outcomes[-1].dice)
    with pytest.raises(SystemExit, match=r"^error: .*record\.json records the test split of acdc_x as another "
                                         r"bundle file or split than this test run's; give another --record, or "
                                         r"remove it to measure again\.$"):
        read_record(path, "def", "test")
    with pytest.raises(SystemExit, match=r"records the test split of acdc_x as another bundle file or split than "
                                         r"this val run's"):
        read_record(path, "abc", "val")


def test_the_input_check_page_copies_the_recorded_table(tmp_path):
    path = tmp_path / "docs" / "records" / "input_check" / "acdc_crac_test.json"
    path.parent.mkdir(parents=True)
    write_json_atomic(path, make_record("acdc_crac", "abc", "test", _outcomes(), 39.5, {}, 3600.0))
    text = "<!-- generated:input_check_acdc_crac_test begin -->\n<!-- generated:input_check_acdc_crac_test end -->\n"
    new, rebuilt, _ = readme_tables.regenerate(text, tmp_path)
    assert rebuilt == ["input_check_acdc_crac_test"]
    assert "| contrast inversion | 2 | **1** | 1 | 1 | 0.300 (0.100) | 2: 1 unsuitable |" in new
    assert re.search(r"`python -m studies\.input_check_table --bundle acdc_crac --split test --record \.\.\.`: 5 "
                     r"inputs, feature threshold 39\.5, 60 min on \d+ CPU cores, recorded \d{4}-\d\d-\d\d\.", new)



def test_reused_predictions_keep_the_dice_and_statistics_and_judge_the_features_again(tmp_path, monkeypatch):
    """``--reuse-predictions``: an earlier record's Dice and statistics' verdict, the features judged by the bundle now
    (two of three members above the threshold: unlike; one: like); a record of other weights is refused."""
    path = tmp_path / "old.json"
    write_json_atomic(path, {**make_record("acdc_x", "abc", "test", _outcomes(), 41.8, {}, 1.0),
                             "weights_sha256": "w1"})
    reused = reused_outcomes(path, SimpleNamespace(weights_sha256="w1"), "test")
    assert reused[("clean", "p1_f1")].dice == 0.9
    with pytest.raises(SystemExit, match=r"^error: .*old\.json records the test split of other weights than this test "
                                         r"run's bundle, so its predictions are not this bundle's"):
        reused_outcomes(path, SimpleNamespace(weights_sha256="w2"), "test")
    judge = FeatureStatistics("model.1", np.zeros(3), np.eye(3)[:1], np.ones(1), 1.0, 10.0, 0.05, 9, 9, 20)
    statistics = SimpleNamespace(member_features=MemberFeatureStatistics((judge, judge, judge)), features=None)
    distances = iter([[5.0, 12.0, 11.0], [5.0, 6.0, 11.0]])
    monkeypatch.setattr(input_check_table, "feature_distance", lambda *arguments: next(distances))
    predictor = SimpleNamespace(model=None, metadata=None, batch_size=1)
    item = SimpleNamespace(kind="clean", name="p1_f1", image=None, spacing=None)
    unlike, like = (features_only(predictor, statistics, item, reused[("clean", "p1_f1")]) for _ in range(2))
    assert (unlike.suitable, unlike.by_features, unlike.distance, unlike.dice) == (False, True, 11.0, 0.9)
    assert (like.suitable, like.by_features, like.distance, like.member_distances) == (
        True, False, 6.0, [5.0, 6.0, 11.0])


def test_the_spacing_study_pairs_each_resampled_copy_with_its_native_verdict():
    """studies/input_check_spacing.py: a shifted copy resampled is the table's own draw resampled, and the agreement
    counts per shift are those of the paired outcomes."""
    from Evaluation.shifts import SHIFTS, at_pixel_spacing
    from studies.input_check_spacing import agreement, resampled_shifts
    from tiny_bundles import disc_case

    cases = [disc_case(seed) for seed in range(input_check_table.OTHER_INPUTS)]  # the noise volumes take as many
    for case in cases:
        case.case_id = f"{case.patient_id}_frame01"
    resampled = list(resampled_shifts(cases, 0.75))
    native = list(input_check_table.inputs(cases, "test", list(SHIFTS)))
    assert [(item.kind, item.name) for item in resampled] == [(item.kind, item.name) for item in native]
    for first, second in zip(native, resampled):
        expected, spacing = at_pixel_spacing(first.image, first.spacing, 0.75)
        np.testing.assert_array_equal(second.image, expected)
        assert spacing == second.spacing == (10.0, 0.75, 0.75)
        assert second.label.shape == second.image.shape == (4, 160, 192)
    kinds = list(SHIFTS)[:2]
    by_input = {(kind, name): Outcome(kind, name, suitable, not suitable, False, 40.0, 0.5)
                for kind, name, suitable in ((kinds[0], "a", True), (kinds[0], "b", False), (kinds[1], "a", False))}
    again = [Outcome(kinds[0], "a", True, False, False, 41.0, 0.5),
             Outcome(kinds[0], "b", True, False, False, 41.0, 0.5),
             Outcome(kinds[1], "a", False, True, False, 41.0, 0.5)]
    rows = agreement(by_input, again)
    assert rows[0] == {"shift": kinds[0], "copies": 2, "unsuitable_native": 1, "unsuitable_resampled": 0,
                       "same_verdict": 1}
    assert rows[-1] == {"shift": "all shifts", "copies": 3, "unsuitable_native": 2, "unsuitable_resampled": 1,
                        "same_verdict": 2}
