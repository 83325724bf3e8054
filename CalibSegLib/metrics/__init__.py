"""Metrics: calibration (exact and streaming), segmentation overlap and surface distance,
error detection from confidence, method ranking, and reliability plots."""

from CalibSegLib.metrics.accumulator import CalibrationAccumulator, CalibrationResult
from CalibSegLib.metrics.calibration import (
    DEFAULT_BINS,
    TACE_THRESHOLD,
    CalibrationStatistics,
    Reliability,
    brier,
    calibration_metrics,
    cece,
    ece,
    mce,
    nll,
    reliability,
    tace,
)
from CalibSegLib.metrics.ranking import RankTable, rank_methods
from CalibSegLib.metrics.segmentation import asd, dice, hd95, segmentation_metrics, summarize, surface_metrics
from CalibSegLib.metrics.selective import aurc, error_detection_auroc

__all__ = [
    "DEFAULT_BINS", "TACE_THRESHOLD", "CalibrationStatistics", "Reliability", "CalibrationAccumulator",
    "CalibrationResult", "ece", "mce", "cece", "tace", "brier", "nll", "reliability", "calibration_metrics",
    "dice", "surface_metrics", "hd95", "asd", "segmentation_metrics", "summarize", "error_detection_auroc", "aurc",
    "RankTable", "rank_methods",
]
