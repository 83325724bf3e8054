"""Volumes and mass of the cardiac structures (CalibSegLib.cardiac.indices) against counts made here."""

from __future__ import annotations

import numpy as np
import pytest

from CalibSegLib.cardiac.indices import (MYOCARDIUM_DENSITY_G_PER_ML, CardiacError, ProbabilityTally,
                                         cardiac_classes, label_volumes_ml, phase_volumes, voxel_volume_ml)
from CalibSegLib.cardiac.intervals import index_values
from Datasets.acdc import ACDC_CLASS_NAMES, ACDC_TERMINOLOGY
from cardiac_standins import SURE, LabelPredictor

SPACING = (8.0, 1.25, 1.5)  # mm: one voxel is 15 mm³ = 0.015 mL


def _labels(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 4, size=(5, 12, 10)).astype(np.uint8)


def test_structures_are_found_by_their_codes_not_their_names():
    shuffled = ["background", "a", "b", "c"]
    terminology = {"a": ACDC_TERMINOLOGY["left ventricle"], "b": ACDC_TERMINOLOGY["myocardium"],
                   "c": ACDC_TERMINOLOGY["right ventricle"]}
    classes = cardiac_classes(shuffled, terminology)
    assert (classes.lv, classes.myocardium, classes.rv) == (1, 2, 3)
    assert (cardiac_classes(ACDC_CLASS_NAMES, ACDC_TERMINOLOGY).lv, cardiac_classes(
        ACDC_CLASS_NAMES, ACDC_TERMINOLOGY).rv) == (3, 1)


@pytest.mark.parametrize("terminology", [None, {}, {"left ventricle": ACDC_TERMINOLOGY["left ventricle"]}])
def test_a_bundle_without_the_codes_is_refused_in_one_sentence(terminology):
    with pytest.raises(CardiacError, match=r"^The bundle's terminology codes no class as .*right ventricle") as error:
        cardiac_classes(ACDC_CLASS_NAMES, terminology)
    assert "\n" not in str(error.value) and str(error.value).endswith(".")


def test_label_volumes_are_voxel_counts_times_the_voxel_volume():
    labels = _labels()
    assert voxel_volume_ml(SPACING) == pytest.approx(0.015)
    volumes = label_volumes_ml(labels, SPACING, cardiac_classes(ACDC_CLASS_NAMES, ACDC_TERMINOLOGY))
    by_loop = {name: 0 for name in ("rv", "myocardium", "lv")}
    for value in labels.ravel():  # an independent count
        if value:
            by_loop[{1: "rv", 2: "myocardium", 3: "lv"}[int(value)]] += 1
    assert volumes == pytest.approx({name: count * 8.0 * 1.25 * 1.5 / 1000.0 for name, count in by_loop.items()})


def test_soft_volumes_and_spreads_follow_the_probabilities_streamed_in_batches():
    labels = _labels(1)
    predictor = LabelPredictor()
    probabilities = predictor.probabilities(labels)
    tally = ProbabilityTally(4)
    for start in range(0, labels.shape[0], 2):  # batches along z, as the predictor streams them
        tally(slice(start, start + 2), probabilities[:, start:start + 2])
    volumes = phase_volumes(labels, tally, SPACING, cardiac_classes(ACDC_CLASS_NAMES, ACDC_TERMINOLOGY))
    other = (1 - SURE) / 3
    count = int((labels == 3).sum())
    rest = labels.size - count
    assert volumes.lv.hard == pytest.approx(count * 0.015)
    assert volumes.lv.soft == pytest.approx((count * SURE + rest * other) * 0.015, rel=1e-6)
    assert volumes.lv.spread == pytest.approx((count * SURE * (1 - SURE) + rest * other * (1 - other)) * 0.015,
                                              rel=1e-6)
    whole = ProbabilityTally(4).add_volume(probabilities)
    assert np.allclose(whole.sums, tally.sums) and np.allclose(whole.spreads, tally.spreads)


def test_indices_from_volumes():
    values = index_values({"lv": 150.0, "rv": 160.0, "myocardium": 100.0}, {"lv": 60.0, "rv": 80.0,
                                                                          "myocardium": 110.0})
    assert values == pytest.approx({"lv_edv_ml": 150.0, "lv_esv_ml": 60.0, "lv_sv_ml": 90.0, "lv_ef_percent": 60.0,
                                    "rv_edv_ml": 160.0, "rv_esv_ml": 80.0, "rv_ef_percent": 50.0,
                                    "myocardium_mass_g": 100.0 * MYOCARDIUM_DENSITY_G_PER_ML})
    assert np.isnan(index_values({"lv": 0.0, "rv": 1.0, "myocardium": 1.0},
                                 {"lv": 0.0, "rv": 1.0, "myocardium": 1.0})["lv_ef_percent"])
