"""DICOM series in: the series of a folder found, checked and read with SimpleITK's series reader.

A folder given where an image file would be is read as DICOM: every file under it (subfolders included) that
starts like a DICOM file (the ``DICM`` marker after the 128-byte preamble) is read up to its pixel data with
pydicom and grouped by its Series Instance UID into a :class:`DicomSeries`. A series is a volume when it is a
stack of single-frame images that a voxel grid can hold; otherwise its ``problem`` says why not, as a clause
that ends with what to do:

- not images (a Segmentation, a structured report, ...), or multi-frame (enhanced) objects;
- images without a position, orientation or pixel spacing (a screenshot), or one image alone;
- images of several sizes, pixel spacings or orientations (a localizer among the slices);
- several images at one position (the time points of a cine, echoes), missing slices (a gap that is a whole
  number of steps), uneven spacing, or slices shifted in-plane from one to the next (a tilted gantry).

Positions are compared along the slice normal, the cross product of ImageOrientationPatient's row and column
directions, to within :data:`POSITION_TOLERANCE` of a step. The images of a volume are sorted along that
normal, and SimpleITK's ``ImageSeriesReader`` (GDCM) reads them in that order: geometry from the files (the
first slice's position, the pixel spacing, the row, column and stacking directions), and each file's Rescale
Slope and Intercept applied, so a CT is in Hounsfield units. The voxels are read as float32, since the slope
may differ from slice to slice (an integer type taken from the first slice would drop the fractions of the
others).

Arrays are ``(z, y, x)``: z along the sorted slices, y down the rows, x along them; the
:class:`~CalibSegLib.io.ImageGeometry` holds spacing ``(z, y, x)`` in mm and origin and direction in DICOM's
(and SimpleITK's) LPS patient coordinates, so outputs written with it lie on the series' grid.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pydicom
import SimpleITK as sitk
from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError
from pydicom.misc import is_dicom
from pydicom.uid import UID

from CalibSegLib.io import ImageGeometry, os_error_sentence

__all__ = ["POSITION_TOLERANCE", "DicomSeries", "find_series", "choose_series", "read_series",
           "read_dicom_folder", "series_case_names", "series_headers"]

# Slice positions agree when they differ by less than this share of a step (or 0.01 mm), so the rounding of
# positions written as decimal strings (DS, 16 characters) never reads as uneven spacing.
POSITION_TOLERANCE = 0.01
_MINIMUM_TOLERANCE_MM = 0.01
# Row and column direction cosines of one orientation agree to this much.
_ORIENTATION_TOLERANCE = 1e-3
_MEDIA_DIRECTORY = "1.2.840.10008.1.3.10"  # DICOMDIR: an index of the files, not an object to segment
# ITK names the reader's class and its address in memory, no help to a user.
_ITK_PREFIX = re.compile(r"ITK ERROR: \w+\(0x[0-9a-fA-F]+\):")
_GEOMETRY = ("ImagePositionPatient", "ImageOrientationPatient", "PixelSpacing", "Rows", "Columns")


@dataclass(frozen=True)
class DicomSeries:
    """The files of one series in a folder.

    ``files``: an image series' files sorted along the slice normal (the volume's z axis, first slice first);
    ``kind``: the SOP class's name (``MR Image Storage``); ``problem``: why the series is no volume (a clause
    ending with what to do), None when :func:`read_series` can read it.
    """

    uid: str
    files: tuple[Path, ...]
    number: int | None
    description: str
    kind: str
    problem: str | None = None

    @property
    def is_image(self) -> bool:
        """True for a series of images (readable or not), False for other objects (SEG, SR, ...)."""
        return self.kind.endswith("Image Storage")

    @property
    def label(self) -> str:
        """How sentences name it: ``series 3 'SA cine' (12 MR Image Storage files, UID 1.2.3)``."""
        number = f" {self.number}" if self.number is not None else ""
        description = f" '{self.description}'" if self.description else ""
        return f"series{number}{description} ({len(self.files)} {self.kind} file(s), UID {self.uid})"


def _headers(folder: Path) -> tuple[list[tuple[Path, Dataset]], list[str]]:
    """Every DICOM file under ``folder`` read up to its pixel data, sorted by path, and the unreadable ones
    (``name (reason)``)."""
    headers, unreadable = [], []
    for root, folders, files in os.walk(folder):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        for name in sorted(files):
            path = Path(root) / name
            if name.startswith(".") or not path.is_file():
                continue
            try:
                if not is_dicom(path):
                    continue
                header = pydicom.dcmread(path, stop_before_pixels=True)
            except OSError as error:
                unreadable.append(f"{path.relative_to(folder)} ({os_error_sentence(error).rstrip('.')})")
                continue
            except (InvalidDicomError, ValueError, EOFError, KeyError, TypeError, AttributeError) as error:
                # pydicom raises all of these on damaged files
                unreadable.append(f"{path.relative_to(folder)} ({type(error).__name__}: {error})")
                continue
            if header.get("SOPClassUID", header.file_meta.get("MediaStorageSOPClassUID")) != _MEDIA_DIRECTORY:
                headers.append((path, header))
    return headers, unreadable


def _vector(header: Dataset, keyword: str) -> np.ndarray:
    return np.array([float(value) for value in header.get(keyword)], dtype=np.float64)


def _stack_problem(headers: Sequence[Dataset]) -> str | None:
    """Why single-frame images of one size and orientation are no evenly spaced stack, or None."""
    orientation = _vector(headers[0], "ImageOrientationPatient")
    normal = np.cross(orientation[:3], orientation[3:])
    positions = np.array([_vector(header, "ImagePositionPatient") for header in headers])
    positions = positions[np.argsort(positions @ normal, kind="stable")]
    along = positions @ normal
    steps = np.diff(along)
    tolerance = max(_MINIMUM_TOLERANCE_MM, POSITION_TOLERANCE * float(np.max(steps, initial=0.0)))
    distinct = 1 + int(np.sum(steps > tolerance))
    if distinct < len(headers):
        return (f"holds {len(headers)} images at {distinct} slice position(s) (several images at one "
                "position: the time points of a cine, echoes or repeats); export one image per position, "
                "e.g. one time point, as a series of its own")
    pixel = float(min(_vector(headers[0], "PixelSpacing")))
    in_plane = positions - positions[0] - np.outer(along - along[0], normal)
    shift = float(np.max(np.linalg.norm(in_plane, axis=1)))
    if shift > max(_MINIMUM_TOLERANCE_MM, POSITION_TOLERANCE * pixel):
        return ("has slices shifted in-plane from one to the next (a tilted CT gantry or a sheared stack), "
                "which a voxel grid cannot hold; resample it onto an orthogonal grid first")
    step = float(np.min(steps))
    tolerance = max(_MINIMUM_TOLERANCE_MM, POSITION_TOLERANCE * step)
    if float(np.max(steps)) - step <= tolerance:
        return None
    multiples = np.rint(steps / step)
    if np.all(np.abs(steps - multiples * step) <= tolerance):
        gap = int(np.argmax(multiples))
        return (f"has {int(np.sum(multiples - 1))} slice(s) missing: its slices are {step:g} mm apart but "
                f"{steps[gap]:g} mm between slices {gap + 1} and {gap + 2}; export the complete series")
    return (f"has uneven slice spacing (steps from {step:g} to {float(np.max(steps)):g} mm along the slice "
            "normal), which a voxel grid cannot hold; resample it onto even slices first")


def _sorted_along_normal(files: list[Path], headers: list[Dataset]) -> tuple[list[Path], list[Dataset]]:
    orientation = _vector(headers[0], "ImageOrientationPatient")
    normal = np.cross(orientation[:3], orientation[3:])
    order = np.argsort([float(_vector(header, "ImagePositionPatient") @ normal) for header in headers],
                       kind="stable")
    return [files[index] for index in order], [headers[index] for index in order]


def _image_problem(headers: Sequence[Dataset]) -> str | None:
    """Why the images of one series are no volume, or None (see the module docstring)."""
    frames = max(int(header.get("NumberOfFrames", 1) or 1) for header in headers)
    if frames > 1:
        return ("is a multi-frame (enhanced) object, which CalibSeg does not read; export the series as "
                "single-frame images (one file per slice)")
    if any(header.get(keyword) is None for header in headers for keyword in _GEOMETRY):
        return ("lacks the position, orientation or pixel spacing of its images (a screenshot or secondary "
                "capture?), so its voxel grid is unknown; give the acquired series")
    if len(headers) < 2:
        return "is one image, not a stack of slices; give a series of two or more slices"
    sizes = sorted({(int(header.Rows), int(header.Columns)) for header in headers})
    if len(sizes) > 1:
        listed = ", ".join(f"{rows}×{columns}" for rows, columns in sizes)
        return f"holds images of {len(sizes)} sizes ({listed}); export one size per series"
    spacings = {tuple(np.round(_vector(header, "PixelSpacing"), 4)) for header in headers}
    if len(spacings) > 1:
        return f"holds images of {len(spacings)} pixel spacings; export one spacing per series"
    orientations: list[np.ndarray] = []
    for header in headers:
        orientation = _vector(header, "ImageOrientationPatient")
        if not any(np.allclose(orientation, seen, atol=_ORIENTATION_TOLERANCE) for seen in orientations):
            orientations.append(orientation)
    if len(orientations) > 1:
        return (f"holds images in {len(orientations)} orientations (ImageOrientationPatient differs, e.g. a "
                "localizer among the slices); export one orientation per series")
    return _stack_problem(headers)


def _series(uid: str, entries: list[tuple[Path, Dataset]]) -> DicomSeries:
    files = [path for path, _ in entries]
    headers = [header for _, header in entries]
    kinds = Counter(UID(str(header.get("SOPClassUID", ""))).name or "unknown" for header in headers)
    kind = kinds.most_common(1)[0][0]
    number = headers[0].get("SeriesNumber")
    description = str(headers[0].get("SeriesDescription", "") or "").strip()
    if not all(name.endswith("Image Storage") for name in kinds):
        others = ", ".join(f"{count} {name}" for name, count in kinds.items()
                           if not name.endswith("Image Storage"))
        problem = (f"holds objects that are not images ({others}); give a folder of an image series, or "
                   "choose an image series with --series-uid")
    else:
        problem = _image_problem(headers)
        if problem is None:
            files, headers = _sorted_along_normal(files, headers)
    number = int(number) if number not in (None, "") else None
    return DicomSeries(uid, tuple(files), number, description, kind, problem)


def find_series(folder: str | Path) -> list[DicomSeries]:
    """Every series of the DICOM files under ``folder``, in the order their first file sorts (none when it
    holds no DICOM file).

    Raises:
        ValueError: ``folder`` is no folder, or holds a DICOM file that cannot be read.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"No folder at {folder}; give a folder of one DICOM series or an image file.")
    headers, unreadable = _headers(folder)
    if unreadable:
        raise ValueError(f"{folder} holds {len(unreadable)} DICOM file(s) that cannot be read (first: "
                         f"{unreadable[0]}); remove them or export the series again.")
    grouped: dict[str, list[tuple[Path, Dataset]]] = {}
    for path, header in headers:
        grouped.setdefault(str(header.get("SeriesInstanceUID", "") or "no Series Instance UID"), []).append(
            (path, header))
    return [_series(uid, entries) for uid, entries in grouped.items()]


def choose_series(series: Sequence[DicomSeries], folder: str | Path, series_uid: str | None = None
                  ) -> DicomSeries:
    """The series of ``folder`` to segment: the one ``series_uid`` names, else its only image series.

    Raises:
        ValueError: no series; ``series_uid`` names none of them; several image series and no
            ``series_uid`` (the sentence lists them).
    """
    if not series:
        raise ValueError(f"{folder} holds no DICOM file (none starts with the DICM marker); give a folder of "
                         "one DICOM series or an image file.")
    listed = "; ".join(entry.label for entry in series)
    if series_uid is not None:
        chosen = [entry for entry in series if entry.uid == series_uid]
        if not chosen:
            raise ValueError(f"{folder} holds no series with UID {series_uid}; its series: {listed}.")
        return chosen[0]
    images = [entry for entry in series if entry.is_image]
    if len(images) > 1:
        labels = "; ".join(entry.label for entry in images)
        raise ValueError(f"{folder} holds {len(images)} image series ({labels}); choose one with "
                         "--series-uid.")
    return (images or list(series))[0]


def series_headers(series: DicomSeries) -> list[Dataset]:
    """The headers (everything but the pixel data) of ``series``' files, in its order."""
    return [pydicom.dcmread(path, stop_before_pixels=True) for path in series.files]


def read_series(series: DicomSeries) -> tuple[np.ndarray, ImageGeometry]:
    """The ``(z, y, x)`` float32 volume of an image series (each file's rescale applied) and its grid.

    Raises:
        ValueError: the series is no volume (its :attr:`DicomSeries.problem`), its pixel data cannot be
            decoded, or it holds NaN/infinite values.
    """
    if series.problem is not None:
        raise ValueError(f"The DICOM {series.label} {series.problem}.")
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames([str(path) for path in series.files])
    reader.SetOutputPixelType(sitk.sitkFloat32)
    try:
        image = reader.Execute()
    except RuntimeError as error:
        reason = (str(error).strip().splitlines() or ["unknown error"])[-1]
        reason = _ITK_PREFIX.sub("", reason.replace("sitk::ERROR:", "")).strip().rstrip(".")
        raise ValueError(f"Cannot read the pixel data of the DICOM {series.label} ({reason}: a file cut "
                         "short, or a compression GDCM cannot decode); export the series again.") from None
    array = sitk.GetArrayFromImage(image)
    if not np.isfinite(array).all():
        raise ValueError(f"The DICOM {series.label} holds NaN or infinite values after its rescale; check "
                         "its Rescale Slope and Intercept.")
    geometry = ImageGeometry.from_sitk(image)
    if not all(math.isfinite(value) and value > 0 for value in geometry.spacing):
        spacing = " × ".join(f"{value:g}" for value in geometry.spacing)
        raise ValueError(f"The DICOM {series.label} gives a voxel spacing of {spacing} mm, which is not "
                         "positive; check its Pixel Spacing.")
    return array, geometry


def read_dicom_folder(folder: str | Path, series_uid: str | None = None
                      ) -> tuple[np.ndarray, ImageGeometry, DicomSeries]:
    """The volume of the one image series in ``folder`` (or the one ``series_uid`` names), its grid and the
    series.

    Raises:
        ValueError: see :func:`find_series`, :func:`choose_series` and :func:`read_series`.
    """
    series = choose_series(find_series(folder), folder, series_uid)
    return (*read_series(series), series)


def series_case_names(series: Sequence[DicomSeries], root: str | Path) -> list[str]:
    """A case name per series of the folder ``root``: the folder holding its files when that folder holds no
    other series (``root``'s own name for files directly in it), else that name and ``_series<number>``; a
    name that would still repeat ends in the last digits of the series' UID."""
    root = Path(root)
    folders = [Path(os.path.commonpath([str(path.parent) for path in entry.files])) for entry in series]
    shared = Counter(folders)
    names = []
    for entry, folder in zip(series, folders):
        name = folder.name if folder != root else root.name
        if shared[folder] > 1:
            name += f"_series{entry.number if entry.number is not None else ''}"
        names.append(name)
    repeated = Counter(names)
    return [f"{name}_{entry.uid.replace('.', '')[-8:]}" if repeated[name] > 1 else name
            for name, entry in zip(names, series)]
