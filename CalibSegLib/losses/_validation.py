"""Input checks shared by every loss: one clear ``ValueError`` that names the problem."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["check_loss_inputs", "check_choice", "check_non_negative"]


def check_loss_inputs(logits: torch.Tensor, target: torch.Tensor, num_classes: int) -> None:
    """Raise one clear ``ValueError`` when ``logits``/``target`` cannot be a segmentation batch.

    Args:
        logits: ``(B, C, H, W)`` or ``(B, C, D, H, W)`` float, finite.
        target: ``(B, H, W)`` or ``(B, D, H, W)`` int64 labels in ``[0, C)``, the logits' batch
            and spatial size.
        num_classes: C, background included.
    """
    if not torch.is_tensor(logits) or not torch.is_tensor(target):
        raise ValueError(f"logits and target must be torch tensors, got {type(logits).__name__} and "
                         f"{type(target).__name__}.")
    if logits.dim() not in (4, 5):
        raise ValueError(f"logits must be (B, C, H, W) or (B, C, D, H, W), got shape {tuple(logits.shape)}.")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {logits.dtype}.")
    if logits.shape[1] != num_classes:
        raise ValueError(f"logits have {logits.shape[1]} channels but the loss was built for {num_classes} classes.")
    if target.dtype != torch.int64:
        raise ValueError(f"target must be int64 class labels, got {target.dtype}; convert it with target.long().")
    if target.shape != logits.shape[:1] + logits.shape[2:]:
        raise ValueError(
            f"target shape {tuple(target.shape)} does not match logits {tuple(logits.shape)}; "
            "expected (B, *spatial) with the logits' batch and spatial size."
        )
    if target.device != logits.device:
        raise ValueError(f"target is on {target.device} but logits are on {logits.device}; move them together.")
    if target.numel():
        # One device sync for both ends of the label range.
        low, high = torch.aminmax(target)
        low, high = int(low), int(high)
        if low < 0 or high >= num_classes:
            raise ValueError(f"target labels must lie in [0, {num_classes - 1}], found range [{low}, {high}].")
    if not bool(torch.isfinite(logits).all()):
        raise ValueError("logits contain NaN or infinite values; check the network's input and learning rate.")


def check_choice(argument: str, value: str, choices: Sequence[str]) -> str:
    """Return ``value`` when it is one of ``choices``, else raise a ``ValueError`` listing them."""
    if value not in choices:
        raise ValueError(f"Unknown {argument} {value!r}; choose one of {', '.join(choices)}.")
    return value


def check_non_negative(**values: float) -> None:
    """Raise a ``ValueError`` naming the first hyper-parameter that is negative or not finite."""
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}.")
