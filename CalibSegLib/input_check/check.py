"""Is this input like the bundle's training inputs? The ``input_check`` of a case's summary (:func:`check_input`)
and the lines a reader sees of it (:func:`input_check_lines`).

Four families compare the volume with the bundle's :class:`~CalibSegLib.input_check.statistics.InputStatistics`
(:mod:`CalibSegLib.input_check.excursions`). Beside them one rule needs no statistics: a CT channel holding values
outside :data:`HOUNSFIELD_RANGE` is unsuitable whatever its histogram (its training window clips a block of 10⁶ HU
to the window's top, where the quantiles need not move): no scanner measures such values, so the file's rescale
slope or intercept is wrong.

A fifth judge is the network itself: statistics of version 3 also hold ``features``
(:class:`~CalibSegLib.feature_statistics.FeatureStatistics`: the distribution of the training volumes'
encoder features and a distance threshold chosen on the validation volumes); the caller gives the
volume's distance (:func:`CalibSegLib.features.feature_distance`), and a distance above the threshold is
one more sentence, the first. Older statistics keep the four families and say the volume was not
checked against the network's features. An ensemble's statistics of version 4 hold ``member_features`` instead
(:class:`~CalibSegLib.feature_statistics.MemberFeatureStatistics`): every member's Gaussian and one pooled
threshold; the caller gives one distance per member, and the input is unlike the training images when a majority
of the members find it so.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from CalibSegLib.feature_statistics import MemberFeatureStatistics
from CalibSegLib.input_check.excursions import input_reasons
from CalibSegLib.input_check.observation import ObservationMetadata, observe_volume
from CalibSegLib.input_check.statistics import InputStatistics, InputStatisticsError
from CalibSegLib.preprocessing import Preprocessing, as_channels

__all__ = ["CheckMetadata", "NOT_CHECKED", "OUTDATED", "FEATURES_NOT_STORED", "FEATURES_NOT_MEASURED",
           "HOUNSFIELD_RANGE", "feature_lines", "check_input", "input_check_lines"]

# Hounsfield units a CT file can hold: air is -1000, padding outside the field of view down to -3024 on some
# scanners, and the extended scale for metal reaches about 30,000 (16-bit storage); anything beyond is not CT.
HOUNSFIELD_RANGE: tuple[float, float] = (-4096.0, 32767.0)
NOT_CHECKED = ("input not checked: this bundle stores no statistics of its training inputs "
               "(add them with python -m Training.fit_input_check --bundle <bundle>)")
FEATURES_NOT_STORED = ("not checked against the network's features: this bundle stores none (add them with "
                       "python -m Training.fit_input_check --bundle <bundle>)")
FEATURES_NOT_MEASURED = "not checked against the network's features: no distance was computed for this volume"
OUTDATED = ("input not checked: this bundle's statistics of its training inputs scaled its CT channels per image, "
            "not over their Hounsfield window (refit them with python -m Training.fit_input_check --bundle <bundle>)")


class CheckMetadata(ObservationMetadata, Protocol):
    """What :func:`check_input` reads of a bundle's metadata (:class:`CalibSegLib.bundle.BundleMetadata` is one):
    besides its classes and preprocessing, its stored ``input_statistics`` (None without), its input channels'
    count and names (None: one channel, the image) and how many networks it holds, which the statistics are read
    against."""

    @property
    def input_statistics(self) -> Mapping[str, Any] | None: ...

    @property
    def in_channels(self) -> int: ...

    @property
    def channel_names(self) -> Sequence[str] | None: ...

    @property
    def ensemble_size(self) -> int: ...


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


def check_input(metadata: CheckMetadata, image: np.ndarray | Sequence[np.ndarray], spacing: Sequence[float],
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
