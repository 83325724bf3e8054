"""Calibration metrics of voxel-wise class probabilities: ECE, MCE, CECE, TACE, Brier, NLL.

Definitions (one place for the whole project; ``docs/design.md``):

- Inputs: ``probs (C, *spatial)`` float summing to 1 over C, ``target (*spatial)`` int labels,
  optional ``mask (*spatial)`` bool, default ``target > 0`` (ground-truth foreground, as the
  papers). N is the number of masked voxels.
- Bins: ``n_bins`` equal-width bins ``(i/n, (i+1)/n]``; a confidence of exactly 0 goes in bin 0.
- ECE = Σ_b (n_b/N)·|acc_b − conf_b| with conf = max_k p_k, correct = (argmax == target);
  MCE = the largest |acc_b − conf_b| over non-empty bins.
- CECE: per class k, bins on p_k over the masked voxels with frequency 1[target == k];
  ECE_k = Σ_b (n_b/N)·|freq_b − conf_b|; CECE = mean over ``classes`` (default all C).
- TACE: per class k, masked voxels with p_k > ``threshold`` sorted by p_k (ties by label
  indicator) and cut into ``n_bins`` bins of equal count — ``numpy.array_split`` of the sorted
  order, so the first ``N_k mod n_bins`` bins hold one voxel more; TACE_k =
  Σ_b (n_b/N_k)·|freq_b − conf_b|; mean over classes that have such voxels.
- Brier = mean over masked voxels of Σ_k (p_k − y_k)²; NLL = mean of −log p_target with p
  clamped at 1e-12.
- ``tace_authors`` (the CRaC/NACL papers' "TACE", their ``ThreshClasswiseECELoss``, reported
  beside ours): per class k, masked voxels with p_k > 1e-3 in the *equal-width* bins;
  TACE_k = Σ_b (n_b/N_k)·|freq_b − conf_b|, 0 for a class without such voxels; mean over all C
  classes, background included.

An empty mask makes every metric NaN and emits a ``RuntimeWarning`` (it is never an error:
a volume without foreground is a legitimate case the summaries must count).

All sums are float64. :class:`CalibrationStatistics` holds the per-bin sums and the TACE
pairs; both the whole-array functions here and :class:`~CalibSegLib.metrics.accumulator.
CalibrationAccumulator` compute through it, so streaming equals whole-array by construction.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

__all__ = [
    "DEFAULT_BINS",
    "TACE_THRESHOLD",
    "AUTHORS_TACE_THRESHOLD",
    "CalibrationStatistics",
    "Reliability",
    "masked_probabilities",
    "ece",
    "mce",
    "cece",
    "tace",
    "brier",
    "nll",
    "reliability",
    "calibration_metrics",
]

DEFAULT_BINS = 15
TACE_THRESHOLD = 0.01
AUTHORS_TACE_THRESHOLD = 1e-3
_SUM_TOLERANCE = 1e-3
_NLL_FLOOR = 1e-12


def _to_numpy(array) -> np.ndarray:
    if hasattr(array, "detach"):
        array = array.detach().cpu().numpy()
    return np.asarray(array)


def masked_probabilities(probs, target, mask=None) -> tuple[np.ndarray, np.ndarray]:
    """Check inputs and return ``(C, N)`` masked probabilities and ``(N,)`` int64 labels.

    Raises:
        ValueError: shapes disagree, NaN/inf or negative probabilities, probabilities not
            summing to 1 over classes (tolerance 1e-3), masked labels outside ``[0, C)`` — with
            the default mask, negative labels anywhere (``target > 0`` would skip them silently).
    """
    probs = _to_numpy(probs)
    target = _to_numpy(target)
    if probs.ndim < 2:
        raise ValueError(f"probs must be (C, *spatial), got shape {probs.shape}.")
    num_classes = probs.shape[0]
    if target.shape != probs.shape[1:]:
        raise ValueError(f"target shape {target.shape} does not match probs spatial shape {probs.shape[1:]}.")
    if not np.issubdtype(target.dtype, np.integer):
        raise ValueError(f"target must hold integer class labels, got dtype {target.dtype}.")
    if mask is None:
        # Negative labels are an error, not "background": the default mask would quietly drop them.
        if target.size and target.min() < 0:
            raise ValueError(
                f"target labels must lie in [0, {num_classes - 1}], found {target.min()}; pass an explicit "
                "mask to leave voxels out instead of negative labels."
            )
        mask = target > 0
    else:
        mask = _to_numpy(mask)
        if mask.shape != target.shape:
            raise ValueError(f"mask shape {mask.shape} does not match target shape {target.shape}.")
        mask = mask.astype(bool, copy=False)
    selected = probs[:, mask]
    labels = target[mask].astype(np.int64, copy=False)
    # A NaN or ±inf anywhere makes its voxel's sum non-finite: one pass checks both.
    sums = selected.sum(axis=0, dtype=np.float64)
    if not np.all(np.isfinite(sums)):
        raise ValueError("probs contain NaN or infinite values.")
    if selected.size and selected.min() < 0:
        raise ValueError(f"probs must be non-negative, found {selected.min():.3g}.")
    if selected.size:
        worst = np.abs(sums - 1.0).max()
        if worst > _SUM_TOLERANCE:
            raise ValueError(
                f"probs must sum to 1 over the class axis (axis 0); found a voxel summing to "
                f"{sums[np.argmax(np.abs(sums - 1.0))]:.4f}. Pass softmax probabilities, not logits."
            )
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"target labels must lie in [0, {num_classes - 1}], found [{labels.min()}, {labels.max()}].")
    return selected, labels


def _tace_keys(probability: np.ndarray, indicator: np.ndarray) -> np.ndarray:
    """uint32 keys that sort like ``(probability, indicator)``: the float32 bit pattern, shifted
    left by one, with the indicator in the freed low bit.

    Exact because a positive float32's bit pattern orders like its value and every value here
    is at most 1.0 (pattern 0x3F800000 < 2³¹), so the shift loses no bit. 4 bytes per voxel and
    class, sorted in place: TACE stays exact without keeping index arrays.
    """
    return (probability.view(np.uint32) << np.uint32(1)) | indicator.astype(np.uint32)


def _bin_index(confidence: np.ndarray, n_bins: int) -> np.ndarray:
    """Bin of each value for bins ``(i/n, (i+1)/n]``; 0 goes in bin 0."""
    index = np.ceil(confidence.astype(np.float64) * n_bins).astype(np.int64) - 1
    return np.clip(index, 0, n_bins - 1)


@dataclass
class Reliability:
    """Reliability diagram data over equal-width bins.

    ``counts (n_bins,)`` voxels per bin; ``mean_confidence``/``accuracy (n_bins,)`` NaN for
    empty bins; ``edges (n_bins + 1,)`` in [0, 1].
    """

    counts: np.ndarray
    mean_confidence: np.ndarray
    accuracy: np.ndarray
    edges: np.ndarray


@dataclass
class CalibrationStatistics:
    """Sufficient statistics of all calibration metrics for one set of voxels.

    Per-bin float64 sums for ECE/MCE/reliability (``(n_bins,)``) and CECE (``(C, n_bins)``),
    Brier and NLL sums, and for TACE the above-threshold ``(p_k, 1[target == k])`` pairs per
    class (float32 / bool, concatenated lazily) — the only exact way to cut equal-count bins.
    ``track_tace=False`` keeps no pairs (4 bytes per voxel and class less; TACE is then NaN), for
    voxel sets too large to hold, e.g. ECE over every voxel of a volume. The sums of the voxels
    with p_k ≤ 1e-3 (``class_below_*``, ``(C,)``, all in bin 0) give the papers' TACE variant.
    """

    num_classes: int
    n_bins: int = DEFAULT_BINS
    tace_threshold: float = TACE_THRESHOLD
    track_tace: bool = True
    count: int = 0
    bin_count: np.ndarray = field(init=False)
    bin_confidence: np.ndarray = field(init=False)
    bin_correct: np.ndarray = field(init=False)
    class_bin_count: np.ndarray = field(init=False)
    class_bin_probability: np.ndarray = field(init=False)
    class_bin_frequency: np.ndarray = field(init=False)
    class_below_count: np.ndarray = field(init=False)
    class_below_probability: np.ndarray = field(init=False)
    class_below_frequency: np.ndarray = field(init=False)
    brier_sum: float = 0.0
    nll_sum: float = 0.0
    tace_keys: list[list[np.ndarray]] = field(init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.n_bins < 1 / AUTHORS_TACE_THRESHOLD:
            # add() files the voxels at or below the papers' TACE threshold under bin 0.
            raise ValueError(f"n_bins must lie in [1, {round(1 / AUTHORS_TACE_THRESHOLD) - 1}], got {self.n_bins}.")
        self.bin_count = np.zeros(self.n_bins, np.float64)
        self.bin_confidence = np.zeros(self.n_bins, np.float64)
        self.bin_correct = np.zeros(self.n_bins, np.float64)
        shape = (self.num_classes, self.n_bins)
        self.class_bin_count = np.zeros(shape, np.float64)
        self.class_bin_probability = np.zeros(shape, np.float64)
        self.class_bin_frequency = np.zeros(shape, np.float64)
        self.class_below_count = np.zeros(self.num_classes, np.float64)
        self.class_below_probability = np.zeros(self.num_classes, np.float64)
        self.class_below_frequency = np.zeros(self.num_classes, np.float64)
        # Per class, the TACE sort keys of every voxel above the threshold (see _tace_keys).
        self.tace_keys: list[list[np.ndarray]] = [[] for _ in range(self.num_classes)]

    def add(self, selected: np.ndarray, labels: np.ndarray) -> None:
        """Add ``(C, N)`` checked probabilities and their ``(N,)`` labels (see :func:`masked_probabilities`)."""
        if selected.shape[0] != self.num_classes:
            raise ValueError(f"expected {self.num_classes} classes, got probabilities for {selected.shape[0]}.")
        if labels.size == 0:
            return
        n_bins, num_classes = self.n_bins, self.num_classes
        predicted = selected.argmax(axis=0)
        confidence = selected.max(axis=0)
        bins = _bin_index(confidence, n_bins)
        self.bin_count += np.bincount(bins, minlength=n_bins)
        self.bin_confidence += np.bincount(bins, weights=confidence, minlength=n_bins)
        self.bin_correct += np.bincount(bins, weights=(predicted == labels), minlength=n_bins)
        # Per voxel, C products in (at least) float32 are exact enough; the sum over voxels is float64.
        squared_error = np.einsum("cn,cn->n", selected, selected,
                                  dtype=np.promote_types(selected.dtype, np.float32)).astype(np.float64)
        target_probability = selected[labels, np.arange(labels.size)].astype(np.float64)
        # Σ_k (p_k − y_k)² = Σ_k p_k² − 2 p_y + 1
        self.brier_sum += float((squared_error - 2.0 * target_probability + 1.0).sum())
        self.nll_sum += float(-np.log(np.maximum(target_probability, _NLL_FLOOR)).sum())
        # Class-wise bins of all classes in one bincount: class k owns slots k·(n_bins + 1) + s, where
        # slot 0 holds its p_k ≤ 1e-3 (the papers' TACE leaves them out; they all lie in bin 0) and
        # slot b + 1 the rest of bin b.
        slots_per_class = n_bins + 1
        slot = _bin_index(selected, n_bins) + 1
        slot[selected <= AUTHORS_TACE_THRESHOLD] = 0
        slot += (np.arange(num_classes) * slots_per_class)[:, None]
        size = num_classes * slots_per_class
        count = np.bincount(slot.ravel(), minlength=size).reshape(num_classes, slots_per_class)
        probability = np.bincount(slot.ravel(), weights=selected.ravel(), minlength=size).reshape(
            num_classes, slots_per_class)
        # 1[target == k] is 1 only in the label's own class: count the label slots alone.
        frequency = np.bincount(slot[labels, np.arange(labels.size)], minlength=size).reshape(
            num_classes, slots_per_class)
        for name, sums in (("count", count), ("probability", probability), ("frequency", frequency)):
            getattr(self, f"class_below_{name}").__iadd__(sums[:, 0])
            binned = getattr(self, f"class_bin_{name}")
            binned += sums[:, 1:]
            binned[:, 0] += sums[:, 0]
        if self.track_tace:
            indicator = labels[None, :] == np.arange(num_classes)[:, None]
            probabilities32 = selected.astype(np.float32, copy=False)
            for k in range(num_classes):
                above = probabilities32[k] > self.tace_threshold
                self.tace_keys[k].append(_tace_keys(probabilities32[k][above], indicator[k][above]))
        self.count += labels.size

    def merge(self, other: "CalibrationStatistics") -> None:
        """Add another set of statistics (same classes, bins and threshold) into this one."""
        for name in ("bin_count", "bin_confidence", "bin_correct", "class_bin_count",
                     "class_bin_probability", "class_bin_frequency", "class_below_count",
                     "class_below_probability", "class_below_frequency"):
            getattr(self, name).__iadd__(getattr(other, name))
        self.brier_sum += other.brier_sum
        self.nll_sum += other.nll_sum
        self.count += other.count
        for k in range(self.num_classes):
            self.tace_keys[k].extend(other.tace_keys[k])

    def _empty(self) -> bool:
        if self.count == 0:
            warnings.warn("The calibration mask is empty (no voxel selected); metrics are NaN.", RuntimeWarning,
                          stacklevel=3)
            return True
        return False

    def _gaps(self) -> tuple[np.ndarray, np.ndarray]:
        filled = self.bin_count > 0
        counts = np.where(filled, self.bin_count, 1.0)
        gap = np.abs(self.bin_correct / counts - self.bin_confidence / counts)
        return gap, filled

    def ece(self) -> float:
        if self._empty():
            return float("nan")
        gap, _ = self._gaps()
        return float((self.bin_count / self.count * gap).sum())

    def mce(self) -> float:
        if self._empty():
            return float("nan")
        gap, filled = self._gaps()
        return float(gap[filled].max())

    def class_ece(self) -> np.ndarray:
        """ECE_k of every class, ``(C,)``."""
        if self._empty():
            return np.full(self.num_classes, np.nan)
        counts = np.where(self.class_bin_count > 0, self.class_bin_count, 1.0)
        gap = np.abs(self.class_bin_frequency / counts - self.class_bin_probability / counts)
        return (self.class_bin_count / self.count * gap).sum(axis=1)

    def cece(self, classes: Sequence[int] | None = None) -> float:
        per_class = self.class_ece()
        chosen = range(self.num_classes) if classes is None else classes
        return float(np.mean([per_class[k] for k in chosen]))

    def class_tace(self) -> np.ndarray:
        """TACE_k of every class, ``(C,)``; NaN for a class with no voxel above the threshold."""
        values = np.full(self.num_classes, np.nan)
        for k in range(self.num_classes):
            if not self.tace_keys[k]:
                continue
            keys = np.concatenate(self.tace_keys[k])
            if keys.size == 0:
                continue
            keys.sort()
            total = 0.0
            for chunk in np.array_split(keys, self.n_bins):
                if chunk.size:
                    probability_sum = (chunk >> np.uint32(1)).view(np.float32).sum(dtype=np.float64)
                    total += abs(float(np.count_nonzero(chunk & np.uint32(1))) - probability_sum)
            values[k] = total / keys.size
        return values

    def tace_authors(self) -> float:
        """The papers' TACE: equal-width bins of p_k > 1e-3 per class, every class averaged (see the module)."""
        if self._empty():
            return float("nan")
        counts, probability, frequency = (getattr(self, f"class_bin_{name}").copy()
                                          for name in ("count", "probability", "frequency"))
        # 1e-3 lies inside bin 0 ((0, 1/n_bins]): the voxels at or below it leave that bin.
        counts[:, 0] -= self.class_below_count
        probability[:, 0] -= self.class_below_probability
        frequency[:, 0] -= self.class_below_frequency
        counts = np.maximum(counts, 0.0)  # float rounding of the subtraction
        filled = np.where(counts > 0, counts, 1.0)
        gap = np.abs(frequency / filled - probability / filled)
        totals = counts.sum(axis=1, keepdims=True)
        per_class = np.where(totals[:, 0] > 0, (counts / np.where(totals > 0, totals, 1.0) * gap).sum(axis=1), 0.0)
        return float(per_class.mean())

    def tace(self, classes: Sequence[int] | None = None) -> float:
        if self._empty() or not self.track_tace:
            return float("nan")
        per_class = self.class_tace()
        chosen = [per_class[k] for k in (range(self.num_classes) if classes is None else classes)]
        chosen = [value for value in chosen if not np.isnan(value)]
        return float(np.mean(chosen)) if chosen else float("nan")

    def brier(self) -> float:
        return float("nan") if self._empty() else self.brier_sum / self.count

    def nll(self) -> float:
        return float("nan") if self._empty() else self.nll_sum / self.count

    def reliability(self) -> Reliability:
        filled = self.bin_count > 0
        counts = np.where(filled, self.bin_count, 1.0)
        return Reliability(
            counts=self.bin_count.copy(),
            mean_confidence=np.where(filled, self.bin_confidence / counts, np.nan),
            accuracy=np.where(filled, self.bin_correct / counts, np.nan),
            edges=np.linspace(0.0, 1.0, self.n_bins + 1),
        )

    def metrics(self, classes: Sequence[int] | None = None) -> dict[str, float]:
        """All scalar metrics: ``ece``, ``mce``, ``cece``, ``tace``, ``tace_authors``, ``brier``, ``nll``,
        ``voxels``."""
        if self._empty():
            nan = float("nan")
            return {"ece": nan, "mce": nan, "cece": nan, "tace": nan, "tace_authors": nan, "brier": nan, "nll": nan,
                    "voxels": 0}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return {
                "ece": self.ece(),
                "mce": self.mce(),
                "cece": self.cece(classes),
                "tace": self.tace(classes),
                "tace_authors": self.tace_authors(),
                "brier": self.brier(),
                "nll": self.nll(),
                "voxels": self.count,
            }


def _statistics(probs, target, mask, n_bins: int, threshold: float = TACE_THRESHOLD) -> CalibrationStatistics:
    selected, labels = masked_probabilities(probs, target, mask)
    statistics = CalibrationStatistics(selected.shape[0], n_bins, threshold)
    statistics.add(selected, labels)
    return statistics


def ece(probs, target, mask=None, n_bins: int = DEFAULT_BINS) -> float:
    """Expected calibration error of the top-1 confidence over the masked voxels, in [0, 1]."""
    return _statistics(probs, target, mask, n_bins).ece()


def mce(probs, target, mask=None, n_bins: int = DEFAULT_BINS) -> float:
    """Maximum calibration error: the largest bin gap |acc_b − conf_b|, in [0, 1]."""
    return _statistics(probs, target, mask, n_bins).mce()


def cece(probs, target, mask=None, n_bins: int = DEFAULT_BINS, classes: Sequence[int] | None = None) -> float:
    """Class-wise ECE, mean over ``classes`` (default all C)."""
    return _statistics(probs, target, mask, n_bins).cece(classes)


def tace(
    probs, target, mask=None, n_bins: int = DEFAULT_BINS, threshold: float = TACE_THRESHOLD,
    classes: Sequence[int] | None = None,
) -> float:
    """Thresholded adaptive calibration error with equal-count bins (Nixon et al., 2019)."""
    return _statistics(probs, target, mask, n_bins, threshold).tace(classes)


def brier(probs, target, mask=None) -> float:
    """Mean over masked voxels of Σ_k (p_k − y_k)², in [0, 2]."""
    return _statistics(probs, target, mask, 1).brier()


def nll(probs, target, mask=None) -> float:
    """Mean negative log-likelihood −log p_target (p clamped at 1e-12), in nats."""
    return _statistics(probs, target, mask, 1).nll()


def reliability(probs, target, mask=None, n_bins: int = DEFAULT_BINS) -> Reliability:
    """Per-bin count, mean confidence and accuracy of the top-1 prediction."""
    return _statistics(probs, target, mask, n_bins).reliability()


def calibration_metrics(
    probs, target, mask=None, n_bins: int = DEFAULT_BINS, threshold: float = TACE_THRESHOLD,
    classes: Sequence[int] | None = None,
) -> dict[str, float]:
    """All calibration metrics of one array in one pass (see :meth:`CalibrationStatistics.metrics`)."""
    return _statistics(probs, target, mask, n_bins, threshold).metrics(classes)
