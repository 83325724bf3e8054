"""An ensemble's predicted Dice, from its members as the quality model was fitted on them.

An ensemble's quality model is fitted on its fold networks' out-of-fold predictions, each network alone under the
ensemble's settings (:func:`Training.ensemble.out_of_fold_quality`, which records it: ``validation["applied_to"]`` is
``"members"``): it has seen single networks' features, never those of the five networks' average, whose confidence
and entropy are smoother. So it is applied as it was fitted:
each member's own prediction of the volume (:attr:`CalibSegLib.prediction.Prediction.members`) gives that member's
features and its predicted Dice, and the ensemble's predicted Dice is their mean (:func:`combined_predicted_dice`).

Why the mean: each member's prediction estimates that member's Dice, without bias on patients like the
out-of-fold ones; the ensemble's Dice is close to its members' mean Dice (the average gains 0.00–0.01 on ACDC), and
the mean of five estimates has less noise than any one. A member that draws a structure nowhere counts 0, its Dice
there when the reference has the structure.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from CalibSegLib.quality.model import QualityModel

__all__ = ["member_predicted_dice", "combined_predicted_dice"]


def member_predicted_dice(model: QualityModel, member_features: Sequence[Sequence[dict[str, float] | None]],
                          class_names: Sequence[str]) -> np.ndarray:
    """``(M, C - 1)`` predicted Dice of each of M members' own predictions, from their
    :func:`~CalibSegLib.quality.structure_features` (C - 1 entries each); NaN where the member draws the structure
    nowhere."""
    names = list(class_names[1:])
    return np.array([[np.nan if values is None else model.structures[name].predict(values)
                      for name, values in zip(names, features)] for features in member_features], dtype=np.float64)


def combined_predicted_dice(per_member: np.ndarray) -> np.ndarray:
    """``(C - 1,)`` the ensemble's predicted Dice: the mean over the members of ``(M, C - 1)`` predicted Dice, a
    member that draws the structure nowhere (NaN) counting 0."""
    return np.nan_to_num(np.asarray(per_member, dtype=np.float64), nan=0.0).mean(axis=0)
