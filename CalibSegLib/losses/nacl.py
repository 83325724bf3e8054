"""Neighbour-aware calibration loss, NACL (Murugesan et al., MICCAI 2023 and the journal extension)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from CalibSegLib.losses._base import SegmentationLoss
from CalibSegLib.losses._validation import check_choice, check_non_negative
from CalibSegLib.priors import check_prior_arguments, neighbourhood_prior

__all__ = ["NeighbourAwareLoss", "PENALTIES", "CONSTRAINED_OUTPUTS"]

# Distance between the prior τ and the constrained output z, per voxel and class (journal §4.2.5).
_DISTANCES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "l1": torch.abs,
    "l2": torch.square,
}
PENALTIES: tuple[str, ...] = tuple(_DISTANCES)

# What the constraint acts on (journal §4.2.6): the logits (paper default) or the softmax.
_OUTPUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "logits": lambda logits: logits,
    "softmax": lambda logits: logits.softmax(dim=1),
}
CONSTRAINED_OUTPUTS: tuple[str, ...] = tuple(_OUTPUTS)


class NeighbourAwareLoss(SegmentationLoss):
    """``CE + λ · mean_{voxels, k} d(τ_k, z_k)`` with τ a neighbourhood prior of the labels.

    NACL Eq. 9 with the paper's defaults: τ the ``mean`` prior over a 3×3(×3) window, z the
    logits, d the L1 distance, λ = 0.1. The journal's variants are options.

    Args:
        num_classes: C, background included.
        weight: λ ≥ 0 (0.1); λ=0 is CE.
        kernel: prior window width, 3 or 5 (2D or 3D windows follow the input).
        prior: ``mean`` (default), ``gaussian``, ``max``, ``min``, ``median`` or ``mode``
            (see :func:`CalibSegLib.priors.neighbourhood_prior`).
        penalty: ``l1`` (default, ``|τ − z|``) or ``l2`` (``(τ − z)²``).
        on: ``logits`` (default, z = l) or ``softmax`` (z = s).
        sigma: Gaussian standard deviation in voxels for the ``gaussian`` prior (2).
    """

    def __init__(
        self,
        num_classes: int,
        weight: float = 0.1,
        kernel: int = 3,
        prior: str = "mean",
        penalty: str = "l1",
        on: str = "logits",
        sigma: float = 2.0,
    ) -> None:
        super().__init__(num_classes)
        check_non_negative(weight=weight)
        check_prior_arguments(prior, kernel, sigma)
        self.distance = _DISTANCES[check_choice("penalty", penalty, PENALTIES)]
        self.constrained = _OUTPUTS[check_choice("constrained output (on)", on, CONSTRAINED_OUTPUTS)]
        self.weight = weight
        self.kernel = kernel
        self.prior = prior
        self.penalty = penalty
        self.on = on
        self.sigma = sigma

    def compute(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        tau = neighbourhood_prior(target, self.num_classes, self.kernel, self.prior, self.sigma)
        penalty = self.distance(tau - self.constrained(logits)).mean()
        return F.cross_entropy(logits, target) + self.weight * penalty
