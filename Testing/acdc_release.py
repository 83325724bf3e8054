"""A tiny generated copy of the official ACDC NIfTI release: ``training/patientNNN/`` (ids up to 100) and
``testing/patientNNN/`` folders with ``Info.cfg``, each frame's image and its ``_gt`` label (4D cine file left
out), for the converter's tests and the release-to-evaluation path."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import SimpleITK as sitk

from Datasets.splits.make_splits import TRAINING_PATIENTS

__all__ = ["SPACING_XYZ", "ORIGIN_XYZ", "write_volume", "write_release"]

SPACING_XYZ = (1.37, 1.37, 9.0)  # ACDC-like: ~1.4 mm in-plane, thick slices
ORIGIN_XYZ = (-120.0, 80.5, 12.0)


def write_volume(path: Path, array: np.ndarray, dtype: type) -> None:
    """``array`` ``(z, y, x)`` as a NIfTI file with the ACDC-like spacing and origin."""
    image = sitk.GetImageFromArray(array.astype(dtype))
    image.SetSpacing(SPACING_XYZ)
    image.SetOrigin(ORIGIN_XYZ)
    sitk.WriteImage(image, str(path))


def write_release(root: Path, frames: Mapping[str, tuple[int, int]]) -> Path:
    """One folder per patient of ``frames`` (``patientNNN`` -> its ED and ES frame numbers) below ``root``;
    images of 4 × 20 × 18 voxels with all four labels present. Returns ``root``."""
    rng = np.random.default_rng(0)
    for patient, (ed, es) in frames.items():
        side = "training" if int(patient.removeprefix("patient")) <= TRAINING_PATIENTS else "testing"
        folder = root / side / patient
        folder.mkdir(parents=True)
        (folder / "Info.cfg").write_text(f"ED: {ed}\nES: {es}\nGroup: NOR\nHeight: 180.0\nNbFrame: 30\nWeight: 80.0\n")
        for frame in (ed, es):
            image = rng.integers(0, 800, (4, 20, 18))
            label = np.zeros(image.shape)
            label[:, 5:12, 4:10], label[:, 7:10, 6:8] = 2, 3
            label[1, 12:15, 4:8] = 1
            write_volume(folder / f"{patient}_frame{frame:02d}.nii.gz", image, np.int16)
            write_volume(folder / f"{patient}_frame{frame:02d}_gt.nii.gz", label, np.uint8)
    return root
