"""Which torch device to run on: one rule for training, evaluation, the command line and Slicer."""

from __future__ import annotations

import torch

__all__ = ["resolve_device"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` → CUDA when available, else CPU; anything else as torch understands it.

    Raises:
        ValueError: an unknown device name, or CUDA asked for on a machine without it.
    """
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except RuntimeError:
        raise ValueError(f"Unknown device {device!r}; use 'auto', 'cpu' or 'cuda'.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("Device 'cuda' was asked for but no CUDA device is available; use 'cpu' or 'auto'.")
    return device
