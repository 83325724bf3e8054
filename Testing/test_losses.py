"""Losses against independent computations, limiting cases, gradients and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from CalibSegLib.losses import LOSSES, CRaCLoss, build_loss, loss_hyperparameters, phr_penalty
from CalibSegLib.networks import build_network
from CalibSegLib.priors import neighbourhood_prior

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SHAPES = {"2d": (2, 4, 8, 9), "3d": (1, 4, 4, 6, 5)}


def batch(shape, seed=0, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(shape, generator=generator).to(device)
    target = torch.randint(0, shape[1], (shape[0],) + shape[2:], generator=generator).to(device)
    return logits, target


def loop_cross_entropy(logits: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per-voxel −log softmax of the target, with explicit loops over voxels."""
    values = []
    for b in range(target.shape[0]):
        for index in np.ndindex(target.shape[1:]):
            column = logits[(b, slice(None)) + index]
            log_sum = math.log(sum(math.exp(v) for v in column))
            values.append(log_sum - column[target[(b,) + index]])
    return np.array(values)


def tiny_model():
    return build_network("unet", 1, 4, channels=(4, 8), strides=(2,), num_res_units=0)


def call(loss, logits, target):
    if loss.needs_model:
        model = tiny_model()
        images = torch.randn(logits.shape[0], 1, *logits.shape[2:])
        return loss(model(images), target, model=model, images=images)
    return loss(logits, target)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", ["2d", "3d"])
@pytest.mark.parametrize("name", [n for n in LOSSES if n != "bwcr"])
def test_every_loss_is_finite_with_finite_gradients(name, dims, device):
    logits, target = batch(SHAPES[dims], device=device)
    logits.requires_grad_(True)
    loss = build_loss(name, 4).to(device)
    value = loss(logits, target)
    value.backward()
    assert value.dim() == 0 and torch.isfinite(value)
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


@pytest.mark.parametrize("size", [(8, 8), (8, 8, 8)])
def test_bwcr_trains_model_in_2d_and_3d(size):
    dims = len(size)
    model = build_network("unet", 1, 3, spatial_dims=dims, channels=(4, 8), strides=(2,), num_res_units=0)
    images = torch.randn(2, 1, *size)
    target = torch.randint(0, 3, (2,) + size)
    value = build_loss("bwcr", 3)(model(images), target, model=model, images=images)
    value.backward()
    assert torch.isfinite(value)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_bwcr_without_model_says_what_it_needs():
    logits, target = batch(SHAPES["2d"])
    with pytest.raises(ValueError, match="needs the model"):
        build_loss("bwcr", 4)(logits, target)


def test_cross_entropy_matches_loops():
    logits, target = batch(SHAPES["2d"], seed=1)
    expected = loop_cross_entropy(logits.numpy(), target.numpy()).mean()
    assert build_loss("ce", 4)(logits, target).item() == pytest.approx(expected, rel=1e-5)


def test_focal_matches_loops():
    logits, target = batch(SHAPES["3d"], seed=2)
    ce = loop_cross_entropy(logits.numpy(), target.numpy())
    expected = ((1 - np.exp(-ce)) ** 3 * ce).mean()
    assert build_loss("focal", 4)(logits, target).item() == pytest.approx(expected, rel=1e-5)


def test_label_smoothing_matches_soft_target_cross_entropy():
    logits, target = batch(SHAPES["2d"], seed=3)
    soft = 0.9 * F.one_hot(target, 4).movedim(-1, 1).float() + 0.1 / 4
    expected = -(soft * F.log_softmax(logits, 1)).sum(1).mean()
    assert build_loss("ls", 4)(logits, target).item() == pytest.approx(expected.item(), rel=1e-5)


def test_ecp_subtracts_mean_entropy():
    logits, target = batch(SHAPES["2d"], seed=4)
    probs = logits.softmax(1).numpy()
    entropy = -(probs * np.log(probs)).sum(1).mean()
    expected = loop_cross_entropy(logits.numpy(), target.numpy()).mean() - 0.1 * entropy
    assert build_loss("ecp", 4)(logits, target).item() == pytest.approx(expected, rel=1e-5)


def test_mbls_penalises_only_distances_beyond_margin():
    logits = torch.tensor([[[[0.0]], [[12.0]], [[3.0]]]])  # one voxel, 3 classes
    target = torch.tensor([[[1]]])
    # distances from the max: 12, 0, 9; beyond margin 10 only the first, by 2 → mean over 3 classes
    ce = loop_cross_entropy(logits.numpy(), target.numpy()).mean()
    assert build_loss("mbls", 3)(logits, target).item() == pytest.approx(ce + 0.1 * 2 / 3, rel=1e-5)


def test_nacl_is_ce_plus_l1_distance_to_window_fractions():
    logits, target = batch(SHAPES["2d"], seed=5)
    tau = neighbourhood_prior(target, 4, 3, "mean")
    expected = F.cross_entropy(logits, target) + 0.1 * (tau - logits).abs().mean()
    assert build_loss("nacl", 4)(logits, target).item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("penalty,on", [("l2", "logits"), ("l1", "softmax"), ("l2", "softmax")])
def test_nacl_variants(penalty, on):
    logits, target = batch(SHAPES["3d"], seed=6)
    tau = neighbourhood_prior(target, 4, 5, "median")
    constrained = logits if on == "logits" else logits.softmax(1)
    distance = (tau - constrained).abs() if penalty == "l1" else (tau - constrained) ** 2
    expected = F.cross_entropy(logits, target) + 0.3 * distance.mean()
    loss = build_loss("nacl", 4, weight=0.3, kernel=5, prior="median", penalty=penalty, on=on)
    assert loss(logits, target).item() == pytest.approx(expected.item(), rel=1e-6)


def test_svls_uses_gaussian_soft_labels():
    logits, target = batch(SHAPES["2d"], seed=7)
    soft = neighbourhood_prior(target, 4, 3, "gaussian", sigma=2.0)
    expected = -(soft * F.log_softmax(logits, 1)).sum(1).mean()
    assert build_loss("svls", 4)(logits, target).item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("name,zero", [("nacl", {"weight": 0.0}), ("ls", {"alpha": 0.0}), ("focal", {"gamma": 0.0}),
                                       ("ecp", {"weight": 0.0}), ("mbls", {"weight": 0.0})])
def test_limiting_case_equals_cross_entropy(name, zero):
    logits, target = batch(SHAPES["3d"], seed=8)
    assert build_loss(name, 4, **zero)(logits, target).item() == pytest.approx(
        F.cross_entropy(logits, target).item(), rel=1e-6)


def test_ce_dice_adds_soft_dice_with_background():
    logits, target = batch(SHAPES["2d"], seed=9)
    probs = logits.softmax(1)
    onehot = F.one_hot(target, 4).movedim(-1, 1).float()
    intersection = (probs * onehot).sum((2, 3))
    dice = (2 * intersection + 1e-5) / (probs.sum((2, 3)) + onehot.sum((2, 3)) + 1e-5)
    expected = F.cross_entropy(logits, target) + (1 - dice).mean()
    assert build_loss("ce_dice", 4)(logits, target).item() == pytest.approx(expected.item(), rel=1e-4)


@pytest.mark.parametrize("dims", ["2d", "3d"])
def test_crac_with_margin_one_and_zero_penalty_equals_nacl(dims):
    logits, target = batch(SHAPES[dims], seed=10)
    crac = build_loss("crac", 4, margin=1.0, initial_penalty=0.0, rho_max=0.0, initial_multiplier=0.25)
    nacl = build_loss("nacl", 4, weight=0.25)
    assert crac(logits, target).item() == pytest.approx(nacl(logits, target).item(), rel=1e-6)


def test_crac_matches_per_voxel_loops():
    logits, target = batch((1, 3, 5, 5), seed=11)
    crac = build_loss("crac", 3)
    crac.multipliers.copy_(torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]))
    crac.penalty.copy_(torch.tensor([[0.5, 0.5, 0.5], [1.0, 1.0, 1.0]]))
    labels = target[0].numpy()
    tau = neighbourhood_prior(target, 3, 3, "mean")[0].numpy()
    l = logits[0].numpy()
    total = 0.0
    for i, j in np.ndindex(5, 5):
        window = {labels[a, b] if 0 <= a < 5 and 0 <= b < 5 else 0 for a in (i - 1, i, i + 1) for b in (j - 1, j, j + 1)}
        region = 1 if len(window) == 1 else 0
        for k in range(3):
            h = abs((5.0 if region else 1.0) * tau[k, i, j] - l[k, i, j])
            lam, rho = crac.multipliers[region, k].item(), crac.penalty[region, k].item()
            total += lam * h + 0.5 * rho * h * h if lam + rho * h >= 0 else -lam**2 / (2 * rho)
    expected = F.cross_entropy(logits, target).item() + total / (3 * 25)
    assert crac(logits, target).item() == pytest.approx(expected, rel=1e-5)


def test_phr_branches():
    z = torch.tensor([2.0, -3.0])
    value = phr_penalty(z, torch.tensor(1.0), torch.tensor(1.0))
    torch.testing.assert_close(value, torch.tensor([1 * 2 + 0.5 * 4, -0.5]))


def test_crac_multipliers_follow_eq8_and_survive_state_dict():
    logits, target = batch(SHAPES["2d"], seed=12)
    crac: CRaCLoss = build_loss("crac", 4)
    statistics = crac.constraint_statistics(logits, target)
    mean = statistics["violation_sum"] / statistics["count"].clamp_min(1)
    crac.update_multipliers(statistics)
    expected = (1e-6 + 0.1 * mean).clamp(1e-6, 1e6).float()
    present = statistics["count"] > 0
    torch.testing.assert_close(crac.multipliers[present], expected[present])
    restored = build_loss("crac", 4)
    restored.load_state_dict(crac.state_dict())
    torch.testing.assert_close(restored.multipliers, crac.multipliers)
    assert int(restored.updates) == 1


def test_crac_statistics_add_across_batches():
    logits, target = batch((4, 4, 6, 6), seed=13)
    crac = build_loss("crac", 4)
    whole = crac.constraint_statistics(logits, target)
    parts = [crac.constraint_statistics(logits[i:i + 2], target[i:i + 2]) for i in (0, 2)]
    for key in whole:
        torch.testing.assert_close(parts[0][key] + parts[1][key], whole[key])


def test_crac_penalty_grows_only_when_violation_does_not_shrink():
    crac = build_loss("crac", 2, rho_update_every=2)
    count = torch.ones(2, 2)
    for violation in (1.0, 0.5, 0.95):  # check at calls 0 and 2: 0.95 > 0.9 × 1.0 → grow
        crac.update_multipliers({"violation_sum": torch.full((2, 2), violation, dtype=torch.float64), "count": count})
    torch.testing.assert_close(crac.penalty, torch.full((2, 2), 0.12))
    crac2 = build_loss("crac", 2, rho_update_every=2)
    for violation in (1.0, 0.5, 0.5):
        crac2.update_multipliers({"violation_sum": torch.full((2, 2), violation, dtype=torch.float64), "count": count})
    torch.testing.assert_close(crac2.penalty, torch.full((2, 2), 0.1))


@pytest.mark.parametrize("mutate,message", [
    (lambda l, t: (l, t.int()), "int64"),
    (lambda l, t: (l, t[:, :4]), "does not match"),
    (lambda l, t: (l, t + 10), "must lie in"),
    (lambda l, t: (l, t - 1), "must lie in"),
    (lambda l, t: (l * float("nan"), t), "NaN"),
    (lambda l, t: (l[:, :3], t), "channels"),
    (lambda l, t: (l[0], t[0]), "logits must be"),
])
@pytest.mark.parametrize("name", LOSSES)
def test_bad_input_raises_clear_value_error(name, mutate, message):
    logits, target = mutate(*batch(SHAPES["2d"]))
    with pytest.raises(ValueError, match=message):
        build_loss(name, 4)(logits, target)


def test_unknown_loss_and_hyperparameter_names_are_listed():
    with pytest.raises(KeyError, match="choose one of"):
        build_loss("dice_focal", 4)
    with pytest.raises(KeyError, match="takes weight"):
        build_loss("nacl", 4, lambda_=0.1)


def test_defaults_are_the_papers_values():
    assert loss_hyperparameters("focal")["gamma"] == 3.0
    assert loss_hyperparameters("ecp")["weight"] == 0.1
    assert loss_hyperparameters("ls")["alpha"] == 0.1
    assert (loss_hyperparameters("svls")["kernel"], loss_hyperparameters("svls")["sigma"]) == (3, 2.0)
    assert (loss_hyperparameters("mbls")["weight"], loss_hyperparameters("mbls")["margin"]) == (0.1, 10.0)
    assert loss_hyperparameters("nacl") | {} == {"weight": 0.1, "kernel": 3, "prior": "mean", "penalty": "l1",
                                                  "on": "logits", "sigma": 2.0}
    crac = loss_hyperparameters("crac")
    assert (crac["margin"], crac["initial_penalty"], crac["rho_max"], crac["gamma"], crac["mu"]) == (5.0, 0.1, 10.0, 1.2, 0.9)
    assert (loss_hyperparameters("bwcr")["weight_min"], loss_hyperparameters("bwcr")["weight_max"]) == (0.01, 1.0)
