"""What the input check measures on one volume and its label map (:func:`observe_volume`).

Every channel is scaled to [0, 1] as the network's input is clipped (:func:`check_intensities`): an MRI channel over
its own [min, p99], so a raw scanner file and a volume stored already scaled to [0, 1] give the same numbers; a CT
channel over its fixed training Hounsfield window, so a CT whose rescale intercept was lost, every value 1024 too
high, is unlike its training CTs although its histogram has their shape. The unit is a share of that range, the one
the thresholds were decided in. What is compared, per family of
:data:`~CalibSegLib.input_check.statistics.FAMILIES`:

- ``intensity``: the :data:`~CalibSegLib.input_check.statistics.QUANTILE_LEVELS` quantiles of the whole normalised
  volume (the shape of its histogram). Cine MRI is mostly dark with bright blood; an inverted copy, a CT in
  Hounsfield units (air at the minimum, soft tissue and bone near the top) or uniform noise is not.
- ``structure_intensity``: the median normalised intensity inside each predicted structure (in
  cine MRI the left-ventricle cavity is bright, the myocardium dark); structures predicted nowhere
  are not compared here.
- ``structure_volume``: each structure's predicted volume in mL; a structure predicted nowhere is
  always a reason (every training volume has each structure).
- ``geometry``: the in-plane pixel spacing as a multiple of the model's grid (``target_spacing``),
  judged by what resampling can take (:data:`~CalibSegLib.input_check.excursions.RESAMPLING_RANGE`), not by the
  training volumes' spacings (ACDC's HDF5 files carry none, so every training volume sits at the nominal 1.5 mm);
  and the field of view (mm) against the training range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from CalibSegLib.input_check.statistics import QUANTILE_LEVELS
from CalibSegLib.preprocessing import Preprocessing, as_channels, in_plane_spacing, intensity_range, scale_intensity

__all__ = ["ObservationMetadata", "VolumeObservation", "check_intensities", "observe_volume"]


class ObservationMetadata(Protocol):
    """What observing a model's volumes reads of its bundle's metadata (:class:`CalibSegLib.bundle.BundleMetadata` is
    one): its classes, background first, and its preprocessing. Named here, the input check needs no bundle: the
    bundle stores the check's statistics, so it sits above the check."""

    @property
    def class_names(self) -> Sequence[str]: ...

    @property
    def preprocessing(self) -> Preprocessing: ...


@dataclass(frozen=True)
class VolumeObservation:
    """What :func:`observe_volume` measures on one volume.

    ``quantiles``: ``(channels, len(QUANTILE_LEVELS))`` normalised intensities; ``structure_intensity``:
    per structure the median normalised intensity inside it (first channel), None where it is absent;
    ``structure_volume_ml``: per structure its volume in mL (0 when absent); ``spacing_mm`` and
    ``field_of_view_mm``: the two in-plane values, mm; ``grid_mm``: the in-plane spacing (mm) of the
    model's grid, which the slices are resampled to.
    """

    quantiles: np.ndarray
    structure_intensity: dict[str, float | None]
    structure_volume_ml: dict[str, float]
    spacing_mm: tuple[float, float]
    field_of_view_mm: tuple[float, float]
    grid_mm: tuple[float, float]


def check_intensities(image: np.ndarray, preprocessing: Preprocessing) -> np.ndarray:
    """The ``(K, z, y, x)`` float32 channels of a ``(z, y, x)`` or ``(K, z, y, x)`` volume in the units the check
    compares, [0, 1]: a ``"ct"`` channel clipped to its training window (the clip the network's input gets, before
    its z-score, which would make the unit one foreground sd, a few HU), every other channel over its own
    ``preprocessing.normalization`` range (the network z-scores a ``"zscore"`` channel per image instead: the same
    shape of histogram, in other units)."""
    channels = as_channels(image)
    schemes = preprocessing.channel_normalization or [None] * len(channels)
    return np.stack([scale_intensity(channel, scheme.clip if scheme is not None and scheme.scheme == "ct" else
                                     intensity_range(channel, preprocessing.normalization,
                                                     preprocessing.upper_percentile))
                     for channel, scheme in zip(channels, schemes)])


def observe_volume(channels: np.ndarray | Sequence[np.ndarray], spacing: Sequence[float], labels: np.ndarray,
                   class_names: Sequence[str], preprocessing: Preprocessing | None = None) -> VolumeObservation:
    """The statistics of one volume and its label map.

    Args:
        channels: the ``(z, y, x)`` volume, its ``(K, z, y, x)`` channels, or one volume per input channel, as
            read (any real dtype); each channel's intensities are compared on their own.
        spacing: its ``(z, y, x)`` voxel size in mm.
        labels: ``(z, y, x)`` integer labels on the same grid: the reference when fitting, the
            prediction when checking; class ``k`` is ``class_names[k]``, 0 the background.
        preprocessing: the bundle's :class:`~CalibSegLib.preprocessing.Preprocessing` (default: each channel
            scaled per image to [min, p99], slices along axis 0).
    """
    preprocessing = preprocessing or Preprocessing()
    image = channels if isinstance(channels, np.ndarray) else np.stack(list(channels))
    normalized = check_intensities(image, preprocessing)
    quantiles = np.stack([np.quantile(volume, QUANTILE_LEVELS) for volume in normalized]).astype(np.float64)
    voxel_ml = float(np.prod([float(value) for value in spacing])) / 1000.0
    intensity: dict[str, float | None] = {}
    volume_ml: dict[str, float] = {}
    for label, name in enumerate(class_names[1:], start=1):
        mask = labels == label
        count = int(np.count_nonzero(mask))
        volume_ml[name] = count * voxel_ml
        intensity[name] = float(np.median(normalized[0][mask])) if count else None
    pixel = in_plane_spacing(spacing, preprocessing.slice_axis)
    shape = [size for axis, size in enumerate(labels.shape) if axis != preprocessing.slice_axis]
    grid = preprocessing.target_spacing[-2:]  # a 3D model's (z, y, x) grid: its in-plane pair
    return VolumeObservation(quantiles, intensity, volume_ml, pixel,
                             (shape[0] * pixel[0], shape[1] * pixel[1]), (float(grid[0]), float(grid[1])))
