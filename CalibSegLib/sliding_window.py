"""How a network is run over a slice (2D) or volume (3D) of any size: overlapping windows, Gaussian blending, mirroring.

The network is trained on fixed ``patch_size`` crops; at inference every slice (already
resampled to the model's spacing) is covered by windows of that size with ``overlap``, and
the windows' logits are blended with a Gaussian weight that trusts window centres more than
their borders (MONAI's :func:`~monai.inferers.sliding_window_inference`, as nnU-Net does).
So the network always sees inputs like those it was trained on, whatever the field of view.
``mirror_axes`` adds test-time mirroring: logits are averaged over every combination of
flips along those in-plane axes, and :class:`MirrorAgreement` can count how far the passes agree.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from monai.inferers import sliding_window_inference
from torch import nn

__all__ = ["SlidingWindow", "MAX_PATCH", "MAX_VOXELS_PER_PASS", "MirrorAgreement", "windows_per_pass",
           "window_logits"]

# Largest accepted window side, and voxels per forward pass (window × windows per pass): a 2D
# network's activations take tens of bytes per voxel and channel, so anything larger in a bundle is
# a mistake or an attack (the default, 32 windows of 128², is a quarter of the budget).
MAX_PATCH = 2048
MAX_VOXELS_PER_PASS = 1 << 21


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass
class SlidingWindow:
    """Window settings a bundle records (the training crop is the window).

    Args:
        patch_size: window size in voxels at the model's spacing: in-plane ``(y, x)`` for a 2D network,
            ``(z, y, x)`` for a 3D one.
        overlap: fraction of a window shared with its neighbour, in [0, 1).
        mirror_axes: window axes (2D: 0 = y, 1 = x; 3D: 0 = z, 1 = y, 2 = x) to mirror at test time; logits
            are averaged over all ``2**len(mirror_axes)`` flips. Empty: no mirroring.
        batch_size: windows per forward pass (memory grows with it, not with the slice).
    """

    patch_size: tuple[int, int] = (128, 128)
    overlap: float = 0.5
    mirror_axes: tuple[int, ...] = ()
    batch_size: int = 32

    def __post_init__(self) -> None:
        if isinstance(self.patch_size, list):  # as read back from JSON
            self.patch_size = tuple(self.patch_size)
        if isinstance(self.mirror_axes, list):
            self.mirror_axes = tuple(self.mirror_axes)

    def validate(self) -> None:
        """Raise ``ValueError`` (one sentence naming the field) when a value is out of range."""
        size = self.patch_size
        if (
            not isinstance(size, (list, tuple))
            or len(size) not in (2, 3)
            or not all(_is_int(value) and 8 <= value <= MAX_PATCH for value in size[-2:])
            or not all(_is_int(value) and 1 <= value <= MAX_PATCH for value in size[:-2])
        ):
            raise ValueError(f"patch_size must be two integers (y, x) in 8..{MAX_PATCH}, or three (z, y, x) with z in "
                             f"1..{MAX_PATCH}, got {size!r}.")
        if isinstance(self.overlap, bool) or not isinstance(self.overlap, (int, float)) \
                or not 0 <= self.overlap < 1:
            raise ValueError(f"overlap must lie in [0, 1), got {self.overlap!r}.")
        axes = self.mirror_axes
        if not isinstance(axes, (list, tuple)) or len(set(axes)) != len(axes) \
                or not all(_is_int(axis) and 0 <= axis < len(size) for axis in axes):
            raise ValueError(f"mirror_axes must be distinct axes of the {len(size)}D window (0 .. {len(size) - 1}), "
                             f"got {axes!r}.")
        if not _is_int(self.batch_size) or not 1 <= self.batch_size <= 1024:
            raise ValueError(f"batch_size must be an integer in 1..1024, got {self.batch_size!r}.")
        if math.prod(size) * self.batch_size > MAX_VOXELS_PER_PASS:
            raise ValueError(
                f"{self.batch_size} windows of {'×'.join(map(str, size))} per pass exceed {MAX_VOXELS_PER_PASS:,} "
                "voxels; lower batch_size or patch_size."
            )

    @property
    def passes(self) -> int:
        """Network passes per slice: one per combination of flips along ``mirror_axes``, the unflipped one included."""
        return 2 ** len(self.mirror_axes)


def windows_per_pass(patch_size: tuple[int, ...], preferred: int = SlidingWindow.batch_size) -> int:
    """Windows of ``patch_size`` (voxels, 2D or 3D) per forward pass: ``preferred``, fewer where that would exceed
    :data:`MAX_VOXELS_PER_PASS` (at least 1), so a trainer with a large crop still writes a valid bundle."""
    voxels = math.prod(patch_size) if all(_is_int(side) and side > 0 for side in patch_size) else 1
    return max(1, min(preferred, MAX_VOXELS_PER_PASS // voxels))


class MirrorAgreement:
    """Per class, how each mirrored pass's argmax agrees with the argmax of the passes' average, counted over every
    batch of slices :func:`window_logits` adds: where the passes draw a structure differently, the average can still
    be confident, so their disagreement is a signal of its own (a quality-model feature, ``mirror_agreement``).

    Args:
        num_classes: C, background included.
        passes: the mirrored passes per slice, :attr:`SlidingWindow.passes`.
    """

    def __init__(self, num_classes: int, passes: int) -> None:
        self.num_classes = num_classes
        self.shared = np.zeros((passes, num_classes))  # voxels where pass p and the average both say class c
        self.pass_voxels = np.zeros((passes, num_classes))
        self.average_voxels = np.zeros(num_classes)

    def add(self, pass_labels: Sequence[torch.Tensor], average_labels: torch.Tensor) -> None:
        """Count one batch: each pass's ``(n, *spatial)`` argmax labels (unflipped back) against the average's (an
        ensemble's ``(n, M, *spatial)``, every member's voxels counted alike)."""
        if len(pass_labels) != len(self.shared):
            raise ValueError(f"Got {len(pass_labels)} passes for an agreement of {len(self.shared)}.")
        classes = self.num_classes
        average = average_labels.reshape(-1).long()
        self.average_voxels += torch.bincount(average, minlength=classes)[:classes].double().cpu().numpy()
        for index, labels in enumerate(pass_labels):
            # one count per (pass class, average class) pair: its rows are the pass's voxels, its diagonal the shared
            joint = torch.bincount(labels.reshape(-1).long() * classes + average, minlength=classes * classes)
            joint = joint[:classes * classes].reshape(classes, classes).double().cpu().numpy()
            self.pass_voxels[index] += joint.sum(axis=1)
            self.shared[index] += np.diag(joint)

    def dice(self) -> np.ndarray:
        """``(C,)`` mean over the passes of the Dice between the pass's class and the average's; NaN for a class
        that neither any pass nor the average draws."""
        total = self.pass_voxels + self.average_voxels
        drawn = total > 0  # all passes when the average draws the class; else the passes that draw it
        per_pass = np.divide(2.0 * self.shared, total, out=np.zeros_like(total), where=drawn)
        counted = drawn.sum(axis=0)
        return np.divide(per_pass.sum(axis=0), counted, out=np.full(self.num_classes, np.nan), where=counted > 0)


def _argmax_classes(logits: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``(n, M, *spatial)`` uint8 index of the largest of each member's C = ``num_classes`` logits in
    ``(n, M × C, *spatial)`` (M = 1: one network), the first where tied. ``max`` rather than ``argmax``: on the CPU,
    torch's argmax over the class axis of this layout is about ten times slower."""
    return logits.unflatten(1, (-1, num_classes)).max(dim=2).indices.to(torch.uint8)


def window_logits(model: nn.Module, images: torch.Tensor, settings: SlidingWindow,
                  agreement: MirrorAgreement | None = None) -> torch.Tensor:
    """Blended logits ``(n, C, *spatial)`` of ``images (n, K, *spatial)`` (any size, at the model's spacing; spatial
    ``(y, x)`` slices or ``(z, y, x)`` volumes, as the window).

    Slices (volumes) smaller than the window are zero-padded for the network and cropped back, so
    every output voxel comes from a full-size window. ``agreement``, when given, counts this batch's passes.
    """

    def blended(batch: torch.Tensor) -> torch.Tensor:
        return sliding_window_inference(
            batch, roi_size=settings.patch_size, sw_batch_size=settings.batch_size, predictor=model,
            overlap=settings.overlap, mode="gaussian", padding_mode="constant", cval=0.0,
        )

    # Every subset of the mirror axes, the empty one (no flip) included.
    flips = [dims for count in range(len(settings.mirror_axes) + 1)
             for dims in itertools.combinations([axis + 2 for axis in settings.mirror_axes], count)]
    total, pass_labels = None, []
    for dims in flips:
        logits = blended(images.flip(dims) if dims else images).float()
        logits = logits.flip(dims) if dims else logits
        if agreement is not None:  # a byte per voxel and pass, not the pass's logits
            pass_labels.append(_argmax_classes(logits, agreement.num_classes))
        total = logits if total is None else total + logits
    average = total / len(flips)
    if agreement is not None:
        agreement.add(pass_labels, _argmax_classes(average, agreement.num_classes))
    return average
