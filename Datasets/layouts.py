"""Finding the volumes of a data folder: which files make a case, in each layout CalibSeg reads.

Layouts (:func:`find_cases`):
- ACDC: ``patientNNN_frameMM.h5`` files with ``image`` and ``label`` datasets; the patient
  id is ``patientNNN`` (both frames of a patient always stay on one side of a split). A cache folder
  (:mod:`Datasets.cache`, recognised by its marker file) holds the same volumes as ``patientNNN_frameMM.npz``.
- Pairs: ``<case>_image.<ext>`` + ``<case>_label.<ext>`` in one folder (ext: nii.gz, nii,
  nrrd, mha); the patient id is ``<case>``, or ``<patient>`` for a case named
  ``<patient>_frameNN`` (so the ``patientNNN_frameMM`` pairs that ``Datasets/convert_acdc.py``
  writes from the official ACDC release group by patient, as the HDF5 files do, and the
  shipped split files apply to them).
- Medical Segmentation Decathlon / nnU-Net v2: ``imagesTr/<case>_0000.nii.gz`` ... ``_000K`` (one file per
  channel, or ``<case>.nii.gz`` for one) + ``labelsTr/<case>.nii.gz``; the folder's ``dataset.json``
  (:func:`Datasets.dataset_json.read_dataset_description`, both forms) names the channels and classes and may list
  test cases.

A case found is a :class:`CaseFile`, its files; :func:`Datasets.loading.load_cases` reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from CalibSegLib.io import case_and_channel
from Datasets.cache import is_cache
from Datasets.case_names import image_file_stem, patient_of_case
from Datasets.dataset_json import DATASET_DESCRIPTION, read_dataset_description
from Datasets.errors import DataError

__all__ = ["CaseFile", "DATASETS", "find_cases", "ignored_images"]

# The file names of an ACDC folder and of its cache; the patient (the split unit) is the first group.
_ACDC_NAME = re.compile(r"^(patient\d+)_frame\d+\.h5$")
_ACDC_CACHED = re.compile(r"^(patient\d+)_frame\d+\.npz$")


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



def _find_pairs(folder: Path) -> list[CaseFile]:
    """The ``<case>_image``/``<case>_label`` pairs of ``folder``; DataError for a case with two images (two
    formats), which would train on one case twice."""
    found: dict[str, CaseFile] = {}
    for image_path in sorted(folder.iterdir()):
        stem = image_file_stem(image_path.name)
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
              if not path.name.startswith(".") and image_file_stem(path.name) is not None]
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
        case, channel = case_and_channel(image_file_stem(image_path.name))
        channels.setdefault(case, {}).setdefault(channel, []).append(image_path)
    named = description.channel_names if description is not None else None
    most = max((max(channel or 0 for channel in found) + 1 for found in channels.values()), default=1)
    count = len(named) if named else most
    found = []
    for case, paths in channels.items():
        ordered = _one_file_per_channel(images, case, paths, count)
        extension = ending or ordered[0].name[len(image_file_stem(ordered[0].name)):]
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

