"""What a prediction of a volume holds (:class:`Prediction`): its labels and per-voxel uncertainty maps on the input's
grid, and an ensemble's members' own predictions.

The record stands apart from the :class:`~CalibSegLib.inference.Predictor` that fills it, so what reads a prediction
(the quality features and summary, the evaluation, cardiac function, the child process's result) needs no bundle or
network.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Prediction"]


@dataclass
class Prediction:
    """Outputs on the input's grid, all ``(z, y, x)`` like the input.

    ``labels`` uint8 argmax; ``confidence`` float32 max probability in [1/C, 1];
    ``entropy`` float32 softmax entropy divided by log C, in [0, 1];
    ``probabilities`` ``(C, z, y, x)`` float32 when asked for, else None;
    ``probability_sums`` ``(C,)`` float64 Σ over all voxels of each class's probability (the voxel count each class
    is expected to cover), filled by :class:`~CalibSegLib.inference.Predictor`, None when unknown;
    ``mirror_agreement`` ``(C,)`` float64 per class the mean over the mirrored passes of the Dice between the
    pass's argmax and the averaged logits' argmax, on the network's grid before post-processing
    (:class:`~CalibSegLib.sliding_window.MirrorAgreement`; NaN for a class no pass draws), None for a bundle
    that does not mirror;
    ``disagreement`` float32 the ensemble members' disagreement (mutual information normalised by log C, in
    [0, ``entropy``]), None for a single network;
    ``members``: an ensemble's members' own predictions (labels, confidence, entropy, probability sums, mirror
    agreement, post-processed), each what that member alone under the bundle's settings gives, when kept
    (:meth:`~CalibSegLib.inference.Predictor.predict_variants`), else None.
    """

    labels: np.ndarray
    confidence: np.ndarray
    entropy: np.ndarray
    probabilities: np.ndarray | None = None
    probability_sums: np.ndarray | None = None
    mirror_agreement: np.ndarray | None = None
    disagreement: np.ndarray | None = None
    members: list["Prediction"] | None = None
