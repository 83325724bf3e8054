"""One pass of a shipped ensemble over its out-of-fold and test volumes, saved per volume so it resumes.

    nice -n 5 python -m scripts.ensemble_quality_pass acdc_ce_dice --part out_of_fold --out /tmp/pass
    nice -n 5 python -m scripts.ensemble_quality_pass acdc_ce_dice --part test --out /tmp/pass

What the ensemble's rules are fitted and checked on (docs/input_check.md, docs/results.md):

- ``out_of_fold``: each of the 65 cross-validation patients' volumes predicted by the one member that never trained
  on it (``ensemble["members"][m]["validation"]``), as that member alone under the ensemble's settings
  (:func:`Training.ensemble.member_metadata`): the quality features, the measured Dice, and every member's encoder
  feature vector (:func:`CalibSegLib.features.volume_features`; a member's Gaussian comes from the volumes of the
  patients it trained on, its threshold from the volumes it never saw).
- ``test``: the bundle's test patients predicted by each member alone under the ensemble's settings (the members
  the ensemble keeps, :attr:`CalibSegLib.inference.Prediction.members`): features, Dice and predicted Dice.
- ``encoders``: every member's encoder feature vector of every out-of-fold and test volume.

Writes ``<out>/<part>/<case>.member<m>.json`` per volume and member (``<case>.json`` for ``encoders``; temporary name,
then rename); a record already written is skipped.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from CalibSegLib.bundle import BundleError, load_bundle
from CalibSegLib.features import bottleneck_layer, volume_features
from CalibSegLib.feature_statistics import volume_vector
from CalibSegLib.inference import Predictor
from CalibSegLib.io import write_json_atomic
from CalibSegLib.metrics import dice as dice_scores
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.quality import structure_features
from CalibSegLib.quality.members import member_predicted_dice
from Datasets.dataset_names import data_folder
from Datasets.errors import DataError
from Datasets.layouts import find_cases
from Datasets.loading import Case, load_cases
from Datasets.splits import select_patients
from Training.ensemble import member_metadata

__all__ = ["PARTS", "run_pass", "main"]

PARTS = ("out_of_fold", "test", "encoders")


def _features_of(prediction: Any, case: Case, metadata: Any) -> list[dict[str, float] | None]:
    """The quality features the ensemble's quality model reads, with its own feature settings."""
    model = metadata.quality
    return structure_features(prediction, metadata.num_classes, model.low_confidence_threshold, model.boundary_ring,
                              case.spacing)


def _encoder_vectors(members: Sequence[torch.nn.Module], metadata: Any, case: Case) -> list[list[float]]:
    """Every member's ``(F,)`` encoder feature vector of ``case``, read at that member's own bottleneck."""
    window = metadata.sliding_window
    vectors = []
    for member in members:
        layer = bottleneck_layer(member, metadata.in_channels, window.patch_size)
        features = volume_features(member, layer, case.image, case.spacing, metadata.preprocessing, window)
        vectors.append(volume_vector(features).tolist())
    return vectors


def _measured(labels: np.ndarray, case: Case, num_classes: int) -> list[float]:
    return [float(value) for value in dice_scores(labels, np.asarray(case.label).astype(np.int64), num_classes)]


def _tasks(metadata: Any, part: str) -> list[tuple[int, str]]:
    """(member, patient) pairs of ``part``: each out-of-fold patient with the member that never saw it; each test
    patient with every member."""
    members = metadata.ensemble["members"]
    if part == "out_of_fold":
        return [(index, patient) for index, entry in enumerate(members) for patient in entry["validation"]]
    return [(index, patient) for patient in metadata.data["test"] for index in range(len(members))]


def run_pass(bundle_name: str, part: str, out: Path, data: Path | None = None, encoders: bool = False,
             reverse: bool = False, offset: int = 0, batch_size: int = 16) -> int:
    """Predict and save every (volume, member) of ``part`` not yet under ``out``; returns how many were written.
    ``encoders``: also every member's encoder feature vector of the volume; ``reverse``: last task first (a second
    process meets the first half-way); ``offset``: start at that task (a third process starts in the middle)."""
    bundle = load_bundle(resolve_bundle_path(bundle_name))
    metadata = bundle.metadata
    if metadata.ensemble_size < 2 or metadata.quality is None:
        raise DataError(f"{bundle_name} is not an ensemble with a quality model.")
    members = list(bundle.build_model().eval().members)
    settings = member_metadata(metadata)
    folder = out / part
    folder.mkdir(parents=True, exist_ok=True)
    files = find_cases(data_folder(metadata.data, data))
    written = 0
    if part == "encoders":
        volumes = select_patients(files, [*metadata.data["train"], *metadata.data["test"]])
        volumes = volumes[offset:] + volumes[:offset]
        for case_file in reversed(volumes) if reverse else volumes:
            target = folder / f"{case_file.case_id}.json"
            if not target.exists():
                case = load_cases([case_file], metadata.num_classes)[0]
                write_json_atomic(target, {"case": case.case_id, "patient": case.patient_id,
                                           "encoder_vectors": _encoder_vectors(members, metadata, case)})
                written += 1
        return written
    tasks = _tasks(metadata, part)
    tasks = tasks[offset:] + tasks[:offset]
    for member_index, patient in reversed(tasks) if reverse else tasks:
        predictor = Predictor.from_network(members[member_index], settings, device="cpu", batch_size=batch_size)
        for case_file in select_patients(files, [patient]):
            target = folder / f"{case_file.case_id}.member{member_index}.json"
            if target.exists():
                continue
            case = load_cases([case_file], metadata.num_classes)[0]
            prediction = predictor.predict(case.image, case.spacing)
            features = _features_of(prediction, case, metadata)
            record: dict[str, Any] = {
                "case": case.case_id, "patient": case.patient_id, "member": member_index, "features": features,
                "dice": _measured(prediction.labels, case, metadata.num_classes),
                "predicted_dice": member_predicted_dice(metadata.quality, [features], metadata.class_names)[0].tolist()}
            if encoders:
                record["encoder_vectors"] = _encoder_vectors(members, metadata, case)
            write_json_atomic(target, record)
            written += 1
            print(f"{part} {case.case_id} member {member_index}: Dice "
                  f"{', '.join(f'{value:.3f}' for value in record['dice'])}", flush=True)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Returns 0; bad input exits with one sentence."""
    parser = argparse.ArgumentParser(prog="python -m scripts.ensemble_quality_pass",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", help="a shipped ensemble's name or a .calibseg path")
    parser.add_argument("--part", choices=PARTS, required=True)
    parser.add_argument("--out", type=Path, required=True, help="folder of the per-volume records")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--encoders", action="store_true", help="also every member's encoder feature vector")
    parser.add_argument("--reverse", action="store_true", help="last volume first, for a second process")
    parser.add_argument("--offset", type=int, default=0, help="start at this task, for a third process")
    arguments = parser.parse_args(argv)
    # One thread: on a shared CPU two threads wait on each other (37 s a member's volume, against 123 s with two).
    torch.set_num_threads(1)
    try:
        written = run_pass(arguments.bundle, arguments.part, arguments.out, arguments.data, arguments.encoders,
                           arguments.reverse, arguments.offset)
    except (BundleError, DataError) as error:
        raise SystemExit(f"error: {error}") from None
    print(f"{written} volumes written under {arguments.out / arguments.part}")
    return 0


if __name__ == "__main__":
    main()
