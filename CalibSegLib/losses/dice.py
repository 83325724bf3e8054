"""Cross-entropy plus soft Dice, background included (MONAI's DiceCELoss)."""

from __future__ import annotations

import torch
from monai.losses import DiceCELoss

from CalibSegLib.losses._base import SegmentationLoss

__all__ = ["CrossEntropyDiceLoss"]


class CrossEntropyDiceLoss(SegmentationLoss):
    """``CE + (1 - soft Dice)``, Dice over all C classes of each image, averaged (MONAI semantics)."""

    def __init__(self, num_classes: int, dice_weight: float = 1.0, ce_weight: float = 1.0) -> None:
        super().__init__(num_classes)
        self.dice_ce = DiceCELoss(
            include_background=True, to_onehot_y=True, softmax=True, lambda_dice=dice_weight, lambda_ce=ce_weight
        )

    def compute(self, logits: torch.Tensor, target: torch.Tensor, **context) -> torch.Tensor:
        return self.dice_ce(logits, target.unsqueeze(1))
