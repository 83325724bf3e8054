"""Pictures of a case's worst slices: the image in grey, the uncertainty hot spots in colour, the predicted
structures as outlines, as PNG bytes for the QC report (:mod:`CalibSegLib.report`).

The layers are those of the Slicer module's slice views: the image windowed at its 1st and 99th percentile;
the normalised entropy shown only where it is at least the hot-spot level, coloured with inferno from that
level (dark purple) to 1 (light yellow) and blended at :data:`HOT_SPOT_OPACITY`; each structure's outline
(:data:`OUTLINE_PX` pixels inside its border, drawn at the picture's resolution) in the bundle's colour. A
picture is resampled to square pixels of the physical aspect (mm) and cropped around the predicted structures
of the whole case (:data:`CROP_ZOOM` times their extent), so every picture of a case shows the same field of
view.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.image import imsave
from scipy import ndimage

__all__ = ["HOT_SPOT_OPACITY", "PICTURE_PX", "CROP_ZOOM", "SlicePicture", "hot_spot_colors", "picture_slices",
           "slice_picture", "case_pictures"]

HOT_SPOT_OPACITY = 0.6
PICTURE_PX = 220  # the longer side of a picture
CROP_ZOOM = 2.0   # field of view: twice the predicted structures' extent, so the tissue around them shows
OUTLINE_PX = 2
_HOT_SPOT_MAP = "inferno"


@dataclass(frozen=True)
class SlicePicture:
    """One slice's picture: its index along the slice axis, its hot-spot voxel count and the PNG bytes."""

    index: int
    hot_spots: int
    png: bytes


def hot_spot_colors(count: int) -> np.ndarray:
    """``(count, 3)`` RGB in [0, 1] of the hot-spot colour scale, from the hot-spot level to entropy 1."""
    return colormaps[_HOT_SPOT_MAP](np.linspace(0.0, 1.0, count))[:, :3]


def picture_slices(summary: dict[str, Any], labels: np.ndarray, count: int) -> list[int]:
    """The ``count`` slices to show: the summary's most uncertain first, then those with the most predicted
    structure voxels; the middle slice when nothing is predicted or uncertain. ``labels``: ``(z, y, x)`` with
    z the slice axis."""
    chosen = [int(index) for index in summary.get("uncertain_slices", [])][:count]
    foreground = (labels > 0).reshape(labels.shape[0], -1).sum(axis=1)
    for index in np.argsort(-foreground, kind="stable"):
        if len(chosen) >= count or foreground[index] == 0:
            break
        if int(index) not in chosen:
            chosen.append(int(index))
    return chosen or [labels.shape[0] // 2]


def _crop(labels: np.ndarray) -> tuple[slice, slice]:
    """The in-plane ``(y, x)`` box around the predicted structures of every slice, :data:`CROP_ZOOM` times
    their extent (square in voxels when they are square), inside the slice; the whole slice without
    structures."""
    found = np.argwhere((labels > 0).any(axis=0))
    if found.size == 0:
        return slice(None), slice(None)
    low, high = found.min(axis=0), found.max(axis=0) + 1
    half = CROP_ZOOM * (high - low).max() / 2
    centre = (low + high) / 2
    box = []
    for axis, size in enumerate(labels.shape[1:]):
        start = int(max(np.floor(centre[axis] - half), 0))
        box.append(slice(start, int(min(np.ceil(centre[axis] + half), size))))
    return box[0], box[1]


def slice_picture(image: np.ndarray, labels: np.ndarray, entropy: np.ndarray, spacing: Sequence[float],
                  window: tuple[float, float], class_colors: Sequence[Sequence[float]], hot_spot_level: float,
                  size: int = PICTURE_PX) -> np.ndarray:
    """The ``(h, w, 3)`` uint8 RGB picture of one slice.

    ``image``, ``labels``, ``entropy``: ``(y, x)``; ``spacing``: ``(y, x)`` mm; ``window``: the intensities
    shown black and white; ``class_colors``: RGB in [0, 1] per class (0, the background, is not drawn).
    """
    extent = np.array(image.shape) * np.asarray(spacing, dtype=np.float64)
    shape = np.maximum(np.rint(extent / extent.max() * size), 1).astype(int)
    zoom = shape / np.array(image.shape)
    low, high = window
    resampled = ndimage.zoom(image.astype(np.float32), zoom, order=1)
    grey = np.clip((resampled - low) / max(high - low, 1e-12), 0, 1)
    picture = np.repeat(grey[..., None], 3, axis=2)
    uncertainty = ndimage.zoom(entropy.astype(np.float32), zoom, order=1)
    hot = uncertainty >= hot_spot_level
    if hot.any():
        scale = np.clip((uncertainty[hot] - hot_spot_level) / max(1.0 - hot_spot_level, 1e-12), 0, 1)
        colors = colormaps[_HOT_SPOT_MAP](scale)[:, :3]
        picture[hot] = (1 - HOT_SPOT_OPACITY) * picture[hot] + HOT_SPOT_OPACITY * colors
    classes = ndimage.zoom(labels.astype(np.int16), zoom, order=0)
    for label in np.unique(classes):
        if label == 0:
            continue
        mask = classes == label
        outline = mask & ~ndimage.binary_erosion(mask, iterations=OUTLINE_PX, border_value=0)
        picture[outline] = class_colors[int(label)][:3]
    return (np.clip(picture, 0, 1) * 255).round().astype(np.uint8)


def _png(picture: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    imsave(buffer, picture, format="png")
    return buffer.getvalue()


def case_pictures(image: np.ndarray, labels: np.ndarray, entropy: np.ndarray, spacing: Sequence[float],
                  summary: dict[str, Any], class_colors: Sequence[Sequence[float]], count: int = 3
                  ) -> list[SlicePicture]:
    """The pictures of a case's ``count`` worst slices (:func:`picture_slices`).

    ``image``: ``(z, y, x)``, or ``(K, z, y, x)`` of which channel 0 is shown; ``labels``, ``entropy``:
    ``(z, y, x)``; ``spacing``: ``(z, y, x)`` mm; ``summary``: the case's quality summary (its ``slice_axis``,
    ``uncertain_slices`` and ``hot_spot_level``).
    """
    axis = int(summary.get("slice_axis", 0))
    level = float(summary.get("hot_spot_level", 0.4))
    shown = image[0] if image.ndim == 4 else image
    shown, labels, entropy = (np.moveaxis(np.asarray(array), axis, 0) for array in (shown, labels, entropy))
    in_plane = [value for index, value in enumerate(spacing) if index != axis]
    window = tuple(float(value) for value in np.percentile(shown, (1, 99)))
    rows, columns = _crop(labels)
    pictures = []
    for index in picture_slices(summary, labels, count):
        picture = slice_picture(shown[index, rows, columns], labels[index, rows, columns],
                                entropy[index, rows, columns], in_plane, window, class_colors, level)
        pictures.append(SlicePicture(index, int((entropy[index] >= level).sum()), _png(picture)))
    return pictures
