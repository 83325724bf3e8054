"""Small, deterministic model bundles for the tests (the Slicer checks build their own with the public API).

    from tiny_bundles import make_test_bundle
    path = make_test_bundle(tmp_path / "tiny.calibseg", num_classes=4, patch_size=(64, 64))

The network is a two-level MONAI UNet with a few thousand weights drawn from ``seed``, so
the same arguments always give byte-identical weights and identical predictions.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np
import torch

from CalibSegLib.bundle import BundleMetadata, Ensemble, EnsembleMember, save_bundle
from CalibSegLib.bundle.ensemble import SelectedFrom
from CalibSegLib.sliding_window import SlidingWindow
from CalibSegLib.networks import build_network

__all__ = ["TINY_UNET", "make_test_metadata", "make_test_bundle", "ensemble_section", "make_test_ensemble", "disc_case"]

TINY_UNET: dict[str, Any] = {"channels": [4, 8], "strides": [2], "num_res_units": 0}


def make_test_metadata(
    num_classes: int = 4, patch_size: tuple[int, int] = (64, 64), **overrides: Any
) -> BundleMetadata:
    """Metadata of a tiny UNet bundle with every section filled; ``overrides`` replace fields."""
    values: dict[str, Any] = {
        "network": "unet",
        "network_kwargs": dict(TINY_UNET),
        "in_channels": 1,
        "num_classes": num_classes,
        "spatial_dims": 2,
        "class_names": ["background"] + [f"class {index}" for index in range(1, num_classes)],
        "class_colors": [(0.0, 0.0, 0.0)]
        + [(index / num_classes, 0.5, 1.0 - index / num_classes) for index in range(1, num_classes)],
        "sliding_window": SlidingWindow(patch_size=tuple(patch_size)),
        "training": {
            "method": "crac",
            "loss_hyperparameters": {"margin": 5.0},
            "epochs": 1,
            "lr": 1e-3,
            "batch_size": 2,
            "seed": 0,
            "loss_state": {"multipliers": {"outer": [1e-6] * num_classes, "inner": [1e-6] * num_classes}},
        },
        "data": {"dataset": "synthetic", "split": "none", "cases": {"train": ["case0"], "val": ["case1"]}},
        "validation_metrics": {"dice_mean": 0.5, "ece": 0.1},
    }
    values.update(overrides)
    return BundleMetadata(**values)


def make_test_bundle(
    path: str | Path,
    num_classes: int = 4,
    patch_size: tuple[int, int] = (64, 64),
    seed: int = 0,
    half: bool = False,
    **overrides: Any,
) -> Path:
    """Write a tiny, deterministic UNet bundle to ``path`` and return the path.

    Args:
        num_classes: output classes, background included.
        patch_size: in-plane ``(y, x)`` sliding-window size the network sees (multiples of 2).
        seed: draws the weights; same seed → byte-identical bundle weights.
        half: store the weights as float16.
        overrides: :class:`BundleMetadata` fields to replace (e.g. ``temperature=2.0``).
    """
    metadata = make_test_metadata(num_classes, patch_size, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_network(
            metadata.network,
            metadata.in_channels,
            num_classes,
            metadata.spatial_dims,
            **metadata.network_kwargs,
        )
    return save_bundle(path, model, metadata, half=half)


def ensemble_section(size: int, selected_from: SelectedFrom | None = None,
                     validation: Sequence[Sequence[str]] | None = None) -> Ensemble:
    """The ``ensemble`` section ``calibseg-ensemble`` writes for ``size`` networks (member m: fold m, validation
    patient ``p<m>``, or ``validation[m]``; its checksum a stand-in, no fold bundle exists), with ``selected_from`` (a
    sub-ensemble's origin) where given."""
    validation = validation or [[f"p{member}"] for member in range(size)]
    members = tuple(EnsembleMember(member, tuple(validation[member]), 1.0, 1, f"{member:064x}")
                    for member in range(size))
    return Ensemble(members, "one, fitted on the out-of-fold predictions of all folds", selected_from)


def make_test_ensemble(path: str | Path, size: int = 3, selected_from: SelectedFrom | None = None,
                       validation: Sequence[Sequence[str]] | None = None, **overrides: Any) -> Path:
    """Write an ensemble of ``size`` tiny UNets (member m: the network of :func:`make_test_bundle`'s ``seed=m``) to
    ``path`` with the ``ensemble`` section of :func:`ensemble_section`; returns the path. ``overrides`` replace other
    :class:`BundleMetadata` fields."""
    metadata = make_test_metadata(ensemble_size=size, ensemble=ensemble_section(size, selected_from, validation),
                                  **overrides)
    state = {}
    for member in range(size):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(member)
            network = build_network(metadata.network, metadata.in_channels, metadata.num_classes,
                                    metadata.spatial_dims, **metadata.network_kwargs)
        state.update({f"members.{member}.{name}": tensor for name, tensor in network.state_dict().items()})
    return save_bundle(path, state, metadata)


def disc_case(seed: int, invert: bool = False) -> SimpleNamespace:
    """A ``(4, 80, 96)`` volume, dark around a bright disc in a darker ring (labels 3, 2, 1; centre drawn from
    ``seed``), as a case: ``image`` (float32; ``invert``: contrast inverted), ``label``, ``spacing`` (10, 1.5, 1.5)
    mm and ``patient_id`` ``p<seed>``."""
    rng = np.random.default_rng(seed)
    k, j, i = np.indices((4, 80, 96))
    radius = np.hypot(j - 40 + rng.normal(0, 3), i - 48 + rng.normal(0, 3))
    labels = np.select([radius < 8, radius < 12, radius < 16], [3, 2, 1], 0).astype(np.uint8)
    image = np.array([0.1, 0.5, 0.3, 0.8])[labels] + rng.normal(0, 0.03, labels.shape)
    return SimpleNamespace(image=(1.0 - image if invert else image).astype(np.float32), label=labels,
                           spacing=(10.0, 1.5, 1.5), patient_id=f"p{seed}")
