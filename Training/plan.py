"""The data plan: what a training run reads from its training cases before it starts (nnU-Net's experiment
planning, kept small).

:func:`make_plan` gives

- the target spacing: the median spacing of the training cases (per axis; the in-plane pair for 2D networks);
- the median shape at that spacing;
- a 2D patch: square, no larger than the schedule's (``preferred``: 128 quick, 224 ``--paper``) nor than the median
  slice's longer side, a multiple of :data:`PATCH_MULTIPLE` (ACDC's slices are 256 voxels long at 1.5 mm, so its
  recipe comes out unchanged);
- a 3D patch: the median shape, shrunk along its longest axis (in mm) until it holds at most
  ``voxel_budget`` voxels, each side a multiple of :data:`PATCH_MULTIPLE`;
- per channel the foreground intensity statistics (mean, sd, 0.5 and 99.5 percentiles over the training
  cases' labelled voxels), from which a channel named ``CT`` gets its dataset-level normalisation; every other
  channel is z-scored per image without clipping, as nnU-Net does, except ACDC's, which keep the per-image
  percentile scaling the shipped models were trained with (:func:`channel_normalization`,
  :func:`default_scheme`).

Every value is overridden by its flag (``--target-spacing``, ``--patch-size``); the plan is printed at the start
and written to ``run.json`` and the bundle's ``training.plan``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from CalibSegLib.preprocessing import (ChannelNormalization, as_channels, in_plane_spacing,
                                       network_grid_shape, volume_grid_shape)
from Datasets.cases import ACDC_DATASET, SAMPLE_DATASET, Case, DataError

__all__ = ["PATCH_MULTIPLE", "VOXEL_BUDGET_3D", "CT_CHANNEL", "IMAGE_SCHEMES", "ChannelStatistics", "Plan",
           "foreground_statistics", "default_scheme", "channel_normalization", "patch_2d", "patch_3d",
           "largest_extent", "make_plan"]

# Crops are halved four times by the default UNet (strides 2, 2, 2, 2): each side a multiple of 16.
PATCH_MULTIPLE = 16
# A 3D patch of at most 128³ voxels: a batch of 2 with MONAI's UNet (16-256 channels) fits in about 8 GiB.
VOXEL_BUDGET_3D = 128 ** 3
CT_CHANNEL = "CT"  # the dataset.json channel name that selects the dataset-level CT normalisation
# How a channel other than CT may be normalised per image (calibseg-train --normalization): "zscore" keeps
# every intensity apart (an affine map, nothing clipped), so a small bright structure stays brighter than all
# the tissue around it; "percentile" clips at the image's 99th percentile: everything brighter is one value.
IMAGE_SCHEMES: tuple[str, ...] = ("zscore", "percentile")
# Foreground voxels read per case and channel (nnU-Net reads 10,000): enough for the percentiles, bounded memory.
_VOXELS_PER_CASE = 10_000


@dataclass(frozen=True)
class ChannelStatistics:
    """Intensities of one channel inside the training labels' foreground, in the channel's own units."""

    name: str
    mean: float
    std: float
    percentile_00_5: float
    percentile_99_5: float


@dataclass(frozen=True)
class Plan:
    """What :func:`make_plan` read from the training cases; ``target_spacing`` and ``median_shape`` (z, y, x) mm and
    voxels, ``patch_2d`` (y, x) and ``patch_3d`` (z, y, x) voxels at that spacing."""

    target_spacing: tuple[float, float, float]
    median_shape: tuple[int, int, int]
    patch_2d: tuple[int, int]
    patch_3d: tuple[int, int, int]
    channels: tuple[ChannelStatistics, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The plan as printed at the start of a run."""
        spacing = " × ".join(f"{value:.3g}" for value in self.target_spacing)
        shape = " × ".join(map(str, self.median_shape))
        lines = [f"plan: median spacing {spacing} mm (z, y, x), median shape {shape} voxels at it; "
                 f"2D patch {self.patch_2d[0]}×{self.patch_2d[1]}, 3D patch {'×'.join(map(str, self.patch_3d))}"]
        lines += [f"plan: channel {channel.name}: foreground mean {channel.mean:.4g}, sd {channel.std:.4g}, "
                  f"0.5–99.5 percentiles {channel.percentile_00_5:.4g} to {channel.percentile_99_5:.4g}"
                  for channel in self.channels]
        return lines


def _rounded_down(size: float) -> int:
    return max(PATCH_MULTIPLE, int(size) // PATCH_MULTIPLE * PATCH_MULTIPLE)


def foreground_statistics(cases: Sequence[Case], names: Sequence[str], seed: int = 0) -> tuple[ChannelStatistics, ...]:
    """Per channel (``names`` one each) the 0.5 and 99.5 percentiles of up to :data:`_VOXELS_PER_CASE` foreground
    voxels of each case (drawn with ``seed``), and their mean and sd once clipped to them (nnU-Net's order).

    Raises:
        DataError: no case has a foreground voxel.
    """
    rng = np.random.default_rng(seed)
    samples: list[list[np.ndarray]] = [[] for _ in names]
    for case in cases:
        foreground = np.flatnonzero(case.label > 0)
        if foreground.size == 0:
            continue
        picked = rng.choice(foreground, min(foreground.size, _VOXELS_PER_CASE), replace=False)
        for channel, values in enumerate(as_channels(case.image)):
            samples[channel].append(values.reshape(-1)[picked].astype(np.float64))
    if not samples[0]:
        raise DataError("The training labels hold no foreground voxel; check the labels.")
    statistics = []
    for name, parts in zip(names, samples):
        values = np.concatenate(parts)
        low, high = np.percentile(values, (0.5, 99.5))
        clipped = np.clip(values, low, high)
        statistics.append(ChannelStatistics(name, float(clipped.mean()), float(clipped.std()), float(low),
                                            float(high)))
    return tuple(statistics)


def default_scheme(dataset: str) -> str:
    """The per-image scheme of a dataset's channels other than CT: ``"percentile"`` for ACDC (``acdc``,
    ``acdc-sample``: the recipe the shipped models were trained and measured with; its volumes were prepared
    by that very scaling), ``"zscore"`` for any other data (nnU-Net's choice for MRI: a lesion brighter than
    the image's 99th percentile stays apart from the tissue around it)."""
    return "percentile" if dataset in (ACDC_DATASET, SAMPLE_DATASET) else "zscore"


def channel_normalization(channels: Sequence[ChannelStatistics], scheme: str = "zscore"
                          ) -> list[ChannelNormalization] | None:
    """Per channel how it is normalised: a channel named :data:`CT_CHANNEL` clipped to its foreground 0.5–99.5
    percentiles and z-scored with the foreground mean and sd after that clipping (Hounsfield units keep their
    meaning), the others by ``scheme`` (one of :data:`IMAGE_SCHEMES`, per image); None when every channel is
    ``"percentile"`` (the bundle then records nothing new and normalises as every bundle before it)."""
    if scheme not in IMAGE_SCHEMES:
        raise DataError(f"Unknown normalisation {scheme!r}; choose one of {', '.join(IMAGE_SCHEMES)}.")
    if scheme == "percentile" and not any(channel.name == CT_CHANNEL for channel in channels):
        return None
    return [ChannelNormalization("ct", (channel.percentile_00_5, channel.percentile_99_5), channel.mean,
                                 max(channel.std, 1e-8)) if channel.name == CT_CHANNEL
            else ChannelNormalization(scheme) for channel in channels]


def patch_2d(median_in_plane: Sequence[float], preferred: int) -> tuple[int, int]:
    """A square 2D patch no larger than ``preferred`` nor than the median slice's longer side (multiple of 16)."""
    side = min(int(preferred), _rounded_down(max(median_in_plane)))
    return side, side


def patch_3d(median_shape: Sequence[int], spacing: Sequence[float], voxel_budget: int = VOXEL_BUDGET_3D
             ) -> tuple[int, int, int]:
    """The median shape (z, y, x) as a patch, each side a multiple of 16, its longest axis in mm shrunk by 16 voxels
    at a time until it holds at most ``voxel_budget`` voxels."""
    patch = [_rounded_down(size) for size in median_shape]
    while int(np.prod(patch)) > voxel_budget:
        shrinkable = [axis for axis in range(3) if patch[axis] > PATCH_MULTIPLE]
        if not shrinkable:
            break
        longest = max(shrinkable, key=lambda axis: patch[axis] * spacing[axis])
        patch[longest] -= PATCH_MULTIPLE
    return tuple(patch)


def largest_extent(cases: Sequence[Case], target_spacing: Sequence[float]) -> tuple[int, ...]:
    """The largest extent, per axis, of any case once resampled to ``target_spacing``: ``(y, x)`` voxels of a
    slice for a 2D one, ``(z, y, x)`` of the volume for a 3D one (what crops are cut from; shapes only, no
    resampling).

    Raises:
        DataError: a case whose spacing puts it outside the model's grid limits (its id and the reason).
    """
    extents = []
    for case in cases:
        try:
            if len(target_spacing) == 3:
                extents.append(volume_grid_shape(case.label.shape, case.spacing, target_spacing))
            else:
                extents.append(network_grid_shape(case.label.shape[1:], in_plane_spacing(case.spacing),
                                                  target_spacing))
        except ValueError as error:
            raise DataError(f"{case.case_id}: {error}") from None
    return tuple(int(value) for value in np.max(extents, axis=0))


def make_plan(cases: Sequence[Case], channel_names: Sequence[str], preferred_patch_2d: int = 128,
              voxel_budget: int = VOXEL_BUDGET_3D, seed: int = 0) -> Plan:
    """The plan of the training ``cases`` (see the module docstring); ``channel_names`` one per channel.

    Raises:
        DataError: no training case, or no foreground voxel in any of them.
    """
    if not cases:
        raise DataError("No training volumes to plan from; the split selected no training volume.")
    spacings = np.array([case.spacing for case in cases], dtype=np.float64)
    target = np.median(spacings, axis=0)
    shapes = np.array([[size * step / aim for size, step, aim in zip(case.label.shape, case.spacing, target)]
                       for case in cases])
    median_shape = tuple(int(round(value)) for value in np.median(shapes, axis=0))
    statistics = foreground_statistics(cases, channel_names, seed)
    return Plan(tuple(float(value) for value in target), median_shape, patch_2d(median_shape[1:], preferred_patch_2d),
                patch_3d(median_shape, target, voxel_budget), statistics)
