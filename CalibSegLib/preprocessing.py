"""Bundle-driven preprocessing steps shared by training and inference.

Training and inference call the same functions, so a model sees at inference exactly the
intensities and in-plane size it was trained on.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["NORMALIZATIONS", "normalize_intensity", "resize_slices", "check_volume"]

NORMALIZATIONS: tuple[str, ...] = ("percentile", "none")


def check_volume(image: np.ndarray, spacing: Sequence[float] | None = None, min_in_plane: int = 8) -> None:
    """Raise one clear ``ValueError`` when ``image`` cannot be segmented.

    Args:
        image: ``(z, y, x)`` array.
        spacing: ``(z, y, x)`` voxel size in mm, or None to skip that check.
        min_in_plane: smallest in-plane size (voxels) a 2D network can use.
    """
    if not isinstance(image, np.ndarray):
        raise ValueError(f"image must be a NumPy array, got {type(image).__name__}.")
    if image.ndim != 3:
        raise ValueError(f"image must be a 3D (z, y, x) volume, got {image.ndim}D with shape {image.shape}.")
    if image.size == 0:
        raise ValueError(f"image is empty (shape {image.shape}).")
    if min(image.shape[1:]) < min_in_plane:
        raise ValueError(f"image slices are {image.shape[1]}×{image.shape[2]} voxels; at least {min_in_plane} are needed.")
    if not np.issubdtype(image.dtype, np.number) or np.issubdtype(image.dtype, np.complexfloating):
        raise ValueError(f"image must hold real numbers, got dtype {image.dtype}.")
    if np.issubdtype(image.dtype, np.floating) and not np.isfinite(image).all():
        raise ValueError("image contains NaN or infinite values; fix or mask them before segmenting.")
    if image.min() == image.max():
        raise ValueError(f"image is constant (every voxel is {image.flat[0]}); there is nothing to segment.")
    if spacing is not None:
        values = tuple(float(value) for value in spacing)
        if len(values) != 3 or not all(np.isfinite(value) and value > 0 for value in values):
            raise ValueError(f"spacing must be three positive numbers (z, y, x) in mm, got {tuple(spacing)}.")


def normalize_intensity(volume: np.ndarray, normalization: str = "percentile", upper_percentile: float = 99.0) -> np.ndarray:
    """Per-volume intensity normalisation to float32.

    ``percentile``: clip to ``[min, p_upper]`` and scale to [0, 1] — how the ACDC volumes
    were prepared, so applying it to them changes (almost) nothing; ``none``: cast only.
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"Unknown normalization {normalization!r}; choose one of {', '.join(NORMALIZATIONS)}.")
    volume = np.asarray(volume, dtype=np.float32)
    if normalization == "none":
        return volume
    low = float(volume.min())
    high = float(np.percentile(volume, upper_percentile))
    if high <= low:
        high = float(volume.max())
    if high <= low:
        raise ValueError("image is constant; there is nothing to normalise or segment.")
    normalized = np.clip(volume, low, high)
    normalized -= low
    normalized /= high - low
    return normalized


def resize_slices(slices: torch.Tensor, size: Sequence[int], mode: str = "bilinear") -> torch.Tensor:
    """Resize ``(n, channels, y, x)`` slices in-plane to ``size`` (``bilinear`` or ``nearest``).

    Bilinear uses ``align_corners=False`` both ways, so resizing logits back lands on the
    input's voxel centres.
    """
    size = tuple(int(value) for value in size)
    if tuple(slices.shape[-2:]) == size:
        return slices
    if mode == "nearest":
        return F.interpolate(slices, size=size, mode="nearest-exact")
    return F.interpolate(slices, size=size, mode=mode, align_corners=False)
