"""Neighbourhood priors against explicit loops over tiny label maps (zero padding = background)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from CalibSegLib.priors import PRIOR_KINDS, gaussian_kernel, inner_region_mask, neighbourhood_prior


def window_labels(labels: np.ndarray, index: tuple[int, ...], kernel: int) -> list[int]:
    """Labels of the window centred at ``index``; outside the image counts as background (0)."""
    half = kernel // 2
    values = []
    for offset in itertools.product(range(-half, half + 1), repeat=labels.ndim):
        position = tuple(i + o for i, o in zip(index, offset))
        inside = all(0 <= p < n for p, n in zip(position, labels.shape))
        values.append(int(labels[position]) if inside else 0)
    return values


def loop_prior(labels: np.ndarray, num_classes: int, kernel: int, kind: str) -> np.ndarray:
    prior = np.zeros((num_classes,) + labels.shape)
    for index in np.ndindex(labels.shape):
        window = window_labels(labels, index, kernel)
        if kind == "mean":
            for label in window:
                prior[(label,) + index] += 1.0 / len(window)
            continue
        if kind == "mode":
            counts = np.bincount(window, minlength=num_classes)
            chosen = int(np.argmax(counts))
        else:
            chosen = int({"max": np.max, "min": np.min, "median": np.median}[kind](window))
        prior[(chosen,) + index] = 1.0
    return prior


def test_mean_prior_hand_worked_corner():
    # A 3×3 image, class 1 in the top-left corner only. At the corner the 3×3 window holds
    # 5 outside voxels (background), 3 background voxels and the class-1 voxel itself.
    labels = torch.zeros(1, 3, 3, dtype=torch.int64)
    labels[0, 0, 0] = 1
    prior = neighbourhood_prior(labels, 2, kernel=3, kind="mean")
    assert prior[0, 1, 0, 0].item() == pytest.approx(1 / 9)
    assert prior[0, 0, 0, 0].item() == pytest.approx(8 / 9)
    assert prior[0, 1, 2, 2].item() == 0.0
    assert prior[0, 1, 1, 1].item() == pytest.approx(1 / 9)


@pytest.mark.parametrize("kind", [k for k in PRIOR_KINDS if k != "gaussian"])
@pytest.mark.parametrize("kernel", [3, 5])
@pytest.mark.parametrize("shape", [(6, 7), (4, 5, 6)])
def test_prior_matches_loops(kind, kernel, shape):
    rng = np.random.default_rng(sum(shape) + kernel)
    labels = rng.integers(0, 4, size=shape)
    expected = loop_prior(labels, 4, kernel, kind)
    result = neighbourhood_prior(torch.from_numpy(labels)[None], 4, kernel=kernel, kind=kind)[0].numpy()
    np.testing.assert_allclose(result, expected, atol=1e-6)


def test_gaussian_prior_is_weighted_window_fraction():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, size=(5, 6))
    weights = gaussian_kernel(3, 2.0, 2).numpy().ravel()
    expected = np.zeros((3,) + labels.shape)
    for index in np.ndindex(labels.shape):
        for weight, label in zip(weights, window_labels(labels, index, 3)):
            expected[(label,) + index] += weight
    result = neighbourhood_prior(torch.from_numpy(labels)[None], 3, kernel=3, kind="gaussian", sigma=2.0)[0]
    np.testing.assert_allclose(result.numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("kind", PRIOR_KINDS)
def test_prior_sums_to_one(kind):
    labels = torch.randint(0, 4, (2, 9, 9))
    prior = neighbourhood_prior(labels, 4, kind=kind)
    torch.testing.assert_close(prior.sum(dim=1), torch.ones(2, 9, 9))


def test_inner_region_mask_matches_loops():
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 2, size=(7, 7))
    labels[2:6, 2:6] = 1
    expected = np.array([[len(set(window_labels(labels, (i, j), 3))) == 1 for j in range(7)] for i in range(7)])
    np.testing.assert_array_equal(inner_region_mask(torch.from_numpy(labels)[None])[0].numpy(), expected)


def test_foreground_touching_border_is_outer():
    labels = torch.ones(1, 5, 5, dtype=torch.int64)
    mask = inner_region_mask(labels)[0]
    assert not mask[0].any() and mask[1:4, 1:4].all()


@pytest.mark.parametrize("kernel", [0, 2, 4])
def test_even_or_empty_kernel_is_refused(kernel):
    with pytest.raises(ValueError, match="odd"):
        neighbourhood_prior(torch.zeros(1, 4, 4, dtype=torch.int64), 2, kernel=kernel)


def test_unknown_prior_kind_is_refused():
    with pytest.raises(ValueError, match="Unknown prior kind"):
        neighbourhood_prior(torch.zeros(1, 4, 4, dtype=torch.int64), 2, kind="average")
