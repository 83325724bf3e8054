"""Voxel-wise classification losses: cross-entropy, label smoothing, focal loss, entropy penalty.

All take ``(B, C, *spatial)`` logits and ``(B, *spatial)`` int64 targets and average over voxels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from CalibSegLib.losses._base import SegmentationLoss
from CalibSegLib.losses._validation import check_non_negative

__all__ = ["CrossEntropyLoss", "LabelSmoothingLoss", "FocalLoss", "EntropyPenaltyLoss"]


class CrossEntropyLoss(SegmentationLoss):
    """Mean voxel cross-entropy ``−log s_y`` with s = softmax(logits)."""

    def compute(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, target)


class LabelSmoothingLoss(SegmentationLoss):
    """Cross-entropy against ``(1 − α)·onehot + α/C`` (Szegedy et al., CVPR 2016).

    Args:
        num_classes: C, background included.
        alpha: smoothing α in ``[0, 1)``, 0.1 as in the MbLS/NACL comparisons; α=0 is CE.
    """

    def __init__(self, num_classes: int, alpha: float = 0.1) -> None:
        super().__init__(num_classes)
        check_non_negative(alpha=alpha)
        if alpha >= 1.0:
            raise ValueError(f"alpha must lie in [0, 1), got {alpha}.")
        self.alpha = alpha

    def compute(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, target, label_smoothing=self.alpha)


class FocalLoss(SegmentationLoss):
    """Focal loss ``−(1 − s_y)^γ log s_y`` averaged over voxels (Lin et al., ICCV 2017).

    Args:
        num_classes: C, background included.
        gamma: focusing parameter γ ≥ 0, 3 as in the calibration papers; γ=0 is CE.
    """

    def __init__(self, num_classes: int, gamma: float = 3.0) -> None:
        super().__init__(num_classes)
        check_non_negative(gamma=gamma)
        self.gamma = gamma

    def compute(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        log_prob_target = F.log_softmax(logits, dim=1).gather(1, target.unsqueeze(1)).squeeze(1)
        # clamp: exp(log s) can round a hair above 1, and a negative base breaks fractional γ.
        modulation = (1.0 - log_prob_target.exp()).clamp_min(0.0) ** self.gamma
        return -(modulation * log_prob_target).mean()


class EntropyPenaltyLoss(SegmentationLoss):
    """ECP: ``CE − λ · mean_voxels H(s)`` with H the softmax entropy (Pereyra et al., ICLR-W 2017).

    Args:
        num_classes: C, background included.
        weight: λ ≥ 0, 0.1; λ=0 is CE.
    """

    def __init__(self, num_classes: int, weight: float = 0.1) -> None:
        super().__init__(num_classes)
        check_non_negative(weight=weight)
        self.weight = weight

    def compute(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        log_probs = F.log_softmax(logits, dim=1)
        entropy = -(log_probs.exp() * log_probs).sum(dim=1)
        return F.cross_entropy(logits, target) - self.weight * entropy.mean()
