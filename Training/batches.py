"""Training batches: random crops of the cached volumes, foreground oversampling, augmentation, prefetching.

Every crop is cut from a whole slice on the model's grid (:func:`Datasets.cases.to_model_grid`)
by one ``grid_sample`` whose sampling grid already holds the augmentation's rotation, mirroring
and scaling, so cropping and the spatial transform cost one interpolation of the crop's
``patch_size`` voxels, whatever the slice's size (nnU-Net's recipe: random crops, a share of
them centred on a random foreground voxel, rotation, scaling, mirroring, gamma, contrast,
brightness and noise).

Foreground crops pick a slice holding foreground, then one of the classes present in it, then a
voxel of that class: small structures (the right ventricle at end-systole, apical slices) are
drawn as often as large ones.

All randomness of an epoch is drawn up front from the checkpointed data-order generator
(:func:`plan_epoch`), so the batches are the same whether they are assembled in the loop or
by background threads, and a resumed run draws exactly what the uninterrupted one drew.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from Datasets.cases import DataError, GridVolume

__all__ = ["Augmentation", "DEFAULT_AUGMENTATION", "NO_AUGMENTATION", "CropSampler", "BatchPlan", "plan_epoch",
           "assemble", "iterate_batches"]


@dataclass(frozen=True)
class Augmentation:
    """Ranges and probabilities of the random transforms of a training crop.

    Spatial (every crop): a random quarter turn (``quarter_turns``) plus a uniform rotation of
    ±``rotation_degrees``, a mirror along x with probability 1/2 (``mirror``; with the quarter
    turns this covers every in-plane orientation), a uniform zoom factor in ``scale`` (> 1 shows
    more of the slice, structures smaller). Intensity (images in [0, 1]): gamma in ``gamma``
    (log-uniform), contrast about the crop's mean and brightness factors, additive Gaussian noise
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
    """Where crops come from: every slice of the cached volumes and an index of their foreground voxels.

    ``slice_volume``/``slice_z`` ``(N,)`` locate each slice, ``slice_shape (N, 2)`` its ``(y, x)``
    size; ``coordinates (M, 2)`` int32 ``(y, x)`` of every foreground voxel sorted by slice and
    class, with ``starts``/``counts`` ``(N, C - 1)`` pointing into it per slice and foreground class.
    """

    def __init__(self, volumes: Sequence[GridVolume], num_classes: int) -> None:
        if not volumes:
            raise DataError("No training volumes to cut crops from.")
        self.volumes = list(volumes)
        volume_ids, z_ids, shapes, coordinates, counts = [], [], [], [], []
        foreground_classes = num_classes - 1
        for index, volume in enumerate(self.volumes):
            labels = volume.labels.cpu().long()
            depth = labels.shape[0]
            volume_ids.append(torch.full((depth,), index, dtype=torch.int64))
            z_ids.append(torch.arange(depth))
            shapes.append(torch.tensor(labels.shape[1:]).expand(depth, 2))
            voxels = labels.nonzero()  # (K, 3) z, y, x in row-major order
            classes = labels[voxels[:, 0], voxels[:, 1], voxels[:, 2]]
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

    def __len__(self) -> int:
        return len(self.slice_volume)

    @property
    def largest_slice(self) -> tuple[int, int]:
        """The largest ``(y, x)`` extent of any cached slice."""
        return tuple(int(value) for value in self.slice_shape.max(dim=0).values)

    def foreground_centres(self, count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` foreground crops: slice indices ``(count,)`` and voxel-centre positions ``(count, 2)`` (y, x).

        A slice holding foreground is drawn uniformly, then one of its classes, then a voxel of it.
        """
        if len(self.foreground_slices) == 0:
            raise DataError("The training labels hold no foreground voxel; check the labels.")
        picks = self.foreground_slices[torch.randint(len(self.foreground_slices), (count,), generator=generator)]
        present = self.counts[picks] > 0  # (count, C - 1)
        rank = (torch.rand(count, generator=generator) * present.sum(dim=1)).long()
        classes = (present.cumsum(dim=1) > rank.unsqueeze(1)).int().argmax(dim=1)
        counts = self.counts[picks, classes]
        offsets = self.starts[picks, classes] + (torch.rand(count, generator=generator) * counts).long()
        return picks, self.coordinates[offsets].float() + 0.5

    def random_centres(self, picks: torch.Tensor, patch_size: Sequence[int], generator: torch.Generator
                       ) -> torch.Tensor:
        """Uniform crop centres ``(n, 2)`` (y, x) in the slices ``picks``, keeping the crop inside the slice
        where the slice is larger than the crop."""
        shapes = self.slice_shape[picks].float()
        half = torch.tensor([float(value) for value in patch_size]) / 2
        low = torch.minimum(half, shapes / 2)
        high = torch.maximum(shapes - half, shapes / 2)
        return low + torch.rand(len(picks), 2, generator=generator) * (high - low)


@dataclass(frozen=True)
class BatchPlan:
    """One batch, drawn up front: per crop ``slice_index``, ``centre (n, 2)`` (y, x) in voxels,
    ``angle`` (radians), ``flip`` (mirror along x), ``scale``, ``gamma``, ``contrast``,
    ``brightness``, ``noise_std``; ``noise_seed`` seeds the batch's noise."""

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
) -> list[BatchPlan]:
    """The batches of one epoch.

    Args:
        sampler: the cached slices and their foreground index.
        batch_size: crops per batch (the last batch of a pass may be smaller).
        iterations: ``None`` for one shuffled pass over the slices; else exactly this many batches
            taken from consecutive shuffled passes.
        generator: the data-order generator (advanced here, and only here).
        patch_size: ``(y, x)`` crop size in voxels.
        augmentation: ranges of the random transforms (:data:`NO_AUGMENTATION` for none).
        foreground_share: fraction of crops centred on a foreground voxel, in [0, 1].
    """
    count = len(sampler)
    needed = count if iterations is None else iterations * batch_size
    picks = torch.cat([torch.randperm(count, generator=generator) for _ in range(-(-needed // count))])[:needed]
    centres = sampler.random_centres(picks, patch_size, generator)
    on_foreground = torch.rand(needed, generator=generator) < foreground_share
    if on_foreground.any():
        picks[on_foreground], centres[on_foreground] = sampler.foreground_centres(int(on_foreground.sum()), generator)
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
    return [BatchPlan(*batch, noise_seed=int(seed)) for batch, seed in zip(zip(*parts), seeds)]


def _sampling_grids(plan: BatchPlan, shapes: torch.Tensor, patch_size: Sequence[int]) -> torch.Tensor:
    """``(n, py, px, 2)`` grid_sample grids (x, y in [-1, 1] of each source slice) of the planned crops."""
    height, width = (int(value) for value in patch_size)
    rows = torch.arange(height, dtype=torch.float32) + 0.5 - height / 2
    columns = torch.arange(width, dtype=torch.float32) + 0.5 - width / 2
    offset_y, offset_x = torch.meshgrid(rows, columns, indexing="ij")  # (py, px) in crop voxels
    sign = torch.where(plan.flip, -1.0, 1.0).view(-1, 1, 1)
    cos, sin = (plan.angle.cos() * plan.scale).view(-1, 1, 1), (plan.angle.sin() * plan.scale).view(-1, 1, 1)
    source_x = plan.centre[:, 1].view(-1, 1, 1) + cos * sign * offset_x - sin * offset_y
    source_y = plan.centre[:, 0].view(-1, 1, 1) + sin * sign * offset_x + cos * offset_y
    shapes = shapes.float()
    return torch.stack([2 * source_x / shapes[:, 1].view(-1, 1, 1) - 1,
                        2 * source_y / shapes[:, 0].view(-1, 1, 1) - 1], dim=-1)


def _augment_intensity(images: torch.Tensor, plan: BatchPlan) -> torch.Tensor:
    """Gamma, contrast, brightness and noise of ``images (n, 1, py, px)`` in [0, 1], per crop."""
    view = (-1, 1, 1, 1)
    images = images.clamp(0.0, 1.0).pow(plan.gamma.to(images.device).view(view))
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    images = (images - mean) * plan.contrast.to(images.device).view(view) + mean
    images = images * plan.brightness.to(images.device).view(view)
    if bool((plan.noise_std > 0).any()):
        noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(plan.noise_seed))
        images = images + noise.to(images.device) * plan.noise_std.to(images.device).view(view)
    return images


def assemble(sampler: CropSampler, plan: BatchPlan, patch_size: Sequence[int], device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut, augment and move one batch: ``images (n, 1, py, px)`` float32 and ``target (n, py, px)`` int64."""
    grids = _sampling_grids(plan, sampler.slice_shape[plan.slice_index], patch_size)
    images, labels = [], []
    for index, grid in zip(plan.slice_index.tolist(), grids):
        volume = sampler.volumes[int(sampler.slice_volume[index])]
        z = int(sampler.slice_z[index])
        grid = grid.unsqueeze(0).to(volume.images.device)
        images.append(F.grid_sample(volume.images[z:z + 1], grid, mode="bilinear", padding_mode="zeros",
                                    align_corners=False))
        labels.append(F.grid_sample(volume.labels[z:z + 1].unsqueeze(1).float(), grid, mode="nearest",
                                    padding_mode="zeros", align_corners=False))
    images = _augment_intensity(torch.cat(images), plan)
    target = torch.cat(labels).squeeze(1).round().long()
    non_blocking = device.type == "cuda"
    if images.device.type == "cpu" and non_blocking:
        images, target = images.pin_memory(), target.pin_memory()
    return images.to(device, non_blocking=non_blocking), target.to(device, non_blocking=non_blocking)


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

