"""Fitting the quality model on validation cases.

The fitting rule (:func:`fit_from_observations`): for each structure, every candidate pair of
feature (:data:`FEATURES`) and form (``linear``: least squares, slope forced to the feature's
monotone direction, clipped to [0, 1]; ``isotonic``: pool-adjacent-violators) is scored by its
mean absolute error in leave-one-patient-out cross-validation on the validation cases (both
frames of a patient leave together; without patient ids, leave-one-case-out); the lowest error
wins, ties to the earlier candidate (linear before isotonic, features in :data:`FEATURES` order).
``expected_dice`` came last and joined the candidates only after a nested leave-one-patient-out
comparison on the shipped models' validation patients (``Training/quality_choice.py``).
With ``averaged=True`` nothing is chosen: each candidate feature gets a linear fit and the
prediction is their mean (form :data:`~CalibSegLib.quality.model.AVERAGED`; procedure D of
``Training/quality_folds.py``), scored by the same held-out error. With ``with_average=True`` that
average is one more candidate, after the single fits, and wins a structure only where its held-out
error is the lowest (procedure F). :func:`fit_quality_model`, what ``calibseg-train`` and
``calibseg-fit-quality`` fit on a bundle's own validation patients, averages the six features of
:data:`~CalibSegLib.quality.model.FEATURES_WITHOUT_SIZE` by default, the mirrored passes' agreement
too for a bundle that mirrors, and the size too for the structures of :data:`SIZED_STRUCTURES`: out of
fold on a dozen patients per fold, averaging ranked better than choosing (procedure G against A,
docs/results.md), averaging with the size better than without it (K against G), with the size for the
left ventricle alone better still (N against K), and with the agreement better again (O against N).
The interval adds split-conformal order statistics of those held-out residuals (measured −
predicted) to the prediction, clipped to [0, 1].
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

import numpy as np

from CalibSegLib.metrics import dice as dice_scores
from CalibSegLib.quality.features import structure_features
from CalibSegLib.quality.model import (AVERAGED, AVERAGED_FEATURES, BOUNDARY_RING, FEATURES,
                                       FEATURES_WITHOUT_MIRRORING, FEATURES_WITHOUT_SIZE, FORMS, INTERVAL_COVERAGE,
                                       LOW_CONFIDENCE_THRESHOLD, MIRROR_AGREEMENT, REVIEW_BELOW, QualityModel,
                                       QualityModelError, StructureQuality, evaluate_form)

if TYPE_CHECKING:
    from CalibSegLib.inference import Predictor

__all__ = ["MIN_FIT_CASES", "SIZED_STRUCTURES", "QualityCase", "isotonic_fit", "observe_case", "size_candidates",
           "fit_from_observations", "fit_quality_model"]

MIN_FIT_CASES = 3
# Structures (ACDC's name) whose average takes the size too: a small left ventricle is one the network finds hard
# (end-systole), while the size ranked the myocardium worse out of fold (procedures L and N, docs/results.md).
SIZED_STRUCTURES: tuple[str, ...] = ("left ventricle",)


def size_candidates(class_names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``extra_candidates`` of :func:`fit_from_observations` adding ``log_volume_ml`` to the foreground classes of
    ``class_names`` (background first) named in :data:`SIZED_STRUCTURES`; empty for a task without one."""
    return {name: ("log_volume_ml",) for name in class_names[1:] if name in SIZED_STRUCTURES}


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


class QualityCase(Protocol):
    """A validation case: ``image`` and ``label`` ``(z, y, x)``, ``spacing`` ``(z, y, x)`` mm.

    ``Datasets.cases.Case`` is one; an optional ``patient_id`` groups cases for leave-one-out.
    """

    image: np.ndarray
    label: np.ndarray
    spacing: tuple[float, float, float]


def observe_case(predictor: "Predictor", image: np.ndarray, label: np.ndarray, spacing: Sequence[float],
                 low_confidence_threshold: float = LOW_CONFIDENCE_THRESHOLD, boundary_ring: int = BOUNDARY_RING,
                 ) -> tuple[list[dict[str, float] | None], np.ndarray]:
    """Predict one case; return its :func:`structure_features` and measured Dice ``(C-1,)``."""
    metadata = predictor.metadata
    prediction = predictor.predict(image, spacing)
    features = structure_features(prediction, metadata.num_classes, low_confidence_threshold, boundary_ring,
                                  spacing)
    return features, dice_scores(prediction.labels, np.asarray(label).astype(np.int64), metadata.num_classes)


# One feature's values ``(cases,)``, or for the averaged form every candidate's, by feature name.
Values = np.ndarray | dict[str, np.ndarray]


def _fit(form: str, x: Values, y: np.ndarray, direction: int) -> dict[str, Any]:
    """Parameters of one form fitted to ``(x, y)``; monotone in ``direction`` (each feature's own when averaged)."""
    if form == AVERAGED:
        return {"terms": [{"feature": name, **_fit("linear", values, y, FEATURES[name])} for name, values in x.items()]}
    if form == "isotonic":
        knots, fitted = isotonic_fit(x, y, increasing=direction > 0)
        return {"x": knots.tolist(), "y": np.clip(fitted, 0.0, 1.0).tolist()}
    slope = 0.0
    if np.ptp(x) > 0:
        slope = float(np.polyfit(x, y, 1)[0])
        slope = slope if slope * direction > 0 else 0.0  # a wrong-signed trend is no trend
    return {"intercept": float(y.mean() - slope * x.mean()), "slope": slope}


def _column(rows: Sequence[dict[str, float]], feature: str) -> np.ndarray:
    """One feature's values over the cases that predict the structure, ``(cases,)``."""
    return np.array([row[feature] for row in rows])


def _rows(x: Values, keep: np.ndarray) -> Values:
    """The cases of ``x`` where ``keep`` is True (of every feature, when averaged)."""
    return {name: values[keep] for name, values in x.items()} if isinstance(x, dict) else x[keep]


def _held_out_residuals(form: str | None, x: Values, y: np.ndarray, groups: np.ndarray,
                        direction: int) -> np.ndarray:
    """Measured − predicted for each case, predicted by a fit on the other groups (None: the mean)."""
    residuals = np.empty_like(y)
    for group in np.unique(groups):
        held = groups == group
        if form is None:
            residuals[held] = y[held] - y[~held].mean()
        else:
            fitted = _fit(form, _rows(x, ~held), y[~held], direction)
            residuals[held] = y[held] - evaluate_form(form, fitted, _rows(x, held))
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
    candidates: Sequence[str] = FEATURES_WITHOUT_MIRRORING,
    fixed: Mapping[str, tuple[str, str]] | None = None,
    averaged: bool = False,
    with_average: bool = False,
    extra_candidates: Mapping[str, Sequence[str]] | None = None,
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
        candidates: the features to choose from (or average), a subset of :data:`FEATURES` (by default the
            seven every prediction has, :data:`FEATURES_WITHOUT_MIRRORING`; fewer or more to measure what one
            adds, as ``Training/quality_choice.py`` and ``Training/quality_folds.py`` do).
        fixed: structure name → ``(feature, form)`` to fit without choosing (chosen on other
            patients, as ``Training/quality_folds.py`` does); its held-out residuals still set the
            interval and the stored error.
        averaged: every structure not in ``fixed`` predicted by the mean of one linear fit per candidate
            feature instead of the chosen one.
        with_average: that mean competes with the single fits instead (ignored where ``averaged``).
        extra_candidates: structure name → features added to ``candidates`` for that structure alone
            (procedure L of ``Training/quality_folds.py``: the size for the left ventricle).

    Raises:
        QualityModelError: fewer than 3 cases predict a structure, or they come from one group,
            or ``candidates`` names an unknown feature or none.
    """
    if not candidates or any(name not in FEATURES for name in candidates):
        raise QualityModelError(f"Candidate features must be some of {', '.join(FEATURES)}; got {list(candidates)}.")
    fixed = dict(fixed or {})
    unknown = {name: pair for name, pair in fixed.items()
               if name not in class_names[1:] or pair[0] not in FEATURES or pair[1] not in FORMS}
    if unknown:
        raise QualityModelError(f"Fixed choices must name a structure, one of {', '.join(FEATURES)} and one of "
                                f"{', '.join(FORMS)}; got {unknown}.")
    extra_candidates = dict(extra_candidates or {})
    unknown_extra = {name: added for name, added in extra_candidates.items()
                     if name not in class_names[1:] or any(feature not in FEATURES for feature in added)}
    if unknown_extra:
        raise QualityModelError(f"Extra candidates must map a structure to some of {', '.join(FEATURES)}; got "
                                f"{unknown_extra}.")
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
        rows = [case[index] for case in features if case[index] is not None]
        added = [feature for feature in extra_candidates.get(name, ()) if feature not in candidates]
        considered = (*candidates, *added)
        if name in fixed:
            pairs = [fixed[name]]
        elif averaged:
            pairs = [(AVERAGED_FEATURES, AVERAGED)]
        else:
            pairs = list(itertools.product(considered, FORMS))
            if with_average:  # last, so that a tie keeps the single fit
                pairs.append((AVERAGED_FEATURES, AVERAGED))
        best = None
        for feature, form in pairs:
            x = ({candidate: _column(rows, candidate) for candidate in considered} if form == AVERAGED
                 else _column(rows, feature))
            direction = FEATURES.get(feature, 0)
            residuals = _held_out_residuals(form, x, y, held_groups, direction)
            error = float(np.abs(residuals).mean())
            if best is None or error < best[0] - 1e-12:
                best = (error, feature, form, x, direction, residuals)
        error, feature, form, x, direction, residuals = best
        baseline = float(np.abs(_held_out_residuals(None, x, y, held_groups, 0)).mean())
        structures[name] = StructureQuality(feature, form, _fit(form, x, y, direction),
                                            _conformal_offsets(residuals, interval_coverage), error, baseline,
                                            int(present.sum()))
    validation = {"cases": len(features), "patients": len(np.unique(groups)),
                  "scheme": "leave-one-patient-out" if len(np.unique(groups)) < len(features) else "leave-one-case-out"}
    return QualityModel(structures, review_below, interval_coverage, low_confidence_threshold, boundary_ring,
                        validation)


def fit_quality_model(predictor: "Predictor", cases: Sequence[QualityCase], class_names: Sequence[str] | None = None,
                      review_below: float = REVIEW_BELOW, averaged: bool = True) -> QualityModel:
    """Predict every validation case, measure its Dice per structure and fit the quality model.

    Args:
        predictor: the model to describe, at the temperature it will be used with.
        cases: validation cases (never training or test ones): ``image``, ``label``, ``spacing``
            and optionally ``patient_id`` (``Datasets.cases.Case`` works as it is).
        class_names: C names, background first (default: the predictor's bundle's).
        review_below: predicted Dice under which a structure is flagged.
        averaged: every structure the mean of one linear fit per feature, the six without the size, the
            mirrored passes' agreement where the predictor's bundle mirrors, and the size too for
            :data:`SIZED_STRUCTURES` (the default: on a dozen validation patients it ranked better out of
            fold than choosing one feature, procedure O against A, G, K and N in docs/results.md); False
            chooses one feature and form per structure among the seven every prediction has.

    Returns:
        The model; store it with ``dataclasses.replace(metadata, quality_model=model.to_dict())``.

    Raises:
        QualityModelError: fewer than :data:`MIN_FIT_CASES` references contain some structure (checked
            before any prediction: where the reference lacks a structure its Dice is 0 or 1 by definition,
            whatever the model did), or too few cases predict it (see :func:`fit_from_observations`).
    """
    class_names = list(class_names or predictor.metadata.class_names)
    for index, name in enumerate(class_names[1:], start=1):
        containing = sum(bool(np.any(np.asarray(case.label) == index)) for case in cases)
        if containing < MIN_FIT_CASES:
            raise QualityModelError(
                f"Only {containing} of {len(cases)} validation references contain {name!r} (at least {MIN_FIT_CASES} "
                "are needed), so its Dice there would say nothing about the model; check the validation labels.")
    observed = [observe_case(predictor, case.image, case.label, case.spacing) for case in cases]
    groups = [str(getattr(case, "patient_id", None) or index) for index, case in enumerate(cases)]
    dice = np.array([scores for _, scores in observed]).reshape(len(cases), len(class_names) - 1)
    mirrors = bool(predictor.metadata.sliding_window.mirror_axes)
    candidates = (*FEATURES_WITHOUT_SIZE, MIRROR_AGREEMENT) if mirrors else FEATURES_WITHOUT_SIZE
    options = ({"averaged": True, "candidates": candidates, "extra_candidates": size_candidates(class_names)}
               if averaged else {})
    return fit_from_observations([features for features, _ in observed], dice, class_names, groups, review_below,
                                 **options)
