"""Bundle-driven preprocessing steps shared by training and inference.

Training and inference call the same functions, so a model sees at inference exactly the
intensities and in-plane size it was trained on. Intensity normalisation is split into
:func:`intensity_range` (one pass over the whole volume) and :func:`scale_intensity` (any
chunk of slices), so the predictor never holds a normalised copy of the volume.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "NORMALIZATIONS",
    "MIN_IN_PLANE",
    "check_volume",
    "intensity_range",
    "scale_intensity",
    "normalize_intensity",
    "resize_slices",
]

NORMALIZATIONS: tuple[str, ...] = ("percentile", "none")
MIN_IN_PLANE = 8  # voxels; smaller slices carry too little context for a 2D network


def check_volume(
    image: np.ndarray,
    spacing: Sequence[float] | None = None,
    slice_axis: int = 0,
    min_in_plane: int = MIN_IN_PLANE,
) -> None:
    """Raise one clear ``ValueError`` when ``image`` cannot be segmented.

    Args:
        image: ``(z, y, x)`` array.
        spacing: ``(z, y, x)`` voxel size in mm, or None to skip that check.
        slice_axis: the axis a 2D network steps along; the other two are in-plane.
        min_in_plane: smallest in-plane size (voxels) accepted.
    """
    if not isinstance(image, np.ndarray):
        raise ValueError(f"The image must be a NumPy array, got {type(image).__name__}.")
    if image.ndim != 3:
        raise ValueError(
            f"The image must be a 3D (z, y, x) volume, got {image.ndim}D with shape {image.shape}."
        )
    if image.size == 0:
        raise ValueError(f"The image is empty (shape {image.shape}); give a volume with voxels in it.")
    if not (np.issubdtype(image.dtype, np.integer) or np.issubdtype(image.dtype, np.floating)):
        raise ValueError(f"The image must hold real numbers, got dtype {image.dtype}.")
    in_plane = tuple(size for axis, size in enumerate(image.shape) if axis != slice_axis)
    if min(in_plane) < min_in_plane:
        raise ValueError(
            f"The image's slices are {in_plane[0]}×{in_plane[1]} voxels; "
            f"at least {min_in_plane}×{min_in_plane} are needed."
        )
    if np.issubdtype(image.dtype, np.floating) and not np.isfinite(image).all():
        raise ValueError("The image contains NaN or infinite values; fix or mask them before segmenting.")
    if image.min() == image.max():
        raise ValueError(
            f"The image is constant (every voxel is {image.flat[0]}); there is nothing to segment."
        )
    if spacing is not None:
        try:
            values = np.asarray(spacing, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            values = np.empty(0)
        if values.size != 3 or not (np.isfinite(values).all() and (values > 0).all()):
            raise ValueError(f"The spacing must be three positive numbers (z, y, x) in mm, got {spacing!r}.")


def intensity_range(
    volume: np.ndarray, normalization: str = "percentile", upper_percentile: float = 99.0
) -> tuple[float, float] | None:
    """The ``(low, high)`` intensities a whole volume is scaled by, or None for ``"none"``.

    ``percentile``: ``low`` = volume minimum, ``high`` = its ``upper_percentile`` percentile
    (the maximum when the percentile equals the minimum, as in mostly-empty volumes). Both are
    float64, so float32 intensities up to ±3.4e38 give a finite range.

    Raises:
        ValueError: unknown normalisation, a constant volume, or a range too wide for float64.
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(
            f"Unknown normalization {normalization!r}; choose one of {', '.join(NORMALIZATIONS)}."
        )
    if normalization == "none":
        return None
    low = float(volume.min())
    high = _percentile(volume, upper_percentile)
    if high <= low:
        high = float(volume.max())
    if high <= low:
        raise ValueError("The image is constant; there is nothing to normalise or segment.")
    if not math.isfinite(high - low):
        raise ValueError(
            f"The image's intensities span [{low:.3g}, {high:.3g}], too wide to normalise; rescale the image."
        )
    return low, high


def _percentile(volume: np.ndarray, q: float) -> float:
    """NumPy's default (linear) ``q``-th percentile, interpolated in float64.

    ``np.percentile`` interpolates in the volume's dtype, which overflows float32 between
    neighbours such as -3e38 and 3e38; the two order statistics are found the same way
    (a partition, one copy of the volume) and only the interpolation changes.
    """
    flat = np.ravel(volume)
    position = q / 100.0 * (flat.size - 1)
    below = math.floor(position)
    above = min(below + 1, flat.size - 1)
    ordered = np.partition(flat, (below, above))
    low, high = float(ordered[below]), float(ordered[above])
    return low + (high - low) * (position - below)


def scale_intensity(slices: np.ndarray, intensity: tuple[float, float] | None) -> np.ndarray:
    """Clip any chunk of a volume to ``intensity = (low, high)`` and scale it to [0, 1], as float32.

    The arithmetic is float64 (then rounded to float32): in float32, ``x - low`` and
    ``high - low`` overflow for intensities near ±3e38. ``intensity=None`` (normalisation
    ``"none"``) only casts to float32. The caller's array is never changed.
    """
    if intensity is None:
        return np.array(slices, dtype=np.float32)
    low, high = intensity
    scaled = np.array(slices, dtype=np.float64)  # always a copy
    np.clip(scaled, low, high, out=scaled)
    scaled -= low
    scaled /= high - low
    return scaled.astype(np.float32)


def normalize_intensity(
    volume: np.ndarray, normalization: str = "percentile", upper_percentile: float = 99.0
) -> np.ndarray:
    """Whole-volume intensity normalisation to float32 (:func:`intensity_range` then :func:`scale_intensity`).

    ``percentile``: clip to ``[min, p_upper]`` and scale to [0, 1] — how the ACDC volumes were
    prepared, so applying it to them changes (almost) nothing; ``none``: cast only.
    """
    return scale_intensity(volume, intensity_range(volume, normalization, upper_percentile))


def resize_slices(slices: torch.Tensor, size: Sequence[int], mode: str = "bilinear") -> torch.Tensor:
    """Resize ``(n, channels, y, x)`` slices in-plane to ``size`` ``(y, x)`` (``bilinear`` or ``nearest``).

    Bilinear uses ``align_corners=False`` both ways, so resizing logits back lands on the
    input's voxel centres; slices already of ``size`` are returned unchanged.
    """
    size = tuple(int(value) for value in size)
    if tuple(slices.shape[-2:]) == size:
        return slices
    if mode == "nearest":
        return F.interpolate(slices, size=size, mode="nearest-exact")
    return F.interpolate(slices, size=size, mode=mode, align_corners=False)
