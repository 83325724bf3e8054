"""The interval rule (CalibSegLib.cardiac.intervals): the conformal quantile, coverage on exchangeable synthetic
patients, the scale's propagation, and the rule stored in a bundle."""

from __future__ import annotations

import math

import numpy as np
import pytest

from CalibSegLib.bundle import BundleError
from CalibSegLib.cardiac.indices import PhaseVolumes, StructureVolume
from CalibSegLib.cardiac.intervals import (BANDS, case_indices, conformal_quantile, fit_rule, index_scales,
                                           index_values, rule_indices)
from CalibSegLib.interval_rule import INDICES, SCALES, IntervalRule, IntervalRuleError
from cardiac_standins import cardiac_metadata


def test_the_quantile_is_the_ceil_n_plus_one_level_th_smallest_score():
    scores = [5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 8.0, 7.0, 6.0]
    assert conformal_quantile(scores, 0.9) == 9.0  # rank ceil(10 * 0.9) = 9 of 9
    assert conformal_quantile(scores, 0.5) == 5.0  # rank 5
    assert conformal_quantile(scores[:8], 0.9) == math.inf  # rank 9 of 8: no finite interval keeps the promise
    assert conformal_quantile([1.0, math.nan, 2.0], 0.5) == 2.0  # NaN scores (undefined EF) are left out


def _phase(lv: float, rv: float, myocardium: float, band: float) -> PhaseVolumes:
    return PhaseVolumes(*(StructureVolume(hard=value, soft=value, spread=band) for value in (lv, rv, myocardium)))


def _patient(rng: np.random.Generator) -> tuple[tuple[PhaseVolumes, PhaseVolumes], dict[str, float]]:
    """A synthetic patient: its predicted phases and a reference EF whose error grows with the predicted band."""
    band_ed, band_es = rng.uniform(1.0, 12.0, size=2)
    ed, es = _phase(150.0, 160.0, 100.0, band_ed), _phase(60.0, 80.0, 105.0, band_es)
    values, scales = case_indices(ed, es, "hard", "spread")
    reference = {index: values[index] + scales[index] * rng.standard_t(4) for index in INDICES}
    return (ed, es), reference


@pytest.mark.parametrize("scale", ["spread", "constant"])
def test_coverage_holds_on_exchangeable_patients(scale):
    """Fitted on 40 patients, the rule covers new patients drawn alike with probability >= 0.9 (and, scores being
    continuous, <= 0.9 + 1/41): averaged over 400 fits of 40 new patients each."""
    rng = np.random.default_rng(7)
    covered = []
    for _ in range(400):
        calibration = [_patient(rng) for _ in range(40)]
        rule = fit_rule([phases for phases, _ in calibration], [reference for _, reference in calibration],
                        "hard", scale)
        for phases, reference in (_patient(rng) for _ in range(40)):
            values, scales = case_indices(*phases, "hard", scale)
            low, high = rule.interval("lv_ef_percent", values["lv_ef_percent"], scales["lv_ef_percent"])
            covered.append(low <= reference["lv_ef_percent"] <= high)
    # 16,000 draws: the binomial standard error is 0.0024, the fits' own spread somewhat more
    assert 0.9 - 0.01 <= np.mean(covered) <= 0.9 + 1 / 41 + 0.01


def test_the_scaled_rule_is_narrow_where_the_band_is():
    """On the same data the spread-scaled intervals are narrower for sure cases than for unsure ones (the point of
    a per-case scale); the constant rule's are all alike."""
    rng = np.random.default_rng(3)
    calibration = [_patient(rng) for _ in range(60)]
    phases, references = [item[0] for item in calibration], [item[1] for item in calibration]
    widths = {}
    for scale in ("spread", "constant"):
        rule = fit_rule(phases, references, "hard", scale)
        widths[scale] = [np.subtract(*reversed(rule.interval("lv_ef_percent", *(
            part["lv_ef_percent"] for part in case_indices(_phase(150.0, 160.0, 100.0, band),
                                                           _phase(60.0, 80.0, 105.0, band), "hard", scale)))))
            for band in (1.0, 12.0)]
    assert widths["spread"][0] < widths["spread"][1] / 5
    assert widths["constant"][0] == pytest.approx(widths["constant"][1])


def test_the_ef_scale_propagates_both_bands():
    ed, es = _phase(150.0, 160.0, 100.0, 3.0), _phase(60.0, 80.0, 105.0, 2.0)
    scales = index_scales(ed, es, "hard", "spread")
    # EF = 100 (EDV - ESV) / EDV: |dEF/dEDV| = 100 ESV / EDV², |dEF/dESV| = 100 / EDV
    assert scales["lv_ef_percent"] == pytest.approx(100.0 * 60.0 * 3.0 / 150.0 ** 2 + 100.0 * 2.0 / 150.0)
    assert scales["lv_sv_ml"] == pytest.approx(5.0)
    assert scales["myocardium_mass_g"] == pytest.approx(1.05 * 3.0)


def test_a_rule_round_trips_and_a_malformed_one_is_refused():
    rule = IntervalRule("soft", "spread", dict.fromkeys(INDICES, 1.5), 0.9, {"patients": 65})
    assert IntervalRule.from_dict(rule.to_dict()) == rule
    broken = {**rule.to_dict(), "quantiles": {"lv_ef_percent": 1.0}}
    with pytest.raises(IntervalRuleError, match="quantiles must give each of lv_edv_ml"):
        IntervalRule.from_dict(broken)
    with pytest.raises(IntervalRuleError, match="estimate must be one of hard, soft"):
        IntervalRule.from_dict({**rule.to_dict(), "estimate": "mean"})


def test_a_bundle_with_a_malformed_rule_is_one_sentence():
    metadata = cardiac_metadata(function_intervals={"estimate": "hard", "scale": "spread", "level": 1.5,
                                                    "quantiles": {}})
    with pytest.raises(BundleError, match=r"^The bundle's function_intervals are malformed \(its level must be"):
        metadata.validate()


def test_recalibration_recovers_a_bias_and_keeps_coverage():
    """Estimates that draw ED volumes 5 % and ES volumes 35 % too large, plus 5 mL (as a network that takes in the
    base at ES): the fitted lines undo it (ES slope 1/1.35), the recalibrated EF error falls, and the jackknife+
    quantile still covers new patients about 90 % of the time."""
    rng = np.random.default_rng(11)

    def patient() -> tuple[tuple[PhaseVolumes, PhaseVolumes], dict[str, float]]:
        truth = {"ed": (rng.uniform(120, 220), rng.uniform(120, 220), rng.uniform(80, 140)),
                 "es": (rng.uniform(40, 100), rng.uniform(50, 110), 100.0)}
        factor = {"ed": 1.05, "es": 1.35}
        drawn = {phase: _phase(*(factor[phase] * value + 5.0 + rng.normal(0, 3) for value in values), 3.0)
                 for phase, values in truth.items()}
        reference = index_values(dict(zip(("lv", "rv", "myocardium"), truth["ed"])),
                                 dict(zip(("lv", "rv", "myocardium"), truth["es"])))
        return (drawn["ed"], drawn["es"]), reference

    calibration = [patient() for _ in range(60)]
    rule = fit_rule([item[0] for item in calibration], [item[1] for item in calibration], "hard", "spread",
                    recalibrate=True)
    assert rule.recalibration["rv_es"][1] == pytest.approx(1 / 1.35, abs=0.03)
    assert IntervalRule.from_dict(rule.to_dict()) == rule
    plain = fit_rule([item[0] for item in calibration], [item[1] for item in calibration], "hard", "spread")
    errors = {"recalibrated": [], "plain": []}
    covered = []
    for phases, reference in (patient() for _ in range(400)):
        for name, fitted in (("recalibrated", rule), ("plain", plain)):
            values, scales = rule_indices(fitted, *phases)
            errors[name].append(abs(values["rv_ef_percent"] - reference["rv_ef_percent"]))
        values, scales = rule_indices(rule, *phases)
        low, high = rule.interval("lv_edv_ml", values["lv_edv_ml"], scales["lv_edv_ml"])
        covered.append(low <= reference["lv_edv_ml"] <= high)
    assert np.mean(errors["recalibrated"]) < 0.7 * np.mean(errors["plain"])
    assert 0.85 <= np.mean(covered) <= 0.97


def _dice_phase(lv: float, rv: float, myocardium: float, spread: float, dice: float) -> PhaseVolumes:
    return PhaseVolumes(*(StructureVolume(hard=value, soft=value, spread=spread, predicted_dice=dice)
                          for value in (lv, rv, myocardium)))


def test_the_dice_scales_propagate_the_quality_models_bands():
    """The predicted-Dice band (1 − D̂) × V, alone, summed with the spread band or their geometric mean, carried to
    EDV, SV and EF as the spread band is; a recalibration line of slope s widens it by |s|."""
    ed, es = _dice_phase(150.0, 160.0, 100.0, 3.0, 0.9), _dice_phase(60.0, 80.0, 105.0, 2.0, 0.8)
    dice_ed, dice_es = 0.1 * 150.0, 0.2 * 60.0  # (1 − D̂) × the LV's label volume at ED and ES
    expected_band = {"dice": (dice_ed, dice_es), "spread_dice_sum": (3.0 + dice_ed, 2.0 + dice_es),
                     "spread_dice_geometric": (math.sqrt(3.0 * dice_ed), math.sqrt(2.0 * dice_es))}
    for scale, (band_ed, band_es) in expected_band.items():
        scales = index_scales(ed, es, "hard", scale)
        assert scales["lv_edv_ml"] == pytest.approx(band_ed)
        assert scales["lv_sv_ml"] == pytest.approx(band_ed + band_es)
        assert scales["lv_ef_percent"] == pytest.approx(100.0 * 60.0 * band_ed / 150.0 ** 2 + 100.0 * band_es / 150.0)
    lines = {key: (-4.0, 1.5) for key in ("lv_ed", "lv_es", "rv_ed", "rv_es", "myocardium_ed")}
    _, recalibrated = case_indices(ed, es, "hard", "dice", lines)
    assert recalibrated["lv_edv_ml"] == pytest.approx(1.5 * dice_ed)
    without = PhaseVolumes(*(StructureVolume(hard=10.0, soft=10.0, spread=1.0) for _ in range(3)))
    assert math.isnan(index_scales(without, without, "hard", "dice")["lv_edv_ml"])  # no predicted Dice: no scale
    rule = IntervalRule("hard", "spread_dice_geometric", dict.fromkeys(INDICES, 1.0))
    assert rule.needs_predicted_dice and IntervalRule.from_dict(rule.to_dict()) == rule
    assert not IntervalRule("hard", "spread", dict.fromkeys(INDICES, 1.0)).needs_predicted_dice


def test_the_stored_rules_scales_are_the_bands_and_the_constant():
    """The stored schema names the scales a rule may read (:mod:`CalibSegLib.interval_rule`, which imports no
    application): each one but ``constant`` is a band the application computes."""
    assert SCALES == (*BANDS, "constant")
