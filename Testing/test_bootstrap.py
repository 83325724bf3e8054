"""The patient-level bootstrap interval of Spearman ρ (Evaluation/bootstrap.py), against materialised
resamples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from Evaluation.bootstrap import resampled_spearman, spearman_interval


def _noisy_pairs(patients: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two volumes per patient; ``x`` rounded to 0.1 so that the resamples carry ties."""
    x = np.round(rng.uniform(0.0, 1.0, 2 * patients), 1)
    return x, x + rng.normal(0.0, 0.3, x.size)


def test_weighted_midranks_give_spearman_of_the_materialised_resamples():
    rng = np.random.default_rng(0)
    x, y = _noisy_pairs(15, rng)
    counts = rng.multinomial(15, np.full(15, 1 / 15), size=20)[:, np.repeat(np.arange(15), 2)]
    expected = [spearmanr(np.repeat(x, row), np.repeat(y, row)).statistic for row in counts]
    np.testing.assert_allclose(resampled_spearman(x, y, counts), expected, rtol=1e-10)


def test_constant_resample_is_nan():
    counts = np.array([[2, 0, 0], [1, 1, 1]])  # the first resample holds one row only: no ranking
    values = resampled_spearman(np.array([0.1, 0.2, 0.3]), np.array([0.3, 0.1, 0.2]), counts)
    assert math.isnan(values[0]) and values[1] == pytest.approx(-0.5)


def test_interval_resamples_patients_not_volumes():
    rng = np.random.default_rng(1)
    x = rng.uniform(size=15)
    y = x + rng.normal(0.0, 0.3, 15)
    per_patient = spearman_interval(x, y, np.arange(15))
    # each patient twice, identical: Spearman of every resample is unchanged, so grouped by patient the
    # interval is the one-row-per-patient interval; counted as 30 independent volumes it is narrower
    twice, patients = np.repeat(x, 2), np.repeat(np.arange(15), 2)
    assert spearman_interval(twice, np.repeat(y, 2), patients) == pytest.approx(per_patient)
    low, high = spearman_interval(twice, np.repeat(y, 2), np.arange(30))
    assert high - low < per_patient[1] - per_patient[0]
    assert per_patient[0] < spearmanr(x, y).statistic < per_patient[1]


def test_interval_edges():
    x = np.arange(10.0)
    assert spearman_interval(x, 2 * x + 1, np.arange(10)) == (1.0, 1.0)  # every resample ranks alike
    assert all(math.isnan(value) for value in spearman_interval(x, x, np.repeat([0, 1], 5)))  # two patients
    assert spearman_interval(x, -x, np.arange(10), seed=3) == spearman_interval(x, -x, np.arange(10), seed=3)
