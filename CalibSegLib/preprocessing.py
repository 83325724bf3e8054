"""How a volume becomes network input: the bundle's :class:`Preprocessing` and the steps that apply it.

Training and inference call the same functions, so a model sees at inference exactly the
intensities and the physical scale it was trained on:

1. :func:`channel_intensities` (one pass over each channel of the whole volume: :func:`intensity_range`, or the
   dataset-level CT window and z-score a bundle's ``channel_normalization`` records) and :func:`scale_intensity`
   (any chunk of slices), so the predictor never holds a normalised copy of the volume;
2. :func:`network_grid_shape` + :func:`resample_slices`: every slice is resampled in-plane
   from the image's own spacing to ``Preprocessing.target_spacing`` (mm), the spacing the
   network was trained at — a scanner with 0.7 mm pixels is seen at the same physical scale
   as one with 1.5 mm pixels. Probabilities go back to the input's grid the same way. A 3D
   network's volumes are resampled along z as well (:func:`volume_grid_shape` +
   :func:`resample_volume`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "NORMALIZATIONS",
    "CHANNEL_SCHEMES",
    "ChannelNormalization",
    "Intensity",
    "MIN_IN_PLANE",
    "MAX_NETWORK_GRID",
    "Preprocessing",
    "check_volume",
    "in_plane_spacing",
    "network_grid_shape",
    "intensity_range",
    "scale_intensity",
    "normalize_intensity",
    "as_channels",
    "channel_intensities",
    "normalize_channels",
    "resample_slices",
    "volume_grid_shape",
    "resample_volume",
]

NORMALIZATIONS: tuple[str, ...] = ("percentile", "none")
# Per-channel schemes (Preprocessing.channel_normalization): "percentile" is the volume-level scheme above for that
# channel; "ct" clips to the training set's foreground percentiles and z-scores with its foreground mean and sd, so
# Hounsfield units keep their meaning across images (nnU-Net's CTNormalization); "zscore" is a per-image z-score.
CHANNEL_SCHEMES: tuple[str, ...] = ("percentile", "ct", "zscore")
# How a chunk of a channel is scaled: (low, high) clips and maps [low, high] to [0, 1]; (low, high, offset, scale)
# clips to [low, high] then maps x to (x - offset) / scale; None casts only.
Intensity = tuple[float, ...] | None
MIN_IN_PLANE = 8  # voxels; smaller slices carry too little context for a 2D network
# A slice resampled to the network's spacing larger than this (voxels per side) would need
# gigabytes per batch: 4096² voxels at 0.25 mm is a 1 m field of view.
MAX_NETWORK_GRID = 4096


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


@dataclass
class ChannelNormalization:
    """How one input channel's intensities are normalised.

    Args:
        scheme: one of :data:`CHANNEL_SCHEMES`.
        clip: ``(low, high)`` the ``"ct"`` scheme clips to (the training foreground's 0.5 and 99.5 percentiles,
            in the channel's units, e.g. HU); None for the other schemes.
        mean: the training foreground's mean after clipping (``"ct"``), else None.
        std: its standard deviation (``"ct"``), else None.
    """

    scheme: str = "percentile"
    clip: tuple[float, float] | None = None
    mean: float | None = None
    std: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.clip, list):  # as read back from JSON
            self.clip = tuple(self.clip)

    def validate(self) -> None:
        """Raise ``ValueError`` (one sentence) when the scheme is unknown or a ``"ct"`` value is missing or wrong."""
        if self.scheme not in CHANNEL_SCHEMES:
            raise ValueError(f"channel scheme {self.scheme!r} is unknown; known: {', '.join(CHANNEL_SCHEMES)}.")
        if self.scheme != "ct":
            return
        clip = self.clip
        if (not isinstance(clip, tuple) or len(clip) != 2 or not all(_is_number(value) and math.isfinite(value)
                                                                     for value in clip) or clip[0] >= clip[1]):
            raise ValueError(f"a ct channel's clip must be two finite numbers low < high, got {clip!r}.")
        if not (_is_number(self.mean) and math.isfinite(self.mean) and _is_number(self.std)
                and math.isfinite(self.std) and self.std > 0):
            raise ValueError("a ct channel needs a finite mean and a positive std, "
                             f"got {self.mean!r} and {self.std!r}.")


def _channel_from_json(item: Any) -> Any:
    """A :class:`ChannelNormalization` from its JSON object; anything else unchanged, for ``validate`` to name."""
    if not isinstance(item, dict) or not set(item) <= {"scheme", "clip", "mean", "std"}:
        return item
    return ChannelNormalization(**item)


@dataclass
class Preprocessing:
    """How a volume is turned into network input; inference uses nothing else.

    Args:
        normalization: ``"percentile"`` clips each volume to ``[min, upper_percentile]`` and
            scales it to [0, 1] (how the ACDC data were prepared); ``"none"`` leaves intensities.
        upper_percentile: the clipping percentile, in (0, 100].
        target_spacing: spacing in mm of the grid the network works on, every image resampled to it
            (training and inference alike): in-plane ``(y, x)`` for a 2D network, ``(z, y, x)`` for a
            3D one (the bundle's ``spatial_dims`` says which; it checks that the lengths agree).
        slice_axis: the array axis 2D networks step along (0 = z).
        channel_normalization: one :class:`ChannelNormalization` per input channel; None (every bundle
            written before channels had their own) applies ``normalization`` to each channel.
    """

    normalization: str = "percentile"
    upper_percentile: float = 99.0
    target_spacing: tuple[float, float] = (1.5, 1.5)
    slice_axis: int = 0
    channel_normalization: list[ChannelNormalization] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.target_spacing, list):  # as read back from JSON
            self.target_spacing = tuple(self.target_spacing)
        if isinstance(self.channel_normalization, list):  # as read back from JSON
            self.channel_normalization = [_channel_from_json(item) for item in self.channel_normalization]

    def validate(self) -> None:
        """Raise ``ValueError`` (one sentence naming the field) when a value is out of range."""
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization {self.normalization!r} is unknown; known: {', '.join(NORMALIZATIONS)}."
            )
        if not _is_number(self.upper_percentile) or not 0 < self.upper_percentile <= 100:
            raise ValueError(f"upper_percentile must lie in (0, 100], got {self.upper_percentile!r}.")
        spacing = self.target_spacing
        if (
            not isinstance(spacing, (list, tuple))
            or len(spacing) not in (2, 3)
            or not all(_is_number(value) and math.isfinite(value) and value > 0 for value in spacing)
        ):
            raise ValueError(
                "target_spacing must be two (y, x) or three (z, y, x) positive, finite spacings in mm, "
                f"got {spacing!r}."
            )
        if isinstance(self.slice_axis, bool) or self.slice_axis not in (0, 1, 2):
            raise ValueError(f"slice_axis must be 0, 1 or 2, got {self.slice_axis!r}.")
        if self.channel_normalization is not None:
            if not isinstance(self.channel_normalization, list) or not all(
                    isinstance(item, ChannelNormalization) for item in self.channel_normalization):
                raise ValueError("channel_normalization must be a list of one object per channel "
                                 '(e.g. {"scheme": "percentile"}).')
            for index, item in enumerate(self.channel_normalization):
                try:
                    item.validate()
                except ValueError as error:
                    raise ValueError(f"channel_normalization[{index}]: {error}") from None


def check_volume(
    image: np.ndarray,
    spacing: Sequence[float] | None = None,
    slice_axis: int = 0,
    min_in_plane: int = MIN_IN_PLANE,
    what: str = "image",
) -> None:
    """Raise one clear ``ValueError`` when ``image`` cannot be segmented.

    Args:
        image: ``(z, y, x)`` array.
        spacing: ``(z, y, x)`` voxel size in mm, or None to skip that check.
        slice_axis: the axis a 2D network steps along; the other two are in-plane.
        min_in_plane: smallest in-plane size (voxels) accepted.
        what: how the sentences name the volume (``"FLAIR channel"`` for one channel of several).
    """
    if not isinstance(image, np.ndarray):
        raise ValueError(f"The {what} must be a NumPy array, got {type(image).__name__}.")
    if image.ndim != 3:
        raise ValueError(
            f"The {what} must be a 3D (z, y, x) volume, got {image.ndim}D with shape {image.shape}."
        )
    if image.size == 0:
        raise ValueError(f"The {what} is empty (shape {image.shape}); give a volume with voxels in it.")
    if not (np.issubdtype(image.dtype, np.integer) or np.issubdtype(image.dtype, np.floating)):
        raise ValueError(f"The {what} must hold real numbers, got dtype {image.dtype}.")
    in_plane = tuple(size for axis, size in enumerate(image.shape) if axis != slice_axis)
    if min(in_plane) < min_in_plane:
        raise ValueError(
            f"The {what}'s slices are {in_plane[0]}×{in_plane[1]} voxels; "
            f"at least {min_in_plane}×{min_in_plane} are needed."
        )
    if np.issubdtype(image.dtype, np.floating) and not np.isfinite(image).all():
        raise ValueError(f"The {what} contains NaN or infinite values; fix or mask them before segmenting.")
    if image.min() == image.max():
        raise ValueError(
            f"The {what} is constant (every voxel is {image.flat[0]}); there is nothing to segment."
        )
    if spacing is not None:
        try:
            values = np.asarray(spacing, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            values = np.empty(0)
        if values.size != 3:
            raise ValueError(f"The spacing must be three numbers (z, y, x) in mm, got {spacing!r}.")
        in_plane = np.delete(values, slice_axis)
        if not (np.isfinite(in_plane).all() and (in_plane > 0).all()):
            raise ValueError(
                f"The {what}'s in-plane spacing {tuple(float(value) for value in in_plane)} mm is missing, "
                "zero or not finite; the model resamples slices by it, so set the image's real voxel size "
                "first."
            )


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


def scale_intensity(slices: np.ndarray, intensity: Intensity) -> np.ndarray:
    """Clip any chunk of a volume to ``intensity = (low, high)`` and scale it to [0, 1], as float32; with
    ``(low, high, offset, scale)`` clip to [low, high] and map x to ``(x - offset) / scale`` (a z-score).

    The arithmetic is float64 (then rounded to float32): in float32, ``x - low`` and
    ``high - low`` overflow for intensities near ±3e38. ``intensity=None`` (normalisation
    ``"none"``) only casts to float32. The caller's array is never changed.
    """
    if intensity is None:
        return np.array(slices, dtype=np.float32)
    low, high, *affine = intensity
    offset, scale = affine or (low, high - low)
    scaled = np.array(slices, dtype=np.float64)  # always a copy
    np.clip(scaled, low, high, out=scaled)
    scaled -= offset
    scaled /= scale
    return scaled.astype(np.float32)


def normalize_intensity(
    volume: np.ndarray, normalization: str = "percentile", upper_percentile: float = 99.0
) -> np.ndarray:
    """Whole-volume intensity normalisation to float32 (:func:`intensity_range` then :func:`scale_intensity`).

    ``percentile``: clip to ``[min, p_upper]`` and scale to [0, 1] — how the ACDC volumes were
    prepared, so applying it to them changes (almost) nothing; ``none``: cast only.
    """
    return scale_intensity(volume, intensity_range(volume, normalization, upper_percentile))


def as_channels(image: np.ndarray) -> np.ndarray:
    """``image`` as ``(K, z, y, x)``: a ``(z, y, x)`` volume is one channel (a view, no copy)."""
    return image[np.newaxis] if image.ndim == 3 else image


def _channel_intensity(channel: np.ndarray, preprocessing: Preprocessing, normalization: ChannelNormalization | None
                       ) -> Intensity:
    if normalization is None or normalization.scheme == "percentile":
        return intensity_range(channel, preprocessing.normalization, preprocessing.upper_percentile)
    if normalization.scheme == "ct":
        return (*normalization.clip, normalization.mean, normalization.std)
    mean, std = float(channel.mean(dtype=np.float64)), float(channel.std(dtype=np.float64))
    if not std > 0:
        raise ValueError("The image is constant; there is nothing to normalise or segment.")
    return (-math.inf, math.inf, mean, std)


def channel_intensities(image: np.ndarray, preprocessing: Preprocessing) -> list[Intensity]:
    """How each channel of a ``(z, y, x)`` or ``(K, z, y, x)`` volume is scaled (:func:`scale_intensity`): the
    channel's :class:`ChannelNormalization` when ``preprocessing`` records them, else ``preprocessing.normalization``
    per channel (every bundle written before channels had their own: the same numbers as before)."""
    channels = as_channels(image)
    schemes = preprocessing.channel_normalization or [None] * len(channels)
    if len(schemes) != len(channels):
        raise ValueError(f"The image has {len(channels)} channel(s) but the preprocessing describes {len(schemes)}.")
    return [_channel_intensity(channel, preprocessing, scheme) for channel, scheme in zip(channels, schemes)]


def normalize_channels(image: np.ndarray, preprocessing: Preprocessing) -> np.ndarray:
    """Whole-volume ``(K, z, y, x)`` float32 of a ``(z, y, x)`` or ``(K, z, y, x)`` volume, each channel normalised
    as :func:`channel_intensities` says."""
    channels = as_channels(image)
    return np.stack([scale_intensity(channel, intensity)
                     for channel, intensity in zip(channels, channel_intensities(channels, preprocessing))])


def in_plane_spacing(spacing: Sequence[float], slice_axis: int = 0) -> tuple[float, float]:
    """The two in-plane spacings (mm) of a ``(z, y, x)`` ``spacing``, in array order, without ``slice_axis``."""
    values = [float(value) for axis, value in enumerate(spacing) if axis != slice_axis]
    return values[0], values[1]


def network_grid_shape(
    shape: Sequence[int], spacing: Sequence[float], target_spacing: Sequence[float]
) -> tuple[int, int]:
    """In-plane ``(y, x)`` size of a slice of ``shape`` voxels at ``spacing`` mm once resampled to ``target_spacing``.

    The physical extent is kept (size × spacing), rounded to whole voxels.

    Raises:
        ValueError: the resampled slice would be smaller than :data:`MIN_IN_PLANE` or larger than
            :data:`MAX_NETWORK_GRID` voxels per side — almost always a wrong spacing in the file.
    """
    grid = tuple(max(1, int(round(size * step / target))) for size, step, target in zip(shape, spacing, target_spacing))
    if min(grid) < MIN_IN_PLANE or max(grid) > MAX_NETWORK_GRID:
        raise ValueError(
            f"A {shape[0]}×{shape[1]} slice with {spacing[0]:g}×{spacing[1]:g} mm pixels becomes {grid[0]}×{grid[1]} "
            f"voxels at the model's {target_spacing[0]:g}×{target_spacing[1]:g} mm; that is outside "
            f"{MIN_IN_PLANE}–{MAX_NETWORK_GRID}, so the image's spacing is probably wrong (check its units)."
        )
    return grid


def resample_slices(slices: torch.Tensor, size: Sequence[int], mode: str = "bilinear") -> torch.Tensor:
    """Resample ``(n, channels, y, x)`` slices in-plane to ``size`` ``(y, x)`` (``bilinear`` or ``nearest``).

    The slice's outer edges map onto each other (``align_corners=False``), so resampling to a
    grid and back lands on the original voxel centres. Bilinear shrinking is anti-aliased (a
    0.7 mm image seen at 1.5 mm looks like a 1.5 mm acquisition, not a sub-sampled one);
    slices already of ``size`` are returned unchanged.
    """
    size = tuple(int(value) for value in size)
    if tuple(slices.shape[-2:]) == size:
        return slices
    if mode == "nearest":
        return F.interpolate(slices, size=size, mode="nearest-exact")
    shrinking = size[0] < slices.shape[-2] or size[1] < slices.shape[-1]
    return F.interpolate(slices, size=size, mode=mode, align_corners=False, antialias=shrinking)


def volume_grid_shape(
    shape: Sequence[int], spacing: Sequence[float], target_spacing: Sequence[float]
) -> tuple[int, int, int]:
    """``(z, y, x)`` size of a ``(z, y, x)`` volume of ``shape`` voxels at ``spacing`` mm once resampled to a 3D
    network's ``target_spacing`` (z, y, x): the physical extent kept, at least one slice along z.

    Raises:
        ValueError: the slice spacing is not a positive number, the in-plane grid is outside the limits of
            :func:`network_grid_shape`, or z exceeds :data:`MAX_NETWORK_GRID` (a wrong spacing in the file).
    """
    if not (math.isfinite(spacing[0]) and spacing[0] > 0):
        raise ValueError(
            f"The image's slice spacing {spacing[0]:g} mm is missing, zero or not finite; a 3D model resamples the "
            "volume by it, so set the image's real voxel size first."
        )
    depth = max(1, int(round(shape[0] * spacing[0] / target_spacing[0])))
    if depth > MAX_NETWORK_GRID:
        raise ValueError(
            f"{shape[0]} slices {spacing[0]:g} mm apart become {depth} slices at the model's {target_spacing[0]:g} mm, "
            f"more than {MAX_NETWORK_GRID}; the image's spacing is probably wrong (check its units)."
        )
    return (depth, *network_grid_shape(shape[1:], spacing[1:], target_spacing[1:]))


def resample_volume(volumes: torch.Tensor, size: Sequence[int], mode: str = "trilinear") -> torch.Tensor:
    """Resample ``(n, channels, z, y, x)`` volumes to ``size`` ``(z, y, x)`` (``trilinear`` or ``nearest``), outer
    edges onto each other (``align_corners=False``) as :func:`resample_slices`; volumes already of ``size`` are
    returned unchanged."""
    size = tuple(int(value) for value in size)
    if tuple(volumes.shape[-3:]) == size:
        return volumes
    if mode == "nearest":
        return F.interpolate(volumes, size=size, mode="nearest-exact")
    return F.interpolate(volumes, size=size, mode=mode, align_corners=False)
