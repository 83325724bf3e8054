"""Calibration-aware segmentation losses, one module per family, behind :func:`build_loss`.

Every loss maps ``(B, C, *spatial)`` logits and ``(B, *spatial)`` int64 targets to a scalar,
in 2D and 3D, with the papers' default hyper-parameters.
"""

from CalibSegLib.losses._base import SegmentationLoss
from CalibSegLib.losses._validation import check_loss_inputs
from CalibSegLib.losses.bwcr import BoundaryWeightedConsistencyLoss
from CalibSegLib.losses.crac import REGIONS, CRaCLoss, phr_penalty
from CalibSegLib.losses.crossentropy import CrossEntropyLoss, EntropyPenaltyLoss, FocalLoss, LabelSmoothingLoss
from CalibSegLib.losses.dice import CrossEntropyDiceLoss
from CalibSegLib.losses.margin import MarginLabelSmoothingLoss
from CalibSegLib.losses.nacl import NeighbourAwareLoss
from CalibSegLib.losses.registry import LOSS_CLASSES, LOSSES, build_loss, loss_hyperparameters
from CalibSegLib.losses.svls import SpatiallyVaryingLabelSmoothingLoss

__all__ = [
    "LOSSES",
    "LOSS_CLASSES",
    "build_loss",
    "loss_hyperparameters",
    "check_loss_inputs",
    "SegmentationLoss",
    "CrossEntropyLoss",
    "CrossEntropyDiceLoss",
    "FocalLoss",
    "EntropyPenaltyLoss",
    "LabelSmoothingLoss",
    "SpatiallyVaryingLabelSmoothingLoss",
    "MarginLabelSmoothingLoss",
    "NeighbourAwareLoss",
    "CRaCLoss",
    "REGIONS",
    "phr_penalty",
    "BoundaryWeightedConsistencyLoss",
]
