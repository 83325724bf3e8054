"""A bundle in memory (:class:`Bundle`: metadata plus weights) and the network its metadata declares.

The declared network is first built on torch's meta device (shapes only, no memory) and refused
when its options are not small plain JSON or it would have more than :data:`MAX_PARAMETERS`
numbers; only then is it built for real, so no bundle can make the loader allocate a huge model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from CalibSegLib import networks
from CalibSegLib.bundle.schema import BundleError, BundleMetadata, is_int, is_number

__all__ = ["MAX_PARAMETERS", "Bundle", "build_declared_network", "check_weights_fit"]

# Networks up to 500 M parameters (2 GB as float32 once loaded): far above any segmentation network we know (MONAI's
# 3D DynUNet has 11 M), far below what would exhaust a workstation.
MAX_PARAMETERS = 500_000_000
# network_kwargs are a few lists of sizes, strides and names: bounded so even the meta-device
# build that sizes the network stays small and shallow (no recursion blow-up, no huge ints).
_MAX_KWARGS_ITEMS = 64
_MAX_KWARGS_DEPTH = 4
_MAX_KWARGS_INTEGER = 1 << 31


@dataclass
class Bundle:
    """A loaded (or freshly trained) bundle: metadata plus float32 weights.

    ``path`` is the file it was loaded from, None when built in memory.
    """

    metadata: BundleMetadata
    state_dict: dict[str, torch.Tensor]
    path: Path | None = None

    def build_model(self) -> nn.Module:
        """The network with the bundle's weights, in eval mode, on the CPU (an ensemble's members side by side,
        one output of ``ensemble_size × num_classes`` channels)."""
        model = build_declared_network(self.metadata)
        model.load_state_dict(self.state_dict)
        return model.eval()



def _check_network_kwargs(value: Any, where: str = "network_kwargs", depth: int = 0) -> None:
    """Raise :class:`BundleError` unless ``value`` is plain, small JSON: at most :data:`_MAX_KWARGS_ITEMS`
    items per list or object, :data:`_MAX_KWARGS_DEPTH` levels, finite numbers, integers within
    ±:data:`_MAX_KWARGS_INTEGER` — so even building the network on the meta device stays cheap."""
    if depth > _MAX_KWARGS_DEPTH:
        raise BundleError(
            f"The bundle's {where} nests deeper than {_MAX_KWARGS_DEPTH} levels; re-export the bundle."
        )
    if isinstance(value, (dict, list, tuple)) and len(value) > _MAX_KWARGS_ITEMS:
        raise BundleError(
            f"The bundle's {where} has {len(value)} items, more than the {_MAX_KWARGS_ITEMS} "
            "any network option needs."
        )
    if isinstance(value, dict):
        for key, item in value.items():
            _check_network_kwargs(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_network_kwargs(item, f"{where}[{index}]", depth + 1)
    elif is_int(value) and abs(value) > _MAX_KWARGS_INTEGER:
        raise BundleError(
            f"The bundle's {where} is {value}, beyond ±{_MAX_KWARGS_INTEGER:,}; "
            "no network option is that large."
        )
    elif is_number(value) and not math.isfinite(value):
        raise BundleError(f"The bundle's {where} is {value}; network options must be finite numbers.")


def build_declared_network(metadata: BundleMetadata, device: str = "cpu") -> nn.Module:
    """The declared network with random weights (for an ensemble, ``ensemble_size`` of them side by side,
    :class:`~CalibSegLib.networks.MemberNetworks`); :class:`BundleError` when it cannot be built.

    It is first built on torch's meta device (shapes only, no memory) and refused when it has
    more than :data:`MAX_PARAMETERS` numbers or cannot segment the bundle's sliding-window patch (a meta
    forward pass: a bundle whose window the network cannot take fails here, in one sentence, and not with
    torch's traceback at the first prediction); only then, unless ``device="meta"``, for real.
    """
    _check_network_kwargs(metadata.network_kwargs)
    declaration = (metadata.network, metadata.in_channels, metadata.num_classes, metadata.spatial_dims)
    try:
        skeleton = networks.build_network_on_meta(*declaration, **metadata.network_kwargs)
    except KeyError:
        raise BundleError(
            f"The bundle names an unknown network {metadata.network!r}; this CalibSeg knows "
            f"{', '.join(networks.NETWORKS)}."
        ) from None
    except networks.NetworkOptionsError as error:
        raise BundleError(
            f"The bundle's network {metadata.network!r} cannot be built from its network_kwargs "
            f"({error.reason})."
        ) from None
    members = metadata.ensemble_size
    count = members * sum(tensor.numel() for tensor in skeleton.state_dict().values())
    if count > MAX_PARAMETERS:
        raise BundleError(
            f"The bundle's network {metadata.network!r}{f' × {members} members' if members > 1 else ''} would have "
            f"{count:,} parameters, more than the {MAX_PARAMETERS:,} CalibSeg loads; check its network_kwargs."
        )
    patch = metadata.sliding_window.patch_size
    problem = networks.input_size_problem(skeleton, metadata.in_channels, patch)
    if problem:
        raise BundleError(
            f"The bundle's sliding-window patch {'×'.join(map(str, patch))} does not fit its network "
            f"{metadata.network!r} ({problem}); the bundle is inconsistent: retrain it, or re-export it with "
            "a patch the network takes."
        )
    build = networks.build_network_on_meta if device == "meta" else networks.build_network
    if members == 1:
        return skeleton if device == "meta" else build(*declaration, **metadata.network_kwargs)
    return networks.MemberNetworks([build(*declaration, **metadata.network_kwargs) for _ in range(members)])


def check_weights_fit(
    network: str, expected: dict[str, tuple[int, ...]], shapes: dict[str, tuple[int, ...]]
) -> None:
    """Raise :class:`BundleError` unless ``shapes`` (weight name → shape) are exactly the ``expected``
    keys and shapes of the declared ``network``."""
    missing = [name for name in expected if name not in shapes]
    unexpected = [name for name in shapes if name not in expected]
    mismatched = [
        f"{name} {tuple(shapes[name])} vs {expected[name]}"
        for name in expected
        if name in shapes and tuple(shapes[name]) != expected[name]
    ]
    problems = [
        f"{label} {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"
        for label, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched))
        if names
    ]
    if problems:
        raise BundleError(
            f"The bundle's weights do not fit the declared network {network!r} ({'; '.join(problems)})."
        )


