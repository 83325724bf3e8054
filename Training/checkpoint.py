"""Atomic, tensor-only training checkpoints.

A checkpoint is written to a temporary file and renamed over the previous one, so a crash
or Ctrl-C never leaves a half-written file, and the last good checkpoint always survives.
It holds only tensors and plain Python values and is read with ``weights_only=True``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from CalibSegLib.io import atomic_output

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "capture_rng_state", "restore_rng_state"]


class CheckpointError(ValueError):
    """A checkpoint cannot be used for resuming; the message says why."""


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically to ``path`` (temporary file in the same folder, synced, then renamed).

    The file gets the umask's usual mode (``0666 & ~umask``), like every output
    (:func:`CalibSegLib.io.atomic_output`).
    """
    path = Path(path)
    with atomic_output(path) as temporary, open(temporary, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    return path


def load_checkpoint(path: str | Path, required: tuple[str, ...] = ("epoch", "model")) -> dict[str, Any]:
    """Read a checkpoint; raise :class:`CheckpointError` with one sentence if it is missing or damaged."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"No checkpoint at {path}; check --resume.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for truncated or foreign files
        raise CheckpointError(
            f"Checkpoint {path} is corrupt or truncated ({type(error).__name__}); it was left untouched — "
            "resume from an intact copy or start a new run."
        ) from None
    if not isinstance(state, dict) or any(key not in state for key in required):
        raise CheckpointError(f"{path} is not a CalibSeg training checkpoint (missing {', '.join(required)}).")
    return state


def capture_rng_state(generator: torch.Generator) -> dict[str, Any]:
    """Every random state training may touch: Python, NumPy, torch CPU (and CUDA), the data-order generator.

    NumPy's state is stored as a tensor and plain numbers, so the checkpoint stays loadable
    with ``weights_only=True``.
    """
    kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "cached_gauss": float(cached_gauss)},
        "torch": torch.get_rng_state(),
        "data_order": generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    """Put back what :func:`capture_rng_state` recorded (CUDA only where a GPU is present)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32), numpy_state["position"],
                         numpy_state["has_gauss"], numpy_state["cached_gauss"]))
    torch.set_rng_state(state["torch"])
    generator.set_state(state["data_order"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
