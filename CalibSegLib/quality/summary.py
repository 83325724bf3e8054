"""The per-structure quality summary of one predicted volume, without a reference: what a reader can act on.

Definitions (every number a reader sees is one of these):

- ``volume_ml``: predicted voxel count × voxel volume (product of the spacing, mm³) / 1000.
- ``mean_confidence`` / ``mean_entropy``: means of the max probability / the entropy divided by
  log C, over the voxels predicted as the structure.
- ``low_confidence_fraction``: share of those voxels with confidence below the model's
  ``low_confidence_threshold`` (:data:`LOW_CONFIDENCE_THRESHOLD` without a model).
- ``boundary_entropy_ratio`` (a model feature, not shown): Σ normalised entropy over the
  structure and the voxels within :data:`BOUNDARY_RING` face-neighbour steps of it (city-block
  distance in voxels, the neighbouring slices included: a structure that goes on, or stops,
  one slice further is where 2D models most often err), divided by the structure's voxel
  count — roughly the share of the structure the model is unsure about, counting tissue it
  may have missed just outside.
- ``boundary_low_confidence_ratio`` (a model feature, not shown): the same for
  ``low_confidence_fraction``: the voxels with confidence below the threshold in the structure
  and its ring, divided by the structure's voxel count — the voxels it may have wrongly taken
  and those it may have missed just outside, which for a structure a few voxels thick (the
  myocardium) are as many.
- ``expected_dice`` (a model feature, not shown): 2 Σ p_k over the voxels predicted as class k
  / (their count + Σ p_k over the whole volume) — the Dice the model expects of itself if its
  probabilities were right: expected overlap over predicted plus expected size. It counts the
  probability mass outside the structure, which the other features do not see. A quality model
  averages one linear fit of each of these features (``quality/fitting.py``).
- ``log_volume_ml`` (a model feature, not shown): the natural logarithm of ``volume_ml``. A
  boundary error of a given thickness costs a small structure more of its Dice than a large one.
- ``mirror_agreement`` (a model feature, not shown): a bundle that mirrors at test time runs every
  slice as it is and mirrored and averages the logits; this is the mean over those passes of the
  Dice between the pass's structure and the average's, over the whole volume on the network's grid
  (:class:`~CalibSegLib.sliding_window.MirrorAgreement`) — 1 when every view draws the same
  structure, lower where the average hides passes that disagree.
- ``mean_disagreement`` (an ensemble's only, shown): the mean over the structure's voxels of the members'
  disagreement (the mutual information between the prediction and the member, normalised by log C;
  :func:`CalibSegLib.inference.ensemble_average`) — the part of the entropy that comes from the networks drawing the
  structure differently rather than from an ambiguous image.
- ``uncertain_slices``: slices along the bundle's slice axis ordered by their hot-spot
  uncertainty Σ entropy over voxels with entropy ≥ :data:`HOT_SPOT_LEVEL`, most first;
  slices without a hot spot are left out, at most :data:`MAX_UNCERTAIN_SLICES`. The level is
  the one the Slicer hot-spot overlay shows, so the list points where the overlay lights up.
- ``predicted_dice``: the quality model's Dice from the features above; where an ensemble's model was fitted on
  single networks (``per_member``), the mean of its members' predicted Dice, each from that member's own prediction,
  as the model was fitted (:mod:`CalibSegLib.quality.members`).
- ``review``: the structure is absent from the prediction, or its predicted Dice is below the
  model's threshold for it (``QualityModel.review_threshold``: its ``review_below``, or the structure's own where
  the review rule chose one per structure; :data:`REVIEW_BELOW` by default): the review rule's own flag,
  :func:`CalibSegLib.quality.review_rule.flagged`, the one its thresholds were chosen by. Without a quality model the
  predicted Dice and the review flag of a present structure are null — never guessed.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, Sequence

import numpy as np

from CalibSegLib.prediction import Prediction
from CalibSegLib.preprocessing import Preprocessing
from CalibSegLib.quality.features import HOT_SPOT_LEVEL, structure_features, uncertain_slices
from CalibSegLib.quality.members import combined_predicted_dice, member_predicted_dice
from CalibSegLib.quality.model import (BOUNDARY_RING, LOW_CONFIDENCE_THRESHOLD, MEAN_DISAGREEMENT, REVIEW_BELOW,
                                       QualityModel, StructureQuality, structure_key, thresholds_text)
from CalibSegLib.quality.review_rule import flagged

__all__ = ["SummaryMetadata", "quality_summary", "review_sentence", "summary_columns", "with_predicted_dice",
           "ensemble_summary_columns"]

_SHOWN_FEATURES = ("mean_confidence", "mean_entropy", "low_confidence_fraction")  # in the summary as they are


class SummaryMetadata(Protocol):
    """What :func:`quality_summary` reads of a bundle's metadata (:class:`CalibSegLib.bundle.BundleMetadata` is one):
    its classes, background first, its preprocessing (the slice axis), how many networks it holds and its parsed
    quality model, None without one. Named here, the summary needs no bundle: the bundle stores the quality model,
    so it sits above quality."""

    @property
    def class_names(self) -> Sequence[str]: ...

    @property
    def num_classes(self) -> int: ...

    @property
    def preprocessing(self) -> Preprocessing: ...

    @property
    def ensemble_size(self) -> int: ...

    @property
    def quality(self) -> QualityModel | None: ...



def _missing_inputs(model: QualityModel, features: Sequence[dict[str, float] | None]) -> None:
    """Refuse ``features`` (one volume's, C - 1 entries) that lack some input of ``model``."""
    missing = [name for name in model.inputs if any(values is not None and name not in values
                                                     for values in features)]
    if missing:
        raise ValueError(f"The quality model predicts Dice from {', '.join(missing)}, which this prediction cannot "
                         f"give (it carries no class probability sums, or no mirrored passes); predict it with the "
                         f"bundle's own CalibSegLib.inference.Predictor.")


def _members_dice(prediction: Prediction, metadata: SummaryMetadata, model: QualityModel,
                  spacing: Sequence[float]) -> np.ndarray:
    """An ensemble's ``(C - 1,)`` predicted Dice: the mean over its members' own predictions
    (:mod:`CalibSegLib.quality.members`)."""
    if prediction.members is None:
        raise ValueError("An ensemble's quality model predicts Dice from each member's own prediction, which this "
                         "prediction does not carry; predict it with the bundle's own "
                         "CalibSegLib.inference.Predictor (keep_members left on).")
    return _combined_dice(model, [structure_features(member, metadata.num_classes, model.low_confidence_threshold,
                                                     model.boundary_ring, spacing) for member in prediction.members],
                          metadata.class_names)


def _combined_dice(model: QualityModel, member_features: Sequence[Sequence[dict[str, float] | None]],
                   class_names: Sequence[str]) -> np.ndarray:
    """``(C - 1,)`` the mean of the members' predicted Dice from their features, each checked to give the model's
    inputs."""
    for features in member_features:
        _missing_inputs(model, features)
    return combined_predicted_dice(member_predicted_dice(model, member_features, class_names))


def _judged(model: StructureQuality | None, dice: float | None, review_below: float,
            drawn: bool = True) -> dict[str, Any]:
    """A structure's predicted Dice, its interval and its review flag. One predicted nowhere (``drawn`` False) has
    nothing to judge and is flagged whatever the threshold; without a model a present structure's are null."""
    if not drawn:
        return {"predicted_dice": None, "predicted_dice_interval": None, "review": bool(flagged(None, review_below))}
    if model is None or dice is None:
        return {"predicted_dice": None, "predicted_dice_interval": None, "review": None}
    return {"predicted_dice": dice, "predicted_dice_interval": list(model.predict_interval(dice)),
            "review": bool(flagged(dice, review_below))}


def _structure_summary(features: dict[str, float] | None, voxel_mm3: float,
                       model: StructureQuality | None, review_below: float,
                       members_dice: float | None = None) -> dict[str, Any]:
    if features is None:
        return {"volume_ml": 0.0, "mean_confidence": None, "mean_entropy": None, "low_confidence_fraction": None,
                **_judged(model, None, review_below, drawn=False)}
    summary: dict[str, Any] = {"volume_ml": features["voxels"] * voxel_mm3 / 1000.0,
                               **{key: features[key] for key in (*_SHOWN_FEATURES, MEAN_DISAGREEMENT)
                                  if key in features}}
    dice = None if model is None else model.predict(features) if members_dice is None else members_dice
    return {**summary, **_judged(model, dice, review_below)}


def ensemble_summary_columns(model: QualityModel, class_names: Sequence[str],
                             member_features: Sequence[Sequence[dict[str, float] | None]],
                             drawn: Sequence[bool]) -> dict[str, float]:
    """The :func:`summary_columns` of an ensemble's prediction whose model was fitted on its members
    (``per_member``), from what a store keeps of it: each of M members' :func:`structure_features` (C - 1 entries
    each, computed with the model's low-confidence threshold and boundary ring) and whether the ensemble's own
    prediction draws each structure anywhere ``(C - 1,)``. The same numbers :func:`quality_summary` gives it.

    Raises:
        ValueError: the features lack an input of the model (one sentence).
    """
    dice = _combined_dice(model, member_features, class_names)
    return {column: value for name, value, present in zip(class_names[1:], dice, drawn, strict=True)
            for column, value in _structure_columns(name, _judged(model.structures[name], float(value),
                                                                  model.review_threshold(name), present)).items()}


def _case_review(flags: Sequence[bool | None]) -> bool | None:
    """True when any structure is flagged; None when none is but some are unknown; else False."""
    if any(flag is True for flag in flags):
        return True
    return None if any(flag is None for flag in flags) else False


def quality_summary(prediction: Prediction, spacing: Sequence[float], metadata: SummaryMetadata,
                    hot_spot_level: float = HOT_SPOT_LEVEL) -> dict[str, Any]:
    """The per-structure quality summary of one predicted volume, without a reference.

    Args:
        prediction: the bundle's prediction, all arrays ``(z, y, x)``.
        spacing: the volume's voxel size ``(z, y, x)`` in mm (volumes are in mL from it).
        metadata: the bundle's metadata: class names, slice axis and its quality model (if any).
        hot_spot_level: normalised entropy from which a voxel counts for ``uncertain_slices``.

    Returns:
        ``{"structures": {name: {"volume_ml", "mean_confidence", "mean_entropy",
        "low_confidence_fraction", "predicted_dice", "predicted_dice_interval": [lo, hi],
        "review"}}, "review", "uncertain_slices", "slice_axis", "hot_spot_level",
        "quality_model", "note"}`` — JSON-ready; undefined values are None (see the module
        docstring for every definition).
    """
    model = metadata.quality
    threshold = model.low_confidence_threshold if model else LOW_CONFIDENCE_THRESHOLD
    ring = model.boundary_ring if model else BOUNDARY_RING
    axis = metadata.preprocessing.slice_axis
    features = structure_features(prediction, metadata.num_classes, threshold, ring, spacing)
    voxel_mm3 = float(np.prod([float(value) for value in spacing]))
    members_dice: list[float | None] = [None] * len(features)
    if model is not None and model.per_member and metadata.ensemble_size > 1:
        members_dice = [float(value) for value in _members_dice(prediction, metadata, model, spacing)]
    elif model is not None:
        _missing_inputs(model, features)
    structures = {
        name: _structure_summary(values, voxel_mm3, model.structures[name] if model else None,
                                 model.review_threshold(name) if model else REVIEW_BELOW, dice)
        for name, values, dice in zip(metadata.class_names[1:], features, members_dice)
    }
    if model is None:
        described = None
        note = ("no quality model: this bundle has none, so predicted Dice and the review flag of a present "
                "structure are null (a structure predicted nowhere is still flagged); fit one with "
                "calibseg-fit-quality --bundle <bundle>")
    else:
        described = {"review_below": model.review_below,
                     "review_below_by_structure": ({name: model.review_threshold(name)
                                                    for name in metadata.class_names[1:]}
                                                   if model.review_below_by_structure else {}),
                     "interval_coverage": model.interval_coverage, "validation": model.validation}
        source = ("the mean of the members' predicted Dice, each from the member's own uncertainty, fitted on "
                  "out-of-fold cases" if model.per_member and metadata.ensemble_size > 1
                  else "predicted Dice from uncertainty, fitted on validation cases")
        note = (f"review: predicted Dice below {_thresholds_text(described)} or the structure predicted nowhere; "
                f"{source}; intervals of nominal {model.interval_coverage:.0%} coverage")
    return {
        "structures": structures,
        "review": _case_review([entry["review"] for entry in structures.values()]),
        "uncertain_slices": uncertain_slices(prediction.entropy, axis, hot_spot_level),
        "slice_axis": axis,
        "hot_spot_level": hot_spot_level,
        "quality_model": described,
        "note": note,
    }


def review_sentence(summary: dict[str, Any]) -> str:
    """One sentence for the reader on a :func:`quality_summary`: which structures to review and why
    (the Slicer module, the command line and the README picture show it)."""
    flagged = [(name, entry) for name, entry in summary["structures"].items() if entry["review"]]
    if flagged:
        reasons = [f"{name} (predicted nowhere)" if entry["predicted_dice"] is None
                   else f"{name} (predicted Dice {entry['predicted_dice']:.2f})" for name, entry in flagged]
        return f"Review: {', '.join(reasons)}."
    if summary["review"] is None:
        return ("This bundle has no quality model, so no predicted Dice; "
                "check the hot spots and uncertain slices.")
    described = summary["quality_model"]
    if described.get("review_below_by_structure"):
        return ("No structure flagged: every predicted Dice is at or above its own threshold, "
                f"{_thresholds_text(described)}.")
    return f"No structure flagged: every predicted Dice is {described['review_below']:.2f} or more."


def _thresholds_text(described: dict[str, Any]) -> str:
    """The review thresholds of a summary's ``quality_model`` (:func:`thresholds_text`)."""
    return thresholds_text(described["review_below"], described.get("review_below_by_structure") or {})


def _structure_columns(name: str, entry: dict[str, Any]) -> dict[str, float]:
    key = structure_key(name)
    low, high = entry["predicted_dice_interval"] or (None, None)
    return {column: math.nan if value is None else float(value)
            for column, value in ((f"predicted_dice_{key}", entry["predicted_dice"]),
                                  (f"predicted_dice_low_{key}", low), (f"predicted_dice_high_{key}", high),
                                  (f"review_{key}", entry["review"]))}


def summary_columns(summary: dict[str, Any]) -> dict[str, float]:
    """Flat per-structure columns of a summary for metric rows and CSV files.

    ``predicted_dice_<structure>``, ``predicted_dice_low_<structure>``,
    ``predicted_dice_high_<structure>`` and ``review_<structure>`` (1.0 / 0.0); NaN where null.
    """
    return {column: value for name, entry in summary["structures"].items()
            for column, value in _structure_columns(name, entry).items()}


def with_predicted_dice(row: dict[str, float], summary: dict[str, Any]) -> dict[str, float]:
    """A flat metrics ``row`` with each structure's :func:`summary_columns` right after its measured
    ``dice_<structure>`` (appended at the end for a structure the row has no Dice of)."""
    groups = {f"dice_{structure_key(name)}": _structure_columns(name, entry)
              for name, entry in summary["structures"].items()}
    merged: dict[str, float] = {}
    for key, value in row.items():
        merged[key] = value
        merged.update(groups.pop(key, {}))
    for columns in groups.values():
        merged.update(columns)
    return merged
