"""Friedman ranks against the CRaC paper's Table 1; error-detection AUROC and AURC against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from CalibSegLib.metrics import aurc, error_detection_auroc, rank_methods

# CRaC paper, Table 1 (UNet): ACDC DSC, HD, ECE, TACE, then FLARE DSC, HD, ECE, TACE.
CRAC_TABLE_1 = {
    "FL": [0.620, 7.30, 0.153, 0.224, 0.834, 6.65, 0.053, 0.145],
    "ECP": [0.782, 4.44, 0.130, 0.151, 0.860, 5.30, 0.037, 0.134],
    "LS": [0.809, 3.30, 0.083, 0.093, 0.860, 5.33, 0.055, 0.050],
    "SVLS": [0.824, 2.81, 0.091, 0.138, 0.857, 5.72, 0.039, 0.144],
    "MbLS": [0.827, 2.99, 0.103, 0.081, 0.836, 5.75, 0.046, 0.041],
    "NACL": [0.854, 2.93, 0.068, 0.073, 0.868, 5.12, 0.033, 0.031],
    "BWCR": [0.841, 2.69, 0.051, 0.075, 0.848, 5.39, 0.029, 0.059],
    "CRaC": [0.877, 1.72, 0.057, 0.058, 0.876, 5.52, 0.029, 0.033],
}
PAPER_FRIEDMAN = {"FL": 7.88, "ECP": 5.38, "LS": 4.88, "SVLS": 5.25, "MbLS": 5.25, "NACL": 2.25, "BWCR": 3.13,
                  "CRaC": 1.75}
PAPER_FINAL = {"FL": 8, "ECP": 7, "LS": 4, "SVLS": 5, "MbLS": 5, "NACL": 2, "BWCR": 3, "CRaC": 1}


def test_reproduces_crac_table_1_friedman_ranks():
    columns = [f"{dataset}_{metric}" for dataset in ("acdc", "flare") for metric in ("dsc", "hd", "ece", "tace")]
    table = {method: dict(zip(columns, values)) for method, values in CRAC_TABLE_1.items()}
    ranks = rank_methods(table, {column: column.endswith("dsc") for column in columns})
    for method, friedman, final in zip(ranks.methods, ranks.friedman, ranks.final):
        assert abs(friedman - PAPER_FRIEDMAN[method]) <= 0.005 + 1e-9  # the paper rounds half up (3.125 → 3.13)
        assert final == PAPER_FINAL[method]
    assert ranks.rank_sum[ranks.methods.index("CRaC")] == pytest.approx(1.75 * 8)


def test_nan_ranks_last_and_ties_share_best_rank():
    ranks = rank_methods({"a": {"x": 1.0}, "b": {"x": 1.0}, "c": {"x": np.nan}}, {"x": False})
    np.testing.assert_allclose(ranks.ranks[:, 0], [1.0, 1.0, 3.0])


def test_ranking_bad_input():
    with pytest.raises(ValueError, match="direction"):
        rank_methods({"a": {"x": 1.0}}, {})


def brute_auroc(confidence, correct):
    pairs = [(r, w) for r, w in itertools.product(confidence[correct], confidence[~correct])]
    return np.mean([1.0 if r > w else 0.5 if r == w else 0.0 for r, w in pairs])


@pytest.mark.parametrize("seed", [0, 1])
def test_auroc_matches_pairwise_count(seed):
    rng = np.random.default_rng(seed)
    confidence = np.round(rng.random(60), 1)  # rounding creates ties
    correct = rng.random(60) < confidence
    assert error_detection_auroc(confidence, correct) == pytest.approx(brute_auroc(confidence, correct))


def test_auroc_perfect_and_undefined():
    assert error_detection_auroc([0.9, 0.8, 0.3], [True, True, False]) == 1.0
    assert np.isnan(error_detection_auroc([0.9, 0.8], [True, True]))


def test_aurc_matches_brute_force():
    rng = np.random.default_rng(2)
    confidence = rng.random(40)
    correct = rng.random(40) < 0.7
    order = sorted(range(40), key=lambda i: -confidence[i])
    risks = [np.mean([not correct[i] for i in order[:n]]) for n in range(1, 41)]
    value, coverage, risk = aurc(confidence, correct)
    assert value == pytest.approx(np.mean(risks))
    np.testing.assert_allclose(risk, risks)
    assert coverage[-1] == 1.0
