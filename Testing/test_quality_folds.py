"""Choosing the quality model on out-of-fold patients (Training/quality_folds.py) and fixed choices in the fit."""

from __future__ import annotations

import dataclasses
import zipfile
from collections import Counter
from typing import Callable

import numpy as np
import pytest

from CalibSegLib.quality import (FEATURES, FEATURES_WITHOUT_MIRRORING, FEATURES_WITHOUT_SIZE, MIRROR_AGREEMENT,
                                 QualityModelError)
from Datasets.cases import DataError
from Training.quality_choice import CLEAN, Observation, fit_on
from Training.quality_folds import FOLD_PROCEDURES, fold_held_out, fold_table, match_folds

NAMES = ["background", "class 1"]


Generators = tuple[np.random.Generator, np.random.Generator, np.random.Generator]


def _generators(seed: int) -> Generators:
    """One generator for the six features and the Dice, one for the size, one for the mirrored passes' agreement:
    adding a feature left the others' draws, and so what these tests measure, as they were."""
    return np.random.default_rng(seed), np.random.default_rng(seed + 1000), np.random.default_rng(seed + 2000)


def _draw(generators: Generators, value: Callable[[np.random.Generator, str], float]) -> dict[str, float]:
    """Every feature's ``value(generator, name)``, the size's and the agreement's from their own generators."""
    rng, size_rng, agreement_rng = generators
    own = {"log_volume_ml": size_rng, MIRROR_AGREEMENT: agreement_rng}
    return {name: value(own.get(name, rng), name) for name in FEATURES}


def _fold(prefix: str, patients: int, informative: str, generators: Generators,
          noise: float = 0.01) -> list[Observation]:
    """Two volumes per patient whose Dice follows ``informative`` (1 − the feature for decreasing ones) plus
    normal noise of sd ``noise``; the other features are noise."""
    observations = []
    for patient in range(patients):
        for _ in range(2):
            values = _draw(generators, lambda rng, _: float(rng.uniform(0.05, 0.5)))
            signal = values[informative] if FEATURES[informative] > 0 else 1.0 - values[informative]
            observations.append(Observation(CLEAN, f"{prefix}{patient}", [values],
                                            np.array([signal + generators[0].normal(0, noise)])))
    return observations


def _folds(seed=0) -> dict[str, list[Observation]]:
    generators = _generators(seed)
    return {f"fold{k}": _fold(f"f{k}p", 4, "mean_entropy", generators) for k in range(3)}


def _averaged_by_hand(own: list[Observation], others: list[Observation], names: list[str],
                      features: tuple[str, ...]) -> list[float]:
    """Each patient's volumes of ``own``, in patient order, predicted by the average of ``features`` fitted on
    ``others`` and ``own``'s other patients: what a pooled averaging procedure (``others`` empty: an own-fold one)
    should give."""
    predictions = []
    for patient in sorted({item.patient for item in own}):
        model = fit_on([*others, *(item for item in own if item.patient != patient)], names, averaged=True,
                       candidates=features).structures[names[1]]
        assert model.inputs == features
        predictions += [model.predict(item.features[0]) for item in own if item.patient == patient]
    return predictions


def test_a_fixed_choice_is_fitted_without_choosing_and_bad_ones_are_refused():
    observations = _folds()["fold0"]
    chosen = fit_on(observations, NAMES).structures["class 1"]
    assert (chosen.feature, chosen.form) == ("mean_entropy", "linear")
    fixed = fit_on(observations, NAMES, fixed={"class 1": ("mean_confidence", "isotonic")}).structures["class 1"]
    assert (fixed.feature, fixed.form) == ("mean_confidence", "isotonic") and fixed.loo_mae > chosen.loo_mae
    for bad in ({"class 2": ("mean_entropy", "linear")}, {"class 1": ("volume", "linear")},
                {"class 1": ("mean_entropy", "cubic")}):
        with pytest.raises(QualityModelError, match="^Fixed choices must name a structure"):
            fit_on(observations, NAMES, fixed=bad)


def test_procedure_b_chooses_on_the_other_folds_and_fits_on_the_same_fold_without_the_patient():
    folds = _folds()
    per_fold = fold_held_out(folds, NAMES, FOLD_PROCEDURES["B"][1])["class 1"]
    for (name, own), (predicted, measured, chosen) in zip(folds.items(), per_fold, strict=True):
        others = [item for other, items in folds.items() if other != name for item in items]
        choice = fit_on(others, NAMES).structures["class 1"]
        by_hand = []
        for patient in sorted({item.patient for item in own}):
            model = fit_on([item for item in own if item.patient != patient], NAMES,
                           fixed={"class 1": (choice.feature, choice.form)}).structures["class 1"]
            by_hand += [model.predict(item.features[0]) for item in own if item.patient == patient]
        np.testing.assert_allclose(predicted, by_hand)
        assert chosen == {choice.feature: len(own)}


@pytest.mark.parametrize("procedure, features, pooled", [
    ("D", tuple(name for name in FEATURES_WITHOUT_SIZE if name != "boundary_low_confidence_ratio"), True),
    ("E", FEATURES_WITHOUT_SIZE, True),
    ("G", FEATURES_WITHOUT_SIZE, False),
    ("I", FEATURES_WITHOUT_MIRRORING, True),
    ("K", FEATURES_WITHOUT_MIRRORING, False)])
def test_procedures_d_e_g_i_and_k_average_their_features_fitted_without_the_patient(procedure, features, pooled):
    """D, E and I fit on the other folds and the same fold's others; G and K on the same fold's others alone;
    I and K average the size too."""
    folds = _folds(seed=1)
    per_fold = fold_held_out(folds, NAMES, FOLD_PROCEDURES[procedure][1])["class 1"]
    for (name, own), (predicted, _, chosen) in zip(folds.items(), per_fold, strict=True):
        others = [item for other, items in folds.items() if other != name and pooled for item in items]
        np.testing.assert_allclose(predicted, _averaged_by_hand(own, others, NAMES, features))
        assert chosen == {"features, averaged": len(own)}


def test_a_second_set_of_fold_networks_joins_the_other_folds_without_the_held_out_patients():
    """--also-folds: the same patients predicted by other networks; a fold's own patients stay out of both sets."""
    folds = _folds(seed=3)
    second = [Observation(CLEAN, item.patient, [{name: value + 0.01 for name, value in item.features[0].items()}],
                          item.dice - 0.02) for items in _folds(seed=4).values() for item in items]
    per_fold = fold_held_out(folds, NAMES, FOLD_PROCEDURES["E"][1], extra=second)["class 1"]
    without = fold_held_out(folds, NAMES, FOLD_PROCEDURES["E"][1])["class 1"]
    for (name, own), (predicted, _, _), (alone, _, _) in zip(folds.items(), per_fold, without, strict=True):
        held = {item.patient for item in own}
        others = [*(item for other, items in folds.items() if other != name for item in items),
                  *(item for item in second if item.patient not in held)]
        assert len(others) == 2 * sum(len(items) for other, items in folds.items() if other != name)
        np.testing.assert_allclose(predicted, _averaged_by_hand(own, others, NAMES, FEATURES_WITHOUT_SIZE))
        assert not np.allclose(predicted, alone)  # the second set changed the fits


def test_own_folds_predict_each_fold_while_the_fold_networks_predict_the_others():
    """own_by: a fold's own volumes come from other networks (trained longer), the other folds' from ``folds``."""
    folds = _folds(seed=7)

    def predicted_longer(item: Observation) -> Observation:
        features = {key: value + 0.02 for key, value in item.features[0].items()}
        return dataclasses.replace(item, features=[features], dice=item.dice + 0.03)

    longer = {name: [predicted_longer(item) for item in items] for name, items in folds.items()}
    per_fold = fold_held_out(folds, NAMES, FOLD_PROCEDURES["E"][1], own_by=longer)["class 1"]
    for (name, own), (predicted, measured, _) in zip(longer.items(), per_fold, strict=True):
        others = [item for other, items in folds.items() if other != name for item in items]
        np.testing.assert_allclose(predicted, _averaged_by_hand(own, others, NAMES, FEATURES_WITHOUT_SIZE))
        np.testing.assert_allclose(np.sort(measured), np.sort([item.dice[0] for item in own]))
    # matched by patients, whatever the bundles are called; a fold nobody else predicts is refused
    renamed = {f"long {name}": items for name, items in reversed(longer.items())}
    assert match_folds(folds, renamed) == longer
    with pytest.raises(DataError, match=r"^No network of --own-folds validates on exactly the patients of fold2; "):
        match_folds(folds, {name: items for name, items in renamed.items() if name != "long fold2"})


@pytest.mark.parametrize("procedure, pooled, averaged", [("L", True, FEATURES_WITHOUT_SIZE),
                                                          ("N", False, FEATURES_WITHOUT_SIZE),
                                                          ("O", False, (*FEATURES_WITHOUT_SIZE, MIRROR_AGREEMENT)),
                                                          ("P", True, (*FEATURES_WITHOUT_SIZE, MIRROR_AGREEMENT))])
def test_procedures_l_n_o_and_p_add_the_size_to_the_left_ventricle_alone(procedure, pooled, averaged):
    """L is E, N is G, where a structure is called "left ventricle" (ACDC's), with the size among its averaged
    features; L fits on the other folds' patients too, N on the same fold's alone. O and P are N and L with the
    mirrored passes' agreement in every structure's average."""
    folds = _folds(seed=5)
    for names, inputs in ((["background", "left ventricle"], (*averaged, "log_volume_ml")), (NAMES, averaged)):
        per_fold = fold_held_out(folds, names, FOLD_PROCEDURES[procedure][1])[names[1]]
        for (name, own), (predicted, _, _) in zip(folds.items(), per_fold, strict=True):
            others = [item for other, items in folds.items() if other != name for item in items] if pooled else []
            np.testing.assert_allclose(predicted, _averaged_by_hand(own, others, names, inputs))


@pytest.mark.parametrize("procedure, base, agreement", [("M", "L", ()), ("Q", "P", (MIRROR_AGREEMENT,))])
def test_procedures_m_and_q_shift_l_and_p_by_the_own_volumes_mean_residual_and_remove_a_network_level(
        procedure, base, agreement):
    """M is L (Q is P) moved by the mean residual of the same fold's other patients under that fit; where a fold's
    network sits at a level of its own (here fold 0's Dice 0.1 below what its features say), the shift finds it."""
    names = ["background", "left ventricle"]
    folds = _shared_signal_folds(seed=6)
    for name, own in folds.items():
        level = -0.1 if name == "fold0" else 0.0
        folds[name] = [dataclasses.replace(item, dice=item.dice + level) for item in own]
    per_fold = fold_held_out(folds, names, FOLD_PROCEDURES[procedure][1])[names[1]]
    plain = fold_held_out(folds, names, FOLD_PROCEDURES[base][1])[names[1]]
    inputs = (*FEATURES_WITHOUT_SIZE, *agreement, "log_volume_ml")
    for (name, own), (predicted, _, _) in zip(folds.items(), per_fold, strict=True):
        others = [item for other, items in folds.items() if other != name for item in items]
        by_hand = []
        for patient in sorted({item.patient for item in own}):
            rest = [item for item in own if item.patient != patient]
            model = fit_on([*others, *rest], names, averaged=True, candidates=inputs).structures[names[1]]
            offset = np.mean([item.dice[0] - model.predict(item.features[0]) for item in rest])
            by_hand += [model.shifted(offset).predict(item.features[0]) for item in own if item.patient == patient]
        np.testing.assert_allclose(predicted, by_hand)
    plain_bias, shifted_bias = ((results[0][0] - results[0][1]).mean() for results in (plain, per_fold))
    assert plain_bias > 0.05 and abs(shifted_bias) < 0.02  # fold 0's level: the base, fitted elsewhere, misses it
    for (predicted, measured, _), (plain_predicted, _, _) in zip(per_fold, plain, strict=True):
        assert np.abs(predicted - measured).mean() < np.abs(plain_predicted - measured).mean()


def _shared_signal_folds(seed: int) -> dict[str, list[Observation]]:
    """Three folds of four patients whose every feature reads the Dice (in its own direction) with noise."""
    generators = _generators(seed)
    folds = {}
    for k in range(3):
        folds[f"fold{k}"] = []
        for patient in range(8):
            dice = float(generators[0].uniform(0.6, 0.95))
            values = _draw(generators, lambda rng, name: float((dice if FEATURES[name] > 0 else 1 - dice)
                                                                 + rng.normal(0, 0.05)))
            folds[f"fold{k}"].append(Observation(CLEAN, f"f{k}p{patient // 2}", [values], np.array([dice])))
    return folds


@pytest.mark.parametrize("procedure, pooled, candidates", [("F", True, FEATURES_WITHOUT_SIZE),
                                                            ("H", False, FEATURES_WITHOUT_SIZE),
                                                            ("J", True, FEATURES_WITHOUT_MIRRORING)])
@pytest.mark.parametrize("folds, winner", [(_folds(seed=2), "mean_entropy"),
                                            (_shared_signal_folds(seed=2), "features, averaged")])
def test_procedures_f_h_and_j_choose_one_feature_or_the_average_without_the_patient(folds, winner, procedure, pooled,
                                                                                     candidates):
    """F is C with the average among the candidates; H is A with it (the same fold's others alone); J is F with
    the size among the candidates."""
    per_fold = fold_held_out(folds, NAMES, FOLD_PROCEDURES[procedure][1])["class 1"]
    for (name, own), (predicted, _, chosen) in zip(folds.items(), per_fold, strict=True):
        others = [item for other, items in folds.items() if other != name and pooled for item in items]
        by_hand, expected = [], Counter()
        for patient in sorted({item.patient for item in own}):
            fitted_on = [*others, *(item for item in own if item.patient != patient)]
            single, averaged = (fit_on(fitted_on, NAMES, candidates=candidates, **options).structures["class 1"]
                                for options in ({}, {"averaged": True}))
            model = averaged if averaged.loo_mae < single.loo_mae - 1e-12 else single
            held = [item for item in own if item.patient == patient]
            by_hand += [model.predict(item.features[0]) for item in held]
            expected[model.feature] += len(held)
        np.testing.assert_allclose(predicted, by_hand)
        assert chosen == expected and chosen.most_common(1)[0][0] == winner


def test_the_other_folds_choose_better_where_one_fold_is_too_small_to():
    """Three patients per fold: procedure A chooses among every feature and form on two patients' four volumes
    and picks spurious ones; choosing on the other folds (B) or pooling them (C) finds the informative one."""
    rho, error = {}, {}
    for seed in range(5):  # one draw can favour A by chance; over five the gap is the procedures'
        generators = _generators(seed)
        folds = {f"fold{k}": _fold(f"f{k}p", 3, "low_confidence_fraction", generators, noise=0.03) for k in range(4)}
        table = fold_table(folds, NAMES)
        for row in table:
            cells = [cell.strip() for cell in row.strip("|").split("|")]
            if cells[1] == "mean":
                rho.setdefault(cells[0][0], []).append(float(cells[3]))
                error.setdefault(cells[0][0], []).append(float(cells[4]))
        assert any(row.startswith("| C: other folds + own, pooled | class 1 |") and "low_confidence_fraction (24 of 24)"
                   in row for row in table)
        if seed == 0:  # the bias column: mean predicted − measured of the held-out predictions
            residuals = np.concatenate([predicted - measured for predicted, measured, _ in
                                        fold_held_out(folds, NAMES, FOLD_PROCEDURES["A"][1])["class 1"]])
            row = next(row for row in table if row.startswith("| A: own fold only, one feature chosen | class 1 |"))
            assert float(row.split("|")[6]) == pytest.approx(residuals.mean(), abs=5e-5)
            assert abs(residuals.mean()) > 1e-4  # not trivially zero
            # the mean row's MAE to five places (the decision rules compare it at 0.002): NAMES has one structure
            mean_row = next(row for row in table if row.startswith("| A: own fold only, one feature chosen | mean |"))
            assert mean_row.split("|")[5].strip() == f"{np.abs(residuals).mean():.5f}"
    mean_rho = {key: np.mean(values) for key, values in rho.items()}
    assert mean_rho["B"] > mean_rho["A"] + 0.1 and mean_rho["C"] > mean_rho["A"] + 0.15
    assert all(np.array(error["C"]) < np.array(error["A"]))


def test_command_prints_the_fold_table_and_refits_a_bundle(tmp_path, sample_acdc_dir, capsys):
    from test_quality import _shipped_copy
    from CalibSegLib.bundle import load_bundle
    from Training import quality_folds

    folds = []
    for index, patients in enumerate((["patient013", "patient016", "patient022"],
                                      ["patient036", "patient054", "patient068"])):
        path, _ = _shipped_copy(tmp_path, sample_acdc_dir, val=patients)
        folds.append(str(path.rename(tmp_path / f"fold{index}.calibseg")))
    assert quality_folds.main(["--folds", *folds, "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "2 folds: held-out predictions of 12 volumes of 6 patients" in printed
    for key, (description, _) in FOLD_PROCEDURES.items():
        assert f"| {key}: {description} | myocardium |" in printed

    target, weights = _shipped_copy(tmp_path, sample_acdc_dir, val=["patient069", "patient091", "patient094"])
    out = tmp_path / "refitted.calibseg"
    assert quality_folds.main(["--folds", *folds, "--refit", str(target), "--procedure", "C", "--out", str(out),
                               "--device", "cpu"]) == 0
    assert "by procedure C (other folds + own, pooled)" in capsys.readouterr().out
    with zipfile.ZipFile(out) as archive:
        assert archive.read("weights.safetensors") == weights
    assert load_bundle(out).metadata.quality_model["validation"] == {
        "cases": 18, "patients": 9, "scheme": "leave-one-patient-out", "procedure": "C: other folds + own, pooled",
        "fold_patients": 6, "fold_networks": 2}

    # a second set of the same folds (here the same networks again): the other folds' patients twice
    assert quality_folds.main(["--folds", *folds, "--also-folds", *folds, "--procedures", "E", "L",
                               "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert ("2 folds: held-out predictions of 12 volumes of 6 patients; the other folds also as 1 more set(s) of "
            "fold networks predict them") in printed
    assert [line.split("|")[1].strip()[0] for line in printed.splitlines() if "| mean |" in line] == ["E", "L"]
    assert quality_folds.main(["--folds", *folds, "--also-folds", *folds, "--refit", str(target), "--procedure", "E",
                               "--out", str(out), "--device", "cpu"]) == 0
    validation = load_bundle(out).metadata.quality_model["validation"]
    assert (validation["fold_patients"], validation["fold_networks"]) == (6, 4)

    # --own: the bundle's own validation patients as the one fold, the fold networks' patients as the others
    assert quality_folds.main(["--folds", *folds, "--own", str(target), "--procedures", "L", "M",
                               "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert ("shipped.calibseg: held-out predictions of its 6 validation volumes of 3 patients; the other folds are "
            "6 patients as 2 fold networks predict them") in printed
    assert [line.split("|")[1].strip()[0] for line in printed.splitlines() if "| mean |" in line] == ["L", "M"]
    rows = [line.split("|") for line in printed.splitlines()
            if line.startswith(("| L", "| M")) and "| mean |" not in line]
    assert all(len(row[3].split()) == 1 for row in rows)  # one fold: one ρ per structure
    with pytest.raises(SystemExit):  # scoring on a bundle's patients and refitting it are two runs
        quality_folds.main(["--folds", *folds, "--own", str(target), "--refit", str(target)])
    assert "argument --refit: not allowed with argument --own" in capsys.readouterr().err
    # --own-folds: each fold's own patients as other networks of the same folds predict them (here the same ones
    # again, so the table is the plain one)
    assert quality_folds.main(["--folds", *folds, "--own-folds", *reversed(folds), "--procedures", "E", "M",
                               "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("2 folds: held-out predictions of 12 volumes of 6 patients; each fold's own patients "
                              "as the networks of --own-folds predict them\n")
    assert quality_folds.main(["--folds", *folds, "--procedures", "E", "M", "--device", "cpu"]) == 0
    assert printed.splitlines()[1:] == capsys.readouterr().out.splitlines()[1:]
    with pytest.raises(SystemExit, match=r"^error: No network of --own-folds validates on exactly the patients of "):
        quality_folds.main(["--folds", *folds, "--own-folds", folds[0], str(target), "--device", "cpu"])
    # the bundle's classes are checked against every fold network's before anything is predicted
    with pytest.raises(DataError, match=r"fold0.calibseg has classes .*, the bundle \['background', 'tumour'\]; "):
        quality_folds.observe_fold_sets([folds], class_names=["background", "tumour"])

    overlapping, _ = _shipped_copy(tmp_path, sample_acdc_dir, val=["patient013", "patient041"])
    with pytest.raises(SystemExit, match=r"^error: .*shipped.calibseg validates on patient013, which fold .*fold0.calibseg already holds"):
        quality_folds.main(["--folds", folds[0], str(overlapping), "--device", "cpu"])
    with pytest.raises(SystemExit, match=r"^error: .*shipped.calibseg validates on patient013, which fold "):
        quality_folds.main(["--folds", *folds, "--also-folds", folds[0], str(overlapping), "--device", "cpu"])

    # Another method's fold networks must not fit this bundle's quality model, nor mix with each other.
    crac, _ = _shipped_copy(tmp_path, sample_acdc_dir, method="crac", val=["patient069", "patient091"])
    with pytest.raises(SystemExit, match=r"^error: .*fold0.calibseg was trained with ce_dice, not crac; pass fold "
                                         r"networks trained with crac\.$"):
        quality_folds.main(["--folds", *folds, "--refit", str(crac), "--out", str(out), "--device", "cpu"])
    with pytest.raises(SystemExit, match=r"^error: .*shipped.calibseg was trained with crac, not ce_dice"):
        quality_folds.main(["--folds", folds[0], str(crac), "--device", "cpu"])
