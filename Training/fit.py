"""Refit a bundle's post-hoc sections from the store, predicting nothing.

    calibseg-fit --bundle acdc_crac --store store [--sections quality_model function_intervals] [--out PATH]
    calibseg-fit --bundle acdc_crac --store store --check      # refit and compare, write nothing

Every fit is a pure function from the bundle's store records (:mod:`CalibSegLib.store`, filled once by
``calibseg-store``) and its metadata to one section of ``bundle.json`` and the record of how it was chosen, listed
in :data:`FITS`:

- ``quality_model``: the quality model and its review rule (per-structure thresholds) from the out-of-fold
  observations, each volume by the member that never trained on it (:func:`Training.ensemble.quality_from_observations`,
  the function ``calibseg-ensemble`` fits with);
- ``function_intervals``: the cardiac function interval rule from the out-of-fold volumes, chosen by
  leave-one-patient-out widths and measured on the test patients
  (:func:`Evaluation.function_intervals.fit_and_measure`); with ``--with-predicted-dice`` the scales that read the
  members' predicted Dice are candidates too;
- ``input_statistics``: the input check's training ranges from the first member's training volumes
  (:func:`Training.ensemble.judging_patients`) and every member's feature Gaussian from the volumes it trained on,
  one distance threshold pooled over the volumes each never saw (:func:`Training.ensemble.member_patients`), from the
  store's input records (what ``python -m Training.fit_input_check`` fits after running the encoders).

What the store does not hold stays with the pass that needs the voxels: mirroring, temperature and the largest
component are chosen by ``calibseg-ensemble`` on the members' logits, and every record is of a prediction under
those settings (a new temperature changes every quality feature, so it means a new store).

The bundle is rewritten through :func:`Training.bundle_rewrite.rewrite_bundle` (default in place; a shipped model:
``runs/<name>/<name>.calibseg``), the weights byte-identical; ``--check`` refits, prints the largest difference
to the bundle's own sections and writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from CalibSegLib.bundle import BundleError, BundleMetadata, load_bundle
from CalibSegLib.feature_statistics import fit_member_statistics
from CalibSegLib import input_check
from CalibSegLib.io import os_error_sentence
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.quality import Observation
from CalibSegLib.store import OUT_OF_FOLD, InputRecord, StoreRecord, read_fit_records, read_input_records
from Datasets.errors import DataError
from Evaluation.function_intervals import fit_and_measure, stored_records
from Training.bundle_rewrite import rewrite_bundle, rewrite_destination
from Training.ensemble import judging_patients, member_patients, quality_from_observations

__all__ = ["FitInputs", "FITS", "out_of_fold_observations", "out_of_fold_folds", "fit_quality_model",
           "fit_function_intervals", "fit_input_statistics", "refit", "largest_difference", "main"]


@dataclasses.dataclass(frozen=True)
class FitInputs:
    """What every fit reads, each part read from the store when a fit asks for it: the bundle's metadata, its
    prediction records, the function fit's volumes (with its one option) and the input records."""

    metadata: BundleMetadata
    records: Callable[[], list[StoreRecord]]
    function_records: Callable[[], list[dict[str, Any]]]
    input_records: Callable[[], list[InputRecord]]


def out_of_fold_observations(records: Sequence[StoreRecord]) -> list[Observation]:
    """The out-of-fold records as the quality fit's observations, member by member (the order ``calibseg-ensemble``
    predicts in, so the fit sums them in the same order)."""
    out_of_fold = sorted((record for record in records if record.role == OUT_OF_FOLD),
                         key=lambda record: (record.member, record.case))
    return [Observation(record.patient, record.features, np.asarray(record.dice))
            for record in out_of_fold]


def out_of_fold_folds(records: Sequence[StoreRecord]) -> list[list[str]]:
    """The cross-validation folds of the out-of-fold records: per member, the patients it predicted because it never
    trained on them (a sub-ensemble's records are those of the ensemble it was selected from, so its folds)."""
    members = sorted({record.member for record in records if record.role == OUT_OF_FOLD})
    return [sorted({record.patient for record in records if record.role == OUT_OF_FOLD and record.member == member})
            for member in members]


def fit_quality_model(inputs: FitInputs) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``quality_model`` section and its record (the review rule's table, the held-out check)."""
    records = inputs.records()
    observations = out_of_fold_observations(records)
    if not observations:
        raise DataError("The store holds no out-of-fold record of the bundle's weights (a sub-ensemble reads those "
                        "of the ensemble it was selected from); fill them with calibseg-store --part out_of_fold.")
    model, record = quality_from_observations(observations, inputs.metadata.class_names, out_of_fold_folds(records))
    return model.to_dict(), record


def fit_function_intervals(inputs: FitInputs) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``function_intervals`` section and its record (the candidates' leave-one-out widths, the test check)."""
    rule, measured = fit_and_measure(inputs.function_records())
    return rule.to_dict(), measured


def fit_input_statistics(inputs: FitInputs) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``input_statistics`` section (module docstring) and its record (volumes per member, the threshold).

    Raises:
        DataError: the store's input records lack a patient the bundle trained on (one sentence).
        InputStatisticsError, FeatureStatisticsError: too few volumes, features that cannot be modelled.
    """
    records = inputs.input_records()
    stored = {record.patient for record in records}
    missing = sorted(set(inputs.metadata.data.get("train") or []) - stored)
    if missing:
        raise DataError(f"The store's input records lack {len(missing)} of the bundle's training patients (first: "
                        f"{missing[0]}); complete them with calibseg-store --part inputs.")
    first_trained, _ = judging_patients(inputs.metadata)
    statistics = input_check.fit_input_statistics(
        [record.observation for record in records if record.patient in first_trained], input_check.THRESHOLDS)
    split = member_patients(inputs.metadata)

    def vectors(member: int, patients: list[str]) -> list[np.ndarray]:
        return [record.encoders[member].vector[None] for record in records if record.patient in patients]

    features = fit_member_statistics([records[0].encoders[member].layer for member in range(len(split))],
                                     [vectors(member, trained) for member, (trained, _) in enumerate(split)],
                                     [vectors(member, unseen) for member, (_, unseen) in enumerate(split)])
    record = {"training_volumes": statistics.volumes,
              "member_training_volumes": [member.training_volumes for member in features.members],
              "unseen_volumes": features.members[0].validation_volumes, "threshold": features.threshold}
    return input_check.with_features(statistics, features).to_dict(), record


# Section of bundle.json → its fit from the store. One table: calibseg-fit, its tests and docs read it.
FITS: dict[str, Callable[[FitInputs], tuple[dict[str, Any], dict[str, Any]]]] = {
    "quality_model": fit_quality_model,
    "function_intervals": fit_function_intervals,
    "input_statistics": fit_input_statistics,
}


def refit(bundle_name: str | Path, store: Path, sections: Sequence[str] = tuple(FITS),
          predicted_dice: bool = False) -> tuple[Any, dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The bundle, its refitted ``sections`` (name → section) and their records, from ``store``.

    Raises:
        BundleError, DataError, StoreError, QualityModelError: unreadable bundle or store, too few records.
    """
    unknown = [name for name in sections if name not in FITS]
    if unknown:
        raise KeyError(f"No fit of section {', '.join(unknown)}; choose from {', '.join(FITS)}.")
    bundle = load_bundle(resolve_bundle_path(bundle_name))
    if bundle.metadata.ensemble is None:
        raise DataError(f"{bundle_name} is no cross-validation ensemble, so no store records are of it.")
    metadata = bundle.metadata
    inputs = FitInputs(metadata, lambda: read_fit_records(store, metadata.weights_sha256,
                                                          metadata.out_of_fold_weights_sha256),
                       lambda: stored_records(bundle, store, predicted_dice),
                       lambda: read_input_records(store, bundle.metadata.weights_sha256))
    fitted, records = {}, {}
    for name in sections:
        fitted[name], records[name] = FITS[name](inputs)
    return bundle, fitted, records


def largest_difference(stored: Any, refitted: Any) -> float:
    """The largest absolute difference between two JSON values' numbers (inf where their shapes or texts differ, or
    where one number is NaN and the other is not)."""
    if isinstance(stored, dict) and isinstance(refitted, dict):
        if set(stored) != set(refitted):
            return math.inf
        return max((largest_difference(stored[key], refitted[key]) for key in stored), default=0.0)
    if isinstance(stored, list) and isinstance(refitted, list):
        if len(stored) != len(refitted):
            return math.inf
        return max((largest_difference(*pair) for pair in zip(stored, refitted)), default=0.0)
    numbers = (int, float)
    if isinstance(stored, numbers) and isinstance(refitted, numbers) and not isinstance(stored, bool):
        if math.isnan(stored) or math.isnan(refitted):  # a NaN difference would be lost in max()
            return 0.0 if math.isnan(stored) and math.isnan(refitted) else math.inf
        return abs(float(stored) - float(refitted))
    return 0.0 if stored == refitted else math.inf


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibseg-fit`` command; returns 0. Bad input exits with one sentence, no traceback."""
    parser = argparse.ArgumentParser(prog="calibseg-fit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, help="an ensemble bundle (.calibseg) or a shipped model's name")
    parser.add_argument("--store", type=Path, required=True, help="the store calibseg-store filled for it")
    parser.add_argument("--sections", nargs="+", choices=tuple(FITS), default=list(FITS))
    parser.add_argument("--with-predicted-dice", action="store_true",
                        help="function intervals: the scales that read the members' predicted Dice are candidates")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the bundle here (default: in place; a shipped model: runs/<name>/<name>.calibseg)")
    parser.add_argument("--check", action="store_true",
                        help="print how far each refitted section is from the bundle's own; write nothing")
    arguments = parser.parse_args(argv)
    try:
        destination = None if arguments.check else rewrite_destination(resolve_bundle_path(arguments.bundle),
                                                                         arguments.out)
        bundle, fitted, _ = refit(arguments.bundle, arguments.store, arguments.sections,
                                  arguments.with_predicted_dice)
        stored = json.loads(bundle.metadata.to_json())
        for name, section in fitted.items():
            print(f"{name}: largest difference to the bundle's own {largest_difference(stored.get(name), section):.3g}")
        if destination is not None:
            print(f"bundle: {rewrite_bundle(bundle, dataclasses.replace(bundle.metadata, **fitted), destination)}")
    except (BundleError, KeyError, ValueError) as error:  # DataError, StoreError, QualityModelError: ValueErrors
        raise SystemExit(f"error: {error.args[0] if isinstance(error, KeyError) else error}") from None
    except OSError as error:
        raise SystemExit(f"error: {os_error_sentence(error)}") from None
    except KeyboardInterrupt:  # the bundle is rewritten atomically, at the very end
        raise SystemExit("interrupted: no bundle was written.") from None
    return 0


if __name__ == "__main__":
    main()
