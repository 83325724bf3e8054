"""The input statistics a bundle stores, ``bundle.json``'s ``input_statistics``: :class:`InputStatistics`, its
versions, and the :data:`QUANTILE_LEVELS` and :data:`FAMILIES` it holds ranges and thresholds of.

Reading and checking them (:meth:`InputStatistics.from_dict`) needs neither the bundle nor the predictor, nor any
other module of :mod:`CalibSegLib.input_check`, so the bundle schema validates them without importing those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

import numpy as np

from CalibSegLib.feature_statistics import FeatureStatistics, FeatureStatisticsError, MemberFeatureStatistics

__all__ = ["INPUT_STATISTICS_VERSION", "QUANTILE_LEVELS", "FAMILIES", "InputStatisticsError", "InputStatistics"]

# 2: a CT channel scaled over its training window (check_intensities). Version 1 scaled every channel per image,
# which is the same thing for a bundle without a CT channel (every ACDC bundle), and not otherwise.
# 3: the network's features (a "features" field, null where none were fitted); bundles of schema 3 carry it.
# 4: an ensemble judged by every member ("member_features", "features" null); written only where they are stored,
# so every other bundle keeps version 3 and stays readable by a CalibSeg that reads 3.
INPUT_STATISTICS_VERSION = 4
_FIRST_MEMBER_VERSION = 3
QUANTILE_LEVELS: tuple[float, ...] = (0.05, 0.25, 0.50, 0.75, 0.95)
# The families of statistics, each with one threshold on its excursion.
FAMILIES: tuple[str, ...] = ("intensity", "structure_intensity", "structure_volume", "geometry")
_MAX_STRUCTURES = 255  # labels are uint8


class InputStatisticsError(ValueError):
    """Stored input statistics cannot be read, or none can be computed; the message says why in a phrase
    (``load_bundle`` wraps it in its one-sentence ``BundleError``)."""


def _range(values: Any, phrase: str, positive: bool = False) -> tuple[float, float]:
    """A stored ``[low, high]`` pair of finite numbers, low <= high (and > 0 with ``positive``)."""
    if (not isinstance(values, (list, tuple)) or len(values) != 2
            or not all(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                       for value in values)
            or values[0] > values[1] or (positive and values[0] <= 0)):
        raise InputStatisticsError(f"{phrase} must be a [low, high] pair of finite{' positive' if positive else ''} "
                                   f"numbers with low <= high, got {values!r}")
    return float(values[0]), float(values[1])


def _ranges(values: Any, names: Sequence[str], phrase: str, positive: bool = False) -> dict[str, tuple[float, float]]:
    if not isinstance(values, dict) or sorted(values) != sorted(names):
        raise InputStatisticsError(f"{phrase} must name exactly the structures {', '.join(names)}")
    return {name: _range(values[name], f"{phrase} of {name}", positive) for name in names}


@dataclass(frozen=True)
class InputStatistics:
    """What the training inputs looked like, and how far from it an input may lie: ``bundle.json``'s
    ``input_statistics``.

    ``intensity``: per channel, per :data:`QUANTILE_LEVELS` level, the ``(low, high)`` range of that
    normalised quantile over the training volumes; ``structure_intensity`` and ``structure_volume_ml``:
    per foreground structure the range of its median normalised intensity and of its volume (mL);
    ``spacing_mm`` / ``field_of_view_mm``: the in-plane ranges (mm; the spacing is a record, the check
    judges it by the model's grid); ``thresholds``: per :data:`FAMILIES` entry the largest excursion still
    suitable; ``volumes``: how many training volumes the ranges come from; ``features``: the network's
    features (version 3), None where the statistics have none; ``member_features``: an ensemble's members'
    features and their pooled threshold (version 4; ``features`` is then None), None otherwise.
    """

    intensity: tuple[tuple[tuple[float, float], ...], ...]
    structure_intensity: dict[str, tuple[float, float]]
    structure_volume_ml: dict[str, tuple[float, float]]
    spacing_mm: tuple[float, float]
    field_of_view_mm: tuple[float, float]
    thresholds: dict[str, float] = field(default_factory=dict)
    volumes: int = 0
    features: FeatureStatistics | None = None
    member_features: MemberFeatureStatistics | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for ``bundle.json``: version 4 where member features are stored, 3 otherwise."""
        ranges = {item.name: _plain(getattr(self, item.name)) for item in fields(self)
                  if item.name not in ("features", "member_features")}
        stored = {"version": _FIRST_MEMBER_VERSION, "quantile_levels": list(QUANTILE_LEVELS), **ranges,
                  "features": None if self.features is None else self.features.to_dict()}
        if self.member_features is None:
            return stored
        return {**stored, "version": INPUT_STATISTICS_VERSION, "member_features": self.member_features.to_dict()}

    @classmethod
    def from_dict(cls, values: Any, class_names: Sequence[str], in_channels: int = 1,
                  ensemble_size: int | None = None) -> "InputStatistics":
        """Read and check stored statistics for a model with ``class_names`` and ``in_channels`` (an ensemble of
        ``ensemble_size`` networks: member features must hold as many; None: not checked).

        Raises:
            InputStatisticsError: a missing, unknown or malformed field (a phrase naming it).
        """
        if not isinstance(values, dict):
            raise InputStatisticsError(f"it must be an object, got {type(values).__name__}")
        version = values.get("version")
        if isinstance(version, bool) or version not in (1, 2, _FIRST_MEMBER_VERSION, INPUT_STATISTICS_VERSION):
            raise InputStatisticsError(f"version {version!r} is not 1, 2, {_FIRST_MEMBER_VERSION} or "
                                       f"{INPUT_STATISTICS_VERSION}")
        expected = {"version", "quantile_levels", "intensity", "structure_intensity", "structure_volume_ml",
                    "spacing_mm", "field_of_view_mm", "thresholds", "volumes"}
        expected |= {"features"} if version >= _FIRST_MEMBER_VERSION else set()
        expected |= {"member_features"} if version == INPUT_STATISTICS_VERSION else set()
        if set(values) != expected:
            wrong = sorted(set(values) ^ expected)
            raise InputStatisticsError(f"its fields must be {', '.join(sorted(expected))} (wrong: {', '.join(wrong)})")
        if version == INPUT_STATISTICS_VERSION and values["features"] is not None:
            raise InputStatisticsError("features must be null where member_features judge the input (version 4)")
        try:
            stored = values.get("features")
            features = None if stored is None else FeatureStatistics.from_dict(stored)
            members = values.get("member_features")
            member_features = None if members is None else MemberFeatureStatistics.from_dict(members, ensemble_size)
        except FeatureStatisticsError as error:
            raise InputStatisticsError(str(error)) from None
        if version == INPUT_STATISTICS_VERSION and member_features is None:
            raise InputStatisticsError("member_features must be an object in version 4")
        if values["quantile_levels"] != list(QUANTILE_LEVELS):
            raise InputStatisticsError(f"quantile_levels must be {list(QUANTILE_LEVELS)}")
        intensity = values["intensity"]
        if not isinstance(intensity, list) or len(intensity) != in_channels or not all(
                isinstance(channel, list) and len(channel) == len(QUANTILE_LEVELS) for channel in intensity):
            raise InputStatisticsError(f"intensity must hold {len(QUANTILE_LEVELS)} ranges for each of the "
                                       f"{in_channels} channel(s)")
        structures = list(class_names[1:])
        if len(structures) > _MAX_STRUCTURES:
            raise InputStatisticsError(f"a model has at most {_MAX_STRUCTURES} structures")
        thresholds = values["thresholds"]
        if not isinstance(thresholds, dict) or sorted(thresholds) != sorted(FAMILIES) or not all(
                isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf
                for value in thresholds.values()):
            raise InputStatisticsError(f"thresholds must give a finite number >= 0 for each of {', '.join(FAMILIES)}")
        volumes = values["volumes"]
        if not isinstance(volumes, int) or isinstance(volumes, bool) or volumes < 1:
            raise InputStatisticsError(f"volumes must be a positive integer, got {volumes!r}")
        return cls(
            intensity=tuple(tuple(_range(pair, f"intensity quantile {level}") for pair, level in
                                  zip(channel, QUANTILE_LEVELS)) for channel in intensity),
            structure_intensity=_ranges(values["structure_intensity"], structures, "structure_intensity"),
            structure_volume_ml=_ranges(values["structure_volume_ml"], structures, "structure_volume_ml",
                                        positive=True),
            spacing_mm=_range(values["spacing_mm"], "spacing_mm", positive=True),
            field_of_view_mm=_range(values["field_of_view_mm"], "field_of_view_mm", positive=True),
            thresholds={family: float(thresholds[family]) for family in FAMILIES},
            volumes=volumes,
            features=features,
            member_features=member_features,
        )


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return float(value) if isinstance(value, (float, np.floating)) else value
