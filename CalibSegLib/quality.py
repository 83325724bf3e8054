"""Case-level quality from uncertainty: what a reader can act on when there is no reference.

Three parts, one concept:

- **Features** (:func:`structure_features`): per predicted structure, from the labels,
  confidence and normalised entropy of a :class:`~CalibSegLib.inference.Prediction`.
- **Quality model** (:class:`QualityModel`): per structure, a predicted Dice from one of those
  features — monotone, fitted on validation cases (:func:`fit_quality_model`), stored as plain
  numbers in ``bundle.json`` (``BundleMetadata.quality_model``) — with an interval and a review
  threshold.
- **Summary** (:func:`quality_summary`): the per-structure table the CLI writes as
  ``<case>_summary.json`` and the Slicer module shows, plus the most uncertain slices.

Definitions (every number a reader sees is one of these):

- ``volume_ml``: predicted voxel count × voxel volume (product of the spacing, mm³) / 1000.
- ``mean_confidence`` / ``mean_entropy``: means of the max probability / the entropy divided by
  log C, over the voxels predicted as the structure.
- ``low_confidence_fraction``: share of those voxels with confidence below the model's
  ``low_confidence_threshold`` (:data:`LOW_CONFIDENCE_THRESHOLD` without a model).
- ``boundary_entropy_ratio`` (a model feature, not shown): Σ normalised entropy over the
  structure and the voxels within :data:`BOUNDARY_RING` face-neighbour steps of it (city-block
  distance in voxels, the neighbouring slices included: a structure that goes on, or stops,
  one slice further is where 2D models most often err), divided by the structure's voxel
  count — roughly the share of the structure the model is unsure about, counting tissue it
  may have missed just outside.
- ``uncertain_slices``: slices along the bundle's slice axis ordered by their hot-spot
  uncertainty Σ entropy over voxels with entropy ≥ :data:`HOT_SPOT_LEVEL`, most first;
  slices without a hot spot are left out, at most :data:`MAX_UNCERTAIN_SLICES`. The level is
  the one the Slicer hot-spot overlay shows, so the list points where the overlay lights up.
- ``review``: the structure is absent from the prediction, or its predicted Dice is below the
  model's ``review_below`` (:data:`REVIEW_BELOW`). Without a quality model the predicted Dice
  and the review flag of a present structure are null — never guessed.

The fitting rule (:func:`fit_from_observations`): for each structure, every candidate pair of
feature (:data:`FEATURES`) and form (``linear``: least squares, slope forced to the feature's
monotone direction, clipped to [0, 1]; ``isotonic``: pool-adjacent-violators) is scored by its
mean absolute error in leave-one-patient-out cross-validation on the validation cases (both
frames of a patient leave together; without patient ids, leave-one-case-out); the lowest error
wins, ties to the earlier candidate (linear before isotonic, features in :data:`FEATURES` order).
The interval adds split-conformal order statistics of those held-out residuals (measured −
predicted) to the prediction, clipped to [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np
from scipy import ndimage

if TYPE_CHECKING:  # imported for annotations only: bundle.py imports this module
    from CalibSegLib.bundle import BundleMetadata
    from CalibSegLib.inference import Prediction, Predictor

__all__ = [
    "LOW_CONFIDENCE_THRESHOLD",
    "HOT_SPOT_LEVEL",
    "REVIEW_BELOW",
    "INTERVAL_COVERAGE",
    "BOUNDARY_RING",
    "MAX_UNCERTAIN_SLICES",
    "FEATURES",
    "FORMS",
    "QualityModelError",
    "StructureQuality",
    "QualityModel",
    "QualityCase",
    "structure_key",
    "structure_features",
    "uncertain_slices",
    "isotonic_fit",
    "quality_model_of",
    "quality_summary",
    "summary_columns",
    "with_predicted_dice",
    "review_text",
    "observe_case",
    "fit_from_observations",
    "fit_quality_model",
]

QUALITY_MODEL_VERSION = 1
LOW_CONFIDENCE_THRESHOLD = 0.6  # the Slicer module's default low-confidence slider
# Normalised entropy of a 75/25 split between two of four classes: the second class is a real option.
HOT_SPOT_LEVEL = 0.4
REVIEW_BELOW = 0.80  # the default: a structure predicted below Dice 0.80 goes to review
INTERVAL_COVERAGE = 0.8
BOUNDARY_RING = 2  # face-neighbour steps around a structure counted by boundary_entropy_ratio
MAX_UNCERTAIN_SLICES = 10
MIN_FIT_CASES = 3
# Feature -> the direction Dice moves when the feature grows (+1 up, -1 down).
FEATURES: dict[str, int] = {
    "mean_entropy": -1,
    "mean_confidence": 1,
    "low_confidence_fraction": -1,
    "boundary_entropy_ratio": -1,
}
FORMS: tuple[str, ...] = ("linear", "isotonic")
_SHOWN_FEATURES = ("mean_confidence", "mean_entropy", "low_confidence_fraction")  # in the summary as they are
_CHUNK_SLICES = 32  # slabs of the first axis per bincount, so no float64 copy of a whole volume is made


class QualityModelError(ValueError):
    """A quality model cannot be read or fitted.

    Reading (:meth:`QualityModel.from_dict`) says why in a phrase that ``load_bundle`` wraps in
    its one-sentence ``BundleError``; fitting says why in one sentence.
    """


def structure_key(name: str) -> str:
    """A class name as it appears in flat metric keys (``right ventricle`` → ``right_ventricle``)."""
    return name.replace(" ", "_")


# --------------------------------------------------------------------------- features


def _class_sums(labels: np.ndarray, values: np.ndarray | None, num_classes: int) -> np.ndarray:
    """Per-label sums of ``values`` (counts when None) in float64, ``(num_classes,)``."""
    totals = np.zeros(num_classes)
    for start in range(0, labels.shape[0], _CHUNK_SLICES):
        chunk = labels[start:start + _CHUNK_SLICES].ravel()
        weights = None if values is None else values[start:start + _CHUNK_SLICES].ravel().astype(np.float64)
        totals += np.bincount(chunk, weights=weights, minlength=num_classes)[:num_classes]
    return totals


def structure_features(
    prediction: "Prediction",
    num_classes: int,
    low_confidence_threshold: float = LOW_CONFIDENCE_THRESHOLD,
    boundary_ring: int = BOUNDARY_RING,
) -> list[dict[str, float] | None]:
    """Uncertainty features of each foreground class of one predicted volume.

    Args:
        prediction: ``labels`` uint8, ``confidence`` and ``entropy`` float32, all ``(z, y, x)``.
        num_classes: C, background included.
        low_confidence_threshold: confidence below this counts as low, in [0, 1].
        boundary_ring: face-neighbour steps around a structure included in ``boundary_entropy_ratio``.

    Returns:
        C-1 entries, class 1 first: ``{"voxels", "mean_confidence", "mean_entropy",
        "low_confidence_fraction", "boundary_entropy_ratio"}``, or None for a class predicted nowhere.
    """
    labels = prediction.labels
    counts = _class_sums(labels, None, num_classes)
    confidence = _class_sums(labels, prediction.confidence, num_classes)
    entropy = _class_sums(labels, prediction.entropy, num_classes)
    low = _class_sums(labels, prediction.confidence < low_confidence_threshold, num_classes)
    boxes = ndimage.find_objects(labels, max_label=num_classes - 1)
    cross = ndimage.generate_binary_structure(3, 1)
    features: list[dict[str, float] | None] = []
    for label in range(1, num_classes):
        count = counts[label]
        if count == 0:
            features.append(None)
            continue
        # The ring only reaches `boundary_ring` voxels beyond the structure's box: crop to that.
        box = tuple(slice(max(item.start - boundary_ring, 0), item.stop + boundary_ring) for item in boxes[label - 1])
        around = labels[box] == label
        if boundary_ring > 0:
            around = ndimage.binary_dilation(around, structure=cross, iterations=boundary_ring)
        features.append({
            "voxels": float(count),
            "mean_confidence": float(confidence[label] / count),
            "mean_entropy": float(entropy[label] / count),
            "low_confidence_fraction": float(low[label] / count),
            "boundary_entropy_ratio": float(prediction.entropy[box][around].sum(dtype=np.float64) / count),
        })
    return features


def uncertain_slices(
    entropy: np.ndarray, slice_axis: int = 0, level: float = HOT_SPOT_LEVEL, limit: int = MAX_UNCERTAIN_SLICES
) -> list[int]:
    """Slice indices along ``slice_axis`` by hot-spot uncertainty (Σ entropy ≥ ``level``), most first.

    ``entropy`` is the ``(z, y, x)`` normalised entropy; slices without a voxel at or above
    ``level`` are left out; equal scores keep slice order; at most ``limit`` indices.
    """
    slices = np.moveaxis(entropy, slice_axis, 0)
    scores = np.array([np.where(plane >= level, plane, 0).sum(dtype=np.float64) for plane in slices])
    order = np.argsort(-scores, kind="stable")
    return [int(index) for index in order[scores[order] > 0][:limit]]


# --------------------------------------------------------------------------- the model


def isotonic_fit(x: Sequence[float], y: Sequence[float], increasing: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares monotone fit by pool-adjacent-violators.

    Equal ``x`` values are pooled first (their mean ``y``, weighted by how many there are).

    Returns:
        ``(knots_x, knots_y)``: the distinct ``x`` in increasing order and the fitted values
        there, non-decreasing when ``increasing`` else non-increasing. Between knots the model is
        their linear interpolation, outside them the end value (``numpy.interp``).
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    knots, inverse = np.unique(x, return_inverse=True)
    weights = np.bincount(inverse).astype(np.float64)
    means = np.bincount(inverse, weights=y if increasing else -y) / weights
    # Blocks of pooled knots: mean, weight, number of knots; merged while a violation remains.
    blocks: list[list[float]] = []
    for mean, weight in zip(means, weights):
        blocks.append([mean, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            last = blocks.pop()
            previous = blocks[-1]
            total = previous[1] + last[1]
            blocks[-1] = [(previous[0] * previous[1] + last[0] * last[1]) / total, total, previous[2] + last[2]]
    fitted = np.repeat([block[0] for block in blocks], [int(block[2]) for block in blocks])
    return knots, fitted if increasing else -fitted


def _evaluate(form: str, parameters: dict[str, Any], values: np.ndarray) -> np.ndarray:
    """Predicted Dice of one form at feature ``values`` (any shape), in [0, 1]."""
    if form == "linear":
        return np.clip(parameters["intercept"] + parameters["slope"] * values, 0.0, 1.0)
    return np.interp(values, parameters["x"], parameters["y"])


@dataclass(frozen=True)
class StructureQuality:
    """Predicted Dice of one structure from one feature.

    ``parameters``: ``{"intercept", "slope"}`` for ``form == "linear"`` (clipped to [0, 1]),
    ``{"x", "y"}`` knots for ``"isotonic"`` (``x`` increasing, ``y`` monotone in the feature's
    direction, in [0, 1]). ``interval``: offsets (measured − predicted) added to the prediction
    for its interval. ``loo_mae``: the held-out mean absolute error that chose it;
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

    def predict(self, value: float) -> float:
        """Predicted Dice in [0, 1] for a feature value."""
        return float(_evaluate(self.form, self.parameters, np.float64(value)))

    def predict_interval(self, dice: float) -> tuple[float, float]:
        """The interval around a predicted Dice, clipped to [0, 1]."""
        low, high = self.interval
        return float(min(max(dice + low, 0.0), 1.0)), float(min(max(dice + high, 0.0), 1.0))

    def to_dict(self) -> dict[str, Any]:
        return {"feature": self.feature, "form": self.form, **self.parameters, "interval": list(self.interval),
                "loo_mae": self.loo_mae, "constant_loo_mae": self.constant_loo_mae, "cases": self.cases}


@dataclass(frozen=True)
class QualityModel:
    """Per-structure predicted Dice, its interval and the review rule; stored in ``bundle.json``.

    ``structures`` maps every foreground class name to its :class:`StructureQuality`.
    ``review_below``: a predicted Dice below it flags the structure. ``interval_coverage``: the
    nominal coverage of the intervals. ``low_confidence_threshold`` and ``boundary_ring``: the
    feature settings it was fitted with (applied again at prediction). ``validation``: what it
    was fitted on (cases, patients, scheme), for the record.
    """

    structures: dict[str, StructureQuality]
    review_below: float = REVIEW_BELOW
    interval_coverage: float = INTERVAL_COVERAGE
    low_confidence_threshold: float = LOW_CONFIDENCE_THRESHOLD
    boundary_ring: int = BOUNDARY_RING
    validation: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON numbers and strings, as stored in ``bundle.json``."""
        return {
            "version": QUALITY_MODEL_VERSION,
            "review_below": self.review_below,
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
        return cls(parsed, review_below, coverage, threshold, int(ring), dict(validation))


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
    if feature not in FEATURES or form not in FORMS:
        raise QualityModelError(f"{where}feature {feature!r} / form {form!r} is not one of "
                                f"{', '.join(FEATURES)} / {', '.join(FORMS)}")
    direction = FEATURES[feature]
    if form == "linear":
        intercept = _number(entry, "intercept", -1e6, 1e6, where)
        slope = _number(entry, "slope", -1e6, 1e6, where)
        if slope * direction < 0:
            raise QualityModelError(f"{where}slope {slope} runs against {feature}'s direction")
        parameters: dict[str, Any] = {"intercept": intercept, "slope": slope}
    else:
        x, y = _numbers(entry, "x", where), _numbers(entry, "y", where, 0.0, 1.0)
        steps = np.diff(y) * direction
        if len(x) != len(y) or np.any(np.diff(x) <= 0) or np.any(steps < 0):
            raise QualityModelError(f"{where}knots need as many x as y, x increasing and y monotone "
                                    f"in {feature}'s direction")
        parameters = {"x": x, "y": y}
    interval = _numbers(entry, "interval", where, -1.0, 1.0)
    if len(interval) != 2 or interval[0] > interval[1]:
        raise QualityModelError(f"{where}interval must be [low, high] with low <= high, got {interval}")
    cases = entry.get("cases")
    if not _is_int(cases) or cases < 1:
        raise QualityModelError(f"{where}cases must be a positive integer, got {cases!r}")
    return StructureQuality(feature, form, parameters, (interval[0], interval[1]),
                            _number(entry, "loo_mae", 0.0, 1.0, where),
                            _number(entry, "constant_loo_mae", 0.0, 1.0, where), int(cases))


def quality_model_of(metadata: "BundleMetadata") -> QualityModel | None:
    """The bundle's quality model, or None for a bundle without one (e.g. written before it existed)."""
    if metadata.quality_model is None:
        return None
    return QualityModel.from_dict(metadata.quality_model, metadata.class_names)


# --------------------------------------------------------------------------- the summary


def _structure_summary(features: dict[str, float] | None, voxel_mm3: float,
                       model: StructureQuality | None, review_below: float) -> dict[str, Any]:
    if features is None:  # predicted nowhere: nothing to average, and a reader must look
        return {"volume_ml": 0.0, "mean_confidence": None, "mean_entropy": None, "low_confidence_fraction": None,
                "predicted_dice": None, "predicted_dice_interval": None, "review": True}
    summary: dict[str, Any] = {"volume_ml": features["voxels"] * voxel_mm3 / 1000.0,
                               **{key: features[key] for key in _SHOWN_FEATURES}}
    if model is None:
        return {**summary, "predicted_dice": None, "predicted_dice_interval": None, "review": None}
    dice = model.predict(features[model.feature])
    return {**summary, "predicted_dice": dice, "predicted_dice_interval": list(model.predict_interval(dice)),
            "review": dice < review_below}


def _case_review(flags: Sequence[bool | None]) -> bool | None:
    """True when any structure is flagged; None when none is but some are unknown; else False."""
    if any(flag is True for flag in flags):
        return True
    return None if any(flag is None for flag in flags) else False


def quality_summary(prediction: "Prediction", spacing: Sequence[float], metadata: "BundleMetadata",
                    hot_spot_level: float = HOT_SPOT_LEVEL) -> dict[str, Any]:
    """The per-structure quality summary of one predicted volume, without a reference.

    Args:
        prediction: the bundle's prediction, all arrays ``(z, y, x)``.
        spacing: the volume's voxel size ``(z, y, x)`` in mm (volumes are in mL from it).
        metadata: the bundle's metadata: class names, slice axis and its quality model (if any).
        hot_spot_level: normalised entropy from which a voxel counts for ``uncertain_slices``.

    Returns:
        ``{"structures": {name: {"volume_ml", "mean_confidence", "mean_entropy",
        "low_confidence_fraction", "predicted_dice", "predicted_dice_interval": [lo, hi],
        "review"}}, "review", "uncertain_slices", "slice_axis", "hot_spot_level",
        "quality_model", "note"}`` — JSON-ready; undefined values are None (see the module
        docstring for every definition).
    """
    model = quality_model_of(metadata)
    threshold = model.low_confidence_threshold if model else LOW_CONFIDENCE_THRESHOLD
    ring = model.boundary_ring if model else BOUNDARY_RING
    axis = metadata.preprocessing.slice_axis
    features = structure_features(prediction, metadata.num_classes, threshold, ring)
    voxel_mm3 = float(np.prod([float(value) for value in spacing]))
    review_below = model.review_below if model else REVIEW_BELOW
    structures = {
        name: _structure_summary(values, voxel_mm3, model.structures[name] if model else None, review_below)
        for name, values in zip(metadata.class_names[1:], features)
    }
    if model is None:
        described = None
        note = ("no quality model: this bundle has none, so predicted Dice and the review flag of a present "
                "structure are null (a structure predicted nowhere is still flagged); fit one with "
                "python Training/fit_quality.py --bundle <bundle>")
    else:
        described = {"review_below": model.review_below, "interval_coverage": model.interval_coverage,
                     "validation": model.validation}
        note = (f"review: predicted Dice below {model.review_below:.2f} or the structure predicted nowhere; "
                f"predicted Dice from uncertainty, fitted on validation cases; intervals of nominal "
                f"{model.interval_coverage:.0%} coverage")
    return {
        "structures": structures,
        "review": _case_review([entry["review"] for entry in structures.values()]),
        "uncertain_slices": uncertain_slices(prediction.entropy, axis, hot_spot_level),
        "slice_axis": axis,
        "hot_spot_level": hot_spot_level,
        "quality_model": described,
        "note": note,
    }


def review_text(summary: dict[str, Any]) -> str:
    """One sentence for the reader on a :func:`quality_summary`: which structures to review and why
    (the Slicer module, the command line and the README picture show it)."""
    flagged = [(name, entry) for name, entry in summary["structures"].items() if entry["review"]]
    if flagged:
        reasons = [f"{name} (predicted nowhere)" if entry["predicted_dice"] is None
                   else f"{name} (predicted Dice {entry['predicted_dice']:.2f})" for name, entry in flagged]
        return f"Review: {', '.join(reasons)}."
    if summary["review"] is None:
        return ("This bundle has no quality model, so no predicted Dice; "
                "check the hot spots and uncertain slices.")
    review_below = summary["quality_model"]["review_below"]
    return f"No structure flagged: every predicted Dice is {review_below:.2f} or more."


def _structure_columns(name: str, entry: dict[str, Any]) -> dict[str, float]:
    key = structure_key(name)
    low, high = entry["predicted_dice_interval"] or (None, None)
    return {column: math.nan if value is None else float(value)
            for column, value in ((f"predicted_dice_{key}", entry["predicted_dice"]),
                                  (f"predicted_dice_low_{key}", low), (f"predicted_dice_high_{key}", high),
                                  (f"review_{key}", entry["review"]))}


def summary_columns(summary: dict[str, Any]) -> dict[str, float]:
    """Flat per-structure columns of a summary for metric rows and CSV files.

    ``predicted_dice_<structure>``, ``predicted_dice_low_<structure>``,
    ``predicted_dice_high_<structure>`` and ``review_<structure>`` (1.0 / 0.0); NaN where null.
    """
    return {column: value for name, entry in summary["structures"].items()
            for column, value in _structure_columns(name, entry).items()}


def with_predicted_dice(row: dict[str, float], summary: dict[str, Any]) -> dict[str, float]:
    """A flat metrics ``row`` with each structure's :func:`summary_columns` right after its measured
    ``dice_<structure>`` (appended at the end for a structure the row has no Dice of)."""
    groups = {f"dice_{structure_key(name)}": _structure_columns(name, entry)
              for name, entry in summary["structures"].items()}
    merged: dict[str, float] = {}
    for key, value in row.items():
        merged[key] = value
        merged.update(groups.pop(key, {}))
    for columns in groups.values():
        merged.update(columns)
    return merged


# --------------------------------------------------------------------------- fitting


class QualityCase(Protocol):
    """A validation case: ``image`` and ``label`` ``(z, y, x)``, ``spacing`` ``(z, y, x)`` mm.

    ``Training.data.Case`` is one; an optional ``patient_id`` groups cases for leave-one-out.
    """

    image: np.ndarray
    label: np.ndarray
    spacing: tuple[float, float, float]


def observe_case(predictor: "Predictor", image: np.ndarray, label: np.ndarray, spacing: Sequence[float],
                 low_confidence_threshold: float = LOW_CONFIDENCE_THRESHOLD, boundary_ring: int = BOUNDARY_RING,
                 ) -> tuple[list[dict[str, float] | None], np.ndarray]:
    """Predict one case; return its :func:`structure_features` and measured Dice ``(C-1,)``."""
    from CalibSegLib.metrics import dice

    metadata = predictor.metadata
    prediction = predictor.predict(image, spacing)
    features = structure_features(prediction, metadata.num_classes, low_confidence_threshold, boundary_ring)
    return features, dice(prediction.labels, np.asarray(label).astype(np.int64), metadata.num_classes)


def _fit(form: str, x: np.ndarray, y: np.ndarray, direction: int) -> dict[str, Any]:
    """Parameters of one form fitted to ``(x, y)``; monotone in ``direction``."""
    if form == "isotonic":
        knots, fitted = isotonic_fit(x, y, increasing=direction > 0)
        return {"x": knots.tolist(), "y": np.clip(fitted, 0.0, 1.0).tolist()}
    slope = 0.0
    if np.ptp(x) > 0:
        slope = float(np.polyfit(x, y, 1)[0])
        slope = slope if slope * direction > 0 else 0.0  # a wrong-signed trend is no trend
    return {"intercept": float(y.mean() - slope * x.mean()), "slope": slope}


def _held_out_residuals(form: str | None, x: np.ndarray, y: np.ndarray, groups: np.ndarray,
                        direction: int) -> np.ndarray:
    """Measured − predicted for each case, predicted by a fit on the other groups (None: the mean)."""
    residuals = np.empty_like(y)
    for group in np.unique(groups):
        held = groups == group
        if form is None:
            residuals[held] = y[held] - y[~held].mean()
        else:
            residuals[held] = y[held] - _evaluate(form, _fit(form, x[~held], y[~held], direction), x[held])
    return residuals


def _conformal_offsets(residuals: np.ndarray, coverage: float) -> tuple[float, float]:
    """Split-conformal order statistics of held-out residuals for a two-sided ``coverage`` interval."""
    ordered = np.sort(residuals)
    count, tail = len(ordered), (1.0 - coverage) / 2.0
    # The 1e-9 keeps float rounding of e.g. 20 × 0.1 = 1.9999999999999996 from moving a rank.
    low = max(math.floor((count + 1) * tail + 1e-9), 1)
    high = min(math.ceil((count + 1) * (1.0 - tail) - 1e-9), count)
    return float(ordered[low - 1]), float(ordered[high - 1])


def fit_from_observations(
    features: Sequence[Sequence[dict[str, float] | None]],
    dice: np.ndarray,
    class_names: Sequence[str],
    groups: Sequence[str] | None = None,
    review_below: float = REVIEW_BELOW,
    interval_coverage: float = INTERVAL_COVERAGE,
    low_confidence_threshold: float = LOW_CONFIDENCE_THRESHOLD,
    boundary_ring: int = BOUNDARY_RING,
) -> QualityModel:
    """Choose and fit each structure's predicted-Dice model (the rule is in the module docstring).

    Args:
        features: per case, :func:`structure_features` (C-1 entries, None where predicted nowhere).
        dice: measured Dice ``(cases, C-1)``.
        class_names: C names, background first.
        groups: per case, the patient id; cases of one patient are held out together. None:
            every case is its own group.
        review_below, interval_coverage: stored in the model (see :class:`QualityModel`).
        low_confidence_threshold, boundary_ring: the settings ``features`` were computed with.

    Raises:
        QualityModelError: fewer than 3 cases predict a structure, or they come from one group.
    """
    dice = np.asarray(dice, dtype=np.float64)
    groups = np.asarray(groups if groups is not None else [str(index) for index in range(len(features))])
    if dice.shape != (len(features), len(class_names) - 1) or len(groups) != len(features):
        raise QualityModelError(f"Fitting needs one feature list, one Dice per structure and one group per case; "
                                f"got {len(features)} feature lists, Dice {dice.shape} and {len(groups)} groups.")
    structures = {}
    for index, name in enumerate(class_names[1:]):
        present = np.array([case[index] is not None for case in features], dtype=bool)
        y, held_groups = dice[present, index], groups[present]
        if present.sum() < MIN_FIT_CASES or len(np.unique(held_groups)) < 2:
            raise QualityModelError(f"Only {int(present.sum())} validation case(s) of "
                                    f"{len(np.unique(held_groups))} patient(s) predict {name!r}; at least "
                                    f"{MIN_FIT_CASES} cases of 2 patients are needed to fit and check a model.")
        best = None
        for feature, direction in FEATURES.items():
            x = np.array([case[index][feature] for case, keep in zip(features, present) if keep])
            for form in FORMS:
                residuals = _held_out_residuals(form, x, y, held_groups, direction)
                error = float(np.abs(residuals).mean())
                if best is None or error < best[0] - 1e-12:
                    best = (error, feature, form, x, residuals)
        error, feature, form, x, residuals = best
        baseline = float(np.abs(_held_out_residuals(None, x, y, held_groups, 0)).mean())
        structures[name] = StructureQuality(feature, form, _fit(form, x, y, FEATURES[feature]),
                                            _conformal_offsets(residuals, interval_coverage), error, baseline,
                                            int(present.sum()))
    validation = {"cases": len(features), "patients": len(np.unique(groups)),
                  "scheme": "leave-one-patient-out" if len(np.unique(groups)) < len(features) else "leave-one-case-out"}
    return QualityModel(structures, review_below, interval_coverage, low_confidence_threshold, boundary_ring,
                        validation)


def fit_quality_model(predictor: "Predictor", cases: Sequence[QualityCase], class_names: Sequence[str] | None = None,
                      review_below: float = REVIEW_BELOW) -> QualityModel:
    """Predict every validation case, measure its Dice per structure and fit the quality model.

    Args:
        predictor: the model to describe, at the temperature it will be used with.
        cases: validation cases (never training or test ones): ``image``, ``label``, ``spacing``
            and optionally ``patient_id`` (``Training.data.Case`` works as it is).
        class_names: C names, background first (default: the predictor's bundle's).
        review_below: predicted Dice under which a structure is flagged.

    Returns:
        The model; store it with ``dataclasses.replace(metadata, quality_model=model.to_dict())``.

    Raises:
        QualityModelError: too few cases predict some structure (see :func:`fit_from_observations`).
    """
    class_names = list(class_names or predictor.metadata.class_names)
    observed = [observe_case(predictor, case.image, case.label, case.spacing) for case in cases]
    groups = [str(getattr(case, "patient_id", None) or index) for index, case in enumerate(cases)]
    dice = np.array([scores for _, scores in observed]).reshape(len(cases), len(class_names) - 1)
    return fit_from_observations([features for features, _ in observed], dice, class_names, groups, review_below)
