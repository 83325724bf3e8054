"""Margin-based label smoothing, MbLS (Liu et al., CVPR 2022)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from CalibSegLib.losses._base import SegmentationLoss

__all__ = ["MarginLabelSmoothingLoss"]


class MarginLabelSmoothingLoss(SegmentationLoss):
    """``CE + λ · mean_{voxels, k} relu(max_j l_j − l_k − m)`` on logits; λ=0.1, m=10.

    The penalty only acts where a logit distance exceeds the margin, so the network keeps
    its ranking while avoiding the unbounded logit gaps that make it overconfident.
    """

    def __init__(self, num_classes: int, weight: float = 0.1, margin: float = 10.0) -> None:
        super().__init__(num_classes)
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}.")
        self.weight = weight
        self.margin = margin

    def compute(self, logits: torch.Tensor, target: torch.Tensor, **context) -> torch.Tensor:
        distances = logits.amax(dim=1, keepdim=True) - logits
        penalty = F.relu(distances - self.margin).mean()
        return F.cross_entropy(logits, target) + self.weight * penalty
