"""Independent reference computations for the loss and prior tests.

Written on purpose unlike the library: plain Python loops over every voxel of tiny
NumPy arrays, ``math`` instead of torch, windows read one voxel at a time with an
explicit "outside the image is background" rule.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch

# CPU always; CUDA as well where a device exists, skipped (never failed) elsewhere.
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]),
]


def random_batch(shape: tuple[int, ...], seed: int = 0, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``shape = (B, C, *spatial)`` from N(0, 2²) and uniform labels ``(B, *spatial)``."""
    generator = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(shape, generator=generator)
    target = torch.randint(0, shape[1], (shape[0],) + tuple(shape[2:]), generator=generator)
    return logits.to(device), target.to(device)


def window_labels(labels: np.ndarray, index: tuple[int, ...], kernel: int) -> list[int]:
    """Labels of the window centred at ``index``, centre included; outside the image counts as 0."""
    half = kernel // 2
    values = []
    for offset in itertools.product(range(-half, half + 1), repeat=labels.ndim):
        position = tuple(i + o for i, o in zip(index, offset))
        inside = all(0 <= p < n for p, n in zip(position, labels.shape))
        values.append(int(labels[position]) if inside else 0)
    return values


def svls_weights(kernel: int, sigma: float, spatial_dims: int) -> list[float]:
    """SVLS window weights in the order of :func:`window_labels`: centre 1/2, the neighbours a
    Gaussian of ``sigma`` voxels scaled to sum to 1/2."""
    half = kernel // 2
    offsets = list(itertools.product(range(-half, half + 1), repeat=spatial_dims))
    gauss = [0.0 if all(o == 0 for o in offset) else math.exp(-sum(o * o for o in offset) / (2 * sigma**2))
             for offset in offsets]
    total = sum(gauss)
    return [0.5 if all(o == 0 for o in offset) else 0.5 * g / total for offset, g in zip(offsets, gauss)]


def loop_prior(labels: np.ndarray, num_classes: int, kernel: int, kind: str, sigma: float = 2.0) -> np.ndarray:
    """τ ``(C, *spatial)`` of one label map, voxel by voxel."""
    prior = np.zeros((num_classes,) + labels.shape)
    weights = svls_weights(kernel, sigma, labels.ndim)
    for index in np.ndindex(labels.shape):
        window = window_labels(labels, index, kernel)
        if kind in ("mean", "gaussian"):
            for position, label in enumerate(window):
                prior[(label,) + index] += 1.0 / len(window) if kind == "mean" else weights[position]
            continue
        if kind == "mode":
            counts = [window.count(k) for k in range(num_classes)]
            chosen = counts.index(max(counts))  # first maximum: the smallest label wins ties
        elif kind == "median":
            chosen = sorted(window)[len(window) // 2]
        else:
            chosen = max(window) if kind == "max" else min(window)
        prior[(chosen,) + index] = 1.0
    return prior


def loop_inner(labels: np.ndarray, kernel: int = 3) -> np.ndarray:
    """True where the window holds a single label."""
    inner = np.zeros(labels.shape, dtype=bool)
    for index in np.ndindex(labels.shape):
        inner[index] = len(set(window_labels(labels, index, kernel))) == 1
    return inner


def log_softmax(column: Sequence[float]) -> list[float]:
    top = max(column)
    log_total = top + math.log(sum(math.exp(v - top) for v in column))
    return [v - log_total for v in column]


VoxelTerm = Callable[[list[float], int, list[float]], float]


def voxel_mean(logits: torch.Tensor, target: torch.Tensor, term: VoxelTerm,
               prior: Callable[[np.ndarray], np.ndarray] | None = None) -> float:
    """Mean over every voxel of ``term(logit column, label, prior column)``.

    ``prior`` maps one ``(*spatial)`` label map to its ``(C, *spatial)`` τ (unused when None).
    """
    array, labels = logits.detach().double().cpu().numpy(), target.cpu().numpy()
    values = []
    for b in range(labels.shape[0]):
        tau = prior(labels[b]) if prior is not None else None
        for index in np.ndindex(labels.shape[1:]):
            column = [float(v) for v in array[(b, slice(None)) + index]]
            tau_column = [float(v) for v in tau[(slice(None),) + index]] if tau is not None else []
            values.append(term(column, int(labels[(b,) + index]), tau_column))
    return sum(values) / len(values)


def cross_entropy_term(column: list[float], label: int, tau: list[float]) -> float:
    return -log_softmax(column)[label]
