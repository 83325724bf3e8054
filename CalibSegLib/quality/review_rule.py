"""The review rule: which predicted-Dice threshold a model flags structures below, chosen on out-of-fold patients.

A structure is flagged when its predicted Dice is below the model's ``review_below`` or it is predicted nowhere
(:func:`flagged`, which :mod:`CalibSegLib.quality.summary` applies too). ``review_below`` is chosen on observations no
prediction has seen: out-of-fold patients, each structure's predicted Dice from a quality model fitted without that
patient (:func:`CalibSegLib.quality.held_out_predictions`). For every threshold of :data:`THRESHOLDS`,
:func:`trade_off` counts the poor structures (measured Dice below :data:`POOR_BELOW`) and the good ones (above
:data:`GOOD_ABOVE`) it flags; :func:`choose_review_threshold` takes the smallest threshold that flags
:data:`TARGET_RECALL` of the poor ones (the largest when none does): the fewest false flags at that recall. Its row
says whether the false flags then stay within :data:`TARGET_FALSE_FLAGS`; where they do not, the two targets conflict
on these patients and recall wins: a missed poor structure costs a patient, a false flag a reader's minute.

:func:`choose_review_rule` then decides between that one pooled threshold and one per structure (each structure's own
:func:`choose_review_threshold`), judging both **nested** (:func:`nested_thresholds`): each cross-validation fold's
volumes flagged at the thresholds chosen on the other folds' volumes, so a way of choosing is counted on patients it
was not chosen on. Per structure only when, so judged, the pooled threshold misses a target and the per-structure
thresholds together meet both. A structure with few poor cases out of fold places its own threshold on those few;
counted on the very patients that placed it, it looks better than it will on new ones (on ACDC's 65 out-of-fold
patients the NACL ensemble's per-structure thresholds met both targets counted so, and missed recall nested:
docs/records/quality/acdc_nacl_review_rule_nested.json). Where the pooled one already meets both targets, or where
per structure does not meet them either, the pooled one stays.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from CalibSegLib.quality.model import REVIEW_BELOW

__all__ = ["POOR_BELOW", "GOOD_ABOVE", "THRESHOLDS", "TARGET_RECALL", "TARGET_FALSE_FLAGS", "flagged", "trade_off",
           "choose_review_threshold", "pooled_thresholds", "per_structure_thresholds", "fold_numbers",
           "nested_thresholds", "choose_review_rule"]

# A structure below this measured Dice needs a person's look, whatever threshold a model's flag uses.
POOR_BELOW = REVIEW_BELOW
GOOD_ABOVE = 0.90  # a structure above this needs none: flagging it is a false alarm
THRESHOLDS: tuple[float, ...] = tuple(round(0.80 + 0.01 * step, 2) for step in range(16))  # 0.80 ... 0.95
TARGET_RECALL = 0.90  # of the poor structures, flagged (issue 63's target)
TARGET_FALSE_FLAGS = 0.05  # of the good structures, flagged at most (issue 63's target)


def flagged(predicted: np.ndarray | float | None, review_below: np.ndarray | float) -> np.ndarray:
    """The review flag: which structures it marks, those whose predicted Dice is below ``review_below`` or NaN or
    None (predicted nowhere). ``predicted``: any shape, a number for one structure; ``review_below`` broadcast
    against it: one threshold for all, or each structure's own (:meth:`QualityModel.review_threshold`).

    The one definition of the flag, and here, beside the rule, because the rule chooses its thresholds by counting
    these flags out of fold: the summary sets a reader's flag with this same function, so the recall and false flags
    a threshold was chosen for are the ones a reader gets. It reads nothing but numbers, so the summary takes it
    without importing more.
    """
    predicted = np.asarray(predicted, np.float64)
    return np.isnan(predicted) | (np.nan_to_num(predicted, nan=0.0) < review_below)


def _flag_counts(predicted: np.ndarray, measured: np.ndarray, thresholds: Any) -> dict[str, Any]:
    """Counts and shares of poor and good structures flagged, ``predicted`` and ``measured`` of one shape and
    ``thresholds`` broadcast against them (one for all, or ``(structures,)`` for ``(volumes, structures)``)."""
    marked = flagged(predicted, thresholds)
    poor, good = measured < POOR_BELOW, measured > GOOD_ABOVE
    return {"poor": int(poor.sum()), "poor_flagged": int((marked & poor).sum()),
            "recall": float((marked & poor).sum() / max(poor.sum(), 1)), "good": int(good.sum()),
            "good_flagged": int((marked & good).sum()),
            "false_flag_share": float((marked & good).sum() / max(good.sum(), 1)),
            "flagged_share": float(marked.mean())}


def trade_off(predicted: np.ndarray, measured: np.ndarray) -> list[dict[str, Any]]:
    """One row per threshold of :data:`THRESHOLDS` over ``predicted`` and ``measured`` Dice (same shape; NaN
    predicted = predicted nowhere, always flagged): counts and shares of poor and good structures flagged."""
    predicted, measured = np.ravel(predicted), np.ravel(measured)
    return [{"review_below": threshold, **_flag_counts(predicted, measured, threshold)} for threshold in THRESHOLDS]


def choose_review_threshold(rows: Sequence[dict[str, Any]], target_recall: float = TARGET_RECALL) -> dict[str, Any]:
    """The rule's row of :func:`trade_off`: the smallest threshold whose recall reaches ``target_recall``, else the
    largest; with ``meets_false_flags``, whether its false-flag share is within :data:`TARGET_FALSE_FLAGS`."""
    chosen = next((row for row in rows if row["recall"] >= target_recall), rows[-1])
    return {**chosen, "meets_false_flags": chosen["false_flag_share"] <= TARGET_FALSE_FLAGS}


def _meets_targets(counts: dict[str, Any]) -> dict[str, Any]:
    """``counts`` (:func:`_flag_counts`) with ``meets_targets``: recall and false flags both within the targets."""
    return {**counts, "meets_targets": counts["recall"] >= TARGET_RECALL
            and counts["false_flag_share"] <= TARGET_FALSE_FLAGS}


def pooled_thresholds(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """``(structures,)``: one threshold for every structure, :func:`choose_review_threshold` on all of
    ``(volumes, structures)`` ``predicted`` and ``measured`` together."""
    threshold = choose_review_threshold(trade_off(predicted, measured))["review_below"]
    return np.full(np.shape(predicted)[1], threshold)


def per_structure_thresholds(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """``(structures,)``: each structure's own :func:`choose_review_threshold` on its column of ``(volumes,
    structures)`` ``predicted`` and ``measured``."""
    return np.array([choose_review_threshold(trade_off(predicted[:, index], measured[:, index]))["review_below"]
                     for index in range(np.shape(predicted)[1])])


def fold_numbers(patients: Sequence[str], folds: Sequence[Sequence[str]]) -> np.ndarray:
    """``(volumes,)``: the number of the fold (a list of patients in ``folds``) each volume's patient is in.

    Raises:
        ValueError: a patient in no fold or in several (one sentence naming it).
    """
    where: dict[str, int] = {}
    for number, fold in enumerate(folds):
        for patient in fold:
            if where.setdefault(patient, number) != number:
                raise ValueError(f"Patient {patient} is in folds {where[patient]} and {number}; each out-of-fold "
                                 "patient is predicted by the one network that never trained on it.")
    missing = sorted(set(patients) - set(where))
    if missing:
        raise ValueError(f"Patient {missing[0]} is in no cross-validation fold; its volume cannot be judged nested.")
    return np.array([where[patient] for patient in patients])


def nested_thresholds(predicted: np.ndarray, measured: np.ndarray, folds: np.ndarray,
                      choose: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """``(volumes, structures)``: each volume's thresholds as ``choose`` sets them on the volumes of the other folds;
    ``folds`` ``(volumes,)`` each volume's fold (:func:`fold_numbers`). ``choose`` gets those volumes' predicted and
    measured Dice and their folds (a way of choosing that judges itself nested, as :func:`choose_review_rule` does,
    nests again inside them) and returns ``(structures,)`` thresholds.

    Raises:
        ValueError: fewer than two folds (nothing to choose on outside the one).
    """
    folds = np.asarray(folds)
    if len(np.unique(folds)) < 2:
        raise ValueError("The review rule is judged on folds it was not chosen on, and these volumes come from "
                         "one fold; give each volume the cross-validation fold that predicted it.")
    thresholds = np.full(np.shape(predicted), np.nan)
    for fold in np.unique(folds):
        inside = folds == fold
        thresholds[inside] = choose(predicted[~inside], measured[~inside], folds[~inside])
    return thresholds


def choose_review_rule(predicted: np.ndarray, measured: np.ndarray, structure_names: Sequence[str],
                       folds: np.ndarray) -> dict[str, Any]:
    """The review rule on out-of-fold ``(volumes, structures)`` predicted and measured Dice (NaN predicted: drawn
    nowhere), pooled or per structure as judged nested over ``folds`` ``(volumes,)`` (module docstring).

    Returns:
        ``{"pooled": row, "per_structure": {name: row}, "pooled_flags", "per_structure_flags": nested counts and
        shares with "meets_targets", "by_structure": bool, "review_below": the pooled threshold,
        "review_below_by_structure": {name: threshold} when by_structure else {}}``; rows (on every volume) as
        :func:`choose_review_threshold`'s.

    Raises:
        ValueError: fewer than two folds.
    """
    predicted, measured = np.asarray(predicted, np.float64), np.asarray(measured, np.float64)
    pooled = choose_review_threshold(trade_off(predicted, measured))
    per_structure = {name: choose_review_threshold(trade_off(predicted[:, index], measured[:, index]))
                     for index, name in enumerate(structure_names)}
    pooled_flags, structure_flags = (
        _meets_targets(_flag_counts(predicted, measured, nested_thresholds(
            predicted, measured, folds, lambda inner, reference, _, choose=choose: choose(inner, reference))))
        for choose in (pooled_thresholds, per_structure_thresholds))
    by_structure = not pooled_flags["meets_targets"] and structure_flags["meets_targets"]
    return {"pooled": pooled, "per_structure": per_structure, "pooled_flags": pooled_flags,
            "per_structure_flags": structure_flags, "by_structure": by_structure,
            "review_below": pooled["review_below"],
            "review_below_by_structure": ({name: row["review_below"] for name, row in per_structure.items()}
                                          if by_structure else {})}
