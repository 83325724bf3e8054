"""Which torch device to run on (one rule for training, evaluation, the command line and Slicer), and the
description of the machine that results pages record beside every measurement."""

from __future__ import annotations

import os
import platform

import torch

__all__ = ["resolve_device", "environment"]


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


def environment(device: str | torch.device = "auto") -> dict[str, str | int]:
    """The machine a run is measured on: device, CPU, core count, torch threads and version, platform."""
    resolved = resolve_device(device)
    return {
        "device": torch.cuda.get_device_name(resolved) if resolved.type == "cuda" else "cpu",
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count() or 0,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "platform": platform.platform(terse=True),
    }
