"""The quality model: per structure, a predicted Dice from the mean of one linear fit per uncertainty feature
(older bundles: from one feature), its interval and the review rule — the schema stored as plain numbers in
``bundle.json`` (``BundleMetadata.quality_model``).

Reading and checking it (:meth:`QualityModel.from_dict`) needs neither the bundle nor the predictor,
so the bundle schema validates it without importing them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from CalibSegLib.uncertainty_levels import LOW_CONFIDENCE_THRESHOLD

__all__ = ["QUALITY_MODEL_VERSION", "LOW_CONFIDENCE_THRESHOLD", "REVIEW_BELOW", "INTERVAL_COVERAGE", "BOUNDARY_RING",
           "FEATURES", "UNCERTAINTY_FEATURES", "SIZE_FEATURE", "MIRROR_AGREEMENT", "MEAN_DISAGREEMENT",
           "OPTIONAL_FEATURES", "FORMS", "AVERAGED", "APPLIED_TO", "MEMBERS",
           "AVERAGED_FEATURES", "PARAMETER_BOUND", "QualityModelError", "structure_key", "StructureQuality",
           "QualityModel", "evaluate_form", "thresholds_text"]

QUALITY_MODEL_VERSION = 1
REVIEW_BELOW = 0.80  # the default: a structure predicted below Dice 0.80 goes to review
INTERVAL_COVERAGE = 0.8
BOUNDARY_RING = 2  # face-neighbour steps around a structure counted by the boundary_* features
# The agreement of the mirrored passes: only a bundle that mirrors has it (CalibSegLib.sliding_window.MirrorAgreement).
MIRROR_AGREEMENT = "mirror_agreement"
# The ensemble members' mean disagreement inside the structure: only an ensemble has it (CalibSegLib.inference).
MEAN_DISAGREEMENT = "mean_disagreement"
# Features some predictions lack: a fit averages one only where every observation has it.
OPTIONAL_FEATURES: tuple[str, ...] = (MIRROR_AGREEMENT, MEAN_DISAGREEMENT)
# Feature -> the direction Dice moves when the feature grows (+1 up, -1 down).
FEATURES: dict[str, int] = {
    "mean_entropy": -1,
    "mean_confidence": 1,
    "low_confidence_fraction": -1,
    "boundary_entropy_ratio": -1,
    "expected_dice": 1,
    "boundary_low_confidence_ratio": -1,
    "log_volume_ml": 1,
    MIRROR_AGREEMENT: 1,
    MEAN_DISAGREEMENT: -1,
}
# What a structure's uncertainty says about its Dice: every quality model averages one linear fit per feature of these.
UNCERTAINTY_FEATURES: tuple[str, ...] = ("mean_entropy", "mean_confidence", "low_confidence_fraction",
                                         "boundary_entropy_ratio", "expected_dice", "boundary_low_confidence_ratio")
# The structure's size: joins a structure's average only where it lowers the held-out error (quality/fitting.py).
SIZE_FEATURE = "log_volume_ml"
# Forms a stored structure may take: the fit writes AVERAGED; single-feature forms are read for older bundles.
FORMS: tuple[str, ...] = ("linear", "isotonic")
# The form that chooses no feature: one linear fit per feature (each held to its direction), their mean.
AVERAGED = "linear_mean"
AVERAGED_FEATURES = "features, averaged"  # what an averaged structure's ``feature`` says
# The key of a model's ``validation`` record that says what it predicts from, and its value for an ensemble's model
# fitted on its single fold networks' predictions: applied to each member's own (CalibSegLib.quality.members).
APPLIED_TO = "applied_to"
MEMBERS = "members"
# The largest intercept or slope a stored linear fit may have: larger ones only come from a feature that barely varies.
PARAMETER_BOUND = 1e6


def structure_key(name: str) -> str:
    """A class name as it appears in flat metric keys (``right ventricle`` → ``right_ventricle``)."""
    return name.replace(" ", "_")


class QualityModelError(ValueError):
    """A quality model cannot be read or fitted.

    Reading (:meth:`QualityModel.from_dict`) says why in a phrase that ``load_bundle`` wraps in
    its one-sentence ``BundleError``; fitting says why in one sentence.
    """


def evaluate_form(form: str, parameters: dict[str, Any], values: Any) -> np.ndarray:
    """Predicted Dice of one form, in [0, 1]: at feature ``values`` (any shape), or for :data:`AVERAGED` at
    ``values[feature]`` of each term (a mapping of equally shaped arrays or numbers)."""
    if form == "linear":
        return np.clip(parameters["intercept"] + parameters["slope"] * values, 0.0, 1.0)
    if form == AVERAGED:
        return np.mean([evaluate_form("linear", term, values[term["feature"]]) for term in parameters["terms"]],
                       axis=0)
    return np.interp(values, parameters["x"], parameters["y"])


@dataclass(frozen=True)
class StructureQuality:
    """Predicted Dice of one structure from one feature, or from several averaged.

    ``parameters``: ``{"intercept", "slope"}`` for ``form == "linear"`` (clipped to [0, 1]),
    ``{"x", "y"}`` knots for ``"isotonic"`` (``x`` increasing, ``y`` monotone in the feature's
    direction, in [0, 1]); for :data:`AVERAGED`, ``{"terms": [{"feature", "intercept", "slope"}, ...]}``,
    one linear fit per feature, and ``feature`` is :data:`AVERAGED_FEATURES`. ``interval``: offsets (measured −
    predicted) added to the prediction for its interval. ``loo_mae``: the held-out mean absolute error that chose it;
    ``constant_loo_mae``: the same for always predicting the mean validation Dice (the baseline
    the feature has to beat); ``cases``: validation cases it was fitted on.
    """

    feature: str
    form: str
    parameters: dict[str, Any]
    interval: tuple[float, float]
    loo_mae: float
    constant_loo_mae: float
    cases: int

    @property
    def inputs(self) -> tuple[str, ...]:
        """The features the prediction reads (keys of :data:`FEATURES`)."""
        if self.form == AVERAGED:
            return tuple(term["feature"] for term in self.parameters["terms"])
        return (self.feature,)

    def predict(self, features: Mapping[str, float]) -> float:
        """Predicted Dice in [0, 1] from a structure's features (:func:`~CalibSegLib.quality.structure_features`)."""
        if self.form == AVERAGED:
            return float(evaluate_form(self.form, self.parameters, features))
        return float(evaluate_form(self.form, self.parameters, np.float64(features[self.feature])))

    def predict_interval(self, dice: float) -> tuple[float, float]:
        """The interval around a predicted Dice, clipped to [0, 1]."""
        low, high = self.interval
        return float(min(max(dice + low, 0.0), 1.0)), float(min(max(dice + high, 0.0), 1.0))

    def to_dict(self) -> dict[str, Any]:
        named = {} if self.form == AVERAGED else {"feature": self.feature}
        return {**named, "form": self.form, **self.parameters, "interval": list(self.interval),
                "loo_mae": self.loo_mae, "constant_loo_mae": self.constant_loo_mae, "cases": self.cases}


@dataclass(frozen=True)
class QualityModel:
    """Per-structure predicted Dice, its interval and the review rule; stored in ``bundle.json``.

    ``structures`` maps every foreground class name to its :class:`StructureQuality`.
    ``review_below``: a predicted Dice below it flags the structure; ``review_below_by_structure`` (structure name →
    threshold; empty: ``review_below`` for all), when the review rule chose one per structure
    (:func:`CalibSegLib.quality.review_rule.choose_review_rule`; :meth:`review_threshold` reads them). An older
    CalibSeg that does not know the key flags at ``review_below``, the pooled rule's threshold.
    ``interval_coverage``: the nominal coverage of the intervals. ``low_confidence_threshold`` and ``boundary_ring``:
    the feature settings it was fitted with (applied again at prediction). ``validation``: what it was fitted on
    (cases, patients, scheme), for the record; its :data:`APPLIED_TO` is :data:`MEMBERS` for an
    ensemble's model fitted on single networks (:attr:`per_member`).
    """

    structures: dict[str, StructureQuality]
    review_below: float = REVIEW_BELOW
    interval_coverage: float = INTERVAL_COVERAGE
    low_confidence_threshold: float = LOW_CONFIDENCE_THRESHOLD
    boundary_ring: int = BOUNDARY_RING
    validation: dict[str, Any] = field(default_factory=dict)
    review_below_by_structure: dict[str, float] = field(default_factory=dict)

    def review_threshold(self, name: str) -> float:
        """The predicted Dice below which structure ``name`` is flagged."""
        return self.review_below_by_structure.get(name, self.review_below)

    @property
    def per_member(self) -> bool:
        """Whether an ensemble applies it to each member's own prediction (it was fitted on single networks')."""
        return self.validation.get(APPLIED_TO) == MEMBERS

    @property
    def inputs(self) -> tuple[str, ...]:
        """Every feature some structure's prediction reads, in :data:`FEATURES` order."""
        read = {name for structure in self.structures.values() for name in structure.inputs}
        return tuple(name for name in FEATURES if name in read)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON numbers and strings, as stored in ``bundle.json``."""
        return {
            "version": QUALITY_MODEL_VERSION,
            "review_below": self.review_below,
            **({"review_below_by_structure": dict(self.review_below_by_structure)}
               if self.review_below_by_structure else {}),
            "interval_coverage": self.interval_coverage,
            "low_confidence_threshold": self.low_confidence_threshold,
            "boundary_ring": self.boundary_ring,
            "validation": dict(self.validation),
            "structures": {name: structure.to_dict() for name, structure in self.structures.items()},
        }

    @classmethod
    def from_dict(cls, values: Any, class_names: Sequence[str] | None = None) -> "QualityModel":
        """Parse and check a stored model; ``class_names`` (background first) must match its structures.

        Raises:
            QualityModelError: one phrase naming the first malformed entry.
        """
        if not isinstance(values, dict):
            raise QualityModelError(f"it must be an object, got {type(values).__name__}")
        if values.get("version") != QUALITY_MODEL_VERSION:
            raise QualityModelError(f"its version is {values.get('version')!r}, this CalibSeg reads "
                                    f"{QUALITY_MODEL_VERSION}")
        review_below = _number(values, "review_below", 0.0, 1.0)
        coverage = _number(values, "interval_coverage", 0.0, 1.0)
        threshold = _number(values, "low_confidence_threshold", 0.0, 1.0)
        ring = values.get("boundary_ring")
        if not _is_int(ring) or ring < 0:
            raise QualityModelError(f"boundary_ring must be a non-negative integer, got {ring!r}")
        validation = values.get("validation", {})
        structures = values.get("structures")
        if not isinstance(validation, dict) or not isinstance(structures, dict) or not structures:
            raise QualityModelError("validation and structures must be objects, structures not empty")
        if class_names is not None and set(structures) != set(class_names[1:]):
            raise QualityModelError(f"its structures {sorted(structures)} are not the foreground classes "
                                    f"{list(class_names[1:])}")
        parsed = {name: _structure_from_dict(name, entry) for name, entry in structures.items()}
        by_structure = values.get("review_below_by_structure", {})
        if not isinstance(by_structure, dict) or (by_structure and set(by_structure) != set(structures)):
            raise QualityModelError(f"review_below_by_structure must name every structure {sorted(structures)}, "
                                    f"got {by_structure!r}")
        thresholds = {name: _number(by_structure, name, 0.0, 1.0, "review_below_by_structure ")
                      for name in by_structure}
        return cls(parsed, review_below, coverage, threshold, int(ring), dict(validation), thresholds)


def thresholds_text(review_below: float, by_structure: Mapping[str, float]) -> str:
    """A model's review thresholds as a reader sees them: ``0.88``, or, where the review rule chose one per
    structure, ``0.88 (right ventricle), 0.90 (left ventricle)`` in ``by_structure``'s order."""
    if not by_structure:
        return f"{review_below:.2f}"
    return ", ".join(f"{threshold:.2f} ({name})" for name, threshold in by_structure.items())


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            and math.isfinite(value))


def _number(values: dict, key: str, low: float, high: float, where: str = "") -> float:
    """``values[key]`` as a float in [low, high], else :class:`QualityModelError`."""
    value = values.get(key)
    if not _is_number(value) or not low <= value <= high:
        raise QualityModelError(f"{where}{key} must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def _numbers(values: dict, key: str, where: str, low: float = -math.inf, high: float = math.inf) -> list[float]:
    """``values[key]`` as a non-empty list of finite numbers in [low, high]."""
    items = values.get(key)
    if not isinstance(items, list) or not items or not all(_is_number(v) and low <= v <= high for v in items):
        raise QualityModelError(f"{where}{key} must be a non-empty list of numbers in [{low:g}, {high:g}], "
                                f"got {items!r}")
    return [float(v) for v in items]


def _structure_from_dict(name: str, entry: Any) -> StructureQuality:
    where = f"structure {name!r}: "
    if not isinstance(entry, dict):
        raise QualityModelError(f"{where}must be an object, got {type(entry).__name__}")
    feature, form = entry.get("feature"), entry.get("form")
    if form == AVERAGED:
        feature, parameters = AVERAGED_FEATURES, {"terms": _averaged_terms(entry, where)}
    elif feature not in FEATURES or form not in FORMS:
        raise QualityModelError(f"{where}feature {feature!r} / form {form!r} is not one of "
                                f"{', '.join(FEATURES)} / {', '.join(FORMS)} (or form {AVERAGED!r} with terms)")
    else:
        parameters = (_linear if form == "linear" else _isotonic)(entry, feature, where)
    interval = _numbers(entry, "interval", where, -1.0, 1.0)
    if len(interval) != 2 or interval[0] > interval[1]:
        raise QualityModelError(f"{where}interval must be [low, high] with low <= high, got {interval}")
    cases = entry.get("cases")
    if not _is_int(cases) or cases < 1:
        raise QualityModelError(f"{where}cases must be a positive integer, got {cases!r}")
    return StructureQuality(feature, form, parameters, (interval[0], interval[1]),
                            _number(entry, "loo_mae", 0.0, 1.0, where),
                            _number(entry, "constant_loo_mae", 0.0, 1.0, where), int(cases))


def _linear(entry: dict, feature: str, where: str) -> dict[str, float]:
    """``{"intercept", "slope"}`` of a linear fit on ``feature``, the slope in the feature's direction."""
    intercept = _number(entry, "intercept", -PARAMETER_BOUND, PARAMETER_BOUND, where)
    slope = _number(entry, "slope", -PARAMETER_BOUND, PARAMETER_BOUND, where)
    if slope * FEATURES[feature] < 0:
        raise QualityModelError(f"{where}slope {slope} runs against {feature}'s direction")
    return {"intercept": intercept, "slope": slope}


def _isotonic(entry: dict, feature: str, where: str) -> dict[str, list[float]]:
    """``{"x", "y"}`` knots: ``x`` increasing, ``y`` in [0, 1] and monotone in the feature's direction."""
    x, y = _numbers(entry, "x", where), _numbers(entry, "y", where, 0.0, 1.0)
    steps = np.diff(y) * FEATURES[feature]
    if len(x) != len(y) or np.any(np.diff(x) <= 0) or np.any(steps < 0):
        raise QualityModelError(f"{where}knots need as many x as y, x increasing and y monotone "
                                f"in {feature}'s direction")
    return {"x": x, "y": y}


def _averaged_terms(entry: dict, where: str) -> list[dict[str, Any]]:
    """The terms of an :data:`AVERAGED` structure: linear fits of distinct known features."""
    terms = entry.get("terms")
    if not isinstance(terms, list) or not terms or not all(isinstance(term, dict) for term in terms):
        raise QualityModelError(f"{where}terms must be a non-empty list of objects, got {terms!r}")
    features = [term.get("feature") for term in terms]
    if any(feature not in FEATURES for feature in features) or len(set(features)) != len(features):
        raise QualityModelError(f"{where}terms must name distinct features of {', '.join(FEATURES)}, got {features}")
    return [{"feature": feature, **_linear(term, feature, where)} for feature, term in zip(features, terms)]
