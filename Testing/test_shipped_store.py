"""The shipped models' store (``store/``, the predictions ``calibseg-store`` made of their out-of-fold, test and
degraded volumes): every section fitted from it is the one its bundle ships, and the metrics re-recorded from it are
the recorded ones, so a change to a fit shows its own effect on every shipped model and nothing else."""

from __future__ import annotations

import json
import shutil

import pytest

from CalibSegLib.bundle import read_metadata
from CalibSegLib.interval_rule import DICE_SCALES, IntervalRule
from CalibSegLib.pretrained import PRETRAINED_DIR
from Reporting.ship import rerecord
from Training.fit import largest_difference, refit

SHIPPED = ("acdc_crac", "acdc_nacl", "acdc_ce_dice")
# The function rules of acdc_crac and acdc_nacl were fitted before the store, from a collection of the same
# predictions whose volumes differ in their last float digits.
FUNCTION_RULE_DIGITS = 1e-8


@pytest.fixture(scope="module")
def store(repo_root):
    return repo_root / "store"


@pytest.mark.parametrize("name", SHIPPED)
def test_every_fit_from_the_shipped_store_is_the_shipped_section(name, store):
    metadata = read_metadata(PRETRAINED_DIR / f"{name}.calibseg")
    rule = IntervalRule.from_dict(metadata.function_intervals)
    _, fitted, _ = refit(name, store, ["quality_model", "function_intervals"],
                         predicted_dice=rule.scale in DICE_SCALES)
    assert largest_difference(metadata.quality.to_dict(), fitted["quality_model"]) == 0.0
    assert largest_difference(metadata.function_intervals, fitted["function_intervals"]) <= FUNCTION_RULE_DIGITS


@pytest.mark.parametrize("name", SHIPPED)
def test_the_metrics_re_recorded_from_the_shipped_store_are_the_recorded_ones(name, store, tmp_path):
    for suffix in (".calibseg", ".metrics.json"):
        shutil.copy(PRETRAINED_DIR / f"{name}{suffix}", tmp_path)
    _, metrics_path = rerecord(name, out_dir=tmp_path, store=store)
    recorded = json.loads((PRETRAINED_DIR / f"{name}.metrics.json").read_text())
    measured = json.loads(metrics_path.read_text())
    assert measured.keys() == recorded.keys()
    for key in ("summary", "per_case", "quality"):
        assert largest_difference(recorded[key], measured[key]) == 0.0, key
