"""Training batches: random crops of the cached volumes, foreground oversampling, augmentation, prefetching.

The crops of a batch are cut from whole items on the model's grid — slices for a 2D network, whole volumes for a
3D one (:func:`Datasets.model_grid.to_model_grid`, stacked once in :class:`CropSampler`; every step below is written
for any number of spatial dimensions) — by one ``affine_grid``/``grid_sample`` over the batch, whose
per-crop affine matrices already hold the augmentation's rotation, mirroring and scaling, so
cropping and the spatial transform cost one interpolation of the batch's ``patch_size`` voxels,
whatever the slices' size, and run where the slices are cached (the GPU when they fit) without
waiting on the host (nnU-Net's recipe: random crops, a share of them centred on a random
foreground voxel, rotation, scaling, mirroring, gamma, contrast, brightness and noise).

Foreground crops are centred by one of :data:`FOREGROUND_SAMPLERS`: ``class`` (the default since 2026-11-29,
nnU-Net's oversampling) draws a volume, then one of the classes present anywhere in it, then a voxel of that class
anywhere in the volume, so that every class of a volume is drawn as often as any other, however few slices hold it;
``slice`` (the shipped models' draw) an item holding foreground, then one of the classes present in it, then a voxel
of that class, which draws a class in proportion to the slices holding it (a lesion in 5 of a volume's 20
foreground slices: 9 % of the foreground crops against 33 %, docs/decisions.md). For a 3D network, whose items are
whole volumes, the two are the same draw.

All randomness of an epoch is drawn up front from the checkpointed data-order generator
(:func:`plan_epoch`), so the batches are the same whether they are assembled in the loop or
by background threads, and a resumed run draws exactly what the uninterrupted one drew.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from Datasets.errors import DataError
from Datasets.model_grid import GridVolume

__all__ = ["Augmentation", "DEFAULT_AUGMENTATION", "NO_AUGMENTATION", "CropSampler", "FOREGROUND_SAMPLERS",
           "DEFAULT_FOREGROUND_SAMPLING", "BatchPlan", "plan_epoch", "assemble", "iterate_batches"]


@dataclass(frozen=True)
class Augmentation:
    """Ranges and probabilities of the random transforms of a training crop.

    Spatial (every crop): a random quarter turn (``quarter_turns``) plus a uniform rotation of
    ±``rotation_degrees`` in the (y, x) plane (about the slice axis for 3D crops), a mirror along x with
    probability 1/2 (``mirror``; with the quarter turns this covers every in-plane orientation), a uniform
    zoom factor in ``scale`` along every axis (> 1 shows more of the slice, structures smaller). Intensity, per
    channel of a crop: gamma in ``gamma`` (log-uniform; on the crop's own [0, 1] range where channels are
    z-scored, as nnU-Net does), contrast about the crop's mean and brightness factors, additive Gaussian noise
    of a standard deviation drawn from ``noise_std``, each with its probability.
    """

    quarter_turns: bool = True
    rotation_degrees: float = 15.0
    mirror: bool = True
    scale: tuple[float, float] = (0.85, 1.2)
    gamma: tuple[float, float] = (0.7, 1.5)
    gamma_probability: float = 0.3
    contrast: tuple[float, float] = (0.75, 1.25)
    contrast_probability: float = 0.15
    brightness: tuple[float, float] = (0.75, 1.25)
    brightness_probability: float = 0.15
    noise_std: tuple[float, float] = (0.0, 0.1)
    noise_probability: float = 0.15


DEFAULT_AUGMENTATION = Augmentation()
NO_AUGMENTATION = Augmentation(quarter_turns=False, rotation_degrees=0.0, mirror=False, scale=(1.0, 1.0),
                               gamma_probability=0.0, contrast_probability=0.0, brightness_probability=0.0,
                               noise_probability=0.0)


class CropSampler:
    """Where crops come from: every item (slice, or volume for a 3D network) of the cached volumes, stacked, and an
    index of their foreground voxels.

    ``images (N, K, *S)`` float32 (K channels) and ``labels (N, 1, *S)`` uint8 hold every item at the low corner of
    the largest item's extent ``S`` (``(H, W)`` for slices, ``(D, H, W)`` for volumes), zero beyond its own (what
    ``grid_sample`` reads outside an item anyway), on ``device``: a batch's items are then one index away from one
    batched ``grid_sample``. ``slice_volume``/``slice_z`` ``(N,)`` locate each item (its volume and its index there),
    ``slice_shape (N, d)`` its spatial size; ``coordinates (M, d)`` int32 positions of every foreground voxel sorted
    by item and class, with ``starts``/``counts`` ``(N, C - 1)`` pointing into it per item and foreground class;
    ``volume_counts (V, C - 1)`` the voxels of each class per volume, and ``class_ends ((C - 1) N,)`` the running
    count of voxels in (class, item) order, which :meth:`class_first_centres` searches to find the item holding a
    volume's r-th voxel of a class (the index and everything planning reads stay on the CPU). ``unit_range``: every
    channel is scaled to [0, 1] (percentile normalisation), so gamma applies to the crop as it is.
    """

    def __init__(self, volumes: Sequence[GridVolume], num_classes: int, device: torch.device | str = "cpu",
                 unit_range: bool = True) -> None:
        if not volumes:
            raise DataError("No training volumes to cut crops from.")
        volume_ids, z_ids, shapes, coordinates, counts = [], [], [], [], []
        foreground_classes = num_classes - 1
        for index, volume in enumerate(volumes):
            labels = volume.labels.cpu().long()  # (n, *spatial)
            depth, dims = labels.shape[0], labels.ndim - 1
            volume_ids.append(torch.full((depth,), index, dtype=torch.int64))
            z_ids.append(torch.arange(depth))
            shapes.append(torch.tensor(labels.shape[1:]).expand(depth, dims))
            voxels = labels.nonzero()  # (V, 1 + d): item, then spatial position, in row-major order
            classes = labels[tuple(voxels.T)]
            keep = classes > 0
            voxels, classes = voxels[keep], classes[keep]
            key = voxels[:, 0] * foreground_classes + classes - 1
            order = torch.argsort(key, stable=True)
            coordinates.append(voxels[order, 1:].to(torch.int32))
            counts.append(torch.bincount(key, minlength=depth * foreground_classes).view(depth, foreground_classes))
        self.slice_volume = torch.cat(volume_ids)
        self.slice_z = torch.cat(z_ids)
        self.slice_shape = torch.cat(shapes)
        self.coordinates = torch.cat(coordinates)
        self.counts = torch.cat(counts)
        self.starts = self.counts.flatten().cumsum(0).sub(self.counts.flatten()).view_as(self.counts)
        self.foreground_slices = (self.counts.sum(dim=1) > 0).nonzero().squeeze(1)
        self.volume_counts = torch.zeros(len(volumes), foreground_classes, dtype=torch.int64).index_add_(
            0, self.slice_volume, self.counts)
        self.foreground_volumes = (self.volume_counts.sum(dim=1) > 0).nonzero().squeeze(1)
        self.class_ends = self.counts.T.flatten().cumsum(0)
        first_items = torch.cat([torch.zeros(1, dtype=torch.int64), self.volume_counts.new_tensor(
            [volume.labels.shape[0] for volume in volumes]).cumsum(0)[:-1]])
        # Where each volume's voxels of each class begin in (class, item) order: a volume's r-th voxel of class c
        # is the (offset + r)-th there, and its item the cell of class_ends that holds it.
        self.class_offsets = (self.class_ends - self.counts.T.flatten()).view(foreground_classes, -1)[
            :, first_items].T.contiguous()  # (V, C - 1)
        self.unit_range = unit_range
        extent = self.largest_slice
        channels = volumes[0].images.shape[1]
        self.images = torch.zeros(len(self.slice_z), channels, *extent, device=device)
        self.labels = torch.zeros(len(self.slice_z), 1, *extent, dtype=torch.uint8, device=device)
        first = 0
        for volume in volumes:
            depth = volume.images.shape[0]
            corner = tuple(slice(0, size) for size in volume.images.shape[2:])
            self.images[(slice(first, first + depth), slice(None), *corner)] = volume.images
            self.labels[(slice(first, first + depth), 0, *corner)] = volume.labels
            first += depth

    @staticmethod
    def stack_bytes(volumes: Sequence[GridVolume]) -> int:
        """Bytes the stacked items of ``volumes`` take (float32 images of K channels and uint8 labels, padded to
        the largest item), to decide where they can be cached."""
        items = sum(volume.images.shape[0] for volume in volumes)
        extent = [max(sizes) for sizes in zip(*(volume.images.shape[2:] for volume in volumes))]
        return items * math.prod(extent) * (4 * volumes[0].images.shape[1] + 1)

    def __len__(self) -> int:
        return len(self.slice_volume)

    @property
    def largest_slice(self) -> tuple[int, ...]:
        """The largest spatial extent of any cached item: ``(y, x)`` slices, ``(z, y, x)`` volumes."""
        return tuple(int(value) for value in self.slice_shape.max(dim=0).values)

    def foreground_centres(self, count: int, generator: torch.Generator,
                           sampling: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` foreground crops: item indices ``(count,)`` and voxel-centre positions ``(count, d)``
        (``(y, x)`` or ``(z, y, x)``), drawn by ``sampling``, a name of :data:`FOREGROUND_SAMPLERS`
        (default :data:`DEFAULT_FOREGROUND_SAMPLING`)."""
        sampling = sampling or DEFAULT_FOREGROUND_SAMPLING
        if sampling not in FOREGROUND_SAMPLERS:
            raise ValueError(f"Unknown foreground sampling {sampling!r}; choose one of "
                             f"{', '.join(FOREGROUND_SAMPLERS)}.")
        if len(self.foreground_slices) == 0:
            raise DataError("The training labels hold no foreground voxel; check the labels.")
        return FOREGROUND_SAMPLERS[sampling](self, count, generator)

    def slice_first_centres(self, count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """An item holding foreground drawn uniformly, then one of the classes present in it, then a voxel of it.

        A volume weighs as many foreground items as it holds, and a class present in few of them is drawn
        rarely: one in 5 of a volume's 20 foreground slices gets about a quarter of its classmates' share.
        """
        picks = self.foreground_slices[torch.randint(len(self.foreground_slices), (count,), generator=generator)]
        classes = _present_class(self.counts[picks] > 0, generator)
        offsets = self.starts[picks, classes] + (torch.rand(count, generator=generator)
                                                 * self.counts[picks, classes]).long()
        return picks, self.coordinates[offsets].float() + 0.5

    def class_first_centres(self, count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """nnU-Net's oversampling: a volume holding foreground drawn uniformly, then one of the classes present
        anywhere in it, then a voxel of that class drawn uniformly over the whole volume (its item follows).

        Every class of a volume is drawn equally often, however few items hold it. For a 3D network, whose items
        are whole volumes, this is the draw :meth:`slice_first_centres` makes.
        """
        volumes = self.foreground_volumes[torch.randint(len(self.foreground_volumes), (count,),
                                                        generator=generator)]
        classes = _present_class(self.volume_counts[volumes] > 0, generator)
        rank = self.class_offsets[volumes, classes] + (torch.rand(count, generator=generator)
                                                       * self.volume_counts[volumes, classes]).long()
        cell = torch.searchsorted(self.class_ends, rank, right=True)  # class · N + item, holding that voxel
        picks = cell - classes * len(self)
        offsets = self.starts[picks, classes] + rank - (self.class_ends[cell] - self.counts[picks, classes])
        return picks, self.coordinates[offsets].float() + 0.5

    def random_centres(self, picks: torch.Tensor, patch_size: Sequence[int], generator: torch.Generator
                       ) -> torch.Tensor:
        """Uniform crop centres ``(n, d)`` in the items ``picks``, keeping the crop inside the item along every
        axis where the item is larger than the crop."""
        shapes = self.slice_shape[picks].float()
        half = torch.tensor([float(value) for value in patch_size]) / 2
        low = torch.minimum(half, shapes / 2)
        high = torch.maximum(shapes - half, shapes / 2)
        return low + torch.rand(len(picks), len(patch_size), generator=generator) * (high - low)


def _present_class(present: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Per row of ``present (n, C - 1)`` bool, the index of one of its True columns drawn uniformly ``(n,)``."""
    rank = (torch.rand(len(present), generator=generator) * present.sum(dim=1)).long()
    return (present.cumsum(dim=1) > rank.unsqueeze(1)).int().argmax(dim=1)


ForegroundSampler = Callable[[CropSampler, int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
# How a foreground crop's centre is drawn, by name (CropSampler.foreground_centres' ``sampling``).
FOREGROUND_SAMPLERS: dict[str, ForegroundSampler] = {"class": CropSampler.class_first_centres,
                                                     "slice": CropSampler.slice_first_centres}
DEFAULT_FOREGROUND_SAMPLING = "class"


@dataclass(frozen=True)
class BatchPlan:
    """One batch, drawn up front: per crop ``slice_index`` (the item), ``centre (n, d)`` in voxels,
    ``angle`` (radians), ``flip`` (mirror along x), ``scale``, ``gamma``, ``contrast``,
    ``brightness``, ``noise_std``; ``noise_seed`` seeds the noise of the whole planned batch of
    ``planned_size`` crops, of which this plan's crops are the rows from ``first`` on (a process's
    share of the batch under data parallelism gets the noise the whole batch would give it)."""

    slice_index: torch.Tensor
    centre: torch.Tensor
    angle: torch.Tensor
    flip: torch.Tensor
    scale: torch.Tensor
    gamma: torch.Tensor
    contrast: torch.Tensor
    brightness: torch.Tensor
    noise_std: torch.Tensor
    noise_seed: int
    planned_size: int
    first: int = 0

    def __len__(self) -> int:
        return len(self.slice_index)

    def share(self, rank: int, world_size: int) -> "BatchPlan | None":
        """Process ``rank``'s equal share of the batch, of ``len // world_size`` consecutive crops (a
        remainder of fewer than ``world_size`` crops is left out, so that every process's mean loss weighs
        the same); None when the batch has fewer crops than processes."""
        if world_size == 1:
            return self
        size = len(self) // world_size
        if size == 0:
            return None
        start = self.first + rank * size
        parts = {item.name: getattr(self, item.name)[rank * size:(rank + 1) * size]
                 for item in fields(self) if isinstance(getattr(self, item.name), torch.Tensor)}
        return BatchPlan(**parts, noise_seed=self.noise_seed, planned_size=self.planned_size, first=start)


def _uniform(low: float, high: float, count: int, generator: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(count, generator=generator)


def _sometimes(values: torch.Tensor, probability: float, neutral: float, generator: torch.Generator) -> torch.Tensor:
    """``values`` where a coin of ``probability`` comes up, else ``neutral`` (the coins are always drawn,
    so changing one probability does not shift the other draws)."""
    coins = torch.rand(len(values), generator=generator) < probability
    return torch.where(coins, values, torch.full_like(values, neutral))


def plan_epoch(
    sampler: CropSampler,
    batch_size: int,
    iterations: int | None,
    generator: torch.Generator,
    patch_size: Sequence[int],
    augmentation: Augmentation = DEFAULT_AUGMENTATION,
    foreground_share: float = 1 / 3,
    foreground_sampling: str | None = None,
) -> list[BatchPlan]:
    """The batches of one epoch.

    Args:
        sampler: the cached slices and their foreground index.
        batch_size: crops per batch (the last batch of a pass may be smaller).
        iterations: ``None`` for one shuffled pass over the slices; else exactly this many batches
            taken from consecutive shuffled passes.
        generator: the data-order generator (advanced here, and only here).
        patch_size: crop size in voxels, ``(y, x)`` or ``(z, y, x)``.
        augmentation: ranges of the random transforms (:data:`NO_AUGMENTATION` for none).
        foreground_share: fraction of crops centred on a foreground voxel, in [0, 1].
        foreground_sampling: how those are drawn, a name of :data:`FOREGROUND_SAMPLERS` (default
            :data:`DEFAULT_FOREGROUND_SAMPLING`).
    """
    count = len(sampler)
    needed = count if iterations is None else iterations * batch_size
    picks = torch.cat([torch.randperm(count, generator=generator) for _ in range(-(-needed // count))])[:needed]
    centres = sampler.random_centres(picks, patch_size, generator)
    on_foreground = torch.rand(needed, generator=generator) < foreground_share
    if on_foreground.any():
        picks[on_foreground], centres[on_foreground] = sampler.foreground_centres(
            int(on_foreground.sum()), generator, foreground_sampling)
    turns = torch.randint(0, 4, (needed,), generator=generator) if augmentation.quarter_turns \
        else torch.zeros(needed, dtype=torch.int64)
    angle = turns * (math.pi / 2) + math.radians(augmentation.rotation_degrees) * (
        2 * torch.rand(needed, generator=generator) - 1)
    flip = (torch.rand(needed, generator=generator) < 0.5) & augmentation.mirror
    scale = _uniform(*augmentation.scale, needed, generator)
    log_gamma = _uniform(math.log(augmentation.gamma[0]), math.log(augmentation.gamma[1]), needed, generator)
    gamma = _sometimes(log_gamma.exp(), augmentation.gamma_probability, 1.0, generator)
    contrast = _sometimes(_uniform(*augmentation.contrast, needed, generator), augmentation.contrast_probability,
                          1.0, generator)
    brightness = _sometimes(_uniform(*augmentation.brightness, needed, generator),
                            augmentation.brightness_probability, 1.0, generator)
    noise_std = _sometimes(_uniform(*augmentation.noise_std, needed, generator), augmentation.noise_probability,
                           0.0, generator)
    seeds = torch.randint(0, 2**62, (-(-needed // batch_size),), generator=generator)
    parts = [tensor.split(batch_size) for tensor in (picks, centres, angle, flip, scale, gamma, contrast, brightness,
                                                     noise_std)]
    return [BatchPlan(*batch, noise_seed=int(seed), planned_size=len(batch[0]))
            for batch, seed in zip(zip(*parts), seeds)]


def _columns(dims: int) -> tuple[slice, slice, int]:
    """Columns of a plan packed for the device: the ``(d, d + 1)`` affine matrix, the four intensity factors, the
    item index."""
    matrix = dims * (dims + 1)
    return slice(0, matrix), slice(matrix, matrix + 4), matrix + 4


def _packed(plan: BatchPlan, sampler: CropSampler, patch_size: Sequence[int]) -> torch.Tensor:
    """``(n, d (d + 1) + 5)`` float32: per crop the ``affine_grid`` matrix mapping the crop onto the stacked items'
    ``[-1, 1]`` coordinates (rotation in the (y, x) plane, mirroring along x and scaling about the crop centre),
    then gamma, contrast, brightness and noise standard deviation, then the item index (exact in float32 below
    2**24 items).

    A crop voxel ``i`` lies ``i + 0.5 - p/2`` voxels from the crop centre along each axis; its source is the centre
    plus that offset mirrored, rotated and scaled (``L`` below, in voxels); ``affine_grid``'s crop coordinates are
    these offsets times ``2 / p`` and ``grid_sample``'s source coordinates ``2 · position / size - 1``, both in
    (x, y[, z]) order, so the matrix is ``L · p / size`` beside the translation ``2 · centre / size - 1``.
    """
    dims = len(patch_size)
    patch = torch.tensor([float(value) for value in reversed(patch_size)])  # (x, y[, z])
    stack = torch.tensor([float(value) for value in reversed(sampler.images.shape[2:])])
    sign = torch.where(plan.flip, -1.0, 1.0)
    cos, sin = plan.angle.cos() * plan.scale, plan.angle.sin() * plan.scale
    linear = torch.zeros(len(plan), dims, dims)
    linear[:, 0, 0], linear[:, 0, 1] = cos * sign, -sin
    linear[:, 1, 0], linear[:, 1, 1] = sin * sign, cos
    if dims == 3:  # the slice axis is scaled, never rotated or mirrored
        linear[:, 2, 2] = plan.scale
    theta = linear * patch / stack.unsqueeze(1)
    translation = 2 * plan.centre.flip(1) / stack - 1
    return torch.cat([torch.cat([theta, translation.unsqueeze(2)], dim=2).flatten(1),
                      torch.stack([plan.gamma, plan.contrast, plan.brightness, plan.noise_std], dim=1),
                      plan.slice_index.unsqueeze(1).float()], dim=1)


def _gamma(images: torch.Tensor, gamma: torch.Tensor, unit_range: bool) -> torch.Tensor:
    """``images (n, K, *patch)`` to the power ``gamma (n, 1, ...)``: as they are when in [0, 1] (``unit_range``),
    else on each crop channel's own [min, max] rescaled to [0, 1] and back (z-scored channels, as nnU-Net)."""
    if unit_range:
        return images.clamp(0.0, 1.0).pow(gamma)
    spatial = tuple(range(2, images.ndim))
    low = images.amin(dim=spatial, keepdim=True)
    extent = (images.amax(dim=spatial, keepdim=True) - low).clamp_min(1e-6)
    return ((images - low) / extent).pow(gamma) * extent + low


def _augment_intensity(images: torch.Tensor, factors: torch.Tensor, plan: BatchPlan, unit_range: bool = True
                       ) -> torch.Tensor:
    """Gamma, contrast, brightness and noise of ``images (n, K, *patch)``, per crop and channel, with
    ``factors (n, 4)`` on the images' device (no host synchronisation); ``unit_range``: see :func:`_gamma`."""
    per_crop = (-1,) + (1,) * (images.ndim - 1)
    gamma, contrast, brightness, noise_std = (column.view(per_crop) for column in factors.unbind(dim=1))
    images = _gamma(images, gamma, unit_range)
    mean = images.mean(dim=tuple(range(2, images.ndim)), keepdim=True)
    images = ((images - mean) * contrast + mean) * brightness
    if bool((plan.noise_std > 0).any()):  # the plan's own CPU copy: no device read
        generator = torch.Generator(device=images.device).manual_seed(plan.noise_seed)
        noise = torch.randn((plan.planned_size, *images.shape[1:]), generator=generator, device=images.device)
        images = images + noise[plan.first:plan.first + len(images)] * noise_std
    return images


def assemble(sampler: CropSampler, plan: BatchPlan, patch_size: Sequence[int], device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut, augment and move one batch: ``images (n, K, *patch_size)`` float32 and ``target (n, *patch_size)`` int64.

    One ``affine_grid`` and one ``grid_sample`` per batch (bilinear for the images, nearest for the labels)
    over the plan's slices, on ``device``: the plan goes over in one asynchronous copy, the slices are
    indexed where they are cached (pinned host memory or the device), and nothing waits for the device.
    """
    non_blocking = device.type == "cuda"
    dims = len(patch_size)
    matrix, intensity, item = _columns(dims)
    packed = _packed(plan, sampler, patch_size)
    if non_blocking:
        packed = packed.pin_memory()
    packed = packed.to(device, non_blocking=non_blocking)
    if sampler.images.device.type == "cpu":
        images, labels = sampler.images[plan.slice_index], sampler.labels[plan.slice_index]
        if non_blocking:  # slices cached on the host for a GPU they do not fit on: pinned, copied asynchronously
            images, labels = images.pin_memory(), labels.pin_memory()
        images, labels = images.to(device, non_blocking=non_blocking), labels.to(device, non_blocking=non_blocking)
    else:
        index = packed[:, item].long()
        images, labels = sampler.images[index], sampler.labels[index]
    grid = F.affine_grid(packed[:, matrix].view(-1, dims, dims + 1), [len(plan), 1, *patch_size], align_corners=False)
    images = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    target = F.grid_sample(labels.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return (_augment_intensity(images, packed[:, intensity], plan, sampler.unit_range),
            target.squeeze(1).round().long())


def iterate_batches(sampler: CropSampler, plans: Sequence[BatchPlan], patch_size: Sequence[int],
                    device: torch.device, workers: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield the assembled batches of ``plans`` in order.

    ``workers`` > 0 assembles up to ``2 × workers`` batches ahead in background threads
    (torch releases the GIL inside its kernels), overlapping data preparation with the step.
    """
    if workers <= 0:
        for plan in plans:
            yield assemble(sampler, plan, patch_size, device)
        return
    lookahead = 2 * workers
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="calibseg-batches") as pool:
        pending = [pool.submit(assemble, sampler, plan, patch_size, device) for plan in plans[:lookahead]]
        for index in range(len(plans)):
            batch = pending[index].result()
            if index + lookahead < len(plans):
                pending.append(pool.submit(assemble, sampler, plans[index + lookahead], patch_size, device))
            pending[index] = None  # the batch is handed out; keep no reference to it
            yield batch

