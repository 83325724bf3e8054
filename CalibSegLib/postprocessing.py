"""Post-processing of a predicted label volume, chosen on validation data and recorded in the bundle.

nnU-Net's rule: for each foreground class, keep only its largest 3D connected component
when, and only when, doing so raises that class's mean Dice over the validation volumes.
Post-processing changes the labels only; confidence and entropy stay the network's, so the
calibration metrics describe the network and the overlap metrics the delivered segmentation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import ndimage

__all__ = ["Postprocessing", "keep_largest_component", "choose_postprocessing"]


@dataclass
class Postprocessing:
    """``largest_component``: foreground class ids reduced to their largest 3D connected component."""

    largest_component: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.largest_component, list):  # as read back from JSON
            self.largest_component = tuple(self.largest_component)

    def validate(self) -> None:
        """Raise ``ValueError`` (one sentence) unless every class id is a distinct foreground class (>= 1)."""
        classes = self.largest_component
        if not isinstance(classes, (list, tuple)) or len(set(classes)) != len(classes) or not all(
            isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1 for value in classes
        ):
            raise ValueError(f"largest_component must list distinct foreground class ids (>= 1), got {classes!r}.")

    def apply(self, labels: np.ndarray) -> np.ndarray:
        """``labels (z, y, x)`` with the configured classes reduced to their largest component (in place)."""
        for class_id in self.largest_component:
            keep_largest_component(labels, class_id)
        return labels


def keep_largest_component(labels: np.ndarray, class_id: int) -> np.ndarray:
    """Set every voxel of ``class_id`` outside its largest connected component to background, in place.

    Components are 3D with face connectivity (6 neighbours), so slices far apart along a
    thick-slice axis join only through shared in-plane voxels. Ties keep the first component.
    """
    mask = labels == class_id
    components, count = ndimage.label(mask)
    if count > 1:
        sizes = np.bincount(components.ravel())
        sizes[0] = 0
        labels[mask & (components != int(sizes.argmax()))] = 0
    return labels


def choose_postprocessing(
    dice_without: Sequence[Sequence[float]], dice_with: Sequence[Sequence[float]]
) -> Postprocessing:
    """Classes whose mean validation Dice rises when only their largest component is kept.

    Args:
        dice_without: per validation volume, the ``(C - 1,)`` foreground Dice of the raw labels.
        dice_with: the same after keeping each class's largest component (each class alone).

    Returns:
        The :class:`Postprocessing` to record; a class whose Dice does not strictly improve is
        left untouched (nnU-Net's rule: post-process only what validation shows helps).
    """
    without = np.nanmean(np.asarray(dice_without, dtype=float), axis=0)
    with_ = np.nanmean(np.asarray(dice_with, dtype=float), axis=0)
    return Postprocessing(tuple(int(index + 1) for index in np.flatnonzero(with_ > without)))

