"""What every study of a shipped model's fitted rules starts from: its command line, the bundle with the rule it
studies, and the bundle's store records (the function rule's as collected volumes, the quality model's as the
out-of-fold volumes with their held-out predicted Dice)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from CalibSegLib.bundle import Bundle, BundleError, load_bundle
from CalibSegLib.interval_rule import IntervalRule
from CalibSegLib.io import write_json_atomic
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.quality import Observation, held_out_predictions
from CalibSegLib.quality.review_rule import fold_numbers
from CalibSegLib.store import OUT_OF_FOLD, StoreRecord, read_records, stored_keys
from Evaluation.function_intervals import stored_records
from Training.fit import out_of_fold_folds, out_of_fold_observations

__all__ = ["study_arguments", "function_study", "quality_study", "HeldOut", "held_out", "held_out_study",
           "flag_cells", "report_study"]


def study_arguments(prog: str, description: str, argv: Sequence[str] | None) -> argparse.Namespace:
    """``--bundle``, ``--store`` and ``--record``, parsed."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--bundle", default="acdc_crac", help="an ensemble bundle or a shipped model's name")
    parser.add_argument("--store", type=Path, required=True, help="the store calibseg-store filled for it")
    parser.add_argument("--record", type=Path, default=None, help="where to write the record (JSON)")
    return parser.parse_args(argv)


def function_study(arguments: argparse.Namespace, predicted_dice: bool = False
                   ) -> tuple[Bundle, IntervalRule, list[dict[str, Any]]]:
    """The bundle, its interval rule and its store's volumes (with ``predicted_dice``, each prediction's); a bundle
    without the rule (or, with ``predicted_dice``, without a quality model) or a store without its records exits
    with one sentence."""
    try:
        bundle = load_bundle(resolve_bundle_path(arguments.bundle))
        if bundle.metadata.function_intervals is None or (predicted_dice and bundle.metadata.quality is None):
            raise BundleError(f"{arguments.bundle} carries no function interval rule"
                              f"{' or no quality model' if predicted_dice else ''} to study.")
        return (bundle, IntervalRule.from_dict(bundle.metadata.function_intervals),
                stored_records(bundle, arguments.store, predicted_dice))
    except (BundleError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None


def quality_study(arguments: argparse.Namespace) -> tuple[Bundle, list[StoreRecord]]:
    """The ensemble bundle with its quality model and its store records; a sub-ensemble's out-of-fold records are
    those of the ensemble it keeps members of (its quality model was fitted on them), where the store holds them.
    A bundle without a quality model or a store without its records exits with one sentence."""
    try:
        bundle = load_bundle(resolve_bundle_path(arguments.bundle))
        metadata = bundle.metadata
        if metadata.ensemble is None or metadata.quality is None:
            raise BundleError(f"{arguments.bundle} is no cross-validation ensemble with a quality model to study.")
        records = read_records(arguments.store, metadata.weights_sha256)
        fitted_on = metadata.out_of_fold_weights_sha256
        if fitted_on != metadata.weights_sha256 and stored_keys(arguments.store, fitted_on):
            records += [record for record in read_records(arguments.store, fitted_on) if record.role == OUT_OF_FOLD]
        return bundle, records
    except (BundleError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None


@dataclass(frozen=True)
class HeldOut:
    """The out-of-fold volumes as the quality fit reads them (each predicted by the member that never trained on its
    patient; ``folds``: each member's out-of-fold patients) and what a review rule is judged on there: each
    volume's predicted Dice from a fit without its patient (``(volumes, structures)``, NaN where drawn nowhere), its
    measured Dice, its patient and the number of its fold in ``folds``."""

    observations: list[Observation]
    folds: list[list[str]]
    predicted: np.ndarray
    measured: np.ndarray
    patients: np.ndarray
    volume_folds: np.ndarray


def held_out(records: Sequence[StoreRecord], class_names: Sequence[str]) -> HeldOut | None:
    """The store's out-of-fold records as :class:`HeldOut` (None: the store holds none of them).

    Raises:
        QualityModelError: too few of them show some structure to fit on (one sentence).
    """
    observations = out_of_fold_observations(records)
    if not observations:
        return None
    folds, patients = out_of_fold_folds(records), np.array([item.patient for item in observations])
    return HeldOut(observations, folds, held_out_predictions(observations, class_names),
                   np.array([item.dice for item in observations]), patients, fold_numbers(patients, folds))


def held_out_study(arguments: argparse.Namespace) -> tuple[Bundle, list[StoreRecord], HeldOut]:
    """:func:`quality_study` with its out-of-fold volumes as :class:`HeldOut`; a store without them, or with too
    few showing some structure, exits with one sentence."""
    bundle, records = quality_study(arguments)
    try:
        held = held_out(records, bundle.metadata.class_names)
    except ValueError as error:  # QualityModelError: too few out-of-fold volumes show a structure
        raise SystemExit(f"error: {error}") from None
    if held is None:
        raise SystemExit(f"error: {arguments.store} holds no out-of-fold record of {arguments.bundle}'s quality fit; "
                         f"fill it with calibseg-store --bundle <the ensemble it was fitted on> --store "
                         f"{arguments.store} --part out_of_fold.")
    return bundle, records, held


def flag_cells(counts: dict[str, Any], false_flag_digits: int = 0) -> str:
    """Two Markdown cells of :func:`Training.ensemble.flag_counts`: poor flagged / poor (recall [95 %]), good flagged
    / good (false-flag share [95 %], to ``false_flag_digits`` decimals of a percent)."""
    recall, false_flags = counts["recall"], counts["false_flag_share"]
    share = f".{false_flag_digits}%"
    return (f"{counts['poor_flagged']} / {counts['poor']} ({recall['value']:.0%} [{recall['low']:.0%}, "
            f"{recall['high']:.0%}]) | {counts['good_flagged']} / {counts['good']} ({false_flags['value']:{share}} "
            f"[{false_flags['low']:{share}}, {false_flags['high']:{share}}])")


def report_study(lines: Sequence[str], result: dict[str, Any], record: Path | None) -> int:
    """Print a study's table ``lines`` and, where ``record`` is given, write ``result`` there (atomically); 0."""
    print("\n".join(lines))
    if record is not None:
        write_json_atomic(record, result)
        print(f"record: {record}")
    return 0
