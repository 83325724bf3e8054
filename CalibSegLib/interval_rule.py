"""The interval rule of cardiac function as a bundle stores it (``bundle.json``'s ``function_intervals``):
:class:`IntervalRule`, the indices it gives intervals for, and its checks on read.

A rule holds its point estimate (:data:`ESTIMATES`), its per-case scale (:data:`SCALES`), its level, one score
quantile per index of :data:`INDICES`, optionally one recalibration line per volume of :data:`VOLUMES`, and what it was
fitted on; :meth:`IntervalRule.interval` is ``value ± q · scale``. What the indices, scales and recalibration mean, how
a case's values and scales are read and how a rule is fitted: :mod:`CalibSegLib.cardiac.intervals`.

The schema stands apart from that fitting and application, and imports neither them nor the bundle:
:mod:`CalibSegLib.bundle` checks a stored rule with it, and the cardiac modules, which read bundles, sit above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["INDICES", "INDEX_LABELS", "LEVEL", "ESTIMATES", "SCALES", "DICE_SCALES", "VOLUMES", "RECALIBRATION_SLOPE",
           "RECALIBRATION_INTERCEPT_ML", "MAX_QUANTILE", "Recalibration", "IntervalRuleError", "IntervalRule"]

INDICES: tuple[str, ...] = ("lv_edv_ml", "lv_esv_ml", "lv_sv_ml", "lv_ef_percent", "rv_edv_ml", "rv_esv_ml",
                            "rv_ef_percent", "myocardium_mass_g")
# What the printout, the report and the sentences of refusals call each index, with its unit.
INDEX_LABELS: dict[str, tuple[str, str]] = {
    "lv_edv_ml": ("LV end-diastolic volume", "mL"), "lv_esv_ml": ("LV end-systolic volume", "mL"),
    "lv_sv_ml": ("LV stroke volume", "mL"), "lv_ef_percent": ("LV ejection fraction", "%"),
    "rv_edv_ml": ("RV end-diastolic volume", "mL"), "rv_esv_ml": ("RV end-systolic volume", "mL"),
    "rv_ef_percent": ("RV ejection fraction", "%"), "myocardium_mass_g": ("Myocardial mass (1.05 g/mL, ED)", "g"),
}
LEVEL = 0.9
ESTIMATES = ("hard", "soft")  # label volumes, probability sums
# Each but "constant" scales by a band of CalibSegLib.cardiac.intervals.BANDS; "constant" is 1 for every case.
SCALES = ("spread", "dice", "spread_dice_sum", "spread_dice_geometric", "constant")
DICE_SCALES = ("dice", "spread_dice_sum", "spread_dice_geometric")  # those that need the predicted Dice
# The volumes the indices are made of: structure and phase (the myocardium's at ED gives the mass).
VOLUMES = ("lv_ed", "lv_es", "rv_ed", "rv_es", "myocardium_ed")
# What a stored rule may hold (checked on read). A recalibration line corrects a network's bias: a slope of 0 would
# give every heart one volume, a negative one reverse the order of hearts, and a slope beyond 2 or below 0.5 or an
# intercept beyond ±100 mL (a whole normal LV) undo more than any segmentation's bias. A score quantile is a number
# of per-case scales; 1000 of them is an interval no reader could use.
RECALIBRATION_SLOPE = (0.5, 2.0)
RECALIBRATION_INTERCEPT_ML = (-100.0, 100.0)
MAX_QUANTILE = 1000.0

Recalibration = dict[str, tuple[float, float]]
"""Per volume of :data:`VOLUMES` the ``(intercept, slope)`` of the line mapping the estimate to the reference."""


class IntervalRuleError(ValueError):
    """A stored interval rule is malformed; the message says why in a phrase."""


@dataclass(frozen=True)
class IntervalRule:
    """A fitted rule: point ``estimate`` (``hard`` or ``soft`` volumes), per-case ``scale`` (:data:`SCALES`), the
    ``level``, one score quantile per index (``quantiles``), the volumes' ``recalibration``
    (None: the volumes as measured) and what it was fitted on (``fitted_on``: free JSON, e.g. patients and
    networks)."""

    estimate: str
    scale: str
    quantiles: dict[str, float]
    level: float = LEVEL
    fitted_on: dict[str, Any] = field(default_factory=dict)
    recalibration: Recalibration | None = None

    def interval(self, index: str, value: float, scale: float) -> tuple[float, float]:
        """``value ± q · scale`` of ``index``; NaN ends when the value or the scale is not finite."""
        half = self.quantiles[index] * scale
        if not (math.isfinite(value) and math.isfinite(half)):
            return math.nan, math.nan
        return value - half, value + half

    @property
    def needs_predicted_dice(self) -> bool:
        """Whether its scale reads the quality model's predicted Dice (:data:`DICE_SCALES`)."""
        return self.scale in DICE_SCALES

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for ``bundle.json``'s ``function_intervals``, as :meth:`from_dict` reads it."""
        return {"estimate": self.estimate, "scale": self.scale, "level": self.level,
                "quantiles": dict(self.quantiles), "fitted_on": dict(self.fitted_on),
                "recalibration": None if self.recalibration is None else
                {key: list(line) for key, line in self.recalibration.items()}}

    @classmethod
    def from_dict(cls, values: Any) -> "IntervalRule":
        """The rule stored by :meth:`to_dict`.

        Raises:
            IntervalRuleError: a missing or unknown estimate, scale or level, a quantile that is not a finite
                number from 0 to :data:`MAX_QUANTILE`, or a recalibration line whose intercept or slope lies outside
                :data:`RECALIBRATION_INTERCEPT_ML` or :data:`RECALIBRATION_SLOPE` (a phrase naming the field).
        """
        if not isinstance(values, dict):
            raise IntervalRuleError(f"it must be an object, got {type(values).__name__}")
        if values.get("estimate") not in ESTIMATES or values.get("scale") not in SCALES:
            raise IntervalRuleError(f"its estimate must be one of {', '.join(ESTIMATES)} and its scale one of "
                                    f"{', '.join(SCALES)}, got {values.get('estimate')!r} and {values.get('scale')!r}")
        level = values.get("level")
        if not _is_number(level) or not 0 < level < 1:
            raise IntervalRuleError(f"its level must be a number in (0, 1), got {level!r}")
        quantiles = values.get("quantiles")
        if not isinstance(quantiles, dict) or set(quantiles) != set(INDICES):
            raise IntervalRuleError(f"its quantiles must give each of {', '.join(INDICES)} a number")
        for index in INDICES:
            _check_bounded(quantiles[index], f"quantile of {index}", (0.0, MAX_QUANTILE))
        fitted_on = values.get("fitted_on", {})
        if not isinstance(fitted_on, dict):
            raise IntervalRuleError("its fitted_on must be an object")
        lines = values.get("recalibration")
        if lines is not None:
            if not isinstance(lines, dict) or set(lines) != set(VOLUMES) or not all(
                    isinstance(line, list) and len(line) == 2 for line in lines.values()):
                raise IntervalRuleError(f"its recalibration must be null or give each of {', '.join(VOLUMES)} an "
                                        "[intercept, slope]")
            for key in VOLUMES:
                _check_bounded(lines[key][0], f"recalibration intercept of {key}", RECALIBRATION_INTERCEPT_ML)
                _check_bounded(lines[key][1], f"recalibration slope of {key}", RECALIBRATION_SLOPE)
        return cls(values["estimate"], values["scale"], {key: float(quantiles[key]) for key in INDICES},
                   float(level), fitted_on,
                   None if lines is None else {key: (float(lines[key][0]), float(lines[key][1])) for key in VOLUMES})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_bounded(value: Any, name: str, bounds: tuple[float, float]) -> None:
    """Raise :class:`IntervalRuleError` naming ``name`` unless ``value`` is a finite number within ``bounds``."""
    if not (_is_number(value) and math.isfinite(value) and bounds[0] <= value <= bounds[1]):
        raise IntervalRuleError(f"its {name} must be a finite number from {bounds[0]:g} to {bounds[1]:g}, got "
                                f"{value!r}")
