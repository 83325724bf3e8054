"""CRaC: constraints and PHR penalty against loops, the NACL relation, and the ALM schedule (Eq. 8, 9)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from CalibSegLib.losses import CRaCLoss, build_loss, phr_penalty
from loss_reference import DEVICES, cross_entropy_term, loop_inner, loop_prior, random_batch, voxel_mean

SHAPES = {"2d": (2, 3, 5, 6), "3d": (1, 3, 4, 4, 5)}
OUTER_LAMBDA, INNER_LAMBDA = [0.1, 0.2, 0.3], [0.4, 0.5, 0.6]
OUTER_RHO, INNER_RHO = [0.5, 0.25, 0.0], [1.0, 2.0, 0.1]


def configured_crac(**hparams) -> CRaCLoss:
    crac = build_loss("crac", 3, **hparams)
    crac.multipliers.copy_(torch.tensor([OUTER_LAMBDA, INNER_LAMBDA]))
    crac.penalty.copy_(torch.tensor([OUTER_RHO, INNER_RHO]))
    return crac


def phr(z: float, rho: float, lam: float) -> float:
    return lam * z + 0.5 * rho * z * z if lam + rho * z >= 0 else -lam * lam / (2 * rho)


def loop_constraints(labels: np.ndarray, margin: float):
    """Per voxel: region (0 outer, 1 inner) and the scaled prior m·τ (inner) or τ (outer)."""
    tau, inner = loop_prior(labels, 3, 3, "mean"), loop_inner(labels)
    return inner, np.where(inner[None], margin * tau, tau)


@pytest.mark.parametrize("reduction,slots_per_voxel", [("voxels", 3), ("region_slots", 6)])
@pytest.mark.parametrize("dims", SHAPES)
def test_crac_matches_voxel_loops(dims, reduction, slots_per_voxel):
    """Both reductions against loops: per voxel C classes (ours) or 2C region × class slots (authors',
    the other region's C slots holding PHR(0) = 0)."""
    logits, target = random_batch(SHAPES[dims], seed=11)
    crac = configured_crac(margin=5.0, penalty_reduction=reduction)  # inner scaling exercised
    array, labels = logits.double().numpy(), target.numpy()
    total, voxels = 0.0, 0
    for b in range(labels.shape[0]):
        inner, scaled = loop_constraints(labels[b], margin=5.0)
        for index in np.ndindex(labels.shape[1:]):
            region = int(inner[index])
            lam, rho = (INNER_LAMBDA, INNER_RHO) if region else (OUTER_LAMBDA, OUTER_RHO)
            for k in range(3):
                total += phr(abs(scaled[(k,) + index] - array[(b, k) + index]), rho[k], lam[k])
            voxels += 1
    expected = voxel_mean(logits, target, cross_entropy_term) + total / (slots_per_voxel * voxels)
    assert crac(logits, target).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("lam", [0.0, 0.1, 0.7])
@pytest.mark.parametrize("dims", SHAPES)
def test_crac_with_margin_one_zero_rho_and_equal_multipliers_is_nacl(dims, lam):
    logits, target = random_batch(SHAPES[dims], seed=10)
    crac = build_loss("crac", 3, margin=1.0, penalty_reduction="voxels")
    crac.multipliers.fill_(lam)
    crac.penalty.zero_()
    nacl = build_loss("nacl", 3, weight=lam)
    assert crac(logits, target).item() == pytest.approx(nacl(logits, target).item(), rel=1e-6)


@pytest.mark.parametrize("z,rho,lam,expected", [
    (2.0, 1.0, 1.0, 1 * 2 + 0.5 * 1 * 4),  # λ + ρz ≥ 0: quadratic branch
    (-3.0, 1.0, 1.0, -0.5),  # λ + ρz < 0: flat branch −λ²/(2ρ)
    (0.0, 3.0, 0.4, 0.0),  # PHR(0) = 0
    (2.0, 0.0, 0.3, 0.6),  # ρ = 0: linear penalty λz
])
def test_phr_penalty_branches(z, rho, lam, expected):
    value = phr_penalty(torch.tensor(z), torch.tensor(rho), torch.tensor(lam))
    assert value.item() == pytest.approx(expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", SHAPES)
def test_crac_gradient_is_finite_and_matches_phr_derivative(dims, device):
    logits, target = random_batch(SHAPES[dims], seed=12, device=device)
    logits.requires_grad_(True)
    crac = configured_crac(penalty_reduction="voxels").to(device)
    crac(logits, target).backward()
    ce_only = logits.detach().clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(ce_only, target).backward()
    penalty_gradient = (logits.grad - ce_only.grad) * logits.numel()  # undo the mean over voxels × C
    assert torch.isfinite(logits.grad).all()
    # d/dl PHR(|m τ − l|) = −sign(m τ − l) · (λ + ρ h): its size is at least λ wherever h > 0.
    assert (penalty_gradient.abs() >= 0.1 - 1e-4).all()


def test_validation_statistics_match_voxel_loops():
    logits, target = random_batch(SHAPES["2d"], seed=13)
    statistics = build_loss("crac", 3, margin=5.0).validation_statistics(logits, target)
    sums, counts = np.zeros((2, 3)), np.zeros((2, 3))
    for b in range(target.shape[0]):
        inner, scaled = loop_constraints(target[b].numpy(), margin=5.0)
        for index in np.ndindex(inner.shape):
            region = int(inner[index])
            for k in range(3):
                sums[region, k] += abs(scaled[(k,) + index] - logits[(b, k) + index].item())
                counts[region, k] += 1
    np.testing.assert_allclose(statistics["violation_sum"].numpy(), sums, rtol=1e-5)
    np.testing.assert_array_equal(statistics["count"].numpy(), counts)
    assert statistics["violation_sum"].dtype == torch.float64 and not statistics["violation_sum"].requires_grad


def test_validation_statistics_add_up_across_batches():
    logits, target = random_batch((4, 3, 6, 6), seed=14)
    crac = build_loss("crac", 3)
    whole = crac.validation_statistics(logits, target)
    parts = [crac.validation_statistics(logits[i:i + 2], target[i:i + 2]) for i in (0, 2)]
    for key in whole:
        torch.testing.assert_close(parts[0][key] + parts[1][key], whole[key])


def statistics_of(violation: list[list[float]], outer_voxels: float = 6.0, inner_voxels: float = 2.0):
    """Validation sums where every voxel of a region × class has constraint ``violation[region][class]``."""
    classes = len(violation[0])
    counts = torch.tensor([[outer_voxels] * classes, [inner_voxels] * classes], dtype=torch.float64)
    return {"violation_sum": torch.tensor(violation, dtype=torch.float64) * counts, "count": counts}


def test_multiplier_update_is_eq8_averaged_over_all_validation_voxels():
    # Authors' code: h counts as 0 outside its region, so h̄ = Σ_region h / (all 8 voxels).
    crac = configured_crac()
    crac.end_epoch(statistics_of([[1.0, 2.0, 3.0], [0.5, 0.0, 4.0]]))
    outer_mean = torch.tensor([1.0, 2.0, 3.0]) * 6 / 8
    inner_mean = torch.tensor([0.5, 0.0, 4.0]) * 2 / 8
    expected = torch.stack([torch.tensor(OUTER_LAMBDA) + torch.tensor(OUTER_RHO) * outer_mean,
                            torch.tensor(INNER_LAMBDA) + torch.tensor(INNER_RHO) * inner_mean])
    torch.testing.assert_close(crac.multipliers, expected)


def test_multipliers_start_at_1e_minus_6_and_change_after_an_update():
    logits, _ = random_batch((1, 3, 8, 8), seed=15)
    target = torch.zeros(1, 8, 8, dtype=torch.int64)
    target[0, 2:7, 2:7] = 1  # a block with an inner core, inside background with an inner rim
    target[0, 4, 4] = 2
    crac = build_loss("crac", 3)
    torch.testing.assert_close(crac.multipliers, torch.full((2, 3), 1e-6))
    crac.end_epoch(crac.validation_statistics(logits, target))
    assert (crac.multipliers > 1e-6).all()


def test_multipliers_are_clamped_to_their_range():
    crac = build_loss("crac", 3, max_multiplier=2.0)
    crac.end_epoch(statistics_of([[1e3] * 3, [1e3] * 3]))
    torch.testing.assert_close(crac.multipliers, torch.full((2, 3), 2.0))


def test_class_absent_from_a_region_keeps_its_multiplier():
    crac = configured_crac()
    statistics = statistics_of([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], inner_voxels=0.0)
    crac.end_epoch(statistics)
    torch.testing.assert_close(crac.multipliers[1], torch.tensor(INNER_LAMBDA))


@pytest.mark.parametrize("violations,grows", [
    ([1.0, 7.0, 0.95], True),  # checks at calls 0 and 2: 0.95 > 0.9 × 1.0, did not shrink enough
    ([1.0, 7.0, 0.5], False),  # shrank by more than μ
    ([1.0, 0.1, 2.0], True),  # grew
])
def test_previous_check_rule_grows_rho_when_violation_did_not_shrink_by_mu(violations, grows):
    crac = build_loss("crac", 2, rho_update_every=2, rho_reference="previous_check")
    for violation in violations:
        crac.end_epoch(statistics_of([[violation] * 2] * 2))
    expected = 0.1 * 1.2 if grows else 0.1
    torch.testing.assert_close(crac.penalty, torch.full((2, 2), expected))


def test_previous_check_rule_leaves_rho_alone_between_scheduled_calls():
    crac = build_loss("crac", 2, rho_reference="previous_check")  # Eq. 9 on calls 0, 10, 20, ...
    for call in range(10):
        crac.end_epoch(statistics_of([[1.0 + call] * 2] * 2))
    torch.testing.assert_close(crac.penalty, torch.full((2, 2), 0.1))
    crac.end_epoch(statistics_of([[20.0] * 2] * 2))  # call 10: 20 > 0.9 × 1
    torch.testing.assert_close(crac.penalty, torch.full((2, 2), 0.12))


@pytest.mark.parametrize("violations,grows", [
    ([5.0, 1.0, 0.95], True),  # epoch 3 (a scheduled one) vs epoch 2: 0.95 > 0.9 × 1.0
    ([5.0, 1.0, 0.5], False),  # shrank by more than μ since the previous epoch
    ([0.1, 9.0, 8.5], True),  # epoch 1 is not the reference: epoch 2 is, and 8.5 > 0.9 × 9
    ([9.0, 0.1, 8.5], True),  # grew since the previous epoch (the previous check would have said shrank)
])
def test_authors_rule_compares_with_the_previous_epoch(violations, grows):
    """Authors' update_rho: prev_constraints is overwritten every epoch; ρ is checked at epochs n, 2n, …"""
    crac = build_loss("crac", 2, rho_update_every=3)
    for violation in violations:
        crac.end_epoch(statistics_of([[violation] * 2] * 2))
    expected = 0.1 * 1.2 if grows else 0.1
    torch.testing.assert_close(crac.penalty, torch.full((2, 2), expected))


def test_authors_rule_never_checks_before_epoch_n():
    crac = build_loss("crac", 2)  # checks at the end of epochs 10, 20, ...
    for epoch in range(9):
        crac.end_epoch(statistics_of([[1.0 + epoch] * 2] * 2))
    torch.testing.assert_close(crac.penalty, torch.full((2, 2), 0.1))
    crac.end_epoch(statistics_of([[20.0] * 2] * 2))  # epoch 10: 20 > 0.9 × 9
    torch.testing.assert_close(crac.penalty, torch.full((2, 2), 0.12))


def test_warmup_epochs_leave_multipliers_and_penalty_untouched():
    crac = build_loss("crac", 2, warmup_epochs=2, rho_update_every=1)
    for _ in range(2):
        crac.end_epoch(statistics_of([[3.0] * 2] * 2))
    torch.testing.assert_close(crac.multipliers, torch.full((2, 2), 1e-6))
    torch.testing.assert_close(crac.penalty, torch.full((2, 2), 0.1))
    crac.end_epoch(statistics_of([[3.0] * 2] * 2))
    assert (crac.multipliers > 1e-6).all() and int(crac.updates) == 3


def test_penalty_never_exceeds_rho_max():
    crac = build_loss("crac", 2, rho_update_every=1, rho_max=0.15)
    for violation in (1.0, 2.0, 3.0, 4.0):
        crac.end_epoch(statistics_of([[violation] * 2] * 2))
    torch.testing.assert_close(crac.penalty, torch.full((2, 2), 0.15))


def test_state_dict_round_trip_resumes_the_schedule_exactly():
    logits, target = random_batch(SHAPES["2d"], seed=16)
    schedule = [statistics_of([[v, v + 1, v + 2], [v / 2, v, 1.0]]) for v in (3.0, 2.9, 2.8, 2.7)]
    uninterrupted = build_loss("crac", 3, rho_update_every=2)
    for statistics in schedule:
        uninterrupted.end_epoch(statistics)
    first_half = build_loss("crac", 3, rho_update_every=2)
    for statistics in schedule[:2]:
        first_half.end_epoch(statistics)
    resumed = build_loss("crac", 3, rho_update_every=2)
    resumed.load_state_dict(first_half.state_dict())
    for statistics in schedule[2:]:
        resumed.end_epoch(statistics)
    assert set(resumed.state_dict()) == {"multipliers", "penalty", "previous_violation", "updates"}
    for key, value in uninterrupted.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[key], value, rtol=0, atol=0)
    assert resumed(logits, target).item() == uninterrupted(logits, target).item()


def test_statistics_of_the_wrong_shape_are_refused():
    crac = build_loss("crac", 3)
    with pytest.raises(ValueError, match=r"statistics must be \(2, 3\)"):
        crac.end_epoch(statistics_of([[1.0] * 4] * 2))


def test_state_summary_and_scalars_list_lambda_and_rho_per_region_and_class():
    crac = configured_crac()
    summary = crac.state_summary()
    assert list(summary["multipliers"]) == ["outer", "inner"]
    assert summary["multipliers"]["outer"] == pytest.approx(OUTER_LAMBDA)
    assert summary["penalty"]["inner"] == pytest.approx(INNER_RHO)
    scalars = crac.epoch_scalars(["bg", "a", "b"])
    assert scalars["crac/lambda_inner/b"] == pytest.approx(INNER_LAMBDA[2])
    assert scalars["crac/rho_outer/a"] == pytest.approx(OUTER_RHO[1]) and len(scalars) == 12


def test_defaults_are_the_authors_acdc_run():
    """README of Bala93/CRac: lag.margin=5 lag.rho=0.1, rho_step 10, γ 1.2, τ 0.9; mean over 2C slots."""
    crac = build_loss("crac", 4)
    assert (crac.margin, crac.penalty_reduction, crac.rho_reference) == (5.0, "region_slots", "previous_epoch")
    assert (crac.rho_update_every, crac.gamma, crac.mu, crac.rho_max) == (10, 1.2, 0.9, 10.0)
    torch.testing.assert_close(crac.penalty, torch.full((2, 4), 0.1))


@pytest.mark.parametrize("shape,kernel", [((2, 9, 11), 3), ((2, 9, 11), 5), ((1, 5, 6, 7), 3)])
def test_inner_mask_read_off_the_prior_equals_the_window_rule(shape, kernel):
    """CRaC reads the inner region off τ; it must be priors.inner_region_mask exactly."""
    from CalibSegLib.priors import inner_region_mask

    generator = torch.Generator().manual_seed(kernel)
    target = torch.randint(0, 3, shape, generator=generator)
    target[0, : shape[1] // 2] = 1  # large uniform blocks so both regions occur
    target[-1, :, : shape[2] // 2] = 0
    logits = torch.zeros((shape[0], 3) + shape[1:])
    _, inner = CRaCLoss(3, kernel=kernel).constraints(logits, target)
    expected = inner_region_mask(target, kernel)
    assert expected.any() and (~expected).any()
    torch.testing.assert_close(inner.squeeze(1), expected)
