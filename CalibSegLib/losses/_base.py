"""Common base of CalibSeg's losses: one input check, one call signature."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from CalibSegLib.losses._validation import check_loss_inputs

__all__ = ["SegmentationLoss"]


class SegmentationLoss(nn.Module, ABC):
    """Base class: ``forward(logits, target)`` checks the inputs, then calls :meth:`compute`.

    ``logits`` are ``(B, C, H, W)`` or ``(B, C, D, H, W)``, ``target`` ``(B, *spatial)`` int64;
    the result is a scalar. Losses that need a second forward pass (BWCR) set
    ``needs_model = True`` and read the ``model`` and ``images`` keyword arguments; every
    other loss ignores them, so a training loop can pass them to any loss.

    The epoch hook, for losses that adapt between epochs (CRaC's augmented Lagrangian): when
    ``uses_validation_statistics`` is True, the training loop sums :meth:`validation_statistics`
    over the validation batches after every epoch and hands the totals to :meth:`end_epoch`;
    :meth:`epoch_scalars` are logged and :meth:`state_summary` is recorded in the bundle. A
    training loop calls these on any loss, without knowing which one it trains.
    """

    needs_model: bool = False
    uses_validation_statistics: bool = False

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2 (background included), got {num_classes!r}.")
        self.num_classes = num_classes

    def forward(
        self,
        logits: torch.Tensor,
        target: torch.Tensor,
        model: nn.Module | None = None,
        images: torch.Tensor | None = None,
    ) -> torch.Tensor:
        check_loss_inputs(logits, target, self.num_classes)
        if self.needs_model:
            return self.compute(logits, target, model=model, images=images)
        return self.compute(logits, target)

    def validation_statistics(self, logits: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Sums over one validation batch, added up across batches (tensors of fixed shapes)."""
        return {}

    def end_epoch(self, statistics: dict[str, torch.Tensor]) -> None:
        """Adapt the loss from the epoch's summed :meth:`validation_statistics`."""

    def epoch_scalars(self, class_names: list[str]) -> dict[str, float]:
        """``{"<loss>/<name>/<class>": value}`` to log after :meth:`end_epoch` (TensorBoard, history)."""
        return {}

    def state_summary(self) -> dict[str, object]:
        """The loss's learned state as plain JSON values (recorded in the bundle and the run summary)."""
        return {}

    @abstractmethod
    def compute(self, logits: torch.Tensor, target: torch.Tensor, **context: object) -> torch.Tensor:
        """The scalar loss on already checked inputs (``context``: ``model``/``images`` when
        ``needs_model``)."""
