"""The input statistics fitted: the training ranges of the training volumes, each observed with its reference labels
(:func:`fit_input_statistics`; :func:`statistics_of_cases` from a bundle's training cases under its preprocessing),
judged by the decided :data:`THRESHOLDS` and by the network's features (:func:`with_features`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from CalibSegLib.feature_statistics import FeatureStatistics, MemberFeatureStatistics
from CalibSegLib.input_check.observation import ObservationMetadata, VolumeObservation, observe_volume
from CalibSegLib.input_check.statistics import FAMILIES, InputStatistics, InputStatisticsError

__all__ = ["THRESHOLDS", "fit_input_statistics", "statistics_of_cases", "with_features"]

# The largest excursion per family still called suitable, decided on acdc_ce_dice's validation patients of
# Datasets/splits/acdc.json and degraded copies of them by the rule in docs/input_check.md: twice the largest excursion
# of a clean validation volume, at least 0.05 normalised-intensity units for the intensity families and log(1.5) (a
# factor 1.5 beyond the training range) for volumes and geometry.
THRESHOLDS: dict[str, float] = {"intensity": 0.08, "structure_intensity": 0.05, "structure_volume": math.log(1.5),
                                "geometry": math.log(1.5)}


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


def statistics_of_cases(metadata: ObservationMetadata, cases: Sequence[Any],
                        thresholds: Mapping[str, float] = THRESHOLDS,
                        features: FeatureStatistics | MemberFeatureStatistics | None = None) -> dict[str, Any]:
    """``bundle.json``'s ``input_statistics`` from a bundle's training ``cases`` (each with ``image``, ``label``
    and ``spacing`` (z, y, x) mm, as :class:`Datasets.loading.Case`), under the bundle's preprocessing, with the
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
