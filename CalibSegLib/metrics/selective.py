"""How well per-voxel confidence tells right from wrong voxels: error-detection AUROC and AURC."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

__all__ = ["error_detection_auroc", "aurc"]


def _flatten(confidence, correct) -> tuple[np.ndarray, np.ndarray]:
    confidence = np.asarray(confidence, dtype=np.float64).ravel()
    correct = np.asarray(correct).astype(bool).ravel()
    if confidence.shape != correct.shape:
        raise ValueError(f"confidence has {confidence.size} values but correct has {correct.size}.")
    if not np.all(np.isfinite(confidence)):
        raise ValueError("confidence contains NaN or infinite values.")
    return confidence, correct


def error_detection_auroc(confidence, correct) -> float:
    """P(confidence of a right voxel > that of a wrong one), ties counting one half.

    1 means confidence ranks every error below every correct voxel, 0.5 is chance.
    NaN when all voxels are right or all wrong. Computed from average ranks (Mann–Whitney U).
    """
    confidence, correct = _flatten(confidence, correct)
    n_right, n_wrong = int(correct.sum()), int((~correct).sum())
    if n_right == 0 or n_wrong == 0:
        return float("nan")
    ranks = rankdata(confidence)
    u_statistic = ranks[correct].sum() - n_right * (n_right + 1) / 2.0
    return float(u_statistic / (n_right * n_wrong))


def aurc(confidence, correct) -> tuple[float, np.ndarray, np.ndarray]:
    """Area under the risk–coverage curve (lower is better).

    Voxels are kept from the most to the least confident (ties in a fixed, stable order);
    at coverage i/N the risk is the error rate among the i kept voxels. AURC is the mean
    risk over i = 1..N. Returns ``(aurc, coverage (N,), risk (N,))``.
    """
    confidence, correct = _flatten(confidence, correct)
    if confidence.size == 0:
        return float("nan"), np.zeros(0), np.zeros(0)
    order = np.argsort(-confidence, kind="stable")
    errors = np.cumsum(~correct[order])
    kept = np.arange(1, confidence.size + 1)
    risk = errors / kept
    return float(risk.mean()), kept / confidence.size, risk
