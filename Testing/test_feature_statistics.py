"""The network features' Gaussian and threshold (CalibSegLib/feature_statistics.py), checked against distances
computed another way: SciPy's Mahalanobis distance with the covariance matrix written out."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.spatial.distance import mahalanobis

from CalibSegLib.feature_statistics import (MAX_FEATURES, FeatureStatistics, FeatureStatisticsError,
                                            conformal_threshold, fit_feature_statistics)

LAYER = "model.1.submodule"


def _volumes(count: int, features: int, seed: int, slices: int = 3) -> list[np.ndarray]:
    """``count`` volumes of ``slices`` slices whose features are correlated Gaussians (a fixed mixing)."""
    rng = np.random.default_rng(seed)
    mixing = np.random.default_rng(0).normal(size=(features, features))
    return [rng.normal(size=(slices, features)) @ mixing + 3.0 for _ in range(count)]


def test_with_every_axis_kept_the_distance_is_the_sample_covariances_mahalanobis():
    """F - 1 axes and the last eigenvalue as the residual: the covariance is the sample covariance itself."""
    training = _volumes(60, 5, seed=1)
    statistics = fit_feature_statistics(LAYER, training, _volumes(4, 5, seed=2), components=4)
    vectors = np.stack([volume.mean(axis=0) for volume in training])
    inverse = np.linalg.inv(np.cov(vectors, rowvar=False))
    for volume in _volumes(5, 5, seed=3):
        expected = mahalanobis(volume.mean(axis=0), vectors.mean(axis=0), inverse)
        assert statistics.distance(volume) == pytest.approx(expected, rel=1e-5)


def test_with_few_axes_the_distance_is_mahalanobis_under_the_low_rank_plus_isotropic_covariance():
    training = _volumes(30, 12, seed=4)
    statistics = fit_feature_statistics(LAYER, training, _volumes(4, 12, seed=5), components=3)
    axes = statistics.axes
    assert axes.shape == (3, 12) and np.allclose(axes @ axes.T, np.eye(3), atol=1e-5)
    rest = np.eye(12) - axes.T @ axes  # the projection onto the directions no axis covers
    covariance = (axes.T * statistics.variances) @ axes + statistics.residual_variance * rest
    # The residual variance is the mean of the eigenvalues left out (probabilistic PCA's maximum likelihood).
    vectors = np.stack([volume.mean(axis=0) for volume in training])
    eigenvalues = np.sort(np.linalg.eigvalsh(np.cov(vectors, rowvar=False)))
    assert statistics.residual_variance == pytest.approx(eigenvalues[:-3].mean(), rel=1e-5)
    for volume in _volumes(5, 12, seed=6):
        expected = mahalanobis(volume.mean(axis=0), statistics.mean, np.linalg.inv(covariance))
        assert statistics.distance(volume) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("count, rank", [(20, 20), (19, 19), (40, 39), (100, 96), (5, 5)])
def test_the_threshold_is_the_split_conformal_quantile(count, rank):
    distances = np.random.default_rng(count).permutation(np.arange(1.0, count + 1.0))
    threshold, within = conformal_threshold(distances, 0.05)
    assert threshold == rank and within == rank  # the ⌈(n + 1) · 0.95⌉-th smallest, at most the largest


def test_a_fitted_threshold_keeps_the_validation_volumes_at_the_stated_rate():
    validation = _volumes(40, 6, seed=8)
    statistics = fit_feature_statistics(LAYER, _volumes(30, 6, seed=7), validation)
    distances = sorted(statistics.distance(volume) for volume in validation)
    assert statistics.threshold == pytest.approx(distances[38])  # ⌈41 · 0.95⌉ = 39th smallest
    counts = (statistics.validation_volumes, statistics.validation_within, statistics.training_volumes)
    assert counts == (40, 39, 30)
    assert statistics.false_alarm_rate == 0.05 and statistics.layer == LAYER


def test_stored_statistics_read_back_with_the_same_distances():
    statistics = fit_feature_statistics(LAYER, _volumes(30, 6, seed=9), _volumes(20, 6, seed=10))
    stored = json.loads(json.dumps(statistics.to_dict()))
    again = FeatureStatistics.from_dict(stored)
    assert again.to_dict() == stored
    volume = _volumes(1, 6, seed=11)[0]
    assert again.distance(volume) == statistics.distance(volume)


def _stored(**changes) -> dict:
    values = fit_feature_statistics(LAYER, _volumes(30, 6, seed=12), _volumes(20, 6, seed=13)).to_dict()
    values.update(changes)
    return values


@pytest.mark.parametrize("values, phrase", [
    (_stored(extra=1), "wrong: extra"),
    (_stored(layer=""), "layer must be a module name"),
    (_stored(mean=[0.0] * (MAX_FEATURES + 1)), f"mean must be a list of 1 to {MAX_FEATURES}"),
    (_stored(variances=[1.0] * 17), "variances must be a list of 1 to 16 finite positive"),
    (_stored(variances=[-1.0] * 5), "variances must be a list of 1 to 16 finite positive"),
    (_stored(axes=[[1.0] * 6] * 5), "orthonormal"),
    (_stored(axes=[[1.0, 0.0]] * 5), "one vector as long as the mean per variance"),
    (_stored(axes=[[1.0, 0.0]] + [[0.0] * 6] * 4), "one vector as long as the mean per variance"),
    (_stored(axes=[["x"] * 6] * 5), "axes must be a list of 1 to 6 finite numbers"),
    (_stored(residual_variance=0.0), "residual_variance must be a positive number"),
    (_stored(threshold=math.inf), "threshold must be a positive number"),
    (_stored(false_alarm_rate=1.0), "false_alarm_rate must lie in"),
    (_stored(validation_within=21), "validation_within at most validation_volumes"),
    ([], "features must be an object"),
])
def test_malformed_statistics_are_refused_with_a_phrase_naming_the_field(values, phrase):
    with pytest.raises(FeatureStatisticsError, match=phrase):
        FeatureStatistics.from_dict(values)


def test_features_of_another_length_are_refused():
    statistics = fit_feature_statistics(LAYER, _volumes(30, 6, seed=14), _volumes(3, 6, seed=15))
    with pytest.raises(FeatureStatisticsError, match="have 7 values, the statistics 6"):
        statistics.distance(np.zeros((2, 7)))


def test_too_few_or_too_long_training_features_are_refused():
    with pytest.raises(FeatureStatisticsError, match="at least 3 training volumes and 1 validation volume"):
        fit_feature_statistics(LAYER, _volumes(2, 4, seed=16), _volumes(3, 4, seed=17))
    with pytest.raises(FeatureStatisticsError, match=f"more than the {MAX_FEATURES}"):
        long = np.zeros((1, MAX_FEATURES + 1))
        fit_feature_statistics(LAYER, [long] * 3, [long])
    with pytest.raises(FeatureStatisticsError, match="vary along fewer than"):
        fit_feature_statistics(LAYER, [np.ones((2, 4))] * 5, [np.ones((2, 4))])
