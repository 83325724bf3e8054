"""Loss registry: ``build_loss(name, num_classes, **hparams)`` and the names in ``LOSSES``."""

from __future__ import annotations

import inspect
from typing import Any

from CalibSegLib.losses._base import SegmentationLoss
from CalibSegLib.losses.bwcr import BoundaryWeightedConsistencyLoss
from CalibSegLib.losses.crac import CRaCLoss
from CalibSegLib.losses.crossentropy import CrossEntropyLoss, EntropyPenaltyLoss, FocalLoss, LabelSmoothingLoss
from CalibSegLib.losses.dice import CrossEntropyDiceLoss
from CalibSegLib.losses.margin import MarginLabelSmoothingLoss
from CalibSegLib.losses.nacl import NeighbourAwareLoss
from CalibSegLib.losses.svls import SpatiallyVaryingLabelSmoothingLoss

__all__ = ["LOSS_CLASSES", "LOSSES", "build_loss", "loss_hyperparameters"]

LOSS_CLASSES: dict[str, type[SegmentationLoss]] = {
    "ce": CrossEntropyLoss,
    "ce_dice": CrossEntropyDiceLoss,
    "focal": FocalLoss,
    "ecp": EntropyPenaltyLoss,
    "ls": LabelSmoothingLoss,
    "svls": SpatiallyVaryingLabelSmoothingLoss,
    "mbls": MarginLabelSmoothingLoss,
    "nacl": NeighbourAwareLoss,
    "crac": CRaCLoss,
    "bwcr": BoundaryWeightedConsistencyLoss,
}

LOSSES: tuple[str, ...] = tuple(LOSS_CLASSES)


def loss_hyperparameters(name: str) -> dict[str, Any]:
    """The hyper-parameters of loss ``name`` with their defaults (the papers' values)."""
    if name not in LOSS_CLASSES:
        raise KeyError(f"Unknown loss {name!r}; choose one of {', '.join(LOSSES)}.")
    signature = inspect.signature(LOSS_CLASSES[name].__init__)
    return {
        key: parameter.default
        for key, parameter in signature.parameters.items()
        if key not in ("self", "num_classes")
    }


def build_loss(name: str, num_classes: int, **hparams: Any) -> SegmentationLoss:
    """Build the loss called ``name`` (one of :data:`LOSSES`) for ``num_classes`` classes.

    ``hparams`` override the defaults listed by :func:`loss_hyperparameters`; an unknown
    name raises ``KeyError`` listing the valid ones.
    """
    known = loss_hyperparameters(name)
    unknown = sorted(set(hparams) - set(known))
    if unknown:
        raise KeyError(
            f"Loss {name!r} has no hyper-parameter {', '.join(unknown)}; it takes {', '.join(known) or 'none'}."
        )
    return LOSS_CLASSES[name](num_classes, **hparams)
