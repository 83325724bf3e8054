"""Fit the interval rule of cardiac function on out-of-fold predictions, and measure it on the test patients.

    python -m Evaluation.function_intervals --bundle acdc_ce_dice --cache runs/function \
        --record docs/records/function/acdc_ce_dice.json --write-bundle

1. **Collect** (resumable: one small JSON per volume under ``--cache``). Every cross-validation patient's ED and
   ES volumes, each predicted by the one member of the ensemble that never saw it (the bundle's
   ``ensemble.members[k].validation``): each structure's volume from hard labels and from probability sums, and
   its spread Σ p (1 − p) (:mod:`CalibSegLib.cardiac.indices`). Every test patient's volumes predicted by each
   member and by the ensemble (the mean of the members' probabilities, its argmax post-processed: what the
   shipped bundle gives). The reference volumes come from the labels.
2. **Fit** (:func:`CalibSegLib.cardiac.intervals.fit_rule`) on the out-of-fold patients; the choice of point
   estimate and scale is made there, by the out-of-fold median width of the LV EF interval under leave-one-
   patient-out conformal coverage.
3. **Measure** on the test patients (each predicted by the shipped ensemble): EF mean absolute error, coverage
   and median width of each index's interval, beside the members' min–max interval and the other point estimate,
   each with a patient-level bootstrap interval (:mod:`Evaluation.bootstrap`).

ACDC's HDF5 files carry no spacing: every volume here is in mL under the assumed 10 × 1.5 × 1.5 mm voxels
(:data:`Datasets.cases.ACDC_SPACING`); the ejection fractions do not depend on it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from CalibSegLib.bundle import Bundle, load_bundle
from CalibSegLib.cardiac.indices import (CardiacClasses, PhaseVolumes, ProbabilityTally, cardiac_classes,
                                         label_volumes_ml, phase_volumes)
from CalibSegLib.cardiac.members import ensemble_labels, member_predictors
from CalibSegLib.io import write_json_atomic
from CalibSegLib.pretrained import resolve_bundle_path
from Datasets.cases import Case, data_folder, find_cases, load_cases
from Datasets.splits import select_patients

__all__ = ["collect_volumes", "read_collected", "main"]


def _member_phase(predictor, case: Case, classes: CardiacClasses, keep: bool
                  ) -> tuple[PhaseVolumes, np.ndarray | None]:
    """One member's prediction of ``case``: its structures' volumes and (``keep``) its probabilities."""
    tally = ProbabilityTally(predictor.num_classes)
    prediction = predictor.predict(case.image, case.spacing, probability_sink=tally, keep_probabilities=keep)
    return phase_volumes(prediction.labels, tally, case.spacing, classes), prediction.probabilities


def _cases(bundle: Bundle, data: Path, patients: Sequence[str]) -> list[Case]:
    return load_cases(select_patients(find_cases(data), list(patients)), bundle.metadata.num_classes)


def _volume_order(bundle: Bundle, folder: Path, member_count: int) -> Iterator[tuple[str, Case, list[int]]]:
    """``(side, case, members)`` of every volume to collect, interleaved so that an interrupted collection holds
    both sides, every fold alike: one test patient (every member), then one out-of-fold patient of each fold (its
    own member), and so on."""
    metadata = bundle.metadata
    folds = [list(member["validation"]) for member in metadata.ensemble["members"]]
    tests = list(metadata.data["test"])
    for round_index in range(max(len(tests), *map(len, folds))):
        if round_index < len(tests):
            for case in _cases(bundle, folder, [tests[round_index]]):
                yield "test", case, list(range(member_count))
        for index, fold in enumerate(folds):
            if round_index < len(fold):
                for case in _cases(bundle, folder, [fold[round_index]]):
                    yield "oof", case, [index]


def collect_volumes(bundle: Bundle, cache: Path, data: str | Path | None = None, device: str = "cpu",
                    progress: Callable[[str], None] = print) -> None:
    """Write ``cache/<side>_<case>.json`` for every out-of-fold and test volume not yet there (module docstring,
    step 1): ``{"case", "patient", "side", "reference": {structure: mL}, "members": {k: PhaseVolumes}}`` and for a
    test volume ``"ensemble": PhaseVolumes``."""
    metadata = bundle.metadata
    classes = cardiac_classes(metadata.class_names, metadata.class_terminology)
    folder = data_folder(metadata.data, data)
    predictors = member_predictors(bundle, device=device)
    cache.mkdir(parents=True, exist_ok=True)
    for side, case, members in _volume_order(bundle, folder, len(predictors)):
        path = cache / f"{side}_{case.case_id}.json"
        if path.is_file():
            continue
        record: dict[str, Any] = {"case": case.case_id, "patient": case.patient_id, "side": side,
                                  "reference": label_volumes_ml(case.label, case.spacing, classes),
                                  "members": {}}
        probabilities = []
        for index in members:
            volumes, kept = _member_phase(predictors[index], case, classes, keep=side == "test")
            record["members"][str(index)] = volumes.to_dict()
            probabilities.append(kept)
        if side == "test":
            mean, labels = ensemble_labels(probabilities, bundle)
            record["ensemble"] = phase_volumes(labels, ProbabilityTally(len(mean)).add_volume(mean),
                                               case.spacing, classes).to_dict()
        write_json_atomic(path, record)
        progress(f"{path.name} written")


def read_collected(cache: Path) -> list[dict[str, Any]]:
    """Every volume record :func:`collect_volumes` wrote, sorted by file name."""
    return [json.loads(path.read_text()) for path in sorted(cache.glob("*.json"))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m Evaluation.function_intervals",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="acdc_ce_dice")
    parser.add_argument("--cache", type=Path, required=True, help="folder of the per-volume records (resumed)")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--device", default="cpu")
    arguments = parser.parse_args(argv)
    bundle = load_bundle(resolve_bundle_path(arguments.bundle))
    collect_volumes(bundle, arguments.cache, arguments.data, arguments.device)
    return 0


if __name__ == "__main__":
    main()
