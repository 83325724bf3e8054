"""Dice, HD95, ASD against MONAI's metric classes, anisotropic spacing and the empty-mask policy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.metrics import DiceMetric, HausdorffDistanceMetric, SurfaceDistanceMetric

from CalibSegLib.metrics import asd, dice, hd95, segmentation_metrics, summarize, surface_metrics


def blobs(seed, shape=(8, 20, 18), classes=3):
    rng = np.random.default_rng(seed)
    labels = np.zeros(shape, dtype=np.int64)
    for k in range(1, classes):
        centre = rng.integers(3, np.array(shape) - 3)
        radius = rng.uniform(2, 5)
        grid = np.indices(shape)
        labels[((grid - centre.reshape(3, 1, 1, 1)) ** 2).sum(0) < radius**2] = k
    return labels


def onehot(labels, classes):
    return torch.nn.functional.one_hot(torch.from_numpy(labels), classes).permute(3, 0, 1, 2)[None].float()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_monai_metric_classes_with_anisotropic_spacing(seed):
    prediction, reference = blobs(seed), blobs(seed + 100)
    reference[reference == 0] = 0
    spacing = (5.0, 1.25, 0.8)
    assert (prediction == 1).any() and (reference == 1).any()
    expected_dice = DiceMetric(include_background=False)(onehot(prediction, 3), onehot(reference, 3))[0].numpy()
    expected_hd = HausdorffDistanceMetric(include_background=False, percentile=95)(
        onehot(prediction, 3), onehot(reference, 3), spacing=spacing)[0].numpy()
    expected_asd = SurfaceDistanceMetric(include_background=False, symmetric=True)(
        onehot(prediction, 3), onehot(reference, 3), spacing=spacing)[0].numpy()
    np.testing.assert_allclose(dice(prediction, reference, 3), expected_dice, rtol=1e-6)
    np.testing.assert_allclose(hd95(prediction, reference, 3, spacing), expected_hd, rtol=1e-6)
    np.testing.assert_allclose(asd(prediction, reference, 3, spacing), expected_asd, rtol=1e-6)


@pytest.mark.parametrize("seed", [0, 5])
def test_one_surface_computation_gives_monais_two_functions_numbers_exactly(seed):
    """HD95 and ASD are read off one computation of the surface distances: the very numbers MONAI's
    compute_hausdorff_distance and compute_average_surface_distance give, each computing them on its own."""
    from monai.metrics.hausdorff_distance import compute_hausdorff_distance
    from monai.metrics.surface_distance import compute_average_surface_distance

    prediction, reference = blobs(seed), blobs(seed + 100)
    spacing = (5.0, 1.25, 0.8)
    metrics = surface_metrics(prediction, reference, 3, spacing)
    for k in (1, 2):
        masks = [torch.from_numpy(labels == k)[None, None] for labels in (prediction, reference)]
        assert metrics["hd95"][k - 1] == float(compute_hausdorff_distance(*masks, percentile=95, spacing=spacing))
        assert metrics["asd"][k - 1] == float(compute_average_surface_distance(*masks, symmetric=True,
                                                                              spacing=spacing))


def test_spacing_scales_distances():
    prediction, reference = blobs(3), blobs(4)
    base = hd95(prediction, reference, 3, (1.0, 1.0, 1.0))
    np.testing.assert_allclose(hd95(prediction, reference, 3, (2.0, 2.0, 2.0)), 2 * base, rtol=1e-6)


def test_empty_mask_policy():
    reference = np.zeros((4, 6, 6), dtype=np.int64)
    reference[1:3, 2:4, 2:4] = 1           # class 1 only in the reference, class 2 nowhere
    prediction = np.zeros_like(reference)
    metrics = segmentation_metrics(prediction, reference, 3, (1, 1, 1))
    assert metrics["dice"][0] == 0 and np.isnan(metrics["hd95"][0]) and np.isnan(metrics["asd"][0])
    assert metrics["dice"][1] == 1 and metrics["hd95"][1] == 0 and metrics["asd"][1] == 0


def test_summary_counts_undefined_values():
    assert summarize([1.0, np.nan, 3.0]) == {"mean": 2.0, "std": 1.0, "count": 2, "undefined": 1}


@pytest.mark.parametrize("call,message", [
    (lambda: dice(np.zeros((2, 3, 3), int), np.zeros((2, 3, 4), int), 2), "does not match"),
    (lambda: dice(np.full((2, 3, 3), 5), np.zeros((2, 3, 3), int), 2), "must lie in"),
    (lambda: hd95(np.ones((2, 3, 3), int), np.ones((2, 3, 3), int), 2, (1, 1)), "spacing"),
    (lambda: hd95(np.ones((2, 3, 3), int), np.ones((2, 3, 3), int), 2, (1, -1, 1)), "spacing"),
])
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()
