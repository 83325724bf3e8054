"""An ensemble bundle's members as predictors of their own, and the ensemble's phase rebuilt from theirs.

The interval rule is fitted on single fold networks, each predicting the patients it never saw
(:mod:`Evaluation.function_intervals`); measuring what that rule is applied to needs each member's prediction as
well as the ensemble's. The ensemble's probabilities are the mean of its members' at the bundle's temperature
(:func:`CalibSegLib.inference.ensemble_average`), so running the members one by one and averaging gives the
ensemble's result at the cost of one ensemble pass.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from CalibSegLib.bundle import Bundle, member_metadata
from CalibSegLib.inference import Predictor

__all__ = ["member_predictors", "ensemble_labels"]


def member_predictors(bundle: Bundle, device: str = "auto", batch_size: int = 16) -> list[Predictor]:
    """One predictor per member of ``bundle`` (a single network: itself), each at the bundle's temperature,
    mirroring and post-processing, without the ensemble's quality model and input check (both describe the
    ensemble: its input statistics may hold every member's features, which no single network carries)."""
    if bundle.metadata.ensemble_size == 1:
        return [Predictor(bundle, device=device, batch_size=batch_size)]
    settings = member_metadata(bundle.metadata)
    network = bundle.build_model()
    return [Predictor.from_network(member, settings, device=device, batch_size=batch_size)
            for member in network.members]


def ensemble_labels(member_probabilities: Sequence[np.ndarray], bundle: Bundle) -> tuple[np.ndarray, np.ndarray]:
    """The ensemble's ``(C, z, y, x)`` mean probabilities and its ``(z, y, x)`` uint8 labels (argmax, then the
    bundle's post-processing) from its members' ``(C, z, y, x)`` probabilities."""
    mean = np.mean(np.stack(member_probabilities), axis=0)
    labels = np.argmax(mean, axis=0).astype(np.uint8)
    bundle.metadata.postprocessing.apply(labels)
    return mean, labels
