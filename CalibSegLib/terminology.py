"""Standard terminology of a model's classes: the coded concepts DICOM SEG export and Slicer read.

``bundle.json``'s optional ``class_terminology`` maps foreground class names to a
:class:`TerminologyEntry` — category and type, an optional type modifier, an optional anatomic
region with its optional modifier — each a :class:`CodedConcept` (coding scheme designator, code
value, code meaning), as in DCMQI's segmentation-context JSON (``CodingSchemeDesignator``,
``CodeValue``, ``CodeMeaning``). :func:`parse_class_terminology` checks it on load;
:meth:`TerminologyEntry.slicer_string` is the value of a Slicer segment's ``TerminologyEntry``
tag. Without an entry Slicer falls back to its generic "Tissue" (SCT 85756007).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = ["CATEGORY_CONTEXT", "REGION_CONTEXT", "TerminologyError", "CodedConcept", "TerminologyEntry",
           "parse_class_terminology", "terminology_to_dict"]

# Slicer's names of the DICOM master lists the codes come from (Modules/Loadable/Terminologies/Resources/
# SegmentationCategoryTypeModifier-DICOM-Master.json and AnatomicRegionAndModifier-DICOM-Master.json).
CATEGORY_CONTEXT = "Segmentation category and type - DICOM master list"
REGION_CONTEXT = "Anatomic codes - DICOM master list"
# DICOM value representations: the designator is SH (16 characters), the value and the meaning at most 64.
_LIMITS = {"CodingSchemeDesignator": 16, "CodeValue": 64, "CodeMeaning": 64}
# Slicer's serialisation separates the parts of an entry with "~" and a concept's fields with "^".
_SEPARATORS = ("~", "^")
_PARTS = ("category", "type", "type_modifier", "region", "region_modifier")
_REQUIRED = ("category", "type")


class TerminologyError(ValueError):
    """Stored terminology is malformed; the message says why in a phrase (``load_bundle`` wraps it in one sentence)."""


@dataclass(frozen=True)
class CodedConcept:
    """One code: ``scheme`` (e.g. ``SCT`` for SNOMED CT), ``value`` (e.g. ``53085002``) and ``meaning``."""

    scheme: str
    value: str
    meaning: str

    @classmethod
    def from_dict(cls, values: Any, phrase: str) -> "CodedConcept":
        if not isinstance(values, dict) or set(values) != set(_LIMITS):
            raise TerminologyError(f"{phrase} must be an object with exactly {', '.join(_LIMITS)}")
        for key, limit in _LIMITS.items():
            text = values[key]
            if not isinstance(text, str) or not text.strip() or len(text) > limit or any(
                    separator in text for separator in _SEPARATORS):
                raise TerminologyError(f"{phrase}'s {key} must be non-empty text of at most {limit} characters "
                                       f"without '~' or '^', got {text!r}")
        return cls(values["CodingSchemeDesignator"], values["CodeValue"], values["CodeMeaning"])

    def to_dict(self) -> dict[str, str]:
        return {"CodingSchemeDesignator": self.scheme, "CodeValue": self.value, "CodeMeaning": self.meaning}

    def slicer_string(self) -> str:
        return f"{self.scheme}^{self.value}^{self.meaning}"


@dataclass(frozen=True)
class TerminologyEntry:
    """A class's terminology: category and type, optional type modifier, anatomic region and region modifier."""

    category: CodedConcept
    type: CodedConcept
    type_modifier: CodedConcept | None = None
    region: CodedConcept | None = None
    region_modifier: CodedConcept | None = None

    @classmethod
    def from_dict(cls, values: Any, phrase: str) -> "TerminologyEntry":
        if not isinstance(values, dict) or not set(_REQUIRED) <= set(values) <= set(_PARTS):
            raise TerminologyError(f"{phrase} must be an object with category and type, and optionally "
                                   f"type_modifier, region and region_modifier")
        if "region_modifier" in values and "region" not in values:
            raise TerminologyError(f"{phrase} has a region_modifier but no region")
        return cls(**{part: CodedConcept.from_dict(values[part], f"{phrase}'s {part}")
                      for part in _PARTS if part in values})

    def to_dict(self) -> dict[str, dict[str, str]]:
        return {part: concept.to_dict() for part in _PARTS if (concept := getattr(self, part)) is not None}

    def slicer_string(self) -> str:
        """The value of a Slicer segment's ``TerminologyEntry`` tag.

        Slicer's ``vtkSlicerTerminologiesModuleLogic::SerializeTerminologyEntry`` writes seven ``~``-separated
        parts: category context name, category, type, type modifier, region context name, region, region
        modifier; each concept is ``scheme^value^meaning``, ``^^`` when absent, and the region context is empty
        without a region.
        """
        def concept(value: CodedConcept | None) -> str:
            return value.slicer_string() if value is not None else "^^"

        return "~".join([CATEGORY_CONTEXT, concept(self.category), concept(self.type), concept(self.type_modifier),
                         REGION_CONTEXT if self.region is not None else "", concept(self.region),
                         concept(self.region_modifier)])


def parse_class_terminology(values: Any, class_names: Sequence[str]) -> dict[str, TerminologyEntry]:
    """``bundle.json``'s ``class_terminology``: foreground class name → :class:`TerminologyEntry`.

    Classes without an entry are allowed (Slicer shows its generic terminology for them); the background is not a
    segment and takes none.

    Raises:
        TerminologyError: not an object, a name that is no foreground class, or a malformed entry.
    """
    if not isinstance(values, dict):
        raise TerminologyError(f"it must be an object from class name to entry, got {type(values).__name__}")
    foreground = set(class_names[1:])
    unknown = sorted(str(name) for name in values if name not in foreground)
    if unknown:
        raise TerminologyError(f"it names {', '.join(unknown)}, not foreground classes of the model")
    return {name: TerminologyEntry.from_dict(entry, f"the entry of {name}") for name, entry in values.items()}


def terminology_to_dict(entries: Mapping[str, TerminologyEntry]) -> dict[str, dict[str, dict[str, str]]]:
    """Plain JSON for ``bundle.json``'s ``class_terminology``."""
    return {name: entry.to_dict() for name, entry in entries.items()}
