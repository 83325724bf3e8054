"""Reading the volumes found (:func:`Datasets.layouts.find_cases`) whole, 3D, as stored, and checking them.

ACDC's HDF5 files (and their cached copies, :mod:`Datasets.cache`) carry no spacing: they are read with
:data:`Datasets.acdc.ACDC_SPACING`; image files bring their own. Images stay as stored (no normalisation), so that
evaluation feeds the predictor exactly what a user would.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from CalibSegLib.io import read_channels, read_image
from Datasets.acdc import ACDC_SPACING
from Datasets.cache import read_cached
from Datasets.errors import DataError
from Datasets.layouts import CaseFile

__all__ = ["Case", "load_cases"]


@dataclass
class Case:
    """One loaded volume: ``image`` as stored, ``(z, y, x)`` for one channel and ``(K, z, y, x)`` for K > 1
    (so one-channel data keep their arrays); ``label`` (z, y, x) uint8, spacing (z, y, x) mm.

    Images stay as stored so that evaluation feeds the predictor exactly what a user would;
    :func:`Datasets.model_grid.to_model_grid` normalises them for training with the predictor's own function.
    """

    case_id: str
    patient_id: str
    image: np.ndarray
    label: np.ndarray
    spacing: tuple[float, float, float]



def _read_acdc(path: Path) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float]]:
    import h5py  # training-only dependency

    try:
        with h5py.File(path, "r") as handle:
            return np.asarray(handle["image"][...]), np.asarray(handle["label"][...]), ACDC_SPACING
    except (OSError, KeyError) as error:
        raise DataError(f"Cannot read {path.name} as an ACDC volume with 'image' and 'label' datasets "
                        f"({error}).") from None


def _read_cache(path: Path) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float]]:
    """An ACDC volume from its cached copy (:mod:`Datasets.cache`), with ACDC's assumed spacing."""
    try:
        return (*read_cached(path), ACDC_SPACING)
    except ValueError as error:
        raise DataError(str(error)) from None


def _read_pair(case: CaseFile) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float]]:
    """Image ``(z, y, x)`` (one channel) or ``(K, z, y, x)``, label and spacing of a file-pair case."""
    try:
        image, geometry = read_channels(case.channel_paths)
        label, label_geometry = read_image(case.label_path)
    except ValueError as error:
        raise DataError(str(error)) from None
    if not np.allclose(geometry.spacing, label_geometry.spacing, rtol=1e-3):
        raise DataError(f"Image and label of {case.case_id} have different spacings {geometry.spacing} and "
                        f"{label_geometry.spacing}.")
    return image, label, geometry.spacing


def load_cases(files: Iterable[CaseFile], num_classes: int) -> list[Case]:
    """Read and check volumes.

    Raises:
        DataError: image and label shapes differ, labels outside ``[0, num_classes)``, or a
            volume is not 3D or is constant.
    """
    cases = []
    for file in files:
        image, label, spacing = (_read_acdc(file.image_path) if file.kind == "acdc" else
                                 _read_cache(file.image_path) if file.kind == "cache" else _read_pair(file))
        if image.ndim != 3 + bool(file.more_channels) or image.shape[-3:] != label.shape:
            raise DataError(f"{file.case_id}: image shape {image.shape} and label shape {label.shape} "
                            "must be the same 3D shape.")
        if not np.issubdtype(label.dtype, np.integer) and not np.all(np.mod(label, 1) == 0):
            raise DataError(f"{file.case_id}: the label image holds non-integer values; labels must be class ids.")
        if label.min() < 0 or label.max() >= num_classes:
            raise DataError(
                f"{file.case_id}: labels range over [{int(label.min())}, {int(label.max())}] but the model has "
                f"{num_classes} classes (0..{num_classes - 1}); fix the labels or pass --num-classes."
            )
        constant = [channel for channel, values in enumerate(image.reshape(-1, *label.shape))
                    if values.min() == values.max()]
        if not np.isfinite(image).all() or constant:
            raise DataError(f"{file.case_id}: the image is constant or holds NaN/inf values"
                            + (f" (channel {constant[0]})." if file.more_channels and constant else "."))
        cases.append(Case(file.case_id, file.patient_id, image, label.astype(np.uint8), tuple(spacing)))
    return cases
