"""BWCR: boundary weights against loops, the second view's warp and its inverse, the loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from CalibSegLib.losses import build_loss
from CalibSegLib.losses._views import invert_affine, random_affine, random_intensity, warp
from CalibSegLib.losses.bwcr import boundary_distance, boundary_weights
from CalibSegLib.networks import build_network
from loss_reference import DEVICES, loop_inner, random_batch

IDENTITY_VIEW = {"max_rotation": 0.0, "max_scaling": 0.0, "max_translation": 0.0, "max_log_gamma": 0.0,
                 "noise_std": 0.0}


def loop_boundary_distance(labels: np.ndarray, cap: int) -> np.ndarray:
    """Chessboard distance to the nearest outer voxel by brute force, capped at ``cap``."""
    inner = loop_inner(labels)
    boundary = [index for index in np.ndindex(labels.shape) if not inner[index]]
    distance = np.full(labels.shape, float(cap))
    for index in np.ndindex(labels.shape):
        for other in boundary:
            distance[index] = min(distance[index], max(abs(a - b) for a, b in zip(index, other)))
    return distance


@pytest.mark.parametrize("shape", [(9, 11), (5, 6, 7)], ids=["2d", "3d"])
def test_boundary_distance_matches_brute_force(shape):
    labels = np.zeros(shape, dtype=np.int64)
    labels[tuple(slice(n // 2 - 1, n // 2 + 1) for n in shape)] = 2
    result = boundary_distance(torch.from_numpy(labels)[None], max_distance=3)[0].numpy()
    np.testing.assert_array_equal(result, loop_boundary_distance(labels, cap=3))


def test_boundary_weights_fall_linearly_from_lambda_max_to_lambda_min():
    # Columns 0–2 are class 1 over all five rows. Along the middle row: column 0 touches the
    # outside (background) and columns 2–3 meet the background, so they are boundary voxels;
    # column 1 is one voxel from them; from column 4 on, the distance grows by one per column.
    labels = torch.zeros(1, 5, 30, dtype=torch.int64)
    labels[0, :, :3] = 1
    weights = boundary_weights(labels, weight_min=0.01, weight_max=1.0, margin=10)[0, 2]
    expected = [1.0, 0.901, 1.0, 1.0] + [0.01 + 0.99 * (10 - d) / 10 for d in range(1, 11)] + [0.01] * 16
    np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-6)


def test_single_label_image_gets_lambda_min_everywhere():
    weights = boundary_weights(torch.zeros(2, 9, 9, dtype=torch.int64), weight_min=0.05, weight_max=1.0, margin=4)
    torch.testing.assert_close(weights, torch.full((2, 9, 9), 0.05))


def rotation_theta(degrees: float, spatial_dims: int = 2) -> torch.Tensor:
    angle = math.radians(degrees)
    theta = torch.zeros(1, spatial_dims, spatial_dims + 1)
    theta[0, :spatial_dims, :spatial_dims] = torch.eye(spatial_dims)
    theta[0, :2, :2] = torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    return theta


def test_warp_by_a_quarter_turn_is_a_voxel_exact_rotation():
    volume = torch.arange(30.0).view(1, 1, 5, 6)[..., :5, :5].contiguous()
    rotated = warp(volume, rotation_theta(90.0))
    torch.testing.assert_close(rotated, torch.rot90(volume, k=1, dims=(-2, -1)), atol=1e-4, rtol=0)


def test_warp_then_inverse_warp_restores_the_volume():
    volume = torch.randn(2, 3, 6, 6)
    theta = torch.cat([rotation_theta(90.0), rotation_theta(-90.0)])
    torch.testing.assert_close(warp(warp(volume, theta), invert_affine(theta)), volume, atol=1e-5, rtol=0)


def test_translation_by_one_voxel_shifts_a_non_square_image():
    volume = torch.randn(1, 1, 4, 7)
    theta = torch.tensor([[[1.0, 0.0, 2.0 / 7], [0.0, 1.0, 0.0]]])  # one voxel along x (W)
    shifted = warp(volume, theta)
    torch.testing.assert_close(shifted[..., :-1], volume[..., 1:], atol=1e-5, rtol=0)
    assert shifted[..., -1].abs().max() == 0


@pytest.mark.parametrize("spatial_shape", [(6, 9), (4, 6, 9)], ids=["2d", "3d"])
def test_random_affine_composed_with_its_inverse_is_identity(spatial_shape):
    theta = random_affine(3, spatial_shape, 30.0, 0.2, 0.1, generator=torch.Generator().manual_seed(0))
    inverse = invert_affine(theta)
    dims = len(spatial_shape)
    composed = inverse[..., :dims] @ theta[..., :dims]
    torch.testing.assert_close(composed, torch.eye(dims).expand(3, dims, dims), atol=1e-5, rtol=0)
    torch.testing.assert_close(inverse[..., :dims] @ theta[..., dims:] + inverse[..., dims:],
                               torch.zeros(3, dims, 1), atol=1e-5, rtol=0)


def test_random_affine_rotates_by_right_angles_in_voxel_units_on_non_square_images():
    # A rigid rotation keeps voxel distances: the linear part in voxel units must be orthogonal.
    shape = (8, 20)
    theta = random_affine(4, shape, 90.0, 0.0, 0.0, generator=torch.Generator().manual_seed(1))
    half = torch.tensor(shape[::-1], dtype=torch.float32) / 2
    in_voxels = theta[..., :2] * half.view(1, -1, 1) / half.view(1, 1, -1)
    torch.testing.assert_close(in_voxels @ in_voxels.transpose(1, 2), torch.eye(2).expand(4, 2, 2),
                               atol=1e-5, rtol=0)


def test_random_intensity_with_zero_ranges_is_the_identity():
    images = torch.randn(2, 1, 5, 5)
    torch.testing.assert_close(random_intensity(images, 0.0, 0.0), images, atol=1e-5, rtol=0)


def tiny_model(spatial_dims: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_network("unet", 1, 3, spatial_dims=spatial_dims, channels=(4, 8), strides=(2,), num_res_units=0)
    return model.eval()


@pytest.mark.parametrize("size", [(8, 8), (4, 8, 8)], ids=["2d", "3d"])
def test_bwcr_with_an_identity_view_is_cross_entropy(size):
    model = tiny_model(len(size))
    images = torch.randn(2, 1, *size)
    _, target = random_batch((2, 3) + size, seed=2)
    logits = model(images)
    value = build_loss("bwcr", 3, **IDENTITY_VIEW)(logits, target, model=model, images=images)
    assert value.item() == pytest.approx(F.cross_entropy(logits, target).item(), abs=1e-5)


def test_bwcr_consistency_term_is_positive_for_a_random_view():
    torch.manual_seed(3)
    model = tiny_model()
    images = torch.randn(2, 1, 16, 16)
    _, target = random_batch((2, 3, 16, 16), seed=3)
    logits = model(images)
    value = build_loss("bwcr", 3)(logits, target, model=model, images=images)
    assert value.item() > F.cross_entropy(logits, target).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size", [(16, 16), (8, 16, 16)], ids=["2d", "3d"])
def test_bwcr_gives_finite_gradients_to_every_model_parameter(size, device):
    model = tiny_model(len(size)).train().to(device)
    images = torch.randn(2, 1, *size, device=device)
    _, target = random_batch((2, 3) + size, seed=4, device=device)
    build_loss("bwcr", 3)(model(images), target, model=model, images=images).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_bwcr_without_model_says_what_it_needs():
    logits, target = random_batch((2, 3, 8, 8))
    with pytest.raises(ValueError, match="needs the model and the input images"):
        build_loss("bwcr", 3)(logits, target)


def test_bwcr_refuses_images_of_another_size():
    model = tiny_model()
    logits, target = random_batch((2, 3, 8, 8))
    with pytest.raises(ValueError, match="images"):
        build_loss("bwcr", 3)(logits, target, model=model, images=torch.randn(2, 1, 16, 16))


@pytest.mark.parametrize("hparams,message", [
    ({"weight_min": 2.0}, "weight_min"),
    ({"margin": 0}, "margin"),
    ({"max_scaling": 1.0}, "max_scaling"),
    ({"noise_std": -0.1}, "noise_std"),
])
def test_bad_bwcr_hyperparameters_are_refused(hparams, message):
    with pytest.raises(ValueError, match=message):
        build_loss("bwcr", 3, **hparams)


def test_view_sampling_is_reproducible_with_a_generator():
    draws = [random_affine(2, (8, 8), generator=torch.Generator().manual_seed(5)) for _ in range(2)]
    torch.testing.assert_close(draws[0], draws[1])
    assert not torch.equal(draws[0], random_affine(2, (8, 8), generator=torch.Generator().manual_seed(6)))
