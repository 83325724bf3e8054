"""Neighbourhood label priors τ used by NACL and CRaC (and the SVLS soft labels).

For every voxel, a prior summarises the ground-truth labels in the ``kernel``-wide window
centred on it (``kernel × kernel`` in 2D, ``kernel³`` in 3D), centre included. Voxels
outside the image count as background (class 0): the one-hot map is zero-padded in the
foreground channels and one-padded in the background channel, the label map is
zero-padded. This is the zero padding of the papers' reference code (``nn.Unfold`` with
``padding=kernel // 2`` over the label map).

Everything here is computed with pooling, convolution and ``unfold`` views over whole
batches; no Python loop visits voxels.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

__all__ = [
    "PRIOR_KINDS",
    "neighbourhood_prior",
    "inner_region_mask",
    "window_class_counts",
    "one_hot",
    "svls_kernel",
    "check_prior_arguments",
]

PRIOR_KINDS: tuple[str, ...] = ("mean", "gaussian", "max", "min", "median", "mode")


def one_hot(target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``(B, *spatial)`` int64 labels → ``(B, C, *spatial)`` float one-hot map."""
    return F.one_hot(target, num_classes).movedim(-1, 1).float()


def check_prior_arguments(kind: str = "mean", kernel: int = 3, sigma: float = 2.0) -> None:
    """Raise a ``ValueError`` naming the first bad prior option (so losses can fail when built)."""
    if kind not in PRIOR_KINDS:
        raise ValueError(f"Unknown prior kind {kind!r}; choose one of {', '.join(PRIOR_KINDS)}.")
    if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 3 or kernel % 2 == 0:
        raise ValueError(f"kernel must be an odd window width >= 3 (3 or 5 in the papers), got {kernel!r}.")
    if kind == "gaussian" and not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be a positive number of voxels, got {sigma!r}.")


def _spatial_dims(target: torch.Tensor, kernel: int) -> int:
    """Check a label batch and a window width; return the number of spatial dimensions (2 or 3)."""
    check_prior_arguments(kernel=kernel)
    if target.dim() not in (3, 4):
        raise ValueError(f"target must be (B, H, W) or (B, D, H, W), got shape {tuple(target.shape)}.")
    if target.dtype != torch.int64:
        raise ValueError(f"target must be int64 class labels, got {target.dtype}.")
    return target.dim() - 1


def _pad(volume: torch.Tensor, kernel: int, spatial_dims: int, value: float = 0.0) -> torch.Tensor:
    """Pad every spatial side of a ``(B, C, *spatial)`` tensor by ``kernel // 2`` with ``value``."""
    return F.pad(volume, (kernel // 2,) * (2 * spatial_dims), value=value)


def _one_hot_outside_background(target: torch.Tensor, num_classes: int, kernel: int) -> torch.Tensor:
    """One-hot map padded so that every voxel outside the image is background."""
    spatial_dims = target.dim() - 1
    encoded = one_hot(target, num_classes)
    background = _pad(encoded[:, :1], kernel, spatial_dims, value=1.0)
    foreground = _pad(encoded[:, 1:], kernel, spatial_dims, value=0.0)
    return torch.cat([background, foreground], dim=1)


def _window_sum(padded: torch.Tensor, kernel: int) -> torch.Tensor:
    """Sum over each ``kernel``-wide window of an already padded ``(B, C, *spatial)`` tensor."""
    pool = F.avg_pool2d if padded.dim() == 4 else F.avg_pool3d
    # divisor_override=1 turns average pooling into an exact window sum (no /k^d then ·k^d rounding).
    return pool(padded, kernel_size=kernel, stride=1, divisor_override=1)


def _window_max(volume: torch.Tensor, kernel: int) -> torch.Tensor:
    """Max over each ``kernel``-wide window of an already padded ``(B, C, *spatial)`` tensor."""
    pool = F.max_pool2d if volume.dim() == 4 else F.max_pool3d
    return pool(volume, kernel_size=kernel, stride=1)


def window_class_counts(target: torch.Tensor, num_classes: int, kernel: int = 3) -> torch.Tensor:
    """Number of window voxels of each class, ``(B, C, *spatial)`` float; sums to ``kernel**d`` over C."""
    _spatial_dims(target, kernel)
    return _window_sum(_one_hot_outside_background(target, num_classes, kernel), kernel)


def svls_kernel(kernel: int, sigma: float, spatial_dims: int) -> torch.Tensor:
    """SVLS smoothing window, shape ``(kernel,) * spatial_dims``, summing to 1.

    Islam & Glocker (IPMI 2021) and their reference code: an isotropic Gaussian of standard
    deviation ``sigma`` voxels, normalised, whose centre weight is then set to the sum of the
    neighbours' weights, so the centre label and all its neighbours together contribute
    equally (centre weight 1/2).
    """
    check_prior_arguments("gaussian", kernel, sigma)
    offsets = torch.arange(kernel, dtype=torch.float64) - kernel // 2
    grids = torch.meshgrid(*([offsets] * spatial_dims), indexing="ij")
    squared_radius = sum(grid.square() for grid in grids)
    window = torch.exp(-squared_radius / (2.0 * sigma**2))
    centre = (kernel // 2,) * spatial_dims
    window[centre] = 0.0
    window = window / (2.0 * window.sum())
    window[centre] = 0.5
    return window.float()


def _mean_prior(target: torch.Tensor, num_classes: int, kernel: int, sigma: float) -> torch.Tensor:
    return window_class_counts(target, num_classes, kernel) / kernel ** (target.dim() - 1)


def _gaussian_prior(target: torch.Tensor, num_classes: int, kernel: int, sigma: float) -> torch.Tensor:
    padded = _one_hot_outside_background(target, num_classes, kernel)
    weights = svls_kernel(kernel, sigma, target.dim() - 1).to(padded.device)
    weights = weights.expand(num_classes, 1, *weights.shape).contiguous()
    conv = F.conv2d if target.dim() == 3 else F.conv3d
    return conv(padded, weights, groups=num_classes)


def _padded_labels(target: torch.Tensor, kernel: int) -> torch.Tensor:
    """``(B, 1, *padded spatial)`` float label map, outside = background (labels are small integers,
    exact in float32)."""
    return _pad(target.unsqueeze(1).float(), kernel, target.dim() - 1)


def _window_max_label(target: torch.Tensor, kernel: int) -> torch.Tensor:
    return _window_max(_padded_labels(target, kernel), kernel).squeeze(1).long()


def _window_min_label(target: torch.Tensor, kernel: int) -> torch.Tensor:
    return (-_window_max(-_padded_labels(target, kernel), kernel)).squeeze(1).long()


def _window_median_label(target: torch.Tensor, kernel: int) -> torch.Tensor:
    padded = _padded_labels(target, kernel).squeeze(1)
    for dim in range(1, target.dim()):
        padded = padded.unfold(dim, kernel, 1)
    windows = padded.reshape(*target.shape, -1)
    # Windows hold an odd number of voxels, so the median is one of the window's labels.
    return windows.median(dim=-1).values.long()


def _window_mode_label(target: torch.Tensor, kernel: int, num_classes: int) -> torch.Tensor:
    # argmax returns the first maximum: ties resolve to the smallest label id.
    return window_class_counts(target, num_classes, kernel).argmax(dim=1)


_LABEL_STATISTICS: dict[str, Callable[[torch.Tensor, int, int], torch.Tensor]] = {
    "max": lambda target, kernel, num_classes: _window_max_label(target, kernel),
    "min": lambda target, kernel, num_classes: _window_min_label(target, kernel),
    "median": lambda target, kernel, num_classes: _window_median_label(target, kernel),
    "mode": _window_mode_label,
}


def _label_statistic_prior(kind: str) -> Callable[[torch.Tensor, int, int, float], torch.Tensor]:
    statistic = _LABEL_STATISTICS[kind]

    def prior(target: torch.Tensor, num_classes: int, kernel: int, sigma: float) -> torch.Tensor:
        return one_hot(statistic(target, kernel, num_classes), num_classes)

    return prior


_PRIORS: dict[str, Callable[[torch.Tensor, int, int, float], torch.Tensor]] = {
    "mean": _mean_prior,
    "gaussian": _gaussian_prior,
    **{kind: _label_statistic_prior(kind) for kind in _LABEL_STATISTICS},
}


def neighbourhood_prior(
    target: torch.Tensor, num_classes: int, kernel: int = 3, kind: str = "mean", sigma: float = 2.0
) -> torch.Tensor:
    """Neighbourhood prior τ of a label map (NACL, Murugesan et al. MICCAI 2023 and journal §4.2.4).

    Args:
        target: ``(B, H, W)`` or ``(B, D, H, W)`` int64 labels in ``[0, num_classes)``.
        num_classes: number of classes C, background included.
        kernel: odd window width, 3 (default) or 5 in the papers; windows are 2D or 3D as the target.
        kind: ``mean`` (default) — fraction of window voxels of each class (NACL, CRaC);
            ``gaussian`` — the SVLS soft label, window weights from :func:`svls_kernel` with ``sigma``;
            ``max``/``min``/``median``/``mode`` — that statistic of the window's label ids,
            one-hot encoded (``mode`` ties go to the smallest label id).
        sigma: Gaussian standard deviation in voxels, for ``gaussian`` only (2).

    Returns:
        τ of shape ``(B, C, *spatial)``, float, summing to 1 over C at every voxel.
    """
    check_prior_arguments(kind, kernel, sigma)
    _spatial_dims(target, kernel)
    return _PRIORS[kind](target, num_classes, kernel, sigma)


def inner_region_mask(target: torch.Tensor, kernel: int = 3) -> torch.Tensor:
    """CRaC's *inner* voxels: ``(B, *spatial)`` bool, True where the whole window holds one label.

    The rest are *outer* (boundary) voxels. Outside the image counts as background, so a
    voxel whose window reaches past the border is inner only when it and all its in-image
    neighbours are background; foreground touching the border is outer.
    """
    _spatial_dims(target, kernel)
    return _window_max_label(target, kernel) == _window_min_label(target, kernel)
