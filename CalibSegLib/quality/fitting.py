"""Fitting the quality model: per structure, the predicted Dice is the mean of one linear fit per feature.

The method, for each structure (:func:`fit_from_observations`):

- every uncertainty feature (:data:`~CalibSegLib.quality.model.UNCERTAINTY_FEATURES`, and the mirrored passes'
  agreement when every observation has it, i.e. the bundle mirrors) gets a least-squares line, its slope held to
  the feature's monotone direction (a wrong-signed trend is no trend); the prediction is their mean, clipped to
  [0, 1];
- the structure's size (:data:`~CalibSegLib.quality.model.SIZE_FEATURE`) joins that mean only where it lowers the
  structure's held-out error (a small structure is a hard one for some anatomy, e.g. ACDC's end-systolic left
  ventricle, and noise for others);
- the held-out error is the mean absolute error in leave-one-patient-out cross-validation (both frames of a
  patient, or the several networks' predictions of one patient, leave together; without patient ids,
  leave-one-case-out), beside that of always predicting the mean Dice (the baseline a feature has to beat);
- the interval adds split-conformal order statistics of those held-out residuals (measured − predicted) to the
  prediction, clipped to [0, 1].

The observations are an input, not part of the method: a bundle's validation patients
(:func:`observe_cases`, what ``calibseg-train`` fits on), and, when given, fold networks' out-of-fold
predictions of the training patients (``calibseg-fit-quality --fold-bundles``), which give the fit many more
patients than one validation split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from CalibSegLib.metrics import dice as dice_scores
from CalibSegLib.prediction import Prediction
from CalibSegLib.quality.features import structure_features
from CalibSegLib.quality.model import (AVERAGED, AVERAGED_FEATURES, FEATURES, INTERVAL_COVERAGE, OPTIONAL_FEATURES,
                                       PARAMETER_BOUND, REVIEW_BELOW, SIZE_FEATURE, UNCERTAINTY_FEATURES,
                                       QualityModel, QualityModelError, StructureQuality, evaluate_form)

__all__ = ["MIN_FIT_CASES", "QualityCase", "PredictedClasses", "CasePredictor", "Observation", "check_references",
           "observe_cases", "fit_from_observations", "held_out_predictions", "fit_quality_model"]

MIN_FIT_CASES = 3


class QualityCase(Protocol):
    """A validation case: ``image`` and ``label`` ``(z, y, x)``, ``spacing`` ``(z, y, x)`` mm, ``patient_id``.

    ``Datasets.loading.Case`` is one.
    """

    image: np.ndarray
    label: np.ndarray
    spacing: tuple[float, float, float]
    patient_id: str


class PredictedClasses(Protocol):
    """The classes a predictor labels (its ``metadata``; :class:`CalibSegLib.bundle.BundleMetadata` is one):
    ``class_names``, background first, and their count."""

    @property
    def class_names(self) -> Sequence[str]: ...

    @property
    def num_classes(self) -> int: ...


class CasePredictor(Protocol):
    """What the fit predicts its cases with (:class:`CalibSegLib.inference.Predictor` is one): a volume's
    prediction under the settings, temperature and post-processing it will be used with, and the classes it labels.
    Named here, the fit needs no predictor or bundle, which store its model and so sit above quality."""

    @property
    def metadata(self) -> PredictedClasses: ...

    def predict(self, image: np.ndarray, spacing: Sequence[float]) -> Prediction: ...


@dataclass(frozen=True)
class Observation:
    """One predicted volume: its patient, :func:`structure_features` (C-1 entries, None where the structure is
    predicted nowhere) and measured Dice ``(C-1,)``."""

    patient: str
    features: list[dict[str, float] | None]
    dice: np.ndarray


def check_references(cases: Sequence[QualityCase], class_names: Sequence[str]) -> None:
    """Refuse validation ``cases`` whose references hold some structure of ``class_names`` (background first) in
    fewer than :data:`MIN_FIT_CASES` volumes: where the reference lacks a structure its Dice is 0 or 1 by
    definition, whatever the model did, so it says nothing about the model.

    Raises:
        QualityModelError: one sentence naming the structure.
    """
    for index, name in enumerate(class_names[1:], start=1):
        containing = sum(bool(np.any(np.asarray(case.label) == index)) for case in cases)
        if containing < MIN_FIT_CASES:
            raise QualityModelError(
                f"Only {containing} of {len(cases)} validation references contain {name!r} (at least {MIN_FIT_CASES} "
                "are needed), so its Dice there would say nothing about the model; check the validation labels.")


def observe_cases(predictor: CasePredictor, cases: Sequence[QualityCase]) -> list[Observation]:
    """Predict every case with ``predictor`` (its bundle's settings, temperature and post-processing) and measure
    it against its label."""
    metadata = predictor.metadata
    observations = []
    for case in cases:
        prediction = predictor.predict(case.image, case.spacing)
        features = structure_features(prediction, metadata.num_classes, spacing=case.spacing)
        scores = dice_scores(prediction.labels, np.asarray(case.label).astype(np.int64), metadata.num_classes)
        observations.append(Observation(str(case.patient_id), features, np.asarray(scores, dtype=np.float64)))
    return observations


def _fit_terms(x: dict[str, np.ndarray], y: np.ndarray) -> dict[str, list[dict[str, float]]]:
    """One least-squares line per feature of ``x`` (values ``(cases,)``), each slope held to its feature's
    direction; the averaged form's parameters. A wrong-signed trend is no trend, and so is one steeper than the
    stored schema holds (:data:`PARAMETER_BOUND`: a feature that barely varies, e.g. nearly constant on a short
    run's validation cases)."""
    terms = []
    for name, values in x.items():
        slope = 0.0
        if np.ptp(values) > 0:
            slope = float(np.polyfit(values, y, 1)[0])
            slope = slope if slope * FEATURES[name] > 0 else 0.0
        intercept = float(y.mean() - slope * values.mean())
        if max(abs(slope), abs(intercept)) > PARAMETER_BOUND:
            slope, intercept = 0.0, float(y.mean())
        terms.append({"feature": name, "intercept": intercept, "slope": slope})
    return {"terms": terms}


def _held_out_residuals(x: dict[str, np.ndarray] | None, y: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Measured − predicted for each case, predicted by a fit on the other groups (``x`` None: their mean Dice)."""
    residuals = np.empty_like(y)
    for group in np.unique(groups):
        held = groups == group
        if x is None:
            residuals[held] = y[held] - y[~held].mean()
        else:
            fitted = _fit_terms({name: values[~held] for name, values in x.items()}, y[~held])
            residuals[held] = y[held] - evaluate_form(AVERAGED, fitted,
                                                      {name: values[held] for name, values in x.items()})
    return residuals


def _conformal_offsets(residuals: np.ndarray, coverage: float) -> tuple[float, float]:
    """Split-conformal order statistics of held-out residuals for a two-sided ``coverage`` interval."""
    ordered = np.sort(residuals)
    count, tail = len(ordered), (1.0 - coverage) / 2.0
    # The 1e-9 keeps float rounding of e.g. 20 × 0.1 = 1.9999999999999996 from moving a rank.
    low = max(math.floor((count + 1) * tail + 1e-9), 1)
    high = min(math.ceil((count + 1) * (1.0 - tail) - 1e-9), count)
    return float(ordered[low - 1]), float(ordered[high - 1])


@dataclass(frozen=True)
class _StructureFit:
    """One structure's fitting data: the features chosen ``x`` (name → ``(cases,)``), measured Dice ``y``, the
    cases' patients ``groups``, their held-out residuals (measured − predicted without the case's patient) and
    ``rows``, the observations' indices these cases come from (those that predict the structure)."""

    x: dict[str, np.ndarray]
    y: np.ndarray
    groups: np.ndarray
    residuals: np.ndarray
    rows: np.ndarray


def _structure_fit(observations: Sequence[Observation], index: int, name: str) -> _StructureFit:
    """The features, data and held-out residuals of structure ``index`` (``name``); the size joins the features
    where it lowers the held-out error (the method in the module docstring)."""
    rows = np.array([number for number, item in enumerate(observations) if item.features[index] is not None],
                    dtype=np.int64)
    features = [observations[number].features[index] for number in rows]
    y = np.array([observations[number].dice[index] for number in rows])
    groups = np.array([observations[number].patient for number in rows])
    if len(rows) < MIN_FIT_CASES or len(np.unique(groups)) < 2:
        raise QualityModelError(f"Only {len(rows)} validation case(s) of {len(np.unique(groups))} patient(s) "
                                f"predict {name!r}; at least {MIN_FIT_CASES} cases of 2 patients are needed to "
                                "fit and check a quality model.")
    if np.ptp(y) == 0 and y[0] == 0:
        raise QualityModelError(f"The network's {name!r} overlaps the reference nowhere on the validation "
                                "cases (Dice 0 on every one), so its Dice cannot be predicted; train longer.")
    averaged = [*UNCERTAINTY_FEATURES, *(feature for feature in OPTIONAL_FEATURES
                                         if all(feature in row for row in features))]
    x = {feature: np.array([row[feature] for row in features], dtype=np.float64) for feature in averaged}
    residuals = _held_out_residuals(x, y, groups)
    with_size = {**x, SIZE_FEATURE: np.array([row[SIZE_FEATURE] for row in features], dtype=np.float64)}
    size_residuals = _held_out_residuals(with_size, y, groups)
    if np.abs(size_residuals).mean() < np.abs(residuals).mean() - 1e-12:
        x, residuals = with_size, size_residuals
    return _StructureFit(x, y, groups, residuals, rows)


def _check_observations(observations: Sequence[Observation], structure_names: Sequence[str]) -> None:
    if any(len(item.features) != len(structure_names) or np.shape(item.dice) != (len(structure_names),)
           for item in observations):
        raise QualityModelError(f"Every observation needs features and a Dice for each of the {len(structure_names)} "
                                "structures.")


def held_out_predictions(observations: Sequence[Observation], class_names: Sequence[str]) -> np.ndarray:
    """Each observation's predicted Dice per structure from a fit without its patient (leave-one-patient-out):
    what the quality model says of patients it never saw, to judge a review rule on.

    Returns:
        ``(len(observations), C - 1)`` float64, clipped to [0, 1]; NaN where the structure is predicted nowhere
        (the summary flags those for review whatever the model says).

    Raises:
        QualityModelError: as :func:`fit_from_observations`.
    """
    structure_names = list(class_names[1:])
    _check_observations(observations, structure_names)
    predicted = np.full((len(observations), len(structure_names)), np.nan)
    for index, name in enumerate(structure_names):
        fit = _structure_fit(observations, index, name)
        predicted[fit.rows, index] = np.clip(fit.y - fit.residuals, 0.0, 1.0)
    return predicted


def fit_from_observations(observations: Sequence[Observation], class_names: Sequence[str],
                          review_below: float = REVIEW_BELOW, interval_coverage: float = INTERVAL_COVERAGE,
                          validation: dict | None = None,
                          review_below_by_structure: dict[str, float] | None = None) -> QualityModel:
    """Fit each structure's predicted-Dice model (the method is in the module docstring).

    Args:
        observations: the predicted volumes to fit on, of at least two patients.
        class_names: C names, background first.
        review_below, interval_coverage, review_below_by_structure: stored in the model (see :class:`QualityModel`).
        validation: extra entries for the model's record of what it was fitted on (e.g. fold networks).

    Raises:
        QualityModelError: one sentence: fewer than 3 cases of 2 patients predict a structure, or the cases
            do not match ``class_names``.
    """
    structure_names = list(class_names[1:])
    _check_observations(observations, structure_names)
    groups_all = np.array([item.patient for item in observations])
    structures = {}
    for index, name in enumerate(structure_names):
        fit = _structure_fit(observations, index, name)
        baseline = float(np.abs(_held_out_residuals(None, fit.y, fit.groups)).mean())
        structures[name] = StructureQuality(AVERAGED_FEATURES, AVERAGED, _fit_terms(fit.x, fit.y),
                                            _conformal_offsets(fit.residuals, interval_coverage),
                                            float(np.abs(fit.residuals).mean()), baseline, len(fit.y))
    patients = len(np.unique(groups_all))
    record = {"cases": len(observations), "patients": patients,
              "scheme": "leave-one-patient-out" if patients < len(observations) else "leave-one-case-out",
              **(validation or {})}
    return QualityModel(structures, review_below, interval_coverage, validation=record,
                        review_below_by_structure=dict(review_below_by_structure or {}))


def fit_quality_model(predictor: CasePredictor, cases: Sequence[QualityCase],
                      review_below: float = REVIEW_BELOW) -> QualityModel:
    """Predict every validation case with ``predictor`` (at the temperature it will be used with), measure its
    Dice per structure and fit the quality model (:func:`fit_from_observations`).

    Returns:
        The model; store it with ``dataclasses.replace(metadata, quality_model=model.to_dict())``.

    Raises:
        QualityModelError: too few references contain some structure (:func:`check_references`, before any
            prediction), too few cases predict it, or none overlaps the reference.
    """
    check_references(cases, predictor.metadata.class_names)
    return fit_from_observations(observe_cases(predictor, cases), predictor.metadata.class_names, review_below)
