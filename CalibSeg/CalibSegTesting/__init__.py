"""Test bodies of the CalibSeg module, shared by pytest (slicer-core scene) and CalibSegTest (inside Slicer).

Each check takes ``(scene, work_dir)``: an empty ``vtkMRMLScene`` (``slicer.mrmlScene`` inside Slicer, a fresh scene
from the ``slicer-core`` package under pytest) and a writable folder, builds its own inputs and a tiny deterministic
bundle (an untrained UNet, made with CalibSegLib's public API), and raises ``AssertionError`` when the module
misbehaves. ``Testing/test_slicer_module.py`` runs every entry of :data:`CHECKS` under pytest; ``CalibSegTest`` runs
the same list inside Slicer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from . import (batch_checks, channel_checks, function_checks, job_checks, metrics_checks, quality_checks,
               refusal_checks, segmentation_checks)
from .scene import make_volume_node, scene_snapshot

__all__ = ["CHECKS", "make_volume_node", "scene_snapshot"]

CHECK_MODULES = (segmentation_checks, channel_checks, metrics_checks, quality_checks, refusal_checks, job_checks,
                 batch_checks, function_checks)
CHECKS: dict[str, Callable[[object, Path], None]] = {
    name.removeprefix("check_"): function for module in CHECK_MODULES for name, function in vars(module).items()
    if name.startswith("check_") and callable(function)
}
