"""Neighbourhood priors and the inner-region mask against loops and hand-worked examples.

Zero padding: voxels outside the image count as background (class 0).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from CalibSegLib.priors import PRIOR_KINDS, inner_region_mask, neighbourhood_prior, svls_kernel
from loss_reference import DEVICES, loop_inner, loop_prior

# 3×3 label map used by the hand-worked examples below.
HAND_LABELS = torch.tensor([[[1, 1, 2],
                             [1, 2, 2],
                             [0, 2, 2]]])


@pytest.mark.parametrize("kind,position,expected", [
    # Top-left corner: 5 outside voxels (background), in-image labels 1, 1, 1, 2.
    ("mean", (0, 0), [5 / 9, 3 / 9, 1 / 9]),
    ("max", (0, 0), [0, 0, 1]),
    ("min", (0, 0), [1, 0, 0]),
    ("median", (0, 0), [1, 0, 0]),  # sorted 0,0,0,0,0,1,1,1,2
    ("mode", (0, 0), [1, 0, 0]),
    # Centre: the whole image, labels 0 ×1, 1 ×3, 2 ×5.
    ("mean", (1, 1), [1 / 9, 3 / 9, 5 / 9]),
    ("max", (1, 1), [0, 0, 1]),
    ("min", (1, 1), [1, 0, 0]),
    ("median", (1, 1), [0, 0, 1]),  # sorted 0,1,1,1,2,2,2,2,2
    ("mode", (1, 1), [0, 0, 1]),
    # Bottom-right corner: 5 outside voxels, four 2s.
    ("mean", (2, 2), [5 / 9, 0, 4 / 9]),
    ("median", (2, 2), [1, 0, 0]),
    ("mode", (2, 2), [1, 0, 0]),
])
def test_prior_hand_worked_3x3_with_zero_padding(kind, position, expected):
    prior = neighbourhood_prior(HAND_LABELS, 3, kernel=3, kind=kind)
    np.testing.assert_allclose(prior[(0, slice(None)) + position].numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("sigma", [1.0, 2.0])
def test_gaussian_prior_hand_worked_centre(sigma):
    # Centre weight 1/2 (label 2); edge neighbours weigh a, diagonal ones b, scaled to sum 1/2.
    a, b = math.exp(-1 / (2 * sigma**2)), math.exp(-2 / (2 * sigma**2))
    scale = 0.5 / (4 * a + 4 * b)
    expected = [b * scale, (2 * a + b) * scale, 0.5 + (2 * a + 2 * b) * scale]
    prior = neighbourhood_prior(HAND_LABELS, 3, kernel=3, kind="gaussian", sigma=sigma)
    np.testing.assert_allclose(prior[0, :, 1, 1].numpy(), expected, atol=1e-6)


def test_mean_prior_hand_worked_3d_corner():
    # 3×3×3 foreground cube: the corner window holds 8 image voxels and 19 outside ones.
    labels = torch.ones(1, 3, 3, 3, dtype=torch.int64)
    prior = neighbourhood_prior(labels, 2, kernel=3, kind="mean")
    np.testing.assert_allclose(prior[0, :, 0, 0, 0].numpy(), [19 / 27, 8 / 27], atol=1e-6)
    np.testing.assert_allclose(prior[0, :, 1, 1, 1].numpy(), [0.0, 1.0], atol=1e-6)


@pytest.mark.parametrize("kind", PRIOR_KINDS)
@pytest.mark.parametrize("kernel", [3, 5])
@pytest.mark.parametrize("shape", [(6, 7), (4, 5, 6)], ids=["2d", "3d"])
def test_prior_matches_voxel_loops(kind, kernel, shape):
    rng = np.random.default_rng(sum(shape) + kernel)
    labels = rng.integers(0, 4, size=(2,) + shape)
    result = neighbourhood_prior(torch.from_numpy(labels), 4, kernel=kernel, kind=kind, sigma=1.5).numpy()
    for b in range(2):
        np.testing.assert_allclose(result[b], loop_prior(labels[b], 4, kernel, kind, sigma=1.5), atol=1e-6)


@pytest.mark.parametrize("kind", PRIOR_KINDS)
@pytest.mark.parametrize("shape", [(9, 9), (4, 5, 6)], ids=["2d", "3d"])
def test_prior_is_a_distribution_over_classes(kind, shape):
    labels = torch.randint(0, 4, (2,) + shape, generator=torch.Generator().manual_seed(0))
    prior = neighbourhood_prior(labels, 4, kind=kind)
    assert prior.shape == (2, 4) + shape
    torch.testing.assert_close(prior.sum(dim=1), torch.ones((2,) + shape))


@pytest.mark.parametrize("spatial_dims", [2, 3])
@pytest.mark.parametrize("kernel", [3, 5])
def test_svls_kernel_centre_weighs_as_much_as_all_neighbours(spatial_dims, kernel):
    window = svls_kernel(kernel, 2.0, spatial_dims)
    centre = (kernel // 2,) * spatial_dims
    assert window.shape == (kernel,) * spatial_dims
    assert window[centre].item() == pytest.approx(0.5)
    assert window.sum().item() == pytest.approx(1.0)
    torch.testing.assert_close(window, window.flip(list(range(spatial_dims))))


def test_inner_region_hand_worked_7x7():
    # A 3×3 foreground block at rows/cols 1–3 of a 7×7 background image.
    labels = torch.zeros(1, 7, 7, dtype=torch.int64)
    labels[0, 1:4, 1:4] = 1
    inner = inner_region_mask(labels)[0]
    assert inner[2, 2]  # the block's centre: all nine are foreground
    assert not inner[1, 1] and not inner[0, 0] and not inner[4, 4]  # windows touch the block
    assert inner[5, 5] and inner[6, 6] and inner[6, 0]  # background, and outside counts as background


def test_foreground_touching_the_border_is_outer():
    labels = torch.ones(1, 5, 5, dtype=torch.int64)
    inner = inner_region_mask(labels)[0]
    assert not inner[0].any() and not inner[:, 0].any()
    assert inner[1:4, 1:4].all()


@pytest.mark.parametrize("kernel", [3, 5])
@pytest.mark.parametrize("shape", [(7, 8), (4, 5, 6)], ids=["2d", "3d"])
def test_inner_region_matches_voxel_loops(kernel, shape):
    rng = np.random.default_rng(7)
    labels = np.zeros(shape, dtype=np.int64)
    labels[tuple(slice(1, n - 1) for n in shape)] = 1
    labels[rng.random(shape) < 0.1] = 2
    result = inner_region_mask(torch.from_numpy(labels)[None], kernel)[0].numpy()
    np.testing.assert_array_equal(result, loop_inner(labels, kernel))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", PRIOR_KINDS)
def test_prior_on_device_equals_cpu(device, kind):
    labels = torch.randint(0, 3, (2, 4, 6, 5), generator=torch.Generator().manual_seed(1))
    expected = neighbourhood_prior(labels, 3, kind=kind)
    torch.testing.assert_close(neighbourhood_prior(labels.to(device), 3, kind=kind).cpu(), expected)


@pytest.mark.parametrize("arguments,message", [
    ({"kernel": 1}, "odd window width"),
    ({"kernel": 4}, "odd window width"),
    ({"kind": "average"}, "Unknown prior kind"),
    ({"kind": "gaussian", "sigma": 0.0}, "sigma"),
])
def test_bad_prior_arguments_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        neighbourhood_prior(torch.zeros(1, 4, 4, dtype=torch.int64), 2, **arguments)


@pytest.mark.parametrize("target,message", [
    (torch.zeros(4, 4, dtype=torch.int64), r"\(B, H, W\)"),
    (torch.zeros(1, 4, 4, dtype=torch.int32), "int64"),
])
def test_bad_target_is_refused(target, message):
    with pytest.raises(ValueError, match=message):
        neighbourhood_prior(target, 2)
    with pytest.raises(ValueError, match=message):
        inner_region_mask(target)
