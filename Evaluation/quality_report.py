"""How well a bundle's quality model works on test cases: predicted against measured Dice, and the
review flag as a detector of poor structures — on the clean volumes and on deliberately degraded ones.

:func:`Evaluation.evaluate.evaluate_bundle` puts :func:`quality_report` into ``summary.json``
(``"quality"``), so every evaluation has it (the degraded copies only with ``--degraded``); for a shipped model::

    calibseg-evaluate --bundle acdc_ce_dice --data "$CALIBSEG_ACDC" --degraded   # → runs/acdc_ce_dice/evaluation/
    python -m Reporting.quality_tables runs/acdc_*/evaluation/summary.json         # the tables, as Markdown

:mod:`Reporting.quality_tables` makes those tables; the results page shows them for every shipped
model, from the report its ``<name>.metrics.json`` records (``python -m Reporting.readme_tables``).

Per structure and pooled over structures (``"all structures"``), over the cases where both
numbers exist: Spearman ρ and mean absolute error between predicted and measured Dice, ρ's 95 %
interval from a bootstrap over patients (:mod:`Evaluation.bootstrap`; thirty test volumes are few
for a rank correlation, and the interval says how few), their means, the share of measured Dice
inside the predicted interval, and — a structure is *poor* when its measured Dice is below
:data:`POOR_BELOW` (0.80, whatever threshold the model's review flag uses) — the counts of poor structures, of flagged
ones and of flagged poor ones, the AUROC of the review flag (binary, so (sensitivity + specificity) / 2) and the
AUROC of the predicted Dice as a continuous score for poor structures (NaN when all or none are
poor).

The degraded inputs (:data:`DEGRADATIONS`) are the test volumes changed on purpose, to see
whether the flag catches a model failing on data unlike its training data; each is reported
on its own and all of them pooled (``"degraded (all)"``), never mixed with the clean cases.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np
from scipy.stats import spearmanr

from CalibSegLib.analysis import analyse_case
from CalibSegLib.bundle import Bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.metrics import dice, error_detection_auroc
from CalibSegLib.quality import QualityModel, structure_key, summary_columns
from CalibSegLib.quality.review_rule import GOOD_ABOVE, POOR_BELOW
from Datasets.loading import Case
from Evaluation.bootstrap import spearman_interval

__all__ = ["DEGRADATIONS", "ALL_STRUCTURES", "POOR_BELOW", "GOOD_ABOVE", "quality_statistics", "degraded_images",
           "degraded_rows", "quality_section", "quality_report"]

ALL_STRUCTURES = "all structures"
NOISE_SEED = 2024


def _unit_range(image: np.ndarray) -> tuple[np.ndarray, float, float]:
    """``image`` scaled to [0, 1] between its minimum and 99th percentile (clipped), and those two."""
    low, high = float(image.min()), float(np.percentile(image, 99))
    return np.clip((image - low) / max(high - low, 1e-12), 0.0, 1.0), low, high


def _invert(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return image.max() + image.min() - image


def _gamma(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    unit, low, high = _unit_range(image)
    return low + unit ** 3.0 * (high - low)


def _noise(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    _, low, high = _unit_range(image)
    return image + rng.normal(0.0, 0.1 * (high - low), image.shape)


# name -> f(image (z, y, x) float, rng) -> degraded image; the noise is drawn from a fixed seed.
DEGRADATIONS: dict[str, Callable[[np.ndarray, np.random.Generator], np.ndarray]] = {
    "contrast inversion": _invert,            # max + min − image: bright blood pool becomes dark
    "gamma 3": _gamma,                        # [min, p99] → [0, 1], cubed, back: mid-greys much darker
    "noise 10 %": _noise,                     # Gaussian, σ = 10 % of the [min, p99] range
}


def _auroc(score: np.ndarray, good: np.ndarray) -> float:
    """AUROC of ``score`` ranking good structures above poor ones (NaN unless both occur)."""
    return error_detection_auroc(score, good) if 0 < good.sum() < good.size else float("nan")


def _statistics(predicted: np.ndarray, low: np.ndarray, high: np.ndarray, measured: np.ndarray, review: np.ndarray,
                groups: np.ndarray, poor_below: float) -> dict[str, float | int | list[float]]:
    known = ~np.isnan(predicted) & ~np.isnan(measured)
    flagged = ~np.isnan(review) & ~np.isnan(measured)
    good = measured[flagged] >= poor_below
    varied = known.sum() >= 3 and np.ptp(predicted[known]) > 0 and np.ptp(measured[known]) > 0
    return {
        "cases": int(known.sum()),
        "spearman": float(spearmanr(predicted[known], measured[known]).statistic) if varied else float("nan"),
        "spearman_interval": list(spearman_interval(predicted[known], measured[known], groups[known])),
        "mae": float(np.abs(predicted[known] - measured[known]).mean()) if known.any() else float("nan"),
        "mean_predicted": float(predicted[known].mean()) if known.any() else float("nan"),
        "mean_measured": float(measured[known].mean()) if known.any() else float("nan"),
        "interval_coverage": float(((measured[known] >= low[known]) & (measured[known] <= high[known])).mean())
        if known.any() else float("nan"),
        "poor": int((~good).sum()),
        "flagged": int(review[flagged].sum()),
        "flagged_poor": int(review[flagged][~good].sum()),
        "review_auroc": _auroc(1.0 - review[flagged], good),
        "predicted_dice_auroc": _auroc(predicted[known], measured[known] >= poor_below),
    }


def quality_statistics(rows: Sequence[dict[str, float]], class_names: Sequence[str],
                       poor_below: float = POOR_BELOW,
                       groups: Sequence[str] | None = None,
                       ) -> dict[str, dict[str, float | int | list[float]]]:
    """Predicted-vs-measured statistics per structure and pooled (see the module docstring).

    Args:
        rows: one flat row per case with ``dice_<structure>`` and the columns of
            :func:`CalibSegLib.quality.summary_columns` (NaN where undefined).
        class_names: C names, background first.
        poor_below: measured Dice under which a structure counts as poor.
        groups: the patient of each row, the unit the ρ interval resamples (default: every row its own).
    """
    prefixes = ("predicted_dice_", "predicted_dice_low_", "predicted_dice_high_", "dice_", "review_")
    patients = np.asarray(groups if groups is not None else range(len(rows)))
    arrays = {name: [np.array([row[f"{prefix}{structure_key(name)}"] for row in rows], dtype=np.float64)
                     for prefix in prefixes] for name in class_names[1:]}
    report = {name: _statistics(*values, patients, poor_below) for name, values in arrays.items()}
    pooled = [np.concatenate([values[index] for values in arrays.values()]) for index in range(len(prefixes))]
    report[ALL_STRUCTURES] = _statistics(*pooled, np.tile(patients, len(arrays)), poor_below)
    return report


def degraded_images(cases: Sequence[Case], degradation: str) -> Iterator[np.ndarray]:
    """Each case's image ``(z, y, x)`` or ``(K, z, y, x)`` float32 after ``degradation``, each channel on its own
    range (a T1 beside a FLAIR, or a CT in HU, would otherwise be inverted or scaled by the others' range); the
    noise generator starts again from :data:`NOISE_SEED` for every call, so the same cases always give the same
    copies."""
    rng = np.random.default_rng(NOISE_SEED)
    degrade = DEGRADATIONS[degradation]
    for case in cases:
        image = case.image.astype(np.float32)
        yield degrade(image, rng) if image.ndim == 3 else np.stack([degrade(channel, rng) for channel in image])


def degraded_rows(predictor: Predictor, cases: Sequence[Case], degradation: str) -> list[dict[str, float]]:
    """Measured Dice and :func:`~CalibSegLib.quality.summary_columns` of every case after ``degradation``: the
    analysis without a reference (what a user would see) and the Dice against the case's label, no other metric."""
    metadata = predictor.metadata
    rows = []
    for case, image in zip(cases, degraded_images(cases, degradation), strict=True):
        analysis = analyse_case(predictor, image, case.spacing)
        measured = dice(analysis.prediction.labels, case.label.astype(np.int64), metadata.num_classes)
        rows.append({"case": case.case_id,
                     **{f"dice_{structure_key(name)}": float(value)
                        for name, value in zip(metadata.class_names[1:], measured)},
                     **summary_columns(analysis.summary)})
    return rows


def quality_section(model: QualityModel, class_names: Sequence[str], clean_rows: Sequence[dict[str, float]],
                    degraded: dict[str, Sequence[dict[str, float]]], patients: Sequence[str]) -> dict:
    """The quality section of an evaluation summary from its rows (:func:`quality_report`'s return value).

    Args:
        model: the evaluated bundle's quality model.
        class_names: C names, background first.
        clean_rows: the per-case rows on the test volumes (measured and predicted Dice columns).
        degraded: per degradation, the rows of the degraded copies of the same volumes, in the same order.
        patients: the patient of each clean row.
    """
    report: dict = {"review_below": model.review_below,
                    "clean": quality_statistics(clean_rows, class_names, POOR_BELOW, patients), "degraded": {}}
    if model.review_below_by_structure:
        report["review_below_by_structure"] = {name: model.review_threshold(name) for name in class_names[1:]}
    for degradation, rows in degraded.items():
        report["degraded"][degradation] = quality_statistics(rows, class_names, POOR_BELOW, patients)
    if len(degraded) > 1:
        report["degraded"]["degraded (all)"] = quality_statistics(
            [row for rows in degraded.values() for row in rows], class_names, POOR_BELOW,
            list(patients) * len(degraded))
    return report


def quality_report(bundle: Bundle, clean_rows: Sequence[dict[str, float]], cases: Sequence[Case],
                   degradations: Sequence[str] = (), device: str = "auto",
                   batch_size: int = 16) -> dict | None:
    """The quality section of an evaluation summary; None for a bundle without a quality model.

    Args:
        bundle: the evaluated bundle (its own temperature and quality model).
        clean_rows: its per-case rows on ``cases``, in their order (measured and predicted Dice columns).
        cases: the test cases, predicted again under each of ``degradations``.

    Returns:
        ``{"review_below", "clean": statistics, "degraded": {name: statistics, "degraded (all)": ...}}``
        (and ``"review_below_by_structure"`` when the model has one threshold per structure) with statistics as
        :func:`quality_statistics` returns them.
    """
    model = bundle.metadata.quality
    if model is None:
        return None
    predictor = Predictor(bundle, device=device, batch_size=batch_size) if degradations else None
    return quality_section(model, bundle.metadata.class_names, clean_rows,
                           {degradation: degraded_rows(predictor, cases, degradation) for degradation in degradations},
                           [case.patient_id for case in cases])
