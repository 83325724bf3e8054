"""The cardiac indices of an ED/ES pair, their per-case scale, and the interval rule that turns both into 90 %
intervals (split-conformal, scaled per case).

**Indices** (:data:`INDICES`), from the structures' volumes of the two phases (:class:`~.indices.PhaseVolumes`,
read as ``hard`` label volumes or ``soft`` probability sums): LV EDV, ESV, SV = EDV − ESV, EF = 100 · SV / EDV;
RV EDV, ESV, EF; myocardial mass = 1.05 g/mL × the myocardium's volume at ED.

**Scale** (per case, in the index's unit): ``spread`` propagates each volume's uncertain band
(Σ p (1 − p) × voxel volume) to the index to first order, adding the magnitudes (a boundary drawn too wide at ED is
not independent of one drawn too wide at ES): s(EDV) = b_ED, s(SV) = b_ED + b_ES,
s(EF) = 100 (ESV · b_ED + EDV · b_ES) / EDV², s(mass) = 1.05 b_myo,ED. ``constant`` is 1 for every case (plain
split-conformal, one width for all).

**Rule** (split-conformal, Vovk et al. 2005; Lei et al., JASA 2018, for the scaled form): on n calibration
patients the score of an index is |reference − estimate| / scale; q is the ⌈(n + 1) · level⌉-th smallest score
(infinite when that rank exceeds n); a new case's interval is estimate ± q · scale. For a new patient exchangeable
with the calibration patients it covers the reference with probability ≥ level, by construction
(:func:`conformal_quantile`). The calibration patients must be predicted the way the rule is applied
(out-of-fold single networks, :mod:`Evaluation.function_intervals`; how an ensemble applies it: docs/function.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from CalibSegLib.cardiac.indices import MYOCARDIUM_DENSITY_G_PER_ML, PhaseVolumes

__all__ = ["INDICES", "LEVEL", "ESTIMATES", "SCALES", "IntervalRuleError", "index_values", "index_scales",
           "case_indices", "conformal_quantile", "IntervalRule", "fit_rule"]

INDICES: tuple[str, ...] = ("lv_edv_ml", "lv_esv_ml", "lv_sv_ml", "lv_ef_percent", "rv_edv_ml", "rv_esv_ml",
                            "rv_ef_percent", "myocardium_mass_g")
LEVEL = 0.9
ESTIMATES = ("hard", "soft")  # label volumes, probability sums
SCALES = ("spread", "constant")


class IntervalRuleError(ValueError):
    """A stored interval rule is malformed; the message says why in a phrase."""


def _ejection_fraction(diastole: float, systole: float) -> float:
    return 100.0 * (diastole - systole) / diastole if diastole > 0 else math.nan


def index_values(ed: Mapping[str, float], es: Mapping[str, float]) -> dict[str, float]:
    """The :data:`INDICES` from each structure's volume in mL (``{"lv", "rv", "myocardium"}``) at ED and ES; an EF
    is NaN when its EDV is 0."""
    return {"lv_edv_ml": ed["lv"], "lv_esv_ml": es["lv"], "lv_sv_ml": ed["lv"] - es["lv"],
            "lv_ef_percent": _ejection_fraction(ed["lv"], es["lv"]), "rv_edv_ml": ed["rv"], "rv_esv_ml": es["rv"],
            "rv_ef_percent": _ejection_fraction(ed["rv"], es["rv"]),
            "myocardium_mass_g": MYOCARDIUM_DENSITY_G_PER_ML * ed["myocardium"]}


def _ef_scale(diastole: float, systole: float, band_diastole: float, band_systole: float) -> float:
    return 100.0 * (systole * band_diastole + diastole * band_systole) / diastole ** 2 if diastole > 0 else math.nan


def index_scales(ed: PhaseVolumes, es: PhaseVolumes, estimate: str, scale: str) -> dict[str, float]:
    """Each index's per-case scale (module docstring) for the ``estimate`` (:data:`ESTIMATES`) and ``scale``
    (:data:`SCALES`) named."""
    if scale == "constant":
        return dict.fromkeys(INDICES, 1.0)
    volume = {name: (getattr(ed.structure(name), estimate), getattr(es.structure(name), estimate))
              for name in ("lv", "rv")}
    band = {name: (ed.structure(name).spread, es.structure(name).spread) for name in ("lv", "rv", "myocardium")}
    return {"lv_edv_ml": band["lv"][0], "lv_esv_ml": band["lv"][1], "lv_sv_ml": sum(band["lv"]),
            "lv_ef_percent": _ef_scale(*volume["lv"], *band["lv"]), "rv_edv_ml": band["rv"][0],
            "rv_esv_ml": band["rv"][1],
            "rv_ef_percent": _ef_scale(*volume["rv"], *band["rv"]),
            "myocardium_mass_g": MYOCARDIUM_DENSITY_G_PER_ML * band["myocardium"][0]}


def case_indices(ed: PhaseVolumes, es: PhaseVolumes, estimate: str, scale: str
                 ) -> tuple[dict[str, float], dict[str, float]]:
    """One case's index values and scales, read with ``estimate`` and ``scale``."""
    values = index_values({name: getattr(ed.structure(name), estimate) for name in ("lv", "rv", "myocardium")},
                          {name: getattr(es.structure(name), estimate) for name in ("lv", "rv", "myocardium")})
    return values, index_scales(ed, es, estimate, scale)


def conformal_quantile(scores: Sequence[float], level: float = LEVEL) -> float:
    """The ⌈(n + 1) · level⌉-th smallest of n finite ``scores`` (NaN ones dropped), ``inf`` when that rank exceeds
    n: the split-conformal quantile whose interval covers a new exchangeable case with probability ≥ ``level``."""
    finite = np.sort(np.asarray([value for value in scores if not math.isnan(value)], dtype=np.float64))
    rank = math.ceil((len(finite) + 1) * level)
    return float(finite[rank - 1]) if rank <= len(finite) else math.inf


@dataclass(frozen=True)
class IntervalRule:
    """A fitted rule: point ``estimate`` (``hard`` or ``soft`` volumes), per-case ``scale`` (``spread`` or
    ``constant``), the ``level``, one score quantile per index (``quantiles``) and what it was fitted on
    (``fitted_on``: free JSON, e.g. patients and networks)."""

    estimate: str
    scale: str
    quantiles: dict[str, float]
    level: float = LEVEL
    fitted_on: dict[str, Any] = field(default_factory=dict)

    def interval(self, index: str, value: float, scale: float) -> tuple[float, float]:
        """``value ± q · scale`` of ``index``; NaN ends when the value or the scale is not finite."""
        half = self.quantiles[index] * scale
        if not (math.isfinite(value) and math.isfinite(half)):
            return math.nan, math.nan
        return value - half, value + half

    def to_dict(self) -> dict[str, Any]:
        return {"estimate": self.estimate, "scale": self.scale, "level": self.level,
                "quantiles": dict(self.quantiles), "fitted_on": dict(self.fitted_on)}

    @classmethod
    def from_dict(cls, values: Any) -> "IntervalRule":
        """The rule stored by :meth:`to_dict`.

        Raises:
            IntervalRuleError: a missing or unknown estimate, scale, level or quantile (a phrase saying which).
        """
        if not isinstance(values, dict):
            raise IntervalRuleError(f"it must be an object, got {type(values).__name__}")
        if values.get("estimate") not in ESTIMATES or values.get("scale") not in SCALES:
            raise IntervalRuleError(f"its estimate must be one of {', '.join(ESTIMATES)} and its scale one of "
                                    f"{', '.join(SCALES)}, got {values.get('estimate')!r} and {values.get('scale')!r}")
        level = values.get("level")
        if not isinstance(level, (int, float)) or isinstance(level, bool) or not 0 < level < 1:
            raise IntervalRuleError(f"its level must be a number in (0, 1), got {level!r}")
        quantiles = values.get("quantiles")
        if not isinstance(quantiles, dict) or set(quantiles) != set(INDICES) or not all(
                isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
                for value in quantiles.values()):
            raise IntervalRuleError(f"its quantiles must give each of {', '.join(INDICES)} a number >= 0")
        fitted_on = values.get("fitted_on", {})
        if not isinstance(fitted_on, dict):
            raise IntervalRuleError("its fitted_on must be an object")
        return cls(values["estimate"], values["scale"], {key: float(quantiles[key]) for key in INDICES},
                   float(level), fitted_on)


def fit_rule(cases: Sequence[tuple[PhaseVolumes, PhaseVolumes]], references: Sequence[Mapping[str, float]],
             estimate: str, scale: str, level: float = LEVEL, fitted_on: Mapping[str, Any] | None = None
             ) -> IntervalRule:
    """Fit the rule on calibration patients: their predicted ``(ED, ES)`` volumes and their reference indices
    (:func:`index_values` of the label volumes), one patient per entry."""
    scores: dict[str, list[float]] = {index: [] for index in INDICES}
    for (ed, es), reference in zip(cases, references, strict=True):
        values, scales = case_indices(ed, es, estimate, scale)
        for index in INDICES:
            scores[index].append(abs(reference[index] - values[index]) / scales[index] if scales[index] > 0
                                 else math.nan)
    return IntervalRule(estimate, scale, {index: conformal_quantile(scores[index], level) for index in INDICES},
                        level, dict(fitted_on or {}))
