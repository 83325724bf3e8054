"""DICOM series in: the series of a folder found, checked and read, as one volume or as the phases of a cine.

A folder given where an image file would be is read as DICOM: every file under it (subfolders included) that
starts like a DICOM file (the ``DICM`` marker after the 128-byte preamble) is read up to its pixel data with
pydicom and grouped by its Series Instance UID into a :class:`DicomSeries`. Its images are the 2D images it
holds: each classic single-frame file (MR/CT Image Storage) is one, and so is each frame of one multi-frame
file (Enhanced MR Image Storage, 1.2.840.10008.5.1.4.1.1.4.1, and the other enhanced images), whose position,
orientation, pixel spacing, rescale and time come from its per-frame or shared functional groups
(PlanePositionSequence, PlaneOrientationSequence, PixelMeasuresSequence, PixelValueTransformationSequence,
FrameContentSequence, CardiacSynchronizationSequence).

**Slice positions and phases.** Positions are compared along the slice normal, the cross product of the row and
column directions, to within :data:`POSITION_TOLERANCE` of a step. A series holding one image per position is
a volume; one holding the same number T > 1 of images at every position is a cine of T phases (time points):
the images at each position are ordered by their time, the first of each position is phase 0, and so on. The
time is the first of these that every image has and that is not the same for all of them: the Trigger Time
(classic files) or the Nominal (else Actual) Cardiac Trigger Delay Time (enhanced frames), in ms after the R
wave; the Temporal Position Identifier (classic) or Temporal Position Index (enhanced; else the frame's dimension
index value of a temporal dimension); the Instance Number (classic files only: a frame's number says nothing of
its time). Where that time repeats at a position, the images there differ by something else (echoes, magnitude
and phase, repeats) and the series is no cine. The time and the Instance Numbers must agree: where the classic
files at a position all have an Instance Number and no two the same, ordering them by those numbers must give the
order by time, else which image is which time point is unknown (a phase could be built of slices hundreds of ms apart)
and the series is refused. A phase's trigger time is the mean over its slices (each position of a cine is often
acquired in its own breath-hold, so their trigger times differ by a few ms); where the time is the trigger time,
each image's, counted in steps between its own position's phases (each breath-hold has its own heart rate), must
lie nearer its own phase's mean than any other phase's, else a phase would mix time points and the series is
refused. There are no phase trigger times when the trigger times do not order the images.

Otherwise the series' ``problem`` says why it is neither, as a clause that ends with what to do:

- not images (a Segmentation, a structured report, ...), or multi-frame images without functional groups;
- images without a position, orientation or pixel spacing (a screenshot), or one image alone;
- a Pixel Spacing that is not positive and finite, or outside
  :data:`~CalibSegLib.io.image_checks.PLAUSIBLE_SPACING_MM` (0.001 to 100 mm, since volumes in mL are measured with
  it), or slice positions too far apart for their step to be finite;
- images of several sizes, pixel spacings or orientations (a localizer among the slices);
- several images at one position that are no cine (not the same number at every position: a phase lacking
  slices, or phases at other positions; several at one time: echoes, repeats), phases whose slices lie
  elsewhere than the first phase's, missing slices (a gap that is a whole number of steps), uneven spacing, or
  slices shifted in-plane from one to the next (a tilted gantry);
- a cine whose time and Instance Numbers order the images at a position differently, or whose phases mix
  trigger times (both above).

**Reading.** A phase's images are sorted along the normal. Classic files are read by SimpleITK's
``ImageSeriesReader`` (GDCM) in that order: geometry from the files (the first slice's position, the pixel
spacing, the row, column and stacking directions), and each file's Rescale Slope and Intercept applied, so a CT
is in Hounsfield units. A multi-frame file's pixel data is decoded by pydicom and each frame's rescale applied
here; its grid is built the way ITK builds a series' (origin the first slice's position, the slice spacing the
distance from the first slice to the last over their count less one, directions row, column, normal). The
voxels are float32, since the slope may differ from slice to slice (an integer type taken from the first slice
would drop the fractions of the others).

Arrays are ``(z, y, x)`` (a cine's ``(t, z, y, x)``): z along the sorted slices, y down the rows, x along them;
the :class:`~CalibSegLib.io.ImageGeometry` holds spacing ``(z, y, x)`` in mm and origin and direction in DICOM's
(and SimpleITK's) LPS patient coordinates, so outputs written with it lie on the series' grid.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pydicom
import SimpleITK as sitk
from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError
from pydicom.misc import is_dicom
from pydicom.tag import Tag
from pydicom.uid import UID

from CalibSegLib.io import ImageGeometry, os_error_sentence
from CalibSegLib.io.image_checks import PLAUSIBLE_SPACING_MM

__all__ = ["POSITION_TOLERANCE", "DicomSeries", "CineSeries", "SinglePhaseError", "find_series",
           "choose_series", "read_series", "read_dicom_folder", "read_cine_series", "series_case_names",
           "series_headers", "in_source_order"]

# Slice positions agree when they differ by less than this share of a step (or 0.01 mm), so the rounding of
# positions written as decimal strings (DS, 16 characters) never reads as uneven spacing.
POSITION_TOLERANCE = 0.01
_MINIMUM_TOLERANCE_MM = 0.01
# Row and column direction cosines of one orientation agree to this much.
_ORIENTATION_TOLERANCE = 1e-3
_MEDIA_DIRECTORY = "1.2.840.10008.1.3.10"  # DICOMDIR: an index of the files, not an object to segment
# ITK names the reader's class and its address in memory, no help to a user.
_ITK_PREFIX = re.compile(r"ITK ERROR: \w+\(0x[0-9a-fA-F]+\):")
# A multi-frame file's dimension that orders its frames in time, when its frames lack a Temporal Position Index.
_TEMPORAL_DIMENSIONS = (Tag("TemporalPositionIndex"), Tag("NominalCardiacTriggerDelayTime"))
# What orders the images at one position in time, first choice first (see the module docstring).
_TIME_KEYS = ("trigger_ms", "temporal_position", "order")


@dataclass(frozen=True)
class DicomSeries:
    """The files of one series in a folder.

    ``files``: an image series' files sorted along the slice normal (the volume's z axis, first slice first),
    phase by phase for a cine of classic files; the one file of a multi-frame series, whose ``frames`` are then
    the (0-based) frame numbers in that order (in the file's order where the series has a problem). ``kind``:
    the SOP class's name (``MR Image Storage``); ``problem``: why the series is neither a volume nor a cine (a
    clause ending with what to do), None when it is one; ``phases``: its number of time points (1 for a volume);
    ``trigger_times_ms``: each phase's trigger time in ms (the mean over its slices) where the images have trigger
    times that rise from phase to phase, else None.
    """

    uid: str
    files: tuple[Path, ...]
    number: int | None
    description: str
    kind: str
    problem: str | None = None
    phases: int = 1
    frames: tuple[int, ...] = ()
    trigger_times_ms: tuple[float, ...] | None = None

    @property
    def is_image(self) -> bool:
        """True for a series of images (readable or not), False for other objects (SEG, SR, ...)."""
        return self.kind.endswith("Image Storage")

    @property
    def slices(self) -> int:
        """The number of slices of each phase."""
        return len(self.frames or self.files) // self.phases

    @property
    def label(self) -> str:
        """How sentences name it: ``series 3 'SA cine' (12 MR Image Storage files, UID 1.2.3)``."""
        number = f" {self.number}" if self.number is not None else ""
        description = f" '{self.description}'" if self.description else ""
        frames = f" of {len(self.frames)} frames" if self.frames else ""
        return f"series{number}{description} ({len(self.files)} {self.kind} file(s){frames}, UID {self.uid})"

    @property
    def volume_problem(self) -> str | None:
        """Why the series is no single volume: its :attr:`problem`, or that it is a cine."""
        if self.problem is None and self.phases > 1:
            return (f"is a cine of {self.phases} time points at {self.slices} slice positions, and "
                    "calibseg-predict segments one volume; give it to calibseg-function --cine, or export one "
                    "time point as a series of its own")
        return self.problem


@dataclass(frozen=True)
class CineSeries:
    """A multi-phase cine read from DICOM (:func:`read_cine_series`).

    ``volumes``: ``(t, z, y, x)`` float32, each file's or frame's rescale applied, phases in time order, so
    ``volumes[t]`` is phase t's volume as :func:`read_series` returns a volume; ``geometry``: the grid every phase
    lies on; ``trigger_times_ms``: each phase's trigger time in ms after the R wave (the mean over its slices)
    where the images have trigger times that rise from phase to phase, else None; ``series``: where it was read
    from.
    """

    volumes: np.ndarray
    geometry: ImageGeometry
    trigger_times_ms: list[float] | None
    series: DicomSeries


class SinglePhaseError(ValueError):
    """A cine was asked for, and the series holds one time point: a volume, which the caller may take as one."""


@dataclass(frozen=True, eq=False)
class _Image:
    """One 2D image of a series: a single-frame file, or frame ``frame`` (0-based) of a multi-frame file.

    Geometry is None where the file lacks it; ``position`` ``(3,)`` and ``orientation`` ``(6,)`` in mm and
    direction cosines (LPS), ``pixel_spacing`` ``(row spacing, column spacing)`` mm (NaN and infinite values kept
    for :func:`_pixel_spacing_problem` to name); the times as in the module
    docstring (``order``: a classic file's Instance Number); ``slope``, ``intercept``: its rescale.
    """

    path: Path
    frame: int | None
    position: np.ndarray | None
    orientation: np.ndarray | None
    pixel_spacing: np.ndarray | None
    size: tuple[int, int]
    trigger_ms: float | None = None
    temporal_position: float | None = None
    order: float | None = None
    slope: float = 1.0
    intercept: float = 0.0


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


def _values(value: Any) -> list[Any]:
    """A DICOM value as a list: [] when absent or empty, one item for a single value."""
    if value is None or value == "":
        return []
    return list(value) if isinstance(value, (list, tuple, pydicom.multival.MultiValue)) else [value]


def _vector(value: Any, length: int, finite: bool = True) -> np.ndarray | None:
    """A multi-valued number (ImagePositionPatient, ...) as ``(length,)`` float64, or None when absent or
    malformed; ``finite=False`` keeps NaN and infinite values, for a check to name them."""
    try:
        numbers = np.array([float(item) for item in _values(value)], dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return numbers if numbers.shape == (length,) and (np.isfinite(numbers).all() or not finite) else None


def _number(value: Any) -> float | None:
    numbers = _vector(value, 1)
    return None if numbers is None else float(numbers[0])


def _single_frame_image(path: Path, header: Dataset) -> _Image:
    return _Image(path, None, _vector(header.get("ImagePositionPatient"), 3),
                  _vector(header.get("ImageOrientationPatient"), 6),
                  _vector(header.get("PixelSpacing"), 2, finite=False),
                  (int(header.get("Rows") or 0), int(header.get("Columns") or 0)),
                  trigger_ms=_number(header.get("TriggerTime")),
                  temporal_position=_number(header.get("TemporalPositionIdentifier")),
                  order=_number(header.get("InstanceNumber")))


def _group(frame_groups: Dataset, shared: Dataset | None, sequence: str) -> Dataset:
    """A frame's item of the functional group ``sequence``: its own, else the shared one, else an empty one."""
    for groups in (frame_groups, shared):
        items = groups.get(sequence) if groups is not None else None
        if items:
            return items[0]
    return Dataset()


def _multi_frame_images(path: Path, header: Dataset) -> list[_Image] | str:
    """The frames of a multi-frame file with functional groups, or why it has none (a clause)."""
    count = int(header.get("NumberOfFrames") or 1)
    per_frame = header.get("PerFrameFunctionalGroupsSequence")
    if per_frame is None or len(per_frame) != count:
        return ("holds multi-frame images without per-frame functional groups, so where each frame lies is "
                "unknown; export the series as single-frame images or as one Enhanced MR file")
    shared = (header.get("SharedFunctionalGroupsSequence") or [None])[0]
    pointers = [Tag(item.get("DimensionIndexPointer")) for item in header.get("DimensionIndexSequence") or []
                if item.get("DimensionIndexPointer") is not None]
    temporal_dimension = next((index for index, pointer in enumerate(pointers)
                               if pointer in _TEMPORAL_DIMENSIONS), None)
    rescale = (_number(header.get("RescaleSlope")), _number(header.get("RescaleIntercept")))
    images = []
    for frame, groups in enumerate(per_frame):
        content = _group(groups, shared, "FrameContentSequence")
        cardiac = _group(groups, shared, "CardiacSynchronizationSequence")
        transform = _group(groups, shared, "PixelValueTransformationSequence")
        temporal = _number(content.get("TemporalPositionIndex"))
        indices = _values(content.get("DimensionIndexValues"))
        if temporal is None and temporal_dimension is not None and len(indices) == len(pointers):
            temporal = float(indices[temporal_dimension])
        trigger = _number(cardiac.get("NominalCardiacTriggerDelayTime"))
        slope = _number(transform.get("RescaleSlope"))
        intercept = _number(transform.get("RescaleIntercept"))
        images.append(_Image(
            path, frame, _vector(_group(groups, shared, "PlanePositionSequence").get("ImagePositionPatient"), 3),
            _vector(_group(groups, shared, "PlaneOrientationSequence").get("ImageOrientationPatient"), 6),
            _vector(_group(groups, shared, "PixelMeasuresSequence").get("PixelSpacing"), 2, finite=False),
            (int(header.get("Rows") or 0), int(header.get("Columns") or 0)),
            trigger_ms=trigger if trigger is not None else _number(cardiac.get("ActualCardiacTriggerDelayTime")),
            temporal_position=temporal,
            slope=next(value for value in (slope, rescale[0], 1.0) if value is not None),
            intercept=next(value for value in (intercept, rescale[1], 0.0) if value is not None)))
    return images


def _file_images(entries: Sequence[tuple[Path, Dataset]]) -> list[_Image] | str:
    """The 2D images of a series' files, or why they cannot be placed (a clause)."""
    multi_frame = [(path, header) for path, header in entries if int(header.get("NumberOfFrames") or 1) > 1
                   or "PerFrameFunctionalGroupsSequence" in header]
    if not multi_frame:
        return [_single_frame_image(path, header) for path, header in entries]
    images = _multi_frame_images(*multi_frame[0])
    if isinstance(images, list) and len(entries) > 1:
        return (f"holds {len(entries)} files, {len(multi_frame)} of them multi-frame; export the series as one "
                "multi-frame file or as single-frame images")
    return images


def _normal(orientation: np.ndarray) -> np.ndarray:
    return np.cross(orientation[:3], orientation[3:])


def _stack_problem(positions: np.ndarray, normal: np.ndarray, pixel: float) -> str | None:
    """Why slices at ``positions`` ``(n, 3)`` (distinct, sorted along ``normal``) are no evenly spaced stack,
    or None; ``pixel``: the smaller pixel spacing (mm)."""
    along = positions @ normal
    steps = np.diff(along)
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


def _pixel_spacing_problem(images: Sequence[_Image]) -> str | None:
    """Why a Pixel Spacing of ``images`` cannot be a voxel grid's (not positive and finite, or outside
    :data:`PLAUSIBLE_SPACING_MM`), or None."""
    low, high = PLAUSIBLE_SPACING_MM
    for image in images:
        spacing = " × ".join(f"{value:g}" for value in image.pixel_spacing)
        if not all(math.isfinite(value) and value > 0 for value in image.pixel_spacing):
            return (f"gives a Pixel Spacing of {spacing} mm, which is not positive and finite, so its voxel grid "
                    "is unknown; fix the Pixel Spacing or export the series again")
        if not all(low <= value <= high for value in image.pixel_spacing):
            return (f"gives a Pixel Spacing of {spacing} mm, outside the {low:g} to {high:g} mm of any scanner's "
                    "images, and volumes in mL are measured with it; fix the Pixel Spacing or export the series "
                    "again")
    return None


def _grid_problem(images: Sequence[_Image]) -> str | None:
    """Why the images of one series share no grid (geometry missing, pixel spacings not a grid's, sizes,
    spacings, orientations), or None."""
    if any(image.position is None or image.orientation is None or image.pixel_spacing is None
           or 0 in image.size for image in images):
        return ("lacks the position, orientation or pixel spacing of its images (a screenshot or secondary "
                "capture?), so its voxel grid is unknown; give the acquired series")
    spacing_problem = _pixel_spacing_problem(images)
    if spacing_problem is not None:
        return spacing_problem
    if len(images) < 2:
        return "is one image, not a stack of slices; give a series of two or more slices"
    sizes = sorted({image.size for image in images})
    if len(sizes) > 1:
        listed = ", ".join(f"{rows}×{columns}" for rows, columns in sizes)
        return f"holds images of {len(sizes)} sizes ({listed}); export one size per series"
    spacings = {tuple(np.round(image.pixel_spacing, 4)) for image in images}
    if len(spacings) > 1:
        return f"holds images of {len(spacings)} pixel spacings; export one spacing per series"
    orientations: list[np.ndarray] = []
    for image in images:
        if not any(np.allclose(image.orientation, seen, atol=_ORIENTATION_TOLERANCE) for seen in orientations):
            orientations.append(image.orientation)
    if len(orientations) > 1:
        return (f"holds images in {len(orientations)} orientations (ImageOrientationPatient differs, e.g. a "
                "localizer among the slices); export one orientation per series")
    return None


def _at_positions(images: Sequence[_Image], normal: np.ndarray) -> list[list[_Image]]:
    """``images`` grouped by slice position, sorted along ``normal``: positions closer than the tolerance (a
    share of the largest step) are one."""
    ordered = sorted(images, key=lambda image: float(image.position @ normal))
    along = np.array([float(image.position @ normal) for image in ordered])
    steps = np.diff(along)
    tolerance = max(_MINIMUM_TOLERANCE_MM, POSITION_TOLERANCE * float(np.max(steps, initial=0.0)))
    groups = [[ordered[0]]]
    for image, step in zip(ordered[1:], steps):
        if step > tolerance:
            groups.append([])
        groups[-1].append(image)
    return groups


def _time_key(groups: Sequence[Sequence[_Image]]) -> str | None:
    """The first of :data:`_TIME_KEYS` that every image has and that is not the same for all, when it tells
    apart the images at each position; else None (see the module docstring)."""
    for key in _TIME_KEYS:
        times = [[getattr(image, key) for image in group] for group in groups]
        values = {value for group in times for value in group}
        if None in values or len(values) == 1:
            continue  # absent somewhere, or the same everywhere: it says nothing of time
        return key if all(len(set(group)) == len(group) for group in times) else None
    return None


def _step_problem(images: Sequence[_Image], normal: np.ndarray) -> str | None:
    """Why the slice spacing of ``images`` along ``normal`` could not be finite (positions too far apart for their
    difference to be a number), or None."""
    with np.errstate(over="ignore", invalid="ignore"):  # the overflow is what is checked
        along = np.array([image.position @ normal for image in images])
        span = float(np.max(along) - np.min(along))
    if math.isfinite(span):
        return None
    return ("has slice positions so far apart along the slice normal that the step between them is not a finite "
            "number of mm; fix the Image Position (Patient) of its images or export the series again")


# How a time key is named in a sentence (classic files' attributes: only they have an Instance Number).
_TIME_KEY_NAMES = {"trigger_ms": "Trigger Time", "temporal_position": "Temporal Position Identifier"}


def _time_order_problem(groups: Sequence[Sequence[_Image]], key: str) -> str | None:
    """Why the images of a cine, ``groups`` of one slice position each (sorted along the normal, each sorted by
    the time ``key``), are not one time order (see the module docstring), or None."""
    for position, group in enumerate(groups):
        numbers = [image.order for image in group]
        if key == "order" or None in numbers or len(set(numbers)) < len(numbers):
            continue  # no Instance Numbers there to order the images by
        if numbers != sorted(numbers):
            return (f"orders its images at slice position {position + 1} of {len(groups)} differently by "
                    f"{_TIME_KEY_NAMES[key]} than by Instance Number, so which image is which time point is "
                    "unknown; export the cine again, or fix the trigger times or instance numbers")
    if key != "trigger_ms":
        return None
    times = np.array([[image.trigger_ms for image in group] for group in groups]).T  # (phase, position) ms
    # Each position in its own breath-hold has its own heart rate, which stretches its trigger times (a
    # retrospectively gated phase k is at k/T of that position's cycle): times are compared in steps of their own
    # position, so a heart rate differing by some per cent between breath-holds still reads, and a position whose
    # times are shifted against the others' does not.
    steps = times / np.median(np.diff(times, axis=0), axis=0)
    means = steps.mean(axis=1)
    distances = np.abs(steps[:, :, None] - means)  # (phase, position, the phase whose mean it is measured from)
    phases = np.arange(len(means))
    own = distances[phases, :, phases]
    others = np.where(np.eye(len(means), dtype=bool)[:, None, :], np.inf, distances)
    mixed = np.argwhere(own >= others.min(axis=2))
    if len(mixed) == 0:
        return None
    phase, position = (int(index) for index in mixed[0])
    nearest = int(np.argmin(others[phase, position]))
    return (f"is a cine whose time points mix trigger times (time point {phase + 1}'s image at slice position "
            f"{position + 1} of {len(groups)} is at {times[phase, position]:g} ms, in its position's own heart "
            f"rate nearer time point {nearest + 1} than its own); export the cine again, or fix the trigger times")


def _arrangement(images: Sequence[_Image]) -> tuple[list[_Image], int, str | None]:
    """``images`` in phase order, each phase sorted along the slice normal, the number of phases, and why they
    are neither a volume nor a cine (None when they are one; see the module docstring)."""
    problem = _grid_problem(images)
    if problem is not None:
        return list(images), 1, problem
    normal = _normal(images[0].orientation)
    pixel = float(min(images[0].pixel_spacing))
    problem = _step_problem(images, normal)
    if problem is not None:
        return list(images), 1, problem
    groups = _at_positions(images, normal)
    counts = sorted({len(group) for group in groups})
    if len(counts) > 1:
        return list(images), 1, (
            f"holds {len(images)} images at {len(groups)} slice positions, {counts[0]} to {counts[-1]} at a "
            "position (a cine whose time points differ in their slices or geometry, or echoes or repeats); "
            "export a complete cine, or one image per position as a series of its own")
    phases = counts[0]
    if phases > 1 and len(groups) < 2:
        return list(images), 1, (f"holds {phases} images at one slice position (a single-slice cine?), not a "
                                 "stack of slices; give a series of two or more slice positions")
    if phases > 1:
        key = _time_key(groups)
        if key is None:
            return list(images), 1, (
                f"holds {phases} images at each of its {len(groups)} slice positions that no trigger time, "
                "temporal position or instance number tells apart (echoes, magnitude and phase images or repeats, "
                "not only a cine's time points); export one image per position and time point")
        groups = [sorted(group, key=lambda image: getattr(image, key)) for group in groups]
        problem = _time_order_problem(groups, key)
        if problem is not None:
            return list(images), 1, problem
    ordered = [group[phase] for phase in range(phases) for group in groups]
    positions = np.array([image.position for image in ordered]).reshape(phases, len(groups), 3)
    problem = _stack_problem(positions[0], normal, pixel)
    if problem is None and phases > 1:
        offsets = np.linalg.norm(positions - positions[:1], axis=2).max(axis=1)
        moved = int(np.argmax(offsets))
        if offsets[moved] > max(_MINIMUM_TOLERANCE_MM, POSITION_TOLERANCE * pixel):
            problem = (f"is a cine whose time points differ in geometry (time point {moved + 1}'s slices lie up "
                       f"to {offsets[moved]:.3g} mm from the first's); export the cine again with its slices "
                       "at the same positions in every time point")
    return ordered, phases, problem


def _trigger_times(images: Sequence[_Image], phases: int) -> tuple[float, ...] | None:
    """Each phase's mean trigger time (ms) of ``images`` in phase order, when every image has one and they
    rise from phase to phase at every position, else None."""
    times = [image.trigger_ms for image in images]
    if phases < 2 or None in times:
        return None
    by_phase = np.array(times, dtype=np.float64).reshape(phases, -1)
    if not np.all(np.diff(by_phase, axis=0) > 0):
        return None
    return tuple(float(value) for value in by_phase.mean(axis=1))


def _series(uid: str, entries: list[tuple[Path, Dataset]]) -> DicomSeries:
    files = tuple(path for path, _ in entries)
    headers = [header for _, header in entries]
    kinds = Counter(UID(str(header.get("SOPClassUID", ""))).name or "unknown" for header in headers)
    kind = kinds.most_common(1)[0][0]
    number = headers[0].get("SeriesNumber")
    number = int(number) if number not in (None, "") else None
    description = str(headers[0].get("SeriesDescription", "") or "").strip()
    if not all(name.endswith("Image Storage") for name in kinds):
        others = ", ".join(f"{count} {name}" for name, count in kinds.items()
                           if not name.endswith("Image Storage"))
        problem = (f"holds objects that are not images ({others}); give a folder of an image series, or "
                   "choose an image series with --series-uid")
        return DicomSeries(uid, files, number, description, kind, problem)
    images = _file_images(entries)
    if isinstance(images, str):
        return DicomSeries(uid, files, number, description, kind, images)
    ordered, phases, problem = _arrangement(images)
    frames = tuple(image.frame for image in ordered) if ordered[0].frame is not None else ()
    if problem is not None:
        return DicomSeries(uid, files, number, description, kind, problem, frames=frames)
    if not frames:
        files = tuple(image.path for image in ordered)
    return DicomSeries(uid, files, number, description, kind, None, phases, frames,
                       _trigger_times(ordered, phases))


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
    """The headers (everything but the pixel data) of ``series``' files, in its order: the source images a
    derived object (a Segmentation) references, one multi-frame file alone."""
    return [pydicom.dcmread(path, stop_before_pixels=True) for path in series.files]


def in_source_order(volume: np.ndarray, series: DicomSeries) -> np.ndarray:
    """The slices of a volume ``(z, y, x)`` read from ``series`` in the order of its source images: the
    files' order, or a multi-frame file's frames (as highdicom pairs a derived object's frames with them)."""
    return volume[np.argsort(series.frames)] if series.frames else volume


def _checked(array: np.ndarray, geometry: ImageGeometry, series: DicomSeries) -> tuple[np.ndarray, ImageGeometry]:
    if not np.isfinite(array).all():
        raise ValueError(f"The DICOM {series.label} holds NaN or infinite values after its rescale; check "
                         "its Rescale Slope and Intercept.")
    if not all(math.isfinite(value) and value > 0 for value in geometry.spacing):
        spacing = " × ".join(f"{value:g}" for value in geometry.spacing)
        raise ValueError(f"The DICOM {series.label} gives a voxel spacing of {spacing} mm, which is not "
                         "positive; check its Pixel Spacing.")
    return array, geometry


def _read_files(series: DicomSeries, files: Sequence[Path]) -> tuple[np.ndarray, ImageGeometry]:
    """The ``(z, y, x)`` float32 volume of single-frame ``files`` (sorted along the normal) and its grid."""
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames([str(path) for path in files])
    reader.SetOutputPixelType(sitk.sitkFloat32)
    try:
        image = reader.Execute()
    except RuntimeError as error:
        reason = (str(error).strip().splitlines() or ["unknown error"])[-1]
        reason = _ITK_PREFIX.sub("", reason.replace("sitk::ERROR:", "")).strip().rstrip(".")
        raise ValueError(f"Cannot read the pixel data of the DICOM {series.label} ({reason}: a file cut "
                         "short, or a compression GDCM cannot decode); export the series again.") from None
    return sitk.GetArrayFromImage(image), ImageGeometry.from_sitk(image)


def _read_frames(series: DicomSeries) -> tuple[np.ndarray, ImageGeometry]:
    """The ``(t, z, y, x)`` float32 phases of a multi-frame series (each frame's rescale applied) and their
    grid (see the module docstring)."""
    try:
        dataset = pydicom.dcmread(series.files[0])
        stored = np.asarray(dataset.pixel_array)
    except (OSError, EOFError, ValueError, RuntimeError, NotImplementedError, AttributeError, KeyError) as error:
        # pydicom raises these on pixel data cut short or in a compression it has no decoder for
        reason = str(error).strip().splitlines()[0].rstrip(".") if str(error).strip() else type(error).__name__
        raise ValueError(f"Cannot read the pixel data of the DICOM {series.label} ({reason}: a file cut "
                         "short, or a compression pydicom cannot decode); export the series again, "
                         "uncompressed.") from None
    images = _multi_frame_images(series.files[0], dataset)
    stored = stored.reshape(len(images), *images[0].size)
    chosen = [images[frame] for frame in series.frames]
    slopes = np.array([image.slope for image in chosen])[:, None, None]
    intercepts = np.array([image.intercept for image in chosen])[:, None, None]
    values = (stored[list(series.frames)] * slopes + intercepts).astype(np.float32)
    first, last = chosen[0], chosen[series.slices - 1]
    step = float(np.linalg.norm(last.position - first.position)) / max(series.slices - 1, 1)
    row, column = (axis / np.linalg.norm(axis) for axis in (first.orientation[:3], first.orientation[3:]))
    direction = np.column_stack([row, column, np.cross(row, column)])
    geometry = ImageGeometry((step, *map(float, first.pixel_spacing)), tuple(map(float, first.position)),
                             tuple(map(float, direction.ravel())))
    return values.reshape(series.phases, series.slices, *first.size), geometry


def _read_phases(series: DicomSeries) -> tuple[np.ndarray, ImageGeometry]:
    """Every phase of a series without a problem: ``(t, z, y, x)`` float32 and the grid they share."""
    if series.frames:
        volumes, geometry = _read_frames(series)
    else:
        count = series.slices
        phases = [_read_files(series, series.files[start:start + count])
                  for start in range(0, len(series.files), count)]
        volumes, geometry = np.stack([array for array, _ in phases]), phases[0][1]
    return _checked(volumes, geometry, series)


def read_series(series: DicomSeries) -> tuple[np.ndarray, ImageGeometry]:
    """The ``(z, y, x)`` float32 volume of an image series (each file's or frame's rescale applied) and its grid.

    Raises:
        ValueError: the series is no volume (its :attr:`DicomSeries.volume_problem`: a cine among others), its
            pixel data cannot be decoded, or it holds NaN/infinite values.
    """
    if series.volume_problem is not None:
        raise ValueError(f"The DICOM {series.label} {series.volume_problem}.")
    volumes, geometry = _read_phases(series)
    return volumes[0], geometry


def read_dicom_folder(folder: str | Path, series_uid: str | None = None
                      ) -> tuple[np.ndarray, ImageGeometry, DicomSeries]:
    """The volume of the one image series in ``folder`` (or the one ``series_uid`` names), its grid and the
    series.

    Raises:
        ValueError: see :func:`find_series`, :func:`choose_series` and :func:`read_series`.
    """
    series = choose_series(find_series(folder), folder, series_uid)
    return (*read_series(series), series)


def read_cine_series(folder: str | Path, series_uid: str | None = None) -> CineSeries:
    """The phases of the multi-phase cine in ``folder``: the series ``series_uid`` names, else its one cine
    (the one image series of several time points, beside localizers and other volumes), else its one image
    series.

    Raises:
        SinglePhaseError: the series holds one time point (a volume; the caller decides what to make of it).
        ValueError: see :func:`find_series` and :func:`choose_series`; the series is neither a volume nor a
            cine (:attr:`DicomSeries.problem`: phases of different numbers of slices or geometry, ...), its
            pixel data cannot be decoded, or it holds NaN/infinite values.
    """
    every_series = find_series(folder)
    cines = [entry for entry in every_series if entry.is_image and entry.problem is None and entry.phases > 1]
    series = cines[0] if series_uid is None and len(cines) == 1 else \
        choose_series(every_series, folder, series_uid)
    if series.problem is not None:
        raise ValueError(f"The DICOM {series.label} {series.problem}.")
    if series.phases < 2:
        raise SinglePhaseError(f"The DICOM {series.label} holds one time point of {series.slices} slices, not a "
                               "cine; give a series of several time points.")
    volumes, geometry = _read_phases(series)
    times = list(series.trigger_times_ms) if series.trigger_times_ms is not None else None
    return CineSeries(volumes, geometry, times, series)


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
