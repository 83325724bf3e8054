"""Rewriting a finished bundle's metadata: where the new file goes, the cases it records, the same weights.

The one rewrite path of a finished bundle: ``calibseg-fit``, ``calibseg-fit-quality`` and ``python -m
Training.fit_input_check`` change only ``bundle.json`` (the same weights bytes, in the same dtype, atomically);
``python -m Training.sub_ensemble`` keeps some members, ``calibseg-ship`` casts to float16.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from CalibSegLib.bundle import BUNDLE_SUFFIX, Bundle, BundleMetadata, save_bundle
from CalibSegLib.io import check_output_file
from CalibSegLib.pretrained import shipped_name
from Datasets.dataset_names import data_folder
from Datasets.errors import DataError
from Datasets.layouts import find_cases
from Datasets.loading import Case, load_cases
from Datasets.splits import select_patients

__all__ = ["rewrite_destination", "recorded_cases", "rewrite_bundle", "add_data_arguments"]

_SIDE_NAMES = {"train": "training", "val": "validation", "test": "test"}


def rewrite_destination(path: Path, out: str | Path | None) -> Path:
    """Where a rewritten ``path`` goes: ``out``, else over ``path`` itself; a shipped model is never rewritten
    inside the package, its default is ``runs/<name>/<name>.calibseg`` under the current folder. Checked
    writable before any work is spent.

    Raises:
        ValueError: the destination cannot be written (one sentence).
    """
    shipped = shipped_name(path)
    if out is None:
        out = Path("runs") / shipped / f"{shipped}{BUNDLE_SUFFIX}" if shipped else path
    return check_output_file(out)


def recorded_cases(metadata: BundleMetadata, name: str, data: str | Path | None, side: str,
                   purpose: str) -> list[Case]:
    """The volumes of the patients a bundle records on ``side`` (``data["train"]``, ``["val"]`` or ``["test"]``),
    loaded from ``data`` or the recorded dataset.

    Raises:
        DataError: the bundle ``name`` records none (nothing to ``purpose`` on), or the data is missing.
    """
    patients = metadata.data.get(side)
    if not patients:
        raise DataError(f"{name} records no {_SIDE_NAMES[side]} patients (data[{side!r}]), so there is nothing to "
                        f"{purpose} on.")
    return load_cases(select_patients(find_cases(data_folder(metadata.data, data)), patients), metadata.num_classes)


def rewrite_bundle(bundle: Bundle, metadata: BundleMetadata, out: Path, state: dict[str, Any] | None = None,
                   half: bool | None = None) -> Path:
    """``bundle``'s weights (or ``state``, some of them: a sub-ensemble's members) with new ``metadata`` at ``out``,
    atomically, in the weights' own dtype (float16 stays float16) unless ``half`` says (shipping casts to float16).
    Every rewrite of a bundle outside ``CalibSegLib.bundle`` goes through here."""
    return save_bundle(out, bundle.state_dict if state is None else state, metadata,
                       half=bundle.metadata.weights_dtype == "float16" if half is None else half)


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """``--data``, ``--device`` and ``--batch-size``: where a rewrite reads the patients the bundle records and runs
    its network over them."""
    parser.add_argument("--data", type=Path, default=None,
                        help="data folder (default: found from the dataset the bundle records)")
    parser.add_argument("--device", default="auto", help="where the network runs: auto, cpu, cuda, cuda:1")
    parser.add_argument("--batch-size", type=int, default=16, help="slices per network pass")
