"""Which way of fitting the quality model predicts Dice best, decided on a bundle's validation patients only.

    python -m Training.quality_choice --bundle acdc_crac [--data DIR]

Every validation volume of the bundle (``bundle.json``: ``data["val"]``) is predicted as it is and,
for the procedures fitted on degraded copies too, again after each of :data:`FIT_DEGRADATIONS`;
its uncertainty features and measured Dice per structure are kept. Each procedure
(:data:`PROCEDURES`: which candidate features, fitted on which volumes) is then scored by
**nested** leave-one-patient-out: for every validation patient, the whole procedure of
:func:`CalibSegLib.quality.fit_from_observations` — the choice of feature and form by its own
leave-one-patient-out, then the fit — runs on the other patients' volumes and predicts that
patient's clean volumes. The printed table has, per structure, Spearman ρ and mean absolute
error of those held-out predictions against the measured Dice, and the feature chosen most
often; the test patients are never read.

The rule that added ``expected_dice`` to the shipped candidates was written down before these
numbers were read (docs/results.md, "Predicted Dice and the review flag: reading the tables"):
adopt a procedure over the shipped one if its mean ρ over the shipped models' structures is
higher and its mean MAE at most 0.002 higher.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from scipy.stats import spearmanr

from CalibSegLib.bundle import BundleError, load_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.quality import (FEATURES_WITHOUT_SIZE, QualityModel, QualityModelError, fit_from_observations,
                                  observe_case)
from Datasets.cases import Case, DataError
from Evaluation.quality_report import degraded_images
from Training.fit_quality import validation_cases

__all__ = ["CLEAN", "FIT_DEGRADATIONS", "PROCEDURES", "Observation", "Procedure", "observe_validation",
           "held_out_predictions", "fit_on", "nested_held_out", "rank_correlation", "choice_table", "main"]

CLEAN = "clean"
# Contrast inversion is left out of fitting: an over-confident model stays sharp on it, which would teach
# the fit that confident structures can have Dice 0.
FIT_DEGRADATIONS = ("gamma 3", "noise 10 %")


@dataclass(frozen=True)
class Observation:
    """One predicted volume: its ``variant`` (clean or a degradation), patient, features and Dice ``(C-1,)``."""

    variant: str
    patient: str
    features: list[dict[str, float] | None]
    dice: np.ndarray


@dataclass(frozen=True)
class Procedure:
    """A way of fitting: the candidate features, and the variants of the volumes it is fitted on."""

    name: str
    candidates: tuple[str, ...]
    fit_variants: tuple[str, ...]


# "All features" are those there were when this comparison was made and recorded: the six before the size.
_WITHOUT_EXPECTED = tuple(name for name in FEATURES_WITHOUT_SIZE if name != "expected_dice")
PROCEDURES: tuple[Procedure, ...] = (
    Procedure("without expected_dice", _WITHOUT_EXPECTED, (CLEAN,)),
    Procedure("all features (shipped)", FEATURES_WITHOUT_SIZE, (CLEAN,)),
    Procedure("without expected_dice, + degraded copies", _WITHOUT_EXPECTED, (CLEAN, *FIT_DEGRADATIONS)),
    Procedure("all features, + degraded copies", FEATURES_WITHOUT_SIZE, (CLEAN, *FIT_DEGRADATIONS)),
)


def observe_validation(predictor: Predictor, cases: Sequence[Case],
                       degradations: Sequence[str] = FIT_DEGRADATIONS) -> list[Observation]:
    """Features and measured Dice of every case, clean and after each of ``degradations`` (fixed noise seed)."""
    observations = []
    for variant in (CLEAN, *degradations):
        if variant == CLEAN:
            images = (case.image.astype(np.float32) for case in cases)
        else:
            images = degraded_images(cases, variant)
        for case, image in zip(cases, images, strict=True):
            features, dice = observe_case(predictor, image, case.label, case.spacing)
            observations.append(Observation(variant, case.patient_id, features, np.asarray(dice, dtype=np.float64)))
    return observations


def held_out_predictions(clean: Sequence[Observation], class_names: Sequence[str],
                         fit_without: Callable[[str], QualityModel],
                         ) -> dict[str, tuple[np.ndarray, np.ndarray, Counter]]:
    """Per structure: predicted and measured Dice of the ``clean`` volumes, each patient's predicted by the model
    ``fit_without(patient)`` returns (one built without that patient), and the features those models chose."""
    structures = list(class_names[1:])
    predicted: dict[str, list[float]] = {name: [] for name in structures}
    measured: dict[str, list[float]] = {name: [] for name in structures}
    chosen: dict[str, Counter] = {name: Counter() for name in structures}
    for patient in sorted({item.patient for item in clean}):
        model = fit_without(patient)
        for item in (item for item in clean if item.patient == patient):
            for index, name in enumerate(structures):
                if item.features[index] is None:  # predicted nowhere: flagged, no predicted Dice to score
                    continue
                quality = model.structures[name]
                predicted[name].append(quality.predict(item.features[index]))
                measured[name].append(float(item.dice[index]))
                chosen[name][quality.feature] += 1
    return {name: (np.array(predicted[name]), np.array(measured[name]), chosen[name]) for name in structures}


def fit_on(observations: Sequence[Observation], class_names: Sequence[str], **options: Any) -> QualityModel:
    """:func:`fit_from_observations` on ``observations``, a patient's volumes held out together; ``options`` are
    its keyword arguments (``candidates``, ``fixed``, ``averaged``)."""
    dice = np.array([item.dice for item in observations])
    return fit_from_observations([item.features for item in observations], dice, class_names,
                                 [item.patient for item in observations], **options)


def nested_held_out(observations: Sequence[Observation], class_names: Sequence[str],
                    procedure: Procedure) -> dict[str, tuple[np.ndarray, np.ndarray, Counter]]:
    """:func:`held_out_predictions` of the clean volumes, each patient's by ``procedure`` run on the other patients.

    Raises:
        QualityModelError: some fold has too few volumes predicting a structure.
    """
    def fit_without(patient: str) -> QualityModel:
        fitted_on = [item for item in observations
                     if item.variant in procedure.fit_variants and item.patient != patient]
        return fit_on(fitted_on, class_names, candidates=procedure.candidates)

    return held_out_predictions([item for item in observations if item.variant == CLEAN], class_names, fit_without)


def rank_correlation(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Spearman ρ of predicted against measured Dice; NaN when the predictions are all equal (no ranking)."""
    return float(spearmanr(predicted, measured).statistic) if np.ptp(predicted) > 0 else float("nan")


def choice_table(observations: Sequence[Observation], class_names: Sequence[str],
                 procedures: Sequence[Procedure] = PROCEDURES) -> list[str]:
    """Markdown rows: per procedure and structure, held-out ρ, MAE and the most chosen feature; then their means."""
    lines = ["| Procedure | Structure | ρ held-out | MAE held-out | feature chosen (folds) |",
             "| --- | --- | --- | --- | --- |"]
    for procedure in procedures:
        rhos, errors = [], []
        for name, (predicted, measured, chosen) in nested_held_out(observations, class_names, procedure).items():
            rho, error = rank_correlation(predicted, measured), float(np.abs(predicted - measured).mean())
            rhos.append(rho)
            errors.append(error)
            feature, folds = chosen.most_common(1)[0]
            lines.append(f"| {procedure.name} | {name} | {rho:+.3f} | {error:.4f} | {feature} "
                         f"({folds} of {sum(chosen.values())}) |")
        lines.append(f"| {procedure.name} | mean | {np.nanmean(rhos):+.3f} | {np.mean(errors):.4f} | |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Print the nested leave-one-patient-out table of a bundle; returns the exit status 0. Bad input exits with
    one sentence, no traceback."""
    parser = argparse.ArgumentParser(prog="python -m Training.quality_choice", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, help="bundle (.calibseg) or a shipped model's name")
    parser.add_argument("--data", type=Path, default=None,
                        help="data folder (default: found from the dataset the bundle records)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=16)
    arguments = parser.parse_args(argv)
    try:
        bundle = load_bundle(resolve_bundle_path(arguments.bundle))
        metadata = bundle.metadata
        cases = validation_cases(metadata, arguments.bundle, arguments.data, "compare")
        observations = observe_validation(Predictor(bundle, arguments.device, arguments.batch_size), cases)
        lines = choice_table(observations, metadata.class_names)
    except (BundleError, DataError, QualityModelError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    print(f"{arguments.bundle}: nested leave-one-patient-out on {len(cases)} validation volumes of "
          f"{len({case.patient_id for case in cases})} patients")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    main()
