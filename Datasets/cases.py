"""Dataset adapters: ACDC HDF5 volumes and folders of NIfTI/NRRD image + label pairs.

Volumes are read whole (3D, for evaluation) and, for training, put on the model's grid and
cached in memory as tensors (:func:`to_model_grid`): intensities through the same
:func:`CalibSegLib.preprocessing.channel_intensities` the predictor uses, every slice
resampled in-plane from the volume's own spacing to ``Preprocessing.target_spacing`` (images
bilinear, labels by the argmax of their resampled one-hot maps), whole — crops are cut from
them per batch (:mod:`Training.batches`). ACDC's HDF5 files carry no spacing: every ACDC
volume is taken to have :data:`ACDC_SPACING` (10 mm between slices, 1.5 × 1.5 mm in-plane),
which is also the default training spacing, so ACDC slices are used at their native resolution.

Folder layouts (:func:`find_cases`):
- ACDC: ``patientNNN_frameMM.h5`` files with ``image`` and ``label`` datasets; the patient
  id is ``patientNNN`` (both frames of a patient always stay on one side of a split).
- Pairs: ``<case>_image.<ext>`` + ``<case>_label.<ext>`` in one folder (ext: nii.gz, nii,
  nrrd, mha); the patient id is ``<case>``, or ``<patient>`` for a case named
  ``<patient>_frameNN`` (so the ``patientNNN_frameMM`` pairs that ``Datasets/convert_acdc.py``
  writes from the official ACDC release group by patient, as the HDF5 files do, and the
  shipped split files apply to them).
- Medical Segmentation Decathlon / nnU-Net v2: ``imagesTr/<case>_0000.nii.gz`` ... ``_000K`` (one file per
  channel, or ``<case>.nii.gz`` for one) + ``labelsTr/<case>.nii.gz``; the folder's ``dataset.json``
  (:func:`read_dataset_description`, both forms) names the channels and classes and may list test cases.

Bundles record their data by dataset name (:func:`dataset_name`: ``acdc-sample`` for the
shipped sample, ``acdc`` for any other ACDC folder, else the folder's name), never by a path of
the training machine; :func:`data_folder` finds a recorded dataset again: ``--data`` when
given, the shipped sample for ``acdc-sample``, ``$CALIBSEG_ACDC`` for ``acdc``, and for bundles
written before names were recorded the absolute folder they hold, when it exists here.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from CalibSegLib.io import WRITE_SUFFIXES, case_and_channel, read_channels, read_image
from CalibSegLib.preprocessing import (Preprocessing, in_plane_spacing, network_grid_shape, normalize_channels,
                                       resample_slices, resample_volume, volume_grid_shape)
from Datasets.cache import is_cache, read_cached

__all__ = [
    "ACDC_SPACING",
    "SAMPLE_DATA",
    "SAMPLE_DATASET",
    "ACDC_DATASET",
    "ACDC_ENVIRONMENT",
    "ACDC_CLASS_NAMES",
    "ACDC_CLASS_COLORS",
    "DEFAULT_CLASS_COUNT",
    "ACDC_TERMINOLOGY",
    "DataError",
    "Case",
    "CaseFile",
    "DATASETS",
    "find_cases",
    "ignored_images",
    "DATASET_DESCRIPTION",
    "DatasetDescription",
    "read_dataset_description",
    "default_classes",
    "default_terminology",
    "default_scheme",
    "volumes_note",
    "dataset_name",
    "recorded_dataset",
    "data_folder",
    "load_cases",
    "GridVolume",
    "to_model_grid",
    "patient_of_case",
]

# The ACDC HDF5 files carry no spacing; ACDC's in-plane spacing is about 1.4–1.7 mm and its
# slice thickness 5–10 mm. Every ACDC volume is read with this one assumption: it decides
# HD95/ASD in mm and, with the default Preprocessing.target_spacing of 1.5 mm, that ACDC slices
# are trained on without resampling.
ACDC_SPACING: tuple[float, float, float] = (10.0, 1.5, 1.5)
ACDC_CLASS_NAMES: list[str] = ["background", "right ventricle", "myocardium", "left ventricle"]
ACDC_CLASS_COLORS: list[tuple[float, float, float]] = [
    (0.0, 0.0, 0.0), (0.90, 0.30, 0.25), (0.30, 0.70, 0.35), (0.25, 0.45, 0.90),
]
# Classes, background included, of data whose folder names none (no dataset.json): ACDC's, as the sample's.
DEFAULT_CLASS_COUNT = len(ACDC_CLASS_NAMES)
# SNOMED CT codes of ACDC's structures (bundle.json's class_terminology, CalibSegLib.terminology): right and left
# ventricle from Slicer's Modules/Loadable/Terminologies/Resources/SegmentationCategoryTypeModifier-DICOM-Master.json
# (Slicer 583e9b37, "Anatomical Structure" 123037004; types 53085002 and 87878005), the myocardium from
# SlicerMONAIAuto3DSeg's MONAIAuto3DSeg/Resources/SegmentationCategoryTypeModifier-MONAIAuto3DSeg.term.json
# (9cdf2df4, 74281007, as SlicerTotalSegmentator's heart_myocardium), in the region 87878005 "Left Ventricle" of
# Slicer's AnatomicRegionAndModifier-DICOM-Master.json. ACDC's cavities are the ventricles' blood pools.
_ANATOMICAL_STRUCTURE = {"CodingSchemeDesignator": "SCT", "CodeValue": "123037004",
                         "CodeMeaning": "Anatomical Structure"}
_LEFT_VENTRICLE = {"CodingSchemeDesignator": "SCT", "CodeValue": "87878005", "CodeMeaning": "Left ventricle"}
_LEFT_VENTRICLE_REGION = {**_LEFT_VENTRICLE, "CodeMeaning": "Left Ventricle"}
ACDC_TERMINOLOGY: dict[str, dict[str, dict[str, str]]] = {
    "right ventricle": {"category": _ANATOMICAL_STRUCTURE, "type": {
        "CodingSchemeDesignator": "SCT", "CodeValue": "53085002", "CodeMeaning": "Right ventricle"}},
    "myocardium": {"category": _ANATOMICAL_STRUCTURE, "type": {
        "CodingSchemeDesignator": "SCT", "CodeValue": "74281007", "CodeMeaning": "Myocardium"},
        "region": _LEFT_VENTRICLE_REGION},
    "left ventricle": {"category": _ANATOMICAL_STRUCTURE, "type": _LEFT_VENTRICLE},
}

# The shipped sample of ACDC, the default training data; bundles trained on it record SAMPLE_DATASET.
SAMPLE_DATA = Path(__file__).resolve().parents[1] / "SampleData" / "ACDC"
SAMPLE_DATASET = "acdc-sample"
ACDC_DATASET = "acdc"
DATASET_DESCRIPTION = "dataset.json"  # nnU-Net v2 / Decathlon: the classes' names
# Where readers of a bundle trained on full ACDC look for the data when no --data is given.
ACDC_ENVIRONMENT = "CALIBSEG_ACDC"

_ACDC_NAME = re.compile(r"^(patient\d+)_frame\d+\.h5$")
_ACDC_CACHED = re.compile(r"^(patient\d+)_frame\d+\.npz$")
# A pair-folder case of one frame of a patient (ACDC: end-diastole and end-systole): grouped by patient.
_FRAME_CASE = re.compile(r"^(.+)_frame\d+$")
_ACDC_CASE = re.compile(r"^patient\d+_frame\d+$")


class DataError(ValueError):
    """The training data cannot be used; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class CaseFile:
    """Where one volume lives: ``case_id`` (unique), ``patient_id`` (split unit), files and format."""

    case_id: str
    patient_id: str
    image_path: Path  # the first (or only) channel
    label_path: Path | None
    kind: str  # "acdc", "cache" (Datasets/cache.py's copy of an ACDC file) or "image"
    more_channels: tuple[Path, ...] = ()  # channels 1 .. K - 1, in order

    @property
    def channel_paths(self) -> tuple[Path, ...]:
        """Every channel's file, channel 0 first."""
        return (self.image_path, *self.more_channels)


@dataclass
class Case:
    """One loaded volume: ``image`` as stored, ``(z, y, x)`` for one channel and ``(K, z, y, x)`` for K > 1
    (so one-channel data keep their arrays); ``label`` (z, y, x) uint8, spacing (z, y, x) mm.

    Images stay as stored so that evaluation feeds the predictor exactly what a user would;
    :func:`make_slices` normalises them for training with the predictor's own function.
    """

    case_id: str
    patient_id: str
    image: np.ndarray
    label: np.ndarray
    spacing: tuple[float, float, float]


def _strip_extension(name: str) -> str | None:
    for extension in WRITE_SUFFIXES:  # single-file formats: an image and its label are one file each
        if name.endswith(extension):
            return name[: -len(extension)]
    return None


def patient_of_case(case_id: str) -> str:
    """The patient a case belongs to: ``<patient>`` of a ``<patient>_frameNN`` case (ACDC's end-diastole and
    end-systole), else the case itself."""
    frame = _FRAME_CASE.match(case_id)
    return frame.group(1) if frame else case_id


def _find_pairs(folder: Path) -> list[CaseFile]:
    """The ``<case>_image``/``<case>_label`` pairs of ``folder``; DataError for a case with two images (two
    formats), which would train on one case twice."""
    found: dict[str, CaseFile] = {}
    for image_path in sorted(folder.iterdir()):
        stem = _strip_extension(image_path.name)
        if stem is None or not stem.endswith("_image"):
            continue
        case = stem[: -len("_image")]
        if case in found:
            raise DataError(f"Case {case} has two images in {folder} ({found[case].image_path.name}, "
                            f"{image_path.name}); remove one of them.")
        extension = image_path.name[len(stem):]
        found[case] = CaseFile(case, patient_of_case(case), image_path, folder / f"{case}_label{extension}", "image")
    return list(found.values())


def _image_files(folder: Path, ending: str | None) -> tuple[list[Path], list[Path]]:
    """The image files of ``folder`` (hidden files and other files left out), sorted: those that count and
    those ``ending`` (``dataset.json``'s ``file_ending``; None: every image format counts) leaves out."""
    images = [path for path in sorted(folder.iterdir())
              if not path.name.startswith(".") and _strip_extension(path.name) is not None]
    if ending is None:
        return images, []
    return ([path for path in images if path.name.endswith(ending)],
            [path for path in images if not path.name.endswith(ending)])


def ignored_images(folder: str | Path) -> list[Path]:
    """The images of a Decathlon / nnU-Net folder's ``imagesTr`` that its ``dataset.json``'s ``file_ending``
    leaves out (``a_0000.nrrd`` beside ``a_0000.nii.gz`` when it says ``.nii.gz``): training names them as
    ignored."""
    folder = Path(folder)
    if not (folder / "imagesTr").is_dir():
        return []
    description = read_dataset_description(folder)
    return _image_files(folder / "imagesTr", description.file_ending if description else None)[1]


def _dimension(path: Path) -> int:
    """The number of axes a image file's header declares (0 when it cannot be read: the reading says why)."""
    import SimpleITK as sitk

    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    try:
        reader.ReadImageInformation()
    except RuntimeError:
        return 0
    return reader.GetDimension()


def _one_file_per_channel(images: Path, case: str, paths: dict[int | None, list[Path]],
                          count: int) -> list[Path]:
    """Case ``case``'s file per channel, channel 0 first, from its files by channel suffix (None: no suffix,
    the one file of a one-channel dataset); DataError naming what is wrong otherwise."""
    for channel, files in paths.items():
        if len(files) > 1:
            named = ", ".join(path.name for path in files)
            raise DataError(f"Case {case} has {len(files)} files for channel {channel or 0} in {images} "
                            f"({named}); remove all but one, or give dataset.json a \"file_ending\" that "
                            "chooses one.")
    last = f"{case}_{count - 1:04d}"
    if None in paths:
        bare = paths[None][0]
        suffixed = [path.name for channel, files in paths.items() if channel is not None for path in files]
        if suffixed:
            raise DataError(f"Case {case} in {images} has {bare.name}, without a channel suffix, beside "
                            f"{', '.join(suffixed)}; remove one of them, or name every file of the case with "
                            "its channel suffix.")
        if count > 1 and _dimension(bare) == 4:
            raise DataError(f"{bare.name} in {images} holds its channels in one 4D image (the Medical "
                            "Segmentation Decathlon's original layout); CalibSeg reads one 3D file per "
                            f"channel: split it into {case}_0000 ... {last} (nnUNetv2_convert_MSD_dataset "
                            "does this for a whole folder).")
        if count > 1:
            raise DataError(f"Case {case} in {images} has one file without a channel suffix ({bare.name}) "
                            f"but the dataset has {count} channels; name its files {case}_0000 ... {last}, "
                            "one per channel.")
    channels = {channel or 0: files[0] for channel, files in paths.items()}
    if sorted(channels) != list(range(count)):
        present = ", ".join(f"_{index:04d}" for index in sorted(channels))
        raise DataError(f"Case {case} in {images} has the channel file(s) {present} but the dataset has "
                        f"{count} channel(s) (_0000 to _{count - 1:04d}); every case needs one file per "
                        "channel.")
    return [channels[index] for index in range(count)]


def _find_decathlon(folder: Path) -> list[CaseFile]:
    """The cases of ``imagesTr``: files grouped by case into channels ``_0000`` ... ``_000K``, each case holding
    exactly one file for every channel the dataset has (``dataset.json``'s count, else the most any case has),
    only files ending in its ``file_ending`` counting when it gives one, as many cases as its
    ``numTraining``."""
    images = folder / "imagesTr"
    description = read_dataset_description(folder)
    ending = description.file_ending if description is not None else None
    counted, ignored = _image_files(images, ending)
    if ignored and not counted:
        raise DataError(f"{images} holds no image ending in {ending}, the file_ending of its dataset.json, "
                        f"but {len(ignored)} of another format (first: {ignored[0].name}); correct "
                        "file_ending or convert the images.")
    channels: dict[str, dict[int | None, list[Path]]] = {}
    for image_path in counted:
        case, channel = case_and_channel(_strip_extension(image_path.name))
        channels.setdefault(case, {}).setdefault(channel, []).append(image_path)
    named = description.channel_names if description is not None else None
    most = max((max(channel or 0 for channel in found) + 1 for found in channels.values()), default=1)
    count = len(named) if named else most
    found = []
    for case, paths in channels.items():
        ordered = _one_file_per_channel(images, case, paths, count)
        extension = ending or ordered[0].name[len(_strip_extension(ordered[0].name)):]
        found.append(CaseFile(case, case, ordered[0], folder / "labelsTr" / f"{case}{extension}", "image",
                              tuple(ordered[1:])))
    expected = description.num_training if description is not None else None
    if expected is not None and found and expected != len(found):
        which = f" ending in {ending}" if ending else ""
        raise DataError(f"{folder / DATASET_DESCRIPTION} says numTraining {expected} but {images} holds "
                        f"{len(found)} case(s){which}; restore the missing cases or correct numTraining.")
    return found


DATASETS: tuple[str, ...] = ("auto", "acdc", "folder")


def find_cases(folder: str | Path, dataset: str = "auto") -> list[CaseFile]:
    """All volumes of a data folder in one of the supported layouts (see the module docstring).

    Args:
        folder: the data folder.
        dataset: ``"acdc"`` (``patientNNN_frameMM.h5`` files), ``"folder"`` (NIfTI/NRRD pairs or
            imagesTr/labelsTr) or ``"auto"`` (ACDC when the folder holds such .h5 files).

    Raises:
        DataError: the folder is missing, holds no recognisable volume, or an image lacks its label.
    """
    folder = Path(folder)
    if dataset not in DATASETS:
        raise DataError(f"Unknown dataset kind {dataset!r}; use one of {', '.join(DATASETS)}.")
    if not folder.is_dir():
        raise DataError(f"Data folder {folder} does not exist; "
                        "pass --data with a folder of ACDC .h5 files or image/label pairs.")
    if dataset != "folder" and is_cache(folder):  # Datasets/cache.py's compact copy of an ACDC folder
        return [CaseFile(path.stem, match.group(1), path, None, "cache")
                for path in sorted(folder.glob("*.npz")) if (match := _ACDC_CACHED.match(path.name))]
    if dataset != "folder":
        acdc = [CaseFile(path.name[:-3], match.group(1), path, None, "acdc")
                for path in sorted(folder.glob("*.h5")) if (match := _ACDC_NAME.match(path.name))]
        if acdc or dataset == "acdc":
            if not acdc:
                raise DataError(f"No ACDC volumes (patientNNN_frameMM.h5) in {folder}; "
                                "check --data or use --dataset folder.")
            return acdc
    cases = _find_decathlon(folder) if (folder / "imagesTr").is_dir() else _find_pairs(folder)
    if not cases:
        raise DataError(
            f"No training volumes in {folder}: expected ACDC patientNNN_frameMM.h5 files, <case>_image/<case>_label "
            "pairs (.nii.gz, .nrrd, .mha), or an imagesTr/labelsTr folder."
        )
    missing = [case.case_id for case in cases if case.label_path is None or not case.label_path.is_file()]
    if missing:
        raise DataError(f"No label file for {len(missing)} image(s) in {folder} (first: {missing[0]}); "
                        "every image needs its label.")
    return cases


def dataset_name(folder: str | Path, files: Sequence[CaseFile]) -> str:
    """The name a bundle records for the data in ``folder`` (whose volumes are ``files``).

    ``acdc-sample`` for the shipped sample, ``acdc`` for ACDC HDF5 files or ``patientNNN_frameMM``
    pairs (the official release after ``Datasets/convert_acdc.py``), else the folder's own name.
    """
    folder = Path(folder).resolve()
    if folder == SAMPLE_DATA:
        return SAMPLE_DATASET
    if files and all(file.kind == "acdc" or _ACDC_CASE.match(file.case_id) for file in files):
        return ACDC_DATASET
    return folder.name


def recorded_dataset(data: dict) -> str:
    """The dataset name a bundle's ``data`` section records; for bundles that recorded an absolute
    ``folder`` instead, the shipped sample's name when that folder was the sample, else its folder name."""
    legacy = data.get("folder")
    if legacy:
        parts = Path(legacy).parts
        if parts[-2:] == SAMPLE_DATA.parts[-2:]:
            return SAMPLE_DATASET
        return ACDC_DATASET if data.get("dataset") == ACDC_DATASET else parts[-1]
    return str(data.get("dataset") or "data")


def data_folder(data: dict, given: str | Path | None = None) -> Path:
    """The folder holding the data a bundle's ``data`` section records.

    ``given`` (``--data``) wins; then the shipped sample for ``acdc-sample``, ``$CALIBSEG_ACDC``
    for ``acdc``, and an absolute folder recorded by older bundles when it exists on this machine.

    Raises:
        DataError: none of these applies (one sentence saying what to pass).
    """
    if given is not None:
        return Path(given)
    name = recorded_dataset(data)
    if name == SAMPLE_DATASET:
        return SAMPLE_DATA
    if name == ACDC_DATASET and os.environ.get(ACDC_ENVIRONMENT):
        return Path(os.environ[ACDC_ENVIRONMENT])
    legacy = data.get("folder")
    if legacy and Path(legacy).is_dir():
        return Path(legacy)
    if name == ACDC_DATASET:
        raise DataError(f"The bundle was trained on ACDC, which is not shipped; pass --data with your ACDC folder "
                        f"or set {ACDC_ENVIRONMENT} to it (README.md, section Data).")
    raise DataError(f"The bundle was trained on dataset {name!r}, whose folder is not known here; "
                    "pass --data with that folder.")


@dataclass(frozen=True)
class DatasetDescription:
    """What a folder's ``dataset.json`` says: ``class_names`` (background, id 0, first), ``channel_names`` (channel
    0 first; None when it names none), ``file_ending`` (None when not given), ``test_cases``, the case ids of
    its ``test`` list (empty without one), and ``num_training``, its ``numTraining`` (None when not given)."""

    class_names: list[str]
    channel_names: list[str] | None
    file_ending: str | None
    test_cases: list[str]
    num_training: int | None = None


def _numbered_names(path: Path, key: str, value: Any) -> list[str]:
    """The names of an ``{"0": name, "1": name, ...}`` object (Decathlon's labels and modality, nnU-Net's
    channel_names) in id order."""
    if not isinstance(value, dict) or not value or not all(isinstance(name, str) for name in value.values()) \
            or sorted(value) != sorted(str(index) for index in range(len(value))):
        raise DataError(f"{path}'s {key} must give the ids 0 to {len(value) - 1 if isinstance(value, dict) else 'K'} "
                        f"one name each, e.g. {{\"0\": \"CT\"}}; got {value!r}.")
    return [value[str(index)] for index in range(len(value))]


def _class_names(path: Path, labels: Any) -> list[str]:
    """``labels`` in either form (nnU-Net v2's name → id, the Decathlon's id → name) as names in id order."""
    if not isinstance(labels, dict) or not labels:
        raise DataError(f"{path} has no \"labels\" object naming the classes; add one, e.g. "
                        '{"background": 0, "liver": 1}.')
    by_name = all(isinstance(value, int) and not isinstance(value, bool) for value in labels.values())
    pairs = ([(value, name) for name, value in labels.items()] if by_name
             else [(int(key), value) for key, value in labels.items() if key.isdigit() and isinstance(value, str)])
    ids = sorted(identifier for identifier, _ in pairs)
    if len(pairs) != len(labels) or ids != list(range(len(labels))):
        raise DataError(f"{path}'s labels must give the ids 0 to {len(labels) - 1} one name each (background 0); "
                        f"got {labels}.")
    return [name for _, name in sorted(pairs)]


def _test_case(entry: Any) -> str | None:
    """The case id of one entry of a Decathlon ``test`` list (a path, or an object with an ``image`` path)."""
    path = entry.get("image") if isinstance(entry, dict) else entry
    if not isinstance(path, str):
        return None
    return case_and_channel(_strip_extension(Path(path).name) or Path(path).name)[0]


def read_dataset_description(folder: str | Path) -> DatasetDescription | None:
    """The ``dataset.json`` of ``folder`` in either form (nnU-Net v2: ``channel_names``, ``labels`` name → id,
    ``file_ending``; Medical Segmentation Decathlon: ``modality``, ``labels`` id → name, ``test``); None without one.

    Raises:
        DataError: the file is unreadable, its labels are not the ids 0, 1, ..., C - 1 each named once (nnU-Net's
            region labels, lists of ids, included), its channels are not numbered 0, 1, ..., K - 1, its
            ``file_ending`` is not an image format CalibSeg reads, or its ``numTraining`` not a whole number.
    """
    path = Path(folder) / DATASET_DESCRIPTION
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"Cannot read {path} ({error}); give it a \"labels\" object or remove it.") from None
    if not isinstance(values, dict):
        raise DataError(f"{path} must hold a JSON object with a \"labels\" object naming the classes.")
    channel_key = next((key for key in ("channel_names", "modality") if key in values), None)
    channels = _numbered_names(path, channel_key, values[channel_key]) if channel_key else None
    ending = values.get("file_ending")
    if ending is not None and (not isinstance(ending, str) or ending.lower() not in WRITE_SUFFIXES):
        raise DataError(f"{path}'s file_ending {ending!r} is not an image format CalibSeg reads; give one of "
                        f"{', '.join(WRITE_SUFFIXES)} (with its dot).")
    count = values.get("numTraining")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise DataError(f"{path}'s numTraining must be the number of training cases, got {count!r}.")
    tests = [case for case in map(_test_case, values.get("test") or []) if case]
    return DatasetDescription(_class_names(path, values.get("labels")), channels, ending, tests, count)


def default_classes(num_classes: int, dataset: str, names: Sequence[str] | None = None,
                    ) -> tuple[list[str], list[tuple[float, float, float]]]:
    """Class names and RGB colours in [0, 1]: ``names`` when given (a ``dataset.json``'s,
    :func:`read_dataset_description`), ACDC's for ACDC data (``dataset`` ``acdc`` or ``acdc-sample``), else
    ``class k``; colours from a fixed palette."""
    if names is None and dataset in (ACDC_DATASET, SAMPLE_DATASET) and num_classes == len(ACDC_CLASS_NAMES):
        return list(ACDC_CLASS_NAMES), list(ACDC_CLASS_COLORS)
    names = list(names) if names is not None else ["background"] + [f"class {index}" for index in range(1, num_classes)]
    palette = [(0.90, 0.30, 0.25), (0.30, 0.70, 0.35), (0.25, 0.45, 0.90), (0.95, 0.75, 0.20),
               (0.65, 0.35, 0.80), (0.20, 0.75, 0.80), (0.95, 0.50, 0.70), (0.60, 0.45, 0.25)]
    return names, [(0.0, 0.0, 0.0)] + [palette[(index - 1) % len(palette)] for index in range(1, num_classes)]


def default_terminology(class_names: Sequence[str]) -> dict[str, dict[str, dict[str, str]]] | None:
    """The ``class_terminology`` of a bundle with these classes: :data:`ACDC_TERMINOLOGY` for ACDC's, else None."""
    return ACDC_TERMINOLOGY if list(class_names) == ACDC_CLASS_NAMES else None


def default_scheme(dataset: str) -> str:
    """How a dataset's channels other than CT are normalised per image (training's plan): ``"percentile"`` for
    ACDC (``acdc``, ``acdc-sample``: the recipe the shipped models were trained and measured with; its
    volumes were prepared by that very scaling), ``"zscore"`` for any other data (nnU-Net's choice for MRI: a
    lesion brighter than the image's 99th percentile stays apart from the tissue around it)."""
    return "percentile" if dataset in (ACDC_DATASET, SAMPLE_DATASET) else "zscore"


def volumes_note(dataset: str) -> str:
    """What a run's start says about a dataset's volumes per patient (ACDC: two frames), or ``""``."""
    if dataset in (ACDC_DATASET, SAMPLE_DATASET):
        return " (ACDC has an end-diastole and an end-systole volume per patient)"
    return ""


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


@dataclass
class GridVolume:
    """One volume on the model's grid, cached for training or validation, as items of the network's input.

    ``images (n, K, *spatial)`` float32 normalised (K input channels), ``labels (n, *spatial)`` uint8 (an eighth of
    int64's memory, widened per batch): for a 2D network the items are the ``n = z`` slices, ``spatial = (y, x)``;
    for a 3D network the one item is the whole volume, ``spatial = (z, y, x)``; sizes at the model's spacing.
    """

    case_id: str
    images: torch.Tensor
    labels: torch.Tensor

    def to(self, device: torch.device) -> "GridVolume":
        """The same volume on ``device`` (e.g. cached on the GPU so batches never wait for the host)."""
        return GridVolume(self.case_id, self.images.to(device), self.labels.to(device))


def _labels_to_grid(label: np.ndarray, size: tuple[int, ...], num_classes: int) -> torch.Tensor:
    """``(n, *spatial)`` labels on the grid ``size`` (2D: in-plane ``(y, x)`` of ``n`` slices; 3D: ``(z, y, x)``):
    argmax of the linearly resampled one-hot maps (smoother and fairer to thin structures than nearest neighbour)."""
    labels = torch.from_numpy(label.astype(np.int64))
    if tuple(labels.shape[-len(size):]) == size:
        return labels.to(torch.uint8)
    one_hot = torch.nn.functional.one_hot(labels, num_classes).movedim(-1, 1).float()
    resample = resample_slices if len(size) == 2 else resample_volume
    return resample(one_hot, size).argmax(dim=1).to(torch.uint8)


def _slices_on_grid(case: Case, preprocessing: Preprocessing, num_classes: int) -> GridVolume:
    """A 2D network's items: the volume's slices, each resampled in-plane."""
    size = network_grid_shape(case.label.shape[1:], in_plane_spacing(case.spacing, 0), preprocessing.target_spacing)
    normalized = normalize_channels(case.image, preprocessing)  # (K, z, y, x)
    images = resample_slices(torch.from_numpy(normalized).transpose(0, 1), size)
    return GridVolume(case.case_id, images.contiguous(), _labels_to_grid(case.label, size, num_classes))


def _volume_on_grid(case: Case, preprocessing: Preprocessing, num_classes: int) -> GridVolume:
    """A 3D network's item: the whole volume resampled to the (z, y, x) target spacing (trilinear)."""
    size = volume_grid_shape(case.label.shape, case.spacing, preprocessing.target_spacing)
    normalized = normalize_channels(case.image, preprocessing)  # (K, z, y, x)
    images = resample_volume(torch.from_numpy(normalized)[None], size)
    return GridVolume(case.case_id, images.contiguous(), _labels_to_grid(case.label[None], size, num_classes))


# How a volume becomes the network's items, by the number of target-spacing values (the network's spatial dims).
_GRID_ITEMS = {2: _slices_on_grid, 3: _volume_on_grid}


def to_model_grid(cases: Sequence[Case], preprocessing: Preprocessing, num_classes: int) -> list[GridVolume]:
    """Normalise each volume as ``preprocessing`` says and resample it from the volume's spacing to
    ``preprocessing.target_spacing`` (the predictor does the same at inference): slice by slice in-plane for a 2D
    target spacing ``(y, x)``, the whole volume for a 3D one ``(z, y, x)``.

    Raises:
        DataError: no volume, or a volume whose spacing puts it outside the model's grid limits.
    """
    if not cases:
        raise DataError("No volumes to train on; the split selected no volume.")
    if preprocessing.slice_axis != 0:
        raise DataError("Training reads slices along the first array axis (z); use slice_axis 0.")
    on_grid = _GRID_ITEMS[len(preprocessing.target_spacing)]
    volumes = []
    for case in cases:
        try:
            volumes.append(on_grid(case, preprocessing, num_classes))
        except ValueError as error:
            raise DataError(f"{case.case_id}: {error}") from None
    return volumes
