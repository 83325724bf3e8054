"""Boundary-weighted logit consistency, BWCR (Karani, Dey, Golland, MICCAI 2023).

Karani et al. show that asking a network for the same logits on two randomly transformed
views of an image acts as a spatially varying regulariser: where the transformation makes
labels ambiguous (near boundaries) it keeps predictions from becoming overconfident. Their
boundary-weighted version weighs the consistency term per pixel by the distance to the
label boundary. CalibSeg's choices, following the authors' code (github.com/neerakara/BWCR)
where the paper leaves freedom:

- Views: view 1 is the original batch (its logits are the ones the training loop already
  computed); view 2 is a random affine warp (in-plane rotation ±15°, isotropic scaling
  ±10 %, translation ±5 % of the size; bilinear) followed by a random intensity change
  (gamma exp(U(±0.4)) on min–max normalised intensities, Gaussian noise of 3 % of the
  range), see :mod:`CalibSegLib.losses._views`. View 2's logits are warped back onto the
  original grid with the inverse affine map; voxels whose back-warp reaches outside view 2
  are left out (weight 0).
- Weight: ``λ(x) = λ_min + (λ_max − λ_min) · max(R − d(x), 0) / R`` where d is the chessboard
  distance in voxels to the nearest label-boundary voxel (a voxel whose 3×3(×3) window holds
  more than one label, outside the image counting as background) and R = 10 voxels, the
  authors' margin. As in the authors' ``compute_lambda_map``, λ is λ_max *at* the boundary,
  where labels are ambiguous, and falls linearly to λ_min at R voxels and beyond; an image
  with a single label gets λ_min everywhere.
- Loss: ``CE(l¹, y) + mean_x λ(x) · v(x) · mean_k (l¹_k(x) − l²_k(x))²`` with l¹ the original
  logits, l² view 2's logits on the original grid, v the validity mask; the mean over x runs
  over all voxels of the batch. Gradients flow through both views.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from CalibSegLib.losses._base import SegmentationLoss
from CalibSegLib.losses._validation import check_non_negative
from CalibSegLib.losses._views import invert_affine, random_affine, random_intensity, valid_after_warp, warp
from CalibSegLib.priors import inner_region_mask

__all__ = ["BoundaryWeightedConsistencyLoss", "boundary_distance", "boundary_weights"]


def boundary_distance(target: torch.Tensor, max_distance: int) -> torch.Tensor:
    """``(B, *spatial)`` float chessboard distance to the nearest label-boundary voxel, capped at
    ``max_distance`` (also the value where the image has no boundary)."""
    reached = (~inner_region_mask(target, kernel=3)).unsqueeze(1).float()
    pool = F.max_pool2d if target.dim() == 3 else F.max_pool3d
    distance = torch.zeros_like(reached)
    # After k dilations by a 3-wide window the boundary covers every voxel at distance <= k,
    # so a voxel's distance is the number of dilations it was still outside of.
    for _ in range(max_distance):
        distance += 1.0 - reached
        reached = pool(reached, kernel_size=3, stride=1, padding=1)
    return distance.squeeze(1)


def boundary_weights(
    target: torch.Tensor, weight_min: float = 0.01, weight_max: float = 1.0, margin: int = 10
) -> torch.Tensor:
    """Per-voxel BWCR weights ``(B, *spatial)``: λ_max at label boundaries, λ_min at ``margin`` voxels."""
    closeness = (margin - boundary_distance(target, margin)) / margin
    return weight_min + (weight_max - weight_min) * closeness


class BoundaryWeightedConsistencyLoss(SegmentationLoss):
    """CE plus boundary-weighted logit consistency between the batch and a random view of it.

    Needs the model and the input batch: ``loss(logits, target, model=model, images=images)``
    with ``logits = model(images)``; see the module docstring for the exact formula.

    Args:
        num_classes: C, background included.
        weight_min: λ_min, the weight far from boundaries (0.01).
        weight_max: λ_max, the weight at boundaries (1).
        margin: R, the distance in voxels over which λ falls from λ_max to λ_min (10).
        max_rotation: in-plane rotation range of view 2, degrees (15).
        max_scaling: relative scaling range of view 2 (0.1).
        max_translation: translation range of view 2, fraction of the size (0.05).
        max_log_gamma: view 2's gamma is exp(U(−max, max)) (0.4).
        noise_std: view 2's Gaussian noise, fraction of the intensity range (0.03).
    """

    needs_model = True

    def __init__(
        self,
        num_classes: int,
        weight_min: float = 0.01,
        weight_max: float = 1.0,
        margin: int = 10,
        max_rotation: float = 15.0,
        max_scaling: float = 0.1,
        max_translation: float = 0.05,
        max_log_gamma: float = 0.4,
        noise_std: float = 0.03,
    ) -> None:
        super().__init__(num_classes)
        check_non_negative(
            weight_min=weight_min, weight_max=weight_max, max_rotation=max_rotation, max_scaling=max_scaling,
            max_translation=max_translation, max_log_gamma=max_log_gamma, noise_std=noise_std,
        )
        if weight_min > weight_max:
            raise ValueError(f"weight_min ({weight_min}) must be <= weight_max ({weight_max}).")
        if isinstance(margin, bool) or not isinstance(margin, int) or margin < 1:
            raise ValueError(f"margin must be a positive number of voxels, got {margin!r}.")
        if max_scaling >= 1.0:
            raise ValueError(f"max_scaling must be < 1 so the scale stays positive, got {max_scaling}.")
        self.weight_min = weight_min
        self.weight_max = weight_max
        self.margin = margin
        self.max_rotation = max_rotation
        self.max_scaling = max_scaling
        self.max_translation = max_translation
        self.max_log_gamma = max_log_gamma
        self.noise_std = noise_std

    def second_view_logits(self, model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of a random view of ``images`` on the original grid, and their ``(B, 1, *spatial)``
        validity mask."""
        theta = random_affine(
            images.shape[0], tuple(images.shape[2:]), self.max_rotation, self.max_scaling,
            self.max_translation, device=images.device,
        )
        view = random_intensity(warp(images, theta), self.max_log_gamma, self.noise_std)
        view_logits = model(view)
        back = invert_affine(theta)
        return warp(view_logits, back), valid_after_warp(view_logits, back)

    def compute(
        self,
        logits: torch.Tensor,
        target: torch.Tensor,
        model: nn.Module | None = None,
        images: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if model is None or images is None:
            raise ValueError("BWCR needs the model and the input images: "
                             "call loss(logits, target, model=..., images=...).")
        if images.dim() != logits.dim() or images.shape[:1] + images.shape[2:] != logits.shape[:1] + logits.shape[2:]:
            raise ValueError(
                f"images {tuple(images.shape)} must be (B, channels, *spatial) with the logits' batch and "
                f"spatial size {tuple(logits.shape)}."
            )
        second_logits, valid = self.second_view_logits(model, images)
        weights = boundary_weights(target, self.weight_min, self.weight_max, self.margin)
        consistency = (logits - second_logits).square().mean(dim=1)
        return F.cross_entropy(logits, target) + (weights * valid.squeeze(1) * consistency).mean()
