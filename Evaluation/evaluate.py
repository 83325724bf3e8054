"""3D evaluation of a model bundle on the test patients of a split.

    calibseg-evaluate --bundle runs/ce_dice/model.calibseg [--data SampleData/ACDC] [--split test] [--out DIR]
    calibseg-evaluate --bundle acdc_ce_dice --data /path/to/acdc   # a shipped model (or set CALIBSEG_ACDC)

The data are found from what the bundle records (:func:`Datasets.dataset_names.data_folder`: ``--data``,
the shipped sample, ``$CALIBSEG_ACDC`` for full ACDC), the patients from its recorded split or
``--split-file``. Patients the bundle was trained or validated on are refused (one sentence
naming them) unless ``--force``: numbers on them would overstate the model.

Every volume goes through :func:`CalibSegLib.analysis.analyse_variants` whole, as a user's would;
calibration is streamed batch by batch from its ``probability_sink`` (the probability volume
is never kept), on the reference foreground as in the papers. Writes into ``--out`` (default:
``evaluation/`` beside the bundle; for a shipped model ``runs/<name>/evaluation`` under the
current folder, never inside the installed package), each file atomically:

- ``per_case.csv``: one row per case and temperature variant: Dice/HD95/ASD per class (mm),
  ECE, MCE, CECE, TACE, Brier, NLL, error-detection AUROC and AURC of the per-voxel
  confidence, mean normalised entropy in the predicted foreground; after each class's measured
  Dice its predicted Dice, interval and review flag (:mod:`CalibSegLib.quality`; NaN for the
  ``uncalibrated`` variant, which the quality model was not fitted for); ``input_suitable``: 1 or 0 as
  :func:`CalibSegLib.input_check.check_input` calls the volume (NaN for a bundle without input statistics) and
  ``feature_distance`` its distance in the network's feature space (NaN without feature statistics);
- ``summary.json``: the case and patient ids; per variant, mean/std/count/undefined count of
  every column (``ece`` there is the mean of the per-volume ECEs), pooled calibration (all
  volumes' voxels together) and its reliability bins, and the Spearman correlation between
  per-case mean foreground entropy and Dice (does uncertainty flag bad cases?); the machine
  (CPU/GPU, torch version) and the evaluation's wall time; ``quality``: how well the bundle's
  quality model predicts Dice and flags poor structures, on the test volumes and, with ``--degraded``, on
  deliberately degraded copies of them (:mod:`Evaluation.quality_report`; null without a model);
- ``reliability.png`` (bundle temperature) and ``reliability_uncalibrated.png`` (T = 1), pooled
  over all volumes, with the pooled ECE in the title;
- with ``--report``, ``report.html`` (:mod:`CalibSegLib.report`): the page ``calibseg-predict --report``
  writes, over the test volumes at the bundle's temperature, worst first, with each volume's measured Dice and
  HD95 beside the predicted ones, and the test set's means and pooled reliability diagram at the top.

Variants: ``scaled`` uses the bundle's fitted temperature, ``uncalibrated`` T = 1 (after and
before temperature scaling).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.stats import spearmanr

from CalibSegLib.bundle import Bundle, BundleError, load_bundle
from CalibSegLib.device import environment
from CalibSegLib.analysis import analyse_variants
from CalibSegLib.inference import Predictor
from CalibSegLib.io import atomic_output, check_output_folder, os_error_sentence
from CalibSegLib.metrics import summarize
from CalibSegLib.metrics.calibration import CalibrationStatistics
from CalibSegLib.metrics.plots import reliability_figure, save_figure
from CalibSegLib.pretrained import bundle_label, resolve_bundle_path, shipped_name
from CalibSegLib.report import REPORT_NAME, ReportCase, report_case, write_report
from CalibSegLib.temperature import temperature_text
from Datasets.dataset_names import data_folder
from Datasets.errors import DataError
from Datasets.layouts import DATASETS, find_cases
from Datasets.loading import Case, load_cases
from Datasets.splits import recorded_split, select_patients
from Evaluation.quality_report import ALL_STRUCTURES, DEGRADATIONS, quality_report
from Evaluation.summary import CASES_NAME, EVALUATION_DIR, SUMMARY_NAME, EvaluationSummary, VariantSummary

__all__ = ["EvaluationResult", "variant_bundles", "evaluate_bundle", "summary_lines", "print_summary",
           "seen_patients", "main"]

RELIABILITY_NAMES = {"scaled": "reliability.png", "uncalibrated": "reliability_uncalibrated.png"}


def variant_bundles(bundle: Bundle) -> dict[str, Bundle]:
    """The bundle as trained (its fitted temperature) and the same weights at T = 1.

    The T = 1 variant carries no quality model: that was fitted on the bundle's own temperature.
    """
    uncalibrated = dataclasses.replace(
        bundle, metadata=dataclasses.replace(bundle.metadata, temperature=1.0, quality_model=None))
    return {"scaled": bundle, "uncalibrated": uncalibrated}


def _spearman(entropy: Sequence[float], dice_mean: Sequence[float]) -> float:
    """Spearman's ρ between per-case mean foreground entropy and Dice (NaN with fewer than 3 defined cases)."""
    defined = [(e, d) for e, d in zip(entropy, dice_mean) if not (math.isnan(e) or math.isnan(d))]
    if len(defined) < 3 or len({e for e, _ in defined}) < 2 or len({d for _, d in defined}) < 2:
        return float("nan")
    return float(spearmanr(*zip(*defined)).statistic)


def _evaluate_variants(bundle: Bundle, cases: Sequence[Case], device: str, batch_size: int,
                       report_cases: list[ReportCase] | None = None
                       ) -> dict[str, tuple[list[dict], CalibrationStatistics]]:
    """Per variant: per-case metric rows and pooled calibration statistics, from one network pass per case;
    ``report_cases`` gets each case at the bundle's temperature for the report page."""
    variants = variant_bundles(bundle)
    predictor = Predictor(bundle, device=device, batch_size=batch_size)
    results = {variant: ([], CalibrationStatistics(bundle.metadata.num_classes)) for variant in variants}
    for case in cases:
        analyses = analyse_variants(predictor, case.image, case.spacing, case.label.astype(np.int64),
                                    [variant_bundle.metadata for variant_bundle in variants.values()])
        if report_cases is not None:
            report_cases.append(report_case(case.case_id, case.image, case.spacing, analyses[0],
                                            bundle.metadata))
        for variant, analysis in zip(variants, analyses):
            rows, pooled = results[variant]
            pooled.merge(analysis.evaluation.statistics)
            check = analysis.summary["input_check"]
            suitable = math.nan if check["suitable"] is None else float(check["suitable"])
            rows.append({"case": case.case_id, **analysis.metrics, "input_suitable": suitable,
                         "feature_distance": check.get("features", {}).get("distance", math.nan)})
    return results


@dataclass
class EvaluationResult:
    """What :func:`evaluate_bundle` wrote: ``summary`` is ``summary.json``, ``per_case`` the rows of
    ``per_case.csv`` per variant (``{variant: [{"case": id, column: value, ...}]}``)."""

    summary: EvaluationSummary
    per_case: dict[str, list[dict]]


def evaluate_bundle(
    bundle: Bundle, cases: Sequence[Case], out_dir: str | Path, device: str = "auto", batch_size: int = 16,
    degradations: Sequence[str] = (), report: bool = False,
) -> EvaluationResult:
    """Evaluate ``bundle`` on ``cases`` (3D) and write CSV, JSON and PNGs into ``out_dir``; returns what it wrote.

    ``degradations`` (names of :data:`Evaluation.quality_report.DEGRADATIONS`, none by default) are degraded
    copies of ``cases`` the quality report is also measured on; each costs one more prediction per case.
    ``report``: also write the page :data:`~CalibSegLib.report.REPORT_NAME` over the cases.

    Raises:
        DataError: no cases were given.
    """
    if not cases:
        raise DataError("No cases to evaluate; the split side is empty.")
    out_dir = Path(out_dir)
    started = time.perf_counter()
    summary = EvaluationSummary(cases=[case.case_id for case in cases], variants={},
                                patients=sorted({case.patient_id for case in cases}), bundle=str(bundle.path or ""),
                                temperature=bundle.metadata.temperature, environment=environment(device),
                                case_patients={case.case_id: case.patient_id for case in cases})
    per_case = {}
    report_cases: list[ReportCase] | None = [] if report else None
    for variant, (variant_rows, pooled) in _evaluate_variants(bundle, cases, device, batch_size,
                                                              report_cases).items():
        per_case[variant] = variant_rows
        if variant == "scaled":
            summary.quality = quality_report(bundle, variant_rows, cases, degradations, device, batch_size)
        columns = [key for key in variant_rows[0] if key != "case"]
        summary.variants[variant] = VariantSummary(
            per_metric={column: summarize([row[column] for row in variant_rows]) for column in columns},
            pooled_calibration=pooled.metrics(),
            reliability=pooled.reliability(),
            spearman_entropy_vs_dice=_spearman([row["mean_foreground_entropy"] for row in variant_rows],
                                               [row["dice_mean"] for row in variant_rows]),
        )
        title = temperature_text(bundle.metadata.temperature) if variant == "scaled" else "T = 1"
        figure = reliability_figure(pooled.reliability(), title=f"Reliability, {title}, {len(cases)} volumes pooled",
                                    ece=pooled.ece())
        save_figure(figure, out_dir / RELIABILITY_NAMES[variant])
    rows = [{"variant": variant, **row} for variant, variant_rows in per_case.items() for row in variant_rows]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["case", "variant"]
                            + [key for key in rows[0] if key not in ("case", "variant")])
    writer.writeheader()
    writer.writerows(rows)
    with atomic_output(out_dir / CASES_NAME) as temporary:
        temporary.write_text(buffer.getvalue())
    summary.wall_s = time.perf_counter() - started
    summary.write(out_dir / SUMMARY_NAME)
    if report_cases is not None:
        write_report(out_dir / REPORT_NAME, report_cases, bundle.metadata, bundle_label(bundle.path),
                     "calibseg-evaluate",
                     reliability_png=(out_dir / RELIABILITY_NAMES["scaled"]).read_bytes(),
                     test_set_lines=summary_lines(summary))
    return EvaluationResult(summary, per_case)


def summary_lines(summary: EvaluationSummary, split: str = "test") -> list[str]:
    """What :func:`print_summary` says about the numbers: Dice/HD95, calibration before and after temperature
    scaling and the quality model's pooled accuracy, each labelled mean over the volumes or pooled."""
    scaled, raw = summary.variants["scaled"], summary.variants["uncalibrated"]
    of_patients = f" of {len(summary.patients)} patients" if summary.patients else ""
    lines = [f"{split}, {len(summary.cases)} volumes{of_patients} (means over the volumes): Dice "
             f"{scaled.value('dice_mean'):.3f}  HD95 {scaled.value('hd95_mean'):.2f} mm  "
             f"ASD {scaled.value('asd_mean'):.2f} mm"]
    fitted = f"T = {temperature_text(summary.temperature, labelled=False)}"
    for label, metrics in (("T = 1   ", raw), (fitted, scaled)):
        pooled = metrics.pooled_calibration["ece"]
        lines.append(f"  {label}  ECE {metrics.value('ece'):.3f} (pooled {pooled:.3f})  CECE "
                     f"{metrics.value('cece'):.3f}  TACE {metrics.value('tace'):.3f}  Brier "
                     f"{metrics.value('brier'):.3f}  NLL {metrics.value('nll'):.3f}")
    if summary.quality:
        for label, report in ((split, summary.quality["clean"]), *summary.quality["degraded"].items()):
            pooled = report[ALL_STRUCTURES]
            lines.append(f"  predicted Dice, {label}: ρ {pooled['spearman']:.2f}  MAE {pooled['mae']:.3f}  "
                         f"review flag AUROC {pooled['review_auroc']:.2f} ({pooled['flagged_poor']} of "
                         f"{pooled['poor']} poor flagged, {pooled['flagged']} flagged in all)")
    undefined = int(scaled.value("hd95_mean", "undefined"))
    if undefined:
        lines.append(f"  HD95 undefined in {undefined} volume(s) (a class in only one of prediction and "
                     "reference)")
    return lines


def print_summary(summary: EvaluationSummary, out_dir: Path, split: str = "test",
                  report: bool = False) -> None:
    """A few lines: :func:`summary_lines` and where the files are (``report``: the report page too).

    ``split`` names the volumes evaluated (``--split``). Every number is the mean over them, except the
    one labelled pooled (all volumes' voxels together, as in the reliability diagram's title).
    """
    for line in summary_lines(summary, split):
        print(line)
    print(f"metrics: {out_dir / SUMMARY_NAME} (per case: {out_dir / CASES_NAME})")
    print(f"reliability diagram: {out_dir / RELIABILITY_NAMES['scaled']} "
          f"(T = 1: {out_dir / RELIABILITY_NAMES['uncalibrated']})")
    if report:
        print(f"report: {out_dir / REPORT_NAME}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calibseg-evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, help="bundle (.calibseg) or a shipped model's name")
    parser.add_argument("--data", type=Path, default=None,
                        help="data folder (default: found from the dataset the bundle records: the shipped sample, "
                             "or $CALIBSEG_ACDC for full ACDC)")
    parser.add_argument("--dataset", default="auto", choices=DATASETS, help="data layout (default: detected)")
    parser.add_argument("--split-file", type=Path, default=None,
                        help="split JSON (default: the bundle's recorded split)")
    parser.add_argument("--split", default="test", choices=("train", "val", "test"))
    parser.add_argument("--force", action="store_true",
                        help="evaluate even on patients the bundle was trained or validated on")
    parser.add_argument("--out", type=Path, default=None, help=f"default: {EVALUATION_DIR}/ beside the bundle "
                        f"(runs/<name>/{EVALUATION_DIR} for a shipped model)")
    parser.add_argument("--degraded", action="store_true",
                        help="also measure the quality check on degraded copies of the volumes (contrast inversion, "
                             f"gamma 3, noise): {len(DEGRADATIONS)} more predictions per volume")
    parser.add_argument("--report", action="store_true",
                        help=f"also write {REPORT_NAME}: one page over the volumes, worst first, with "
                             "pictures of their worst slices, and the reliability diagram")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=16)
    return parser


def seen_patients(data: dict) -> set[str]:
    """The patients a bundle's ``data`` section records as trained or validated on."""
    return {patient for side in ("train", "val") for patient in data.get(side) or []}


def _check_unseen(patients: Sequence[str], data: dict) -> None:
    """Raise :class:`DataError` naming the ``patients`` the bundle was trained or validated on."""
    seen = sorted(set(patients) & seen_patients(data))
    if seen:
        raise DataError(f"The bundle was trained or validated on {', '.join(seen)}, so its numbers there would "
                        "overstate it; evaluate other patients (its recorded test split by default) or pass --force.")


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibseg-evaluate`` command: prints where the summary went; returns the exit status 0. Bad input
    exits with one sentence, no traceback."""
    arguments = _parser().parse_args(argv)
    try:
        bundle_path = resolve_bundle_path(arguments.bundle)
        # A shipped model's folder is the installed library: its evaluation goes under runs/ instead.
        shipped = shipped_name(bundle_path)
        default_out = (Path("runs") / shipped if shipped else bundle_path.parent) / EVALUATION_DIR
        # The output folder first: a bad --out must not cost the evaluation (seconds to minutes).
        out = check_output_folder(arguments.out or default_out)
        bundle = load_bundle(bundle_path)
        recorded = bundle.metadata.data
        patients = recorded_split(recorded, arguments.split_file)[arguments.split]
        if not arguments.force:
            _check_unseen(patients, recorded)
        files = select_patients(find_cases(data_folder(recorded, arguments.data), arguments.dataset), patients)
        cases = load_cases(files, bundle.metadata.num_classes)
        result = evaluate_bundle(bundle, cases, out, arguments.device, arguments.batch_size,
                                 degradations=tuple(DEGRADATIONS) if arguments.degraded else (),
                                 report=arguments.report)
    except (BundleError, DataError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    except OSError as error:
        raise SystemExit(f"error: {os_error_sentence(error)}") from None
    except KeyboardInterrupt:  # each file is written atomically: none is half-written
        raise SystemExit("interrupted: the evaluation did not finish; run calibseg-evaluate again for a complete "
                         "one.") from None
    print_summary(result.summary, out, arguments.split, arguments.report)
    return 0


if __name__ == "__main__":
    main()
