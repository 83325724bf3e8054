"""Fault catalogue, metrics: negative labels are refused under the default mask (``target > 0`` would
skip them silently), by every calibration metric, streaming included; inputs are never changed."""

from __future__ import annotations

import numpy as np
import pytest

from CalibSegLib.metrics import (
    CalibrationAccumulator,
    brier,
    calibration_metrics,
    cece,
    ece,
    mce,
    nll,
    reliability,
    tace,
)
from fault_checks import assert_one_sentence


def probabilities_and_labels(seed: int = 0, classes: int = 3, shape=(2, 6, 5)) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(classes, *shape))
    return np.exp(logits) / np.exp(logits).sum(axis=0), rng.integers(0, classes, size=shape)


def _streamed(probs, target):
    accumulator = CalibrationAccumulator(probs.shape[0])
    accumulator.update(probs, target)
    return accumulator.result()


METRICS = {"ece": ece, "mce": mce, "cece": cece, "tace": tace, "brier": brier, "nll": nll,
           "reliability": reliability, "calibration_metrics": calibration_metrics,
           "CalibrationAccumulator.update": _streamed}


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
    assert np.isfinite(ece(probs, target, mask))
    np.testing.assert_allclose(ece(probs, target, mask), ece(probs[:, 1:], target[1:], mask[1:]))
