"""The input check on a split's volumes, clean, shifted and resampled, through a bundle (docs/input_check.md).

    python -m studies.input_check_table --bundle acdc_ce_dice --split test --data "$CALIBSEG_ACDC"
    python -m studies.input_check_table --bundle acdc_ce_dice --split val --data "$CALIBSEG_ACDC"
    python -m studies.input_check_table --bundle acdc_ce_dice --inputs "clean;gamma 3;k-space undersampling"
    python -m studies.input_check_table --bundle acdc_crac --record docs/records/input_check/acdc_crac_test.json

Every input is analysed as ``calibseg-predict`` analyses it (:func:`CalibSegLib.analysis.analyse_case`:
the prediction, then the input check with the network's feature distance): the split's clean volumes;
their shifted copies (:data:`Evaluation.shifts.SHIFTS`, each shift's severities drawn from its own
generator, seeded per split: ``val`` 1, ``test`` 2, so the held-out copies are other draws); the volumes
resampled in-plane to other pixel sizes (:func:`Evaluation.shifts.at_pixel_spacing`: ``val`` 0.375, 0.75,
3.0 and 4.5 mm, ``test`` 0.75 mm); and inputs that are no cine MRI at all, uniform noise and a CT-like
abdomen in Hounsfield units (:func:`ct_like_volume`). It prints one line per input (each family's
excursion, :func:`CalibSegLib.input_check.excursions`, the feature distance, the verdict, the measured
Dice), then the Markdown table docs/input_check.md shows: per kind of input how many volumes are called
unsuitable (by the network's features, by the statistics), their Dice, and how many of those below
:data:`FAILED_BELOW` are caught. Research only: it reads ACDC from ``--data`` (default ``$CALIBSEG_ACDC``).

With ``--record PATH`` every outcome is written to ``PATH`` as it is measured (JSON, atomically), with the table of
what is recorded so far, so that a run stopped part-way (an ensemble took 47-49 min on the 2-core CPU) goes on where
it stopped when started again with the same record: the inputs recorded are not analysed again. A record belongs to
one bundle file (its SHA-256) and split; docs/input_check.md copies the tables of ``docs/records/input_check/``
(:mod:`Reporting.readme_tables`).

With ``--reuse-predictions OLD`` only the network's feature distances are computed (an encoder pass per network, no
segmentation: minutes instead of an hour); each input's Dice and the four families' verdict are taken from ``OLD``, a
record of the same split made with the same weights and prediction settings (where ``OLD`` records the weights'
checksum it must be this bundle's). For a bundle whose feature judge changed and nothing else: e.g. ``acdc_ce_dice``
judged by every member, its predictions those of the table recorded through its first member.

It runs the networks rather than reading the store: its inputs are shifted and resampled copies, not the out-of-fold
or test volumes the store holds. Tables recorded before it moved here name the former ``scripts.input_check_table``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from CalibSegLib.analysis import analyse_case
from CalibSegLib.bundle import BundleMetadata, load_bundle
from CalibSegLib.device import environment
from CalibSegLib.features import feature_distance
from CalibSegLib.inference import Predictor
from CalibSegLib.input_check import FAMILIES, InputStatistics, excursions, observe_volume
from CalibSegLib.io import recorded_path, write_json_atomic
from CalibSegLib.metrics import dice
from CalibSegLib.pretrained import resolve_bundle_path
from Datasets.acdc import ACDC_SPACING
from Datasets.dataset_names import data_folder
from Datasets.layouts import find_cases
from Datasets.loading import Case, load_cases
from Datasets.splits import recorded_split, select_patients
from Evaluation.shifts import SHIFTS, at_pixel_spacing

__all__ = ["FAILED_BELOW", "Input", "Outcome", "bundle_digest", "analyse_input", "ct_like_volume", "noise_volume",
           "input_kinds", "inputs", "table", "read_record", "feature_judge", "reused_outcomes", "features_only",
           "make_record", "main"]

SEEDS = {"val": 1, "test": 2}
PIXELS_MM = {"val": (0.375, 0.75, 3.0, 4.5), "test": (0.75,)}
OTHER_INPUTS = 3  # noise volumes and CT-like volumes per split
FAILED_BELOW = 0.7  # mean foreground Dice under which a shifted volume is a failure the check must catch
CLEAN, NO_HEART = "clean", ("uniform noise", "CT-like abdomen (HU)")


def ct_like_volume(rng: np.random.Generator) -> tuple[np.ndarray, tuple[float, float, float]]:
    """An axial CT-like abdomen in Hounsfield units, ``(z, y, x)`` int16, and its spacing (mm).

    Air −1000 outside an elliptic body of muscle/organs (40 HU, σ 15) under a subcutaneous fat ring
    (−100 HU), a liver (60 HU), two kidneys (30 HU), a vertebral body (700 HU cortex around 250 HU), the
    scanner's −1024 outside the reconstruction circle; size, slice count and spacing drawn from ``rng``.
    """
    size = int(rng.integers(384, 513))
    slices = int(rng.integers(8, 40))
    pixel = float(rng.uniform(0.6, 0.9))
    spacing = (float(rng.choice([2.5, 3.0, 5.0])), pixel, pixel)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    cy, cx = size / 2 + rng.normal(0, 5), size / 2 + rng.normal(0, 5)
    body_a, body_b = size * rng.uniform(0.30, 0.38), size * rng.uniform(0.40, 0.46)

    def ellipse(y0: float, x0: float, a: float, b: float) -> np.ndarray:
        return ((y - y0) / a) ** 2 + ((x - x0) / b) ** 2 <= 1

    plane = np.full((size, size), -1000.0, dtype=np.float32)
    plane[ellipse(cy, cx, body_a, body_b)] = -100.0
    plane[ellipse(cy, cx, body_a - 12, body_b - 12)] = 40.0
    plane[ellipse(cy - body_a * 0.2, cx - body_b * 0.35, body_a * 0.45, body_b * 0.4)] = 60.0
    for side in (-1, 1):
        plane[ellipse(cy + body_a * 0.35, cx + side * body_b * 0.35, body_a * 0.18, body_b * 0.1)] = 30.0
    spine = ellipse(cy + body_a * 0.55, cx, body_a * 0.16, body_b * 0.12)
    plane[spine] = 700.0
    plane[ellipse(cy + body_a * 0.55, cx, body_a * 0.12, body_b * 0.09)] = 250.0
    plane[~ellipse(size / 2, size / 2, size / 2, size / 2)] = -1024.0
    volume = np.repeat(plane[None], slices, axis=0) + rng.normal(0.0, 15.0, (slices, size, size))
    return np.clip(np.rint(volume), -1024, 3071).astype(np.int16), spacing


def noise_volume(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    """Uniform noise of ``shape`` in [0, scale) with a random scale (an image of nothing)."""
    return (rng.random(tuple(shape)) * float(rng.uniform(1.0, 4000.0))).astype(np.float32)


@dataclass
class Input:
    """One input of the table: its kind and name, the image and its spacing, the reference (None: none)."""

    kind: str
    name: str
    image: np.ndarray
    spacing: Sequence[float]
    label: np.ndarray | None


def _resampled(pixel: float) -> str:
    """The kind of the copies resampled in-plane to ``pixel`` mm."""
    return f"resampled to {pixel:g} mm"


def input_kinds(split: str) -> list[str]:
    """The kinds of input the table has for ``split``, in its order."""
    return [CLEAN, *SHIFTS, *map(_resampled, PIXELS_MM[split]), *NO_HEART]


def inputs(cases: Sequence[Case], split: str, kinds: Sequence[str] | None = None) -> Iterator[Input]:
    """Every input the table analyses, in order: clean, shifted, resampled, then the non-cardiac ones; with
    ``kinds``, only those (each shift's draws are the same as in the whole table)."""
    def wanted(kind: str) -> bool:
        return kinds is None or kind in kinds

    for case in cases if wanted(CLEAN) else ():
        yield Input(CLEAN, case.case_id, case.image, case.spacing, case.label)
    for index, (kind, shift) in enumerate(SHIFTS.items()):
        rng = np.random.default_rng([SEEDS[split], index])  # one generator per shift: its draws stand alone
        for case in cases if wanted(kind) else ():
            image = shift(case.image.astype(np.float32), rng)
            yield Input(kind, case.case_id, image, case.spacing, case.label)
    for pixel in PIXELS_MM[split]:
        for case in cases if wanted(_resampled(pixel)) else ():
            image, spacing = at_pixel_spacing(case.image, case.spacing, pixel)
            yield Input(_resampled(pixel), case.case_id, image, spacing,
                        at_pixel_spacing(case.label, case.spacing, pixel, labels=True)[0])
    if not any(wanted(kind) for kind in NO_HEART):
        return
    rng = np.random.default_rng(SEEDS[split])
    # Drawn even when only the CT-like volumes are wanted: they come after the noise from the same generator.
    noise = [noise_volume(rng, cases[index].image.shape) for index in range(OTHER_INPUTS)]
    for index, image in enumerate(noise if wanted(NO_HEART[0]) else ()):
        yield Input(NO_HEART[0], f"noise{index}", image, ACDC_SPACING, None)
    for index in range(OTHER_INPUTS if wanted(NO_HEART[1]) else 0):
        image, spacing = ct_like_volume(rng)
        yield Input(NO_HEART[1], f"ct{index}", image, spacing, None)


@dataclass
class Outcome:
    """What the check said about one input and how the model did on it."""

    kind: str
    name: str
    suitable: bool
    by_features: bool
    by_statistics: bool
    distance: float  # the network's feature distance; NaN where the bundle has no feature statistics
    dice: float  # mean over the foreground structures; NaN without a reference
    # An ensemble judged by every member: each member's distance (``distance`` is the one deciding the majority).
    member_distances: list[float] | None = None


def _cell(outcomes: Sequence[Outcome]) -> list[str]:
    """A table row's cells for the outcomes of one kind of input."""
    unsuitable = [not outcome.suitable for outcome in outcomes]
    dice_values = np.array([outcome.dice for outcome in outcomes])
    failed = dice_values < FAILED_BELOW
    has_dice = not np.isnan(dice_values).all()
    caught = sum(called for called, low in zip(unsuitable, failed) if low)
    return [str(len(outcomes)), f"**{sum(unsuitable)}**", str(sum(o.by_features for o in outcomes)),
            str(sum(o.by_statistics for o in outcomes)),
            f"{np.nanmean(dice_values):.3f} ({np.nanmin(dice_values):.3f})" if has_dice else "no heart",
            f"{int(failed.sum())}: {caught} unsuitable" if has_dice else "–"]


def table(outcomes: Sequence[Outcome], kinds: Sequence[str] | None = None) -> list[str]:
    """The Markdown table of docs/input_check.md and its summary lines, one row per kind of input in the order
    of ``kinds`` (default: as they come); kinds of ``kinds`` without outcomes are named as not measured yet."""
    measured = list(dict.fromkeys(outcome.kind for outcome in outcomes))
    order = [kind for kind in kinds if kind in measured] if kinds is not None else measured
    lines = [("| input | volumes | called unsuitable | by the features | by the statistics | "
              f"mean Dice (lowest) | Dice < {FAILED_BELOW}: of them unsuitable |"),
             "|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join([kind, *_cell([o for o in outcomes if o.kind == kind])]) + " |"
              for kind in order]
    clean = [outcome for outcome in outcomes if outcome.kind == CLEAN]
    shifted = [outcome for outcome in outcomes if outcome.kind in SHIFTS and outcome.dice < FAILED_BELOW]
    lines += ["", (f"Clean volumes called unsuitable: {sum(not o.suitable for o in clean)} of {len(clean)}; "
                   f"shifted volumes with Dice < {FAILED_BELOW} called unsuitable: "
                   f"{sum(not o.suitable for o in shifted)} of {len(shifted)}.")]
    missing = [kind for kind in kinds or () if kind not in measured]
    if missing:
        lines += ["", "Not measured yet: " + "; ".join(missing) + "."]
    return lines


def bundle_digest(path: Path) -> str:
    """The SHA-256 of the whole bundle file: a record belongs to these weights and these thresholds (a refit changes
    only ``bundle.json``), not to a name."""
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def read_record(path: Path | None, bundle_sha256: str, split: str) -> tuple[list[Outcome], float]:
    """The outcomes already recorded in ``path`` and the seconds they took (none, 0 when it is None or absent).

    Raises:
        SystemExit: the record is of another bundle file or split (one sentence).
    """
    if path is None or not path.exists():
        return [], 0.0
    record = json.loads(path.read_text())
    if record.get("bundle_sha256") != bundle_sha256 or record.get("split") != split:
        raise SystemExit(f"error: {path} records the {record.get('split')} split of {record.get('bundle')} as another "
                         f"bundle file or split than this {split} run's; give another --record, or remove it to "
                         "measure again.")
    return [Outcome(**entry) for entry in record["outcomes"]], float(record["seconds"])


def feature_judge(statistics: InputStatistics) -> tuple[float, str]:
    """The feature threshold a bundle's statistics compare with (NaN: none) and who judges: ``"the network"``, or
    for an ensemble judged by every member ``"every member, the majority deciding"``."""
    if statistics.member_features is not None:
        judge = statistics.member_features
        return judge.threshold, f"every member, the {judge.combination} deciding"
    return (float("nan") if statistics.features is None else statistics.features.threshold), "the network"


def reused_outcomes(path: Path, metadata: BundleMetadata, split: str) -> dict[tuple[str, str], Outcome]:
    """The outcomes of an earlier record whose predictions this run takes (``--reuse-predictions``), by input.

    Raises:
        SystemExit: the record is of another split, or of other weights (one sentence).
    """
    record = json.loads(path.read_text())
    weights = record.get("weights_sha256")
    if record.get("split") != split or (weights is not None and weights != metadata.weights_sha256):
        raise SystemExit(f"error: {path} records the {record.get('split')} split of other weights than this {split} "
                         "run's bundle, so its predictions are not this bundle's; measure without "
                         "--reuse-predictions.")
    return {(entry["kind"], entry["name"]): Outcome(**entry) for entry in record["outcomes"]}


def features_only(predictor: Predictor, statistics: InputStatistics, item: "Input", reused: Outcome) -> Outcome:
    """``reused`` (an earlier record's outcome of the same input, the same weights) judged again by the bundle's
    feature statistics: only the network's feature distances are computed."""
    distance = feature_distance(predictor.model, predictor.metadata, item.image, item.spacing, predictor.batch_size)
    if statistics.member_features is not None:
        judge = statistics.member_features
        by_features, deciding, members = judge.unlike(distance), judge.deciding_distance(distance), distance
    else:
        by_features, deciding, members = distance > statistics.features.threshold, distance, None
    return Outcome(item.kind, item.name, not (by_features or reused.by_statistics), by_features,
                   reused.by_statistics, deciding, reused.dice, members)


def make_record(bundle: str, bundle_sha256: str, split: str, outcomes: Sequence[Outcome], feature_threshold: float,
                family_thresholds: dict[str, float], seconds: float, device: str = "cpu",
                judged_by: str = "the network", weights_sha256: str | None = None,
                reused: str | None = None) -> dict:
    """The JSON record of a table: what was measured, on what, and the table docs/input_check.md copies;
    ``judged_by``: whose feature distances (:func:`feature_judge`); ``reused``: the record whose predictions (Dice,
    the four families' verdict) were taken (``--reuse-predictions``)."""
    machine, recorded = environment(device), datetime.date.today().isoformat()
    judge = "" if judged_by == "the network" else f" ({judged_by})"
    if reused is not None:
        judge += f"; Dice and the statistics' verdicts from {reused}, the same weights"
    caption = (f"`python -m studies.input_check_table --bundle {bundle} --split {split} --record ...`: "
               f"{len(outcomes)} inputs, feature threshold {feature_threshold:.1f}{judge}, {seconds / 60:.0f} min on "
               f"{'' if machine['device'] == 'cpu' else machine['device'] + ' and '}{machine['cpu_count']} CPU "
               f"cores, recorded {recorded}.")
    return {"bundle": bundle, "bundle_sha256": bundle_sha256, "split": split,
            "recorded": recorded, "environment": machine, "seconds": seconds,
            "weights_sha256": weights_sha256, "reused_predictions": reused,
            "feature_threshold": feature_threshold, "feature_judge": judged_by, "family_thresholds": family_thresholds,
            "outcomes": [asdict(outcome) for outcome in outcomes],
            "table": [*table(outcomes, input_kinds(split)), "", caption]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.input_check_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="acdc_ce_dice")
    parser.add_argument("--split", choices=tuple(SEEDS), default="test")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--inputs", default=None, metavar="KIND;KIND...",
                        help="only these kinds of input, separated by ';' (default: all; the kinds are the "
                             "table's first column), e.g. on a slow machine or one without SimpleITK")
    parser.add_argument("--record", type=Path, default=None,
                        help="write every outcome here as it is measured (JSON); started again with the same "
                             "record, the run skips what it holds")
    parser.add_argument("--reuse-predictions", type=Path, default=None, metavar="OLD",
                        help="take each input's Dice and the statistics' verdict from this record of the same weights "
                             "and compute only the feature distances")
    arguments = parser.parse_args(argv)
    kinds = None if arguments.inputs is None else [kind.strip() for kind in arguments.inputs.split(";")]
    known = input_kinds(arguments.split)
    unknown = [kind for kind in kinds or () if kind not in known]
    if unknown:
        raise SystemExit(f"error: no input kind {unknown[0]!r} for the {arguments.split} split; the kinds are: "
                         + "; ".join(known) + ".")
    started = time.monotonic()
    bundle_path = resolve_bundle_path(arguments.bundle)
    bundle_sha256 = bundle_digest(bundle_path)
    outcomes, seconds_before = read_record(arguments.record, bundle_sha256, arguments.split)
    recorded = {(outcome.kind, outcome.name) for outcome in outcomes}
    bundle = load_bundle(bundle_path)
    metadata = bundle.metadata
    statistics = InputStatistics.from_dict(metadata.input_statistics, metadata.class_names,
                                           metadata.in_channels)
    feature_threshold, judged_by = feature_judge(statistics)
    files = find_cases(data_folder(metadata.data, arguments.data))
    patients = recorded_split(metadata.data)[arguments.split]
    cases = load_cases(select_patients(files, patients), metadata.num_classes)
    predictor = Predictor(bundle, device=arguments.device)
    reused = (None if arguments.reuse_predictions is None
              else reused_outcomes(arguments.reuse_predictions, metadata, arguments.split))
    reused_name = None if reused is None else recorded_path(arguments.reuse_predictions)
    print("kind | input | " + " | ".join(FAMILIES) + " | feature distance | suitable | Dice")
    for item in inputs(cases, arguments.split, kinds):
        if (item.kind, item.name) in recorded:
            continue
        if reused is not None:
            outcome = features_only(predictor, statistics, item, reused[(item.kind, item.name)])
            outcomes.append(outcome)
            print(f"{item.kind} | {item.name} | (reused) | {outcome.distance:.1f} | {outcome.suitable} | "
                  f"{outcome.dice:.3f}", flush=True)
        else:
            analyse_input(predictor, statistics, item, outcomes)
        if arguments.record is not None:
            write_json_atomic(arguments.record, make_record(
                bundle_path.stem, bundle_sha256, arguments.split, outcomes, feature_threshold,
                statistics.thresholds, seconds_before + time.monotonic() - started, arguments.device, judged_by,
                metadata.weights_sha256, reused_name))
    print(f"\nfeature threshold {feature_threshold:.1f}; family thresholds {statistics.thresholds}; "
          f"{seconds_before + time.monotonic() - started:.0f} s\n")
    print("\n".join(table(outcomes, known)))
    return 0


def analyse_input(predictor: Predictor, statistics: InputStatistics, item: Input, outcomes: list[Outcome]) -> None:
    """One input analysed as calibseg-predict does; its outcome appended and its line printed."""
    metadata = predictor.metadata
    analysis = analyse_case(predictor, item.image, item.spacing)
    check = analysis.summary["input_check"]
    labels = analysis.prediction.labels
    distance = check["features"].get("distance", float("nan"))
    by_features = distance > check["features"].get("threshold", float("inf"))
    values = excursions(statistics, observe_volume(item.image, item.spacing, labels, metadata.class_names,
                                                   metadata.preprocessing))
    score = (float("nan") if item.label is None else
             float(np.mean(dice(labels, item.label.astype(np.int64), metadata.num_classes))))
    outcomes.append(Outcome(item.kind, item.name, check["suitable"], by_features,
                            len(check["reasons"]) > int(by_features), distance, score,
                            check["features"].get("member_distances")))
    print(f"{item.kind} | {item.name} | " + " | ".join(f"{values[family]:.3f}" for family in FAMILIES)
          + f" | {distance:.1f} | {check['suitable']} | {score:.3f}", flush=True)


if __name__ == "__main__":
    main()
