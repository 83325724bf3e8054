"""Post-hoc temperature scaling (Guo et al., ICML 2017): softmax(l / T) with T fitted on validation data."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

__all__ = ["fit_temperature", "apply_temperature"]


def apply_temperature(logits: torch.Tensor, temperature: float | Sequence[float]) -> torch.Tensor:
    """Divide ``(B, C, *spatial)`` or ``(N, C)`` logits by one temperature or one per class."""
    values = torch.as_tensor(temperature, dtype=logits.dtype, device=logits.device).reshape(-1)
    if values.numel() == 1:
        return logits / values
    if values.numel() != logits.shape[1]:
        raise ValueError(f"got {values.numel()} temperatures for {logits.shape[1]} classes.")
    return logits / values.view(1, -1, *([1] * (logits.dim() - 2)))


def fit_temperature(
    logits: torch.Tensor, labels: torch.Tensor, per_class: bool = False, max_iterations: int = 200
) -> float | list[float]:
    """Temperature(s) minimising the NLL of ``(N, C)`` logits against ``(N,)`` int64 labels.

    Optimised with L-BFGS over log T (so T stays positive), starting at T = 1; the result
    never has a higher NLL than T = 1. Returns a float, or a list of C floats when ``per_class``.
    """
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"need (N, C) logits and (N,) labels, got {tuple(logits.shape)} and {tuple(labels.shape)}.")
    if logits.shape[0] == 0:
        raise ValueError("no validation voxels to fit a temperature on.")
    logits = logits.detach().double()
    labels = labels.detach().long()
    log_temperature = torch.zeros(logits.shape[1] if per_class else 1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_temperature], lr=0.5, max_iter=max_iterations, line_search_fn="strong_wolfe")

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(apply_temperature(logits, log_temperature.exp()), labels)
        loss.backward()
        return loss

    optimizer.step(objective)
    with torch.no_grad():
        fitted = log_temperature.exp()
        if F.cross_entropy(apply_temperature(logits, fitted), labels) > F.cross_entropy(logits, labels):
            fitted = torch.ones_like(fitted)
    values = [float(value) for value in fitted]
    return values if per_class else values[0]
