"""Images with their geometry through SimpleITK (NIfTI, NRRD, MHA): read, written, named.

Arrays are ``(z, y, x)``; :class:`ImageGeometry` keeps spacing in the same ``(z, y, x)``
order (mm) and origin/direction in SimpleITK's physical ``(x, y, z)`` LPS convention, so an
output written with the input's geometry lands on exactly the input's grid.

Reading refuses NaN and infinite voxels whatever the format, and a header that disagrees with its data
before any voxel is allocated (:mod:`CalibSegLib.io.image_checks` says what ITK's readers would hide).
Writing is atomic (:mod:`CalibSegLib.io.outputs`) and checks what was written before the file may replace
anything: ITK's NIfTI writer only prints a warning when the disk fills, leaving a truncated file behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import SimpleITK as sitk

from CalibSegLib.io.image_checks import header_problem, itk_reason, nifti_problem, written_problem
from CalibSegLib.io.outputs import atomic_output, destination_name, os_error_sentence

__all__ = ["IMAGE_SUFFIXES", "WRITE_SUFFIXES", "ImageGeometry", "ImageDimensionError", "read_image", "read_channels",
           "write_image", "image_from_array", "image_stem"]

IMAGE_SUFFIXES: tuple[str, ...] = (".nii.gz", ".nii", ".nrrd", ".nhdr", ".mha", ".mhd")
# Single-file formats only: a detached header (.mhd, .nhdr) names its data file, which a rename would break.
# Training data folders hold image/label pairs in these formats too (Datasets/layouts.py).
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


class ImageDimensionError(ValueError):
    """An image file is not of the dimension asked for; ``found`` is the dimension its header declares."""

    def __init__(self, message: str, found: int) -> None:
        super().__init__(message)
        self.found = found


def read_image(path: str | Path, dimension: int = 3) -> tuple[np.ndarray, ImageGeometry]:
    """Read a scalar 3D image, or with ``dimension=4`` a scalar 4D one (a cine: ``(t, z, y, x)``).

    Both go through the same checks before any voxel is allocated (:mod:`CalibSegLib.io.image_checks`: the
    header against the file's size, the spatial spacing positive, finite and plausible, the voxels within the
    memory bound) and after (no NaN or infinite voxel).

    Returns:
        The ``(z, y, x)`` voxel array (``(t, z, y, x)`` for 4D) and the :class:`ImageGeometry` of its 3D grid.

    Raises:
        ImageDimensionError: the file is a scalar image of another dimension (one sentence).
        ValueError: the file is missing, unreadable, not single-component, or stores NaN/infinite voxels
            (also where the format's reader would have hidden them).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"No image file at {path}; check the path.")
    wanted = "a 3D volume" if dimension == 3 else "a scalar 4D image (t, z, y, x)"
    # The NIfTI check reads the stored header and voxels, which nifticlib changes while reading
    # (0 → 1, NaN → 0, ...), before ITK sees them (and prints its own warnings about them); the
    # header check bounds what any format's header may claim.
    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    try:
        problem = nifti_problem(path)
        if not problem:
            reader.ReadImageInformation()  # the header only: nothing is allocated before it is checked
            if reader.GetDimension() != dimension:
                raise ImageDimensionError(f"{path.name} is a {reader.GetDimension()}D image; CalibSeg needs "
                                          f"{wanted}.", reader.GetDimension())
            if reader.GetNumberOfComponents() != 1:
                raise ValueError(
                    f"{path.name} has {reader.GetNumberOfComponents()} components per voxel; give a scalar "
                    "volume."
                )
            problem = header_problem(path, reader)
        if problem:
            raise ValueError(f"{path.name} {problem}; fix or re-export the file before segmenting.")
        image = reader.Execute()
    except (RuntimeError, OSError) as error:  # OSError: a data file the checks could not open
        reason = (os_error_sentence(error).rstrip(".") if isinstance(error, OSError)
                  else itk_reason(error, path))
        raise ValueError(
            f"Cannot read {path.name} as an image ({reason}); give a NIfTI, NRRD or MHA file."
        ) from None
    array = sitk.GetArrayFromImage(image)
    # Catches NaN/inf in NRRD/MHA and NIfTI scaling that overflows float32.
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ValueError(
            f"{path.name} holds NaN or infinite voxel values; fix the file (or mask those voxels) before "
            "segmenting."
        )
    if dimension == 3:
        return array, ImageGeometry.from_sitk(image)
    direction = np.asarray(image.GetDirection()).reshape(dimension, dimension)[:3, :3]
    return array, ImageGeometry(tuple(float(value) for value in reversed(image.GetSpacing()[:3])),
                                tuple(float(value) for value in image.GetOrigin()[:3]),
                                tuple(float(value) for value in direction.ravel()))


def read_channels(paths: "list[Path] | tuple[Path, ...]") -> tuple[np.ndarray, ImageGeometry]:
    """Read one file per channel (channel 0 first): ``(z, y, x)`` for one, ``(K, z, y, x)`` for several, and
    the grid they share.

    Raises:
        ValueError: a file :func:`read_image` refuses, or a channel on another grid than the first (one
            sentence naming both files).
    """
    channels = [read_image(path) for path in paths]
    image, geometry = channels[0]
    for path, (other, other_geometry) in zip(paths[1:], channels[1:]):
        if other.shape != image.shape or not other_geometry.matches(geometry):
            raise ValueError(f"{Path(path).name} is not on {Path(paths[0]).name}'s grid (shape "
                             f"{other.shape} vs {image.shape}, or another spacing, origin or direction); "
                             "every channel of a case must share one grid.")
    if len(channels) == 1:
        return image, geometry
    return np.stack([values for values, _ in channels]), geometry


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


def write_image(path: str | Path, array: np.ndarray, geometry: ImageGeometry) -> Path:
    """Write a ``(z, y, x)`` array on ``geometry`` to ``path`` (format from the extension), atomically.

    Raises:
        ValueError: the extension is not one of :data:`WRITE_SUFFIXES`, the array is not 3D, or
            the folder cannot be written.
        OSError: writing failed (e.g. the disk is full), with ITK's reason in one sentence; the
            previous file at ``path`` is kept.
    """
    path = Path(path)
    if not path.name.lower().endswith(WRITE_SUFFIXES):
        raise ValueError(
            f"Cannot write {path.name}: give it one of the extensions {', '.join(WRITE_SUFFIXES)}."
        )
    image = image_from_array(array, geometry)
    with atomic_output(path) as temporary:
        try:
            sitk.WriteImage(image, str(temporary), useCompression=True)
            problem = written_problem(temporary, image)
        except RuntimeError as error:
            problem = f"({itk_reason(error, temporary)})"
        if problem:
            raise OSError(f"Cannot write {destination_name(path)} {problem}; check the free space and "
                          f"permissions of {path.parent}.")
    return path
