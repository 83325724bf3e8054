"""The quality report as Markdown: how well each bundle's predicted Dice and review flag did.

    python -m Reporting.quality_tables runs/acdc_*/evaluation/summary.json

One table per model and structure on the test volumes, then one per model and degraded input
pooled over structures, from the ``quality`` section :mod:`Evaluation.quality_report` puts into
every evaluation summary; the results page shows the same tables for the shipped models
(:func:`Reporting.readme_tables.shipped_quality_report`, from their ``*.metrics.json``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from Evaluation.quality_report import ALL_STRUCTURES
from Evaluation.summary import EvaluationSummary
from Reporting.formatting import markdown_table, number_cell

__all__ = ["quality_tables", "main"]


def _interval_cell(statistics: dict) -> str:
    """ρ's bootstrap interval over patients as ``low to high``; n/a where it is undefined or, in a report
    written before it was measured, absent."""
    low, high = statistics.get("spearman_interval", (float("nan"),) * 2)
    return "n/a" if low != low else f"{number_cell(low, signed=True)} to {number_cell(high, signed=True)}"


def quality_tables(reports: dict[str, dict]) -> list[str]:
    """Markdown lines: per model and structure on the test volumes, then per model and degraded input
    pooled over structures. ``reports`` maps a model's label to its
    :func:`~Evaluation.quality_report.quality_report`."""
    def cells(statistics: dict) -> list[str]:
        return [number_cell(statistics["spearman"], signed=True), _interval_cell(statistics),
                number_cell(statistics["mae"], 3),
                f"{number_cell(statistics['mean_predicted'], 3)} / {number_cell(statistics['mean_measured'], 3)}",
                f"{statistics['flagged_poor']} / {statistics['poor']}",
                str(statistics["flagged"] - statistics["flagged_poor"]),
                number_cell(statistics["review_auroc"]), number_cell(statistics["predicted_dice_auroc"])]

    common = ["ρ predicted–measured", "ρ 95 % interval", "MAE", "mean predicted / measured", "poor flagged / poor",
              "good flagged", "flag AUROC", "predicted-Dice AUROC"]
    clean = [[label, structure, str(statistics["cases"]), *cells(statistics),
              number_cell(statistics["interval_coverage"])]
             for label, report in reports.items() for structure, statistics in report["clean"].items()]
    degraded = [[label, name, str(report["degraded"][name][ALL_STRUCTURES]["cases"]),
                 *cells(report["degraded"][name][ALL_STRUCTURES])]
                for label, report in reports.items() for name in report["degraded"]]
    lines = markdown_table(["Model", "Structure", "n predicted", *common, "interval coverage"], clean)
    if degraded:
        lines += ["", *markdown_table(["Model", "Degraded input (all structures)", "n predicted", *common], degraded)]
    return lines


def main(argv: Sequence[str] | None = None) -> list[str]:
    """Print the quality tables of evaluation summaries (``summary.json`` files written by calibseg-evaluate)."""
    parser = argparse.ArgumentParser(prog="python -m Reporting.quality_tables", description=main.__doc__)
    parser.add_argument("summaries", nargs="+", type=Path, metavar="SUMMARY_JSON")
    arguments = parser.parse_args(argv)
    reports = {}
    for path in arguments.summaries:
        try:
            summary = EvaluationSummary.read(path)
        except ValueError as error:
            raise SystemExit(f"error: {error}") from None
        if not summary.quality:
            raise SystemExit(f"error: {path} has no quality report; its bundle has no quality model.")
        reports[Path(summary.bundle or path.parent.parent.name).stem] = summary.quality
    lines = quality_tables(reports)
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
