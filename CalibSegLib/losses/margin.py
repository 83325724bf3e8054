"""Margin-based label smoothing, MbLS (Liu, Ben Ayed, Galdran, Dolz, CVPR 2022)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from CalibSegLib.losses._base import SegmentationLoss
from CalibSegLib.losses._validation import check_non_negative

__all__ = ["MarginLabelSmoothingLoss"]


class MarginLabelSmoothingLoss(SegmentationLoss):
    """``CE + λ · mean_{voxels, k} relu(max_j l_j − l_k − m)`` on logits l (paper Eq. 8).

    The penalty only acts where a logit distance exceeds the margin, so the network keeps
    its ranking while the unbounded logit gaps that make it overconfident are discouraged.

    Args:
        num_classes: C, background included.
        weight: λ ≥ 0 (0.1); λ=0 is CE.
        margin: m ≥ 0 (10).
    """

    def __init__(self, num_classes: int, weight: float = 0.1, margin: float = 10.0) -> None:
        super().__init__(num_classes)
        check_non_negative(weight=weight, margin=margin)
        self.weight = weight
        self.margin = margin

    def compute(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        distances = logits.amax(dim=1, keepdim=True) - logits
        penalty = F.relu(distances - self.margin).mean()
        return F.cross_entropy(logits, target) + self.weight * penalty
