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
:func:`choose_review_threshold`): per structure only when the pooled threshold misses a target out of fold and the
per-structure thresholds together meet both. A structure with few poor cases out of fold places its own threshold on
those few, so per-structure thresholds are taken only when they pay: where the pooled one already meets both targets,
or where per structure does not meet them either, the pooled one stays.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from CalibSegLib.quality.model import REVIEW_BELOW

__all__ = ["POOR_BELOW", "GOOD_ABOVE", "THRESHOLDS", "TARGET_RECALL", "TARGET_FALSE_FLAGS", "flagged", "trade_off",
           "choose_review_threshold", "choose_review_rule"]

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


def choose_review_rule(predicted: np.ndarray, measured: np.ndarray, structure_names: Sequence[str]
                       ) -> dict[str, Any]:
    """The review rule on out-of-fold ``(volumes, structures)`` predicted and measured Dice (NaN predicted: drawn
    nowhere), pooled or per structure (module docstring).

    Returns:
        ``{"pooled": row, "per_structure": {name: row}, "pooled_flags", "per_structure_flags": counts and shares
        with "meets_targets", "by_structure": bool, "review_below": the pooled threshold, "review_below_by_structure":
        {name: threshold} when by_structure else {}}``; rows as :func:`choose_review_threshold`'s.
    """
    predicted, measured = np.asarray(predicted, np.float64), np.asarray(measured, np.float64)
    pooled = choose_review_threshold(trade_off(predicted, measured))
    per_structure = {name: choose_review_threshold(trade_off(predicted[:, index], measured[:, index]))
                     for index, name in enumerate(structure_names)}
    pooled_flags = _meets_targets(_flag_counts(predicted, measured, pooled["review_below"]))
    structure_flags = _meets_targets(_flag_counts(
        predicted, measured, np.array([per_structure[name]["review_below"] for name in structure_names])[None, :]))
    by_structure = not pooled_flags["meets_targets"] and structure_flags["meets_targets"]
    return {"pooled": pooled, "per_structure": per_structure, "pooled_flags": pooled_flags,
            "per_structure_flags": structure_flags, "by_structure": by_structure,
            "review_below": pooled["review_below"],
            "review_below_by_structure": ({name: row["review_below"] for name, row in per_structure.items()}
                                          if by_structure else {})}
