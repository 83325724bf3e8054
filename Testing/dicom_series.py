"""DICOM files edited for the tests: an attribute changed in a file written by :mod:`Datasets.dicom_series`."""

from __future__ import annotations

from pathlib import Path

import pydicom

__all__ = ["edit_file"]


def edit_file(path: Path, **attributes) -> Path:
    """Rewrite the DICOM file at ``path`` with ``attributes`` (keyword → value) changed."""
    header = pydicom.dcmread(path)
    for keyword, value in attributes.items():
        setattr(header, keyword, value)
    header.save_as(path)
    return path
