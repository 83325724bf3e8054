"""DICOM files edited for the tests: an attribute changed in a file written by :mod:`Datasets.dicom_series`."""

from __future__ import annotations

from pathlib import Path

import pydicom

__all__ = ["edit_file", "edit_shared_group", "swap_attribute"]


def edit_file(path: Path, **attributes) -> Path:
    """Rewrite the DICOM file at ``path`` with ``attributes`` (keyword → value) changed."""
    header = pydicom.dcmread(path)
    for keyword, value in attributes.items():
        setattr(header, keyword, value)
    header.save_as(path)
    return path


def edit_shared_group(path: Path, sequence: str, **attributes) -> Path:
    """Rewrite the multi-frame DICOM file at ``path`` with ``attributes`` changed in the item of its shared
    functional group ``sequence`` (``PixelMeasuresSequence``, ...)."""
    dataset = pydicom.dcmread(path)
    item = getattr(dataset.SharedFunctionalGroupsSequence[0], sequence)[0]
    for keyword, value in attributes.items():
        setattr(item, keyword, value)
    dataset.save_as(path)
    return path


def swap_attribute(first: Path, second: Path, keyword: str) -> None:
    """Exchange the value of ``keyword`` between the DICOM files ``first`` and ``second``."""
    values = [pydicom.dcmread(path).get(keyword) for path in (first, second)]
    edit_file(first, **{keyword: values[1]})
    edit_file(second, **{keyword: values[0]})
