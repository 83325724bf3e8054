"""The input check's thresholds decided on validation volumes, and its table on held-out ones (docs/input_check.md).

    python -m scripts.input_check_table --bundle acdc_ce_dice --split val    # the excursions the rule decides on
    python -m scripts.input_check_table --bundle acdc_ce_dice --split test   # held out: with the bundle's thresholds

Every volume is the bundle's prediction on one input: the split's clean volumes, their contrast-inverted
copies (:data:`Evaluation.quality_report.DEGRADATIONS`), and inputs that are no cine MRI at all —
uniform noise and a CT-like abdomen in Hounsfield units (:func:`ct_like_volume`) — drawn from a seed
per split (``val`` 1, ``test`` 2), so the held-out ones are other draws. ``--split val`` prints each
family's excursion (:func:`CalibSegLib.input_check.excursions`) against the training ranges of the
bundle's training patients; ``--split test`` prints, per kind of input, how often the bundle's stored
rule calls it unsuitable. Research only: it reads ACDC from ``--data`` (default ``$CALIBSEG_ACDC``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from CalibSegLib.bundle import load_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.input_check import (FAMILIES, InputStatistics, excursions, input_reasons, observe_volume,
                                     statistics_of_cases)
from CalibSegLib.pretrained import resolve_bundle_path
from Datasets.cases import ACDC_SPACING, data_folder, find_cases, load_cases
from Datasets.splits import recorded_split, select_patients
from Evaluation.quality_report import DEGRADATIONS

__all__ = ["ct_like_volume", "noise_volume", "inputs", "main"]

SEEDS = {"val": 1, "test": 2}
OTHER_INPUTS = 3  # noise volumes and CT-like volumes per split


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


def inputs(cases, split: str) -> Iterator[tuple[str, str, np.ndarray, Sequence[float]]]:
    """``(kind, name, image, spacing)`` of every input the table predicts."""
    rng = np.random.default_rng(SEEDS[split])
    for case in cases:
        yield "clean", case.case_id, case.image, case.spacing
    invert = DEGRADATIONS["contrast inversion"]
    for case in cases:
        yield "contrast inversion", case.case_id, invert(case.image.astype(np.float32), rng), case.spacing
    for index in range(OTHER_INPUTS):
        yield "uniform noise", f"noise{index}", noise_volume(rng, cases[index].image.shape), ACDC_SPACING
    for index in range(OTHER_INPUTS):
        image, spacing = ct_like_volume(rng)
        yield "CT-like abdomen (HU)", f"ct{index}", image, spacing


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="acdc_ce_dice")
    parser.add_argument("--split", choices=tuple(SEEDS), default="val")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--device", default="auto")
    arguments = parser.parse_args(argv)
    bundle = load_bundle(resolve_bundle_path(arguments.bundle))
    metadata = bundle.metadata
    files = find_cases(data_folder(metadata.data, arguments.data))
    patients = recorded_split(metadata.data)
    if arguments.split == "val":
        training = load_cases(select_patients(files, patients["train"]), metadata.num_classes)
        statistics = InputStatistics.from_dict(statistics_of_cases(metadata, training), metadata.class_names,
                                               metadata.in_channels)
    else:
        statistics = InputStatistics.from_dict(metadata.input_statistics, metadata.class_names, metadata.in_channels)
    cases = load_cases(select_patients(files, patients[arguments.split]), metadata.num_classes)
    predictor = Predictor(bundle, device=arguments.device)
    counts: dict[str, list[int]] = {}
    print("kind | input | " + " | ".join(FAMILIES) + " | suitable")
    for kind, name, image, spacing in inputs(cases, arguments.split):
        labels = predictor.predict(image, spacing).labels
        observation = observe_volume(image, spacing, labels, metadata.class_names, metadata.preprocessing)
        values = excursions(statistics, observation)
        suitable = not input_reasons(statistics, observation)
        counts.setdefault(kind, [0, 0])
        counts[kind][0] += suitable
        counts[kind][1] += 1
        print(f"{kind} | {name} | " + " | ".join(f"{values[family]:.3f}" for family in FAMILIES)
              + f" | {suitable}", flush=True)
    print(f"\nthresholds: {statistics.thresholds}")
    for kind, (suitable, total) in counts.items():
        print(f"{kind}: suitable {suitable} of {total}, unsuitable {total - suitable} of {total}")
    return 0


if __name__ == "__main__":
    main()
