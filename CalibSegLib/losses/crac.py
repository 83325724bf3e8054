"""Class- and region-adaptive constraints, CRaC (Murugesan, Silva-Rodriguez, Ben Ayed, Dolz, MICCAI 2024).

NACL's single penalty weight λ becomes 2·C multipliers, one per class and region
(*outer*: voxels whose window holds more than one label; *inner*: the rest), learned
with an augmented Lagrangian method (ALM) and the PHR penalty (paper Eq. 7–10).

The training loop, not the loss, owns the ALM schedule: after each epoch it sums
:meth:`CRaCLoss.constraint_statistics` over the validation set and calls
:meth:`CRaCLoss.update_multipliers`. Multipliers, penalty parameters and the schedule
state are buffers, so they travel in ``state_dict`` (checkpoints, bundles) and resume exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from CalibSegLib.losses._base import SegmentationLoss, check_loss_inputs
from CalibSegLib.priors import inner_region_mask, neighbourhood_prior

__all__ = ["CRaCLoss", "phr_penalty", "REGIONS"]

REGIONS: tuple[str, ...] = ("outer", "inner")


def phr_penalty(z: torch.Tensor, rho: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """PHR penalty (paper Eq. 10): ``λz + ρz²/2`` where ``λ + ρz ≥ 0``, else ``−λ²/(2ρ)``.

    With ``ρ = 0`` it is the linear penalty ``λz`` (λ > 0 and z ≥ 0 keep the first branch).
    """
    quadratic = lam * z + 0.5 * rho * z.square()
    flat = -lam.square() / (2.0 * rho.clamp_min(torch.finfo(z.dtype).tiny))
    return torch.where(lam + rho * z >= 0, quadratic, flat)


class CRaCLoss(SegmentationLoss):
    """``CE + mean_{voxels, k} PHR(h_{k}, ρ_{r,k}, λ_{r,k})`` with the voxel's region r.

    Constraints per voxel and class (authors' reference implementation): outer
    ``h = |τ_k − l_k|``, inner ``h = |m·τ_k − l_k|`` with margin m, τ the ``mean``
    neighbourhood prior over a ``kernel``-wide window and l the logits.

    Args:
        num_classes: C, background included.
        margin: inner-region margin m (5).
        kernel: prior and region window width (3).
        initial_multiplier: λ at start (1e-6); λ stays in ``[min_multiplier, max_multiplier]``.
        initial_penalty: ρ₀ (0.1); ``rho_max`` (10), growth ``gamma`` (1.2), shrink factor ``mu`` (0.9).
        rho_update_every: Eq. 9 is applied every this many multiplier updates (epochs), 10.

    Buffers (``(2, C)``, row 0 outer, row 1 inner): ``multipliers`` λ, ``penalty`` ρ,
    ``reference_violation`` (mean constraint at the last ρ check); scalar ``updates``.
    """

    def __init__(
        self,
        num_classes: int,
        margin: float = 5.0,
        kernel: int = 3,
        initial_multiplier: float = 1e-6,
        initial_penalty: float = 0.1,
        rho_max: float = 10.0,
        gamma: float = 1.2,
        mu: float = 0.9,
        rho_update_every: int = 10,
        min_multiplier: float = 1e-6,
        max_multiplier: float = 1e6,
    ) -> None:
        super().__init__(num_classes)
        if initial_penalty < 0 or rho_max < initial_penalty:
            raise ValueError(f"need 0 <= initial_penalty <= rho_max, got {initial_penalty} and {rho_max}.")
        self.margin = margin
        self.kernel = kernel
        self.rho_max = rho_max
        self.gamma = gamma
        self.mu = mu
        self.rho_update_every = rho_update_every
        self.min_multiplier = min_multiplier
        self.max_multiplier = max_multiplier
        shape = (len(REGIONS), num_classes)
        self.register_buffer("multipliers", torch.full(shape, float(initial_multiplier)))
        self.register_buffer("penalty", torch.full(shape, float(initial_penalty)))
        self.register_buffer("reference_violation", torch.full(shape, float("inf")))
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))

    def constraints(self, logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-voxel constraint values ``(B, C, *spatial)`` and the inner-region mask ``(B, 1, *spatial)``."""
        tau = neighbourhood_prior(target, self.num_classes, self.kernel, "mean")
        inner = inner_region_mask(target, self.kernel).unsqueeze(1)
        scaled_tau = torch.where(inner, self.margin * tau, tau)
        return (scaled_tau - logits).abs(), inner

    def _per_voxel(self, parameters: torch.Tensor, inner: torch.Tensor, spatial_dims: int) -> torch.Tensor:
        """Pick row 0 (outer) or 1 (inner) of a ``(2, C)`` buffer for every voxel: ``(B, C, *spatial)``."""
        view = (1, self.num_classes) + (1,) * spatial_dims
        return torch.where(inner, parameters[1].view(view), parameters[0].view(view))

    def compute(self, logits: torch.Tensor, target: torch.Tensor, **context) -> torch.Tensor:
        violation, inner = self.constraints(logits, target)
        spatial_dims = logits.dim() - 2
        lam = self._per_voxel(self.multipliers, inner, spatial_dims)
        rho = self._per_voxel(self.penalty, inner, spatial_dims)
        return F.cross_entropy(logits, target) + phr_penalty(violation, rho, lam).mean()

    @torch.no_grad()
    def constraint_statistics(self, logits: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per class × region sums of the constraint and voxel counts, ``(2, C)`` float64 each.

        Sums (not means) so that the loop can add them over validation batches.
        """
        check_loss_inputs(logits, target, self.num_classes)
        violation, inner = self.constraints(logits.float(), target)
        inner = inner.expand_as(violation)
        reduce_dims = [0] + list(range(2, violation.dim()))
        totals = []
        counts = []
        for region_mask in (~inner, inner):
            totals.append((violation * region_mask).sum(dim=reduce_dims).double())
            counts.append(region_mask.sum(dim=reduce_dims).double())
        return {"violation_sum": torch.stack(totals).cpu(), "count": torch.stack(counts).cpu()}

    @torch.no_grad()
    def update_multipliers(self, statistics: dict[str, torch.Tensor]) -> None:
        """One ALM outer step from summed validation statistics.

        Eq. 8: ``λ ← clamp(λ + ρ·mean h, min, max)`` (the mean of PHR's derivative, since
        h ≥ 0 keeps PHR in its quadratic branch). Eq. 9, every ``rho_update_every`` calls:
        ``ρ ← min(γρ, ρ_max)`` where the mean violation did not shrink below ``μ`` times the
        one at the previous check. Classes absent from a region keep their values.
        """
        total = statistics["violation_sum"].to(self.multipliers.device, torch.float64)
        count = statistics["count"].to(self.multipliers.device, torch.float64)
        if total.shape != self.multipliers.shape or count.shape != self.multipliers.shape:
            raise ValueError(
                f"statistics must be {tuple(self.multipliers.shape)} sums from constraint_statistics(), "
                f"got {tuple(total.shape)} and {tuple(count.shape)}."
            )
        present = count > 0
        mean_violation = torch.where(present, total / count.clamp_min(1.0), torch.zeros_like(total))
        stepped = self.multipliers.double() + self.penalty.double() * mean_violation
        stepped = stepped.clamp(self.min_multiplier, self.max_multiplier)
        self.multipliers.copy_(torch.where(present, stepped, self.multipliers.double()))

        if int(self.updates) % self.rho_update_every == 0:
            not_shrinking = present & (mean_violation > self.mu * self.reference_violation.double())
            grown = (self.penalty * self.gamma).clamp_max(self.rho_max)
            self.penalty.copy_(torch.where(not_shrinking, grown, self.penalty))
            self.reference_violation.copy_(torch.where(present, mean_violation, self.reference_violation.double()))
        self.updates += 1

    def multiplier_table(self) -> dict[str, list[float]]:
        """λ per region as plain lists (for logs and bundle metadata)."""
        return {region: self.multipliers[index].tolist() for index, region in enumerate(REGIONS)}
