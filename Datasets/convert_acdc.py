"""Convert the official ACDC NIfTI release into a folder ``calibseg-train --data`` reads.

    calibseg-convert-acdc --source /path/to/ACDC/database --out data/acdc
    calibseg-train --cpu --data data/acdc --method crac

The ACDC challenge (https://www.creatis.insa-lyon.fr/Challenge/acdc/) publishes one folder per
patient: ``patientNNN/patientNNN_frameXX.nii.gz`` (a cine-MRI frame), ``patientNNN_frameXX_gt.nii.gz``
(its reference: 0 background, 1 right ventricle, 2 myocardium, 3 left ventricle) for the
end-diastolic (ED) and end-systolic (ES) frames named in ``patientNNN/Info.cfg``
(``ED: 1``, ``ES: 12``, ...), and the whole cycle as ``patientNNN_4d.nii.gz`` (not used). Every
``Info.cfg`` below ``--source`` is one patient (the release's ``training/`` and ``testing/``
folders alike).

For each patient and each of its ED and ES frames this writes ``patientNNN_frameXX_image.nii.gz``
and ``patientNNN_frameXX_label.nii.gz`` into ``--out``: the image's voxels and geometry
unchanged (the real spacing, origin and direction of the release, unlike the HDF5 copy, which
has none), the label as uint8 on the same grid. :func:`Datasets.layouts.find_cases` reads that
folder as image/label pairs grouped by patient (``patientNNN``), so both frames of a patient stay
on one side of a split and the shipped split files apply; bundles trained on it record the
dataset as ``acdc``. Intensities are left as acquired: the bundle's preprocessing normalises
every volume (clip at the 99th percentile, scale to [0, 1]) as the HDF5 files were.

Bad input — a patient folder without ``Info.cfg``, a missing ``Info.cfg`` entry or frame file,
an image and label of different shapes or grids, labels outside 0–3 — stops the conversion with
one sentence naming the patient and file. The output files are one set (:class:`CalibSegLib.io.OutputSet`): they appear
together at the end, and a failure or Ctrl-C leaves ``--out`` as it was; rerunning rewrites them.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from CalibSegLib.io import ImageGeometry, OutputSet, check_output_folder, os_error_sentence, read_image, write_image
from Datasets.acdc import ACDC_CLASS_NAMES
from Datasets.errors import DataError

__all__ = ["AcdcFrame", "INFO_NAME", "find_frames", "convert", "main"]

INFO_NAME = "Info.cfg"
_PATIENT = re.compile(r"^patient\d{3}$")
_FRAMES = ("ED", "ES")


@dataclass(frozen=True)
class AcdcFrame:
    """One labelled frame of the official release: ``case_id`` ``patientNNN_frameXX``, its image and label files."""

    case_id: str
    patient_id: str
    image_path: Path
    label_path: Path


def _read_info(path: Path) -> dict[str, str]:
    """``Info.cfg`` as ``{key: value}`` (lines ``ED: 1``)."""
    entries = {}
    for line in path.read_text().splitlines():
        key, separator, value = line.partition(":")
        if separator:
            entries[key.strip()] = value.strip()
    return entries


def _patient_frames(info_path: Path) -> list[AcdcFrame]:
    folder = info_path.parent
    patient = folder.name
    info = _read_info(info_path)
    frames = []
    for key in _FRAMES:
        if not info.get(key, "").isdigit():
            raise DataError(f"{patient}: {INFO_NAME} has no '{key}: <frame number>' line; "
                            f"the official release names the end-diastolic and end-systolic frames there.")
        case = f"{patient}_frame{int(info[key]):02d}"
        frame = AcdcFrame(case, patient, folder / f"{case}.nii.gz", folder / f"{case}_gt.nii.gz")
        for path in (frame.image_path, frame.label_path):
            if not path.is_file():
                raise DataError(f"{patient}: {path.name} is missing; the official layout has {case}.nii.gz and "
                                f"{case}_gt.nii.gz for every frame {INFO_NAME} names.")
        if frame not in frames:  # ED and ES are the same frame in no real patient, but stay safe
            frames.append(frame)
    return frames


def find_frames(source: str | Path) -> list[AcdcFrame]:
    """The ED and ES frames of every ``patientNNN/Info.cfg`` below ``source``, sorted by case.

    Raises:
        DataError: ``source`` is missing or holds no patient, a patient id occurs twice, or a
            patient's ``Info.cfg`` or frame files are incomplete (one sentence naming it).
    """
    source = Path(source)
    if not source.is_dir():
        raise DataError(f"ACDC folder {source} does not exist; pass --source with the folder of the official "
                        "release (the one holding training/ and testing/, or the patientNNN folders).")
    infos = sorted(path for path in source.rglob(INFO_NAME) if _PATIENT.match(path.parent.name))
    if not infos:
        raise DataError(f"No patientNNN/{INFO_NAME} below {source}; pass --source with the official ACDC NIfTI "
                        "release (patientNNN/patientNNN_frameXX.nii.gz, _gt.nii.gz and Info.cfg).")
    # A patient folder without its Info.cfg would otherwise vanish from the conversion without a word.
    without_info = sorted(folder for folder in source.rglob("patient*")
                          if _PATIENT.match(folder.name) and folder.is_dir() and not (folder / INFO_NAME).is_file())
    if without_info:
        raise DataError(f"{without_info[0].name}: {INFO_NAME} is missing ({without_info[0]}); the official release "
                        "names each patient's end-diastolic and end-systolic frames there, so restore it or remove "
                        "the folder.")
    patients = [path.parent.name for path in infos]
    twice = sorted({patient for patient in patients if patients.count(patient) > 1})
    if twice:
        raise DataError(f"{twice[0]} occurs in more than one folder below {source}; pass one copy of the release.")
    return sorted((frame for path in infos for frame in _patient_frames(path)), key=lambda frame: frame.case_id)


def _checked_pair(frame: AcdcFrame) -> tuple[np.ndarray, np.ndarray, ImageGeometry]:
    """Image (as stored), uint8 label and the image's geometry; :class:`DataError` for a mismatch."""
    try:
        image, geometry = read_image(frame.image_path)
        label, label_geometry = read_image(frame.label_path)
    except ValueError as error:
        raise DataError(f"{frame.case_id}: {error}") from None
    if image.ndim != 3 or image.shape != label.shape or not label_geometry.matches(geometry):
        raise DataError(f"{frame.case_id}: the image {image.shape} and its _gt label {label.shape} are not 3D volumes "
                        "on the same grid; replace them with the release's files.")
    if not np.array_equal(np.rint(label), label) or label.min() < 0 or label.max() >= len(ACDC_CLASS_NAMES):
        raise DataError(f"{frame.case_id}: the _gt label holds values other than "
                        f"0–{len(ACDC_CLASS_NAMES) - 1} ({', '.join(ACDC_CLASS_NAMES)}); it is not an ACDC reference.")
    return image, label.astype(np.uint8), geometry


def convert(source: str | Path, out: str | Path, patients: Sequence[str] | None = None) -> list[Path]:
    """Write every ED/ES frame below ``source`` (or of ``patients`` only) as an image/label pair into ``out``.

    The files are written as one set: after any error none of them replaces what ``out`` held.

    Returns:
        The written ``*_image.nii.gz`` paths, sorted.

    Raises:
        DataError: see :func:`find_frames`; an image and label that do not match, labels outside
            0–3, or a requested patient not found.
        ValueError: ``out`` cannot be written.
    """
    out = check_output_folder(out)
    frames = find_frames(source)
    if patients:
        missing = sorted(set(patients) - {frame.patient_id for frame in frames})
        if missing:
            raise DataError(f"{missing[0]} is not in {source}; check --patients.")
        frames = [frame for frame in frames if frame.patient_id in set(patients)]
    written = []
    with OutputSet() as outputs:  # one frame in memory at a time; all files renamed into place at the end
        for frame in frames:
            image, label, geometry = _checked_pair(frame)
            image_path = out / f"{frame.case_id}_image.nii.gz"
            write_image(outputs.stage(image_path), image, geometry)
            write_image(outputs.stage(out / f"{frame.case_id}_label.nii.gz"), label, geometry)
            written.append(image_path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibseg-convert-acdc`` command: prints how many volumes went where; returns the exit status 0. Bad input
    exits with one sentence, no traceback."""
    parser = argparse.ArgumentParser(prog="calibseg-convert-acdc", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True,
                        help="the official ACDC NIfTI release (folder holding training/ and testing/ or patientNNN/)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the <case>_image/<case>_label pairs")
    parser.add_argument("--patients", default=None, help="comma-separated patient ids to convert (default: all)")
    arguments = parser.parse_args(argv)
    patients = [name.strip() for name in arguments.patients.split(",") if name.strip()] if arguments.patients else None
    try:
        written = convert(arguments.source, arguments.out, patients)
    except (DataError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    except OSError as error:
        raise SystemExit(f"error: {os_error_sentence(error)}") from None
    count = len({path.name.split("_")[0] for path in written})
    print(f"wrote {len(written)} volumes of {count} patients (image + label pairs, real spacing) to {arguments.out}")
    print(f"train on them: calibseg-train --data {arguments.out}   (or set CALIBSEG_ACDC={arguments.out})")
    return 0


if __name__ == "__main__":
    main()
