"""Losses against voxel-loop references, limiting cases, gradients, the registry and bad input.

CRaC and BWCR have their own files (test_crac.py, test_bwcr.py).
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from CalibSegLib.losses import LOSSES, build_loss, loss_hyperparameters
from CalibSegLib.networks import build_network
from loss_reference import DEVICES, cross_entropy_term, log_softmax, loop_prior, random_batch, voxel_mean

SHAPES = {"2d": (2, 3, 5, 6), "3d": (1, 3, 3, 4, 5)}


def label_smoothing_term(alpha, column, label, tau):
    log_probs = log_softmax(column)
    return -sum(((1 - alpha) * (k == label) + alpha / len(column)) * lp for k, lp in enumerate(log_probs))


def focal_term(gamma, column, label, tau):
    log_prob = log_softmax(column)[label]
    return -((1 - math.exp(log_prob)) ** gamma) * log_prob


def entropy_penalty_term(weight, column, label, tau):
    log_probs = log_softmax(column)
    entropy = -sum(math.exp(lp) * lp for lp in log_probs)
    return -log_probs[label] - weight * entropy


def margin_term(weight, margin, column, label, tau):
    top = max(column)
    penalty = sum(max(0.0, top - value - margin) for value in column) / len(column)
    return -log_softmax(column)[label] + weight * penalty


def nacl_term(weight, penalty, on, column, label, tau):
    outputs = column if on == "logits" else [math.exp(lp) for lp in log_softmax(column)]
    distance = [abs(t - z) if penalty == "l1" else (t - z) ** 2 for t, z in zip(tau, outputs)]
    return -log_softmax(column)[label] + weight * sum(distance) / len(column)


def svls_term(column, label, tau):
    return -sum(t * lp for t, lp in zip(tau, log_softmax(column)))


def prior_of(kind, kernel=3, sigma=2.0):
    return lambda labels: loop_prior(labels, 3, kernel, kind, sigma)


# name, hyper-parameters, per-voxel reference term, per-image prior (or None)
LOOP_CASES = {
    "ce": ("ce", {}, cross_entropy_term, None),
    "ls": ("ls", {}, partial(label_smoothing_term, 0.1), None),
    "ls_alpha_0.3": ("ls", {"alpha": 0.3}, partial(label_smoothing_term, 0.3), None),
    "focal": ("focal", {}, partial(focal_term, 3.0), None),
    "focal_gamma_1.5": ("focal", {"gamma": 1.5}, partial(focal_term, 1.5), None),
    "ecp": ("ecp", {}, partial(entropy_penalty_term, 0.1), None),
    "mbls_margin_1": ("mbls", {"margin": 1.0}, partial(margin_term, 0.1, 1.0), None),
    "mbls_weight_0.5_margin_2": ("mbls", {"weight": 0.5, "margin": 2.0}, partial(margin_term, 0.5, 2.0), None),
    "nacl": ("nacl", {}, partial(nacl_term, 0.1, "l1", "logits"), prior_of("mean")),
    "svls": ("svls", {}, svls_term, prior_of("gaussian")),
    "svls_kernel_5_sigma_1": ("svls", {"kernel": 5, "sigma": 1.0}, svls_term, prior_of("gaussian", 5, 1.0)),
}


@pytest.mark.parametrize("dims", SHAPES)
@pytest.mark.parametrize("case", LOOP_CASES)
def test_loss_matches_voxel_loop_reference(case, dims):
    name, hparams, term, prior = LOOP_CASES[case]
    logits, target = random_batch(SHAPES[dims], seed=len(case))
    expected = voxel_mean(logits, target, term, prior)
    assert build_loss(name, 3, **hparams)(logits, target).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("on", ["logits", "softmax"])
@pytest.mark.parametrize("penalty", ["l1", "l2"])
@pytest.mark.parametrize("kernel", [3, 5])
@pytest.mark.parametrize("prior", ["mean", "gaussian", "max", "min", "median", "mode"])
def test_nacl_variant_matches_voxel_loop_reference_2d(prior, kernel, penalty, on):
    logits, target = random_batch((1, 3, 6, 5), seed=kernel)
    expected = voxel_mean(logits, target, partial(nacl_term, 0.3, penalty, on), prior_of(prior, kernel, 1.5))
    loss = build_loss("nacl", 3, weight=0.3, kernel=kernel, prior=prior, penalty=penalty, on=on, sigma=1.5)
    assert loss(logits, target).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("prior,kernel,penalty,on", [
    ("median", 5, "l2", "softmax"), ("mode", 3, "l1", "softmax"), ("max", 5, "l1", "logits"),
    ("gaussian", 3, "l2", "logits"),
])
def test_nacl_variant_matches_voxel_loop_reference_3d(prior, kernel, penalty, on):
    logits, target = random_batch(SHAPES["3d"], seed=3)
    expected = voxel_mean(logits, target, partial(nacl_term, 0.3, penalty, on), prior_of(prior, kernel))
    loss = build_loss("nacl", 3, weight=0.3, kernel=kernel, prior=prior, penalty=penalty, on=on)
    assert loss(logits, target).item() == pytest.approx(expected, rel=1e-5)


def test_mbls_hand_worked_single_voxel():
    # Logits 0, 12, 3: distances to the max 12, 0, 9; only 12 passes margin 10, by 2.
    logits = torch.tensor([0.0, 12.0, 3.0]).view(1, 3, 1, 1)
    target = torch.tensor([[[1]]])
    expected = -log_softmax([0.0, 12.0, 3.0])[1] + 0.1 * 2 / 3
    assert build_loss("mbls", 3)(logits, target).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("dims", SHAPES)
def test_ce_dice_matches_loops_over_images_and_classes(dims):
    logits, target = random_batch(SHAPES[dims], seed=9)
    probs = logits.softmax(1).double().numpy()
    labels = target.numpy()
    dice_losses = []
    for b in range(labels.shape[0]):
        for k in range(3):
            p, y = probs[b, k].ravel(), (labels[b] == k).ravel()
            intersection = sum(pv for pv, yv in zip(p, y) if yv)
            dice_losses.append(1 - (2 * intersection + 1e-5) / (p.sum() + y.sum() + 1e-5))
    expected = voxel_mean(logits, target, cross_entropy_term) + sum(dice_losses) / len(dice_losses)
    assert build_loss("ce_dice", 3)(logits, target).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("name,hparams", [
    ("nacl", {"weight": 0.0}),
    ("nacl", {"weight": 0.0, "prior": "mode", "penalty": "l2", "on": "softmax", "kernel": 5}),
    ("ls", {"alpha": 0.0}),
    ("focal", {"gamma": 0.0}),
    ("ecp", {"weight": 0.0}),
    ("mbls", {"weight": 0.0}),
    ("ce_dice", {"dice_weight": 0.0}),
])
@pytest.mark.parametrize("dims", SHAPES)
def test_limiting_case_equals_cross_entropy(name, hparams, dims):
    logits, target = random_batch(SHAPES[dims], seed=8)
    expected = F.cross_entropy(logits, target).item()
    assert build_loss(name, 3, **hparams)(logits, target).item() == pytest.approx(expected, rel=1e-6)


def test_svls_with_one_hot_labels_far_from_boundaries_is_cross_entropy():
    # A single-label image away from the border (background everywhere): τ is one-hot.
    logits, _ = random_batch((1, 3, 5, 5), seed=4)
    target = torch.zeros(1, 5, 5, dtype=torch.int64)
    expected = F.cross_entropy(logits, target).item()
    assert build_loss("svls", 3)(logits, target).item() == pytest.approx(expected, rel=1e-6)


def _tiny_unet(spatial_dims: int) -> torch.nn.Module:
    return build_network("unet", 1, 3, spatial_dims=spatial_dims, channels=(4, 8), strides=(2,), num_res_units=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", SHAPES)
@pytest.mark.parametrize("name", LOSSES)
def test_loss_is_a_finite_scalar_with_finite_gradients(name, dims, device):
    shape = {"2d": (2, 3, 8, 8), "3d": (1, 3, 4, 8, 8)}[dims]
    loss = build_loss(name, 3).to(device)
    _, target = random_batch(shape, seed=5, device=device)
    if loss.needs_model:
        model = _tiny_unet(len(shape) - 2).to(device)
        images = torch.randn(shape[0], 1, *shape[2:], device=device)
        logits = model(images)
        value = loss(logits, target, model=model, images=images)
        value.backward()
        gradients = [p.grad for p in model.parameters()]
    else:
        logits, _ = random_batch(shape, seed=5, device=device)
        logits.requires_grad_(True)
        value = loss(logits, target)
        value.backward()
        gradients = [logits.grad]
    assert value.dim() == 0 and torch.isfinite(value)
    assert all(torch.isfinite(g).all() for g in gradients) and any(g.abs().sum() > 0 for g in gradients)


@pytest.mark.parametrize("name", [n for n in LOSSES if n != "bwcr"])
def test_losses_without_a_model_ignore_model_and_images(name):
    logits, target = random_batch(SHAPES["2d"], seed=6)
    loss = build_loss(name, 3)
    with_context = loss(logits, target, model=torch.nn.Identity(), images=torch.zeros(2, 1, 5, 6))
    assert with_context.item() == loss(logits, target).item()


BAD_INPUTS = {
    "int32 target": (lambda logits, target: (logits, target.int()), "int64"),
    "float target": (lambda logits, target: (logits, target.float()), "int64"),
    "target shape": (lambda logits, target: (logits, target[:, :4]), "does not match"),
    "target without batch axis": (lambda logits, target: (logits, target[0]), "does not match"),
    "label >= C": (lambda logits, target: (logits, target + 3), r"must lie in \[0, 2\]"),
    "negative label": (lambda logits, target: (logits, target - 1), r"must lie in \[0, 2\]"),
    "NaN logits": (lambda logits, target: (logits * float("nan"), target), "NaN"),
    "inf logits": (lambda logits, target: (logits.index_fill(1, torch.tensor([0]), float("inf")), target), "infinite"),
    "wrong channels": (lambda logits, target: (logits[:, :2], target), "channels"),
    "3D logits": (lambda logits, target: (logits[0], target[0]), "logits must be"),
    "integer logits": (lambda logits, target: (logits.long(), target), "floating-point"),
}


@pytest.mark.parametrize("problem", BAD_INPUTS)
@pytest.mark.parametrize("name", LOSSES)
def test_bad_input_raises_one_clear_value_error(name, problem):
    mutate, message = BAD_INPUTS[problem]
    logits, target = mutate(*random_batch(SHAPES["2d"]))
    with pytest.raises(ValueError, match=message):
        build_loss(name, 3)(logits, target)


def test_unknown_loss_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="choose one of ce, ce_dice, focal"):
        build_loss("dice_focal", 3)


def test_unknown_hyperparameter_lists_the_valid_ones():
    with pytest.raises(KeyError, match="no hyper-parameter lambda_; it takes weight, kernel, prior"):
        build_loss("nacl", 3, lambda_=0.1)


@pytest.mark.parametrize("name,hparams,message", [
    ("ls", {"alpha": 1.0}, "alpha"),
    ("focal", {"gamma": -1.0}, "gamma"),
    ("ecp", {"weight": float("nan")}, "weight"),
    ("mbls", {"margin": -1.0}, "margin"),
    ("nacl", {"prior": "average"}, "Unknown prior kind"),
    ("nacl", {"penalty": "l3"}, "Unknown penalty"),
    ("nacl", {"on": "probabilities"}, "choose one of logits, softmax"),
    ("nacl", {"kernel": 4}, "odd window width"),
    ("svls", {"sigma": 0.0}, "sigma"),
    ("ce", {}, "num_classes"),
])
def test_bad_hyperparameter_value_is_refused_when_built(name, hparams, message):
    num_classes = 1 if name == "ce" else 3
    with pytest.raises(ValueError, match=message):
        build_loss(name, num_classes, **hparams)


@pytest.mark.parametrize("name,expected", [
    ("focal", {"gamma": 3.0}),
    ("ecp", {"weight": 0.1}),
    ("ls", {"alpha": 0.1}),
    ("svls", {"kernel": 3, "sigma": 2.0}),
    ("mbls", {"weight": 0.1, "margin": 10.0}),
    ("nacl", {"weight": 0.1, "kernel": 3, "prior": "mean", "penalty": "l1", "on": "logits"}),
    # CRaC: the authors' ACDC command (lag.margin=5 lag.rho=0.1) over their yaml defaults.
    ("crac", {"margin": 5.0, "kernel": 3, "penalty_reduction": "region_slots", "initial_multiplier": 1e-6,
              "initial_penalty": 0.1, "rho_max": 10.0, "gamma": 1.2, "mu": 0.9, "rho_update_every": 10,
              "rho_reference": "previous_epoch", "min_multiplier": 1e-6, "max_multiplier": 1e6}),
    ("bwcr", {"weight_min": 0.01, "weight_max": 1.0}),
])
def test_defaults_are_the_papers_values(name, expected):
    defaults = loss_hyperparameters(name)
    assert {key: defaults[key] for key in expected} == expected
