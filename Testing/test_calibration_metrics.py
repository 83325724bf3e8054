"""Calibration metrics against brute-force loops, closed forms, bin edges and streaming."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

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


def random_case(seed=0, classes=4, shape=(3, 7, 8), sharpness=2.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(classes,) + shape) * sharpness
    probs = np.exp(logits) / np.exp(logits).sum(0)
    target = rng.integers(0, classes, size=shape)
    return probs, target


def voxels(probs, target, mask):
    """Masked voxels as a list of (probability vector, label) with explicit loops."""
    result = []
    for index in np.ndindex(target.shape):
        if mask[index]:
            result.append((probs[(slice(None),) + index], int(target[index])))
    return result


def loop_bin(value, n_bins):
    for b in range(n_bins):
        if b / n_bins < value <= (b + 1) / n_bins:
            return b
    return 0  # exactly 0


def loop_ece(probs, target, mask, n_bins=15, maximum=False):
    items = voxels(probs, target, mask)
    bins = [[] for _ in range(n_bins)]
    for p, y in items:
        bins[loop_bin(max(p), n_bins)].append((max(p), float(np.argmax(p) == y)))
    gaps = [(len(b), abs(sum(c for _, c in b) / len(b) - sum(q for q, _ in b) / len(b))) for b in bins if b]
    if maximum:
        return max(g for _, g in gaps)
    return sum(n / len(items) * g for n, g in gaps)


def loop_cece(probs, target, mask, n_bins=15):
    items = voxels(probs, target, mask)
    per_class = []
    for k in range(probs.shape[0]):
        bins = [[] for _ in range(n_bins)]
        for p, y in items:
            bins[loop_bin(p[k], n_bins)].append((p[k], float(y == k)))
        per_class.append(sum(len(b) / len(items) * abs(sum(f for _, f in b) / len(b) - sum(q for q, _ in b) / len(b))
                             for b in bins if b))
    return np.mean(per_class)


def loop_tace(probs, target, mask, n_bins=15, threshold=0.01):
    items = voxels(probs, target, mask)
    per_class = []
    for k in range(probs.shape[0]):
        pairs = sorted((p[k], float(y == k)) for p, y in items if p[k] > threshold)
        if not pairs:
            continue
        total = 0.0
        for chunk in np.array_split(np.array(pairs), n_bins):
            if len(chunk):
                total += abs(chunk[:, 1].sum() - chunk[:, 0].sum())
        per_class.append(total / len(pairs))
    return np.mean(per_class)


def loop_brier_nll(probs, target, mask):
    items = voxels(probs, target, mask)
    brier_value = np.mean([sum((p[k] - (k == y)) ** 2 for k in range(len(p))) for p, y in items])
    nll_value = np.mean([-np.log(max(p[y], 1e-12)) for p, y in items])
    return brier_value, nll_value


@pytest.mark.parametrize("seed,sharpness", [(0, 2.0), (1, 2.0), (2, 12.0)])  # sharp: many p_k ≤ 1e-3 in bin 0
@pytest.mark.parametrize("use_mask", [False, True])
def test_every_metric_matches_brute_force(seed, sharpness, use_mask):
    probs, target = random_case(seed, sharpness=sharpness)
    mask = (np.random.default_rng(seed + 10).random(target.shape) > 0.3) if use_mask else target > 0
    passed = mask if use_mask else None
    assert ece(probs, target, passed) == pytest.approx(loop_ece(probs, target, mask), abs=1e-12)
    assert mce(probs, target, passed) == pytest.approx(loop_ece(probs, target, mask, maximum=True), abs=1e-12)
    assert cece(probs, target, passed) == pytest.approx(loop_cece(probs, target, mask), abs=1e-12)
    assert tace(probs, target, passed) == pytest.approx(loop_tace(probs, target, mask), abs=1e-6)
    expected_brier, expected_nll = loop_brier_nll(probs, target, mask)
    assert brier(probs, target, passed) == pytest.approx(expected_brier, abs=1e-12)
    assert nll(probs, target, passed) == pytest.approx(expected_nll, abs=1e-12)


def test_torch_inputs_give_the_same_values():
    probs, target = random_case(4)
    assert ece(torch.from_numpy(probs), torch.from_numpy(target)) == pytest.approx(ece(probs, target), abs=1e-12)


def test_one_hot_correct_predictions_are_perfect():
    target = np.random.default_rng(0).integers(0, 3, size=(4, 5, 6))
    probs = np.eye(3)[target].transpose(3, 0, 1, 2)
    metrics = calibration_metrics(probs, target)
    assert metrics["ece"] == 0 and metrics["brier"] == 0 and metrics["cece"] == 0 and metrics["nll"] == 0


def test_constant_confidence_gives_accuracy_gap():
    rng = np.random.default_rng(1)
    target = rng.integers(1, 2, size=(1000,))  # all class 1 (foreground)
    predicted = np.where(rng.random(1000) < 0.6, 1, 0)  # 60 % correct
    probs = np.full((2, 1000), 0.2)
    probs[predicted, np.arange(1000)] = 0.8
    accuracy = float((predicted == target).mean())
    assert ece(probs, target) == pytest.approx(abs(accuracy - 0.8), abs=1e-12)


def test_perfectly_calibrated_predictor_ece_shrinks_with_samples():
    def calibrated_ece(n, seed):
        rng = np.random.default_rng(seed)
        confidence = rng.uniform(0.5, 1.0, size=n)
        correct = rng.random(n) < confidence
        probs = np.stack([np.where(correct, 1 - confidence, confidence), np.where(correct, confidence, 1 - confidence)])
        return ece(probs, np.ones(n, dtype=np.int64))
    small, large = calibrated_ece(1_000, 0), calibrated_ece(1_000_000, 0)
    assert large < 0.005 and large < small


@pytest.mark.parametrize("value,expected_bin", [(1.0, 14), (0.0, 0), (1 / 15, 0), (2 / 15, 1), (14 / 15, 13),
                                                (0.5, 7), (7.5 / 15, 7), (np.nextafter(1 / 15, 1), 1)])
def test_bin_edges_are_right_closed(value, expected_bin):
    probs = np.array([[1 - value], [value]]) if value >= 0.5 else np.array([[value], [1 - value]])
    counts = reliability(probs[::-1] if value < 0.5 else probs, np.array([1]), n_bins=15).counts
    confidence = max(value, 1 - value)
    assert counts[int(np.ceil(confidence * 15)) - 1 if confidence > 0 else 0] == 1
    cls = CalibrationAccumulator(2)
    # the class-wise bins see p_k itself, including exact edges and 0
    from CalibSegLib.metrics.calibration import _bin_index
    assert _bin_index(np.array([value]), 15)[0] == expected_bin
    del cls


@pytest.mark.parametrize("chunks", [[3], [1, 1, 1], [2, 1]])
def test_streaming_equals_whole_array(chunks):
    probs, target = random_case(7, shape=(3, 9, 10))
    accumulator = CalibrationAccumulator(4)
    start = 0
    for size in chunks:
        accumulator.update(probs[:, start:start + size], target[start:start + size])
        start += size
    result = accumulator.result()
    whole = calibration_metrics(probs, target)
    for key, value in whole.items():
        assert result.per_volume[0][key] == pytest.approx(value, abs=1e-12)
        assert result.pooled[key] == pytest.approx(value, abs=1e-12)


def test_pooled_over_volumes_equals_concatenation():
    first, second = random_case(8), random_case(9)
    accumulator = CalibrationAccumulator(4)
    for probs, target in (first, second):
        accumulator.update(probs, target)
        accumulator.end_volume()
    joined_probs = np.concatenate([first[0], second[0]], axis=1)
    joined_target = np.concatenate([first[1], second[1]], axis=0)
    pooled = accumulator.result().pooled
    for key, value in calibration_metrics(joined_probs, joined_target).items():
        assert pooled[key] == pytest.approx(value, abs=1e-12)
    assert accumulator.result().per_volume[1]["ece"] == pytest.approx(ece(*second), abs=1e-12)


def test_empty_mask_gives_nan_with_warning():
    probs, target = random_case(0)
    with pytest.warns(RuntimeWarning, match="empty"):
        assert np.isnan(ece(probs, np.zeros_like(target)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(calibration_metrics(probs, np.zeros_like(target))["tace"])


@pytest.mark.parametrize("mutate,message", [
    (lambda p, t, m: (p * 2, t, m), "sum to 1"),
    (lambda p, t, m: (np.where(p > 0.5, np.nan, p), t, m), "NaN"),
    (lambda p, t, m: (p - 0.5, t, m), "non-negative"),
    (lambda p, t, m: (p, t[:, :-1], m), "does not match"),
    (lambda p, t, m: (p, t, m[:-1]), "mask shape"),
    (lambda p, t, m: (p, t + 4, None), "must lie in"),
    (lambda p, t, m: (p, t.astype(float), m), "integer"),
])
def test_bad_input_raises_value_error(mutate, message):
    probs, target = random_case(0)
    probs, target, mask = mutate(probs, target, np.ones(target.shape, bool))
    with pytest.raises(ValueError, match=message):
        ece(probs, target, mask)


@pytest.mark.parametrize("n_bins", [0, 1000])
def test_bin_counts_outside_the_supported_range_are_refused(n_bins):
    from CalibSegLib.metrics import CalibrationStatistics

    with pytest.raises(ValueError, match=r"n_bins must lie in \[1, 999\]"):
        CalibrationStatistics(4, n_bins=n_bins)


def loop_authors_tace(probs, target, mask, n_bins=15, threshold=1e-3):
    """The CRaC authors' ThreshClasswiseECELoss written out: per class, p_k > 1e-3 in equal-width bins,
    weighted by the share of those voxels; an empty class adds 0; mean over every class."""
    items = voxels(probs, target, mask)
    per_class = []
    for k in range(probs.shape[0]):
        kept = [(p[k], float(y == k)) for p, y in items if p[k] > threshold]
        total = 0.0
        for b in range(n_bins):
            in_bin = [(q, f) for q, f in kept if b / n_bins < q <= (b + 1) / n_bins]
            if in_bin:
                total += len(in_bin) / len(kept) * abs(sum(f for _, f in in_bin) / len(in_bin)
                                                       - sum(q for q, _ in in_bin) / len(in_bin))
        per_class.append(total)
    return float(np.mean(per_class))


@pytest.mark.parametrize("seed,sharpness", [(0, 2.0), (1, 6.0), (2, 12.0)])  # sharp: many p_k ≤ 1e-3
def test_authors_tace_matches_their_loop(seed, sharpness):
    from CalibSegLib.metrics import CalibrationStatistics
    from CalibSegLib.metrics.calibration import masked_probabilities

    probs, target = random_case(seed, sharpness=sharpness)
    assert (probs <= 1e-3).any() or sharpness < 6
    statistics = CalibrationStatistics(4)
    for chunk in range(3):  # streamed in slices: the below-threshold sums must add up too
        statistics.add(*masked_probabilities(probs[:, chunk], target[chunk]))
    assert statistics.tace_authors() == pytest.approx(loop_authors_tace(probs, target, target > 0), abs=1e-9)


def test_statistics_without_tace_pairs_give_the_same_ece_and_no_tace():
    from CalibSegLib.metrics import CalibrationStatistics
    from CalibSegLib.metrics.calibration import masked_probabilities

    probs, target = random_case(3)
    everything = np.ones(target.shape, bool)
    light = CalibrationStatistics(4, track_tace=False)
    light.add(*masked_probabilities(probs, target, everything))
    assert light.ece() == pytest.approx(loop_ece(probs, target, everything), abs=1e-9)
    assert np.isnan(light.tace()) and all(not keys for keys in light.tace_keys)
