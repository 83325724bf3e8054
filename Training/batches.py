"""Training batches from slices cached in memory: the epoch's plan, augmentation, and prefetching.

All randomness of an epoch (slice order, 90° turns, flips) is drawn up front from the
checkpointed data-order generator (:func:`plan_epoch`), so the batches are the same whether
they are assembled in the loop or by background threads, and a resumed run draws exactly
what the uninterrupted one drew.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from Training.data import SliceData

__all__ = ["BatchPlan", "plan_epoch", "augment", "assemble", "iterate_batches"]


@dataclass(frozen=True)
class BatchPlan:
    """One batch: slice ``indices (n,)`` int64, counter-clockwise quarter ``turns (n,)`` in 0..3, ``flips (n,)`` bool."""

    indices: torch.Tensor
    turns: torch.Tensor
    flips: torch.Tensor


def plan_epoch(
    count: int,
    batch_size: int,
    generator: torch.Generator,
    iterations: int | None = None,
    augment: bool = True,
    square: bool = True,
) -> list[BatchPlan]:
    """The batches of one epoch.

    Args:
        count: number of cached training slices.
        batch_size: slices per batch (the last batch of a pass may be smaller).
        generator: the data-order generator (advanced here, and only here).
        iterations: ``None`` for one shuffled pass over the slices; else exactly this many
            batches taken from consecutive shuffled passes (a small dataset still gets enough
            steps between two CRaC multiplier updates).
        augment: draw random 90° turns and horizontal flips (else none).
        square: slices are square; otherwise only half turns keep their shape.
    """
    if iterations is None:
        order = torch.randperm(count, generator=generator)
    else:
        needed = iterations * batch_size
        order = torch.cat([torch.randperm(count, generator=generator) for _ in range(-(-needed // count))])[:needed]
    if augment:
        turns = torch.randint(0, 4 if square else 2, (len(order),), generator=generator) * (1 if square else 2)
        flips = torch.randint(0, 2, (len(order),), generator=generator).bool()
    else:
        turns = torch.zeros(len(order), dtype=torch.int64)
        flips = torch.zeros(len(order), dtype=torch.bool)
    return [BatchPlan(*parts) for parts in zip(order.split(batch_size), turns.split(batch_size), flips.split(batch_size))]


def augment(images: torch.Tensor, labels: torch.Tensor, turns: torch.Tensor, flips: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn ``images (n, 1, H, W)`` and ``labels (n, H, W)`` by ``turns``·90° and flip where ``flips``.

    Slices sharing a (turn, flip) pair are transformed together (at most 8 groups per batch),
    so the cost does not grow with Python-level work per slice.
    """
    if not bool(turns.any()) and not bool(flips.any()):
        return images, labels
    out_images, out_labels = torch.empty_like(images), torch.empty_like(labels)
    turns, flips = turns.to(images.device), flips.to(images.device)
    for turn in range(4):
        for flip in (False, True):
            selected = ((turns == turn) & (flips == flip)).nonzero().squeeze(1)
            if selected.numel() == 0:
                continue
            group_images = torch.rot90(images[selected], turn, (-2, -1))
            group_labels = torch.rot90(labels[selected], turn, (-2, -1))
            if flip:
                group_images, group_labels = group_images.flip(-1), group_labels.flip(-1)
            out_images[selected], out_labels[selected] = group_images, group_labels
    return out_images, out_labels


def assemble(slices: SliceData, plan: BatchPlan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather, augment and move one batch: ``images (n, 1, H, W)`` float32 and ``target (n, H, W)`` int64 on ``device``."""
    indices = plan.indices.to(slices.images.device)
    images, labels = augment(slices.images[indices], slices.labels[indices], plan.turns, plan.flips)
    non_blocking = device.type == "cuda"
    if images.device.type == "cpu" and non_blocking:
        images, labels = images.pin_memory(), labels.pin_memory()
    return images.to(device, non_blocking=non_blocking), labels.to(device, non_blocking=non_blocking).long()


def iterate_batches(slices: SliceData, plans: Sequence[BatchPlan], device: torch.device, workers: int = 0
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield the assembled batches of ``plans`` in order.

    ``workers`` > 0 assembles up to ``2 × workers`` batches ahead in background threads
    (torch releases the GIL inside its kernels), overlapping data preparation with the step.
    """
    if workers <= 0:
        for plan in plans:
            yield assemble(slices, plan, device)
        return
    lookahead = 2 * workers
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="calibseg-batches") as pool:
        pending = [pool.submit(assemble, slices, plan, device) for plan in plans[:lookahead]]
        for index in range(len(plans)):
            batch = pending[index].result()
            if index + lookahead < len(plans):
                pending.append(pool.submit(assemble, slices, plans[index + lookahead], device))
            pending[index] = None  # the batch is handed out; keep no reference to it
            yield batch
