"""Image IO with geometry through SimpleITK (NIfTI, NRRD, MHA), and atomic file writes.

Arrays are ``(z, y, x)``; :class:`ImageGeometry` keeps spacing in the same ``(z, y, x)``
order (mm) and origin/direction in SimpleITK's physical ``(x, y, z)`` LPS convention, so an
output written with the input's geometry lands on exactly the input's grid.

Every write goes to a temporary file beside the destination and is renamed over it, so a
crash or an error never leaves a half-written file under the final name.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import SimpleITK as sitk

__all__ = [
    "IMAGE_SUFFIXES",
    "WRITE_SUFFIXES",
    "ImageGeometry",
    "read_image",
    "write_image",
    "image_from_array",
    "image_stem",
    "atomic_output",
    "write_json_atomic",
]

IMAGE_SUFFIXES: tuple[str, ...] = (".nii.gz", ".nii", ".nrrd", ".nhdr", ".mha", ".mhd")
# Single-file formats only: a detached header (.mhd, .nhdr) names its data file, which a rename would break.
WRITE_SUFFIXES: tuple[str, ...] = (".nii.gz", ".nii", ".nrrd", ".mha")

# SimpleITK has no bool or float16 pixel types; these are written as the nearest type it has.
_WRITABLE_DTYPES = {np.dtype(bool): np.uint8, np.dtype(np.float16): np.float32}


@dataclass(frozen=True)
class ImageGeometry:
    """Voxel grid of a 3D image.

    ``spacing``: ``(z, y, x)`` mm, the order of the array axes; ``origin``: ``(x, y, z)`` mm;
    ``direction``: row-major 3×3 direction cosines as SimpleITK gives them (9 numbers).
    """

    spacing: tuple[float, float, float]
    origin: tuple[float, float, float] = (0.0, 0.0, 0.0)
    direction: tuple[float, ...] = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)

    @classmethod
    def from_sitk(cls, image: sitk.Image) -> "ImageGeometry":
        """Geometry of a 3D SimpleITK image."""
        return cls(tuple(reversed(image.GetSpacing())), tuple(image.GetOrigin()), tuple(image.GetDirection()))

    def apply(self, image: sitk.Image) -> sitk.Image:
        """Place ``image`` on this grid (in place) and return it."""
        image.SetSpacing(tuple(float(value) for value in reversed(self.spacing)))
        image.SetOrigin(tuple(float(value) for value in self.origin))
        image.SetDirection(tuple(float(value) for value in self.direction))
        return image

    def matches(self, other: "ImageGeometry", tolerance: float = 1e-4) -> bool:
        """True when both grids have the same spacing, origin and direction (within ``tolerance`` mm)."""
        return all(
            np.allclose(mine, theirs, atol=tolerance, rtol=0.0)
            for mine, theirs in (
                (self.spacing, other.spacing),
                (self.origin, other.origin),
                (self.direction, other.direction),
            )
        )


def read_image(path: str | Path) -> tuple[np.ndarray, ImageGeometry]:
    """Read a scalar 3D image.

    Returns:
        The ``(z, y, x)`` voxel array and its :class:`ImageGeometry`.

    Raises:
        ValueError: the file is missing, unreadable, or not a single-component 3D image.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"No image file at {path}; check the path.")
    try:
        image = sitk.ReadImage(str(path))
    except RuntimeError as error:
        # ITK's message ends with one line naming the cause, prefixed and quoting the full path.
        reason = (str(error).strip().splitlines() or ["unknown format"])[-1]
        reason = reason.replace("sitk::ERROR:", "").replace(f' for "{path}"', "").strip()
        raise ValueError(
            f"Cannot read {path.name} as an image ({reason}); give a NIfTI, NRRD or MHA file."
        ) from None
    if image.GetDimension() != 3:
        raise ValueError(f"{path.name} is a {image.GetDimension()}D image; CalibSeg needs a 3D volume.")
    if image.GetNumberOfComponentsPerPixel() != 1:
        raise ValueError(
            f"{path.name} has {image.GetNumberOfComponentsPerPixel()} components per voxel; "
            "give a scalar volume."
        )
    return sitk.GetArrayFromImage(image), ImageGeometry.from_sitk(image)


def image_from_array(array: np.ndarray, geometry: ImageGeometry) -> sitk.Image:
    """A SimpleITK image of a ``(z, y, x)`` array placed on ``geometry`` (bool → uint8, float16 → float32)."""
    array = np.asarray(array)
    if array.ndim != 3:
        raise ValueError(f"Only (z, y, x) arrays can be written as images, got shape {array.shape}.")
    writable = _WRITABLE_DTYPES.get(array.dtype, array.dtype)
    return geometry.apply(sitk.GetImageFromArray(np.ascontiguousarray(array, dtype=writable)))


def image_stem(path: str | Path) -> str:
    """File name without its image extension (``case.nii.gz`` → ``case``)."""
    name = Path(path).name
    for suffix in IMAGE_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return Path(name).stem


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed over ``path``, on error removed.

    The temporary name keeps ``path``'s full extension (``.nii.gz``) so writers that choose a
    format by extension (SimpleITK) write the same format.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix="".join(path.suffixes), dir=path.parent
    )
    os.close(descriptor)
    try:
        yield Path(temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_image(path: str | Path, array: np.ndarray, geometry: ImageGeometry) -> Path:
    """Write a ``(z, y, x)`` array on ``geometry`` to ``path`` (format from the extension), atomically.

    Raises:
        ValueError: the extension is not one of :data:`WRITE_SUFFIXES` or the array is not 3D.
    """
    path = Path(path)
    if not path.name.lower().endswith(WRITE_SUFFIXES):
        raise ValueError(
            f"Cannot write {path.name}: give it one of the extensions {', '.join(WRITE_SUFFIXES)}."
        )
    image = image_from_array(array, geometry)
    with atomic_output(path) as temporary:
        sitk.WriteImage(image, str(temporary), useCompression=True)
    return path


def write_json_atomic(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` as indented JSON to ``path``, atomically (NaN is written as ``NaN``)."""
    path = Path(path)
    text = json.dumps(payload, indent=2, allow_nan=True)
    with atomic_output(path) as temporary:
        temporary.write_text(text)
    return path
