"""studies/function_groups.py: the interval rule's rows grouped by ACDC group, each group's summary against the
mean of its own rows, and the tables it prints."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from studies.function_groups import group_rows, group_summary, markdown_table


def _row(error: float, covered: bool, width: float) -> dict:
    return {index: {"error": error, "covered": float(covered), "width": width}
            for index in ("lv_ef_percent", "rv_ef_percent", "lv_edv_ml")}


def test_each_group_is_summarised_on_its_own_patients():
    rng = np.random.default_rng(0)
    numbers = [3, 7, 12, 25, 30, 33, 44, 90, 95]  # DCM ×3, HCM ×3, MINF ×1, RV ×2
    patients = [SimpleNamespace(patient=f"patient{number:03d}") for number in numbers]
    rows = [_row(rng.uniform(0, 10), bool(rng.integers(2)), rng.uniform(5, 20)) for _ in numbers]
    grouped = group_rows(patients, rows)
    assert {name: len(items) for name, items in grouped.items()} == {"all": 9, "DCM": 3, "HCM": 3, "MINF": 1, "RV": 2}
    summary = group_summary(grouped)
    assert list(summary) == ["all", "DCM", "HCM", "MINF", "RV"]
    hypertrophy = rows[3:6]
    assert summary["HCM"]["lv_ef_percent"]["mae"]["value"] == pytest.approx(
        np.mean([row["lv_ef_percent"]["error"] for row in hypertrophy]))
    assert summary["HCM"]["lv_ef_percent"]["coverage"]["value"] == pytest.approx(
        np.mean([row["lv_ef_percent"]["covered"] for row in hypertrophy]))
    assert summary["RV"]["lv_ef_percent"]["median_width"]["value"] == pytest.approx(
        np.median([row["lv_ef_percent"]["width"] for row in rows[7:]]))
    table = markdown_table(summary, "out_of_fold")
    assert len(table) == 2 + 5 and table[3].startswith("| DCM | 3 | ")


def test_the_documented_group_tables_are_the_recorded_ones(repo_root):
    page = (repo_root / "docs" / "function.md").read_text()
    records = sorted((repo_root / "docs" / "records" / "function_groups").glob("*.json"))
    assert records
    for path in records:
        record = json.loads(path.read_text())
        for part in ("out_of_fold", "test"):
            assert "\n".join(markdown_table(record[part], part)) in page


def _patient(error: float, width: float, lv_flagged: bool) -> dict:
    return {"error": error, "width": width, "lv_flagged": lv_flagged}


def test_the_width_limit_is_the_widest_that_marks_nine_in_ten_of_the_patients_off():
    from studies.function_review import mark_summary, wide_limit

    off = [_patient(12.0, 20.0, True), *(_patient(-9.5, width, False) for width in (18.0, 16.0, 14.0, 12.0))]
    within = [_patient(1.0, width, False) for width in (10.0, 13.0, 15.0, 17.0)]
    rows = off + within
    # the flag marks 1 of 5; widths ≥ 12 mark the other four, so 12 is the widest limit reaching 90 %
    assert wide_limit(rows) == 12.0
    assert wide_limit(within) == float("inf")  # no patient off: no limit needed
    assert wide_limit([_patient(10.0, 5.0, True)]) == float("inf")  # the flag alone marks them
    for row in rows:
        row["marked"] = row["lv_flagged"] or row["width"] >= 15.0
    summary = mark_summary(rows, "marked")
    assert (summary["off_marked"]["marked"], summary["off_marked"]["of"]) == (3, 5)
    assert (summary["within_marked"]["marked"], summary["within_marked"]["of"]) == (2, 4)
    low, high = summary["off_marked"]["interval"]
    assert low < 0.6 < high
