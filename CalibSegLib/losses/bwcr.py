"""Boundary-weighted logit consistency, BWCR (Karani, Dey, Golland, MICCAI 2023).

Karani et al. show that asking for the same logits under stochastic transformations of
the input acts as a spatially varying regulariser that stops overconfidence at voxels
whose labels are ambiguous, and weight that consistency term by the distance to the
label boundary. CalibSeg's choices, where the paper leaves freedom:

- Second view: the same images under a random intensity transformation (per image:
  gamma in [0.7, 1.5] on min-max-normalised intensities, then additive Gaussian noise of
  standard deviation 0.03 of the intensity range). Intensity-only transformations keep
  voxel correspondence, so the two logit maps are compared voxel by voxel with no warp.
- Weight: ``λ(x) = λ_max − (λ_max − λ_min)·min(d(x), d_max)/d_max`` where d is the
  chessboard distance (in voxels) to the nearest label-boundary voxel (a voxel whose 3×3(×3)
  window holds more than one label), ``d_max = 4``: strongest at boundaries, where labels
  are ambiguous, λ_min far inside structures and background.
- Loss: ``CE(l¹, y) + mean_x λ(x) · mean_k (l¹_k − l²_k)²`` with l¹ the logits of the
  original images (the ones the training loop computed) and l² those of the second view.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from CalibSegLib.losses._base import SegmentationLoss
from CalibSegLib.priors import inner_region_mask

__all__ = ["BoundaryWeightedConsistencyLoss", "boundary_distance_weights", "intensity_view"]


def boundary_distance_weights(
    target: torch.Tensor, weight_min: float = 0.01, weight_max: float = 1.0, max_distance: int = 4
) -> torch.Tensor:
    """``(B, *spatial)`` per-voxel weights from λ_max at label boundaries down to λ_min at ``max_distance``."""
    boundary = (~inner_region_mask(target, kernel=3)).float().unsqueeze(1)
    pool = F.max_pool2d if target.dim() == 3 else F.max_pool3d
    distance = torch.full_like(boundary, float(max_distance))
    reached = boundary
    # Each 3-wide max-pool grows the boundary by one voxel in chessboard distance.
    for step in range(max_distance):
        distance = torch.where((reached > 0) & (distance == max_distance), torch.full_like(distance, step), distance)
        reached = pool(reached, kernel_size=3, stride=1, padding=1)
    fraction = distance.squeeze(1) / max_distance
    return weight_max - (weight_max - weight_min) * fraction


def intensity_view(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random gamma and noise per image of a ``(B, channels, *spatial)`` batch (the second BWCR view)."""
    batch = images.shape[0]
    reduce_dims = tuple(range(1, images.dim()))
    low = images.amin(dim=reduce_dims, keepdim=True)
    span = (images.amax(dim=reduce_dims, keepdim=True) - low).clamp_min(1e-6)
    shape = (batch,) + (1,) * (images.dim() - 1)
    gamma = torch.empty(shape, device=images.device).uniform_(0.7, 1.5, generator=generator)
    normalised = ((images - low) / span).clamp(0, 1) ** gamma
    noise = torch.randn(images.shape, device=images.device, generator=generator) * 0.03
    return (normalised + noise) * span + low


class BoundaryWeightedConsistencyLoss(SegmentationLoss):
    """CE plus boundary-weighted logit consistency between two views; λ_min=0.01, λ_max=1.

    Needs the model and the input batch: call ``loss(logits, target, model=model, images=images)``.
    """

    needs_model = True

    def __init__(self, num_classes: int, weight_min: float = 0.01, weight_max: float = 1.0, max_distance: int = 4):
        super().__init__(num_classes)
        if not 0 <= weight_min <= weight_max:
            raise ValueError(f"need 0 <= weight_min <= weight_max, got {weight_min} and {weight_max}.")
        self.weight_min = weight_min
        self.weight_max = weight_max
        self.max_distance = max_distance

    def compute(
        self,
        logits: torch.Tensor,
        target: torch.Tensor,
        model: nn.Module | None = None,
        images: torch.Tensor | None = None,
        **context,
    ) -> torch.Tensor:
        if model is None or images is None:
            raise ValueError("BWCR needs the model and the input images: call loss(logits, target, model=..., images=...).")
        second_logits = model(intensity_view(images))
        weights = boundary_distance_weights(target, self.weight_min, self.weight_max, self.max_distance)
        consistency = (logits - second_logits).square().mean(dim=1)
        return F.cross_entropy(logits, target) + (weights * consistency).mean()
