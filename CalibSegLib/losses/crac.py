"""Class- and region-adaptive constraints, CRaC (Murugesan, Silva-Rodriguez, Ben Ayed, Dolz, MICCAI 2024).

NACL's single penalty weight λ becomes 2·C multipliers, one per region (*outer*: voxels
whose window holds more than one label; *inner*: the rest) and class, learned with an
augmented Lagrangian method (ALM) and the PHR penalty (paper Eq. 7–10).

The training loop runs the ALM outer steps through the loss's epoch hook: after each epoch
it sums :meth:`CRaCLoss.validation_statistics` over the validation set and calls
:meth:`CRaCLoss.end_epoch`. Multipliers, penalty parameters and the schedule
state are buffers, so they travel in ``state_dict`` (checkpoints, bundles) and resume exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from CalibSegLib.losses._base import SegmentationLoss
from CalibSegLib.losses._validation import check_choice, check_loss_inputs, check_non_negative
from CalibSegLib.priors import check_prior_arguments, neighbourhood_prior

__all__ = ["CRaCLoss", "phr_penalty", "REGIONS", "PENALTY_REDUCTIONS", "RHO_REFERENCES"]

REGIONS: tuple[str, ...] = ("outer", "inner")  # row order of the (2, C) buffers


def phr_penalty(z: torch.Tensor, rho: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """PHR penalty (paper Eq. 10): ``λz + ρz²/2`` where ``λ + ρz ≥ 0``, else ``−λ²/(2ρ)``.

    Element-wise with broadcasting. With ``ρ = 0`` and ``λ ≥ 0`` it is the linear penalty ``λz``
    for ``z ≥ 0``.
    """
    quadratic = lam * z + 0.5 * rho * z.square()
    # The flat branch is only taken where ρ > 0 (λ ≥ 0 and λ + ρz < 0 need ρz < 0); the clamp
    # keeps the unused branch finite where ρ = 0.
    flat = -lam.square() / (2.0 * rho.clamp_min(torch.finfo(z.dtype).tiny))
    return torch.where(lam + rho * z >= 0, quadratic, flat)


PENALTY_REDUCTIONS: tuple[str, ...] = ("region_slots", "voxels")
RHO_REFERENCES: tuple[str, ...] = ("previous_epoch", "previous_check")


class CRaCLoss(SegmentationLoss):
    """``CE + reduce_{voxels, k} PHR(h_k, ρ_{r,k}, λ_{r,k})``, r the voxel's region.

    Constraints per voxel and class: outer (boundary) ``h = |τ_k − l_k|`` (paper Eq. 7), inner
    ``h = |m·τ_k − l_k|``, τ the ``mean`` neighbourhood prior over a ``kernel``-wide window
    (outside = background), l the logits. The defaults are the authors' ACDC run (README of
    github.com/Bala93/CRac: ``lag.margin=5 lag.rho=0.1``; ``aug_lagrangian_spatial_cls_bndry.py``):

    - ``margin`` m = 5. Since h ≥ 0, λ only grows, and an L1 pull of weight λ pins a logit at its
      target once λ exceeds the cross-entropy pull 1 − p; with m = 1 the inner logits are pinned
      in [0, 1] and the softmax at e/(e + 3) ≈ 0.48 (under-confident), with m = 5 at
      e⁵/(e⁵ + 3) ≈ 0.98.
    - ``penalty_reduction="region_slots"``: the penalty is averaged over B·voxels·2C
      region × class slots, the other region's slot being 0 — half of a plain mean over voxels
      and classes (``"voxels"``).
    - ρ (Eq. 9) every ``rho_update_every`` epochs, compared with the *previous epoch's* mean
      violation (``rho_reference="previous_epoch"``), clamped to [ρ₀, ρ_max];
      ``"previous_check"`` compares with the value at the previous ρ check instead.

    With ``margin=1``, ``ρ = 0``, ``penalty_reduction="voxels"`` and every λ equal, this is NACL
    with that λ.

    Args:
        num_classes: C, background included.
        margin: inner-region target scale m (5; 1 is the paper's Eq. 7 without margin).
        kernel: prior and region window width (3).
        penalty_reduction: ``"region_slots"`` (authors) or ``"voxels"``.
        initial_multiplier: λ at start (1e-6).
        initial_penalty: ρ₀ (0.1), also ρ's lower bound.
        rho_max: ρ never grows beyond this (10).
        gamma: ρ growth factor γ (1.2).
        mu: ρ grows where the mean violation is above ``mu`` times the reference one (0.9).
        rho_update_every: Eq. 9 is applied at the end of epochs n, 2n, … (n = 10).
        rho_reference: ``"previous_epoch"`` (authors) or ``"previous_check"``.
        warmup_epochs: epochs before the first multiplier update (0: from the first epoch).
        min_multiplier, max_multiplier: λ is clamped to this range (1e-6, 1e6).

    Buffers (``(2, C)``, row 0 outer, row 1 inner): ``multipliers`` λ, ``penalty`` ρ,
    ``previous_violation`` (the reference mean violation, ``inf`` before the first);
    scalar ``updates`` (number of :meth:`end_epoch` calls).
    """

    uses_validation_statistics = True

    def __init__(
        self,
        num_classes: int,
        margin: float = 5.0,
        kernel: int = 3,
        penalty_reduction: str = "region_slots",
        initial_multiplier: float = 1e-6,
        initial_penalty: float = 0.1,
        rho_max: float = 10.0,
        gamma: float = 1.2,
        mu: float = 0.9,
        rho_update_every: int = 10,
        rho_reference: str = "previous_epoch",
        warmup_epochs: int = 0,
        min_multiplier: float = 1e-6,
        max_multiplier: float = 1e6,
    ) -> None:
        super().__init__(num_classes)
        check_non_negative(
            margin=margin, initial_multiplier=initial_multiplier, initial_penalty=initial_penalty,
            rho_max=rho_max, gamma=gamma, mu=mu, min_multiplier=min_multiplier, max_multiplier=max_multiplier,
        )
        check_prior_arguments("mean", kernel)
        check_choice("penalty_reduction", penalty_reduction, PENALTY_REDUCTIONS)
        check_choice("rho_reference", rho_reference, RHO_REFERENCES)
        if rho_max < initial_penalty:
            raise ValueError(f"rho_max ({rho_max}) must be >= initial_penalty ({initial_penalty}).")
        if min_multiplier > max_multiplier:
            raise ValueError(f"min_multiplier ({min_multiplier}) must be <= max_multiplier ({max_multiplier}).")
        for name, value, lowest in (("rho_update_every", rho_update_every, 1), ("warmup_epochs", warmup_epochs, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                raise ValueError(f"{name} must be an integer >= {lowest}, got {value!r}.")
        self.margin = margin
        self.kernel = kernel
        self.penalty_reduction = penalty_reduction
        # region_slots: the mean over 2C slots per voxel, C of them zero, is half the mean over C.
        self.reduction_scale = 0.5 if penalty_reduction == "region_slots" else 1.0
        self.initial_penalty = initial_penalty
        self.rho_max = rho_max
        self.gamma = gamma
        self.mu = mu
        self.rho_update_every = rho_update_every
        self.rho_reference = rho_reference
        self.warmup_epochs = warmup_epochs
        self.min_multiplier = min_multiplier
        self.max_multiplier = max_multiplier
        shape = (len(REGIONS), num_classes)
        self.register_buffer("multipliers", torch.full(shape, float(initial_multiplier)))
        self.register_buffer("penalty", torch.full(shape, float(initial_penalty)))
        self.register_buffer("previous_violation", torch.full(shape, float("inf")))
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))

    def constraints(self, logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-voxel constraints h ``(B, C, *spatial)`` and the inner-region mask ``(B, 1, *spatial)``."""
        tau = neighbourhood_prior(target, self.num_classes, self.kernel, "mean")
        # Inner ⇔ one label fills the window ⇔ its τ is 1 (τ holds multiples of 1/window, so
        # half a step of tolerance is exact); the same mask as priors.inner_region_mask, read off τ.
        window = self.kernel ** (tau.dim() - 2)
        inner = tau.amax(dim=1, keepdim=True) > 1.0 - 0.5 / window
        scaled_tau = torch.where(inner, self.margin * tau, tau)
        return (scaled_tau - logits).abs(), inner

    def _per_voxel(self, parameters: torch.Tensor, inner: torch.Tensor) -> torch.Tensor:
        """Row 0 (outer) or 1 (inner) of a ``(2, C)`` buffer for every voxel: ``(B, C, *spatial)``."""
        view = (1, self.num_classes) + (1,) * (inner.dim() - 2)
        return torch.where(inner, parameters[1].view(view), parameters[0].view(view))

    def compute(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        violation, inner = self.constraints(logits, target)
        lam = self._per_voxel(self.multipliers, inner)
        rho = self._per_voxel(self.penalty, inner)
        # h = |·| ≥ 0, λ ≥ min_multiplier > 0 and ρ ≥ 0, so λ + ρh ≥ 0 and the PHR penalty is
        # always on its quadratic branch: skipping phr_penalty's branch selection saves ~30 %.
        penalty = violation * (lam + 0.5 * rho * violation)
        return F.cross_entropy(logits, target) + self.reduction_scale * penalty.mean()

    @torch.no_grad()
    def validation_statistics(self, logits: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per region × class sums for one batch: ``violation_sum`` (Σ h) and ``count`` (voxels).

        Both ``(2, C)`` float64 on the CPU, detached; add them over validation batches and
        pass the totals to :meth:`end_epoch`.
        """
        check_loss_inputs(logits, target, self.num_classes)
        violation, inner = self.constraints(logits.float(), target)
        region_masks = torch.stack([~inner, inner]).to(violation.dtype)  # (2, B, 1, *spatial)
        reduce_dims = [1] + list(range(3, region_masks.dim()))
        sums = (region_masks * violation.unsqueeze(0)).sum(dim=reduce_dims)
        counts = region_masks.sum(dim=reduce_dims).expand(-1, self.num_classes)
        return {"violation_sum": sums.double().cpu(), "count": counts.double().cpu()}

    @torch.no_grad()
    def end_epoch(self, statistics: dict[str, torch.Tensor]) -> None:
        """One ALM outer step from summed validation statistics.

        Eq. 8: λ ← clamp(mean over validation voxels of PHR'(h), min, max) = clamp(λ + ρ·h̄).
        As in the authors' reference implementation, the mean runs over *all* validation
        voxels with h counted as 0 outside the region (PHR'(0) = λ there), so
        ``h̄ = Σ_region h / N_all``: a region's multiplier grows in proportion to its share of
        voxels. Eq. 9 (see the class docstring): ρ ← clamp(γρ, ρ₀, ρ_max) where h̄ did not shrink
        below ``μ`` times the reference. During ``warmup_epochs`` nothing changes but the count.
        """
        total = statistics["violation_sum"].to(self.multipliers.device, torch.float64)
        count = statistics["count"].to(self.multipliers.device, torch.float64)
        if total.shape != self.multipliers.shape or count.shape != self.multipliers.shape:
            raise ValueError(
                f"statistics must be {tuple(self.multipliers.shape)} sums from validation_statistics(), "
                f"got {tuple(total.shape)} and {tuple(count.shape)}."
            )
        epoch = int(self.updates)
        self.updates += 1
        if epoch < self.warmup_epochs:
            return
        voxels = count.sum(dim=0, keepdim=True)  # outer + inner = every validation voxel, per class
        mean_violation = total / voxels.clamp_min(1.0)
        stepped = self.multipliers.double() + self.penalty.double() * mean_violation
        self.multipliers.copy_(stepped.clamp(self.min_multiplier, self.max_multiplier))

        step = epoch - self.warmup_epochs
        if self.rho_reference == "previous_epoch":
            scheduled, remember = (step + 1) % self.rho_update_every == 0, True
        else:
            scheduled = remember = step % self.rho_update_every == 0
        if scheduled:
            not_shrinking = mean_violation > self.mu * self.previous_violation.double().clamp_min(0.0)
            grown = (self.penalty * self.gamma).clamp(self.initial_penalty, self.rho_max)
            self.penalty.copy_(torch.where(not_shrinking, grown, self.penalty))
        if remember:
            self.previous_violation.copy_(mean_violation)

    def epoch_scalars(self, class_names: list[str]) -> dict[str, float]:
        """λ and ρ per region × class, ``crac/lambda_<region>/<class>`` and ``crac/rho_<region>/<class>``."""
        return {f"crac/{name}_{region}/{class_name}": float(buffer[index, class_index])
                for name, buffer in (("lambda", self.multipliers), ("rho", self.penalty))
                for index, region in enumerate(REGIONS) for class_index, class_name in enumerate(class_names)}

    def state_summary(self) -> dict[str, object]:
        """``{"multipliers": {region: [C floats]}, "penalty": {region: [C floats]}, "updates": n}``."""
        return {
            "multipliers": {region: self.multipliers[index].tolist() for index, region in enumerate(REGIONS)},
            "penalty": {region: self.penalty[index].tolist() for index, region in enumerate(REGIONS)},
            "updates": int(self.updates),
        }
