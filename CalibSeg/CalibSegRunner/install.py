"""Checks CalibSeg's Python dependencies inside Slicer and installs them only after the user agrees."""

from __future__ import annotations

import importlib.util
from typing import Callable

__all__ = ["REQUIRED_PACKAGES", "missing_packages", "install_missing"]

# import name -> pip requirement
REQUIRED_PACKAGES: dict[str, str] = {"torch": "torch", "monai": "monai>=1.3", "safetensors": "safetensors",
                                     "SimpleITK": "SimpleITK", "scipy": "scipy"}


def missing_packages() -> list[str]:
    """Import names of required packages that are not installed."""
    return [name for name in REQUIRED_PACKAGES if importlib.util.find_spec(name) is None]


def install_missing(confirm: Callable[[str], bool]) -> bool:
    """Install what is missing after ``confirm(message)`` returns True; returns whether all are present.

    torch comes from SlicerPyTorch's ``PyTorchUtils`` when that extension is installed (it
    picks the CUDA/CPU build that fits the machine), otherwise from ``slicer.util.pip_install``.
    """
    missing = missing_packages()
    if not missing:
        return True
    message = (f"CalibSeg needs {', '.join(missing)}, which are not installed in Slicer's Python. "
               "Install them now? This downloads several hundred MB and can take minutes.")
    if not confirm(message):
        return False
    import slicer.util

    if "torch" in missing:
        try:
            import PyTorchUtils

            PyTorchUtils.PyTorchUtilsLogic().installTorch(askConfirmation=False)
        except ImportError:
            slicer.util.pip_install(REQUIRED_PACKAGES["torch"])
    others = [REQUIRED_PACKAGES[name] for name in missing if name != "torch"]
    if others:
        slicer.util.pip_install(" ".join(others))
    return not missing_packages()
