"""Post-hoc temperature scaling (Guo et al., ICML 2017): ``softmax(logits / T)``, T fitted on validation data.

One temperature for all classes keeps the argmax (and so the segmentation) unchanged; one
per class (``per_class=True``) can recalibrate classes separately but may move boundaries.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

__all__ = ["apply_temperature", "fit_temperature", "temperature_nll", "temperature_text"]


def apply_temperature(
    logits: torch.Tensor, temperature: float | Sequence[float] | torch.Tensor
) -> torch.Tensor:
    """Divide ``(B, C, *spatial)`` or ``(N, C)`` logits by one temperature, or by one per class (dim 1)."""
    values = torch.as_tensor(temperature, dtype=logits.dtype, device=logits.device).reshape(-1)
    if values.numel() == 1:
        return logits / values
    if values.numel() != logits.shape[1]:
        raise ValueError(
            f"Got {values.numel()} temperatures for {logits.shape[1]} classes; give one or one per class."
        )
    return logits / values.view(1, -1, *([1] * (logits.dim() - 2)))


def temperature_nll(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float | Sequence[float] | torch.Tensor = 1.0
) -> float:
    """Mean negative log-likelihood of ``(N, C)`` logits scaled by ``temperature`` against ``(N,)`` labels."""
    return float(F.cross_entropy(apply_temperature(logits.double(), temperature), labels.long()))


def fit_temperature(
    logits: torch.Tensor, labels: torch.Tensor, per_class: bool = False, max_iterations: int = 200
) -> float | list[float]:
    """Temperature(s) minimising the NLL of ``(N, C)`` logits against ``(N,)`` int64 labels.

    Optimised with L-BFGS over log T (so T stays positive), starting at T = 1. The result is
    never worse than T = 1 on these data: if the optimiser ends higher, T = 1 is returned.

    Returns:
        A float, or a list of C floats when ``per_class``.
    """
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(
            f"Temperature fitting needs (N, C) logits and (N,) labels, "
            f"got {tuple(logits.shape)} and {tuple(labels.shape)}."
        )
    if logits.shape[0] == 0:
        raise ValueError("There are no validation voxels to fit a temperature on.")
    logits = logits.detach().to("cpu", torch.float64)
    labels = labels.detach().to("cpu", torch.int64)
    if labels.min() < 0 or labels.max() >= logits.shape[1]:
        raise ValueError(
            f"Labels must lie in [0, {logits.shape[1] - 1}] for {logits.shape[1]} classes, "
            f"found [{int(labels.min())}, {int(labels.max())}]."
        )
    if not torch.isfinite(logits).all():
        raise ValueError("The logits contain NaN or infinite values; a temperature cannot be fitted on them.")
    log_temperature = torch.zeros(
        logits.shape[1] if per_class else 1, dtype=torch.float64, requires_grad=True
    )
    optimizer = torch.optim.LBFGS(
        [log_temperature], lr=0.5, max_iter=max_iterations, line_search_fn="strong_wolfe"
    )

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(apply_temperature(logits, log_temperature.exp()), labels)
        loss.backward()
        return loss

    optimizer.step(objective)
    fitted = log_temperature.detach().exp()
    if not torch.isfinite(fitted).all() or temperature_nll(logits, labels, fitted) > temperature_nll(
        logits, labels
    ):
        fitted = torch.ones_like(fitted)
    values = [float(value) for value in fitted]
    return values if per_class else values[0]


def temperature_text(temperature: float | Sequence[float], labelled: bool = True) -> str:
    """A temperature as the reports print it: ``T = 1.42`` (``1.42`` when not ``labelled``), or ``T per class``
    (``per class``) for one temperature per class."""
    if isinstance(temperature, (int, float)):
        return f"T = {temperature:.2f}" if labelled else f"{temperature:.2f}"
    return "T per class" if labelled else "per class"
