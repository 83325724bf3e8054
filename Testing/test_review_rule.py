"""The review rule (CalibSegLib.quality.review_rule): flags counted among poor and good structures per threshold,
structures predicted nowhere always flagged, and the rule's choice, pooled or per structure, as written in
docs/results.md, judged on folds it was not chosen on."""

from __future__ import annotations

import numpy as np
import pytest

from CalibSegLib.quality.review_rule import (THRESHOLDS, choose_review_rule, choose_review_threshold, fold_numbers,
                                             nested_thresholds, pooled_thresholds, trade_off)


def test_trade_off_counts_flags_among_poor_and_good_structures_by_hand():
    predicted = np.array([0.70, 0.84, 0.86, np.nan, 0.92, 0.95, 0.83, 0.97])
    measured = np.array([0.60, 0.75, 0.78, 0.10, 0.95, 0.97, 0.91, 0.85])  # 4 poor, 3 good, 1 neither
    rows = {row["review_below"]: row for row in trade_off(predicted, measured)}
    assert set(rows) == set(THRESHOLDS)
    at_080, at_085, at_087 = rows[0.80], rows[0.85], rows[0.87]
    assert (at_080["poor"], at_080["poor_flagged"], at_080["good"], at_080["good_flagged"]) == (4, 2, 3, 0)
    assert (at_085["poor_flagged"], at_085["good_flagged"]) == (3, 1)  # 0.84 caught; the good 0.83 flagged too
    assert (at_087["poor_flagged"], at_087["recall"], at_087["false_flag_share"]) == (4, 1.0, pytest.approx(1 / 3))
    assert at_087["flagged_share"] == pytest.approx(5 / 8)
    # the rule: the smallest threshold reaching 90 % of the poor ones (4 of 4 from 0.87 on; 3 of 4 is 75 %), and
    # whether its false flags stay within 5 % (1 of 3 good ones flagged: they do not)
    chosen = choose_review_threshold(trade_off(predicted, measured))
    assert (chosen["review_below"], chosen["meets_false_flags"]) == (0.87, False)
    assert choose_review_threshold(trade_off(predicted, measured), target_recall=0.75)["review_below"] == 0.85


def test_the_rule_says_when_its_false_flags_meet_the_target():
    # 10 poor structures predicted low, 40 good ones predicted high, 2 of them at 0.86 (flagged from 0.87 on)
    predicted = np.array([0.70] * 10 + [0.86] * 2 + [0.97] * 38)
    measured = np.array([0.60] * 10 + [0.95] * 40)
    chosen = choose_review_threshold(trade_off(predicted, measured))
    assert (chosen["review_below"], chosen["recall"], chosen["false_flag_share"]) == (0.80, 1.0, 0.0)
    assert chosen["meets_false_flags"]
    rows = trade_off(predicted, measured)
    assert [row["false_flag_share"] for row in rows if row["review_below"] == 0.87] == [pytest.approx(2 / 40)]
    assert choose_review_threshold(rows[7:])["meets_false_flags"]  # 2 of 40 = 5 %: within the target


def test_the_rule_takes_the_largest_threshold_when_none_reaches_the_target():
    predicted, measured = np.array([0.99, 0.99, 0.50]), np.array([0.50, 0.60, 0.70])
    chosen = choose_review_threshold(trade_off(predicted, measured))
    assert chosen["review_below"] == THRESHOLDS[-1] and chosen["recall"] == pytest.approx(1 / 3)



FIVE_FOLDS = np.arange(40) % 5  # each of the 40 volumes' fold: every fold holds 2 poor and 6 good of each structure


def _two_structures(first_poor: float, first_good: float, second_good: float) -> tuple[np.ndarray, np.ndarray]:
    """Two structures over 40 volumes, each with 10 poor (measured 0.60) and 30 good (0.95) ones: the first's
    predicted ``first_poor`` and ``first_good``, the second's predicted 0.70 and ``second_good``."""
    predicted = np.column_stack([[first_poor] * 10 + [first_good] * 30, [0.70] * 10 + [second_good] * 30])
    measured = np.column_stack([[0.60] * 10 + [0.95] * 30] * 2)
    return predicted, measured


def test_the_rule_stays_pooled_where_one_threshold_meets_both_targets():
    # 0.87 catches all 20 poor ones and flags none of the 60 good ones
    rule = choose_review_rule(*_two_structures(0.86, 0.97, 0.97), ["first", "second"], FIVE_FOLDS)
    assert (rule["by_structure"], rule["review_below"], rule["review_below_by_structure"]) == (False, 0.87, {})
    assert rule["pooled_flags"]["meets_targets"]
    assert [rule["per_structure"][name]["review_below"] for name in ("first", "second")] == [0.87, 0.80]


def test_the_rule_goes_per_structure_where_the_pooled_threshold_flags_too_many_good_ones():
    # the first structure's poor ones need 0.90, which flags the second's 30 good ones predicted 0.87 (50 %);
    # 0.90 for the first and 0.80 for the second catch all 20 and flag none
    rule = choose_review_rule(*_two_structures(0.89, 0.97, 0.87), ["first", "second"], FIVE_FOLDS)
    assert rule["review_below"] == 0.90 and not rule["pooled_flags"]["meets_targets"]
    assert (rule["pooled_flags"]["poor_flagged"], rule["pooled_flags"]["good_flagged"]) == (20, 30)
    assert rule["by_structure"] and rule["review_below_by_structure"] == {"first": 0.90, "second": 0.80}
    assert (rule["per_structure_flags"]["poor_flagged"], rule["per_structure_flags"]["good_flagged"]) == (20, 0)


def test_the_rule_stays_pooled_where_per_structure_thresholds_miss_a_target_too():
    # the first structure's poor (0.89) and good (0.895) ones cannot be told apart by any threshold
    rule = choose_review_rule(*_two_structures(0.89, 0.895, 0.87), ["first", "second"], FIVE_FOLDS)
    assert not rule["pooled_flags"]["meets_targets"] and not rule["per_structure_flags"]["meets_targets"]
    assert (rule["by_structure"], rule["review_below"], rule["review_below_by_structure"]) == (False, 0.90, {})


def test_per_structure_thresholds_placed_on_a_few_poor_cases_are_refused_when_they_fail_on_other_folds():
    """The first structure's 5 poor volumes (predicted 0.70) sit one in each of 5 folds, its 45 good ones are
    predicted 0.87; the second's only 2 poor volumes are predicted 0.89 (fold 0) and 0.84 (fold 1). Counted on all
    50 volumes, one threshold must reach 0.90 for 7 of 7 poor ones and so flags all 45 good ones of the first, while
    0.80 and 0.90 per structure catch all 7 and flag none: the per-structure thresholds seem to win. Chosen without
    fold 0, the second's threshold is 0.85 and misses its 0.89: nested they catch 6 of 7 (86 %), below the target,
    so the pooled threshold stays."""
    first = np.array([0.70] * 5 + [0.87] * 45)
    second = np.full(50, 0.97)
    second[[5, 6]] = 0.89, 0.84
    predicted = np.column_stack([first, second])
    measured = np.full((50, 2), 0.95)
    measured[:5, 0] = measured[[5, 6], 1] = 0.60
    folds = np.arange(50) % 5
    rule = choose_review_rule(predicted, measured, ["first", "second"], folds)
    assert [rule["per_structure"][name]["review_below"] for name in ("first", "second")] == [0.80, 0.90]
    assert rule["pooled"]["review_below"] == 0.90 and rule["pooled"]["good_flagged"] == 45
    in_sample = {name: row["recall"] for name, row in rule["per_structure"].items()}
    assert in_sample == {"first": 1.0, "second": 1.0}
    assert (rule["per_structure_flags"]["poor_flagged"], rule["per_structure_flags"]["poor"]) == (6, 7)
    assert not rule["per_structure_flags"]["meets_targets"]
    assert (rule["by_structure"], rule["review_below"], rule["review_below_by_structure"]) == (False, 0.90, {})


def test_nested_thresholds_are_chosen_on_the_other_folds_only():
    """Each volume's thresholds are those chosen without its fold: a fold whose volumes alone hold a low-predicted
    poor structure gets the threshold the others choose, as computed by hand."""
    predicted = np.array([[0.70], [0.97], [0.86], [0.97], [0.97], [0.97]])
    measured = np.array([[0.60], [0.95], [0.60], [0.95], [0.95], [0.95]])
    folds = fold_numbers(["a", "a", "b", "b", "c", "c"], [["c"], ["a"], ["b"]])
    assert folds.tolist() == [1, 1, 2, 2, 0, 0]
    thresholds = nested_thresholds(predicted, measured, folds, lambda inner, reference, _: pooled_thresholds(
        inner, reference))
    # without a: the poor 0.86 needs 0.87; without b: the poor 0.70 needs 0.80; without c: both, so 0.87
    assert thresholds[:, 0].tolist() == [0.87, 0.87, 0.80, 0.80, 0.87, 0.87]


@pytest.mark.parametrize("patients, folds, pattern", [
    (["a", "b"], [["a"], ["b", "a"]], "Patient a is in folds 0 and 1"),
    (["a", "z"], [["a"], ["b"]], "Patient z is in no cross-validation fold"),
])
def test_folds_that_cannot_judge_the_rule_are_refused_in_one_sentence(patients, folds, pattern):
    with pytest.raises(ValueError, match=pattern):
        fold_numbers(patients, folds)
    with pytest.raises(ValueError, match="come from one fold"):
        nested_thresholds(np.zeros((2, 1)), np.zeros((2, 1)), np.zeros(2), lambda *_: np.zeros(1))
