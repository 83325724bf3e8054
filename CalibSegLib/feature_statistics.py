"""How far a volume's network features lie from the training volumes': a bounded Gaussian and its threshold.

The features of the training volumes (:mod:`CalibSegLib.features`: the deepest encoder layer, averaged
over each slice, then over the volume) are modelled as one Gaussian whose covariance is low-rank plus
isotropic (probabilistic PCA, Tipping & Bishop 1999): the :data:`MAX_COMPONENTS` leading principal axes
with their variances, and one variance for every other direction (the mean of the remaining
eigenvalues). Unlike the sample covariance (384 × 384 numbers for MONAI's UNet, from 110 volumes:
singular) it is invertible, and ``bundle.json`` stores it in ``(1 + k) × F`` numbers. A volume's
*distance* is the Mahalanobis distance of its feature vector under it.

Its threshold is chosen on the validation volumes (never seen in training) at a stated false-alarm
rate α (:data:`FALSE_ALARM_RATE`, 5 %): the ``⌈(n + 1)(1 − α)⌉``-th smallest of their n distances, so a
new clean volume, exchangeable with them, exceeds it with probability at most α (split conformal); with
fewer than ``1/α − 1`` validation volumes that is their largest, and the guarantee is weaker.

An ensemble of cross-validation folds is judged by every member (:class:`MemberFeatureStatistics`, bundle.json's
``member_features``): each member's own Gaussian, fitted on the volumes of the patients that member trained on;
one threshold pooled over the out-of-fold distances, each volume scored by the member that never trained on it
(:func:`pool_member_statistics`); and a combination of the members' verdicts (:data:`COMBINATIONS`: the majority,
so a volume is unlike the training images when more than half of the members find it so). Pure NumPy: no torch,
no bundle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

__all__ = ["FALSE_ALARM_RATE", "MAX_COMPONENTS", "MAX_FEATURES", "MAX_MEMBERS", "COMBINATIONS",
           "FeatureStatisticsError", "FeatureStatistics", "MemberFeatureStatistics", "volume_vector",
           "fit_feature_statistics", "pool_member_statistics", "fit_member_statistics", "conformal_threshold"]

FALSE_ALARM_RATE = 0.05
# Principal axes kept: chosen on acdc_ce_dice's validation copies (docs/input_check.md) among 4, 8, 16, 32.
MAX_COMPONENTS = 16
# Longer feature vectors are refused: the mean and the axes take (1 + MAX_COMPONENTS) × F numbers of
# bundle.json, about 300 kB at 2048, within its 1 MiB with the quality model beside them.
MAX_FEATURES = 2048
# An ensemble's members judged one by one: as many as a bundle holds (CalibSegLib.bundle's MAX_ENSEMBLE_SIZE).
MAX_MEMBERS = 16
# How the members' verdicts make one: "majority", more than half of them above the threshold (with an odd number
# of members, their median distance above it). Chosen over "any" on acdc_ce_dice's clean test volumes
# (docs/input_check.md): any member above called 3 of 30 unsuitable, the majority none.
COMBINATIONS = ("majority",)
_MAX_LAYER_NAME = 256
_SIGNIFICANT = 7  # digits stored: float32's precision, the features' own


class FeatureStatisticsError(ValueError):
    """Stored feature statistics cannot be read, or none can be fitted; the message says why in a phrase."""


def volume_vector(features: np.ndarray) -> np.ndarray:
    """A volume's ``(F,)`` feature vector: the mean of its ``(items, F)`` features (slices, or a volume)."""
    return np.asarray(features, dtype=np.float64).mean(axis=0)


def conformal_threshold(distances: Sequence[float],
                        false_alarm_rate: float = FALSE_ALARM_RATE) -> tuple[float, int]:
    """The ``⌈(n + 1)(1 − rate)⌉``-th smallest of ``n`` clean volumes' distances (their largest when there
    are too few) and how many of them lie at or below it."""
    ordered = np.sort(np.asarray(distances, dtype=np.float64))
    rank = min(math.ceil((len(ordered) + 1) * (1.0 - false_alarm_rate)), len(ordered))
    threshold = float(ordered[rank - 1])
    return threshold, int((ordered <= threshold).sum())


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _stored(values: np.ndarray | float) -> Any:
    """``values`` as JSON numbers (nested lists) rounded to :data:`_SIGNIFICANT` digits (bundle.json stays
    small)."""
    return np.vectorize(lambda value: float(f"{value:.{_SIGNIFICANT}g}"), otypes=[float])(values).tolist()


@dataclass(frozen=True)
class FeatureStatistics:
    """The training volumes' feature distribution and the distance threshold (``input_statistics``'
    ``features``).

    ``layer``: the network module the features come from (:func:`CalibSegLib.features.bottleneck_layer`);
    ``mean`` ``(F,)``; ``axes`` ``(k, F)`` orthonormal principal axes and ``variances`` ``(k,)`` theirs;
    ``residual_variance``: the variance along every other direction; ``threshold``: the largest distance
    still like the training images, at ``false_alarm_rate``; ``validation_volumes``: the n clean validation
    volumes it was chosen on, ``validation_within`` how many of them lie at or below it;
    ``training_volumes``: how many volumes the Gaussian was fitted on.
    """

    layer: str
    mean: np.ndarray
    axes: np.ndarray
    variances: np.ndarray
    residual_variance: float
    threshold: float
    false_alarm_rate: float
    validation_volumes: int
    validation_within: int
    training_volumes: int

    def distance(self, features: np.ndarray) -> float:
        """The Mahalanobis distance of a volume's ``(items, F)`` features (:func:`volume_vector`) under the
        Gaussian: ``√(Σ_i (a_i·y)² / λ_i + |y − Σ_i (a_i·y) a_i|² / σ²)``, ``y`` the vector minus the mean.

        Raises:
            FeatureStatisticsError: the features are not ``F`` long (another network than the statistics
                were fitted on).
        """
        vector = volume_vector(features)
        if vector.shape != self.mean.shape:
            raise FeatureStatisticsError(f"the features have {vector.shape[-1]} values, the statistics "
                                         f"{self.mean.size}: they come from another network")
        centred = vector - self.mean
        projections = self.axes @ centred
        residual = max(float(centred @ centred - projections @ projections), 0.0)
        return math.sqrt(float((projections ** 2 / self.variances).sum()) + residual / self.residual_variance)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for ``bundle.json``."""
        return {"layer": self.layer, "mean": _stored(self.mean), "axes": _stored(self.axes),
                "variances": _stored(self.variances), "residual_variance": _stored(self.residual_variance),
                "threshold": float(self.threshold), "false_alarm_rate": float(self.false_alarm_rate),
                "validation_volumes": self.validation_volumes, "validation_within": self.validation_within,
                "training_volumes": self.training_volumes}

    @classmethod
    def from_dict(cls, values: Any) -> "FeatureStatistics":
        """Read and check stored statistics (untrusted: every size bounded before an array is built).

        Raises:
            FeatureStatisticsError: a missing, unknown or malformed field (a phrase naming it).
        """
        if not isinstance(values, dict):
            raise FeatureStatisticsError(f"features must be an object, got {type(values).__name__}")
        expected = {"layer", "mean", "axes", "variances", "residual_variance", "threshold",
                    "false_alarm_rate", "validation_volumes", "validation_within", "training_volumes"}
        if set(values) != expected:
            wrong = sorted(set(values) ^ expected)
            raise FeatureStatisticsError(f"features' fields must be {', '.join(sorted(expected))} "
                                         f"(wrong: {', '.join(wrong)})")
        layer = values["layer"]
        if not isinstance(layer, str) or not 0 < len(layer) <= _MAX_LAYER_NAME:
            raise FeatureStatisticsError(f"features' layer must be a module name of 1 to {_MAX_LAYER_NAME} "
                                         "characters")
        mean = _vector(values["mean"], "mean", MAX_FEATURES)
        variances = _vector(values["variances"], "variances", MAX_COMPONENTS, positive=True)
        axes = values["axes"]
        if not isinstance(axes, list) or len(axes) != len(variances) or not all(
                isinstance(axis, list) and len(axis) == mean.size for axis in axes):
            raise FeatureStatisticsError("features' axes must hold one vector as long as the mean per "
                                         "variance")
        axes = np.stack([_vector(axis, "axes", mean.size) for axis in axes])
        if not np.allclose(axes @ axes.T, np.eye(len(axes)), atol=1e-4):
            raise FeatureStatisticsError("features' axes must be orthonormal")
        for name in ("residual_variance", "threshold"):
            if not _number(values[name]) or values[name] <= 0:
                raise FeatureStatisticsError(f"features' {name} must be a positive number, got "
                                             f"{values[name]!r}")
        if not _number(values["false_alarm_rate"]) or not 0 < values["false_alarm_rate"] < 1:
            raise FeatureStatisticsError("features' false_alarm_rate must lie in (0, 1)")
        counts = [values[name] for name in ("validation_volumes", "validation_within", "training_volumes")]
        if not all(map(_count, counts)) or counts[1] > counts[0]:
            raise FeatureStatisticsError("features' volume counts must be positive integers, "
                                         "validation_within at most validation_volumes")
        return cls(layer, mean, axes, variances, float(values["residual_variance"]),
                   float(values["threshold"]), float(values["false_alarm_rate"]), *counts)


def _vector(values: Any, name: str, longest: int, positive: bool = False) -> np.ndarray:
    """A stored list of 1..``longest`` finite numbers (> 0 with ``positive``) as float64."""
    if not isinstance(values, list) or not 1 <= len(values) <= longest or not all(
            _number(value) and (value > 0 or not positive) for value in values):
        raise FeatureStatisticsError(f"features' {name} must be a list of 1 to {longest} finite"
                                     f"{' positive' if positive else ''} numbers")
    return np.array(values, dtype=np.float64)


def fit_feature_statistics(layer: str, training: Sequence[np.ndarray], validation: Sequence[np.ndarray],
                           false_alarm_rate: float = FALSE_ALARM_RATE,
                           components: int = MAX_COMPONENTS) -> FeatureStatistics:
    """The Gaussian of the ``training`` volumes' features, and the threshold from the ``validation``
    volumes' distances.

    Args:
        layer: the module the features come from.
        training, validation: one ``(items, F)`` array per volume
            (:func:`CalibSegLib.features.volume_features`).
        false_alarm_rate: the share of clean volumes allowed above the threshold.
        components: principal axes kept (at most two fewer than the training volumes).

    Raises:
        FeatureStatisticsError: fewer than 3 training or 1 validation volume, vectors longer than
            :data:`MAX_FEATURES`, or training features that do not vary.
    """
    if len(training) < 3 or not validation:
        raise FeatureStatisticsError(f"the network's features need at least 3 training volumes and 1 "
                                     f"validation volume, got {len(training)} and {len(validation)}")
    vectors = np.stack([volume_vector(features) for features in training])
    if vectors.shape[1] > MAX_FEATURES:
        raise FeatureStatisticsError(f"the network's layer {layer} gives {vectors.shape[1]} features, more "
                                     f"than the {MAX_FEATURES} a bundle stores")
    mean = vectors.mean(axis=0)
    _, singular, rows = np.linalg.svd(vectors - mean, full_matrices=False)
    eigenvalues = singular ** 2 / (len(vectors) - 1)
    # n centred vectors span at most n - 1 directions: keeping at most n - 2 leaves one that varies for the
    # residual variance (otherwise only rounding noise, and distances of 10^16).
    kept = max(1, min(components, len(vectors) - 2, vectors.shape[1] - 1))
    residual_variance = float(eigenvalues[kept:].sum()) / (vectors.shape[1] - kept)
    if not (eigenvalues[:kept] > 0).all() or not residual_variance > 1e-12 * eigenvalues[0]:
        raise FeatureStatisticsError(f"the training volumes' features vary along fewer than {kept + 1} "
                                     "directions")
    # Rounded as stored, so the validation distances are those a check of the same volumes gives.
    gaussian = FeatureStatistics.from_dict(FeatureStatistics(
        layer, mean, rows[:kept], eigenvalues[:kept], residual_variance, 1.0, false_alarm_rate, 1, 1,
        len(vectors)).to_dict())
    threshold, within = conformal_threshold([gaussian.distance(features) for features in validation],
                                            false_alarm_rate)
    return replace(gaussian, threshold=threshold, validation_volumes=len(validation),
                   validation_within=within)


@dataclass(frozen=True)
class MemberFeatureStatistics:
    """An ensemble judged by every member (``input_statistics``' ``member_features``).

    ``members``: one :class:`FeatureStatistics` per member, in the bundle's member order, each that member's own
    Gaussian (its ``layer`` named inside the member network) and all with the one pooled threshold, its
    false-alarm rate and its out-of-fold volume counts (:func:`pool_member_statistics`); ``combination``: how the
    members' verdicts make one (:data:`COMBINATIONS`).
    """

    members: tuple[FeatureStatistics, ...]
    combination: str = COMBINATIONS[0]

    @property
    def threshold(self) -> float:
        """The pooled distance threshold every member compares its distance with."""
        return self.members[0].threshold

    def above(self, distances: Sequence[float]) -> list[bool]:
        """Per member, whether its distance (one per member, in order) lies above the threshold."""
        if len(distances) != len(self.members):
            raise FeatureStatisticsError(f"{len(distances)} distances for {len(self.members)} members")
        return [float(distance) > self.threshold for distance in distances]

    def unlike(self, distances: Sequence[float]) -> bool:
        """The combined verdict: more than half of the members find the volume unlike their training volumes."""
        return 2 * sum(self.above(distances)) > len(self.members)

    def deciding_distance(self, distances: Sequence[float]) -> float:
        """The distance that decides the majority: the ``(M // 2 + 1)``-th largest of the ``M`` members' (their
        median for an odd ``M``), above the threshold exactly when the verdict is "unlike"."""
        return float(sorted(distances, reverse=True)[len(distances) // 2])

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for ``bundle.json``."""
        return {"combination": self.combination, "members": [member.to_dict() for member in self.members]}

    @classmethod
    def from_dict(cls, values: Any, members: int | None = None) -> "MemberFeatureStatistics":
        """Read and check stored member statistics (untrusted), for an ensemble of ``members`` networks (None:
        any number from 2 to :data:`MAX_MEMBERS`).

        Raises:
            FeatureStatisticsError: a missing, unknown or malformed field, another number of members, or members
                that do not share one threshold (a phrase naming it).
        """
        if not isinstance(values, dict) or set(values) != {"combination", "members"}:
            raise FeatureStatisticsError("member_features must be an object with the fields combination and "
                                         "members")
        if values["combination"] not in COMBINATIONS:
            raise FeatureStatisticsError(f"member_features' combination must be one of {', '.join(COMBINATIONS)}, "
                                         f"got {values['combination']!r}")
        stored = values["members"]
        if not isinstance(stored, list) or not 2 <= len(stored) <= MAX_MEMBERS:
            raise FeatureStatisticsError(f"member_features' members must be a list of 2 to {MAX_MEMBERS} "
                                         "members' features")
        if members is not None and len(stored) != members:
            raise FeatureStatisticsError(f"member_features hold {len(stored)} members' features for an ensemble "
                                         f"of {members}")
        parsed = []
        for index, member in enumerate(stored):
            try:
                parsed.append(FeatureStatistics.from_dict(member))
            except FeatureStatisticsError as error:
                raise FeatureStatisticsError(f"member_features' member {index}: {error}") from None
        pooled = {(item.threshold, item.false_alarm_rate, item.validation_volumes, item.validation_within)
                  for item in parsed}
        if len(pooled) != 1:
            raise FeatureStatisticsError("member_features' members must share one threshold, false_alarm_rate and "
                                         "validation counts (the threshold pooled over the out-of-fold volumes)")
        return cls(tuple(parsed), values["combination"])


def pool_member_statistics(members: Sequence[FeatureStatistics], unseen_distances: Sequence[Sequence[float]],
                           false_alarm_rate: float = FALSE_ALARM_RATE,
                           combination: str = COMBINATIONS[0]) -> MemberFeatureStatistics:
    """Every member judged against one threshold: the :func:`conformal_threshold` of all members' distances of
    the volumes they never trained on (``unseen_distances[m]``: member m's distances of its own out-of-fold
    volumes), pooled because the members' Gaussians are fitted alike on as many patients, so their distances share
    one scale, and a member's own few volumes would put its threshold at their largest.

    Args:
        members: each member's Gaussian (:func:`fit_feature_statistics` on the volumes it trained on; its own
            threshold is replaced).
        unseen_distances: per member, the distances of the volumes it never trained on, under its Gaussian.

    Raises:
        FeatureStatisticsError: fewer than 2 members, another number of distance lists, or no distance.
    """
    if not 2 <= len(members) <= MAX_MEMBERS or len(unseen_distances) != len(members):
        raise FeatureStatisticsError(f"the members' features need 2 to {MAX_MEMBERS} members with one list of "
                                     f"out-of-fold distances each, got {len(members)} and {len(unseen_distances)}")
    pooled = [float(distance) for distances in unseen_distances for distance in distances]
    if not pooled:
        raise FeatureStatisticsError("the members' features need at least 1 out-of-fold volume")
    threshold, within = conformal_threshold(pooled, false_alarm_rate)
    return MemberFeatureStatistics(tuple(replace(member, threshold=threshold, false_alarm_rate=false_alarm_rate,
                                                 validation_volumes=len(pooled), validation_within=within)
                                         for member in members), combination)


def fit_member_statistics(layers: Sequence[str], training: Sequence[Sequence[np.ndarray]],
                          unseen: Sequence[Sequence[np.ndarray]]) -> MemberFeatureStatistics:
    """An ensemble's members judged together from their features alone: member m's Gaussian
    (:func:`fit_feature_statistics` at ``layers[m]``) from ``training[m]``, the ``(items, F)`` features of the volumes
    it trained on; its distances of ``unseen[m]``, the volumes it never trained on, pooled into one threshold
    (:func:`pool_member_statistics`). What :func:`CalibSegLib.features.fit_member_features` fits after reading the
    features, and ``calibseg-fit`` from the store's vectors.

    Raises:
        FeatureStatisticsError: not one layer, training and unseen list per member, too few volumes, or features
            that cannot be modelled (a phrase).
    """
    if not len(layers) == len(training) == len(unseen):
        raise FeatureStatisticsError(f"the members' features need the training and unseen volumes of each of the "
                                     f"{len(layers)} members, got {len(training)} and {len(unseen)}")
    statistics, distances = [], []
    for layer, trained, never in zip(layers, training, unseen):
        gaussian = fit_feature_statistics(layer, trained, never)
        statistics.append(gaussian)
        distances.append([gaussian.distance(features) for features in never])
    return pool_member_statistics(statistics, distances)
