"""Cardiac function of an ED/ES pair or a cine: the indices, their 90 % intervals and ``function.json``.

:func:`measure_function` segments the two phases, :func:`measure_cine` every phase of a cine (ED and ES chosen by
:func:`~CalibSegLib.cardiac.phases.choose_phases`); both read the structures' volumes from the bundle's prediction
(an ensemble's: the mean of its members' probabilities) and apply the bundle's interval rule
(``metadata.function_intervals``, :class:`~CalibSegLib.interval_rule.IntervalRule`) to them: its point estimate
(hard label volumes or probability sums), its recalibration of the volumes when it has one, and its per-case
scale. A bundle without a fitted rule still gives every value, with the intervals absent and a sentence saying why.

Nothing impossible is published (:mod:`CalibSegLib.cardiac.checks`): ED and ES must be two images, every phase
passes the bundle's input check as it is segmented, every structure is drawn at ED and ES, the LV is smaller at ES,
and the result's values and intervals are checked before a :class:`FunctionResult` is returned; each refusal is a
:class:`~CalibSegLib.cardiac.indices.CardiacError` of one sentence. Published intervals are clipped to the
index's range (volumes ≥ 0, EF 0–100). What the reader should know before signing the numbers is the result's
``review`` list (empty when there is nothing).

Inputs are 3D ``(z, y, x)`` images with their :class:`~CalibSegLib.io.ImageGeometry` (spacing ``(z, y, x)`` mm):
the ``(array, geometry)`` pairs :func:`CalibSegLib.io.read_image` returns.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from CalibSegLib.bundle import BundleMetadata
from CalibSegLib.cardiac.checks import (STRUCTURE_NAMES, check_distinct, check_order, check_result, check_structures,
                                        check_suitable, clip_interval)
from CalibSegLib.cardiac.indices import (STRUCTURES, CardiacClasses, CardiacError, PhaseVolumes, ProbabilityTally,
                                         cardiac_classes, phase_volumes)
from CalibSegLib.cardiac.intervals import case_indices, rule_indices, unmapped_volumes
from CalibSegLib.cardiac.phases import choose_phases, phase_order
from CalibSegLib.features import feature_distance
from CalibSegLib.inference import Predictor
from CalibSegLib.input_check import check_input
from CalibSegLib.interval_rule import INDEX_LABELS, INDICES, LEVEL, IntervalRule
from CalibSegLib.io import ImageGeometry
from CalibSegLib.prediction import Prediction
from CalibSegLib.quality import quality_summary
from CalibSegLib.quality.review_rule import flagged

__all__ = ["PhaseImage", "REVIEWED_STRUCTURES", "FunctionResult", "stored_rule", "measure_volumes", "function_result",
           "measure_function", "measure_cine"]

PhaseImage = tuple[np.ndarray, ImageGeometry]
"""One phase: a ``(z, y, x)`` image and its geometry."""

_DEFAULT_ESTIMATE = "hard"  # without a rule: the label map's volumes, what a reader of the segmentation would count


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


@dataclass
class FunctionResult:
    """The measured function.

    ``values`` and ``intervals`` per index of :data:`~CalibSegLib.interval_rule.INDICES` (mL, %, g; an
    interval is ``(low, high)``, None when absent, NaN ends when an EF is undefined); ``level`` 0.9;
    ``intervals_absent`` the sentence saying why there are none (None when there are); ``estimate`` the volumes
    the values come from (``hard`` label voxels or ``soft`` probability sums), ``recalibrated`` whether the rule
    mapped them by its lines (then the values differ from the segmentation's volumes); ``ed_volumes`` and ``es_volumes``
    the two phases' structures (:class:`~CalibSegLib.cardiac.indices.PhaseVolumes`); ``predictions`` the ED and
    ES predictions (labels and maps on the input grid, for a report); ``review`` the reasons to check the contours
    before signing the numbers, one sentence each (empty: none); for a cine ``phases`` ``{"ed": i, "es": j}``,
    ``phase_volumes`` every phase's LV and RV volume (mL), ``trigger_times_ms`` and ``phase_rule`` (words).
    """

    values: dict[str, float]
    intervals: dict[str, tuple[float, float] | None]
    level: float
    intervals_absent: str | None
    estimate: str
    recalibrated: bool
    ed_volumes: PhaseVolumes
    es_volumes: PhaseVolumes
    predictions: dict[str, Prediction] = field(default_factory=dict)
    review: list[str] = field(default_factory=list)
    phases: dict[str, int] | None = None
    phase_volumes: list[dict[str, float]] | None = None
    trigger_times_ms: list[float] | None = None
    phase_rule: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``function.json``: every index as ``{"value", "interval": [low, high]}`` (null where undefined or
        absent), ``"level"``, ``"review"`` (the reasons to check the contours first; empty when there are none),
        and why intervals are absent; for a cine ``"phases"`` and ``"phase_volumes"``
        (``[{"phase", "trigger_time_ms", "lv_ml", "rv_ml"}]``: each phase's segmentation volumes as the rule's
        estimate reads them, before any recalibration, the volumes ED and ES were chosen by)."""
        payload: dict[str, Any] = {}
        for index in INDICES:
            interval = self.intervals[index]
            payload[index] = {"value": _number(self.values[index]),
                              "interval": None if interval is None else [_number(end) for end in interval]}
        payload["level"] = self.level
        payload["review"] = list(self.review)
        payload["volumes_from"] = {"hard": "label voxels", "soft": "probability sums"}[self.estimate] + (
            ", recalibrated by the interval rule's lines (fitted out of fold)" if self.recalibrated else "")
        if self.intervals_absent is not None:
            payload["intervals_absent"] = self.intervals_absent
        if self.phases is not None:
            payload["phases"] = dict(self.phases)
            payload["phase_rule"] = self.phase_rule
            payload["phase_volumes"] = [dict(row) for row in self.phase_volumes or []]
        return payload

    def table_lines(self) -> list[str]:
        """The printout: one line per index, value and interval."""
        lines = [f"{'index':<37}{'value':>9}  {int(round(self.level * 100))} % interval"]
        for index in INDICES:
            label, unit = INDEX_LABELS[index]
            value, interval = self.values[index], self.intervals[index]
            shown = "undefined" if not math.isfinite(value) else f"{value:.1f}"
            band = "-" if interval is None or not all(map(math.isfinite, interval)) else \
                f"{interval[0]:.1f} to {interval[1]:.1f}"
            lines.append(f"{label + ' (' + unit + ')':<37}{shown:>9}  {band}")
        if self.intervals_absent is not None:
            lines.append(f"no intervals: {self.intervals_absent}")
        lines += [f"REVIEW before signing: {reason}" for reason in self.review]
        if self.phase_rule is not None:
            lines.append(self.phase_rule)
        return lines


def stored_rule(metadata: BundleMetadata) -> tuple[IntervalRule | None, str | None]:
    """The bundle's interval rule, or None and the sentence saying why there is none."""
    if metadata.function_intervals is None:
        return None, ("the bundle holds no fitted interval rule; fit one with python -m "
                      "Evaluation.function_intervals (docs/function.md).")
    rule = IntervalRule.from_dict(metadata.function_intervals)
    if rule.needs_predicted_dice and metadata.quality is None:
        return None, (f"the bundle's interval rule scales by the quality model's predicted Dice ({rule.scale}), and "
                      "the bundle holds no quality model; refit the rule (docs/function.md).")
    return rule, None


def _predicted_dice(prediction: Prediction, spacing: Sequence[float], metadata: BundleMetadata,
                    classes: CardiacClasses) -> dict[str, float]:
    """Each structure's predicted Dice as the bundle's quality summary gives it (an ensemble's: its members'
    mean); 0 where the structure is drawn nowhere, as the members' mean counts it."""
    structures = quality_summary(prediction, spacing, metadata)["structures"]
    return {structure: structures[metadata.class_names[classes.index(structure)]]["predicted_dice"] or 0.0
            for structure in STRUCTURES}


def measure_volumes(predictor: Predictor, phase: PhaseImage, progress: Callable[[float], None] | None = None,
                    cancel: threading.Event | None = None, name: str = "The image"
                    ) -> tuple[PhaseVolumes, Prediction]:
    """Segment one phase, judge it by the bundle's input check and measure its structures, with their predicted Dice
    when the bundle has a quality model.

    Raises:
        CardiacError: a bundle without the cardiac structures' codes (before the network runs), or a phase the input
            check calls unsuitable (``name`` says which, e.g. ``ED``).
    """
    metadata = predictor.metadata
    classes = cardiac_classes(metadata.class_names, metadata.class_terminology)
    image, geometry = phase
    tally = ProbabilityTally(metadata.num_classes)
    prediction = predictor.predict(image, geometry.spacing, progress=progress, cancel=cancel,
                                   probability_sink=tally)
    if metadata.input_statistics is not None:  # without statistics there is nothing to judge by
        distance = feature_distance(predictor.model, metadata, image, geometry.spacing, predictor.batch_size)
        check_suitable(check_input(metadata, image, geometry.spacing, prediction.labels, distance), name)
    volumes = phase_volumes(prediction.labels, tally, geometry.spacing, classes)
    if metadata.quality is not None:  # the rule's scale may read it, and the review list does
        volumes = volumes.with_predicted_dice(_predicted_dice(prediction, geometry.spacing, metadata, classes))
    return volumes, prediction


def _unmapped_sentence(volume: str) -> str:
    structure, phase = volume.rsplit("_", 1)
    return (f"The {STRUCTURE_NAMES[structure]} at {phase.upper()} is given as measured: the interval rule's "
            "recalibration line would make it 0 mL or less, so this cavity is smaller than any the line was fitted "
            "on; check its contours.")


# The structures whose review flag goes into the review list: the LV blood pool, at ED and ES. Measured on
# acdc_ce_dice (docs/function.md, "The review mark, measured"): with the RV and the myocardium too, 22 of 27
# out-of-fold patients whose LV EF is within 3 points were marked (the RV at ES is flagged in most hearts whatever
# their EF), with the LV alone none, while the two test patients off by most (33 and 9 points) still are.
REVIEWED_STRUCTURES = ("lv",)


def _flagged_sentences(metadata: BundleMetadata, ed: PhaseVolumes, es: PhaseVolumes) -> list[str]:
    """A sentence per phase whose :data:`REVIEWED_STRUCTURES` the bundle's review flag marks (its predicted Dice
    below the review threshold, :func:`CalibSegLib.quality.review_rule.flagged`): the indices made of it may be off."""
    model = metadata.quality
    if model is None:
        return []
    classes = cardiac_classes(metadata.class_names, metadata.class_terminology)
    sentences = []
    for structure in REVIEWED_STRUCTURES:
        threshold = model.review_threshold(metadata.class_names[classes.index(structure)])
        for phase, volumes in (("ED", ed), ("ES", es)):
            dice = volumes.structure(structure).predicted_dice
            if dice is not None and bool(flagged(dice, threshold)):
                sentences.append(f"The {STRUCTURE_NAMES[structure]} at {phase} is flagged for review (predicted "
                                 f"Dice {dice:.2f}, below {threshold:.2f}), so the indices made of it may be off; "
                                 "check its contours before signing.")
    return sentences


def function_result(metadata: BundleMetadata, ed: PhaseVolumes, es: PhaseVolumes) -> FunctionResult:
    """The indices of measured ED and ES volumes, with the intervals of ``metadata``'s rule (module docstring).

    Raises:
        CardiacError: a structure drawn nowhere at ED or ES, an LV not smaller at ES, or a result no heart has (one
            sentence, :mod:`CalibSegLib.cardiac.checks`).
    """
    check_structures(ed, es)
    check_order(ed, es)
    rule, absent = stored_rule(metadata)
    estimate = rule.estimate if rule is not None else _DEFAULT_ESTIMATE
    values, scales = rule_indices(rule, ed, es) if rule is not None else case_indices(ed, es, estimate, "constant")
    intervals = {index: None if rule is None else clip_interval(index, rule.interval(index, values[index],
                                                                                    scales[index]))
                 for index in INDICES}
    check_result(values, intervals)
    review = _flagged_sentences(metadata, ed, es) + [
        _unmapped_sentence(volume) for volume in
        (unmapped_volumes(ed, es, estimate, rule.recalibration) if rule is not None else [])]
    return FunctionResult(values, intervals, rule.level if rule is not None else LEVEL, absent, estimate,
                          rule is not None and rule.recalibration is not None, ed, es, review=review)


def _check_geometry(phases: Sequence[PhaseImage], names: Sequence[str]) -> None:
    first_image, first_geometry = phases[0]
    for name, (image, geometry) in zip(names[1:], phases[1:]):
        if image.shape != first_image.shape or not geometry.matches(first_geometry):
            raise CardiacError(
                f"{names[0]} ({first_image.shape}, spacing {tuple(round(v, 3) for v in first_geometry.spacing)} mm) "
                f"and {name} ({image.shape}, spacing {tuple(round(v, 3) for v in geometry.spacing)} mm) differ in "
                "geometry, so their volumes are not of one heart on one grid; give phases of one acquisition.")


def measure_function(predictor: Predictor, ed: PhaseImage, es: PhaseImage,
                     progress: Callable[[float], None] | None = None, cancel: threading.Event | None = None
                     ) -> FunctionResult:
    """Cardiac function from an end-diastolic and an end-systolic image of one acquisition.

    Raises:
        CardiacError: the bundle has no cardiac structures' codes, ED and ES differ in shape, spacing, origin or
            direction or are one image (before the network runs), or a check of :mod:`CalibSegLib.cardiac.checks`
            fails after it (one sentence).
        ValueError, InferenceCancelled: as :meth:`Predictor.predict`.
    """
    cardiac_classes(predictor.metadata.class_names, predictor.metadata.class_terminology)
    _check_geometry([ed, es], ["ED", "ES"])
    check_distinct([ed[0], es[0]], ["ED", "ES"])
    measured = [measure_volumes(predictor, phase, None if progress is None else
                                (lambda fraction, start=step: progress((start + fraction) / 2)), cancel, name)
                for step, (name, phase) in enumerate((("ED", ed), ("ES", es)))]
    result = function_result(predictor.metadata, measured[0][0], measured[1][0])
    result.predictions = {"ed": measured[0][1], "es": measured[1][1]}
    return result


def measure_cine(predictor: Predictor, phases: Sequence[PhaseImage], trigger_times_ms: Sequence[float] | None = None,
                 progress: Callable[[float], None] | None = None, cancel: threading.Event | None = None
                 ) -> FunctionResult:
    """Cardiac function from every phase of a cine: each is segmented, ED and ES are chosen by the LV blood pool
    (:func:`~CalibSegLib.cardiac.phases.choose_phases`, with ``trigger_times_ms`` when given, one per phase).

    Raises:
        CardiacError: fewer than two phases, phases that differ in geometry or repeat one another, a bundle without
            the cardiac structures' codes (before any phase is segmented), or a check of
            :mod:`CalibSegLib.cardiac.checks` that fails after (one sentence).
        ValueError, InferenceCancelled: as :meth:`Predictor.predict`, or trigger times not one per phase.
    """
    cardiac_classes(predictor.metadata.class_names, predictor.metadata.class_terminology)
    if len(phases) < 2:
        raise CardiacError(f"The cine holds {len(phases)} phase; a cine needs at least two time points to find ED "
                           "and ES in, so give the whole series or pass one phase each to --ed and --es.")
    _check_geometry(phases, [f"phase {index}" for index in range(len(phases))])
    phase_order(len(phases), trigger_times_ms)  # its sentence before any phase is segmented
    check_distinct([image for image, _ in phases], [f"phase {index} of the cine" for index in range(len(phases))])
    rule, _ = stored_rule(predictor.metadata)
    estimate = rule.estimate if rule is not None else _DEFAULT_ESTIMATE
    measured = [measure_volumes(predictor, phase, None if progress is None else
                                (lambda fraction, start=step: progress((start + fraction) / len(phases))), cancel,
                                f"Phase {step} of the cine")
                for step, phase in enumerate(phases)]
    lv = [getattr(volumes.lv, estimate) for volumes, _ in measured]
    choice = choose_phases(lv, trigger_times_ms)
    result = function_result(predictor.metadata, measured[choice.ed][0], measured[choice.es][0])
    result.predictions = {"ed": measured[choice.ed][1], "es": measured[choice.es][1]}
    result.phases = {"ed": choice.ed, "es": choice.es}
    result.phase_rule = choice.rule
    result.trigger_times_ms = None if trigger_times_ms is None else [float(time) for time in trigger_times_ms]
    result.phase_volumes = [
        {"phase": index, "trigger_time_ms": None if trigger_times_ms is None else float(trigger_times_ms[index]),
         "lv_ml": getattr(volumes.lv, estimate), "rv_ml": getattr(volumes.rv, estimate)}
        for index, (volumes, _) in enumerate(measured)]
    return result
