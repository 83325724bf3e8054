"""Image IO with geometry through SimpleITK (NIfTI, NRRD, MHA, ...).

Arrays are ``(z, y, x)``; :class:`ImageGeometry` keeps spacing in the same ``(z, y, x)``
order (mm) and origin/direction in SimpleITK's physical (x, y, z, LPS) convention, so an
output written with the input's geometry lands on exactly the input's grid.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import SimpleITK as sitk

__all__ = ["ImageGeometry", "read_image", "write_image", "image_from_array"]


@dataclass(frozen=True)
class ImageGeometry:
    """Voxel grid of a 3D image.

    ``spacing``: (z, y, x) mm; ``origin``: (x, y, z) mm; ``direction``: row-major 3×3
    cosines as SimpleITK gives them (9 numbers).
    """

    spacing: tuple[float, float, float]
    origin: tuple[float, float, float]
    direction: tuple[float, ...]

    @classmethod
    def from_sitk(cls, image: sitk.Image) -> "ImageGeometry":
        return cls(tuple(reversed(image.GetSpacing())), tuple(image.GetOrigin()), tuple(image.GetDirection()))

    def apply(self, image: sitk.Image) -> sitk.Image:
        image.SetSpacing(tuple(reversed(self.spacing)))
        image.SetOrigin(self.origin)
        image.SetDirection(self.direction)
        return image


def read_image(path: str | Path) -> tuple[np.ndarray, ImageGeometry]:
    """Read a 3D image; returns the ``(z, y, x)`` array and its geometry.

    Raises:
        ValueError: the file is missing, unreadable, or not a single-component 3D image.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"No image at {path}; check the path.")
    try:
        image = sitk.ReadImage(str(path))
    except RuntimeError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "unknown format"
        raise ValueError(f"Cannot read {path.name} as an image ({first_line}); use NIfTI, NRRD or MHA.") from None
    if image.GetDimension() != 3:
        raise ValueError(f"{path.name} is a {image.GetDimension()}D image; CalibSeg needs a 3D volume.")
    if image.GetNumberOfComponentsPerPixel() != 1:
        raise ValueError(f"{path.name} has {image.GetNumberOfComponentsPerPixel()} components per voxel; give a scalar volume.")
    return sitk.GetArrayFromImage(image), ImageGeometry.from_sitk(image)


def image_from_array(array: np.ndarray, geometry: ImageGeometry) -> sitk.Image:
    """A SimpleITK image of a ``(z, y, x)`` array placed on ``geometry``."""
    if array.ndim != 3:
        raise ValueError(f"expected a (z, y, x) array, got shape {array.shape}.")
    return geometry.apply(sitk.GetImageFromArray(np.ascontiguousarray(array)))


def write_image(path: str | Path, array: np.ndarray, geometry: ImageGeometry) -> Path:
    """Write ``array`` on ``geometry`` to ``path`` atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image = image_from_array(array, geometry)
    # Keep the full extension (".nii.gz") on the temporary name so SimpleITK picks the same writer.
    suffix = "".join(path.suffixes)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(descriptor)
    try:
        sitk.WriteImage(image, temporary, useCompression=True)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
