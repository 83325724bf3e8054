"""Does the input check's verdict depend on how the user resampled the scan? The test split's shifted copies judged
again after resampling them in-plane to another pixel size, against their verdicts at the native spacing.

    python -m studies.input_check_spacing --bundle acdc_ce_dice --pixel 0.75 --data "$CALIBSEG_ACDC" \
        --native docs/records/input_check/acdc_ce_dice_test.json \
        --record docs/records/input_check/acdc_ce_dice_test_shifts_at_0.75mm.json

Each shift of :data:`Evaluation.shifts.SHIFTS` is drawn exactly as the input-check table draws it for the test split
(:func:`studies.input_check_table.inputs`, the same generators), then resampled in-plane to ``--pixel`` mm
(:func:`Evaluation.shifts.at_pixel_spacing`, its reference nearest-neighbour), and analysed as ``calibseg-predict``
analyses a file. The native verdicts are read from ``--native``, the input-check table's record of the same bundle
file (its SHA-256 is checked), so only the resampled copies run through the networks. A scan and its resampled copy
should get the same verdict (issue 70, item 5); the table says per shift how often they do. ``--record`` is written
after every copy, and a run started again with it goes on where it stopped.
"""

from __future__ import annotations

import argparse
import datetime
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from CalibSegLib.bundle import load_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.input_check import InputStatistics
from CalibSegLib.io import write_json_atomic
from CalibSegLib.pretrained import resolve_bundle_path
from Datasets.dataset_names import data_folder
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Datasets.splits import recorded_split, select_patients
from Evaluation.shifts import SHIFTS, at_pixel_spacing
from studies.input_check_table import Input, Outcome, analyse_input, bundle_digest, inputs

__all__ = ["SPLIT", "resampled_shifts", "agreement", "main"]

SPLIT = "test"  # the native verdicts come from the test split's table


def resampled_shifts(cases: Sequence[Any], pixel_mm: float):
    """Every shifted copy of the test split's table, resampled in-plane to ``pixel_mm`` (its kind and name as in
    the table, so it pairs with its native outcome)."""
    for item in inputs(cases, SPLIT, list(SHIFTS)):
        image, spacing = at_pixel_spacing(item.image, item.spacing, pixel_mm)
        yield Input(item.kind, item.name, image, spacing,
                    at_pixel_spacing(item.label, item.spacing, pixel_mm, labels=True)[0])


def agreement(native: dict[tuple[str, str], Outcome], resampled: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Per shift (and all together): copies, called unsuitable at the native spacing and resampled, and how many
    get the same verdict both times."""
    rows = []
    for kind in [*SHIFTS, "all shifts"]:
        pairs = [(native[(outcome.kind, outcome.name)], outcome) for outcome in resampled
                 if kind in (outcome.kind, "all shifts")]
        if pairs:
            rows.append({"shift": kind, "copies": len(pairs),
                         "unsuitable_native": sum(not first.suitable for first, _ in pairs),
                         "unsuitable_resampled": sum(not second.suitable for _, second in pairs),
                         "same_verdict": sum(first.suitable == second.suitable for first, second in pairs)})
    return rows


def _table(rows: Sequence[dict[str, Any]], pixel_mm: float) -> list[str]:
    return ["| shift | copies | unsuitable at the native spacing | unsuitable at "
            f"{pixel_mm:g} mm | same verdict |", "| --- | --- | --- | --- | --- |",
            *[f"| {row['shift']} | {row['copies']} | {row['unsuitable_native']} | {row['unsuitable_resampled']} | "
              f"{row['same_verdict']} |" for row in rows]]


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the table; writes the record with ``--record``. Returns 0; bad input exits with one sentence."""
    parser = argparse.ArgumentParser(prog="python -m studies.input_check_spacing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="acdc_ce_dice")
    parser.add_argument("--pixel", type=float, default=0.75, help="the in-plane pixel size (mm) to resample to")
    parser.add_argument("--native", type=Path, required=True,
                        help="the input-check table's record of the test split for this bundle file")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--record", type=Path, default=None)
    arguments = parser.parse_args(argv)
    bundle_path = resolve_bundle_path(arguments.bundle)
    digest = bundle_digest(bundle_path)
    native_record = json.loads(arguments.native.read_text())
    if native_record.get("bundle_sha256") != digest or native_record.get("split") != SPLIT:
        raise SystemExit(f"error: {arguments.native} is no {SPLIT}-split record of this bundle file; give the "
                         f"input-check table's record of {arguments.bundle}.")
    native = {(entry["kind"], entry["name"]): Outcome(**entry) for entry in native_record["outcomes"]}
    done: list[Outcome] = []
    if arguments.record is not None and arguments.record.exists():
        done = [Outcome(**entry) for entry in json.loads(arguments.record.read_text())["outcomes"]]
    recorded = {(outcome.kind, outcome.name) for outcome in done}
    bundle = load_bundle(bundle_path)
    metadata = bundle.metadata
    statistics = InputStatistics.from_dict(metadata.input_statistics, metadata.class_names, metadata.in_channels)
    files = find_cases(data_folder(metadata.data, arguments.data))
    cases = load_cases(select_patients(files, recorded_split(metadata.data)[SPLIT]), metadata.num_classes)
    predictor = Predictor(bundle, device=arguments.device)
    for item in resampled_shifts(cases, arguments.pixel):
        if (item.kind, item.name) in recorded:
            continue
        analyse_input(predictor, statistics, item, done)
        rows = agreement(native, done)
        if arguments.record is not None:
            write_json_atomic(arguments.record, {
                "bundle": arguments.bundle, "bundle_sha256": digest, "split": SPLIT, "pixel_mm": arguments.pixel,
                "native": str(arguments.native), "recorded": datetime.date.today().isoformat(),
                "command": f"python -m studies.input_check_spacing --bundle {arguments.bundle} --pixel "
                           f"{arguments.pixel:g} --native {arguments.native} --record {arguments.record}",
                "agreement": rows, "outcomes": [asdict(outcome) for outcome in done]})
    print("\n".join(_table(agreement(native, done), arguments.pixel)))
    return 0


if __name__ == "__main__":
    main()
