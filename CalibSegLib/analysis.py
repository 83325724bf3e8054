"""One case analysed: predict → quality summary → (with a reference) every metric.

The one path the command line (``calibseg-predict``), the evaluation (``calibseg-evaluate``) and the Slicer
module take, so a case gives the same numbers wherever it is run.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from CalibSegLib.bundle import BundleMetadata
from CalibSegLib.evaluation import CaseEvaluation, case_metrics_row, evaluate_variants
from CalibSegLib.features import feature_distance
from CalibSegLib.inference import Predictor
from CalibSegLib.input_check import check_input
from CalibSegLib.metrics.calibration import Reliability
from CalibSegLib.prediction import Prediction
from CalibSegLib.quality import HOT_SPOT_LEVEL, quality_summary, with_predicted_dice

__all__ = ["CaseAnalysis", "analyse_case", "analyse_variants"]


@dataclass
class CaseAnalysis:
    """One predicted volume and what is known about it.

    ``summary``: ``input_check`` (:func:`CalibSegLib.input_check.check_input`: is the image like the training
    data, to the statistics and to the network's features?) and
    :func:`CalibSegLib.quality.quality_summary` (what a reader sees without a reference);
    ``evaluation``, ``metrics`` (the flat row of :func:`CalibSegLib.evaluation.case_metrics_row` with the
    predicted Dice beside each measured one) and ``reliability`` (the reference foreground's reliability bins):
    None without a reference (``evaluation`` also for a case read back from a child process,
    :mod:`CalibSegLib.analysis_process`, whose numbers are in the other two).
    """

    prediction: Prediction
    summary: dict[str, Any]
    evaluation: CaseEvaluation | None = None
    metrics: dict[str, float] | None = None
    reliability: Reliability | None = None


def analyse_variants(predictor: Predictor, image: np.ndarray, spacing: Sequence[float],
                     reference: np.ndarray | None = None, variants: Sequence[BundleMetadata] | None = None,
                     progress: Callable[[float], None] | None = None, cancel: threading.Event | None = None,
                     hot_spot_level: float = HOT_SPOT_LEVEL) -> list[CaseAnalysis]:
    """:func:`analyse_case` for several ``variants`` of the predictor's bundle from one pass of the network.

    A variant is the bundle's metadata with another temperature and quality model (e.g. the evaluation's T = 1
    copy without one); default: the bundle as it is.
    """
    variants = list(variants or [predictor.metadata])
    temperatures = [metadata.temperature for metadata in variants]
    if reference is None:
        predictions = predictor.predict_variants(image, spacing, temperatures, progress=progress, cancel=cancel)
        evaluations: list[CaseEvaluation | None] = [None] * len(variants)
    else:
        evaluations = evaluate_variants(predictor, image, reference, spacing, temperatures, progress, cancel)
        predictions = [evaluation.prediction for evaluation in evaluations]
    # One network, one input: the variants share its features (they differ in temperature and quality model). An
    # ensemble judged by every member gives one distance per member (an encoder pass each).
    distance = feature_distance(predictor.model, predictor.metadata, image, spacing, predictor.batch_size)
    analyses = []
    for metadata, prediction, evaluation in zip(variants, predictions, evaluations):
        # The input check first: a reader should know the image is unlike the training data before any Dice.
        summary = {"input_check": check_input(metadata, image, spacing, prediction.labels, distance),
                   **quality_summary(prediction, spacing, metadata, hot_spot_level)}
        if evaluation is None:
            analyses.append(CaseAnalysis(prediction, summary))
            continue
        metrics = with_predicted_dice(case_metrics_row(evaluation, metadata.class_names), summary)
        analyses.append(CaseAnalysis(prediction, summary, evaluation, metrics, evaluation.statistics.reliability()))
    return analyses


def analyse_case(predictor: Predictor, image: np.ndarray, spacing: Sequence[float],
                 reference: np.ndarray | None = None, progress: Callable[[float], None] | None = None,
                 cancel: threading.Event | None = None, hot_spot_level: float = HOT_SPOT_LEVEL) -> CaseAnalysis:
    """Predict ``image (z, y, x)`` (``spacing`` ``(z, y, x)`` mm) with the bundle as it is, summarise its quality
    and, with a ``reference (z, y, x)`` integer label map on the same grid, measure it.

    ``hot_spot_level``: the normalised entropy from which a voxel counts for the summary's uncertain slices.

    Raises:
        ValueError: the predictor refuses the image, or the reference does not fit it (one sentence).
        InferenceCancelled: ``cancel`` was set.
    """
    return analyse_variants(predictor, image, spacing, reference, None, progress, cancel, hot_spot_level)[0]
