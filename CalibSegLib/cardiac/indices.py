"""Volumes (mL) and mass (g) of the heart's structures in one segmented phase.

The structures are found by their SNOMED CT codes in the bundle's ``class_terminology``
(:mod:`CalibSegLib.terminology`), never by their names: the left ventricle's blood pool (type 87878005), the right
ventricle's (53085002) and the myocardium (74281007). A structure's volume is measured two ways on the input's grid:

- ``hard``: its voxels in the label map (argmax after the bundle's post-processing) × the voxel's volume;
- ``soft``: the sum of its probability over all voxels × the voxel's volume (the volume the probabilities expect);

and one spread, ``spread`` = Σ p (1 − p) over all voxels × the voxel's volume: the volume of the structure's
uncertain band (0 where every voxel is sure), the per-case scale of the interval rule (:mod:`.intervals`).

Mass = myocardial volume × 1.05 g/mL (the density the cardiac tools and ACDC use).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["MYOCARDIUM_DENSITY_G_PER_ML", "STRUCTURE_CODES", "STRUCTURES", "CardiacError", "CardiacClasses",
           "cardiac_classes", "voxel_volume_ml", "label_volumes_ml", "StructureVolume", "PhaseVolumes",
           "ProbabilityTally", "phase_volumes"]

MYOCARDIUM_DENSITY_G_PER_ML = 1.05
# SNOMED CT type codes of the three structures (Datasets.acdc.ACDC_TERMINOLOGY says where each comes from).
STRUCTURE_CODES: dict[str, str] = {"lv": "87878005", "rv": "53085002", "myocardium": "74281007"}
STRUCTURES: tuple[str, ...] = tuple(STRUCTURE_CODES)
_MEANINGS = {"lv": "left ventricle", "rv": "right ventricle", "myocardium": "myocardium"}


class CardiacError(ValueError):
    """Cardiac function cannot be measured; the message says why in one sentence."""


@dataclass(frozen=True)
class CardiacClasses:
    """Class indices (into the bundle's ``class_names``) of the LV blood pool, the RV blood pool, the myocardium."""

    lv: int
    rv: int
    myocardium: int

    def index(self, structure: str) -> int:
        """The class index of ``structure`` (one of :data:`STRUCTURES`)."""
        return getattr(self, structure)


def cardiac_classes(class_names: Sequence[str], class_terminology: Mapping[str, Any] | None) -> CardiacClasses:
    """The classes whose terminology type is the SNOMED CT code of each structure (:data:`STRUCTURE_CODES`).

    Args:
        class_names: the bundle's classes, background first.
        class_terminology: the bundle's ``class_terminology`` (class name → entry with ``type`` as DICOM coded
            concept JSON: ``CodingSchemeDesignator``, ``CodeValue``, ``CodeMeaning``), or None.

    Raises:
        CardiacError: a structure has no class with its code, or two classes carry the same one.
    """
    found: dict[str, list[int]] = {structure: [] for structure in STRUCTURES}
    for name, entry in (class_terminology or {}).items():
        concept = entry.get("type", {}) if isinstance(entry, Mapping) else {}
        for structure, code in STRUCTURE_CODES.items():
            if concept.get("CodingSchemeDesignator") == "SCT" and concept.get("CodeValue") == code \
                    and name in class_names:
                found[structure].append(list(class_names).index(name))
    missing = [f"{_MEANINGS[structure]} (SCT {STRUCTURE_CODES[structure]})"
               for structure, indices in found.items() if not indices]
    if missing:
        raise CardiacError(f"The bundle's terminology codes no class as {', '.join(missing)}, so cardiac function "
                           "cannot be measured with it; use a cardiac bundle such as acdc_ce_dice.")
    doubled = [_MEANINGS[structure] for structure, indices in found.items() if len(indices) > 1]
    if doubled:
        raise CardiacError(f"The bundle's terminology codes several classes as {', '.join(doubled)}, so its volume "
                           "is ambiguous; give each structure's code to one class.")
    return CardiacClasses(**{structure: indices[0] for structure, indices in found.items()})


def voxel_volume_ml(spacing: Sequence[float]) -> float:
    """The volume in mL of one voxel of ``spacing`` ``(z, y, x)`` mm (1 mL = 1000 mm³)."""
    return float(np.prod(np.asarray(spacing, dtype=np.float64))) / 1000.0


def label_volumes_ml(labels: np.ndarray, spacing: Sequence[float], classes: CardiacClasses) -> dict[str, float]:
    """Each structure's volume in mL in a ``(z, y, x)`` label map of voxel ``spacing`` (z, y, x) mm."""
    counts = np.bincount(np.asarray(labels).ravel().astype(np.int64),
                         minlength=max(classes.lv, classes.rv, classes.myocardium) + 1)
    voxel = voxel_volume_ml(spacing)
    return {structure: float(counts[classes.index(structure)]) * voxel for structure in STRUCTURES}


@dataclass(frozen=True)
class StructureVolume:
    """One structure in one phase, in mL: ``hard`` (label voxels), ``soft`` (probability sum) and ``spread``
    (Σ p (1 − p), the uncertain band's volume); ``predicted_dice`` the bundle's quality model's predicted Dice of
    the structure's label map (None where it was not measured; 0 where the structure is drawn nowhere)."""

    hard: float
    soft: float
    spread: float
    predicted_dice: float | None = None


@dataclass(frozen=True)
class PhaseVolumes:
    """The three structures of one phase (:class:`StructureVolume` each, mL)."""

    lv: StructureVolume
    rv: StructureVolume
    myocardium: StructureVolume

    def structure(self, name: str) -> StructureVolume:
        return getattr(self, name)

    def to_dict(self) -> dict[str, dict[str, float | None]]:
        return asdict(self)

    def with_predicted_dice(self, dice: Mapping[str, float]) -> "PhaseVolumes":
        """These volumes with each structure's predicted Dice ``dice`` (structure → Dice)."""
        return PhaseVolumes(**{structure: replace(self.structure(structure), predicted_dice=float(dice[structure]))
                               for structure in STRUCTURES})

    @classmethod
    def from_dict(cls, values: Mapping[str, Mapping[str, float]]) -> "PhaseVolumes":
        return cls(**{structure: StructureVolume(**values[structure]) for structure in STRUCTURES})


class ProbabilityTally:
    """Per-class Σ p and Σ p (1 − p) over a volume, fed batch by batch as a
    :data:`~CalibSegLib.inference.ProbabilitySink` (so the ``(C, z, y, x)`` probabilities never need to exist whole).
    """

    def __init__(self, num_classes: int) -> None:
        self.sums = np.zeros(num_classes)
        self.spreads = np.zeros(num_classes)

    def __call__(self, slices: slice, probabilities: np.ndarray) -> None:
        """Add a batch's ``(C, n, *in-plane)`` probabilities."""
        values = probabilities.reshape(probabilities.shape[0], -1).astype(np.float64)
        self.sums += values.sum(axis=1)
        self.spreads += (values * (1.0 - values)).sum(axis=1)

    def add_volume(self, probabilities: np.ndarray) -> "ProbabilityTally":
        """Add a whole ``(C, z, y, x)`` probability volume; returns the tally."""
        self(slice(None), probabilities)
        return self


def phase_volumes(labels: np.ndarray, tally: ProbabilityTally, spacing: Sequence[float],
                  classes: CardiacClasses) -> PhaseVolumes:
    """The structures of one predicted phase: ``labels`` ``(z, y, x)`` (post-processed argmax), ``tally`` of its
    probabilities, voxel ``spacing`` ``(z, y, x)`` mm."""
    hard = label_volumes_ml(labels, spacing, classes)
    voxel = voxel_volume_ml(spacing)
    return PhaseVolumes(**{structure: StructureVolume(
        hard=hard[structure], soft=float(tally.sums[classes.index(structure)]) * voxel,
        spread=float(tally.spreads[classes.index(structure)]) * voxel) for structure in STRUCTURES})
