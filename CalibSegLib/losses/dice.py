"""Cross-entropy plus soft Dice, background included (MONAI's ``DiceCELoss``)."""

from __future__ import annotations

import torch
from monai.losses import DiceCELoss

from CalibSegLib.losses._base import SegmentationLoss
from CalibSegLib.losses._validation import check_non_negative

__all__ = ["CrossEntropyDiceLoss"]


class CrossEntropyDiceLoss(SegmentationLoss):
    """``ce_weight · CE + dice_weight · (1 − soft Dice)``.

    Soft Dice per image and class over softmax probabilities, all C classes (background
    included), averaged over images and classes, with MONAI's smoothing 1e-5 in numerator
    and denominator.

    Args:
        num_classes: C, background included.
        dice_weight: weight of the Dice term (1).
        ce_weight: weight of the cross-entropy term (1).
    """

    def __init__(self, num_classes: int, dice_weight: float = 1.0, ce_weight: float = 1.0) -> None:
        super().__init__(num_classes)
        check_non_negative(dice_weight=dice_weight, ce_weight=ce_weight)
        self.dice_ce = DiceCELoss(
            include_background=True, to_onehot_y=True, softmax=True, lambda_dice=dice_weight, lambda_ce=ce_weight
        )

    def compute(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.dice_ce(logits, target.unsqueeze(1))
