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
