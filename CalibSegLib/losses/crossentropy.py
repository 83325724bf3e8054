"""Pixel-wise classification losses: cross-entropy, label smoothing, focal loss, entropy penalty."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from CalibSegLib.losses._base import SegmentationLoss

__all__ = ["CrossEntropyLoss", "LabelSmoothingLoss", "FocalLoss", "EntropyPenaltyLoss"]


class CrossEntropyLoss(SegmentationLoss):
    """Mean voxel cross-entropy ``-log s_y`` of ``(B, C, *spatial)`` logits."""

    def compute(self, logits: torch.Tensor, target: torch.Tensor, **context) -> torch.Tensor:
        return F.cross_entropy(logits, target)


class LabelSmoothingLoss(SegmentationLoss):
    """Cross-entropy against ``(1 - α)·onehot + α/C`` (Szegedy et al., CVPR 2016); α=0.1."""

    def __init__(self, num_classes: int, alpha: float = 0.1) -> None:
        super().__init__(num_classes)
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must lie in [0, 1), got {alpha}.")
        self.alpha = alpha

    def compute(self, logits: torch.Tensor, target: torch.Tensor, **context) -> torch.Tensor:
        return F.cross_entropy(logits, target, label_smoothing=self.alpha)


class FocalLoss(SegmentationLoss):
    """Focal loss ``-(1 - s_y)^γ log s_y`` averaged over voxels (Lin et al., ICCV 2017); γ=3."""

    def __init__(self, num_classes: int, gamma: float = 3.0) -> None:
        super().__init__(num_classes)
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}.")
        self.gamma = gamma

    def compute(self, logits: torch.Tensor, target: torch.Tensor, **context) -> torch.Tensor:
        log_prob_target = F.log_softmax(logits, dim=1).gather(1, target.unsqueeze(1)).squeeze(1)
        modulation = (1.0 - log_prob_target.exp()).clamp_min(0.0) ** self.gamma
        return -(modulation * log_prob_target).mean()


class EntropyPenaltyLoss(SegmentationLoss):
    """ECP: cross-entropy minus λ times the mean softmax entropy (Pereyra et al., 2017); λ=0.1."""

    def __init__(self, num_classes: int, weight: float = 0.1) -> None:
        super().__init__(num_classes)
        self.weight = weight

    def compute(self, logits: torch.Tensor, target: torch.Tensor, **context) -> torch.Tensor:
        log_probs = F.log_softmax(logits, dim=1)
        entropy = -(log_probs.exp() * log_probs).sum(dim=1)
        return F.cross_entropy(logits, target) - self.weight * entropy.mean()
