"""Spatially varying label smoothing (Islam & Glocker, IPMI 2021)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from CalibSegLib.losses._base import SegmentationLoss
from CalibSegLib.priors import neighbourhood_prior

__all__ = ["SpatiallyVaryingLabelSmoothingLoss"]


class SpatiallyVaryingLabelSmoothingLoss(SegmentationLoss):
    """Cross-entropy ``-Σ_k τ_k log s_k`` against Gaussian soft labels τ.

    τ is the one-hot map convolved with a normalised ``kernel``-wide Gaussian of standard
    deviation ``sigma`` voxels (k=3, σ=2), outside the image counting as background; see
    :func:`CalibSegLib.priors.neighbourhood_prior` with ``kind="gaussian"``.
    """

    def __init__(self, num_classes: int, kernel: int = 3, sigma: float = 2.0) -> None:
        super().__init__(num_classes)
        self.kernel = kernel
        self.sigma = sigma

    def compute(self, logits: torch.Tensor, target: torch.Tensor, **context) -> torch.Tensor:
        soft_labels = neighbourhood_prior(target, self.num_classes, self.kernel, "gaussian", self.sigma)
        return -(soft_labels * F.log_softmax(logits, dim=1)).sum(dim=1).mean()
