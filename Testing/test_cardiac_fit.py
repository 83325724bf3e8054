"""The interval rule's fit and measurement (Evaluation.function_intervals) on synthetic collected records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from CalibSegLib.cardiac.intervals import INDICES, IntervalRule
from Evaluation.function_intervals import fit_and_measure, markdown_table, patient_volumes, read_collected

STRUCTURES = ("lv", "rv", "myocardium")


def _phase(rng: np.random.Generator, volumes: dict[str, float], band: float) -> dict[str, dict[str, float]]:
    """A predicted phase: hard volumes off the reference by a band-sized error, soft ones nearer."""
    return {name: {"hard": volumes[name] + band * rng.normal(), "soft": volumes[name] + 0.5 * band * rng.normal(),
                   "spread": band} for name in STRUCTURES}


def _records(rng: np.random.Generator, side: str, patients: int, members: int) -> list[dict]:
    records = []
    for number in range(patients):
        patient = f"{side}{number:03d}"
        reference = {"ed": {"lv": rng.uniform(120, 200), "rv": rng.uniform(120, 200), "myocardium": 100.0},
                     "es": {"lv": rng.uniform(40, 90), "rv": rng.uniform(50, 100), "myocardium": 110.0}}
        for frame, phase in ((1, "ed"), (12, "es")):
            band = rng.uniform(1, 6)
            record = {"case": f"{patient}_frame{frame:02d}", "patient": patient, "side": side,
                      "weights_sha256": "abc", "reference": reference[phase],
                      "members": {str(index): _phase(rng, reference[phase], band)
                                  for index in (range(members) if side == "test" else [number % 5])}}
            if side == "test":
                record["ensemble"] = _phase(rng, reference[phase], band / 2)
            records.append(record)
    return records


def test_fit_chooses_on_out_of_fold_patients_and_measures_the_test_ones(tmp_path):
    rng = np.random.default_rng(0)
    records = _records(rng, "oof", 40, 1) + _records(rng, "test", 8, 5)
    for record in records + [{**records[0], "case": "stale_frame01", "weights_sha256": "other"}]:
        (tmp_path / f"{record['side']}_{record['case']}.json").write_text(json.dumps(record))
    collected = read_collected(tmp_path, "abc")
    assert len(collected) == len(records)  # the other weights' record is not read
    assert len(patient_volumes(collected, "oof")) == 40
    rule, measured = fit_and_measure(collected)
    assert isinstance(rule, IntervalRule) and set(rule.quantiles) == set(INDICES)
    assert rule.fitted_on["patients"] == 40
    candidates = measured["out_of_fold"]["leave_one_out"]
    assert set(candidates) == {f"{estimate}/{scale}/{recalibration}" for estimate in ("hard", "soft")
                               for scale in ("spread", "constant") for recalibration in ("none", "linear")}
    widths = {name: entry["lv_ef_percent"]["median_width"]["value"] + entry["rv_ef_percent"]["median_width"]["value"]
              for name, entry in candidates.items()}
    recalibration = "none" if rule.recalibration is None else "linear"
    assert measured["out_of_fold"]["chosen"] == min(widths, key=widths.get) == \
        f"{rule.estimate}/{rule.scale}/{recalibration}"
    # soft volumes are the nearer ones here, so the leave-one-out choice must find them
    assert rule.estimate == "soft"
    methods = measured["test"]["methods"]
    assert len(methods) in (4, 5) and "members' min-max" in methods
    for summary in methods.values():
        assert 0.0 <= summary["lv_ef_percent"]["coverage"]["value"] <= 1.0
        assert summary["lv_ef_percent"]["coverage"]["low"] <= summary["lv_ef_percent"]["coverage"]["value"]
    assert measured["test"]["patients"] == [f"test{number:03d}" for number in range(8)]


def test_too_few_patients_is_one_sentence():
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match="^Only 6 out-of-fold patients are collected; a 90 % rule needs at least 10"):
        fit_and_measure(_records(rng, "oof", 6, 1))


def test_the_documented_table_is_the_recorded_one(repo_root):
    """docs/function.md and docs/results.md show the test table the committed record holds, digit for digit."""
    record = json.loads((repo_root / "docs" / "records" / "function" / "acdc_ce_dice.json").read_text())
    table = "\n".join(markdown_table(record))
    assert table in (repo_root / "docs" / "function.md").read_text()
    results = (repo_root / "docs" / "results.md").read_text()
    lines = markdown_table(record)
    assert all(line in results for line in (lines[0], lines[2], lines[-1]))  # the header, the rule, the min-max
