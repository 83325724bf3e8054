"""The nested leave-one-patient-out comparison of quality-model procedures (Training/quality_choice.py)."""

from __future__ import annotations

import numpy as np
import pytest

from CalibSegLib.quality import FEATURES_WITHOUT_MIRRORING as SEVEN, QualityModelError, fit_from_observations
from Training.quality_choice import CLEAN, Observation, Procedure, choice_table, nested_held_out

NAMES = ["background", "class 1"]
ALL = Procedure("all", SEVEN, (CLEAN,))
WITHOUT = Procedure("without", tuple(name for name in SEVEN if name != "expected_dice"), (CLEAN,))
WITH_NOISE = Procedure("with noise", SEVEN, (CLEAN, "noise"))


def _observations(patients=6, seed=0) -> list[Observation]:
    """Two clean volumes per patient whose Dice is the expected Dice exactly (other features noise), and a
    'noise' copy of each whose Dice ignores every feature."""
    rng = np.random.default_rng(seed)
    observations = []
    for patient in range(patients):
        for _ in range(2):
            values = {name: float(rng.uniform(0.05, 0.5)) for name in SEVEN}
            values["expected_dice"] = float(rng.uniform(0.6, 0.95))
            observations.append(Observation(CLEAN, f"p{patient}", [values], np.array([values["expected_dice"]])))
            observations.append(Observation("noise", f"p{patient}", [dict(values)], np.array([rng.uniform(0, 1)])))
    return observations


def test_each_patient_is_predicted_by_a_fit_on_the_others_only():
    observations = _observations()
    predicted, measured, chosen = nested_held_out(observations, NAMES, WITH_NOISE)["class 1"]
    clean = [item for item in observations if item.variant == CLEAN]
    by_hand = []
    for patient in sorted({item.patient for item in clean}):
        others = [item for item in observations if item.patient != patient]
        model = fit_from_observations([item.features for item in others], np.array([item.dice for item in others]),
                                      NAMES, [item.patient for item in others]).structures["class 1"]
        by_hand += [model.predict(item.features[0]) for item in clean if item.patient == patient]
    np.testing.assert_allclose(predicted, by_hand)
    np.testing.assert_array_equal(measured, [item.dice[0] for item in sorted(clean, key=lambda item: item.patient)])
    assert sum(chosen.values()) == len(clean)  # only clean volumes are scored


def test_the_informative_feature_wins_only_where_it_is_a_candidate():
    observations = _observations()
    predicted, measured, chosen = nested_held_out(observations, NAMES, ALL)["class 1"]
    assert chosen == {"expected_dice": 12} and np.abs(predicted - measured).max() < 1e-9
    predicted, measured, chosen = nested_held_out(observations, NAMES, WITHOUT)["class 1"]
    assert "expected_dice" not in chosen and np.abs(predicted - measured).mean() > 0.02
    table = choice_table(observations, NAMES, (ALL, WITHOUT))
    assert "| all | class 1 | +1.000 | 0.0000 | expected_dice (12 of 12) |" in table


def test_unknown_candidate_features_are_refused():
    with pytest.raises(QualityModelError, match="Candidate features must be some of"):
        nested_held_out(_observations(), NAMES, Procedure("bad", ("volume",), (CLEAN,)))


def test_command_compares_procedures_on_the_validation_patients(tmp_path, sample_acdc_dir, capsys):
    from test_quality import _shipped_copy
    from Training import quality_choice

    path, _ = _shipped_copy(tmp_path, sample_acdc_dir, val=["patient013", "patient016", "patient022"])
    assert quality_choice.main(["--bundle", str(path), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "nested leave-one-patient-out on 6 validation volumes of 3 patients" in printed
    for procedure in ("all features (shipped)", "without expected_dice, + degraded copies"):
        assert f"| {procedure} | myocardium |" in printed and f"| {procedure} | mean |" in printed
    path, _ = _shipped_copy(tmp_path, sample_acdc_dir, val=[])
    with pytest.raises(SystemExit, match=r"^error: .*shipped.calibseg records no validation patients"):
        quality_choice.main(["--bundle", str(path), "--device", "cpu"])
