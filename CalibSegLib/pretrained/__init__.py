"""Ready-to-use model bundles shipped with CalibSeg, and their recorded test metrics.

Each ``<name>.calibseg`` here (float16 weights) has a ``<name>.metrics.json`` beside it, written by
``Reporting/ship.py`` from an evaluation of that very file on the test patients of its split:
per-case rows (both temperature variants), their summary, the run it came from. Anywhere a
bundle path is asked for (``calibseg-predict --bundle``, the Slicer module), the
name alone (``acdc_crac``) picks the shipped file. Tools that write files about a shipped model
write them under the current folder (``runs/<name>/``), never into this package folder
(:func:`shipped_name` tells them when a bundle is a shipped one).
"""

from __future__ import annotations

import json
from pathlib import Path

from CalibSegLib import BUNDLE_SUFFIX

__all__ = ["PRETRAINED_DIR", "METRICS_SUFFIX", "DEFAULT_MODEL", "pretrained_models",
           "resolve_bundle_path", "shipped_name", "bundle_label", "recorded_metrics"]

PRETRAINED_DIR = Path(__file__).resolve().parent
METRICS_SUFFIX = ".metrics.json"
# The model the Slicer module preselects, chosen on the validation patients: the highest validation Dice among
# the models whose review flag catches at least half of the poor structures on degraded validation copies
# (docs/decisions.md, "Which model the module preselects").
DEFAULT_MODEL = "acdc_ce_dice"


def pretrained_models() -> dict[str, Path]:
    """``{name: bundle path}`` of every shipped bundle, sorted by name."""
    return {path.name.removesuffix(BUNDLE_SUFFIX): path for path in sorted(PRETRAINED_DIR.glob(f"*{BUNDLE_SUFFIX}"))}


def resolve_bundle_path(value: str | Path) -> Path:
    """A bundle file path as given, or the shipped bundle of that name.

    A value that looks like a path (a suffix or a folder) is returned as it is, so that the
    bundle loader reports a missing file by its path.

    Raises:
        ValueError: a bare name that is neither a file nor a shipped model (one sentence listing the names).
    """
    path = Path(value)
    models = pretrained_models()
    if path.is_file() or path.suffix or len(path.parts) > 1:
        return path
    if str(value) in models:
        return models[str(value)]
    names = ", ".join(models) or "none shipped"
    raise ValueError(f"Bundle {str(value)!r} is neither a file nor a shipped model ({names}); give a .calibseg path.")


def shipped_name(path: str | Path) -> str | None:
    """The shipped model's name when ``path`` is a shipped bundle (its name or its file here), else None."""
    path = Path(path)
    for name, shipped in pretrained_models().items():
        if str(path) == name or (path.is_file() and path.resolve() == shipped.resolve()):
            return name
    return None


def bundle_label(path: str | Path | None) -> str:
    """How outputs (DICOM objects, report pages) name the bundle at ``path``: a shipped model's name, else its
    file's name."""
    return "bundle" if path is None else shipped_name(path) or Path(path).name


def recorded_metrics(name: str) -> dict:
    """The metrics JSON written beside the shipped bundle ``name`` when it was shipped."""
    path = PRETRAINED_DIR / f"{name}{METRICS_SUFFIX}"
    if not path.is_file():
        raise ValueError(f"No recorded metrics for shipped model {name!r}; expected {path}.")
    return json.loads(path.read_text())
