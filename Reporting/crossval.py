"""The cross-validation summary: out-of-fold results of one or more methods, every number with its interval.

    calibseg-crossval runs/ce_dice-cv runs/crac-cv runs/nacl-cv --record docs/records/crossval_acdc.json

Each argument is a cross-validation's folder (``calibseg-train --fold all --out FOLDER``). A fold whose out-of-fold
records are missing (trained before they were written) is evaluated first (:mod:`Training.out_of_fold`); then each
folder gets its ``crossval/`` summary (:func:`Evaluation.crossval.write_cross_validation`), and with two or more
methods they are compared on the volumes they share (:func:`Evaluation.crossval.paired_comparisons`) at T = 1 (the
papers' protocol) and at each fold's fitted temperature. The tables are printed; ``--record`` keeps them as JSON, from
which ``python -m Reporting.readme_tables`` writes docs/results.md's out-of-fold tables (:func:`crossval_tables`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from CalibSegLib.io import os_error_sentence, recorded_path, write_json_atomic
from Datasets.case_names import patient_of_case
from Datasets.errors import DataError
from Evaluation.crossval import (CROSSVAL_DIR, CaseResults, cross_validation_summary, paired_comparisons,
                                 read_out_of_fold, write_cross_validation)
from Evaluation.summary import METRICS, VARIANTS
from Reporting.formatting import markdown_table, number_cell, p_value_cell
from Training.out_of_fold import complete_out_of_fold, out_of_fold_dir
from Training.records import RunSummary

__all__ = ["collect_cross_validation", "crossval_record", "crossval_tables", "out_of_fold_comparison_table",
           "shipped_results", "shipped_comparison_table", "main"]

# (variant, label) in the order the tables show them: the papers' protocol first.
_VARIANTS = (("uncalibrated", "T = 1"), ("scaled", "fitted T"))
_CALIBRATION = ("ece", "tace")  # shown at both temperatures; the other metrics at the fitted one only


def _folds(folder: Path) -> list[Path]:
    folds = sorted((path for path in folder.glob("fold_*") if path.is_dir() and path.name[5:].isdigit()),
                   key=lambda path: int(path.name[5:]))
    if not folds:
        raise DataError(f"{folder} holds no fold_K folder; train one with calibseg-train --fold all --out {folder}.")
    return folds


def collect_cross_validation(folders: Sequence[str | Path], data: str | Path | None = None, device: str = "auto"
                             ) -> list[CaseResults]:
    """Each cross-validation folder's out-of-fold results (its missing records evaluated first), labelled by its
    method, or by its folder's name where two folders share a method."""
    results = []
    for folder in map(Path, folders):
        folds = _folds(folder)
        for fold in folds:
            complete_out_of_fold(fold, data, device)
        results.append(read_out_of_fold([out_of_fold_dir(fold) for fold in folds],
                                        RunSummary.read(folds[0]).method))
    methods = [result.label for result in results]
    for result, folder in zip(results, map(Path, folders)):
        if methods.count(result.label) > 1:
            result.label = folder.name
    return results


def crossval_record(results: Sequence[CaseResults], folders: Sequence[str | Path]) -> dict[str, Any]:
    """Every method's summary (written into its folder's ``crossval/``) and, with two or more, their comparisons."""
    summaries = {result.label: write_cross_validation(result, Path(folder) / CROSSVAL_DIR)
                 for result, folder in zip(results, folders)}
    comparisons = {variant: paired_comparisons(results, variant) for variant, _ in _VARIANTS} \
        if len(results) >= 2 else {}
    return {"folders": [recorded_path(folder) for folder in folders], "methods": summaries, "comparisons": comparisons}


def _interval_cell(entry: dict[str, float], digits: int) -> str:
    return (f"{number_cell(entry['mean'], digits)} [{number_cell(entry['low'], digits)}, "
            f"{number_cell(entry['high'], digits)}]")


def _columns() -> list[tuple[str, str, str]]:
    """(variant, metric key, header) of the summary table."""
    columns = [("scaled", metric.key, metric.label) for metric in METRICS[:2]]
    columns += [(variant, key, f"{metric.label} ({label})") for key in _CALIBRATION
                for metric in METRICS if metric.key == key for variant, label in _VARIANTS]
    return columns + [("scaled", metric.key, metric.label) for metric in METRICS[5:8]]


def _out_of_fold_description(summaries: dict[str, Any]) -> str:
    counts = {(summary["patients"], summary["volumes"], summary["folds"]) for summary in summaries.values()}
    if len(counts) == 1:
        patients, volumes, folds = counts.pop()
        whose = f"every one of {patients} patients ({volumes} volumes) predicted by the fold network of {folds}"
    else:  # a cross-validation still training: its finished folds' patients only
        whose = "each patient (" + "; ".join(
            f"`{label}`: {summary['patients']} patients, {summary['volumes']} volumes, {summary['folds']} folds"
            for label, summary in summaries.items()) + ") predicted by the fold network"
    return (f"Out of fold: {whose} that did not train on it. Fitted T: each fold's own temperature, fitted on its "
            "validation patients (T = 1 where no temperature lowered its validation ECE).")


def crossval_tables(record: dict[str, Any], description: str | None = None) -> list[str]:
    """Markdown: each method's means with their intervals, then (two or more methods) the paired differences with
    their intervals and Wilcoxon p, and the mean Friedman ranks. ``description`` says whose volumes they are
    (default: a cross-validation's out-of-fold ones)."""
    summaries = record["methods"]
    first = next(iter(summaries.values()))
    columns = _columns()
    description = description or _out_of_fold_description(summaries)
    lines = [f"{description} Means over the volumes with {first['interval']['level']:.0%} intervals from "
             f"{first['interval']['resamples']} bootstrap resamples of whole patients.", ""]
    rows = [[f"`{label}`", *(_interval_cell(summary["variants"][variant][key], 2 if key == "hd95_mean" else 3)
                             for variant, key, _ in columns)] for label, summary in summaries.items()]
    lines += markdown_table(["method", *(header for _, _, header in columns)], rows)
    if not record["comparisons"]:
        return lines
    for variant, label in _VARIANTS:
        comparison = record["comparisons"][variant]
        keys = ["dice_mean", "hd95_mean", *_CALIBRATION] if variant == "scaled" else list(_CALIBRATION)
        pairs = list(comparison["metrics"][keys[0]]["pairs"])
        lines += ["", f"Paired differences at {label} (first minus second method, on the {comparison['volumes']} "
                      f"volumes of {comparison['patients']} patients both predicted; interval resampling patients; "
                      "Wilcoxon signed-rank p over the patients' mean differences):", ""]
        headers = [next(metric.label for metric in METRICS if metric.key == key) for key in keys]
        rows = []
        for pair in pairs:
            cells = []
            for key in keys:
                entry = comparison["metrics"][key]["pairs"][pair]
                digits = 2 if key == "hd95_mean" else 3
                cells.append(f"{number_cell(entry['difference'], digits, signed=True)} "
                             f"[{number_cell(entry['low'], digits, signed=True)}, "
                             f"{number_cell(entry['high'], digits, signed=True)}], "
                             f"p {p_value_cell(entry['wilcoxon_p'])}")
            rows.append([pair.replace(" - ", " − "), *cells])
        lines += markdown_table(["methods", *headers], rows)
        if len(comparison["methods"]) >= 3:
            ranks = [[f"`{method}`", *(number_cell(comparison["metrics"][key]["mean_rank"][method])
                                       for key in keys)] for method in comparison["methods"]]
            lines += ["", f"Mean Friedman rank over patients at {label} (1 = best); Friedman's test p: " + ", ".join(
                f"{header} {p_value_cell(comparison['metrics'][key]['friedman_p'])}"
                for header, key in zip(headers, keys)), ""]
            lines += markdown_table(["method", *headers], ranks)
    return lines


def shipped_results(paths: Sequence[Path]) -> list[CaseResults]:
    """The shipped models' test rows (``<name>.metrics.json``, :mod:`Reporting.ship`), each case's patient from the
    file's ``case_patients`` or, in files written before it, from the case's name
    (:func:`Datasets.case_names.patient_of_case`)."""
    results = []
    for path in sorted(paths):
        metrics = json.loads(Path(path).read_text())
        cases = list(metrics["cases"])
        patients = metrics.get("case_patients") or {case: patient_of_case(case) for case in cases}
        results.append(CaseResults(metrics["model"], cases, [patients[case] for case in cases], [0] * len(cases),
                                   {variant: [metrics["per_case"][variant][case] for case in cases]
                                    for variant in VARIANTS}))
    return results


def out_of_fold_comparison_table(paths: list[Path]) -> list[str]:
    """docs/results.md's ``crossval_comparison`` block: a ``calibseg-crossval ... --record`` record's tables."""
    return crossval_tables(json.loads(paths[0].read_text()))


def shipped_comparison_table(paths: list[Path], tested: str) -> list[str]:
    """docs/results.md's ``shipped_comparison`` block: the shipped models on their test patients (``tested`` names
    them, e.g. "15 test patients of `acdc.json`"), every mean and every paired difference with its patient-level
    interval (the block :mod:`Reporting.readme_tables` writes)."""
    results = shipped_results(paths)
    record = {"methods": {result.label: cross_validation_summary(result) for result in results},
              "comparisons": {variant: paired_comparisons(results, variant) for variant, _ in _VARIANTS}}
    first = next(iter(record["methods"].values()))
    return crossval_tables(record, f"The shipped models on the {tested} "
                                   f"({first['volumes']} volumes), from their metrics files. Fitted T: each "
                                   "bundle's own, fitted on its validation patients (an ensemble's on its folds' "
                                   "out-of-fold patients).")


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibseg-crossval`` command: prints the tables; returns the exit status 0. Bad input exits with one
    sentence, no traceback."""
    parser = argparse.ArgumentParser(prog="calibseg-crossval", description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="cross-validation folders (each holding fold_K)")
    parser.add_argument("--data", type=Path, default=None,
                        help="data folder, for folds whose out-of-fold records are missing (default: the recorded "
                             "dataset's)")
    parser.add_argument("--record", type=Path, default=None, help="write the summaries and comparisons as JSON here")
    parser.add_argument("--device", default="auto")
    arguments = parser.parse_args(argv)
    try:
        results = collect_cross_validation(arguments.folders, arguments.data, arguments.device)
        record = crossval_record(results, arguments.folders)
        if arguments.record is not None:
            write_json_atomic(arguments.record, record)
    except (DataError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    except OSError as error:
        raise SystemExit(f"error: {os_error_sentence(error)}") from None
    print("\n".join(crossval_tables(record)))
    return 0


if __name__ == "__main__":
    main()
