"""One stored prediction: a member's (or the ensemble's) pass over one case, reduced to what the fits read.

A record holds, for one case predicted by one network under the bundle's settings (temperature, mirroring,
post-processing, :func:`CalibSegLib.bundle.member_metadata`):

- ``features``: the quality features of every foreground class (:func:`CalibSegLib.quality.structure_features`,
  ``None`` where the class is drawn nowhere) and ``dice``, the measured Dice ``(C - 1,)`` against the reference;
- ``volumes``: for a cardiac bundle, each structure's volume in mL from the hard labels and from the probability
  sums with its spread Σ p (1 − p) (:class:`CalibSegLib.cardiac.indices.PhaseVolumes` as a dict), and
  ``reference_ml``, the reference label's volumes;
- ``voxels``: how many voxels the prediction's labels give each foreground class ``(C - 1,)``: where the ensemble's
  own prediction (whose quality features are left empty) draws a structure at all, which decides its review flag
  (null in a record written without the count);
- ``role``: ``out_of_fold`` (the member never trained on the case's patient) or ``test`` (a test patient; the
  member ``"ensemble"`` is the ensemble's own prediction, the mean of its members' probabilities);
- ``degradation``: None for the volume as it is; for a test patient's deliberately degraded copy, the name of the
  degradation (:data:`Evaluation.quality_report.DEGRADATIONS`), which the evaluation's quality check is measured on.

Everything is JSON numbers and strings: reading a store runs no code (no pickle).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["STORE_VERSION", "OUT_OF_FOLD", "TEST", "ROLES", "ENSEMBLE", "StoreError", "StoreRecord",
           "check_header"]

STORE_VERSION = 1  # raised when a field changes meaning; a record of another version is refused, not guessed at
OUT_OF_FOLD, TEST = "out_of_fold", "test"
ROLES = (OUT_OF_FOLD, TEST)
ENSEMBLE = "ensemble"  # the member name of the ensemble's own prediction of a test case


class StoreError(ValueError):
    """A store record that cannot be read as this version writes it (one sentence: which file, which field)."""


def check_header(values: Any, source: str) -> None:
    """Check what every stored record begins with: a JSON object of this version naming its case, patient and
    weights.

    Raises:
        StoreError: one sentence naming ``source`` and the field that is wrong.
    """
    if not isinstance(values, Mapping):
        raise StoreError(f"{source} is no JSON object; rebuild the store with calibseg-store.")
    if values.get("version") != STORE_VERSION:
        raise StoreError(f"{source} is store version {values.get('version')!r}, this CalibSeg reads version "
                         f"{STORE_VERSION}; rebuild the store with calibseg-store.")
    for name in ("case", "patient", "weights_sha256"):
        if not isinstance(values.get(name), str) or not values[name]:
            raise StoreError(f"{source} has no {name}.")


@dataclass(frozen=True)
class StoreRecord:
    """One case predicted by one member (an int) or by the ensemble (:data:`ENSEMBLE`), as the module says."""

    case: str
    patient: str
    member: int | str
    role: str
    weights_sha256: str
    dice: list[float]
    features: list[dict[str, float] | None]
    volumes: dict[str, dict[str, float | None]] | None = None
    reference_ml: dict[str, float] | None = None
    voxels: list[int] | None = None
    degradation: str | None = None

    @property
    def key(self) -> tuple[str, int | str]:
        """``(case, member)``: what one record is of, within one bundle's weights."""
        return self.case, self.member

    def to_dict(self) -> dict[str, Any]:
        return {"version": STORE_VERSION, "case": self.case, "patient": self.patient, "member": self.member,
                "role": self.role, "weights_sha256": self.weights_sha256, "dice": list(self.dice),
                "features": self.features, "volumes": self.volumes, "reference_ml": self.reference_ml,
                "voxels": self.voxels, "degradation": self.degradation}

    @classmethod
    def from_dict(cls, values: Any, source: str = "a store record") -> "StoreRecord":
        """The record of a JSON object, checked field by field.

        Raises:
            StoreError: another version, a missing or mistyped field (one sentence naming ``source``).
        """
        check_header(values, source)
        member = values.get("member")
        if not (member == ENSEMBLE or (isinstance(member, int) and not isinstance(member, bool) and member >= 0)):
            raise StoreError(f"{source} has member {member!r}, neither a member number nor {ENSEMBLE!r}.")
        if values.get("role") not in ROLES:
            raise StoreError(f"{source} has role {values.get('role')!r}, not one of {', '.join(ROLES)}.")
        dice, features = values.get("dice"), values.get("features")
        if not isinstance(dice, list) or not all(isinstance(value, (int, float)) for value in dice):
            raise StoreError(f"{source} has no list of measured Dice.")
        if not isinstance(features, list) or len(features) != len(dice) or not all(
                item is None or (isinstance(item, Mapping) and all(
                    isinstance(value, (int, float)) and not math.isinf(value) for value in item.values()))
                for item in features):
            raise StoreError(f"{source} has no quality features of each of its {len(dice)} classes.")
        for name in ("volumes", "reference_ml"):
            if values.get(name) is not None and not isinstance(values[name], Mapping):
                raise StoreError(f"{source} has {name} that is no JSON object.")
        voxels, degradation = values.get("voxels"), values.get("degradation")
        if voxels is not None and (not isinstance(voxels, list) or len(voxels) != len(dice) or not all(
                isinstance(value, int) and not isinstance(value, bool) and value >= 0 for value in voxels)):
            raise StoreError(f"{source} has voxels that are no count of each of its {len(dice)} classes.")
        if degradation is not None and (not isinstance(degradation, str) or not degradation):
            raise StoreError(f"{source} has degradation {degradation!r}, neither null nor a name.")
        return cls(values["case"], values["patient"], member, values["role"], values["weights_sha256"],
                   [float(value) for value in dice], [None if item is None else dict(item) for item in features],
                   None if values.get("volumes") is None else {key: dict(value)
                                                               for key, value in values["volumes"].items()},
                   None if values.get("reference_ml") is None else dict(values["reference_ml"]),
                   None if voxels is None else list(voxels), degradation)
