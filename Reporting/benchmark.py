"""Train and evaluate several methods alike, then write the papers' comparison table with ranks.

    calibseg-benchmark --methods ce_dice,nacl,crac --epochs 30 --data "$CALIBSEG_ACDC" --out runs/benchmark
    calibseg-benchmark --collect runs/benchmark/* --out runs/benchmark

Every method is trained by ``Training/train.py`` into ``<out>/<method>`` with the same data,
split, schedule and seed; flags this script does not know (``--paper``, ``--image-size``,
``--device``, ``--seed`` ...) are passed on to train.py unchanged. A method whose run folder
already holds an evaluated bundle is collected, not retrained; one with only a checkpoint
is resumed. ``--collect`` skips training and reads finished run folders.

Writes, atomically, into ``--out``:
- ``benchmark.md``: one table before temperature scaling (T = 1, as the papers report) and
  one after (the bundle's fitted T): DSC, HD95 (mm), ECE, CECE, TACE, Brier, NLL,
  error-detection AUROC and AURC, each the mean over the test cases, with the Friedman mean
  rank and the sum of ranks (:func:`CalibSegLib.metrics.rank_methods`) over the papers'
  five metrics (DSC, HD95, ECE, CECE, TACE) of every dataset;
- ``benchmark.csv``: the same numbers plus standard deviations and undefined counts, one row
  per method, dataset and temperature variant.
"""

from __future__ import annotations

import argparse
import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from CalibSegLib.bundle import BundleError, BundleMetadata, load_bundle
from CalibSegLib.io import atomic_output, recorded_path
from CalibSegLib.losses import LOSSES
from CalibSegLib.metrics import RankTable, rank_methods
from Datasets.dataset_names import recorded_dataset
from Evaluation.summary import EVALUATION_DIR, METRICS, RANKED_METRICS, SUMMARY_NAME, VARIANTS, EvaluationSummary
from Reporting.formatting import format_value, markdown_table
from Training.records import BUNDLE_NAME, CHECKPOINT_NAME, RUN_SUMMARY_NAME, RunSummary

__all__ = ["RunResult", "collect_run", "benchmark_tables", "ranked_table",
           "table_caption", "benchmark_csv", "write_benchmark", "main"]


VARIANT_TITLES = {
    "uncalibrated": "Before temperature scaling (T = 1, as the papers report)",
    "scaled": "After temperature scaling (T fitted on the validation patients)",
}


@dataclass
class RunResult:
    """One finished run: its method, dataset, test summary (``evaluation/summary.json``), folder, bundle
    metadata and, for runs that wrote one, its run summary (``run.json``)."""

    run_dir: Path
    method: str
    dataset: str
    summary: EvaluationSummary
    metadata: BundleMetadata
    run: RunSummary | None = None

    def value(self, variant: str, key: str, statistic: str = "mean") -> float:
        return self.summary.variants[variant].value(key, statistic)


def collect_run(run_dir: str | Path) -> RunResult:
    """Read a finished run folder (bundle, ``evaluation/summary.json``, and ``run.json`` when there is one).

    Raises:
        ValueError: the folder has no bundle or no evaluation (one sentence naming it).
    """
    run_dir = Path(run_dir)
    summary_path = run_dir / EVALUATION_DIR / SUMMARY_NAME
    if not summary_path.is_file():
        raise ValueError(
            f"{run_dir} has no {EVALUATION_DIR}/{SUMMARY_NAME}; "
            "train it to the end or run calibseg-evaluate on its bundle."
        )
    metadata = load_bundle(run_dir / BUNDLE_NAME).metadata
    summary = EvaluationSummary.read(summary_path)
    run = RunSummary.read(run_dir) if (run_dir / RUN_SUMMARY_NAME).is_file() else None
    return RunResult(run_dir, metadata.training.get("method", run_dir.name), recorded_dataset(metadata.data), summary,
                     metadata, run)


def _labels(runs: Sequence[RunResult]) -> list[str]:
    """Row labels: the method, or the run folder's name where one method appears twice on a dataset."""
    seen = [(run.method, run.dataset) for run in runs]
    return [run.method if seen.count((run.method, run.dataset)) == 1 else run.run_dir.name for run in runs]


def benchmark_tables(runs: Sequence[RunResult], variant: str) -> tuple[dict[str, dict[str, float]], RankTable]:
    """``{row label: {"<dataset>/<metric key>": mean}}`` for one temperature variant, and its ranks.

    Rows are methods; a method missing on some dataset gets NaN there (ranked last).
    """
    labels = _labels(runs)
    datasets = sorted({run.dataset for run in runs})
    columns = [f"{dataset}/{metric.key}" for dataset in datasets for metric in METRICS]
    table: dict[str, dict[str, float]] = {label: dict.fromkeys(columns, float("nan")) for label in labels}
    for label, run in zip(labels, runs):
        for metric in METRICS:
            table[label][f"{run.dataset}/{metric.key}"] = run.value(variant, metric.key)
    ranked = {label: {column: row[column] for column in columns if column.split("/", 1)[1] in RANKED_METRICS}
              for label, row in table.items()}
    direction = {f"{dataset}/{metric.key}": metric.higher_is_better for dataset in datasets for metric in METRICS}
    return table, rank_methods(ranked, direction)


def ranked_table(runs: Sequence[RunResult], variant: str) -> list[str]:
    """Markdown lines of one temperature variant's table, best Friedman rank first, with HD95 caveats."""
    datasets = sorted({run.dataset for run in runs})
    table, ranks = benchmark_tables(runs, variant)
    header = ["Method"] + [
        (f"{dataset} " if len(datasets) > 1 else "") + metric.label + (" ↑" if metric.higher_is_better else " ↓")
        for dataset in datasets for metric in METRICS
    ] + ["Friedman rank ↓", "Sum of ranks ↓", "Final rank"]
    rows = []
    for index in sorted(range(len(ranks.methods)), key=lambda row: (ranks.final[row], ranks.friedman[row])):
        label = ranks.methods[index]
        cells = [format_value(table[label][f"{dataset}/{metric.key}"], metric.key)
                 for dataset in datasets for metric in METRICS]
        rows.append([label, *cells, f"{ranks.friedman[index]:.2f}", f"{ranks.rank_sum[index]:.0f}",
                     str(ranks.final[index])])
    lines = markdown_table(header, rows)
    undefined = {run.run_dir.name: int(run.value(variant, "hd95_mean", "undefined"))
                 for run in runs if run.value(variant, "hd95_mean", "undefined")}
    if undefined:
        lines += ["", "HD95 undefined (a class present in only one of prediction and reference) in: "
                  + ", ".join(f"{name} ({count} cases)" for name, count in undefined.items()) + "."]
    return lines


def table_caption(runs: Sequence[RunResult]) -> str:
    """What the table's numbers are: which test cases, which ranking."""
    datasets = sorted({run.dataset for run in runs})
    cases = {run.dataset: len(run.summary.cases) for run in runs}
    return ("Mean over the test cases of " + ", ".join(f"{name} ({cases[name]} volumes)" for name in datasets) + ". "
            "Friedman rank = mean rank over " + ", ".join(m.label for m in METRICS if m.key in RANKED_METRICS)
            + " of every dataset (the papers' ranking; 1 = best, ties share the best rank); "
            "Brier, NLL, error-detection AUROC (↑) and AURC (↓) are reported beside, unranked.")


def _markdown(runs: Sequence[RunResult]) -> str:
    lines = ["# CalibSeg benchmark", "", table_caption(runs), ""]
    for variant in ("uncalibrated", "scaled"):
        lines += [f"## {VARIANT_TITLES[variant]}", "", *ranked_table(runs, variant), ""]
    lines += ["Runs: " + ", ".join(f"`{recorded_path(run.run_dir)}`" for run in runs), ""]
    return "\n".join(lines)


def benchmark_csv(runs: Sequence[RunResult]) -> str:
    """One row per method, dataset and temperature variant: means, standard deviations, undefined counts, ranks."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    statistics = ("mean", "std", "undefined")
    writer.writerow(["method", "dataset", "variant", "run_dir", "cases", "friedman_rank", "rank_sum"]
                    + [f"{metric.key}_{statistic}" for metric in METRICS for statistic in statistics])
    for variant in VARIANTS:
        _, ranks = benchmark_tables(runs, variant)
        for label, run in zip(_labels(runs), runs):
            index = ranks.methods.index(label)
            writer.writerow([label, run.dataset, variant, recorded_path(run.run_dir), len(run.summary.cases),
                             f"{ranks.friedman[index]:.4f}", f"{ranks.rank_sum[index]:.0f}"]
                            + [run.value(variant, metric.key, statistic)
                               for metric in METRICS for statistic in statistics])
    return buffer.getvalue()


def write_benchmark(runs: Sequence[RunResult], out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``benchmark.md`` and ``benchmark.csv`` into ``out_dir`` atomically; returns both paths."""
    if not runs:
        raise ValueError("No runs to tabulate; give --methods or --collect with finished run folders.")
    out_dir = Path(out_dir)
    paths = out_dir / "benchmark.md", out_dir / "benchmark.csv"
    for path, text in zip(paths, (_markdown(runs), benchmark_csv(runs))):
        with atomic_output(path) as temporary:
            temporary.write_text(text)
    return paths


def train_method(method: str, run_dir: Path, train_arguments: Sequence[str]) -> Path:
    """Train (or resume, or reuse) ``method`` into ``run_dir`` with train.py; returns the run folder."""
    from Training.train import main as train_main

    if (run_dir / EVALUATION_DIR / SUMMARY_NAME).is_file() and (run_dir / BUNDLE_NAME).is_file():
        print(f"{method}: {run_dir} is already trained and evaluated; collecting it", flush=True)
        return run_dir
    argv = ["--method", method, "--out", str(run_dir), *train_arguments]
    if (run_dir / CHECKPOINT_NAME).is_file():
        argv.append("--resume")
    print(f"== {method}: calibseg-train {' '.join(argv)}", flush=True)
    train_main(argv)
    return run_dir


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calibseg-benchmark", description=__doc__.split("\n\n")[0],
                                     epilog="Unknown flags are passed on to Training/train.py.")
    parser.add_argument("--methods", default=",".join(LOSSES),
                        help=f"comma-separated losses to train (default: all of {', '.join(LOSSES)})")
    parser.add_argument("--collect", nargs="+", type=Path, metavar="RUN_DIR",
                        help="tabulate these finished run folders instead of training")
    parser.add_argument("--out", type=Path, default=Path("runs") / "benchmark", help="table folder and run folders")
    parser.add_argument("--epochs", type=int, default=None, help="passed to train.py")
    parser.add_argument("--data", type=Path, default=None, help="passed to train.py")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibseg-benchmark`` command: prints the table and where it went; returns the exit status 0. Bad input
    exits with one sentence, no traceback."""
    arguments, train_arguments = _parser().parse_known_args(argv)
    for flag, value in (("--epochs", arguments.epochs), ("--data", arguments.data)):
        if value is not None:
            train_arguments += [flag, str(value)]
    try:
        if arguments.collect:
            run_dirs = arguments.collect
        else:
            methods = [name.strip() for name in arguments.methods.split(",") if name.strip()]
            unknown = [name for name in methods if name not in LOSSES]
            if unknown or not methods:
                raise ValueError(f"Unknown method(s) {', '.join(unknown) or '(none given)'}; "
                                 f"choose from {', '.join(LOSSES)}.")
            run_dirs = [train_method(method, arguments.out / method, train_arguments) for method in methods]
        paths = write_benchmark([collect_run(run_dir) for run_dir in run_dirs], arguments.out)
    except (BundleError, ValueError, OSError) as error:
        raise SystemExit(f"error: {error}") from None
    print(paths[0].read_text())
    print(f"table: {paths[0]}\ncsv: {paths[1]}")
    return 0


if __name__ == "__main__":
    main()
