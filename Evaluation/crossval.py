"""A cross-validation's out-of-fold results: every labelled patient predicted once, by the fold network that did
not train on it, summarised with patient-level intervals, and methods compared on the same patients.

The input is each fold's out-of-fold evaluation (:func:`Evaluation.evaluate.evaluate_bundle`'s ``summary.json`` and
``per_case.csv`` on the fold's validation patients, ``Training.out_of_fold``). Per temperature variant
(:data:`Evaluation.summary.VARIANTS`) and metric column (:data:`Evaluation.summary.METRICS`, plus any other column
asked for), :func:`cross_validation_summary` gives the mean over all out-of-fold volumes with a 95 % interval that
resamples whole patients (:func:`Evaluation.bootstrap.mean_interval`), and the same per fold (how far the folds'
networks differ). :func:`paired_comparisons` sets two or more methods side by side on the volumes they share:
each pair's mean difference with its interval and Wilcoxon signed-rank p over patients, and per metric each method's
mean Friedman rank over patients with Friedman's test where there are at least three methods.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy.stats import friedmanchisquare, rankdata

from CalibSegLib.io import atomic_output, write_json_atomic
from Datasets.errors import DataError
from Evaluation.bootstrap import BOOTSTRAP_RESAMPLES, INTERVAL_LEVEL, mean_interval, paired_difference, patient_values
from Evaluation.summary import CASES_NAME, METRICS, SUMMARY_NAME, VARIANTS, EvaluationSummary

__all__ = ["CROSSVAL_DIR", "OUT_OF_FOLD_CASES_NAME", "CaseResults", "read_out_of_fold", "cross_validation_summary",
           "paired_comparisons", "write_cross_validation", "summary_lines"]

CROSSVAL_DIR = "crossval"  # in a cross-validation's folder, beside its fold_K folders
OUT_OF_FOLD_CASES_NAME = "out_of_fold_cases.csv"


@dataclass
class CaseResults:
    """One method's metric rows per volume, e.g. its out-of-fold results: ``rows[variant]`` one row per volume
    (``per_case.csv``'s columns, floats), ``patients[i]`` and ``folds[i]`` the patient and fold of row i (the same
    order in every variant; fold 0 throughout for one test set)."""

    label: str
    cases: list[str]
    patients: list[str]
    folds: list[int]
    rows: dict[str, list[dict[str, float]]]

    def column(self, variant: str, key: str) -> np.ndarray:
        """One metric over the volumes ``(n,)``, NaN where a row lacks it."""
        return np.array([row.get(key, math.nan) for row in self.rows[variant]], dtype=np.float64)


def _read_rows(path: Path) -> dict[str, dict[str, dict[str, float]]]:
    """``per_case.csv`` as ``{variant: {case: {column: value}}}``."""
    rows: dict[str, dict[str, dict[str, float]]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            values = {key: float(value) if value not in ("", None) else math.nan
                      for key, value in row.items() if key not in ("case", "variant")}
            rows.setdefault(row["variant"], {})[row["case"]] = values
    return rows


def read_out_of_fold(folders: Sequence[str | Path], label: str) -> CaseResults:
    """The out-of-fold results of a cross-validation from its folds' out-of-fold folders (fold k's at index k).

    Raises:
        DataError: a folder lacks its summary or table, predates the case-to-patient map, or two folds predict one
            patient (folds that are not one cross-validation's).
    """
    cases: list[str] = []
    patients: list[str] = []
    folds: list[int] = []
    rows: dict[str, list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
    for fold, folder in enumerate(map(Path, folders)):
        if not (folder / SUMMARY_NAME).is_file() or not (folder / CASES_NAME).is_file():
            raise DataError(f"{folder} holds no out-of-fold evaluation ({SUMMARY_NAME}, {CASES_NAME}); finish that "
                            "fold's training, or let calibseg-crossval complete it.")
        summary = EvaluationSummary.read(folder / SUMMARY_NAME)
        if not summary.case_patients:
            raise DataError(f"{folder / SUMMARY_NAME} does not say which patient each case belongs to; delete "
                            f"{folder} and let calibseg-crossval evaluate the fold again.")
        table = _read_rows(folder / CASES_NAME)
        for case in summary.cases:
            cases.append(case)
            patients.append(summary.case_patients[case])
            folds.append(fold)
            for variant in VARIANTS:
                rows[variant].append(table[variant][case])
    twice = sorted({patient for patient in patients if len({f for p, f in zip(patients, folds) if p == patient}) > 1})
    if twice:
        raise DataError(f"{len(twice)} patient(s) (first: {twice[0]}) are predicted out of fold by two folds, so "
                        "these folds are not one cross-validation's; give the fold folders of one.")
    return CaseResults(label, cases, patients, folds, rows)


def _interval(values: np.ndarray, groups: Sequence[str]) -> dict[str, float]:
    mean, low, high = mean_interval(values, np.asarray(groups))
    return {"mean": mean, "low": low, "high": high, "count": int(np.count_nonzero(~np.isnan(values)))}


def cross_validation_summary(results: CaseResults, columns: Sequence[str] = ()) -> dict[str, Any]:
    """Per variant and metric (:data:`METRICS` and ``columns``): the mean over all volumes (out of fold, or of a
    test set) with its patient-level interval, and per fold the mean over that fold's volumes (``{"mean", "low", "high",
    "count", "folds": [mean per fold]}``); with the patients, volumes and folds counted."""
    keys = [metric.key for metric in METRICS] + [column for column in columns if column not in
                                                  {metric.key for metric in METRICS}]
    fold_ids = sorted(set(results.folds))
    folds = np.asarray(results.folds)
    variants: dict[str, Any] = {}
    for variant in VARIANTS:
        variants[variant] = {}
        for key in keys:
            values = results.column(variant, key)
            entry = _interval(values, results.patients)
            entry["folds"] = [float(np.nanmean(values[folds == fold])) if np.any(~np.isnan(values[folds == fold]))
                              else math.nan for fold in fold_ids]
            variants[variant][key] = entry
    return {"label": results.label, "volumes": len(results.cases), "patients": len(set(results.patients)),
            "folds": len(fold_ids), "interval": {"level": INTERVAL_LEVEL, "resamples": BOOTSTRAP_RESAMPLES,
                                                  "unit": "patient"},
            "variants": variants}


def _aligned(results: Sequence[CaseResults]) -> list[list[int]]:
    """Per method, the row indices of the volumes every method predicted, in one common order.

    Raises:
        DataError: the methods share no volume.
    """
    shared = sorted(set.intersection(*(set(result.cases) for result in results)))
    if not shared:
        raise DataError("These cross-validations predict no volume in common, so they cannot be compared; give "
                        "cross-validations of one dataset.")
    return [[result.cases.index(case) for case in shared] for result in results]


def paired_comparisons(results: Sequence[CaseResults], variant: str, columns: Sequence[str] = ()) -> dict[str, Any]:
    """Two or more methods on the out-of-fold volumes they share, for one ``variant``: per metric
    (:data:`METRICS` and ``columns``) every pair's difference (first minus second, with its interval and Wilcoxon
    p), each method's mean Friedman rank over patients (1 = best) and, with three or more methods, Friedman's
    test p."""
    if len(results) < 2:
        raise DataError("A comparison needs the cross-validations of at least two methods.")
    rows = _aligned(results)
    patients = np.asarray([results[0].patients[index] for index in rows[0]])
    direction = {metric.key: metric.higher_is_better for metric in METRICS}
    comparison: dict[str, Any] = {"variant": variant, "methods": [result.label for result in results],
                                  "volumes": len(patients), "patients": len(set(patients)), "metrics": {}}
    for key in [metric.key for metric in METRICS] + list(columns):
        values = [result.column(variant, key)[indices] for result, indices in zip(results, rows)]
        pairs = {f"{results[i].label} - {results[j].label}": paired_difference(values[i], values[j], patients)
                 for i, j in itertools.combinations(range(len(results)), 2)}
        per_patient = np.stack([patient_values(method_values, patients)[1] for method_values in values], axis=1)
        complete = per_patient[~np.isnan(per_patient).any(axis=1)]
        oriented = -complete if direction.get(key, True) else complete
        ranks = rankdata(oriented, axis=1).mean(axis=0) if len(complete) else np.full(len(results), np.nan)
        friedman_p = (float(friedmanchisquare(*complete.T).pvalue)
                      if len(results) >= 3 and len(complete) >= 3 and np.ptp(complete) > 0 else math.nan)
        comparison["metrics"][key] = {"pairs": pairs, "mean_rank": dict(zip(comparison["methods"], ranks.tolist())),
                                      "friedman_p": friedman_p}
    return comparison


def write_cross_validation(results: CaseResults, out_dir: str | Path, columns: Sequence[str] = ()) -> dict[str, Any]:
    """Write ``summary.json`` (:func:`cross_validation_summary`) and ``out_of_fold_cases.csv`` (every volume's row,
    with its patient and fold) into ``out_dir``, each atomically; returns the summary."""
    out_dir = Path(out_dir)
    summary = cross_validation_summary(results, columns)
    buffer = io.StringIO()
    header = list(results.rows[VARIANTS[0]][0])
    writer = csv.DictWriter(buffer, fieldnames=["case", "patient", "fold", "variant", *header])
    writer.writeheader()
    for variant in VARIANTS:
        for case, patient, fold, row in zip(results.cases, results.patients, results.folds, results.rows[variant]):
            writer.writerow({"case": case, "patient": patient, "fold": fold, "variant": variant, **row})
    with atomic_output(out_dir / OUT_OF_FOLD_CASES_NAME) as temporary:
        temporary.write_text(buffer.getvalue())
    write_json_atomic(out_dir / SUMMARY_NAME, summary)
    return summary


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """A few console lines: the out-of-fold means with their intervals at T = 1 and at the fitted temperature."""
    lines = [f"{summary['label']}: out of fold, {summary['volumes']} volumes of {summary['patients']} patients in "
             f"{summary['folds']} folds (means, {summary['interval']['level']:.0%} intervals resampling patients)"]
    for variant, label in (("uncalibrated", "T = 1"), ("scaled", "fitted T")):
        values = summary["variants"][variant]
        lines.append(f"  {label:8}  " + "  ".join(
            f"{metric.label} {values[metric.key]['mean']:.3f} [{values[metric.key]['low']:.3f}, "
            f"{values[metric.key]['high']:.3f}]" for metric in METRICS[:5]))
    return lines
