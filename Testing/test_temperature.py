"""Temperature scaling recovers a known temperature and never increases NLL."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from CalibSegLib.temperature import apply_temperature, fit_temperature


def sample(true_temperature=2.5, n=20000, classes=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    calibrated = torch.randn(n, classes, generator=generator) * 2
    labels = torch.multinomial(calibrated.softmax(1), 1, generator=generator).squeeze(1)
    return calibrated * true_temperature, labels  # over-confident logits


def test_recovers_known_temperature():
    logits, labels = sample()
    assert fit_temperature(logits, labels) == pytest.approx(2.5, rel=0.05)


def test_nll_never_increases():
    logits, labels = sample(1.0)
    temperature = fit_temperature(logits, labels)
    assert F.cross_entropy(apply_temperature(logits, temperature), labels) <= F.cross_entropy(logits, labels) + 1e-9


def test_per_class_temperatures():
    logits, labels = sample()
    values = fit_temperature(logits, labels, per_class=True)
    assert len(values) == 4 and all(v > 0 for v in values)


def test_bad_shapes():
    with pytest.raises(ValueError, match="need"):
        fit_temperature(torch.zeros(3, 4, 5), torch.zeros(3, dtype=torch.long))
