"""What cardiac function checks before it measures and before it publishes, so that no impossible number leaves it.

Each check raises :class:`~CalibSegLib.cardiac.indices.CardiacError` with one sentence that names what is wrong and
what to do; nothing is written after one:

- **the phases** (before the network runs): ED and ES are two images, not one image twice (:func:`check_distinct`);
- **each phase's input check** (after it is segmented): judged as ``calibseg-predict`` judges a volume
  (:func:`CalibSegLib.input_check.check_input`), an unsuitable phase stops the measurement (:func:`check_suitable`;
  why stop rather than mark: docs/decisions.md);
- **the segmentations**: every structure drawn at ED and at ES (:func:`check_structures`), and the LV blood pool
  smaller at ES than at ED (:func:`check_order`, which names a swap);
- **the result** (:func:`check_result`): every value finite, volumes and mass ≥ 0, each ventricle's ESV ≤ its EDV,
  0 ≤ EF ≤ 100, every interval finite, ordered and holding its value.

:func:`clip_interval` keeps a published interval within its index's range (:data:`INDEX_RANGES`): the reference
never lies outside it, so the coverage is unchanged and the interval only narrower.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Mapping, Sequence

import numpy as np

from CalibSegLib.cardiac.indices import STRUCTURES, CardiacError, PhaseVolumes
from CalibSegLib.interval_rule import INDEX_LABELS, INDICES

__all__ = ["INDEX_RANGES", "STRUCTURE_NAMES", "check_distinct", "check_suitable", "check_structures", "check_order",
           "clip_interval", "check_result"]

# The values each index can take: volumes and mass are not negative, an ejection fraction is a share of the EDV.
INDEX_RANGES: dict[str, tuple[float, float]] = {
    index: (0.0, 100.0) if index.endswith("_percent") else (0.0, math.inf) for index in INDICES}
STRUCTURE_NAMES = {"lv": "LV blood pool", "rv": "RV blood pool", "myocardium": "myocardium"}
_VENTRICLES = (("LV", "lv_edv_ml", "lv_esv_ml"), ("RV", "rv_edv_ml", "rv_esv_ml"))


def check_distinct(images: Sequence[np.ndarray], names: Sequence[str]) -> None:
    """Refuse two phases of equal voxels (one file given twice, a copy of it, or a cine repeating a phase): their
    volumes would give an EF of 0 that no heart has. ``names`` say what each image is, for the sentence."""
    seen: dict[bytes, int] = {}
    for position, image in enumerate(images):
        # Values, not bytes: the same voxels stored as int16 in one file and float32 in another are one image. A
        # digest per phase, not every pair compared: a cine of 30 phases is then 30 passes over its voxels.
        array = np.ascontiguousarray(image, dtype=np.float64)
        digest = hashlib.blake2b(f"{array.shape}".encode() + array.tobytes()).digest()
        if digest in seen:
            first = names[seen[digest]]
            raise CardiacError(f"{first[:1].upper()}{first[1:]} and {names[position]} are the same image (equal "
                               "voxels), so no heart's contraction lies between them; give the end-diastolic and the "
                               "end-systolic phase of one cine.")
        seen[digest] = position


def check_suitable(input_check: Mapping[str, Any], name: str) -> None:
    """Refuse a phase the input check calls unsuitable (``input_check`` as
    :func:`~CalibSegLib.input_check.check_input` returns it; ``suitable`` None, a bundle without input statistics,
    passes), naming the phase and the check's first reason."""
    if input_check["suitable"] is not False:
        return
    reason = input_check["reasons"][0].rstrip(".")
    raise CardiacError(f"{name} is unlike the model's training images ({reason[:1].lower()}{reason[1:]}), so no "
                       "volume measured on it can be trusted; check it with calibseg-predict and give a short-axis "
                       "cine like the model's training images.")


def check_structures(ed: PhaseVolumes, es: PhaseVolumes) -> None:
    """Refuse a measurement where a structure is drawn nowhere at ED or at ES (an image without a heart, a phase
    cut off): its volumes would be 0 and its EF undefined."""
    for phase, volumes in (("ED", ed), ("ES", es)):
        missing = [STRUCTURE_NAMES[structure] for structure in STRUCTURES if volumes.structure(structure).hard <= 0]
        if missing:
            raise CardiacError(f"No {' and no '.join(missing)} is segmented at {phase}, so its volumes cannot be "
                               "measured; give short-axis images that cover both ventricles at ED and at ES.")


def check_order(ed: PhaseVolumes, es: PhaseVolumes) -> None:
    """Refuse ED and ES whose LV blood pool is not smaller at ES (as segmented): the phases are swapped, or they are
    two images of one time point."""
    diastole, systole = ed.lv.hard, es.lv.hard
    if systole >= diastole:
        raise CardiacError(f"The LV blood pool is {systole:.1f} mL at ES and {diastole:.1f} mL at ED, not smaller "
                           "at ES, so ED and ES look swapped (or are one time point); give the end-diastolic phase "
                           "as ED and the end-systolic one as ES.")


def clip_interval(index: str, interval: tuple[float, float]) -> tuple[float, float]:
    """``interval`` within :data:`INDEX_RANGES` of ``index``."""
    low, high = INDEX_RANGES[index]
    return min(max(interval[0], low), high), max(min(interval[1], high), low)


def check_result(values: Mapping[str, float], intervals: Mapping[str, tuple[float, float] | None]) -> None:
    """Refuse a result that no heart has (module docstring), naming the index; called before anything is written."""
    for ventricle, diastolic, systolic in _VENTRICLES:
        if values[systolic] > values[diastolic]:
            raise CardiacError(f"The {ventricle} end-systolic volume ({values[systolic]:.1f} mL) exceeds its "
                               f"end-diastolic volume ({values[diastolic]:.1f} mL), which no heart does, so its "
                               "contours are wrong at ED or ES; check them with calibseg-predict.")
    for index in INDICES:
        value, (low, high), (label, unit) = values[index], INDEX_RANGES[index], INDEX_LABELS[index]
        if not (math.isfinite(value) and low <= value <= high):
            raise CardiacError(f"The measured {label} is {value:.4g} {unit}, outside the {low:g} to {high:g} {unit} "
                               "a heart can have, so the segmentation is not of a heart's ventricles; check it with "
                               "calibseg-predict.")
        interval = intervals[index]
        if interval is not None and not (all(map(math.isfinite, interval)) and interval[0] <= value <= interval[1]):
            raise CardiacError(f"The interval of the {label}, {interval[0]:.4g} to {interval[1]:.4g} {unit}, does "
                               f"not hold its value {value:.4g} {unit}; refit the bundle's interval rule "
                               "(docs/function.md).")
