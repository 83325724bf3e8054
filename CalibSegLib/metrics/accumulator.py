"""Streaming calibration metrics over chunks of volumes (slices, batches), per volume and pooled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from CalibSegLib.metrics.calibration import (
    DEFAULT_BINS,
    TACE_THRESHOLD,
    CalibrationStatistics,
    Reliability,
    masked_probabilities,
)

__all__ = ["CalibrationAccumulator", "CalibrationResult"]


@dataclass
class CalibrationResult:
    """``per_volume``: one metrics dict per closed volume; ``pooled``: all voxels of all volumes together."""

    per_volume: list[dict[str, float]]
    pooled: dict[str, float]
    reliability: Reliability


class CalibrationAccumulator:
    """Accumulates calibration statistics chunk by chunk, so no volume sits in memory whole.

    Usage::

        accumulator = CalibrationAccumulator(num_classes=4)
        for volume in volumes:
            for probs_chunk, target_chunk in chunks(volume):   # (C, n, y, x), (n, y, x)
                accumulator.update(probs_chunk, target_chunk)
            accumulator.end_volume()
        result = accumulator.result()

    Per-bin sums are float64 and TACE keeps its above-threshold ``(p_k, y_k)`` pairs
    (float32 + bool), so results equal the whole-array functions for any chunking.
    """

    def __init__(
        self,
        num_classes: int,
        n_bins: int = DEFAULT_BINS,
        tace_threshold: float = TACE_THRESHOLD,
        classes: Sequence[int] | None = None,
    ) -> None:
        self.num_classes = num_classes
        self.n_bins = n_bins
        self.tace_threshold = tace_threshold
        self.classes = classes
        self._pooled = self._new_statistics()
        self._volume = self._new_statistics()
        self._volume_open = False
        self._per_volume: list[dict[str, float]] = []

    def _new_statistics(self) -> CalibrationStatistics:
        return CalibrationStatistics(self.num_classes, self.n_bins, self.tace_threshold)

    def update(self, probs, target, mask=None) -> None:
        """Add a chunk: ``probs (C, *spatial)``, ``target (*spatial)``, ``mask`` (default ``target > 0``)."""
        selected, labels = masked_probabilities(probs, target, mask)
        self._volume.add(selected, labels)
        self._volume_open = True

    def end_volume(self) -> dict[str, float]:
        """Close the current volume and return its metrics."""
        metrics = self._volume.metrics(self.classes)
        self._per_volume.append(metrics)
        self._pooled.merge(self._volume)
        self._volume = self._new_statistics()
        self._volume_open = False
        return metrics

    def result(self) -> CalibrationResult:
        """Per-volume and pooled metrics; an open volume is closed first."""
        if self._volume_open:
            self.end_volume()
        return CalibrationResult(
            per_volume=list(self._per_volume),
            pooled=self._pooled.metrics(self.classes),
            reliability=self._pooled.reliability(),
        )
