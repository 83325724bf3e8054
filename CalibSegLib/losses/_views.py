"""Random second views of an image batch for consistency losses (BWCR).

A view is a random affine warp (rotation in the in-plane ``(H, W)`` axes, isotropic
scaling, translation) followed by a random intensity change (gamma, Gaussian noise).
The warp is returned with the view so that the view's outputs can be warped back onto
the original grid and compared voxel by voxel.

Affine matrices ``theta`` are ``(B, d, d + 1)`` in the normalised coordinates of
:func:`torch.nn.functional.affine_grid` (``align_corners=False``, coordinate order
x = W, y = H, z = D): for every output location they give the input location it samples.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["random_affine", "invert_affine", "warp", "random_intensity", "valid_after_warp"]


def _draw_device(generator: torch.Generator | None, device: torch.device | str) -> torch.device:
    """Random numbers are drawn where the generator lives (the target device without one)."""
    return generator.device if generator is not None else torch.device(device)


def _uniform(
    shape: tuple[int, ...], bound: float, device: torch.device | str, generator: torch.Generator | None
) -> torch.Tensor:
    """Samples from U(−bound, bound) on ``device``."""
    draws = torch.rand(shape, generator=generator, device=_draw_device(generator, device))
    return ((draws * 2.0 - 1.0) * bound).to(device)


def random_affine(
    batch: int,
    spatial_shape: tuple[int, ...],
    max_rotation: float = 15.0,
    max_scaling: float = 0.1,
    max_translation: float = 0.05,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One random affine map per image, ``(B, d, d + 1)`` float32.

    Args:
        batch: B.
        spatial_shape: ``(H, W)`` or ``(D, H, W)`` in voxels (rotations are made isotropic in voxels).
        max_rotation: in-plane rotation angle drawn from U(−max, max), degrees.
        max_scaling: scale factor drawn from 1 + U(−max, max), the same along every axis.
        max_translation: shift along each axis drawn from U(−max, max), as a fraction of the image size.
        device: where the matrices live.
        generator: optional CPU generator for reproducible draws.
    """
    spatial_dims = len(spatial_shape)
    # The matrices are tiny: build them on the CPU, move them once.
    angle = _uniform((batch,), math.radians(max_rotation), "cpu", generator)
    scale = 1.0 + _uniform((batch,), max_scaling, "cpu", generator)
    shift = _uniform((batch, spatial_dims), 2.0 * max_translation, "cpu", generator)
    rotation = torch.eye(spatial_dims).repeat(batch, 1, 1)
    cos, sin = torch.cos(angle), torch.sin(angle)
    rotation[:, 0, 0], rotation[:, 0, 1], rotation[:, 1, 0], rotation[:, 1, 1] = cos, -sin, sin, cos
    # Rotate in voxel units, not normalised ones, so non-square images are not sheared:
    # A = S⁻¹ R S with S = diag(size / 2) in the grid's (x, y, z) order.
    half_size = torch.tensor(spatial_shape[::-1], dtype=torch.float32) / 2.0
    linear = (rotation * half_size.view(1, 1, -1)) / half_size.view(1, -1, 1) * scale.view(-1, 1, 1)
    return torch.cat([linear, shift.unsqueeze(-1)], dim=-1).to(device)


def invert_affine(theta: torch.Tensor) -> torch.Tensor:
    """The inverse maps of ``(B, d, d + 1)`` affine matrices: ``[A | t]⁻¹ = [A⁻¹ | −A⁻¹ t]``."""
    inverse_linear = torch.linalg.inv(theta[..., :-1])
    return torch.cat([inverse_linear, -(inverse_linear @ theta[..., -1:])], dim=-1)


def warp(volume: torch.Tensor, theta: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    """Resample ``(B, C, *spatial)`` with ``theta``; samples outside the volume are 0."""
    grid = F.affine_grid(theta.to(volume.dtype), list(volume.shape), align_corners=False)
    return F.grid_sample(volume, grid, mode=mode, padding_mode="zeros", align_corners=False)


def valid_after_warp(reference: torch.Tensor, theta: torch.Tensor, tolerance: float = 1e-4) -> torch.Tensor:
    """``(B, 1, *spatial)`` float mask of the voxels whose ``theta`` sample lies wholly inside the volume
    (shape taken from ``reference``), i.e. where interpolation mixed in no padding."""
    ones = torch.ones_like(reference[:, :1])
    return (warp(ones, theta) >= 1.0 - tolerance).to(reference.dtype)


def random_intensity(
    images: torch.Tensor,
    max_log_gamma: float = 0.4,
    noise_std: float = 0.03,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Per image of a ``(B, channels, *spatial)`` batch: gamma ``exp(U(−max, max))`` on min–max
    normalised intensities, then Gaussian noise of ``noise_std`` times the intensity range."""
    batch = images.shape[0]
    reduce_dims = tuple(range(1, images.dim()))
    low = images.amin(dim=reduce_dims, keepdim=True)
    span = (images.amax(dim=reduce_dims, keepdim=True) - low).clamp_min(1e-6)
    shape = (batch,) + (1,) * (images.dim() - 1)
    gamma = torch.exp(_uniform(shape, max_log_gamma, images.device, generator)).to(images.dtype)
    noise = torch.randn(images.shape, generator=generator, device=_draw_device(generator, images.device))
    noise = noise.to(images.device, images.dtype) * noise_std
    return ((((images - low) / span).clamp(0.0, 1.0) ** gamma) + noise) * span + low
