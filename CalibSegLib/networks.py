"""Segmentation networks by name, built from MONAI architectures (no hand-written copies).

Every network maps ``(B, in_channels, *spatial)`` images to ``(B, num_classes, *spatial)``
logits, one tensor, in training and in evaluation mode. The keyword arguments a caller
passes are what a model bundle stores as ``network_kwargs``, so a bundle can rebuild
exactly the same network.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import torch
from monai.networks import nets
from torch import nn

__all__ = ["NETWORKS", "NetworkOptionsError", "MemberNetworks", "build_network", "build_network_on_meta",
           "input_size_problem", "network_stride"]

# Each network's options where a caller gives none (any of them overridden by the caller's keyword arguments).
_DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {
    "unet": {"channels": (16, 32, 64, 128, 256), "strides": (2, 2, 2, 2), "num_res_units": 2},
    "attention_unet": {"channels": (16, 32, 64, 128, 256), "strides": (2, 2, 2, 2)},
    "unetpp": {"features": (16, 16, 32, 64, 128, 16)},
    "basic_unet": {"features": (16, 16, 32, 64, 128, 16)},
    # nnU-Net-like: five resolution levels, stride-2 down-sampling, instance norm.
    "dynunet": {"kernel_size": (3,) * 5, "strides": (1, 2, 2, 2, 2), "upsample_kernel_size": (2,) * 4,
                "filters": (16, 32, 64, 128, 256), "norm_name": "instance"},
}
# MONAI's BasicUNet and BasicUNetPlusPlus max-pool every axis by 2 four times whatever their options.
_FIXED_STRIDES: dict[str, tuple[int, ...]] = {"unetpp": (2, 2, 2, 2), "basic_unet": (2, 2, 2, 2)}


class NetworkOptionsError(ValueError):
    """The options given cannot build the network; ``reason`` is the library's own explanation (one line)."""

    def __init__(self, name: str, options: dict[str, Any], reason: str) -> None:
        self.reason = reason
        super().__init__(f"Network {name!r} cannot be built with the options {options} ({reason}).")


class _FinalOutput(nn.Module):
    """Unwraps networks that return a list of outputs (MONAI's UNet++) into their last, full-depth one."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.network(images)[-1]


class MemberNetworks(nn.Module):
    """An ensemble's networks run side by side on the same input: ``(B, K, *spatial)`` images to the members' logits
    concatenated along the channels, ``(B, M × C, *spatial)`` (member m's classes at ``m × C … m × C + C - 1``).

    One module with one output, so a sliding window blends (and mirrors) every member's logits in one pass exactly as
    it would blend each alone: blending is linear per channel. The members' weights are ``members.<m>.…``.
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.cat([member(images) for member in self.members], dim=1)


def _refuse_deep_supervision(name: str, options: dict[str, Any]) -> None:
    # Deep supervision changes the output to a stack of heads; CalibSeg's losses, metrics and
    # predictor all expect the single full-resolution logits map.
    if options.get("deep_supervision"):
        raise ValueError(f"{name} is built without deep supervision in CalibSeg; drop deep_supervision=True.")


def _unet(spatial_dims: int, in_channels: int, num_classes: int, **kw: Any) -> nn.Module:
    options = {**_DEFAULT_OPTIONS["unet"], **kw}
    return nets.UNet(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=num_classes, **options)


def _attention_unet(spatial_dims: int, in_channels: int, num_classes: int, **kw: Any) -> nn.Module:
    options = {**_DEFAULT_OPTIONS["attention_unet"], **kw}
    return nets.AttentionUnet(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=num_classes, **options)


def _unetpp(spatial_dims: int, in_channels: int, num_classes: int, **kw: Any) -> nn.Module:
    options = {**_DEFAULT_OPTIONS["unetpp"], **kw}
    _refuse_deep_supervision("unetpp", options)
    network = nets.BasicUNetPlusPlus(
        spatial_dims=spatial_dims, in_channels=in_channels, out_channels=num_classes, **options
    )
    return _FinalOutput(network)


def _basic_unet(spatial_dims: int, in_channels: int, num_classes: int, **kw: Any) -> nn.Module:
    options = {**_DEFAULT_OPTIONS["basic_unet"], **kw}
    return nets.BasicUNet(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=num_classes, **options)


def _dynunet(spatial_dims: int, in_channels: int, num_classes: int, **kw: Any) -> nn.Module:
    options = {**_DEFAULT_OPTIONS["dynunet"], **kw}
    _refuse_deep_supervision("dynunet", options)
    return nets.DynUNet(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=num_classes, **options)


_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "unet": _unet,
    "attention_unet": _attention_unet,
    "unetpp": _unetpp,
    "basic_unet": _basic_unet,
    "dynunet": _dynunet,
}

NETWORKS: tuple[str, ...] = tuple(_BUILDERS)


def build_network(
    name: str, in_channels: int, num_classes: int, spatial_dims: int = 2, **kw: Any
) -> nn.Module:
    """Build the MONAI network called ``name``.

    Defaults (override any of them through ``kw``): ``unet`` and ``attention_unet`` channels
    (16, 32, 64, 128, 256) with strides (2, 2, 2, 2) (``unet``: 2 residual units);
    ``unetpp`` and ``basic_unet`` features (16, 16, 32, 64, 128, 16); ``dynunet`` filters
    (16, 32, 64, 128, 256), kernels 3, strides (1, 2, 2, 2, 2), instance norm.

    Args:
        name: one of :data:`NETWORKS`.
        in_channels: image channels (1 for MRI/CT).
        num_classes: output channels C, background included.
        spatial_dims: 2 for slice-wise networks, 3 for volumetric ones.
        kw: options of the MONAI class (e.g. ``channels``); an option it does not take raises
            ``TypeError``.

    Returns:
        A module mapping ``(B, in_channels, *spatial)`` to ``(B, num_classes, *spatial)`` logits
        (spatial sizes divisible by the product of the strides, :func:`network_stride`: 16 with the defaults).
    """
    if name not in _BUILDERS:
        raise KeyError(f"Unknown network {name!r}; choose one of {', '.join(NETWORKS)}.")
    if spatial_dims not in (2, 3):
        raise ValueError(f"spatial_dims must be 2 or 3, got {spatial_dims}.")
    if in_channels < 1 or num_classes < 2:
        raise ValueError(
            f"in_channels must be >= 1 and num_classes >= 2, got {in_channels} and {num_classes}."
        )
    return _BUILDERS[name](spatial_dims, in_channels, num_classes, **kw)


def build_network_on_meta(
    name: str, in_channels: int, num_classes: int, spatial_dims: int = 2, **kw: Any
) -> nn.Module:
    """:func:`build_network` on torch's meta device: parameters have shapes and dtypes but no memory.

    Options from an untrusted bundle or a command line are checked this way, and the network's
    size is known (``sum(t.numel() for t in model.state_dict().values())``), before anything
    is allocated; a negative or astronomically large channel count costs nothing here.

    Raises:
        KeyError: ``name`` is not one of :data:`NETWORKS`.
        NetworkOptionsError: the options cannot build the network (MONAI's or torch's reason,
            first line only: their messages can span many).
    """
    if name not in _BUILDERS:
        raise KeyError(f"Unknown network {name!r}; choose one of {', '.join(NETWORKS)}.")
    try:
        with torch.device("meta"):
            return build_network(name, in_channels, num_classes, spatial_dims, **kw)
    except Exception as error:  # noqa: BLE001 — arbitrary options can fail in any way inside MONAI
        lines = str(error).strip().splitlines() or [type(error).__name__]
        reason = lines[0] if len(lines[0]) <= 200 else lines[0][:197] + "..."
        raise NetworkOptionsError(name, kw, reason) from None


def input_size_problem(model: nn.Module, in_channels: int, size: Sequence[int], batch: int = 2,
                       search: int = 64) -> str | None:
    """Why ``model`` (from :func:`build_network_on_meta`) cannot segment inputs of ``size`` voxels, or None.

    A training-mode forward pass of a ``(batch, in_channels, *size)`` meta tensor: no memory, no
    compute, but every shape rule of the network applies (down-sampling that must halve evenly,
    normalisation that needs more than one voxel at the bottom). The logits must come back on the
    same grid. The phrase suggests the nearest sizes within ``search`` voxels that work, taken
    isotropically.
    """
    size = tuple(int(value) for value in size)
    if _output_size(model, in_channels, size, batch) == size:
        return None
    nearest = (candidate for offset in range(1, search + 1) for candidate in (size[0] - offset, size[0] + offset)
               if candidate > 0 and _output_size(model, in_channels, (candidate,) * len(size), batch)
               == (candidate,) * len(size))
    fitting = sorted(itertools.islice(nearest, 2))
    hint = f"; the nearest sizes it takes are {' and '.join(map(str, fitting))}" if fitting else ""
    return f"the network cannot segment {'×'.join(map(str, size))}-voxel windows{hint}"


def _output_size(model: nn.Module, in_channels: int, size: tuple[int, ...], batch: int) -> tuple[int, ...] | None:
    """The spatial size of ``model``'s logits for a ``(batch, in_channels, *size)`` meta input; None if it fails."""
    model.train()
    try:
        with torch.no_grad():
            logits = model(torch.empty(batch, in_channels, *size, device="meta"))
    except Exception:  # noqa: BLE001 — any shape rule inside MONAI or torch may refuse the size
        return None
    return tuple(logits.shape[2:])


def network_stride(name: str, spatial_dims: int, **kw: Any) -> tuple[int, ...]:
    """How many times network ``name`` (with the options ``kw`` it was built with) shrinks each spatial axis
    at its deepest level: the product of its strides per axis (``(16, 16)`` for the default 2D UNet). A
    window side that is a multiple of it halves evenly at every level; a stride is a number or one per axis.

    Raises:
        KeyError: ``name`` is not one of :data:`NETWORKS`.
    """
    if name not in _BUILDERS:
        raise KeyError(f"Unknown network {name!r}; choose one of {', '.join(NETWORKS)}.")
    strides = _FIXED_STRIDES.get(name) or {**_DEFAULT_OPTIONS[name], **kw}["strides"]
    factor = [1] * spatial_dims
    for stride in strides:
        per_axis = [stride] * spatial_dims if isinstance(stride, int) else list(stride)
        factor = [total * int(step) for total, step in zip(factor, per_axis)]
    return tuple(factor)
