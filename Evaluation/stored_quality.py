"""The quality check of an ensemble on its test volumes and their degraded copies, read from the store instead of
running the networks again.

The store (:mod:`CalibSegLib.store`, filled by ``calibseg-store --part test`` and ``--part degraded``) keeps, for
every test volume and every degraded copy the evaluation draws, each member's quality features and the ensemble's own
prediction: its measured Dice and where it draws each structure. That is all an evaluation's quality columns and
its quality section are made of (:func:`CalibSegLib.quality.ensemble_summary_columns`,
:func:`Evaluation.quality_report.quality_section`), so a refitted quality model is measured in seconds, with the same
numbers the networks would give; ``calibseg-ship --rerecord NAME --store S`` records them.
"""

from __future__ import annotations

from typing import Sequence

from CalibSegLib.bundle import BundleMetadata
from CalibSegLib.quality import BOUNDARY_RING, LOW_CONFIDENCE_THRESHOLD, ensemble_summary_columns, structure_key
from CalibSegLib.store import ENSEMBLE, TEST, StoreError, StoreRecord, read_records
from Evaluation.quality_report import DEGRADATIONS, quality_section

__all__ = ["stored_rows", "stored_quality"]


def _check_model(metadata: BundleMetadata) -> None:
    """Refuse a bundle whose quality model the store's features cannot serve (one sentence)."""
    model = metadata.quality
    if model is None or not model.per_member or metadata.ensemble_size < 2:
        raise ValueError("Only an ensemble's quality model fitted on its members can be measured from the store; "
                         "re-record this bundle with its networks (without --store).")
    if (model.low_confidence_threshold, model.boundary_ring) != (LOW_CONFIDENCE_THRESHOLD, BOUNDARY_RING):
        raise ValueError(f"The quality model reads its features at a low-confidence threshold of "
                         f"{model.low_confidence_threshold} and a boundary ring of {model.boundary_ring}, the store "
                         f"keeps them at {LOW_CONFIDENCE_THRESHOLD} and {BOUNDARY_RING}; re-record it with its "
                         "networks (without --store).")


def stored_rows(records: Sequence[StoreRecord], metadata: BundleMetadata, cases: Sequence[str],
                part: str = "the test volumes") -> list[dict[str, float]]:
    """One row per case of ``cases``, in their order: the ensemble's measured ``dice_<structure>`` and the quality
    columns its summary gives (:func:`~CalibSegLib.quality.summary_columns`), from the test records of one bundle's
    weights (``part`` names them in a sentence).

    Raises:
        StoreError: a case lacks a member's or the ensemble's record, or the ensemble's voxel counts (one sentence).
    """
    _check_model(metadata)
    by_case: dict[str, dict] = {}
    for record in records:
        if record.role == TEST:
            by_case.setdefault(record.case, {})[record.member] = record
    wanted = [*range(metadata.ensemble_size), ENSEMBLE]
    rows = []
    for case in cases:
        found = by_case.get(case, {})
        missing = [str(member) for member in wanted if member not in found]
        if missing:
            raise StoreError(f"The store lacks the record of {case} ({part}) by {', '.join(missing)}; fill it with "
                             "calibseg-store --part test and --part degraded.")
        ensemble = found[ENSEMBLE]
        if ensemble.voxels is None:
            raise StoreError(f"The store's ensemble record of {case} ({part}) does not say where it draws each "
                             "structure; fill it again with calibseg-store, which predicts such a case anew.")
        names = metadata.class_names
        rows.append({**{f"dice_{structure_key(name)}": value for name, value in zip(names[1:], ensemble.dice)},
                     **ensemble_summary_columns(metadata.quality, names,
                                                [found[member].features for member in range(metadata.ensemble_size)],
                                                [count > 0 for count in ensemble.voxels])})
    return rows


def stored_quality(metadata: BundleMetadata, store: str, cases: Sequence[str], patients: Sequence[str]
                   ) -> tuple[list[dict[str, float]], dict]:
    """The rows of the test volumes ``cases`` (:func:`stored_rows`) and the quality section
    (:func:`~Evaluation.quality_report.quality_section`) over them and every degraded copy, as an evaluation with
    ``--degraded`` measures them; ``patients``: each case's patient.

    Raises:
        StoreError: the store lacks a record (one sentence saying how to fill it).
        ValueError: a quality model the store cannot serve.
    """
    sha256 = metadata.weights_sha256
    rows = stored_rows(read_records(store, sha256), metadata, cases)
    degraded = {degradation: stored_rows(read_records(store, sha256, degradation), metadata, cases,
                                         f"its copy under {degradation}") for degradation in DEGRADATIONS}
    return rows, quality_section(metadata.quality, metadata.class_names, rows, degraded, patients)
