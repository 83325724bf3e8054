"""Spatially varying label smoothing, SVLS (Islam & Glocker, IPMI 2021)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from CalibSegLib.losses._base import SegmentationLoss
from CalibSegLib.priors import check_prior_arguments, neighbourhood_prior

__all__ = ["SpatiallyVaryingLabelSmoothingLoss"]


class SpatiallyVaryingLabelSmoothingLoss(SegmentationLoss):
    """Cross-entropy ``−mean_voxels Σ_k τ_k log s_k`` against SVLS soft labels τ.

    τ is the one-hot map convolved with the SVLS window (:func:`CalibSegLib.priors.svls_kernel`:
    Gaussian of standard deviation ``sigma`` voxels whose centre weighs as much as all
    neighbours together), outside the image counting as background — the ``gaussian``
    :func:`~CalibSegLib.priors.neighbourhood_prior`.

    Args:
        num_classes: C, background included.
        kernel: odd window width (3).
        sigma: Gaussian standard deviation in voxels (2).
    """

    def __init__(self, num_classes: int, kernel: int = 3, sigma: float = 2.0) -> None:
        super().__init__(num_classes)
        check_prior_arguments("gaussian", kernel, sigma)
        self.kernel = kernel
        self.sigma = sigma

    def compute(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        soft_labels = neighbourhood_prior(target, self.num_classes, self.kernel, "gaussian", self.sigma)
        return -(soft_labels * F.log_softmax(logits, dim=1)).sum(dim=1).mean()
