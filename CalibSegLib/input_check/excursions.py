"""How far one volume lies outside the training ranges, per family, and the sentence for each family beyond its
threshold.

Each family's *excursion* (:func:`excursions`) is how far the volume lies outside the training
range: normalised-intensity units for the two intensity families, the natural logarithm of the
ratio to the nearest bound for volumes and geometry (0 inside the range; for the pixel spacing, of
its ratio to the grid outside :data:`RESAMPLING_RANGE`). A family whose
excursion exceeds its threshold (``InputStatistics.thresholds``, decided on validation volumes
and degraded copies: docs/input_check.md) gives one sentence (:func:`input_reasons`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from CalibSegLib.input_check.observation import VolumeObservation
from CalibSegLib.input_check.statistics import QUANTILE_LEVELS, InputStatistics

__all__ = ["RESAMPLING_RANGE", "excursions", "input_reasons"]

# The in-plane pixel spacing, as a multiple of the model's grid, that resampling to the grid takes with
# little loss: a finer image is averaged down (anti-aliased), a coarser one enlarged. Measured on
# acdc_ce_dice's validation volumes resampled in-plane (docs/input_check.md). The geometry threshold is the
# tolerance around it: with log(1.5), pixels from 1/6 of the grid to 2.25 times it (0.25-3.4 mm for a
# 1.5 mm model) are suitable.
RESAMPLING_RANGE: tuple[float, float] = (0.25, 1.5)


def _outside(value: float, bounds: tuple[float, float]) -> float:
    """Distance of ``value`` outside ``[low, high]`` (0 inside)."""
    return max(bounds[0] - value, value - bounds[1], 0.0)


def _log_outside(value: float, bounds: tuple[float, float]) -> float:
    """|log(value / nearest bound)| outside ``[low, high]`` (0 inside; infinite for a value of 0)."""
    if value <= 0:
        return math.inf
    return abs(math.log(value / min(max(value, bounds[0]), bounds[1])))


@dataclass(frozen=True)
class _Finding:
    """The worst statistic of one family: its excursion and the sentence that says it."""

    excursion: float
    sentence: str


def _findings(statistics: InputStatistics, observation: VolumeObservation,
              channel_names: Sequence[str] | None = None) -> dict[str, _Finding]:
    channels = len(statistics.intensity)
    names = list(channel_names or [f"channel {index + 1}" for index in range(channels)])
    where = [f"{name}: " if channels > 1 else "" for name in names]  # one channel needs no name
    intensity = max(
        (_Finding(_outside(value, bounds),
                  f"Its intensity histogram is unlike every training volume's ({where[channel]}the "
                  f"{level:.0%} quantile is {value:.2f} of the normalised range, training volumes "
                  f"{bounds[0]:.2f}–{bounds[1]:.2f}): another contrast, modality or an inverted image?")
         for channel, (values, ranges) in enumerate(zip(observation.quantiles, statistics.intensity))
         for level, value, bounds in zip(QUANTILE_LEVELS, values, ranges)),
        key=lambda finding: finding.excursion)
    found = [(name, value) for name, value in observation.structure_intensity.items() if value is not None]
    contrast = max(
        (_Finding(_outside(value, statistics.structure_intensity[name]),
                  f"The predicted {name} has median intensity {value:.2f} of the normalised range, where training "
                  f"volumes have {statistics.structure_intensity[name][0]:.2f}–"
                  f"{statistics.structure_intensity[name][1]:.2f}: the contrast between structures is unlike the "
                  f"training images.")
         for name, value in found), key=lambda finding: finding.excursion, default=_Finding(0.0, ""))
    volumes = statistics.structure_volume_ml
    missing = [name for name, value in observation.structure_volume_ml.items() if value <= 0]
    if missing:
        size = _Finding(math.inf, f"No {' and no '.join(missing)} was found, though every training volume has "
                                  f"{'it' if len(missing) == 1 else 'them'}.")
    else:
        size = max(
            (_Finding(_log_outside(value, volumes[name]),
                      f"The predicted {name} measures {value:.1f} mL, where training volumes have "
                      f"{volumes[name][0]:.1f}–{volumes[name][1]:.1f} mL.")
             for name, value in observation.structure_volume_ml.items()), key=lambda finding: finding.excursion)
    tolerance = math.exp(statistics.thresholds["geometry"])
    geometry = max(
        [_Finding(_log_outside(value / grid, RESAMPLING_RANGE),
                  f"Its in-plane pixel spacing, {value:.2f} mm, is {value / grid:.2g} times the model's "
                  f"{grid:.2f} mm grid, beyond what resampling to it can take "
                  f"({RESAMPLING_RANGE[0] * grid / tolerance:.2f}–"
                  f"{RESAMPLING_RANGE[1] * grid * tolerance:.2f} mm pixels).")
         for value, grid in zip(observation.spacing_mm, observation.grid_mm)]
        + [_Finding(_log_outside(value, statistics.field_of_view_mm),
                    f"Its in-plane field of view, {value:.0f} mm, is far from the training volumes' "
                    f"{statistics.field_of_view_mm[0]:.0f}–{statistics.field_of_view_mm[1]:.0f} mm.")
           for value in observation.field_of_view_mm], key=lambda finding: finding.excursion)
    return {"intensity": intensity, "structure_intensity": contrast, "structure_volume": size, "geometry": geometry}


def excursions(statistics: InputStatistics, observation: VolumeObservation) -> dict[str, float]:
    """Per :data:`FAMILIES` entry, how far ``observation`` lies outside the training ranges (0 inside; see the
    module docstring for the units)."""
    return {family: finding.excursion for family, finding in _findings(statistics, observation).items()}


def input_reasons(statistics: InputStatistics, observation: VolumeObservation,
                  channel_names: Sequence[str] | None = None) -> list[str]:
    """One sentence per family whose excursion exceeds its threshold, in :data:`FAMILIES` order; a model of several
    channels names the channel (``channel_names``, the bundle's, e.g. FLAIR; default ``channel 1`` ...)."""
    return [finding.sentence for family, finding in _findings(statistics, observation, channel_names).items()
            if finding.excursion > statistics.thresholds[family]]
