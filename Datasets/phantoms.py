"""Generated datasets with a known answer, in the layouts real downloads come in.

    python -m Datasets.phantoms --kind ct --out data/ct_phantom            # Decathlon layout, one CT channel
    python -m Datasets.phantoms --kind multichannel --out data/mr_phantom  # nnU-Net v2 layout, four MRI channels
    python -m Datasets.phantoms --kind lesion --out data/lesion_phantom    # three MRI channels, a lesion
    python -m Datasets.phantoms --kind flat-lesion --out data/flat_lesion  # the lesion in 5 slices only

They exist to train and test CalibSeg on input unlike ACDC's, where a wrong preprocessing choice
shows as a failed run rather than a slightly worse one:

- ``ct``: an abdomen-like CT in Hounsfield units, Medical Segmentation Decathlon layout
  (``imagesTr/<case>_0000.nii.gz``, ``labelsTr/<case>.nii.gz``, ``dataset.json`` with
  ``"modality": {"0": "CT"}`` and ``"labels": {"0": "background", ...}``). Air at -1000 HU, a body
  of soft tissue at 40 HU and three organs at 55, 70 and 90 HU, so neighbours differ by 15-20 HU
  (the organs touch the body and each other), under 12 HU of noise. Slices are anisotropic: 0.7-0.9
  mm in-plane and 2.5-5 mm apart, different per case. A per-image [min, 99th percentile] scaling
  maps the 15 HU steps to about 1 % of the range; CT needs a dataset-level HU window.
- ``multichannel``: a brain-like MRI of four sequences, nnU-Net v2 layout
  (``imagesTr/<case>_0000.nii.gz`` ... ``_0003``, ``labelsTr/<case>.nii.gz``, ``dataset.json`` with
  ``channel_names``, ``labels`` name → id and ``file_ending``). Channel 0 shows the head only; each
  structure k (1-3) is bright in channel k and invisible in the others, so a model must read every
  channel. Each case and channel has its own gain and offset (MRI intensities carry no units).
- ``lesion``: a three-sequence MRI (T1, T2, FLAIR), nnU-Net v2 layout as ``multichannel``, whose third
  structure is a small bright lesion (0.1-0.5 % of the voxels) seen in T2 only: about 800 against tissue of
  380 ± 24. Edema shows in FLAIR, the core in T1. A per-image [min, 99th percentile] scaling clips T2 at about
  430, where every lesion voxel lands on the clip value together with the brightest 1 % of noise voxels of
  normal tissue: enhancing tumour in T1ce, multiple-sclerosis lesions in FLAIR and scar in late-enhancement
  cardiac MRI are this kind of structure. The normalisation must keep the brightest 1 % of intensities apart
  for a network to learn it.
- ``flat-lesion``: ``lesion`` with the lesion flattened along z, as issue 61 describes its phantom: about 0.2 % of
  the voxels (0.16-0.23 % in the 30 cases of seed 0) in 4-6 of about 20 slices holding foreground, 14-16 mm
  across. A crop sampler that draws a slice holding foreground before a class present in it draws this lesion
  about a quarter as often as the edema (``Training/batches.py``).

Every case gets its own random geometry (structure centres, radii, spacing) from ``seed``; the same
``seed`` writes byte-identical folders. The folder is written under a temporary name and renamed
when complete.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from scipy import ndimage

from CalibSegLib.io import ImageGeometry, check_output_folder, os_error_sentence, write_image

__all__ = ["PHANTOMS", "PhantomCase", "ct_case", "multichannel_case", "lesion_case", "flat_lesion_case",
           "write_phantom", "main"]

_AIR_HU, _TISSUE_HU = -1000.0, 40.0
_CT_ORGANS: dict[str, float] = {"liver": 55.0, "spleen": 70.0, "kidney": 90.0}  # HU
_CT_NOISE_HU = 12.0
_MRI_CHANNELS = ("T1", "T1ce", "T2", "FLAIR")
_MRI_STRUCTURES = ("edema", "necrosis", "enhancing")
# The lesion phantom: per structure the one channel it shows in and its level there, in units of the case's
# gain (tissue 1: 380 ± 24 and the lesion 800 at the median gain); the noise sd in the same units.
_LESION_CHANNELS = ("T1", "T2", "FLAIR")
_LESION_STRUCTURES: dict[str, tuple[str, float]] = {"edema": ("FLAIR", 2.0), "core": ("T1", 2.0),
                                                    "lesion": ("T2", 800.0 / 380.0)}
_LESION_NOISE = 24.0 / 380.0
_LESION_RADIUS_MM = (4.6, 6.2)  # 0.13-0.34 % of the 48 × 80 × 80 voxels
# The flat lesion's half-thickness (z) and in-plane radius, mm: 4-6 slices at 1 mm, 0.15-0.26 % of the voxels.
_FLAT_LESION_RADII_MM = ((2.2, 2.8), (7.0, 8.2))


@dataclass
class PhantomCase:
    """One generated case: ``channels`` K arrays ``(z, y, x)`` float32, ``label (z, y, x)`` uint8,
    ``spacing (z, y, x)`` mm."""

    channels: list[np.ndarray]
    label: np.ndarray
    spacing: tuple[float, float, float]


def _grid(shape: Sequence[int], spacing: Sequence[float]) -> list[np.ndarray]:
    """Voxel-centre coordinates in mm from the volume's centre, one ``(z, y, x)`` array per axis."""
    return np.meshgrid(*[(np.arange(size) + 0.5 - size / 2) * step for size, step in zip(shape, spacing)],
                       indexing="ij", sparse=True)


def _ellipsoid(coordinates: list[np.ndarray], centre: Sequence[float], radii: Sequence[float]) -> np.ndarray:
    """Boolean mask of the ellipsoid with ``centre`` and ``radii`` (mm, z y x)."""
    return sum(((axis - middle) / radius) ** 2 for axis, middle, radius in zip(coordinates, centre, radii)) <= 1.0


def _place(coordinates: list[np.ndarray], body: np.ndarray, radii: Sequence[float], extent: Sequence[float],
           rng: np.random.Generator) -> np.ndarray:
    """An ellipsoid of ``radii`` (each scaled by 0.8-1.2) centred within ``extent`` mm of the middle, cut to
    ``body``."""
    scaled = [radius * rng.uniform(0.8, 1.2) for radius in radii]
    centre = [rng.uniform(-reach, reach) for reach in extent]
    return _ellipsoid(coordinates, centre, scaled) & body


def ct_case(rng: np.random.Generator, field_of_view: Sequence[float] = (60.0, 96.0, 96.0)) -> PhantomCase:
    """One CT case of about ``field_of_view`` mm (z, y, x): HU image and labels 0-3 (see the module docstring)."""
    in_plane = rng.uniform(0.7, 0.9)
    spacing = (float(rng.uniform(2.5, 5.0)), in_plane, in_plane)
    shape = tuple(int(round(extent / step)) for extent, step in zip(field_of_view, spacing))
    coordinates = _grid(shape, spacing)
    body = _ellipsoid(coordinates, (0.0, 0.0, 0.0),
                      (field_of_view[0], 0.42 * field_of_view[1], 0.46 * field_of_view[2]))
    image = np.where(body, _TISSUE_HU, _AIR_HU)
    label = np.zeros(shape, np.uint8)
    for index, (radii, reach) in enumerate((((22, 18, 22), (8, 6, 8)), ((18, 12, 12), (8, 10, 12)),
                                            ((14, 8, 8), (8, 14, 16))), start=1):
        organ = _place(coordinates, body, radii, reach, rng)
        label[organ] = index
    for index, hounsfield in enumerate(_CT_ORGANS.values(), start=1):
        image[label == index] = hounsfield
    # Partial volume at the organs' borders, then the scanner's noise.
    image = ndimage.gaussian_filter(image, sigma=(0.3, 0.8, 0.8)) + rng.normal(0.0, _CT_NOISE_HU, shape)
    return PhantomCase([image.astype(np.float32)], label, spacing)


def _mri_head(field_of_view: Sequence[float]
              ) -> tuple[tuple[float, float, float], list[np.ndarray], np.ndarray]:
    """An MRI case's 1 mm grid over ``field_of_view`` mm (z, y, x): its spacing, voxel coordinates and the
    head's mask."""
    spacing = (1.0, 1.0, 1.0)
    shape = tuple(int(round(extent)) for extent in field_of_view)
    coordinates = _grid(shape, spacing)
    head = _ellipsoid(coordinates, (0.0, 0.0, 0.0), (0.45 * field_of_view[0], 0.42 * field_of_view[1],
                                                      0.36 * field_of_view[2]))
    return spacing, coordinates, head


def _mri_channel(head: np.ndarray, structures: Sequence[tuple[np.ndarray, float]], noise: float,
                 gains: tuple[float, float], offsets: tuple[float, float], rng: np.random.Generator
                 ) -> np.ndarray:
    """One MRI channel ``(z, y, x)`` float32: tissue 1 in the head, each ``(mask, level)`` of ``structures``
    at its level, blurred (partial volume), noise of sd ``noise``, then a gain and an offset drawn from
    ``gains`` and ``offsets`` (MRI intensities carry no units)."""
    tissue = np.where(head, 1.0, 0.0)
    for mask, level in structures:
        tissue[mask] = level
    tissue = ndimage.gaussian_filter(tissue, sigma=0.7) + rng.normal(0.0, noise, head.shape)
    gain, offset = rng.uniform(*gains), rng.uniform(*offsets)
    return (offset + gain * np.clip(tissue, 0.0, None)).astype(np.float32)


def multichannel_case(rng: np.random.Generator, field_of_view: Sequence[float] = (48.0, 80.0, 80.0)
                      ) -> PhantomCase:
    """One four-channel MRI case of ``field_of_view`` mm at 1 mm: structure k shows in channel k only."""
    spacing, coordinates, head = _mri_head(field_of_view)
    label = np.zeros(head.shape, np.uint8)
    for index in range(1, len(_MRI_STRUCTURES) + 1):
        label[_place(coordinates, head, (9, 12, 12), (6, 14, 10), rng)] = index
    # Channel k > 0 shows structure k, and no other; channel 0 the head alone.
    channels = [_mri_channel(head, [(label == channel, 2.0)] if channel else [], 0.15, (200.0, 800.0),
                             (0.0, 100.0), rng) for channel in range(len(_MRI_CHANNELS))]
    return PhantomCase(channels, label, spacing)


def lesion_case(rng: np.random.Generator, field_of_view: Sequence[float] = (48.0, 80.0, 80.0), flat: bool = False
                ) -> PhantomCase:
    """One three-channel MRI case of ``field_of_view`` mm at 1 mm: edema (label 1) bright in FLAIR, the core
    (2) in T1, a small lesion (3, a ball of 4.6-6.2 mm radius; ``flat``: an ellipsoid 4.4-5.6 mm thick and
    14-16.4 mm across) in T2 only (see the module docstring)."""
    spacing, coordinates, head = _mri_head(field_of_view)
    label = np.zeros(head.shape, np.uint8)
    label[_place(coordinates, head, (9, 12, 12), (6, 14, 10), rng)] = 1
    label[_place(coordinates, head, (6, 8, 8), (6, 14, 10), rng)] = 2
    if flat:
        thickness, width = (rng.uniform(*extent) for extent in _FLAT_LESION_RADII_MM)
        radii = (thickness, width, width)
    else:
        radii = (rng.uniform(*_LESION_RADIUS_MM),) * 3
    centre = [rng.uniform(-reach, reach) for reach in (4.0, 10.0, 8.0)]  # the whole lesion inside the head
    label[_ellipsoid(coordinates, centre, radii)] = 3
    channels = [_mri_channel(head, [(label == structure, level) for structure, (shown_in, level)
                                    in enumerate(_LESION_STRUCTURES.values(), start=1)
                                    if shown_in == channel],
                             _LESION_NOISE, (300.0, 460.0), (0.0, 20.0), rng) for channel in _LESION_CHANNELS]
    return PhantomCase(channels, label, spacing)


def flat_lesion_case(rng: np.random.Generator) -> PhantomCase:
    """One case of :func:`lesion_case` whose lesion is flat: in 4-6 of about 20 slices holding foreground."""
    return lesion_case(rng, flat=True)


@dataclass(frozen=True)
class _Phantom:
    """How a phantom is drawn and described: ``make(rng)`` one case, the case prefix and its ``dataset.json``."""

    make: Callable[[np.random.Generator], PhantomCase]
    prefix: str
    description: Callable[[int], dict]


def _decathlon_description(count: int) -> dict:
    names = ["background", *_CT_ORGANS]
    return {"name": "CTPhantom", "description": "CalibSeg's generated abdomen-like CT (Datasets/phantoms.py)",
            "modality": {"0": "CT"}, "labels": {str(index): name for index, name in enumerate(names)},
            "numTraining": count, "numTest": 0, "tensorImageSize": "3D",
            "training": [{"image": f"./imagesTr/ct_{index:03d}.nii.gz", "label": f"./labelsTr/ct_{index:03d}.nii.gz"}
                         for index in range(count)], "test": []}


def _nnunet_description(name: str, what: str, channels: Sequence[str], structures: Sequence[str]
                        ) -> Callable[[int], dict]:
    """The nnU-Net v2 ``dataset.json`` of a phantom of ``count`` cases."""
    return lambda count: {
        "name": name, "description": f"CalibSeg's generated {what} (Datasets/phantoms.py)",
        "channel_names": {str(index): channel for index, channel in enumerate(channels)},
        "labels": {structure: index for index, structure in enumerate(["background", *structures])},
        "numTraining": count, "file_ending": ".nii.gz"}


PHANTOMS: dict[str, _Phantom] = {
    "ct": _Phantom(ct_case, "ct", _decathlon_description),
    "multichannel": _Phantom(multichannel_case, "mr", _nnunet_description(
        "MRPhantom", "four-sequence MRI", _MRI_CHANNELS, _MRI_STRUCTURES)),
    "lesion": _Phantom(lesion_case, "lesion", _nnunet_description(
        "LesionPhantom", "three-sequence MRI with a small lesion", _LESION_CHANNELS, _LESION_STRUCTURES)),
    "flat-lesion": _Phantom(flat_lesion_case, "flatlesion", _nnunet_description(
        "FlatLesionPhantom", "three-sequence MRI with a small lesion in few slices", _LESION_CHANNELS,
        _LESION_STRUCTURES)),
}


def write_phantom(folder: str | Path, kind: str = "ct", cases: int = 30, seed: int = 0) -> Path:
    """Write ``cases`` cases of phantom ``kind`` (:data:`PHANTOMS`) into the new folder ``folder``.

    Raises:
        ValueError: unknown ``kind``, fewer than 5 cases (a split needs training, validation and test
            patients), or ``folder`` exists and is not empty.
    """
    if kind not in PHANTOMS:
        raise ValueError(f"Unknown phantom {kind!r}; choose one of {', '.join(PHANTOMS)}.")
    if cases < 5:
        raise ValueError("A phantom needs at least 5 cases to be split into training, validation and test, "
                         f"got {cases}.")
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder} already exists and is not empty; give a new folder with --out.")
    check_output_folder(folder.parent if folder.parent != Path("") else Path("."))
    phantom = PHANTOMS[kind]
    rng = np.random.default_rng(seed)
    staging = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        for index in range(cases):
            case = phantom.make(rng)
            geometry = ImageGeometry(case.spacing)
            name = f"{phantom.prefix}_{index:03d}"
            for channel, image in enumerate(case.channels):
                write_image(staging / "imagesTr" / f"{name}_{channel:04d}.nii.gz", image, geometry)
            write_image(staging / "labelsTr" / f"{name}.nii.gz", case.label, geometry)
        (staging / "dataset.json").write_text(json.dumps(phantom.description(cases), indent=2) + "\n")
        if folder.exists():
            folder.rmdir()  # empty, checked above
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m Datasets.phantoms``: write one phantom folder; bad arguments exit with one sentence."""
    parser = argparse.ArgumentParser(prog="python -m Datasets.phantoms", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=tuple(PHANTOMS), default="ct")
    parser.add_argument("--out", type=Path, required=True, help="new folder for the phantom")
    parser.add_argument("--cases", type=int, default=30, help="number of cases (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args(argv)
    try:
        folder = write_phantom(arguments.out, arguments.kind, arguments.cases, arguments.seed)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    except OSError as error:
        raise SystemExit(f"error: {os_error_sentence(error)}") from None
    print(f"{arguments.kind} phantom of {arguments.cases} cases written to {folder}")
    return 0


if __name__ == "__main__":
    main()
