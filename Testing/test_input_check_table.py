"""scripts/input_check_table.py's record: one table row per kind in the split's order with the kinds still to measure
named, a record of other weights refused in one sentence, and docs/input_check.md's block copied from the record."""

from __future__ import annotations

import math
import re

import pytest

from CalibSegLib.io import write_json_atomic
from Reporting import readme_tables
from scripts.input_check_table import Outcome, input_kinds, make_record, read_record, table

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
    assert re.search(r"`python -m scripts\.input_check_table --bundle acdc_crac --split test --record \.\.\.`: 5 "
                     r"inputs, feature threshold 39\.5, 60 min on \d+ CPU cores, recorded \d{4}-\d\d-\d\d\.", new)
