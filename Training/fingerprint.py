"""The data fingerprint: what the training cases are, read once before any choice is made from them (nnU-Net's
``dataset_fingerprint.json``, kept small).

:func:`make_fingerprint` records, per training case, its id, spacing ``(z, y, x)`` mm and shape ``(z, y, x)``
voxels, and per channel the intensities inside the training labels' foreground (mean, sd, 0.5 and 99.5
percentiles).
The plan (:mod:`Training.plan`) makes its choices from these numbers alone, and ``plan.json`` stores them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from CalibSegLib.preprocessing import as_channels
from Datasets.errors import DataError
from Datasets.loading import Case

__all__ = ["ChannelStatistics", "Fingerprint", "foreground_statistics", "make_fingerprint"]

# Foreground voxels read per case and channel (nnU-Net reads 10,000): enough for percentiles, bounded memory.
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
class Fingerprint:
    """The training cases (``cases``: their ids), each one's ``spacings`` ``(z, y, x)`` mm and ``shapes``
    ``(z, y, x)`` voxels in that order, and the foreground intensities of each input channel."""

    cases: tuple[str, ...]
    spacings: tuple[tuple[float, float, float], ...]
    shapes: tuple[tuple[int, int, int], ...]
    channels: tuple[ChannelStatistics, ...]

    def median_spacing(self) -> tuple[float, float, float]:
        """The median spacing per axis, ``(z, y, x)`` mm."""
        return tuple(float(value) for value in np.median(np.array(self.spacings, dtype=np.float64), axis=0))

    def median_shape(self, spacing: Sequence[float]) -> tuple[int, int, int]:
        """The median shape per axis once every case is resampled to ``spacing`` ``(z, y, x)`` mm, voxels."""
        sizes = [[size * step / aim for size, step, aim in zip(shape, case_spacing, spacing)]
                 for shape, case_spacing in zip(self.shapes, self.spacings)]
        return tuple(int(round(value)) for value in np.median(sizes, axis=0))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> "Fingerprint":
        return cls(tuple(values["cases"]),
                   tuple(tuple(float(step) for step in spacing) for spacing in values["spacings"]),
                   tuple(tuple(int(size) for size in shape) for shape in values["shapes"]),
                   tuple(ChannelStatistics(**channel) for channel in values["channels"]))


def foreground_statistics(cases: Sequence[Case], names: Sequence[str], seed: int = 0
                          ) -> tuple[ChannelStatistics, ...]:
    """Per channel (``names`` one each) the 0.5 and 99.5 percentiles of up to :data:`_VOXELS_PER_CASE`
    foreground voxels of each case (drawn with ``seed``), and their mean and sd once clipped to them
    (nnU-Net's order).

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


def make_fingerprint(cases: Sequence[Case], channel_names: Sequence[str], seed: int = 0) -> Fingerprint:
    """The fingerprint of the training ``cases`` (``channel_names`` one per channel; foreground voxels drawn
    with ``seed``).

    Raises:
        DataError: no training case, or no foreground voxel in any of them.
    """
    if not cases:
        raise DataError("No training volumes to plan from; the split selected no training volume.")
    return Fingerprint(tuple(case.case_id for case in cases),
                       tuple(tuple(float(step) for step in case.spacing) for case in cases),
                       tuple(tuple(int(size) for size in case.label.shape) for case in cases),
                       foreground_statistics(cases, channel_names, seed))
