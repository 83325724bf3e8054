"""Temperature scaling recovers known temperatures from over-confident logits and never increases NLL."""

from __future__ import annotations

import pytest
import torch

from CalibSegLib.temperature import apply_temperature, fit_temperature, temperature_nll


def overconfident(temperature: float | list[float] = 2.5, n: int = 20000, classes: int = 4, seed: int = 0):
    """Logits with labels drawn from ``softmax(logits / temperature)``: that temperature is the true one."""
    generator = torch.Generator().manual_seed(seed)
    calibrated = torch.randn(n, classes, generator=generator, dtype=torch.float64) * 2
    labels = torch.multinomial(calibrated.softmax(1), 1, generator=generator).squeeze(1)
    return calibrated * torch.as_tensor(temperature, dtype=torch.float64), labels


def test_recovers_a_known_temperature():
    logits, labels = overconfident(2.5)
    assert fit_temperature(logits, labels) == pytest.approx(2.5, rel=0.05)


def test_recovers_known_per_class_temperatures():
    truth = [0.8, 1.5, 2.5, 4.0]
    logits, labels = overconfident(truth, n=40000)
    assert fit_temperature(logits, labels, per_class=True) == pytest.approx(truth, rel=0.1)


@pytest.mark.parametrize("true_temperature", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("per_class", [False, True])
def test_fitted_nll_is_never_above_the_unscaled_nll(true_temperature, per_class):
    logits, labels = overconfident(true_temperature, n=3000, seed=1)
    fitted = fit_temperature(logits, labels, per_class=per_class)
    assert temperature_nll(logits, labels, fitted) <= temperature_nll(logits, labels) + 1e-12


def test_a_single_temperature_keeps_the_argmax():
    logits, labels = overconfident(3.0, n=500)
    scaled = apply_temperature(logits.float(), fit_temperature(logits, labels))
    assert torch.equal(scaled.argmax(1), logits.argmax(1))


def test_apply_temperature_broadcasts_over_images():
    logits = torch.ones(2, 3, 4, 5)
    scaled = apply_temperature(logits, [1.0, 2.0, 4.0])
    torch.testing.assert_close(scaled[:, :, 1, 2], torch.tensor([[1.0, 0.5, 0.25]] * 2))
    with pytest.raises(ValueError, match="2 temperatures for 3 classes"):
        apply_temperature(logits, [1.0, 2.0])


@pytest.mark.parametrize(
    "logits,labels,message",
    [
        (torch.zeros(3, 4, 5), torch.zeros(3, dtype=torch.long), "needs \\(N, C\\) logits"),
        (torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), "no validation voxels"),
        (torch.zeros(3, 4), torch.tensor([0, 1, 4]), "Labels must lie in \\[0, 3\\]"),
        (torch.tensor([[0.0, float("nan")]]), torch.tensor([0]), "NaN"),
    ],
)
def test_bad_inputs_are_refused(logits, labels, message):
    with pytest.raises(ValueError, match=message):
        fit_temperature(logits, labels)
