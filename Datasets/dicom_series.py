"""DICOM series written from arrays with pydicom: a volume or a cine as a scanner would give it, for the tests and
the README's report picture (``scripts/make_report_picture.py``).

    from Datasets.dicom_series import write_series, write_cine, write_enhanced
    files = write_series(tmp_path / "series", volume, geometry, modality="CT", intercept=-1024.0)
    files = write_cine(tmp_path / "cine", volumes, geometry, trigger_times_ms=[0.0, 40.0, ...])
    path = write_enhanced(tmp_path / "enhanced" / "cine.dcm", volumes, geometry, trigger_times_ms=[...])

Each slice of :func:`write_series` is a classic single-frame image (MR or CT Image Storage, explicit VR little
endian) with the patient, study, series, frame of reference and image plane attributes a scanner writes; a cine
(:func:`write_cine`) is one such series holding every slice position at each time point, with its Trigger Time.
:func:`write_enhanced` writes the phases as one Enhanced MR Image Storage file, with per-frame functional groups
(position, temporal position index, cardiac trigger delay) and shared ones (pixel measures, orientation,
rescale; or per frame), and its dimensions indexed by in-stack position and temporal position. Geometry follows
the file format, independently of SimpleITK: the position of slice k is
``origin + k · spacing_z · (third direction column)``, the orientation the first two direction columns (along a
row, down a column) and PixelSpacing ``(row spacing, column spacing) = (spacing_y, spacing_x)``. Stored values
are ``round((value - intercept) / slope)`` as int16, so a volume of whole numbers with slope 1 comes back
exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.tag import Tag
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from CalibSegLib.io import ImageGeometry

__all__ = ["SOP_CLASSES", "ENHANCED_MR", "write_series", "write_cine", "write_enhanced"]

SOP_CLASSES = {"MR": "1.2.840.10008.5.1.4.1.1.4", "CT": "1.2.840.10008.5.1.4.1.1.2"}
ENHANCED_MR = "1.2.840.10008.5.1.4.1.1.4.1"


def _file_meta(sop_class: str, sop_instance: str) -> FileMetaDataset:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = sop_instance
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    return meta


def _decimals(values: Sequence[float]) -> list[str]:
    return [f"{value:.6f}" for value in values]


def _header(sop_class: str, modality: str, study_uid: str, series_uid: str, frame_uid: str | None,
            series_number: int, description: str, rows: int, columns: int) -> Dataset:
    """The attributes every file of a series shares: patient, study, series, frame of reference (none where
    ``frame_uid`` is None) and pixel format (int16)."""
    sop_instance = generate_uid()
    header = Dataset()
    header.file_meta = _file_meta(sop_class, sop_instance)
    header.SOPClassUID, header.SOPInstanceUID = sop_class, sop_instance
    header.PatientName, header.PatientID = "Test^Case", "T1"
    header.PatientBirthDate, header.PatientSex = "", "O"
    header.StudyInstanceUID, header.StudyDate, header.StudyTime = study_uid, "20260101", "120000"
    header.StudyID, header.AccessionNumber, header.ReferringPhysicianName = "1", "A1", ""
    header.Modality, header.SeriesInstanceUID, header.SeriesNumber = modality, series_uid, series_number
    header.SeriesDescription = description
    if frame_uid is not None:
        header.FrameOfReferenceUID, header.PositionReferenceIndicator = frame_uid, ""
    header.Manufacturer = "CalibSeg tests"
    header.Rows, header.Columns = rows, columns
    header.SamplesPerPixel, header.PhotometricInterpretation = 1, "MONOCHROME2"
    header.BitsAllocated, header.BitsStored, header.HighBit, header.PixelRepresentation = 16, 16, 15, 1
    return header


def _positions(geometry: ImageGeometry, slices: int) -> tuple[np.ndarray, list[str]]:
    """Each slice's ImagePositionPatient ``(slices, 3)`` and the ImageOrientationPatient of ``geometry``."""
    direction = np.array(geometry.direction, dtype=np.float64).reshape(3, 3)
    positions = np.array(geometry.origin) + np.outer(np.arange(slices) * geometry.spacing[0], direction[:, 2])
    return positions, _decimals((*direction[:, 0], *direction[:, 1]))


def _stored(plane: np.ndarray, slope: float, intercept: float) -> np.ndarray:
    return np.rint((plane - intercept) / slope).astype("<i2")


def write_series(folder: str | Path, volume: np.ndarray, geometry: ImageGeometry, modality: str = "MR",
                 slope: float | Sequence[float] = 1.0, intercept: float = 0.0, series_number: int = 3,
                 description: str = "SA stack", study_uid: str | None = None, prefix: str = "slice",
                 series_uid: str | None = None, frame_uid: str | None = "", trigger_time_ms: float | None = None,
                 first_instance: int = 1) -> list[Path]:
    """Write ``volume (z, y, x)`` on ``geometry`` as one series of single-frame files ``<prefix>_<k>.dcm``.

    ``slope``: one Rescale Slope for every slice or one per slice; ``series_uid``, ``frame_uid``: the series'
    and its Frame of Reference's UIDs (new ones by default; ``frame_uid=None`` leaves the Frame of Reference
    out); ``trigger_time_ms``: every slice's Trigger Time; ``first_instance``: slice 0's Instance Number.
    Returns the files, slice 0 first.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    positions, orientation = _positions(geometry, volume.shape[0])
    slopes = [float(slope)] * volume.shape[0] if np.isscalar(slope) else [float(value) for value in slope]
    study_uid, series_uid = study_uid or generate_uid(), series_uid or generate_uid()
    frame_uid = generate_uid() if frame_uid == "" else frame_uid
    files = []
    for index, plane in enumerate(volume):
        header = _header(SOP_CLASSES[modality], modality, study_uid, series_uid, frame_uid, series_number,
                         description, *plane.shape)
        header.InstanceNumber = first_instance + index
        header.ImagePositionPatient = _decimals(positions[index])
        header.ImageOrientationPatient = orientation
        header.PixelSpacing = _decimals(geometry.spacing[1:])
        header.SliceThickness = f"{geometry.spacing[0]:.6f}"
        if trigger_time_ms is not None:
            header.TriggerTime = f"{trigger_time_ms:g}"
        header.RescaleSlope, header.RescaleIntercept = f"{slopes[index]:g}", f"{intercept:g}"
        if modality == "CT":
            header.RescaleType = "HU"
        header.PixelData = _stored(plane, slopes[index], intercept).tobytes()
        path = folder / f"{prefix}_{index:03d}.dcm"
        header.save_as(path, enforce_file_format=True)
        files.append(path)
    return files


def write_cine(folder: str | Path, volumes: np.ndarray, geometry: ImageGeometry,
               trigger_times_ms: Sequence[float] | None = None, **options) -> list[Path]:
    """Write the phases ``volumes (t, z, y, x)`` as one classic multi-phase series: phase t's slices are files
    ``t<t>_<k>.dcm`` with Trigger Time ``trigger_times_ms[t]`` (none without it) and Instance Numbers
    ``t · z + k + 1``. ``options``: those of :func:`write_series`. Returns the files, phase by phase."""
    series_uid, study_uid, frame_uid = generate_uid(), generate_uid(), generate_uid()
    options = {"series_uid": series_uid, "study_uid": study_uid, "frame_uid": frame_uid,
               "description": "SA cine", **options}
    files = []
    for phase, volume in enumerate(volumes):
        trigger = None if trigger_times_ms is None else float(trigger_times_ms[phase])
        files += write_series(folder, volume, geometry, prefix=f"t{phase:02d}", trigger_time_ms=trigger,
                              first_instance=phase * volume.shape[0] + 1, **options)
    return files


def _item(**attributes) -> Dataset:
    item = Dataset()
    for keyword, value in attributes.items():
        setattr(item, keyword, value)
    return item


def write_enhanced(path: str | Path, volumes: np.ndarray, geometry: ImageGeometry,
                   trigger_times_ms: Sequence[float] | None = None, frame_order: Sequence[int] | None = None,
                   slopes: Sequence[float] | None = None, shared: bool = True, temporal_index: bool = True,
                   frame_uid: str | None = "", series_number: int = 5, description: str = "SA cine enhanced"
                   ) -> Path:
    """Write the phases ``volumes (t, z, y, x)`` on ``geometry`` as one Enhanced MR Image Storage file.

    Frame ``f`` holds image ``frame_order[f]`` of the phase-major order (image ``t · z + k`` is phase t's slice
    k; by default in that order). ``trigger_times_ms``: each phase's Nominal Cardiac Trigger Delay Time (no
    cardiac synchronisation without it); ``slopes``: a Rescale Slope per image (per-frame Pixel Value
    Transformation; one shared slope 1 without it); ``shared``: orientation in the shared functional groups
    (else in every frame's); ``temporal_index``: each frame's Temporal Position Index (else only its dimension
    index value gives the phase); ``frame_uid`` as for :func:`write_series`. Returns ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    phases, slices, rows, columns = volumes.shape
    order = list(range(phases * slices)) if frame_order is None else [int(index) for index in frame_order]
    positions, orientation = _positions(geometry, slices)
    frame_uid = generate_uid() if frame_uid == "" else frame_uid
    header = _header(ENHANCED_MR, "MR", generate_uid(), generate_uid(), frame_uid, series_number, description,
                     rows, columns)
    header.ImageType = ["ORIGINAL", "PRIMARY", "M", "NONE"]
    header.InstanceNumber, header.NumberOfFrames = 1, len(order)
    header.ContentDate, header.ContentTime, header.AcquisitionDateTime = "20260101", "120000", "20260101120000"
    organization = generate_uid()
    header.DimensionOrganizationSequence = [_item(DimensionOrganizationUID=organization)]
    header.DimensionIndexSequence = [
        _item(DimensionOrganizationUID=organization, DimensionIndexPointer=Tag(keyword),
              FunctionalGroupPointer=Tag("FrameContentSequence"))
        for keyword in ("InStackPositionNumber", "TemporalPositionIndex")]
    orientation_item = _item(ImageOrientationPatient=orientation)
    common = _item(PixelMeasuresSequence=[_item(PixelSpacing=_decimals(geometry.spacing[1:]),
                                                SliceThickness=f"{geometry.spacing[0]:.6f}")])
    if shared:
        common.PlaneOrientationSequence = [orientation_item]
    if slopes is None:
        common.PixelValueTransformationSequence = [_item(RescaleSlope="1", RescaleIntercept="0",
                                                         RescaleType="US")]
    header.SharedFunctionalGroupsSequence = [common]
    frames, planes = [], []
    for image in order:
        phase, index = divmod(image, slices)
        content = _item(StackID="1", InStackPositionNumber=index + 1, DimensionIndexValues=[index + 1, phase + 1])
        if temporal_index:
            content.TemporalPositionIndex = phase + 1
        groups = _item(FrameContentSequence=[content],
                       PlanePositionSequence=[_item(ImagePositionPatient=_decimals(positions[index]))])
        if not shared:
            groups.PlaneOrientationSequence = [orientation_item]
        if trigger_times_ms is not None:
            groups.CardiacSynchronizationSequence = [_item(
                NominalCardiacTriggerDelayTime=float(trigger_times_ms[phase]))]
        slope = 1.0 if slopes is None else float(slopes[image])
        if slopes is not None:
            groups.PixelValueTransformationSequence = [_item(RescaleSlope=f"{slope:g}", RescaleIntercept="0",
                                                             RescaleType="US")]
        frames.append(groups)
        planes.append(_stored(volumes[phase, index], slope, 0.0))
    header.PerFrameFunctionalGroupsSequence = frames
    header.PixelData = np.stack(planes).tobytes()
    header.save_as(path, enforce_file_format=True)
    return path

