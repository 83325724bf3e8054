"""Neighbourhood label priors τ used by NACL and CRaC (and the SVLS soft labels).

For every voxel, a prior summarises the ground-truth labels in the ``kernel``-wide window
centred on it (``kernel × kernel`` in 2D, ``kernel³`` in 3D), centre included. Voxels
outside the image count as background (class 0), as the papers' zero padding of the
one-hot map does for the background channel.

Everything here is computed with pooling, convolution and ``unfold`` views over whole
batches; no Python loop visits voxels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["PRIOR_KINDS", "neighbourhood_prior", "inner_region_mask", "one_hot", "gaussian_kernel"]

PRIOR_KINDS: tuple[str, ...] = ("mean", "gaussian", "max", "min", "median", "mode")


def one_hot(target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``(B, *spatial)`` int64 labels → ``(B, C, *spatial)`` float one-hot map."""
    encoded = F.one_hot(target, num_classes)
    return encoded.movedim(-1, 1).float()


def _check_window(target: torch.Tensor, kernel: int) -> int:
    if target.dim() not in (3, 4):
        raise ValueError(f"target must be (B, H, W) or (B, D, H, W), got shape {tuple(target.shape)}.")
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"kernel must be a positive odd number, got {kernel}.")
    return target.dim() - 1


def _pad_as_background(volume: torch.Tensor, kernel: int, spatial_dims: int, value: float = 0.0) -> torch.Tensor:
    half = kernel // 2
    return F.pad(volume, (half, half) * spatial_dims, value=value)


def _windows(target: torch.Tensor, kernel: int) -> torch.Tensor:
    """``(B, *spatial)`` labels → ``(B, *spatial, kernel**d)`` label windows (outside = background)."""
    spatial_dims = _check_window(target, kernel)
    padded = _pad_as_background(target, kernel, spatial_dims)
    for dim in range(1, spatial_dims + 1):
        padded = padded.unfold(dim, kernel, 1)
    return padded.reshape(*target.shape, kernel**spatial_dims)


def _window_class_counts(target: torch.Tensor, num_classes: int, kernel: int) -> torch.Tensor:
    """Number of window voxels of each class, ``(B, C, *spatial)`` float."""
    spatial_dims = _check_window(target, kernel)
    encoded = one_hot(target, num_classes)
    # Outside the image is background: pad the background channel with ones, the others with zeros.
    background = _pad_as_background(encoded[:, :1], kernel, spatial_dims, value=1.0)
    foreground = _pad_as_background(encoded[:, 1:], kernel, spatial_dims, value=0.0)
    padded = torch.cat([background, foreground], dim=1)
    pool = F.avg_pool2d if spatial_dims == 2 else F.avg_pool3d
    return pool(padded, kernel_size=kernel, stride=1) * kernel**spatial_dims


def gaussian_kernel(kernel: int, sigma: float, spatial_dims: int) -> torch.Tensor:
    """Normalised isotropic Gaussian window, shape ``(kernel,) * spatial_dims``, summing to 1."""
    offsets = torch.arange(kernel, dtype=torch.float64) - kernel // 2
    profile = torch.exp(-(offsets**2) / (2.0 * sigma**2))
    window = profile
    for _ in range(spatial_dims - 1):
        window = window.unsqueeze(-1) * profile
    return (window / window.sum()).float()


def _gaussian_prior(target: torch.Tensor, num_classes: int, kernel: int, sigma: float) -> torch.Tensor:
    spatial_dims = _check_window(target, kernel)
    encoded = one_hot(target, num_classes)
    background = _pad_as_background(encoded[:, :1], kernel, spatial_dims, value=1.0)
    foreground = _pad_as_background(encoded[:, 1:], kernel, spatial_dims, value=0.0)
    padded = torch.cat([background, foreground], dim=1)
    weights = gaussian_kernel(kernel, sigma, spatial_dims).to(padded.device)
    weights = weights.expand(num_classes, 1, *weights.shape).contiguous()
    conv = F.conv2d if spatial_dims == 2 else F.conv3d
    return conv(padded, weights, groups=num_classes)


def _label_statistic(target: torch.Tensor, num_classes: int, kernel: int, kind: str) -> torch.Tensor:
    if kind == "mode":
        # argmax returns the first maximum, so ties resolve to the smallest label id.
        labels = _window_class_counts(target, num_classes, kernel).argmax(dim=1)
    else:
        windows = _windows(target, kernel)
        if kind == "max":
            labels = windows.amax(dim=-1)
        elif kind == "min":
            labels = windows.amin(dim=-1)
        else:  # median: windows have an odd number of voxels, so the median is a window label.
            labels = windows.median(dim=-1).values
    return one_hot(labels, num_classes)


def neighbourhood_prior(
    target: torch.Tensor, num_classes: int, kernel: int = 3, kind: str = "mean", sigma: float = 2.0
) -> torch.Tensor:
    """Neighbourhood prior τ of a label map.

    Args:
        target: ``(B, H, W)`` or ``(B, D, H, W)`` int64 labels in ``[0, num_classes)``.
        num_classes: number of classes C, background included.
        kernel: odd window width (3 or 5 in the papers).
        kind: ``mean`` — fraction of window voxels of each class (NACL, CRaC);
            ``gaussian`` — Gaussian-weighted fractions with ``sigma`` (the SVLS soft label);
            ``max``/``min``/``median``/``mode`` — that statistic of the window's label ids,
            one-hot encoded (NACL journal variants; ``mode`` ties go to the smallest label).
        sigma: Gaussian standard deviation in voxels, for ``gaussian`` only.

    Returns:
        τ of shape ``(B, C, *spatial)``, float, summing to 1 over C at every voxel.
    """
    if kind not in PRIOR_KINDS:
        raise ValueError(f"Unknown prior kind {kind!r}; choose one of {', '.join(PRIOR_KINDS)}.")
    if kind == "mean":
        spatial_dims = _check_window(target, kernel)
        return _window_class_counts(target, num_classes, kernel) / kernel**spatial_dims
    if kind == "gaussian":
        if not math.isfinite(sigma) or sigma <= 0:
            raise ValueError(f"sigma must be a positive number, got {sigma}.")
        return _gaussian_prior(target, num_classes, kernel, sigma)
    return _label_statistic(target, num_classes, kernel, kind)


def inner_region_mask(target: torch.Tensor, kernel: int = 3) -> torch.Tensor:
    """``(B, *spatial)`` bool: True where every voxel of the window has the voxel's label.

    These are CRaC's *inner* voxels; the rest (label boundaries, and foreground touching
    the image border, since outside counts as background) are *outer* voxels.
    """
    windows = _windows(target, kernel)
    return (windows.amax(dim=-1) == windows.amin(dim=-1))
