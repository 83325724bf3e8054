"""Fault catalogue, metrics: negative labels are refused under the default mask (``target > 0`` would
skip them silently), by every calibration metric, streaming included; inputs are never changed."""

from __future__ import annotations

import numpy as np
import pytest

from CalibSegLib import metrics
from fault_checks import assert_one_sentence


def probabilities_and_labels(seed: int = 0, classes: int = 3, shape=(2, 6, 5)
                             ) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(classes, *shape))
    return np.exp(logits) / np.exp(logits).sum(axis=0), rng.integers(0, classes, size=shape)


def _streamed(probs, target):
    accumulator = metrics.CalibrationAccumulator(probs.shape[0])
    accumulator.update(probs, target)
    return accumulator.result()


NAMES = ("ece", "mce", "cece", "tace", "brier", "nll", "reliability", "calibration_metrics")
METRICS = {**{name: getattr(metrics, name) for name in NAMES}, "CalibrationAccumulator.update": _streamed}


@pytest.mark.parametrize("name", list(METRICS))
@pytest.mark.parametrize("negative", [-1, -128], ids=["-1", "-128"])
def test_negative_labels_are_refused_under_the_default_mask(name, negative):
    probs, target = probabilities_and_labels()
    target[1, 2, 3] = negative
    kept = probs.copy(), target.copy()
    with pytest.raises(ValueError) as caught:
        METRICS[name](probs, target)
    assert_one_sentence(str(caught.value), rf"found {negative}", "explicit mask")
    np.testing.assert_array_equal(probs, kept[0])
    np.testing.assert_array_equal(target, kept[1])


def test_an_explicit_mask_may_leave_negative_labels_out():
    probs, target = probabilities_and_labels()
    target[0] = -1
    mask = target >= 0
    assert np.isfinite(metrics.ece(probs, target, mask))
    without_first = metrics.ece(probs[:, 1:], target[1:], mask[1:])
    np.testing.assert_allclose(metrics.ece(probs, target, mask), without_first)
