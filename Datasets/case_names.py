"""What a file's or a case's name says: a volume file's name without its image extension, and the patient a case
belongs to.

A case named ``<patient>_frameNN`` is one frame of that patient (ACDC: end-diastole and end-systole), so both
frames of a patient stay on one side of a split; any other case is its own patient.
"""

from __future__ import annotations

import re

from CalibSegLib.io import WRITE_SUFFIXES

__all__ = ["image_file_stem", "patient_of_case"]

# A pair-folder case of one frame of a patient (ACDC: end-diastole and end-systole): grouped by patient.
_FRAME_CASE = re.compile(r"^(.+)_frame\d+$")


def image_file_stem(name: str) -> str | None:
    """``name`` without its image extension (``a_0000.nii.gz`` → ``a_0000``); None for a file of another format."""
    for extension in WRITE_SUFFIXES:  # single-file formats: an image and its label are one file each
        if name.endswith(extension):
            return name[: -len(extension)]
    return None


def patient_of_case(case_id: str) -> str:
    """The patient a case belongs to: ``<patient>`` of a ``<patient>_frameNN`` case (ACDC's end-diastole and
    end-systole), else the case itself."""
    frame = _FRAME_CASE.match(case_id)
    return frame.group(1) if frame else case_id
