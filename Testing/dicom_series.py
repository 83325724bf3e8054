"""DICOM series written from arrays with pydicom, for the tests and the README's report picture.

    from dicom_series import write_series
    files = write_series(tmp_path / "series", volume, geometry, modality="CT", intercept=-1024.0)

Each slice is a classic single-frame image (MR or CT Image Storage, explicit VR little endian) with the
patient, study, series, frame of reference and image plane attributes a scanner writes. Geometry follows the
file format, independently of SimpleITK: ImagePositionPatient of slice k is
``origin + k · spacing_z · (third direction column)``, ImageOrientationPatient the first two direction columns
(along a row, down a column) and PixelSpacing ``(row spacing, column spacing) = (spacing_y, spacing_x)``.
Stored values are ``round((value - intercept) / slope)`` as int16, so a volume of whole numbers with slope 1
comes back exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from CalibSegLib.io import ImageGeometry

__all__ = ["SOP_CLASSES", "write_series", "edit_file"]

SOP_CLASSES = {"MR": "1.2.840.10008.5.1.4.1.1.4", "CT": "1.2.840.10008.5.1.4.1.1.2"}


def _file_meta(sop_class: str, sop_instance: str) -> FileMetaDataset:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = sop_instance
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    return meta


def write_series(folder: str | Path, volume: np.ndarray, geometry: ImageGeometry, modality: str = "MR",
                 slope: float | Sequence[float] = 1.0, intercept: float = 0.0, series_number: int = 3,
                 description: str = "SA stack", study_uid: str | None = None,
                 prefix: str = "slice") -> list[Path]:
    """Write ``volume (z, y, x)`` on ``geometry`` as one series of single-frame files ``<prefix>_<k>.dcm``.

    ``slope``: one Rescale Slope for every slice or one per slice. Returns the files, slice 0 first.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    direction = np.array(geometry.direction, dtype=np.float64).reshape(3, 3)
    slopes = [float(slope)] * volume.shape[0] if np.isscalar(slope) else [float(value) for value in slope]
    study_uid, series_uid, frame_uid = study_uid or generate_uid(), generate_uid(), generate_uid()
    files = []
    for index, plane in enumerate(volume):
        sop_instance = generate_uid()
        header = Dataset()
        header.file_meta = _file_meta(SOP_CLASSES[modality], sop_instance)
        header.SOPClassUID, header.SOPInstanceUID = SOP_CLASSES[modality], sop_instance
        header.PatientName, header.PatientID = "Test^Case", "T1"
        header.PatientBirthDate, header.PatientSex = "", "O"
        header.StudyInstanceUID, header.StudyDate, header.StudyTime = study_uid, "20260101", "120000"
        header.StudyID, header.AccessionNumber, header.ReferringPhysicianName = "1", "A1", ""
        header.Modality, header.SeriesInstanceUID, header.SeriesNumber = modality, series_uid, series_number
        header.SeriesDescription, header.FrameOfReferenceUID = description, frame_uid
        header.PositionReferenceIndicator = ""
        header.Manufacturer, header.InstanceNumber = "CalibSeg tests", index + 1
        position = np.array(geometry.origin) + index * geometry.spacing[0] * direction[:, 2]
        header.ImagePositionPatient = [f"{value:.6f}" for value in position]
        header.ImageOrientationPatient = [f"{value:.6f}" for value in (*direction[:, 0], *direction[:, 1])]
        header.PixelSpacing = [f"{geometry.spacing[1]:.6f}", f"{geometry.spacing[2]:.6f}"]
        header.SliceThickness = f"{geometry.spacing[0]:.6f}"
        header.Rows, header.Columns = plane.shape
        header.SamplesPerPixel, header.PhotometricInterpretation = 1, "MONOCHROME2"
        header.BitsAllocated, header.BitsStored, header.HighBit, header.PixelRepresentation = 16, 16, 15, 1
        header.RescaleSlope, header.RescaleIntercept = f"{slopes[index]:g}", f"{intercept:g}"
        if modality == "CT":
            header.RescaleType = "HU"
        header.PixelData = np.rint((plane - intercept) / slopes[index]).astype("<i2").tobytes()
        path = folder / f"{prefix}_{index:03d}.dcm"
        header.save_as(path, enforce_file_format=True)
        files.append(path)
    return files


def edit_file(path: Path, **attributes) -> Path:
    """Rewrite the DICOM file at ``path`` with ``attributes`` (keyword → value) changed."""
    header = pydicom.dcmread(path)
    for keyword, value in attributes.items():
        setattr(header, keyword, value)
    header.save_as(path)
    return path
