"""The cardiac indices of an ED/ES pair, their per-case scale, and the interval rule that turns both into 90 %
intervals (split-conformal, scaled per case).

**Indices** (:data:`~CalibSegLib.interval_rule.INDICES`), from the structures' volumes of the two phases
(:class:`~.indices.PhaseVolumes`, read as ``hard`` label volumes or ``soft`` probability sums): LV EDV, ESV,
SV = EDV − ESV, EF = 100 · SV / EDV; RV EDV, ESV, EF; myocardial mass = 1.05 g/mL × the myocardium's volume at ED.

**Scale** (per case, in the index's unit): each volume gets a band b in mL, propagated to the index to first
order, adding the magnitudes (a boundary drawn too wide at ED is not independent of one drawn too wide at ES):
s(EDV) = b_ED, s(SV) = b_ED + b_ES, s(EF) = 100 (ESV · b_ED + EDV · b_ES) / EDV², s(mass) = 1.05 b_myo,ED. The
band (:data:`BANDS`): ``spread``, the uncertain band Σ p (1 − p) × voxel volume; ``dice``, (1 − D̂) × the label
volume, D̂ the quality model's predicted Dice (a label map of Dice D off a reference of about its size differs from
it in about 2 (1 − D) V voxels, an upper bound of the volume error, so the band is its half); ``spread_dice_sum``
and ``spread_dice_geometric``, the two bands' sum and geometric mean. ``constant`` is 1 for every case (plain
split-conformal, one width for all).

**Recalibration** (optional): each of the five volumes the indices need (:data:`~CalibSegLib.interval_rule.VOLUMES`)
mapped by a line ``intercept + slope · volume`` fitted by least squares on the calibration patients (a network that
draws the RV too large at ES in most patients has that bias taken out); the indices are then made of the mapped
volumes, the bands scaled by |slope|. A line that would map a volume to 0 mL or below is not applied to it
(:func:`unmapped_volumes`): that volume stays as measured, and ``function.json``'s ``review`` says so.

**Rule** (split-conformal, Vovk et al. 2005; Lei et al., JASA 2018, for the scaled form): on n calibration
patients the score of an index is |reference − estimate| / scale; q is the ⌈(n + 1) · level⌉-th smallest score
(infinite when that rank exceeds n); a new case's interval is estimate ± q · scale. For a new patient exchangeable
with the calibration patients it covers the reference with probability ≥ level, by construction
(:func:`conformal_quantile`). The calibration patients must be predicted the way the rule is applied
(out-of-fold single networks, :mod:`Evaluation.function_intervals`; how an ensemble applies it: docs/function.md).
:func:`fit_rule` fits it and :func:`rule_indices` reads a case as it does; the fitted rule as a bundle stores it,
checked on read, is :class:`CalibSegLib.interval_rule.IntervalRule`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from CalibSegLib.cardiac.indices import MYOCARDIUM_DENSITY_G_PER_ML, PhaseVolumes, StructureVolume
from CalibSegLib.interval_rule import INDICES, LEVEL, VOLUMES, IntervalRule, Recalibration

__all__ = ["BANDS", "RECALIBRATIONS", "index_values", "unmapped_volumes", "phase_pair_volumes", "case_indices",
           "index_scales", "rule_indices", "reference_volumes", "fit_recalibration", "conformal_quantile", "fit_rule"]

RECALIBRATIONS = ("none", "linear")  # the volumes as measured, or mapped by lines fitted on calibration patients


def _dice_band(volume: StructureVolume) -> float:
    """(1 − D̂) × the label volume (mL); NaN without a predicted Dice."""
    return math.nan if volume.predicted_dice is None else (1.0 - volume.predicted_dice) * volume.hard


# Each scale's band of a structure (mL), by the name of the scale (SCALES but "constant"): Σ p (1 − p), the quality
# model's (1 − D̂) × label volume, or both.
BANDS: dict[str, Callable[[StructureVolume], float]] = {
    "spread": lambda volume: volume.spread,
    "dice": _dice_band,
    "spread_dice_sum": lambda volume: volume.spread + _dice_band(volume),
    "spread_dice_geometric": lambda volume: math.sqrt(volume.spread * _dice_band(volume)),
}


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


def _measured(ed: PhaseVolumes, es: PhaseVolumes, key: str) -> StructureVolume:
    """The structure and phase a key of :data:`VOLUMES` names (``rv_es``: the RV at ES)."""
    structure, phase = key.rsplit("_", 1)
    return (ed if phase == "ed" else es).structure(structure)


def unmapped_volumes(ed: PhaseVolumes, es: PhaseVolumes, estimate: str, recalibration: Recalibration | None
                     ) -> list[str]:
    """The :data:`VOLUMES` of an ED/ES pair that ``recalibration``'s lines leave as measured: those a line would
    map to 0 mL or below (a line fitted on hearts of tens of mL says nothing of a cavity of a few, and no volume is
    negative)."""
    if recalibration is None:
        return []
    return [key for key in VOLUMES if recalibration[key][0] + recalibration[key][1] * getattr(
        _measured(ed, es, key), estimate) <= 0]


def phase_pair_volumes(ed: PhaseVolumes, es: PhaseVolumes, estimate: str,
                       recalibration: Recalibration | None = None, band: str = "spread"
                       ) -> tuple[dict[str, float], dict[str, float]]:
    """The :data:`VOLUMES` of an ED/ES pair read as ``estimate`` (mL), recalibrated when a map is given (but for
    :func:`unmapped_volumes`), and their ``band`` (:data:`BANDS`, mL; a line of slope s widens a band by |s|)."""
    unmapped = unmapped_volumes(ed, es, estimate, recalibration)
    volumes, bands = {}, {}
    for key in VOLUMES:
        measured = _measured(ed, es, key)
        intercept, slope = recalibration[key] if recalibration is not None and key not in unmapped else (0.0, 1.0)
        volumes[key] = intercept + slope * getattr(measured, estimate)
        bands[key] = abs(slope) * BANDS[band](measured)
    return volumes, bands


def _indices_of(volumes: Mapping[str, float]) -> dict[str, float]:
    return index_values({"lv": volumes["lv_ed"], "rv": volumes["rv_ed"], "myocardium": volumes["myocardium_ed"]},
                        {"lv": volumes["lv_es"], "rv": volumes["rv_es"], "myocardium": math.nan})


def _scales_of(volumes: Mapping[str, float], bands: Mapping[str, float], scale: str) -> dict[str, float]:
    if scale == "constant":
        return dict.fromkeys(INDICES, 1.0)
    return {"lv_edv_ml": bands["lv_ed"], "lv_esv_ml": bands["lv_es"], "lv_sv_ml": bands["lv_ed"] + bands["lv_es"],
            "lv_ef_percent": _ef_scale(volumes["lv_ed"], volumes["lv_es"], bands["lv_ed"], bands["lv_es"]),
            "rv_edv_ml": bands["rv_ed"], "rv_esv_ml": bands["rv_es"],
            "rv_ef_percent": _ef_scale(volumes["rv_ed"], volumes["rv_es"], bands["rv_ed"], bands["rv_es"]),
            "myocardium_mass_g": MYOCARDIUM_DENSITY_G_PER_ML * bands["myocardium_ed"]}


def case_indices(ed: PhaseVolumes, es: PhaseVolumes, estimate: str, scale: str,
                 recalibration: Recalibration | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """One case's index values and per-case scales (module docstring), read with ``estimate``
    (:data:`ESTIMATES`), ``scale`` (:data:`SCALES`) and, when given, the volumes' ``recalibration``."""
    volumes, bands = phase_pair_volumes(ed, es, estimate, recalibration, "spread" if scale == "constant" else scale)
    return _indices_of(volumes), _scales_of(volumes, bands, scale)


def index_scales(ed: PhaseVolumes, es: PhaseVolumes, estimate: str, scale: str) -> dict[str, float]:
    """Each index's per-case scale for the ``estimate`` and ``scale`` named (no recalibration)."""
    return case_indices(ed, es, estimate, scale)[1]


def reference_volumes(reference: Mapping[str, float]) -> dict[str, float]:
    """The :data:`VOLUMES` a patient's reference indices hold (the myocardium's from the mass)."""
    return {"lv_ed": reference["lv_edv_ml"], "lv_es": reference["lv_esv_ml"], "rv_ed": reference["rv_edv_ml"],
            "rv_es": reference["rv_esv_ml"],
            "myocardium_ed": reference["myocardium_mass_g"] / MYOCARDIUM_DENSITY_G_PER_ML}


def fit_recalibration(cases: Sequence[tuple[PhaseVolumes, PhaseVolumes]],
                      references: Sequence[Mapping[str, float]], estimate: str) -> Recalibration:
    """Least-squares lines from each estimated volume to the reference one over calibration patients."""
    estimated = [phase_pair_volumes(ed, es, estimate)[0] for ed, es in cases]
    observed = [reference_volumes(reference) for reference in references]
    recalibration = {}
    for key in VOLUMES:
        slope, intercept = np.polyfit([item[key] for item in estimated], [item[key] for item in observed], 1)
        recalibration[key] = (float(intercept), float(slope))
    return recalibration


def conformal_quantile(scores: Sequence[float], level: float = LEVEL) -> float:
    """The ⌈(n + 1) · level⌉-th smallest of n finite ``scores`` (NaN ones dropped), ``inf`` when that rank exceeds
    n: the split-conformal quantile whose interval covers a new exchangeable case with probability ≥ ``level``."""
    finite = np.sort(np.asarray([value for value in scores if not math.isnan(value)], dtype=np.float64))
    rank = math.ceil((len(finite) + 1) * level)
    return float(finite[rank - 1]) if rank <= len(finite) else math.inf


def rule_indices(rule: IntervalRule, ed: PhaseVolumes, es: PhaseVolumes
                 ) -> tuple[dict[str, float], dict[str, float]]:
    """A case's index values and scales as ``rule`` reads them: :func:`case_indices` with its estimate, scale and
    recalibration."""
    return case_indices(ed, es, rule.estimate, rule.scale, rule.recalibration)


def _scores(values: Mapping[str, float], scales: Mapping[str, float], reference: Mapping[str, float]
            ) -> dict[str, float]:
    return {index: abs(reference[index] - values[index]) / scales[index] if scales[index] > 0 else math.nan
            for index in INDICES}


def fit_rule(cases: Sequence[tuple[PhaseVolumes, PhaseVolumes]], references: Sequence[Mapping[str, float]],
             estimate: str, scale: str, level: float = LEVEL, fitted_on: Mapping[str, Any] | None = None,
             recalibrate: bool = False) -> IntervalRule:
    """Fit the rule on calibration patients: their predicted ``(ED, ES)`` volumes and their reference indices
    (:func:`index_values` of the label volumes), one patient per entry.

    With ``recalibrate`` the volumes are first mapped by least-squares lines fitted on the same patients
    (:func:`fit_recalibration`); each patient's score then comes from the lines fitted without it (jackknife+,
    Barber et al., Ann. Statist. 2021), so the quantile is not made small by residuals the lines were fitted to.
    """
    scores: dict[str, list[float]] = {index: [] for index in INDICES}
    for held, ((ed, es), reference) in enumerate(zip(cases, references, strict=True)):
        lines = None
        if recalibrate:
            others = [index for index in range(len(cases)) if index != held]
            lines = fit_recalibration([cases[index] for index in others], [references[index] for index in others],
                                      estimate)
        for index, score in _scores(*case_indices(ed, es, estimate, scale, lines), reference).items():
            scores[index].append(score)
    recalibration = fit_recalibration(cases, references, estimate) if recalibrate else None
    return IntervalRule(estimate, scale, {index: conformal_quantile(scores[index], level) for index in INDICES},
                        level, dict(fitted_on or {}), recalibration)
