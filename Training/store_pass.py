"""Fill the store: every out-of-fold and test case of an ensemble bundle predicted once by each member that the
fits read it from, reduced to a :class:`CalibSegLib.store.StoreRecord` (resumable).

    calibseg-store --bundle acdc_crac --store store [--data DIR] [--device auto]
        [--part out_of_fold|test|degraded|inputs|all]

- ``out_of_fold``: each cross-validation patient's volumes predicted by the one member that never trained on it
  (the bundle's ``ensemble.members[m].validation``), as that member alone under the ensemble's settings
  (:func:`CalibSegLib.cardiac.members.member_predictors`): what the quality model, its review rule and the
  function intervals are fitted on (:mod:`Training.fit`).
- ``test``: each test patient's volumes by every member, and by the ensemble (the mean of the members'
  probabilities, post-processed: what the shipped bundle gives): what the fits are measured on.
- ``degraded``: the same for each degraded copy of the test volumes that the evaluation's quality check is measured on
  (:data:`Evaluation.quality_report.DEGRADATIONS`, drawn as :func:`~Evaluation.quality_report.degraded_images` draws
  them): what ``calibseg-ship --rerecord --store`` reads to measure a refitted quality model without the networks.
- ``inputs``: each labelled and test case's image statistics against its reference and every member's encoder
  vector (:class:`CalibSegLib.store.InputRecord`; the encoder alone runs, no segmentation): what the input check's
  statistics are fitted on (a member's Gaussian from the patients it trained on, the threshold from those it never
  saw).

A record already in the store for these weights is skipped, so an interrupted pass resumes where it stopped (a test
case whose ensemble record lacks its voxel counts is predicted again). The
networks run once here; every fit and study reads the records afterwards.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from CalibSegLib.bundle import Bundle, BundleError, load_bundle
from CalibSegLib.cardiac.indices import (CardiacClasses, CardiacError, ProbabilityTally, cardiac_classes,
                                         label_volumes_ml, phase_volumes)
from CalibSegLib.cardiac.members import ensemble_labels, member_predictors
from CalibSegLib.device import resolve_device
from CalibSegLib.feature_statistics import volume_vector
from CalibSegLib.features import bottleneck_layer, volume_features
from CalibSegLib.inference import Predictor
from CalibSegLib.input_check import observe_volume
from CalibSegLib.io import os_error_sentence
from CalibSegLib.metrics import dice as dice_scores
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.quality import structure_features
from CalibSegLib.store import (ENSEMBLE, OUT_OF_FOLD, TEST, InputRecord, MemberEncoding, StoreRecord, read_record,
                               record_path, stored_input_cases, stored_keys, write_input_record, write_record)
from Datasets.dataset_names import data_folder
from Datasets.errors import DataError
from Datasets.layouts import CaseFile, find_cases
from Datasets.loading import Case, load_cases
from Datasets.splits import select_patients
from Evaluation.quality_report import DEGRADATIONS, degraded_images

__all__ = ["INPUTS", "DEGRADED", "PARTS", "fill_store", "fill_inputs", "main"]

INPUTS, DEGRADED = "inputs", "degraded"
PARTS = (OUT_OF_FOLD, TEST, DEGRADED, INPUTS, "all")


def _classes(bundle: Bundle) -> CardiacClasses | None:
    """The bundle's cardiac structures, or None for a bundle of other anatomy (its records hold no volumes)."""
    try:
        return cardiac_classes(bundle.metadata.class_names, bundle.metadata.class_terminology)
    except CardiacError:
        return None


def _voxels(labels: np.ndarray, num_classes: int) -> list[int]:
    """How many voxels ``labels`` give each foreground class ``(C - 1,)``."""
    return [int(count) for count in np.bincount(np.asarray(labels).ravel(), minlength=num_classes)[1:num_classes]]


def _record(predictor: Predictor, case: Case, image: np.ndarray, member: int, role: str, weights_sha256: str,
            classes: CardiacClasses | None, degradation: str | None) -> tuple[StoreRecord, np.ndarray | None]:
    """One member's prediction of ``image`` (``case``'s own, or its ``degradation``'s copy) as a record, and (test
    cases, whose ensemble record needs them) its ``(C, z, y, x)`` probabilities."""
    num_classes = predictor.num_classes
    tally = ProbabilityTally(num_classes)
    prediction = predictor.predict(image, case.spacing, probability_sink=tally, keep_probabilities=role == TEST)
    reference = np.asarray(case.label).astype(np.int64)
    record = StoreRecord(
        case.case_id, str(case.patient_id), member, role, weights_sha256,
        [float(value) for value in dice_scores(prediction.labels, reference, num_classes)],
        structure_features(prediction, num_classes, spacing=case.spacing),
        None if classes is None else phase_volumes(prediction.labels, tally, case.spacing, classes).to_dict(),
        None if classes is None else label_volumes_ml(case.label, case.spacing, classes),
        _voxels(prediction.labels, num_classes), degradation)
    return record, prediction.probabilities


def _ensemble_record(bundle: Bundle, case: Case, members: Sequence[StoreRecord],
                     probabilities: Sequence[np.ndarray], classes: CardiacClasses | None) -> StoreRecord:
    """The ensemble's own prediction of a test ``case`` from its members' probabilities. Its quality features are
    left empty (``None`` each): the ensemble's predicted Dice is the mean of its members' (quality/members.py)."""
    mean, labels = ensemble_labels(probabilities, bundle)
    num_classes = bundle.metadata.num_classes
    reference = np.asarray(case.label).astype(np.int64)
    return StoreRecord(
        case.case_id, members[0].patient, ENSEMBLE, TEST, members[0].weights_sha256,
        [float(value) for value in dice_scores(labels, reference, num_classes)], [None] * (num_classes - 1),
        None if classes is None else phase_volumes(labels, ProbabilityTally(num_classes).add_volume(mean),
                                                   case.spacing, classes).to_dict(),
        members[0].reference_ml, _voxels(labels, num_classes), members[0].degradation)


def _predict_case(bundle: Bundle, predictors: Sequence[Predictor], case: Case, image: np.ndarray,
                  members: Sequence[int], role: str, classes: CardiacClasses | None,
                  degradation: str | None = None) -> list[StoreRecord]:
    """The records of ``members``' predictions of ``image`` (``case``'s, or its ``degradation``'s copy), and for a
    test case the ensemble's."""
    records, probabilities = [], []
    for member in members:
        record, kept = _record(predictors[member], case, image, member, role, bundle.metadata.weights_sha256,
                               classes, degradation)
        records.append(record)
        probabilities.append(kept)
    if role == TEST:
        records.append(_ensemble_record(bundle, case, records, probabilities, classes))
    return records


def _done(store: Path, weights_sha256: str, degradation: str | None = None) -> Callable[[str, list[str]], bool]:
    """Whether the store holds every wanted record of a case: those of ``members`` (the names their files carry),
    an ensemble record with its voxel counts among them."""
    stored = stored_keys(store, weights_sha256, degradation)

    def done(case: str, members: list[str]) -> bool:
        if not all((case, member) in stored for member in members):
            return False
        return ENSEMBLE not in members or read_record(record_path(store, weights_sha256, case, ENSEMBLE,
                                                                  degradation)).voxels is not None
    return done


def _tasks(bundle: Bundle, files: Sequence[CaseFile], part: str) -> Iterator[tuple[str, CaseFile, list[int]]]:
    """``(role, case file, members)`` of every record to write: out of fold first (what the fits read)."""
    metadata = bundle.metadata
    if part in (OUT_OF_FOLD, "all") and metadata.out_of_fold_weights_sha256 == metadata.weights_sha256:
        for index, member in enumerate(metadata.ensemble.members):
            for case_file in select_patients(files, list(member.validation)):
                yield OUT_OF_FOLD, case_file, [index]
    if part in (TEST, "all"):
        for case_file in select_patients(files, list(metadata.data.get("test") or [])):
            yield TEST, case_file, list(range(metadata.ensemble_size))


def _ensemble_bundle(bundle_name: str | Path) -> Bundle:
    """The ensemble bundle ``bundle_name`` names.

    Raises:
        BundleError, DataError: unreadable, or no cross-validation ensemble (one sentence).
    """
    bundle = load_bundle(resolve_bundle_path(bundle_name))
    if bundle.metadata.ensemble is None:
        raise DataError(f"{bundle_name} is no cross-validation ensemble (calibseg-ensemble), so it has no "
                        "out-of-fold members to fill a store from.")
    return bundle


def fill_inputs(bundle: Bundle, store: Path, files: Sequence[CaseFile], device: str = "auto", batch_size: int = 16,
                progress: Callable[[str], None] = print) -> int:
    """Write the :class:`~CalibSegLib.store.InputRecord` of every labelled and test case of ``bundle`` not yet in
    ``store``: the image observed with its reference under the bundle's preprocessing, and each member's encoder
    vector at its own bottleneck (as :func:`CalibSegLib.features.fit_member_features` reads them); how many."""
    metadata = bundle.metadata
    done = stored_input_cases(store, metadata.weights_sha256)
    wanted = [case_file for case_file in select_patients(files, list(metadata.data.get("train") or [])
                                                         + list(metadata.data.get("test") or []))
              if case_file.case_id not in done]
    if not wanted:
        return 0
    network = bundle.build_model().to(resolve_device(device))
    members = list(network.members)
    window = metadata.sliding_window
    layers = [bottleneck_layer(member, metadata.in_channels, window.patch_size) for member in members]
    for case_file in wanted:
        case = load_cases([case_file], metadata.num_classes)[0]
        observation = observe_volume(case.image, case.spacing, case.label, metadata.class_names,
                                     metadata.preprocessing)
        encoders = tuple(MemberEncoding(layer, volume_vector(volume_features(
            member, layer, case.image, case.spacing, metadata.preprocessing, window, batch_size)))
            for member, layer in zip(members, layers))
        write_input_record(store, InputRecord(case.case_id, str(case.patient_id), metadata.weights_sha256,
                                              observation, encoders))
        progress(f"{INPUTS} {case.case_id}: {len(encoders)} member(s)")
    return len(wanted)


def fill_store(bundle_name: str | Path, store: Path, data: str | Path | None = None, device: str = "auto",
               part: str = "all", batch_size: int = 16, progress: Callable[[str], None] = print) -> int:
    """Write every record of ``part`` not yet in ``store`` for the bundle's weights (module docstring); returns how
    many were written.

    Raises:
        BundleError, DataError: no ensemble bundle, or its recorded patients cannot be found (one sentence each).
    """
    bundle = _ensemble_bundle(bundle_name)
    metadata = bundle.metadata
    files = find_cases(data_folder(metadata.data, data))
    written = 0
    if part in (OUT_OF_FOLD, TEST, DEGRADED, "all"):
        predictors = member_predictors(bundle, device=device, batch_size=batch_size)
        if part != DEGRADED:
            written += _fill_predictions(bundle, store, files, predictors, part, progress)
        if part in (DEGRADED, "all"):
            written += _fill_degraded(bundle, store, files, predictors, progress)
    if part in (INPUTS, "all"):
        written += fill_inputs(bundle, store, files, device, batch_size, progress)
    return written


def _fill_predictions(bundle: Bundle, store: Path, files: Sequence[CaseFile], predictors: Sequence[Predictor],
                      part: str, progress: Callable[[str], None]) -> int:
    """Write every prediction record of ``part`` (out of fold, test or both) not yet in ``store``; how many."""
    metadata = bundle.metadata
    classes = _classes(bundle)
    done = _done(store, metadata.weights_sha256)
    written = 0
    for role, case_file, members in _tasks(bundle, files, part):
        if done(case_file.case_id, [str(member) for member in members] + ([ENSEMBLE] if role == TEST else [])):
            continue
        case = load_cases([case_file], metadata.num_classes)[0]
        records = _predict_case(bundle, predictors, case, case.image, members, role, classes)
        for record in records:
            write_record(store, record)
        written += len(records)
        progress(f"{role} {case.case_id}: {len(records)} record(s)")
    return written


def _fill_degraded(bundle: Bundle, store: Path, files: Sequence[CaseFile], predictors: Sequence[Predictor],
                   progress: Callable[[str], None]) -> int:
    """Write every record of the test volumes' degraded copies not yet in ``store``; how many."""
    metadata = bundle.metadata
    classes = _classes(bundle)
    test_files = select_patients(files, list(metadata.data.get("test") or []))
    members = list(range(metadata.ensemble_size))
    wanted = [str(member) for member in members] + [ENSEMBLE]
    written = 0
    for degradation in DEGRADATIONS:
        done = _done(store, metadata.weights_sha256, degradation)
        if all(done(case_file.case_id, wanted) for case_file in test_files):
            continue
        # The noise runs on from one case to the next, as the evaluation draws it: every case is degraded in order.
        cases = load_cases(test_files, metadata.num_classes)
        for case, image in zip(cases, degraded_images(cases, degradation), strict=True):
            if done(case.case_id, wanted):
                continue
            records = _predict_case(bundle, predictors, case, image, members, TEST, classes, degradation)
            for record in records:
                write_record(store, record)
            written += len(records)
            progress(f"{degradation} {case.case_id}: {len(records)} record(s)")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibseg-store`` command; returns 0. Bad input exits with one sentence, no traceback."""
    parser = argparse.ArgumentParser(prog="calibseg-store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, help="an ensemble bundle (.calibseg) or a shipped model's name")
    parser.add_argument("--store", type=Path, required=True, help="the store's folder (created; resumed)")
    parser.add_argument("--part", choices=PARTS, default="all")
    parser.add_argument("--data", type=Path, default=None,
                        help="data folder (default: found from the dataset the bundle records)")
    parser.add_argument("--device", default="auto", help="where the networks run: auto, cpu, cuda, cuda:1")
    parser.add_argument("--batch-size", type=int, default=16, help="slices per network pass")
    arguments = parser.parse_args(argv)
    try:
        written = fill_store(arguments.bundle, arguments.store, arguments.data, arguments.device, arguments.part,
                             arguments.batch_size)
    except (BundleError, ValueError) as error:  # DataError is a ValueError
        raise SystemExit(f"error: {error}") from None
    except OSError as error:
        raise SystemExit(f"error: {os_error_sentence(error)}") from None
    except KeyboardInterrupt:  # every record is written whole; the next run resumes
        raise SystemExit("interrupted: the records written so far are kept; run again to resume.") from None
    print(f"{written} record(s) written to {arguments.store}")
    return 0


if __name__ == "__main__":
    main()
