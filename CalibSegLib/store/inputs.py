"""What the input check's fit reads of one case: the image statistics against its reference, and every member's
encoder feature vector.

An :class:`InputRecord` holds, for one labelled or test case of an ensemble bundle:

- ``observation``: :func:`CalibSegLib.input_check.observe_volume` of the image with its **reference** labels under
  the bundle's preprocessing (the four families' training ranges are fitted on these);
- ``encoders``: per member (in the bundle's order) the layer it is read at (the member's bottleneck) and the
  volume's ``(F,)`` feature vector there (:func:`CalibSegLib.feature_statistics.volume_vector` of
  :func:`CalibSegLib.features.volume_features`), float64 written as JSON's shortest round-tripping decimal, so a
  refit reads back the very numbers the pass computed.

Every member reads every case (the one it never trained on sets its distance threshold, the others its Gaussian),
so the record is per case, not per (case, member) as :class:`CalibSegLib.store.StoreRecord` is. Plain JSON, no
pickle, validated on read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from CalibSegLib.input_check.observation import VolumeObservation
from CalibSegLib.store.record import STORE_VERSION, StoreError, check_header

__all__ = ["InputRecord", "MemberEncoding"]


@dataclass(frozen=True)
class MemberEncoding:
    """One member's view of a case: the ``layer`` it is read at and the volume's ``(F,)`` feature ``vector``."""

    layer: str
    vector: np.ndarray


def _finite_numbers(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(value, (int, float)) and not isinstance(value, bool)
                                            and math.isfinite(value) for value in values)


def _observation_dict(observation: VolumeObservation) -> dict[str, Any]:
    return {"quantiles": observation.quantiles.tolist(), "structure_intensity": dict(observation.structure_intensity),
            "structure_volume_ml": dict(observation.structure_volume_ml),
            "spacing_mm": list(observation.spacing_mm), "field_of_view_mm": list(observation.field_of_view_mm),
            "grid_mm": list(observation.grid_mm)}


def _observation(values: Any, source: str) -> VolumeObservation:
    fields = ("quantiles", "structure_intensity", "structure_volume_ml", "spacing_mm", "field_of_view_mm", "grid_mm")
    if not isinstance(values, Mapping) or any(name not in values for name in fields):
        raise StoreError(f"{source} has no image observation with {', '.join(fields)}.")
    quantiles = values["quantiles"]
    if not isinstance(quantiles, list) or not quantiles or not all(_finite_numbers(row) for row in quantiles):
        raise StoreError(f"{source} has no intensity quantiles per channel.")
    for name in ("spacing_mm", "field_of_view_mm", "grid_mm"):
        if not _finite_numbers(values[name]) or len(values[name]) != 2:
            raise StoreError(f"{source} has no pair of in-plane {name}.")
    intensity, volume = values["structure_intensity"], values["structure_volume_ml"]
    if not isinstance(intensity, Mapping) or not isinstance(volume, Mapping) or set(intensity) != set(volume) \
            or not _finite_numbers(list(volume.values())) \
            or not all(value is None or _finite_numbers([value]) for value in intensity.values()):
        raise StoreError(f"{source} has no intensity and volume of each structure.")
    return VolumeObservation(np.asarray(quantiles, dtype=np.float64), dict(intensity),
                             {name: float(value) for name, value in volume.items()},
                             tuple(values["spacing_mm"]), tuple(values["field_of_view_mm"]), tuple(values["grid_mm"]))


@dataclass(frozen=True)
class InputRecord:
    """One case as the input check's fit reads it (module docstring)."""

    case: str
    patient: str
    weights_sha256: str
    observation: VolumeObservation
    encoders: tuple[MemberEncoding, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"version": STORE_VERSION, "case": self.case, "patient": self.patient,
                "weights_sha256": self.weights_sha256, "observation": _observation_dict(self.observation),
                "encoders": [{"layer": member.layer, "vector": np.asarray(member.vector, dtype=np.float64).tolist()}
                             for member in self.encoders]}

    @classmethod
    def from_dict(cls, values: Any, source: str = "an input record") -> "InputRecord":
        """The record of a JSON object, checked field by field.

        Raises:
            StoreError: another version, a missing or mistyped field, members' vectors of different lengths (one
                sentence naming ``source``).
        """
        check_header(values, source)
        encoders = values.get("encoders")
        if not isinstance(encoders, list) or not encoders or not all(
                isinstance(item, Mapping) and isinstance(item.get("layer"), str) and _finite_numbers(item.get("vector"))
                and item["vector"] for item in encoders) \
                or len({len(item["vector"]) for item in encoders}) != 1:
            raise StoreError(f"{source} has no encoder vector of one length for each member.")
        return cls(values["case"], values["patient"], values["weights_sha256"],
                   _observation(values.get("observation"), source),
                   tuple(MemberEncoding(item["layer"], np.asarray(item["vector"], dtype=np.float64))
                         for item in encoders))
