"""The measured tables of README.md, docs/results.md, docs/crossval.md, docs/performance.md and docs/input_check.md,
regenerated from recorded files so that their numbers cannot drift.

    python -m Reporting.readme_tables            # rewrite every block whose record exists
    python -m Reporting.readme_tables --check    # exit 1 if a document and its records disagree
    python -m Reporting.readme_tables --record-quick-start runs/ce_dice --command "calibseg-train" [--wall-s 282]

Every measured table of those documents sits between ``<!-- generated:NAME begin -->`` and
``<!-- generated:NAME end -->``; :data:`TABLES` says, per NAME, which recorded files it is made
from and how, and :data:`DOCUMENTS` which document holds which blocks (docs/results.md's own
``results:begin`` block ``calibseg-results`` writes from run folders). A block whose records do not
exist yet is left as it is (and named in the output), so a fresh clone regenerates what it can.
``Testing/test_readme_tables.py`` fails when a block differs from what its records give, or when a
marker pair has no entry here.

Records (each written by the tool that measured it):

- ``shipped_models``: ``CalibSegLib/pretrained/<name>.metrics.json`` (``Reporting/ship.py``) and
  the ``bundle.json`` inside ``<name>.calibseg`` beside it;
- ``shipped_comparison`` (docs/results.md): their test rows (``per_case``), every mean and paired difference with its
  patient-level interval (:func:`Reporting.crossval.shipped_comparison_table`);
- ``crossval_comparison`` (docs/crossval.md): :data:`CROSSVAL_RECORD`, the out-of-fold results of the shipped
  recipe's cross-validations with intervals and paired differences (``calibseg-crossval
  docs/records/crossval/acdc_ce_dice docs/records/crossval/acdc_crac docs/records/crossval/acdc_nacl --record ...``);
- ``shipped_quality`` (README) and ``shipped_quality_report`` (docs/results.md): the ``quality``
  report in those metrics files — here, not in ``calibseg-results``'s block, because
  ``calibseg-fit-quality`` changes a shipped model's quality model without a new training run;
- ``quick_start``: ``docs/records/quick_start.json``, one entry per README command, written by
  ``--record-quick-start RUN_DIR`` from the run's ``run.json`` and ``evaluation/summary.json``
  (:func:`quick_start_entry`);
- ``benchmark_<name>`` (docs/performance.md): ``docs/records/benchmark_<name>.json`` from
  ``python -m benchmarks.<name> --record docs/records/benchmark_<name>.json``; each benchmark
  script formats its own table (``record_table``) and keeps it in its record, which is copied here;
- ``input_check_<bundle>_<split>`` (docs/input_check.md): ``docs/records/input_check/<bundle>_<split>.json`` from
  ``python -m studies.input_check_table --bundle <bundle> --split <split> --record ...``, whose table is copied
  the same way.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from CalibSegLib import BUNDLE_SUFFIX
from CalibSegLib.bundle import read_metadata
from CalibSegLib.io import atomic_output, write_json_atomic
from CalibSegLib.pretrained import METRICS_SUFFIX
from CalibSegLib.temperature import temperature_text
from Reporting.crossval import out_of_fold_comparison_table, shipped_comparison_table

REPO_ROOT = Path(__file__).resolve().parents[1]

__all__ = ["Table", "TABLES", "DOCUMENTS", "SHIPPED_METRICS", "NO_QUALITY_REPORT", "MARKER", "README",
           "RESULTS_PAGE", "CROSSVAL_PAGE", "PERFORMANCE_PAGE", "INPUT_CHECK_PAGE", "QUICK_START_RECORD", "blocks",
           "regenerate", "shipped_models_table", "shipped_quality_table", "shipped_quality_report", "quick_start_entry",
           "quick_start_table", "record_quick_start", "tested_patients", "CROSSVAL_RECORD", "main"]

README = REPO_ROOT / "README.md"
RESULTS_PAGE = REPO_ROOT / "docs" / "results.md"
CROSSVAL_PAGE = REPO_ROOT / "docs" / "crossval.md"
INPUT_CHECK_PAGE = REPO_ROOT / "docs" / "input_check.md"
PERFORMANCE_PAGE = REPO_ROOT / "docs" / "performance.md"
RECORDS_DIR = REPO_ROOT / "docs" / "records"
QUICK_START_RECORD = RECORDS_DIR / "quick_start.json"
NO_QUALITY_REPORT = "*No shipped model carries a quality report.*"
# The shipped models' records (Reporting/ship.py): every table about the shipped models is made from these.
SHIPPED_METRICS = ("CalibSegLib/pretrained/*.metrics.json",)
# The shipped recipe's cross-validations side by side (calibseg-crossval ... --record, docs/records/README.md).
CROSSVAL_RECORD = "docs/records/crossval/acdc.json"
MARKER = re.compile(r"<!-- generated:(?P<name>[a-z0-9_]+) (?P<end>begin|end) -->")


@dataclass(frozen=True)
class Table:
    """One generated block: the record files it is made from (glob patterns relative to the
    repository root; none matching = no record yet) and the function turning them into lines."""

    sources: tuple[str, ...]
    render: Callable[[list[Path]], list[str]]


def _mean(summary: dict, variant: str, key: str) -> float:
    return float(summary[variant][key])


def _bundle_beside(metrics_path: Path) -> Path:
    """The shipped bundle a ``<name>.metrics.json`` file describes."""
    return metrics_path.with_name(metrics_path.name.removesuffix(METRICS_SUFFIX) + BUNDLE_SUFFIX)


def tested_patients(paths: list[Path]) -> str:
    """Which test patients the shipped models' metrics files were measured on, named by the split files their
    bundles record, e.g. "15 test patients of `acdc.json` and `acdc_cv.json`"."""
    splits: dict[frozenset, set[str]] = {}
    for path in paths:
        data = read_metadata(_bundle_beside(path)).data
        splits.setdefault(frozenset(data.get("test", [])), set()).add(Path(data.get("split_file", "?")).name)
    # A cross-validation split keeps the single-network split's test patients: one set, named by both files.
    return "; ".join(sorted(f"{len(patients)} test patients of " + " and ".join(f"`{name}`" for name in sorted(names))
                            for patients, names in splits.items()))


def shipped_models_table(paths: list[Path]) -> list[str]:
    """Table of the shipped models from their ``<name>.metrics.json`` files (``Reporting/ship.py``)."""
    rows, volumes, sizes = [], set(), []
    for path in sorted(paths):
        metrics = json.loads(path.read_text())
        bundle_path = _bundle_beside(path)
        recorded = read_metadata(bundle_path)
        summary = metrics["summary"]
        fitted = temperature_text(metrics.get("temperature", recorded.temperature))
        volumes.add(len(metrics["cases"]))
        sizes.append(bundle_path.stat().st_size / 1e6)
        rows.append(f"| `{metrics['model']}` | {_mean(summary, 'scaled', 'dice_mean'):.3f} | "
                    f"{_mean(summary, 'scaled', 'hd95_mean'):.2f} | {_mean(summary, 'uncalibrated', 'ece'):.3f} | "
                    f"{_mean(summary, 'uncalibrated', 'tace'):.3f} | "
                    f"{_mean(summary, 'scaled', 'ece'):.3f} ({fitted}) | "
                    f"{_mean(summary, 'uncalibrated', 'error_auroc'):.3f} | "
                    f"{metrics['spearman_entropy_vs_dice']['uncalibrated']:.2f} |")
    size = f"{min(sizes):.1f}" if f"{min(sizes):.1f}" == f"{max(sizes):.1f}" else f"{min(sizes):.1f}–{max(sizes):.1f}"
    return [f"Means over the {' / '.join(map(str, sorted(volumes)))} test volumes ({tested_patients(paths)}) "
            f"of each shipped file (float16, {size} MB); ECE is the mean of the per-volume ECEs over the "
            "reference foreground.",
            "",
            "| Model | DSC | HD95 (mm) | ECE (T = 1) | TACE (T = 1) | ECE (fitted T) | Error AUROC (T = 1) | "
            "ρ entropy–Dice (T = 1) |",
            "|---|---|---|---|---|---|---|---|",
            *rows]


def _quality_reports(paths: list[Path]) -> dict[str, dict]:
    """``{model: quality report}`` of the ``<name>.metrics.json`` files that carry one, in file-name order."""
    reports = {}
    for path in sorted(paths):
        metrics = json.loads(path.read_text())
        if metrics.get("quality"):
            reports[metrics["model"]] = metrics["quality"]
    return reports


def _review_thresholds(quality: dict, structures: list[str]) -> str:
    """``0.88``, or one threshold per structure in ``structures``' order: ``0.88 / 0.88 / 0.90``."""
    by_structure = quality.get("review_below_by_structure")
    if not by_structure:
        return f"{quality['review_below']:.2f}"
    return " / ".join(f"{by_structure[name]:.2f}" for name in structures)


def shipped_quality_table(paths: list[Path]) -> list[str]:
    """How each shipped model's predicted Dice and review flag did on the test volumes and on degraded copies,
    from the ``quality`` report in its ``<name>.metrics.json``."""
    from Evaluation.quality_report import ALL_STRUCTURES, POOR_BELOW

    rows = []
    for model, quality in _quality_reports(paths).items():
        clean = quality["clean"]
        structures = [name for name in clean if name != ALL_STRUCTURES]
        degraded = quality["degraded"].get("degraded (all)") or next(iter(quality["degraded"].values()), None)

        def flagged(statistics: dict) -> str:
            others = statistics["flagged"] - statistics["flagged_poor"]
            plural = "" if others == 1 else "s"
            return f"{statistics['flagged_poor']} of {statistics['poor']} poor, {others} other{plural}"

        rows.append(f"| `{model}` | " + " | ".join(
            f"{clean[name]['spearman']:+.2f} / {clean[name]['mae']:.3f}" for name in structures)
            + f" | {_review_thresholds(quality, structures)} | {flagged(clean[ALL_STRUCTURES])} | "
            f"{flagged(degraded[ALL_STRUCTURES]) if degraded else 'n/a'} |")
        header = structures
    if not rows:
        return [NO_QUALITY_REPORT]
    return ["| Model | " + " | ".join(f"{name}: ρ / MAE" for name in header) + " | review below | "
            "flagged, test volumes | flagged, degraded copies |", "|---" * (len(header) + 4) + "|", *rows, "",
            f"ρ: Spearman between predicted and measured Dice over the test volumes; MAE: their mean absolute "
            f"difference; poor: measured Dice below {POOR_BELOW:.2f}; flagged: predicted Dice below the model's review "
            "threshold (each shipped model's chosen on out-of-fold patients by the rule in docs/results.md) or the "
            "structure predicted nowhere; others: flagged structures that are not poor. Degraded copies: the test "
            "volumes contrast-inverted, at gamma 3 and with 10 % noise, pooled."]


def shipped_quality_report(paths: list[Path]) -> list[str]:
    """The results page's full quality tables (per structure on the test volumes, per degraded input) of every
    shipped model whose ``<name>.metrics.json`` carries a ``quality`` report."""
    from Reporting.quality_tables import quality_tables

    reports = _quality_reports(paths)
    return quality_tables(reports) if reports else [NO_QUALITY_REPORT]


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def quick_start_entry(run_dir: str | Path, command: str, wall_s: float | None = None) -> dict:
    """One quick-start record entry from a finished run folder (``run.json`` + ``evaluation/summary.json``).

    ``wall_s``: the command's measured wall time (e.g. ``/usr/bin/time``); without it the sum of
    the logged training, end-of-run and evaluation times is recorded (start-up and data loading
    not included), and the entry says so.

    Raises:
        ValueError: the folder holds no finished, evaluated run (one sentence).
    """
    from Evaluation.summary import EVALUATION_DIR, SUMMARY_NAME, EvaluationSummary
    from Training.records import BUNDLE_NAME, RunSummary

    run_dir = Path(run_dir)
    run = RunSummary.read(run_dir)
    summary_path = run_dir / EVALUATION_DIR / SUMMARY_NAME
    if not summary_path.is_file():
        raise ValueError(f"{run_dir} has no {EVALUATION_DIR}/{SUMMARY_NAME}; record a run that was evaluated.")
    summary = EvaluationSummary.read(summary_path)
    logged = run.training_wall_s + run.finish_wall_s + (0.0 if math.isnan(summary.wall_s) else summary.wall_s)

    def test(variant: str) -> dict[str, float]:
        means = {key: summary.variants[variant].value(key) for key in ("dice_mean", "hd95_mean", "ece")}
        return {**means, "pooled_ece": summary.variants[variant].pooled_calibration["ece"]}

    return {
        "command": command,
        "method": run.method,
        "wall_s": float(wall_s) if wall_s is not None else logged,
        "wall_measured": "the command (measured)" if wall_s is not None
        else "training + end-of-run choices + test evaluation (logged; start-up and data loading not included)",
        "epochs": run.epochs,
        "best_epoch": run.best_epoch,
        "best_validation_dice": run.best_validation_dice,
        "temperature": summary.temperature,
        "test_volumes": len(summary.cases),
        "test_patients": len(summary.patients or read_metadata(run_dir / BUNDLE_NAME).data.get("test", [])),
        "test": {variant: test(variant) for variant in ("scaled", "uncalibrated")},
        "environment": run.environment,
        "recorded": datetime.date.today().isoformat(),
    }


def record_quick_start(run_dir: str | Path, command: str, wall_s: float | None = None,
                       record: Path = QUICK_START_RECORD) -> Path:
    """Add (or replace, by command) the entry of ``run_dir`` in the quick-start record; returns its path."""
    entry = quick_start_entry(run_dir, command, wall_s)
    runs = json.loads(record.read_text())["runs"] if record.is_file() else []
    runs = [run for run in runs if run["command"] != command] + [entry]
    return write_json_atomic(record, {"about": "README.md's quick-start table (Reporting/readme_tables.py)",
                                      "runs": runs})


def quick_start_table(paths: list[Path]) -> list[str]:
    """The quick-start table from ``docs/records/quick_start.json``."""
    runs = json.loads(paths[0].read_text())["runs"]
    rows = []
    for run in runs:
        scaled, raw = run["test"]["scaled"], run["test"]["uncalibrated"]
        fitted = temperature_text(run["temperature"])
        rows.append(f"| `{run['command']}` | {_minutes(run['wall_s'])} | {run['best_validation_dice']:.3f} "
                    f"({run['best_epoch']} of {run['epochs']}) | {scaled['dice_mean']:.3f} / "
                    f"{scaled['hd95_mean']:.1f} mm / {scaled['ece']:.3f} ({fitted}) | {raw['ece']:.3f} |")

    def described(describe: Callable[[dict], str]) -> str:  # one phrase when every run shares it
        return "; ".join(dict.fromkeys(describe(run) for run in runs))

    machine = described(lambda run: f"{run['environment'].get('device', '?')} with "
                                    f"{run['environment'].get('cpu_count', '?')} cores and torch "
                                    f"{run['environment'].get('torch', '?')}, {run['recorded']}")
    test = described(lambda run: f"{run['test_volumes']} volumes of {run['test_patients']} patients")
    return ["| command | wall time | best val. Dice (epoch) | test Dice / HD95 / ECE, fitted T | test ECE, T = 1 |",
            "|---|---|---|---|---|", *rows, "",
            f"Test: means over {test} (ECE: the mean of the per-volume ECEs). Measured on {machine}; wall time: "
            f"{described(lambda run: run['wall_measured'])}."]


def _copied_table(source: str, command: str) -> Table:
    """A block that copies the table its measuring ``command`` printed and kept in its record ``source``."""
    def render(paths: list[Path]) -> list[str]:
        record = json.loads(paths[0].read_text())
        if "table" not in record:
            raise ValueError(f"{paths[0].name} holds no table; run {command} --record {paths[0]} again.")
        return list(record["table"])

    return Table((source,), render)


def _benchmark(name: str) -> Table:
    """A benchmark's block: the table its run printed (``benchmarks/record.py``)."""
    return _copied_table(f"docs/records/benchmark_{name}.json", f"python -m benchmarks.{name}")


def _input_check(bundle: str, split: str) -> Table:
    """A model's input-check table on a split's clean and shifted volumes (``studies/input_check_table.py``)."""
    return _copied_table(f"docs/records/input_check/{bundle}_{split}.json",
                         f"python -m studies.input_check_table --bundle {bundle} --split {split}")


TABLES: dict[str, Table] = {
    "shipped_models": Table(SHIPPED_METRICS, shipped_models_table),
    "shipped_quality": Table(SHIPPED_METRICS, shipped_quality_table),
    "quick_start": Table(("docs/records/quick_start.json",), quick_start_table),
    "shipped_quality_report": Table(SHIPPED_METRICS, shipped_quality_report),
    "shipped_comparison": Table(SHIPPED_METRICS, lambda paths: shipped_comparison_table(paths, tested_patients(paths))),
    "crossval_comparison": Table((CROSSVAL_RECORD,), out_of_fold_comparison_table),
    **{f"benchmark_{name}": _benchmark(name)
       for name in ("metrics", "losses", "inference", "training_throughput", "mirror_agreement", "ensemble")},
    **{f"input_check_{bundle}_test": _input_check(bundle, "test")
       for bundle in ("acdc_ce_dice", "acdc_crac", "acdc_nacl")},
}
# Every document with generated blocks, and the generators of its blocks.
DOCUMENTS: dict[Path, dict[str, Table]] = {
    README: {name: TABLES[name] for name in ("quick_start", "shipped_models", "shipped_quality")},
    RESULTS_PAGE: {name: TABLES[name] for name in ("shipped_quality_report", "shipped_comparison")},
    CROSSVAL_PAGE: {"crossval_comparison": TABLES["crossval_comparison"]},
    PERFORMANCE_PAGE: {name: table for name, table in TABLES.items() if name.startswith("benchmark_")},
    INPUT_CHECK_PAGE: {name: table for name, table in TABLES.items() if name.startswith("input_check_")},
}


def blocks(text: str) -> list[tuple[str, int, int]]:
    """``(name, start, end)`` of every generated block: ``text[start:end]`` is the content between
    its begin and end markers.

    Raises:
        ValueError: a marker without its partner, nested or repeated blocks (one sentence).
    """
    found, open_name, open_end, seen = [], None, 0, set()
    for match in MARKER.finditer(text):
        name, is_end = match.group("name"), match.group("end") == "end"
        if not is_end and open_name is None and name not in seen:
            open_name, open_end = name, match.end()
        elif is_end and name == open_name:
            found.append((name, open_end, match.start()))
            seen.add(name)
            open_name = None
        else:
            raise ValueError(f"Marker {match.group(0)} does not pair up (a begin without its end, nesting "
                             "or a repeated name); fix the markers by hand.")
    if open_name is not None:
        raise ValueError(f"Generated block {open_name!r} has no end marker; add <!-- generated:{open_name} end -->.")
    return found


def _sources(table: Table, root: Path) -> list[Path]:
    return sorted(path for pattern in table.sources for path in root.glob(pattern))


def regenerate(text: str, root: Path = REPO_ROOT, tables: dict[str, Table] | None = None
               ) -> tuple[str, list[str], list[str]]:
    """``text`` with every block whose records exist under ``root`` rebuilt from them.

    Returns:
        The new text, the names of the blocks rebuilt, and those left as they were (no record yet).

    Raises:
        ValueError: bad markers (see :func:`blocks`) or a block no entry of ``tables`` generates.
    """
    tables = TABLES if tables is None else tables
    pieces, position, rebuilt, skipped = [], 0, [], []
    for name, start, end in blocks(text):
        if name not in tables:
            raise ValueError(f"Generated block {name!r} has no generator; add it to DOCUMENTS in "
                             "Reporting/readme_tables.py.")
        paths = _sources(tables[name], root)
        if not paths:
            skipped.append(name)
            continue
        pieces += [text[position:start], "\n" + "\n".join(tables[name].render(paths)) + "\n"]
        position = end
        rebuilt.append(name)
    return "".join(pieces) + text[position:], rebuilt, skipped


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit status (1: ``--check`` found a difference)."""
    parser = argparse.ArgumentParser(prog="python -m Reporting.readme_tables", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a document (README.md, docs/*.md) is out of date")
    parser.add_argument("--record-quick-start", type=Path, metavar="RUN_DIR",
                        help="record this finished run as the quick-start row of --command, then regenerate")
    parser.add_argument("--command", help="the README command the run came from (with --record-quick-start)")
    parser.add_argument("--wall-s", type=float, default=None,
                        help="the command's measured wall time in seconds (default: the run's logged times)")
    arguments = parser.parse_args(argv)
    try:
        if arguments.record_quick_start:
            if not arguments.command:
                raise ValueError("--record-quick-start needs --command with the README command the run came from.")
            print(f"recorded: {record_quick_start(arguments.record_quick_start, arguments.command, arguments.wall_s)}")
        # Every document is regenerated before any is written, so bad markers in one leave all of them as they were.
        texts = {document: document.read_text() for document in DOCUMENTS}
        results = {document: regenerate(text, tables=DOCUMENTS[document]) for document, text in texts.items()}
    except (ValueError, OSError, KeyError) as error:
        raise SystemExit(f"error: {error}") from None
    status = 0
    for document, (new_text, rebuilt, skipped) in results.items():
        name = document.relative_to(REPO_ROOT)
        if skipped:
            print(f"{name}: no record yet, left as they are: {', '.join(skipped)}")
        if arguments.check:
            if new_text != texts[document]:
                print(f"{name} differs from its records; run python -m Reporting.readme_tables ({', '.join(rebuilt)}).")
                status = 1
            else:
                print(f"{name} matches its records ({', '.join(rebuilt)}).")
            continue
        if new_text != texts[document]:
            with atomic_output(document) as temporary:
                temporary.write_text(new_text)
        print(f"{name}: regenerated {', '.join(rebuilt) or 'nothing'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
