"""studies/function_review_mark.py's summary: the marked shares and their intervals, from rows made by hand."""

from __future__ import annotations

import pytest
from scipy import stats

from studies.function_review_mark import summarise


def _row(part: str, patient: str, error: float | None, review: bool, flags: bool, refused: bool = False) -> dict:
    return {"part": part, "patient": patient, "group": "HCM" if patient < "patient041" else "NOR", "error": error,
            "review": ["LV at ES"] if review else [], "flags": ["rv_es"] if flags else [],
            "refused": "a sentence" if refused else None}


def test_marks_count_the_review_list_or_any_flag_and_a_refusal_as_marked():
    rows = [_row("out_of_fold", "patient021", -12.0, True, True), _row("out_of_fold", "patient022", 9.0, False, True),
            _row("out_of_fold", "patient023", None, False, False, refused=True),  # refused: marked, off by infinity
            _row("out_of_fold", "patient061", 1.0, False, True), _row("out_of_fold", "patient062", -2.5, False, False),
            _row("out_of_fold", "patient063", 5.0, True, True), _row("test", "patient064", 0.5, False, False)]
    summary = summarise(rows)
    review, flags = summary["out_of_fold"]["review_list"]["all"], summary["out_of_fold"]["any_flagged_volume"]["all"]
    assert (review["off_marked"]["marked"], review["off_marked"]["of"]) == (2, 3)  # -12 marked, 9 not, refused
    assert (flags["off_marked"]["marked"], flags["within_marked"]["marked"], flags["within_marked"]["of"]) == (3, 1, 2)
    assert review["lv_ef_mae"] == pytest.approx((12 + 9 + 1 + 2.5 + 5) / 5)
    exact = stats.binomtest(2, 3).proportion_ci(method="exact")
    assert review["off_marked"]["interval"] == pytest.approx([exact.low, exact.high])
    assert summary["out_of_fold"]["review_list"]["groups"]["HCM"]["off_marked"]["of"] == 3
    assert summary["test"]["review_list"]["all"]["within_marked"] == {"marked": 0, "of": 1, "share": 0.0,
                                                                       "interval": [0.0, pytest.approx(0.975)]}
