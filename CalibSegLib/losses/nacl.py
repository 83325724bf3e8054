"""Neighbour-aware calibration loss, NACL (Murugesan et al., MICCAI 2023 and the journal extension)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from CalibSegLib.losses._base import SegmentationLoss
from CalibSegLib.priors import PRIOR_KINDS, neighbourhood_prior

__all__ = ["NeighbourAwareLoss", "PENALTIES", "TARGETS"]

PENALTIES: tuple[str, ...] = ("l1", "l2")
TARGETS: tuple[str, ...] = ("logits", "softmax")


class NeighbourAwareLoss(SegmentationLoss):
    """``CE + λ · mean_{voxels, k} ‖τ_k − z_k‖`` where τ is a neighbourhood prior of the labels.

    Args:
        num_classes: C, background included.
        weight: λ (0.1 in the paper).
        kernel: prior window width, 3 or 5 (2D or 3D windows follow the input).
        prior: one of ``mean`` (paper default), ``gaussian``, ``max``, ``min``, ``median``, ``mode``.
        penalty: ``l1`` (paper default) or ``l2`` (squared difference).
        on: ``logits`` (paper default, z = l) or ``softmax`` (z = s).
        sigma: Gaussian standard deviation in voxels, for the ``gaussian`` prior.
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
        if prior not in PRIOR_KINDS:
            raise ValueError(f"Unknown prior {prior!r}; choose one of {', '.join(PRIOR_KINDS)}.")
        if penalty not in PENALTIES:
            raise ValueError(f"Unknown penalty {penalty!r}; choose one of {', '.join(PENALTIES)}.")
        if on not in TARGETS:
            raise ValueError(f"NACL penalises 'logits' or 'softmax', got {on!r}.")
        self.weight = weight
        self.kernel = kernel
        self.prior = prior
        self.penalty = penalty
        self.on = on
        self.sigma = sigma

    def compute(self, logits: torch.Tensor, target: torch.Tensor, **context) -> torch.Tensor:
        tau = neighbourhood_prior(target, self.num_classes, self.kernel, self.prior, self.sigma)
        constrained = logits if self.on == "logits" else logits.softmax(dim=1)
        difference = tau - constrained
        distance = difference.abs() if self.penalty == "l1" else difference.square()
        return F.cross_entropy(logits, target) + self.weight * distance.mean()
