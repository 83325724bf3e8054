"""The plan: every choice a training run makes from its data before the first step, one file in the run folder
(nnU-Net's experiment planning and plans file, kept small).

:func:`make_plan` chooses, from the training cases' fingerprint (:mod:`Training.fingerprint`) and the flags,

- the grid: the training cases' median spacing (its in-plane pair for a 2D network);
- the patch: for a 2D network a square no larger than the schedule's side (``preferred``: 128 quick, 224
  ``--paper``) nor than the median slice's longer side; for a 3D network the median shape, shrunk along its
  longest axis (in mm) to at most :data:`VOXEL_BUDGET_3D` voxels. Every side is a multiple of the network's
  own down-sampling (:func:`CalibSegLib.networks.network_stride`: 16 for the default UNet, so the shipped
  recipe comes out unchanged), then the patch is grown, smallest side first, until the network segments it,
  and it must fit the largest training slice or volume;
- the normalisation: a channel named ``CT`` gets the training foreground's HU window and its z-score, every
  other channel the dataset's per-image scheme (:func:`Datasets.dataset_defaults.default_scheme`);
- the classes and channels: ``dataset.json``'s names, else the dataset's own
  (:func:`Datasets.dataset_defaults.default_classes`).

Each is a flag's value where one is given (``--target-spacing``, ``--patch-size``, ``--normalization``,
``--num-classes``), and a refusal names a flag only then: otherwise it names the plan's choice and the data.
The plan is printed at the start and written to the run folder's ``plan.json`` before the first step
(:func:`write_plan`); the run's configuration is built from it (:func:`Training.config.train_config`), and
``run.json`` and the bundle's ``training.plan`` record it.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from CalibSegLib.io import write_json_atomic
from CalibSegLib.networks import (NetworkOptionsError, build_network_on_meta, input_size_problem,
                                  network_stride)
from CalibSegLib.preprocessing import (ChannelNormalization, in_plane_spacing, network_grid_shape,
                                       volume_grid_shape)
from Datasets.dataset_defaults import DEFAULT_CLASS_COUNT, default_classes, default_scheme
from Datasets.dataset_json import DatasetDescription
from Datasets.errors import DataError
from Datasets.layouts import CaseFile
from Datasets.loading import Case
from Training.fingerprint import ChannelStatistics, Fingerprint, make_fingerprint
from Training.records import PLAN_NAME

if TYPE_CHECKING:
    from torch import nn

__all__ = ["VOXEL_BUDGET_3D", "CT_CHANNEL", "IMAGE_SCHEMES", "Plan", "spacing_text", "class_count",
           "channel_names", "channel_normalization", "patch_2d", "patch_3d", "largest_extent", "per_axis",
           "make_plan", "read_plan", "write_plan", "check_stored_plan"]

# A 3D patch of at most 128³ voxels: a batch of 2 with MONAI's UNet (16-256 channels) fits in about 8 GiB.
VOXEL_BUDGET_3D = 128 ** 3
CT_CHANNEL = "CT"  # the dataset.json channel name that selects the dataset-level CT normalisation
# How a channel other than CT may be normalised per image (calibseg-train --normalization): "zscore" keeps
# every intensity apart (an affine map, nothing clipped), so a small bright structure stays brighter than all
# the tissue around it; "percentile" clips at the image's 99th percentile: everything brighter is one value.
IMAGE_SCHEMES: tuple[str, ...] = ("zscore", "percentile")
# The plan's patch is grown at most this many times (by the network's stride along its smallest side) to one
# the network segments: the default UNet needs more than one voxel left at the bottom, and a 3D plan of thin
# volumes may start at one stride a side.
_PATCH_GROWTH_STEPS = 8
# How the start of a run names each channel's scheme (CalibSegLib.preprocessing.CHANNEL_SCHEMES).
_SCHEME_TEXT = {"percentile": "per image [min, 99th percentile] → [0, 1]",
                "zscore": "per image z-score, not clipped",
                "ct": "training foreground's HU window, then its z-score"}


@dataclass(frozen=True)
class Plan:
    """What a run decided from its data: the ``fingerprint`` of ``dataset``'s training cases and the choices
    made from it. ``target_spacing`` (mm) and ``patch_size`` (voxels at it) are ``(y, x)`` for a 2D network
    (``spatial_dims``) and ``(z, y, x)`` for a 3D one; ``channel_normalization`` has one entry per channel
    (None: every channel's per-image percentile scaling); ``channel_names`` None means one channel, the image;
    ``class_names`` start with the background, ``class_colors`` are RGB in [0, 1]."""

    dataset: str
    fingerprint: Fingerprint
    spatial_dims: int
    target_spacing: tuple[float, ...]
    patch_size: tuple[int, ...]
    channel_normalization: tuple[ChannelNormalization, ...] | None
    channel_names: tuple[str, ...] | None
    class_names: tuple[str, ...]
    class_colors: tuple[tuple[float, float, float], ...]

    def to_json(self) -> dict[str, Any]:
        """The plan as ``plan.json`` holds it (lists for tuples)."""
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> "Plan":
        """A plan from :meth:`to_json`'s dictionary; ``KeyError``/``TypeError``/``ValueError`` when it is
        none."""
        normalization = values["channel_normalization"]
        names = values["channel_names"]
        return cls(str(values["dataset"]), Fingerprint.from_json(values["fingerprint"]),
                   int(values["spatial_dims"]), tuple(float(value) for value in values["target_spacing"]),
                   tuple(int(value) for value in values["patch_size"]),
                   (None if normalization is None
                    else tuple(ChannelNormalization(**item) for item in normalization)),
                   None if names is None else tuple(str(name) for name in names),
                   tuple(str(name) for name in values["class_names"]),
                   tuple(tuple(float(value) for value in color) for color in values["class_colors"]))

    def lines(self) -> list[str]:
        """The plan as printed at the start of a run."""
        median = self.fingerprint.median_spacing()
        spacing = " × ".join(f"{value:.3g}" for value in median)
        shape = " × ".join(map(str, self.fingerprint.median_shape(median)))
        lines = [f"plan: median spacing {spacing} mm (z, y, x), median shape {shape} voxels at it; "
                 f"{self.spatial_dims}D patch {'×'.join(map(str, self.patch_size))} at "
                 f"{spacing_text(self.target_spacing)} mm"]
        lines += [f"plan: channel {channel.name}: foreground mean {channel.mean:.4g}, sd {channel.std:.4g}, "
                  f"0.5–99.5 percentiles {channel.percentile_00_5:.4g} to {channel.percentile_99_5:.4g}"
                  for channel in self.fingerprint.channels]
        schemes = [item.scheme for item in self.channel_normalization or []]
        schemes = schemes or ["percentile"] * len(self.fingerprint.channels)
        named = zip(self.fingerprint.channels, schemes)
        lines.append("normalisation: " + "; ".join(f"{channel.name}: {_SCHEME_TEXT[scheme]}"
                                                    for channel, scheme in named))
        return lines


def spacing_text(spacing: Sequence[float]) -> str:
    """``1.5`` for an isotropic spacing in mm, ``3.68×0.834×0.834`` for any other (as the console shows it:
    three significant digits)."""
    values = [f"{value:.3g}" for value in spacing]
    return values[0] if len(set(values)) == 1 else "×".join(values)


def class_count(arguments: argparse.Namespace, description: DatasetDescription | None) -> int:
    """The classes (background included) a run segments: ``--num-classes``, else as many as the data's
    ``dataset.json`` names (``description``), else :data:`Datasets.dataset_defaults.DEFAULT_CLASS_COUNT`.

    Raises:
        DataError: ``--num-classes`` contradicts ``dataset.json``, or fewer than 2 classes (in the terms of
            the flag where it is given).
    """
    names = description.class_names if description is not None else None
    count = arguments.num_classes or (len(names) if names else DEFAULT_CLASS_COUNT)
    if names and count != len(names):
        raise DataError(f"--num-classes {count} contradicts the data's dataset.json, which names "
                        f"{len(names)} classes ({', '.join(names)}); leave --num-classes out.")
    if count < 2:  # the sentence names the flag only where it was given
        source = f"--num-classes {count}" if arguments.num_classes else "The data's dataset.json (one class)"
        raise DataError(f"{source} leaves nothing to segment; a run needs the background and one class more.")
    return count


def channel_names(files: Sequence[CaseFile], description: DatasetDescription | None) -> list[str] | None:
    """The input channels' names for a bundle: the ``dataset.json``'s, ``channel k`` for several unnamed
    channels, None for one unnamed channel (the image)."""
    if description is not None and description.channel_names:
        return list(description.channel_names)
    count = len(files[0].channel_paths) if files else 1
    return [f"channel {index}" for index in range(count)] if count > 1 else None


def channel_normalization(channels: Sequence[ChannelStatistics], scheme: str = "zscore"
                          ) -> list[ChannelNormalization] | None:
    """Per channel how it is normalised: a channel named :data:`CT_CHANNEL` clipped to its foreground 0.5–99.5
    percentiles and z-scored with the foreground mean and sd after that clipping (Hounsfield units keep their
    meaning), the others by ``scheme`` (one of :data:`IMAGE_SCHEMES`, per image); None when every channel is
    ``"percentile"`` (the bundle then records nothing new and normalises as every bundle before it)."""
    if scheme not in IMAGE_SCHEMES:
        raise DataError(f"Unknown normalisation {scheme!r}; choose one of {', '.join(IMAGE_SCHEMES)}.")
    if scheme == "percentile" and not any(channel.name == CT_CHANNEL for channel in channels):
        return None
    return [ChannelNormalization("ct", (channel.percentile_00_5, channel.percentile_99_5), channel.mean,
                                 max(channel.std, 1e-8)) if channel.name == CT_CHANNEL
            else ChannelNormalization(scheme) for channel in channels]


def _rounded_down(size: float, multiple: int) -> int:
    return max(multiple, int(size) // multiple * multiple)


def patch_2d(median_in_plane: Sequence[float], preferred: int, multiple: int = 16) -> tuple[int, int]:
    """A square 2D patch no larger than ``preferred`` nor than the median slice's longer side, a ``multiple``
    of the network's stride (voxels)."""
    side = min(_rounded_down(preferred, multiple), _rounded_down(max(median_in_plane), multiple))
    return side, side


def patch_3d(median_shape: Sequence[int], spacing: Sequence[float], voxel_budget: int = VOXEL_BUDGET_3D,
             multiple: Sequence[int] = (16, 16, 16)) -> tuple[int, int, int]:
    """The median shape ``(z, y, x)`` as a patch, each side a multiple of the network's stride along it
    (``multiple``), its longest axis in mm shrunk one stride at a time until it holds at most ``voxel_budget``
    voxels."""
    patch = [_rounded_down(size, step) for size, step in zip(median_shape, multiple)]
    while int(np.prod(patch)) > voxel_budget:
        shrinkable = [axis for axis in range(3) if patch[axis] > multiple[axis]]
        if not shrinkable:
            break
        longest = max(shrinkable, key=lambda axis: patch[axis] * spacing[axis])
        patch[longest] -= multiple[longest]
    return tuple(patch)


def largest_extent(fingerprint: Fingerprint, target_spacing: Sequence[float]) -> tuple[int, ...]:
    """The largest extent, per axis, of any training case once resampled to ``target_spacing``: ``(y, x)``
    voxels of a slice for a 2D one, ``(z, y, x)`` of the volume for a 3D one (what crops are cut from; shapes
    only, no resampling).

    Raises:
        DataError: a case whose spacing puts it outside the model's grid limits (its id and the reason).
    """
    extents = []
    for case, shape, spacing in zip(fingerprint.cases, fingerprint.shapes, fingerprint.spacings):
        try:
            if len(target_spacing) == 3:
                extents.append(volume_grid_shape(shape, spacing, target_spacing))
            else:
                extents.append(network_grid_shape(shape[1:], in_plane_spacing(spacing), target_spacing))
        except ValueError as error:
            raise DataError(f"{case}: {error}") from None
    return tuple(int(value) for value in np.max(extents, axis=0))


def per_axis(flag: str, values: Sequence[float] | None, dims: int) -> tuple[float, ...] | None:
    """A per-axis flag's value (``--patch-size``, ``--target-spacing``): one number for every axis or ``dims``
    of them, each positive and finite; None when the flag is not given.

    Raises:
        DataError: another count of numbers, or one that is not positive and finite.
    """
    if not values:
        return None
    if len(values) not in (1, dims):
        axes = "z y x" if dims == 3 else "y x"
        raise DataError(f"{flag} takes one value or {dims} ({axes}) with --spatial-dims {dims}, got "
                        f"{len(values)}.")
    if not all(math.isfinite(value) and value > 0 for value in values):
        raise DataError(f"{flag} must be positive and finite, got {' '.join(map(str, values))}.")
    return tuple(values) * dims if len(values) == 1 else tuple(values)


def _planned_network(arguments: argparse.Namespace, in_channels: int, num_classes: int) -> "nn.Module":
    """The flags' network on torch's meta device (no memory): a bad ``--network-arg`` is one sentence here."""
    kwargs = dict(arguments.network_arg)
    try:
        return build_network_on_meta(arguments.network, in_channels, num_classes, arguments.spatial_dims,
                                     **kwargs)
    except NetworkOptionsError as error:
        raise DataError(f"--network {arguments.network} cannot be built with --network-arg {kwargs} "
                        f"({error.reason}).") from None


def _given_patch(model: "nn.Module", arguments: argparse.Namespace, patch: tuple[int, ...],
                 in_channels: int, largest: tuple[int, ...], extent: str) -> tuple[int, ...]:
    """``--patch-size``, refused in its own terms when the network cannot take it or no training item holds
    it."""
    items = "slice" if arguments.spatial_dims == 2 else "volume"
    flag = " ".join(map(str, patch))
    problem = input_size_problem(model, in_channels, patch, batch=arguments.batch_size)
    if problem:
        raise DataError(f"--patch-size {flag} does not fit --network {arguments.network}: {problem}.")
    if all(side > largest_side for side, largest_side in zip(patch, largest)):
        raise DataError(f"--patch-size {flag} is larger than every training {items} ({extent}); choose a "
                        "smaller --patch-size.")
    return patch


def _grown_patch(model: "nn.Module", arguments: argparse.Namespace, planned: tuple[int, ...],
                 multiple: tuple[int, ...], in_channels: int, largest: tuple[int, ...], extent: str
                 ) -> tuple[int, ...]:
    """The plan's patch grown, its smallest side by the network's stride along it at a time, to the smallest
    the network segments (printed when it grew); refused in terms of the plan and the data, never of a
    flag."""
    items = "slice" if arguments.spatial_dims == 2 else "volume"
    size = "×".join(map(str, planned))
    patch, grown = list(planned), 0
    while (problem := input_size_problem(model, in_channels, patch, batch=arguments.batch_size)) is not None:
        if grown == _PATCH_GROWTH_STEPS:
            stride = "×".join(map(str, multiple))
            raise DataError(f"--network {arguments.network} cannot segment the plan's {size}-voxel patch "
                            f"nor any within {_PATCH_GROWTH_STEPS} steps of its stride ({stride} voxels; "
                            f"{problem}); choose a network with fewer down-sampling steps (--network-arg "
                            "strides=...) or give --patch-size.")
        axis = min(range(len(patch)), key=lambda side: patch[side])
        patch[axis] += multiple[axis]
        grown += 1
    if all(side > largest_side for side, largest_side in zip(patch, largest)):
        raise DataError(f"The training {items}s are too small for --network {arguments.network}: the "
                        f"smallest patch it segments from the plan's {size} is {'×'.join(map(str, patch))} "
                        f"voxels, larger than every training {items} ({extent}); choose a network with fewer "
                        "down-sampling steps (--network-arg strides=...) or a finer --target-spacing.")
    if tuple(patch) != tuple(planned):
        print(f"plan: patch {size} grown to {'×'.join(map(str, patch))} voxels, the smallest --network "
              f"{arguments.network} segments", flush=True)
    return tuple(patch)


def make_plan(cases: Sequence[Case], dataset: str, arguments: argparse.Namespace, preferred_patch_2d: int,
              names: Sequence[str] | None, description: DatasetDescription | None) -> Plan:
    """The plan of a run on ``dataset``'s training ``cases`` (see the module docstring): ``arguments`` are
    calibseg-train's flags, ``preferred_patch_2d`` the schedule's 2D patch side, ``names`` the input channels'
    (:func:`channel_names`) and ``description`` the data's ``dataset.json`` (class names).

    Raises:
        DataError: no training case or foreground, a ``--network-arg`` the network cannot be built with, a
            patch the network cannot segment or no training item holds (in the terms of the flag where one is
            given).
    """
    dims = arguments.spatial_dims
    fingerprint = make_fingerprint(cases, list(names or ["image"]), seed=arguments.seed)
    median = fingerprint.median_spacing()
    planned_spacing = median if dims == 3 else median[1:]
    spacing = per_axis("--target-spacing", arguments.target_spacing, dims) or planned_spacing
    num_classes = class_count(arguments, description)
    in_channels = len(names) if names else 1
    model = _planned_network(arguments, in_channels, num_classes)
    multiple = network_stride(arguments.network, dims, **dict(arguments.network_arg))
    largest = largest_extent(fingerprint, spacing)
    extent = f"largest {'×'.join(map(str, largest))} voxels at {spacing_text(spacing)} mm"
    given = per_axis("--patch-size", arguments.patch_size, dims)
    if given is not None:
        patch = _given_patch(model, arguments, tuple(int(side) for side in given), in_channels, largest,
                             extent)
    else:
        shape = fingerprint.median_shape(median)
        planned = (patch_3d(shape, median, VOXEL_BUDGET_3D, multiple) if dims == 3
                   else patch_2d(shape[1:], preferred_patch_2d, math.lcm(*multiple)))
        patch = _grown_patch(model, arguments, planned, multiple, in_channels, largest, extent)
    scheme = default_scheme(dataset) if arguments.normalization == "auto" else arguments.normalization
    normalization = channel_normalization(fingerprint.channels, scheme)
    class_names, class_colors = default_classes(num_classes, dataset,
                                                description.class_names if description is not None else None)
    return Plan(dataset, fingerprint, dims, tuple(float(value) for value in spacing), patch,
                None if normalization is None else tuple(normalization),
                None if names is None else tuple(names), tuple(class_names),
                tuple(tuple(color) for color in class_colors))


def read_plan(run_dir: str | Path) -> Plan | None:
    """The plan in ``run_dir``'s ``plan.json``; None when it holds none (a run folder written before plans).

    Raises:
        DataError: the file is not a plan calibseg-train wrote (one sentence).
    """
    path = Path(run_dir) / PLAN_NAME
    if not path.is_file():
        return None
    try:
        return Plan.from_json(json.loads(path.read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise DataError(f"{path} is not a plan calibseg-train wrote ({type(error).__name__}: {error}); "
                        "remove it to plan again.") from None


def write_plan(run_dir: str | Path, plan: Plan) -> Path:
    """Write ``plan`` to ``run_dir``'s ``plan.json``, atomically; returns its path."""
    return write_json_atomic(Path(run_dir) / PLAN_NAME, plan.to_json())


def check_stored_plan(run_dir: str | Path, plan: Plan) -> None:
    """A run folder's stored plan (``--plan-only``'s, or a resumed run's) must be the one this run makes.

    Raises:
        DataError: the stored plan is unreadable, or one of its choices differs (named with both values).
    """
    stored = read_plan(run_dir)
    if stored is None:
        return
    kept, made = stored.to_json(), plan.to_json()
    changed = next((key for key in made if kept.get(key) != made[key]), None)
    if changed is not None:
        what = changed.replace("_", " ")
        raise DataError(f"{Path(run_dir) / PLAN_NAME} plans {what} {_choice_text(kept[changed])} but these "
                        f"flags and data plan {_choice_text(made[changed])}; give the flags and data it was "
                        "planned with, or remove it to plan again.")


def _choice_text(value: Any) -> str:
    """A plan's choice for a sentence: ``128×128`` for a patch or spacing, its JSON otherwise (cut at 80)."""
    if isinstance(value, list) and value and all(isinstance(item, (int, float)) for item in value):
        return "×".join(f"{item:g}" for item in value)
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
