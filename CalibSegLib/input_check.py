"""Is this input like the model's training inputs? The statistics a bundle stores and the check against them.

A model's predicted Dice only means something on images like the ones it learnt from: on a
contrast-inverted cine MRI the shipped models predict Dice 0.44–0.51 where 0.01–0.03 is measured.
So before anyone reads a Dice, :func:`check_input` says in plain sentences when an input is unlike
every training volume. It compares one volume (and the model's prediction on it) with
:class:`InputStatistics`, stored in ``bundle.json`` as ``input_statistics`` and computed by
:func:`fit_input_statistics` from the training volumes and their reference labels.

What is compared (:func:`observe_volume`; every channel scaled to [0, 1] as the network's input is clipped,
:func:`check_intensities`: an MRI channel over its own [min, p99], so a raw scanner file and a volume stored
already scaled to [0, 1] give the same numbers; a CT channel over its fixed training Hounsfield window, so a CT
whose rescale intercept was lost, every value 1024 too high, is unlike its training CTs although its histogram
has their shape. The unit is a share of that range, the one the thresholds were decided in):

- ``intensity``: the :data:`QUANTILE_LEVELS` quantiles of the whole normalised volume (the shape of
  its histogram). Cine MRI is mostly dark with bright blood; an inverted copy, a CT in Hounsfield
  units (air at the minimum, soft tissue and bone near the top) or uniform noise is not.
- ``structure_intensity``: the median normalised intensity inside each predicted structure (in
  cine MRI the left-ventricle cavity is bright, the myocardium dark); structures predicted nowhere
  are not compared here.
- ``structure_volume``: each structure's predicted volume in mL; a structure predicted nowhere is
  always a reason (every training volume has each structure).
- ``geometry``: the in-plane pixel spacing as a multiple of the model's grid (``target_spacing``),
  judged by what resampling can take (:data:`RESAMPLING_RANGE`), not by the training volumes' spacings
  (ACDC's HDF5 files carry none, so every training volume sits at the nominal 1.5 mm); and the field of
  view (mm) against the training range.

Beside them one rule needs no statistics: a CT channel holding values outside :data:`HOUNSFIELD_RANGE` is
unsuitable whatever its histogram (its training window clips a block of 10⁶ HU to the window's top, where the
quantiles need not move): no scanner measures such values, so the file's rescale slope or intercept is wrong.

Each family's *excursion* (:func:`excursions`) is how far the volume lies outside the training
range: normalised-intensity units for the two intensity families, the natural logarithm of the
ratio to the nearest bound for volumes and geometry (0 inside the range; for the pixel spacing, of
its ratio to the grid outside :data:`RESAMPLING_RANGE`). A family whose
excursion exceeds its threshold (``InputStatistics.thresholds``, decided on validation volumes
and degraded copies: docs/input_check.md) gives one sentence.

A fifth judge is the network itself: statistics of version 3 also hold ``features``
(:class:`~CalibSegLib.feature_statistics.FeatureStatistics`: the distribution of the training volumes'
encoder features and a distance threshold chosen on the validation volumes); the caller gives the
volume's distance (:func:`CalibSegLib.features.feature_distance`), and a distance above the threshold is
one more sentence, the first. Older statistics keep the four families and say the volume was not
checked against the network's features. An ensemble's statistics of version 4 hold ``member_features`` instead
(:class:`~CalibSegLib.feature_statistics.MemberFeatureStatistics`): every member's Gaussian and one pooled
threshold; the caller gives one distance per member, and the input is unlike the training images when a majority
of the members find it so. Pure NumPy: no torch, no bundle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from CalibSegLib.feature_statistics import FeatureStatistics, FeatureStatisticsError, MemberFeatureStatistics
from CalibSegLib.preprocessing import Preprocessing, as_channels, in_plane_spacing, intensity_range, scale_intensity

if TYPE_CHECKING:
    from CalibSegLib.bundle import BundleMetadata

__all__ = ["INPUT_STATISTICS_VERSION", "QUANTILE_LEVELS", "FAMILIES", "InputStatisticsError", "VolumeObservation",
           "InputStatistics", "check_intensities", "observe_volume", "fit_input_statistics", "statistics_of_cases",
           "THRESHOLDS", "excursions", "input_reasons", "check_input", "input_check_lines", "NOT_CHECKED",
           "OUTDATED", "HOUNSFIELD_RANGE", "RESAMPLING_RANGE", "FEATURES_NOT_STORED", "FEATURES_NOT_MEASURED",
           "feature_lines", "with_features"]

# 2: a CT channel scaled over its training window (check_intensities). Version 1 scaled every channel per image,
# which is the same thing for a bundle without a CT channel (every ACDC bundle), and not otherwise.
# 3: the network's features (a "features" field, null where none were fitted); bundles of schema 3 carry it.
# 4: an ensemble judged by every member ("member_features", "features" null); written only where they are stored,
# so every other bundle keeps version 3 and stays readable by a CalibSeg that reads 3.
INPUT_STATISTICS_VERSION = 4
_FIRST_MEMBER_VERSION = 3
QUANTILE_LEVELS: tuple[float, ...] = (0.05, 0.25, 0.50, 0.75, 0.95)
# Hounsfield units a CT file can hold: air is -1000, padding outside the field of view down to -3024 on some
# scanners, and the extended scale for metal reaches about 30,000 (16-bit storage); anything beyond is not CT.
HOUNSFIELD_RANGE: tuple[float, float] = (-4096.0, 32767.0)
# The families of statistics, each with one threshold on its excursion.
FAMILIES: tuple[str, ...] = ("intensity", "structure_intensity", "structure_volume", "geometry")
# The largest excursion per family still called suitable, decided on acdc_ce_dice's validation patients of
# Datasets/splits/acdc.json and degraded copies of them by the rule in docs/input_check.md: twice the largest excursion
# of a clean validation volume, at least 0.05 normalised-intensity units for the intensity families and log(1.5) (a
# factor 1.5 beyond the training range) for volumes and geometry.
THRESHOLDS: dict[str, float] = {"intensity": 0.08, "structure_intensity": 0.05, "structure_volume": math.log(1.5),
                                "geometry": math.log(1.5)}
# The in-plane pixel spacing, as a multiple of the model's grid, that resampling to the grid takes with
# little loss: a finer image is averaged down (anti-aliased), a coarser one enlarged. Measured on
# acdc_ce_dice's validation volumes resampled in-plane (docs/input_check.md). The geometry threshold is the
# tolerance around it: with log(1.5), pixels from 1/6 of the grid to 2.25 times it (0.25-3.4 mm for a
# 1.5 mm model) are suitable.
RESAMPLING_RANGE: tuple[float, float] = (0.25, 1.5)
_MAX_STRUCTURES = 255  # labels are uint8
NOT_CHECKED = ("input not checked: this bundle stores no statistics of its training inputs "
               "(add them with python -m Training.fit_input_check --bundle <bundle>)")
FEATURES_NOT_STORED = ("not checked against the network's features: this bundle stores none (add them with "
                       "python -m Training.fit_input_check --bundle <bundle>)")
FEATURES_NOT_MEASURED = "not checked against the network's features: no distance was computed for this volume"
OUTDATED = ("input not checked: this bundle's statistics of its training inputs scaled its CT channels per image, "
            "not over their Hounsfield window (refit them with python -m Training.fit_input_check --bundle <bundle>)")


class InputStatisticsError(ValueError):
    """Stored input statistics cannot be read, or none can be computed; the message says why in a phrase
    (``load_bundle`` wraps it in its one-sentence ``BundleError``)."""


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


def _span(values: Sequence[float]) -> tuple[float, float]:
    return float(min(values)), float(max(values))


def fit_input_statistics(observations: Sequence[VolumeObservation], thresholds: Mapping[str, float]) -> InputStatistics:
    """The training ranges of ``observations`` (one per training volume, labelled with its reference).

    Raises:
        InputStatisticsError: no observation, or a structure absent from every training volume.
    """
    if not observations:
        raise InputStatisticsError("there are no training volumes to compute the input statistics from")
    quantiles = np.stack([observation.quantiles for observation in observations])  # (volumes, channels, levels)
    structures = list(observations[0].structure_volume_ml)
    present = {name: [o.structure_intensity[name] for o in observations if o.structure_intensity[name] is not None]
               for name in structures}
    absent = [name for name, values in present.items() if not values]
    if absent:
        raise InputStatisticsError(f"no training volume contains {', '.join(absent)}, so its range is unknown")
    volumes = {name: [o.structure_volume_ml[name] for o in observations if o.structure_volume_ml[name] > 0]
               for name in structures}
    return InputStatistics(
        intensity=tuple(tuple(_span(quantiles[:, channel, level]) for level in range(quantiles.shape[2]))
                        for channel in range(quantiles.shape[1])),
        structure_intensity={name: _span(values) for name, values in present.items()},
        structure_volume_ml={name: _span(values) for name, values in volumes.items()},
        spacing_mm=_span([value for o in observations for value in o.spacing_mm]),
        field_of_view_mm=_span([value for o in observations for value in o.field_of_view_mm]),
        thresholds={family: float(thresholds[family]) for family in FAMILIES},
        volumes=len(observations),
    )


def statistics_of_cases(metadata: "BundleMetadata", cases: Sequence[Any],
                        thresholds: Mapping[str, float] = THRESHOLDS,
                        features: FeatureStatistics | MemberFeatureStatistics | None = None) -> dict[str, Any]:
    """``bundle.json``'s ``input_statistics`` from a bundle's training ``cases`` (each with ``image``, ``label``
    and ``spacing`` (z, y, x) mm, as :class:`Datasets.cases.Case`), under the bundle's preprocessing, with the
    network's ``features`` (:func:`CalibSegLib.features.fit_network_features`, or an ensemble's members',
    :func:`CalibSegLib.features.fit_member_features`; None: none)."""
    observations = [observe_volume(case.image, case.spacing, case.label, metadata.class_names,
                                   metadata.preprocessing) for case in cases]
    return with_features(fit_input_statistics(observations, thresholds), features).to_dict()


def with_features(statistics: InputStatistics,
                  features: FeatureStatistics | MemberFeatureStatistics | None) -> InputStatistics:
    """``statistics`` judged by ``features``: one network's (``features``) or every member's (``member_features``),
    in place of what they held."""
    if isinstance(features, MemberFeatureStatistics):
        return replace(statistics, features=None, member_features=features)
    return replace(statistics, features=features, member_features=None)


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


def _feature_entry(statistics: InputStatistics, distance: float | Sequence[float] | None) -> dict[str, Any]:
    """A check's ``features``: the volume's distance beside the threshold (an ensemble judged by every member:
    each member's, and the one that decides the majority, as ``distance``), or a note saying why none."""
    judge = statistics.member_features or statistics.features
    if judge is None:
        return {"note": FEATURES_NOT_STORED}
    if distance is None:
        return {"note": FEATURES_NOT_MEASURED}
    first = judge.members[0] if isinstance(judge, MemberFeatureStatistics) else judge
    calibration = {"threshold": judge.threshold, "false_alarm_rate": first.false_alarm_rate,
                   "validation_volumes": first.validation_volumes, "validation_within": first.validation_within}
    members = isinstance(judge, MemberFeatureStatistics)
    if members == isinstance(distance, (int, float)):  # the caller's error, not the bundle's
        wanted = "one distance per member" if members else "one distance"
        raise InputStatisticsError(f"the bundle's feature statistics take {wanted}, got {distance!r}")
    if not members:
        return {"distance": float(distance), **calibration}
    distances = [float(value) for value in distance]
    return {"distance": judge.deciding_distance(distances), **calibration, "combination": judge.combination,
            "member_distances": distances, "members_above": sum(judge.above(distances))}


def _unlike_features(entry: Mapping[str, Any]) -> bool:
    return "distance" in entry and entry["distance"] > entry["threshold"]


def _validation_share(entry: Mapping[str, Any]) -> str:
    """``all 20 validation volumes`` or ``95 % of the 130 out-of-fold volumes``: those at or below the
    threshold (out of fold where every member judges)."""
    count, within = entry["validation_volumes"], entry["validation_within"]
    kind = "out-of-fold" if "member_distances" in entry else "validation"
    return (f"all {count} {kind} volumes" if within == count
            else f"{within / count:.0%} of the {count} {kind} volumes")


def _member_line(entry: Mapping[str, Any]) -> str:
    """An ensemble's members' verdicts in one line."""
    distances = entry["member_distances"]
    listed = ", ".join(f"{value:.3g}" for value in distances)
    share = f"{_validation_share(entry)} ≤ {entry['threshold']:.3g}"
    if _unlike_features(entry):
        return (f"Unlike the training images the networks saw: {entry['members_above']} of {len(distances)} "
                f"members find it so, a majority (feature distances {listed}; {share}).")
    return (f"network features: {entry['members_above']} of {len(distances)} members find it unlike their "
            f"training images (distances {listed}; {share})")


def feature_lines(entry: Mapping[str, Any]) -> list[str]:
    """What a check's ``features`` entry says in one line: the distance against the threshold (an ensemble's
    members: how many of them find the volume unlike their training images, and their distances), or the note."""
    if "distance" not in entry:
        return [entry["note"]]
    if "member_distances" in entry:
        return [_member_line(entry)]
    distance, threshold, share = entry["distance"], entry["threshold"], _validation_share(entry)
    if _unlike_features(entry):
        return [f"Unlike the training images the network saw: feature distance {distance:.3g}, above {share} "
                f"(≤ {threshold:.3g})."]
    return [f"network features: distance {distance:.3g}, like the training images the network saw ({share} "
            f"≤ {threshold:.3g})"]


def check_input(metadata: "BundleMetadata", image: np.ndarray | Sequence[np.ndarray], spacing: Sequence[float],
                labels: np.ndarray, feature_distance: float | Sequence[float] | None = None) -> dict[str, Any]:
    """Is ``image`` like the bundle's training inputs? The ``input_check`` of a case's summary.

    Args:
        metadata: the bundle's metadata (its ``input_statistics``, class names and preprocessing).
        image: the ``(z, y, x)`` volume as read, its ``(K, z, y, x)`` channels, or one volume per input channel.
        spacing: its ``(z, y, x)`` voxel size in mm.
        labels: the bundle's ``(z, y, x)`` prediction on it.
        feature_distance: the volume's distance in the network's feature space
            (:func:`CalibSegLib.features.feature_distance`): one per member for an ensemble judged by every member,
            None where none was computed.

    Returns:
        ``{"suitable": bool, "reasons": [one sentence each], "features": {...}}`` (no reason when suitable;
        impossible Hounsfield values come first, then a feature distance above its threshold), ``features`` holding
        ``distance``, ``threshold``, ``false_alarm_rate``, ``validation_volumes`` and ``validation_within`` (for an
        ensemble judged by every member also ``member_distances``, ``members_above`` and ``combination``, and
        ``distance`` the one that decides the majority), or a ``note`` saying why the volume was not checked against
        the network's features; for a bundle without statistics
        ``{"suitable": None, "reasons": [], "note": "input not checked: ..."}``.
    """
    if metadata.input_statistics is None:
        return {"suitable": None, "reasons": [], "note": NOT_CHECKED}
    statistics = InputStatistics.from_dict(metadata.input_statistics, metadata.class_names, metadata.in_channels,
                                           metadata.ensemble_size)
    preprocessing = metadata.preprocessing
    if metadata.input_statistics["version"] == 1 and any(
            channel.scheme == "ct" for channel in preprocessing.channel_normalization or ()):
        return {"suitable": None, "reasons": [], "note": OUTDATED}
    observation = observe_volume(image, spacing, labels, metadata.class_names, preprocessing)
    features = _feature_entry(statistics, feature_distance)
    reasons = _impossible_hounsfield(image, preprocessing, metadata.channel_names)
    reasons += (feature_lines(features) if _unlike_features(features) else []) + input_reasons(
        statistics, observation, metadata.channel_names)
    return {"suitable": not reasons, "reasons": reasons, "features": features}


def _impossible_hounsfield(image: np.ndarray | Sequence[np.ndarray], preprocessing: Preprocessing,
                           channel_names: Sequence[str] | None) -> list[str]:
    """A sentence per CT channel (scheme ``"ct"``) holding values outside :data:`HOUNSFIELD_RANGE`."""
    schemes = preprocessing.channel_normalization or []
    channels = as_channels(image if isinstance(image, np.ndarray) else np.stack(list(image)))
    names = list(channel_names or ["CT"] * len(schemes))
    reasons = []
    for name, channel, scheme in zip(names, channels, schemes):
        low, high = float(channel.min()), float(channel.max())
        if scheme.scheme == "ct" and (low < HOUNSFIELD_RANGE[0] or high > HOUNSFIELD_RANGE[1]):
            lowest, highest = HOUNSFIELD_RANGE
            reasons.append(f"Its {name} channel holds values from {low:.4g} to {high:.4g} HU, beyond any CT "
                           f"({lowest:.0f} to {highest:.0f} HU): its rescale slope or intercept is wrong, or "
                           "it is not a CT.")
    return reasons


def input_check_lines(check: Mapping[str, Any]) -> list[str]:
    """What a reader sees first about a case: ``input suitable``, or ``INPUT UNSUITABLE`` and its reasons,
    or the not-checked note, then the network's feature distance against its threshold (or why it is not
    there; nothing more where it is already a reason). The command line and the Slicer tables print these."""
    if check["suitable"] is None:
        return [check["note"]]
    features = check.get("features")  # summaries written before the features have none
    distance = [] if features is None or _unlike_features(features) else feature_lines(features)
    if check["suitable"]:
        return ["input suitable: like the model's training volumes", *distance]
    return ["INPUT UNSUITABLE: unlike the model's training volumes, so no Dice here can be trusted.",
            *check["reasons"], *distance]
