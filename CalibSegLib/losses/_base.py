"""Common base of CalibSeg's losses: one input check, one call signature."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SegmentationLoss", "check_loss_inputs"]


def check_loss_inputs(logits: torch.Tensor, target: torch.Tensor, num_classes: int) -> None:
    """Raise one clear ``ValueError`` when ``logits``/``target`` cannot be a segmentation batch.

    Args:
        logits: ``(B, C, H, W)`` or ``(B, C, D, H, W)`` float.
        target: ``(B, H, W)`` or ``(B, D, H, W)`` int64 labels in ``[0, C)``.
        num_classes: C, background included.
    """
    if not torch.is_tensor(logits) or not torch.is_tensor(target):
        raise ValueError("logits and target must be torch tensors.")
    if logits.dim() not in (4, 5):
        raise ValueError(f"logits must be (B, C, H, W) or (B, C, D, H, W), got shape {tuple(logits.shape)}.")
    if logits.shape[1] != num_classes:
        raise ValueError(f"logits have {logits.shape[1]} channels but the loss was built for {num_classes} classes.")
    if target.dtype != torch.int64:
        raise ValueError(f"target must be int64 class labels, got {target.dtype}; convert it with target.long().")
    if target.shape != logits.shape[:1] + logits.shape[2:]:
        raise ValueError(
            f"target shape {tuple(target.shape)} does not match logits {tuple(logits.shape)}; "
            "expected (B, *spatial) with the logits' batch and spatial size."
        )
    if target.numel() and (int(target.min()) < 0 or int(target.max()) >= num_classes):
        raise ValueError(
            f"target labels must lie in [0, {num_classes - 1}], found range "
            f"[{int(target.min())}, {int(target.max())}]."
        )
    if not bool(torch.isfinite(logits).all()):
        raise ValueError("logits contain NaN or infinite values; check the network's input and learning rate.")


class SegmentationLoss(nn.Module):
    """Base class: ``forward(logits, target)`` checks the inputs, then calls :meth:`compute`.

    Losses that need a second forward pass (BWCR) set ``needs_model = True`` and read the
    ``model`` and ``images`` keyword arguments; every other loss ignores them.
    """

    needs_model: bool = False

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}.")
        self.num_classes = num_classes

    def forward(
        self,
        logits: torch.Tensor,
        target: torch.Tensor,
        model: nn.Module | None = None,
        images: torch.Tensor | None = None,
    ) -> torch.Tensor:
        check_loss_inputs(logits, target, self.num_classes)
        return self.compute(logits, target, model=model, images=images)

    def compute(self, logits: torch.Tensor, target: torch.Tensor, **context) -> torch.Tensor:
        raise NotImplementedError
