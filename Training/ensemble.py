"""Five folds, one model: the ensemble bundle of a cross-validation's fold networks, with every choice made on
their out-of-fold predictions.

    calibseg-ensemble runs/ce_dice-cv                     # → runs/ce_dice-cv/ensemble.calibseg
    calibseg-ensemble runs/ce_dice-cv --out acdc_ce_dice.calibseg --data data/full

The folds of ``calibseg-train --fold all`` (or ``--fold K`` for every K) each validated on patients no other step
of their run saw; together they predict every labelled patient once, out of fold. nnU-Net ships such folds as an
ensemble; so does this command, as one bundle (``ensemble_size`` networks side by side, float16, their
probabilities averaged by the :class:`~CalibSegLib.inference.Predictor`, their disagreement a map of its own).

What the ensemble applies is chosen on the pooled out-of-fold predictions, each patient predicted by the fold
network that did not train on it, with the rules the trainer uses on one validation split
(:mod:`Training.choices`):

- test-time mirroring where it raises the out-of-fold Dice (never for folds trained with ``--mirroring off``);
- **one temperature**, applied to every member before the average, fitted on the out-of-fold voxels (all,
  foreground or none, whichever gives the lowest out-of-fold foreground ECE). Not each fold's own temperature:
  that one was fitted on 13 patients, the pooled one on all of them, and it is one number a reader can check;
- the largest component per class where it raises that class's out-of-fold Dice;
- the quality model (predicted Dice) fitted on every fold network's out-of-fold predictions under those settings,
  and its review threshold chosen on them by the review rule (:mod:`CalibSegLib.quality.review_rule`) from
  held-out predictions (a patient's own volumes never in the fit that predicts them). It is applied as it was
  fitted: to each member's own prediction, the members' predicted Dice averaged (:mod:`CalibSegLib.quality.members`),
  not to the smoother average of the five;
- the input check's statistics from the first member's training patients (:func:`judging_patients`), and its
  feature statistics from every member (:func:`member_patients`): each member's Gaussian from the patients it
  trained on, one distance threshold pooled over every member's distances of the fold it never saw, the majority
  of the members deciding (:func:`CalibSegLib.features.fit_member_features`).

What out-of-fold predictions cannot give: the ensemble's own behaviour on a labelled patient (four of its five
members trained on each one), so its disagreement is no candidate of the quality model fitted here; the test
patients, which no fold saw, measure the ensemble as shipped (``calibseg-evaluate``).

Writes the bundle (atomically) and ``ensemble.json`` beside it: the choices, the review rule's table and the
out-of-fold quality check (recall of poor structures, false flags among good ones, predicted-Dice error per
structure) with patient-level 95 % intervals.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from CalibSegLib.bundle import (Bundle, BundleError, BundleMetadata, Ensemble, EnsembleMember, load_bundle,
                                member_metadata, save_bundle)
from CalibSegLib.device import resolve_device
from CalibSegLib.feature_statistics import FeatureStatisticsError
from CalibSegLib.features import fit_member_features
from CalibSegLib.inference import Predictor
from CalibSegLib.input_check import statistics_of_cases
from CalibSegLib.io import check_output_file, os_error_sentence, recorded_path, write_json_atomic
from CalibSegLib.quality import (Observation, QualityModel, QualityModelError, fit_from_observations,
                                 held_out_predictions, observe_cases, structure_key)
from CalibSegLib.quality.model import APPLIED_TO, MEMBERS, thresholds_text
from CalibSegLib.quality.review_rule import (GOOD_ABOVE, POOR_BELOW, TARGET_RECALL, choose_review_rule, fold_numbers,
                                             flagged, trade_off)
from Datasets.errors import DataError
from Datasets.loading import Case
from Datasets.model_grid import to_model_grid
from Evaluation.bootstrap import mean_interval, ratio_interval
from Training.bundle_rewrite import recorded_cases
from Training.choices import (TEMPERATURE_FITS, ValidationPass, choose_largest_component, choose_temperature,
                              foreground_ece, mirrored, mirroring_choice, or_neutral, pooled,
                              validation_pass, volume_dice)
from Training.out_of_fold import complete_out_of_fold
from Training.records import BUNDLE_NAME, RUN_SUMMARY_NAME

__all__ = ["ENSEMBLE_NAME", "ENSEMBLE_RECORD", "MEMBER_PREFIX", "FoldRun", "read_folds", "member_metadata",
           "flag_counts", "flag_record",
           "out_of_fold_choices", "out_of_fold_quality", "quality_from_observations", "judging_patients",
           "member_patients", "member_cases", "build_ensemble", "main"]

ENSEMBLE_NAME = "ensemble.calibseg"  # in the cross-validation's folder by default
ENSEMBLE_RECORD = "ensemble.json"  # beside the bundle
MEMBER_PREFIX = "members"  # an ensemble's weights are members.<m>.<name>
# Settings every member must share: the ensemble runs them through one sliding window on one grid.
_SHARED = ("network", "network_kwargs", "in_channels", "num_classes", "spatial_dims", "class_names",
           "channel_names", "preprocessing")


@dataclass
class FoldRun:
    """One finished fold: its number, folder, bundle and out-of-fold (validation) volumes."""

    fold: int
    run_dir: Path
    bundle: Bundle
    cases: list[Case]


def _fold_number(folder: Path) -> int:
    return int(folder.name.split("_", 1)[1])


def read_folds(cross_validation: str | Path, data: str | Path | None = None) -> list[FoldRun]:
    """Every ``fold_K`` of a cross-validation folder, finished and checked to form one ensemble.

    Raises:
        DataError: no fold, an unfinished one, folds trained differently, on other test patients, or validating on
            one patient twice (one sentence each, before anything is predicted).
    """
    folder = Path(cross_validation)
    folders = sorted((path for path in folder.glob("fold_*") if path.is_dir() and path.name[5:].isdigit()),
                     key=_fold_number)
    if not folders:
        raise DataError(f"{folder} holds no fold_K folder; train the folds with calibseg-train --fold all --out "
                        f"{folder}.")
    unfinished = [path.name for path in folders if not (path / RUN_SUMMARY_NAME).is_file()]
    if unfinished:
        raise DataError(f"{', '.join(unfinished)} of {folder} did not finish; continue with calibseg-train --fold "
                        f"all --resume --out {folder} (same flags).")
    bundles = [load_bundle(path / BUNDLE_NAME) for path in folders]
    first = bundles[0].metadata
    for path, bundle in zip(folders[1:], bundles[1:]):
        differing = [name for name in _SHARED if getattr(bundle.metadata, name) != getattr(first, name)]
        if bundle.metadata.training.get("method") != first.training.get("method"):
            differing.append("method")
        if sorted(bundle.metadata.data.get("test") or []) != sorted(first.data.get("test") or []):
            differing.append("test patients")
        if differing:
            raise DataError(f"{path.name} differs from {folders[0].name} in {', '.join(differing)}, so they cannot "
                            "form one ensemble; give the folds of one cross-validation.")
    validated = [patient for bundle in bundles for patient in bundle.metadata.data.get("val") or []]
    if len(validated) != len(set(validated)):
        raise DataError(f"Two folds of {folder} validate on the same patient, so they are not one "
                        "cross-validation's; give the folds of one.")
    for path in folders:
        complete_out_of_fold(path, data)
    return [FoldRun(_fold_number(path), path, bundle,
                    recorded_cases(bundle.metadata, str(path / BUNDLE_NAME), data, "val", "predict out of fold"))
            for path, bundle in zip(folders, bundles)]


def _passes(folds: Sequence[FoldRun], settings: BundleMetadata, device: torch.device, batch_size: int
            ) -> ValidationPass:
    """Every fold network's pass over its own out-of-fold volumes under ``settings``, pooled."""
    passes = []
    for fold in folds:
        predictor = Predictor.from_network(fold.bundle.build_model(), settings, device=device, batch_size=batch_size)
        volumes = to_model_grid(fold.cases, settings.preprocessing, settings.num_classes)
        passes.append(validation_pass(predictor, volumes, batch_size))
    return pooled(passes)


def out_of_fold_choices(folds: Sequence[FoldRun], device: str = "auto", batch_size: int = 16,
                        temperature_fit: str = "auto", seed: int = 0) -> tuple[BundleMetadata, dict[str, Any]]:
    """Mirroring, temperature and post-processing for the ensemble of ``folds``, chosen on their pooled out-of-fold
    passes (module docstring): the members' settings (a single network's metadata, fold 0's otherwise) and the
    record of each choice."""
    device = resolve_device(device)
    base = dataclasses.replace(member_metadata(folds[0].bundle.metadata), temperature=1.0,
                               sliding_window=dataclasses.replace(folds[0].bundle.metadata.sliding_window,
                                                                  mirror_axes=()))
    num_classes = base.num_classes
    plain = _passes(folds, base, device, batch_size)
    if any(fold.bundle.metadata.training.get("mirroring") == "off" for fold in folds):
        chosen, validation, mirroring = base, plain, {"used": False, "why": "the folds were trained with "
                                                                           "--mirroring off"}
    else:
        with_mirroring = _passes(folds, mirrored(base), device, batch_size)
        used, mirroring = mirroring_choice(plain, with_mirroring, num_classes)
        chosen, validation = (mirrored(base), with_mirroring) if used else (base, plain)
        del plain, with_mirroring
    temperature, temperature_record = choose_temperature(validation, temperature_fit, seed)
    postprocessing, postprocessing_record = choose_largest_component(validation, num_classes)
    dice = float(np.nanmean(volume_dice(validation, postprocessing, num_classes)))
    choices = {"mirroring": mirroring, "temperature": temperature_record, "postprocessing": postprocessing_record,
               "out_of_fold_dice": dice, "out_of_fold_foreground_ece": foreground_ece(validation, temperature),
               "volumes": len(validation.logits)}
    return dataclasses.replace(chosen, temperature=temperature, postprocessing=postprocessing), choices


def _observations(folds: Sequence[FoldRun], settings: BundleMetadata, device: str, batch_size: int
                  ) -> list[Observation]:
    """Each fold network's out-of-fold volumes predicted under ``settings`` and measured."""
    return [observation for fold in folds
            for observation in observe_cases(Predictor.from_network(fold.bundle.build_model(), settings,
                                                                    device=device, batch_size=batch_size),
                                             fold.cases)]


def flag_counts(predicted: np.ndarray, measured: np.ndarray, patients: np.ndarray, thresholds: np.ndarray
                ) -> dict[str, Any]:
    """Recall among poor structures and false flags among good ones, with patient-level intervals, over
    ``(volumes, structures)`` arrays flagged at ``thresholds`` (broadcast against them: ``(structures,)``, or a
    threshold per volume and structure where each volume's were chosen on other patients)."""
    marked = flagged(predicted, thresholds)
    poor, good = measured < POOR_BELOW, measured > GOOD_ABOVE
    rows = np.repeat(patients, measured.shape[1])
    recall = ratio_interval((marked & poor).ravel(), poor.ravel(), rows)
    false_flags = ratio_interval((marked & good).ravel(), good.ravel(), rows)
    return {"poor": int(poor.sum()), "poor_flagged": int((marked & poor).sum()),
            "recall": dict(zip(("value", "low", "high"), recall)), "good": int(good.sum()),
            "good_flagged": int((marked & good).sum()),
            "false_flag_share": dict(zip(("value", "low", "high"), false_flags))}


def flag_record(predicted: np.ndarray, measured: np.ndarray, patients: np.ndarray, rule: dict[str, Any],
                structure_names: Sequence[str]) -> dict[str, Any]:
    """:func:`flag_counts` under the review ``rule`` (:func:`choose_review_rule`'s ``review_below`` and
    ``review_below_by_structure``), with the rule's thresholds."""
    by_structure = rule["review_below_by_structure"]
    thresholds = np.array([by_structure.get(name, rule["review_below"]) for name in structure_names])
    return {"review_below": rule["review_below"], "review_below_by_structure": dict(by_structure),
            **flag_counts(predicted, measured, patients, thresholds[None, :])}


def quality_from_observations(observations: Sequence[Observation], class_names: Sequence[str],
                              folds: Sequence[Sequence[str]]) -> tuple[QualityModel, dict[str, Any]]:
    """The quality model and review rule of an ensemble fitted on its fold networks' out-of-fold ``observations``
    (each volume by the member that never trained on it; ``folds``: each fold network's out-of-fold patients, which
    the rule is judged nested over), and the record of the rule's table and the held-out check
    (:func:`out_of_fold_quality`, which predicts them; ``calibseg-fit`` reads them from the store).

    Raises:
        QualityModelError: too few out-of-fold volumes show some structure.
        ValueError: an observation's patient in no fold, or fewer than two folds.
    """
    predicted = held_out_predictions(observations, class_names)
    measured = np.array([item.dice for item in observations])
    patients = np.array([item.patient for item in observations])
    table = trade_off(predicted, measured)
    rule = choose_review_rule(predicted, measured, class_names[1:], fold_numbers(patients, folds))
    fold_networks = len(folds)
    error = {}
    for index, name in enumerate(class_names[1:]):
        defined = ~np.isnan(predicted[:, index])
        value, low, high = mean_interval(np.abs(predicted[defined, index] - measured[defined, index]),
                                         patients[defined])
        error[structure_key(name)] = {"mae": value, "low": low, "high": high, "volumes": int(defined.sum())}
    record = {"fold_networks": fold_networks, "volumes": len(observations), "patients": len(set(patients)),
              "rule": {"poor_below": POOR_BELOW, "good_above": GOOD_ABOVE, "target_recall": TARGET_RECALL},
              "table": table, "by_structure": rule["by_structure"],
              "nested": {"pooled": rule["pooled_flags"], "per_structure": rule["per_structure_flags"]},
              "held_out": flag_record(predicted, measured, patients, rule, class_names[1:]), "held_out_mae": error}
    model = fit_from_observations(observations, class_names, review_below=rule["review_below"],
                                  validation={"fold_networks": fold_networks, "fold_patients": len(set(patients)),
                                              APPLIED_TO: MEMBERS},
                                  review_below_by_structure=rule["review_below_by_structure"])
    return model, record


def out_of_fold_quality(folds: Sequence[FoldRun], metadata: BundleMetadata, device: str = "auto",
                        batch_size: int = 16) -> tuple[QualityModel, dict[str, Any]]:
    """The quality model of an ensemble described by ``metadata``: fitted on every fold network's out-of-fold
    predictions under the ensemble's settings, its review threshold chosen by the review rule on held-out
    predictions; with the record of the rule's table and the out-of-fold check (recall, false flags and
    predicted-Dice error per structure, each with a patient-level interval).

    Raises:
        QualityModelError: too few out-of-fold volumes show some structure.
    """
    return quality_from_observations(_observations(folds, member_metadata(metadata), device, batch_size),
                                     metadata.class_names,
                                     [sorted({case.patient_id for case in fold.cases}) for fold in folds])


def _own_temperature(temperature: float | Sequence[float]) -> float | tuple[float, ...]:
    """A fold network's temperature as its ensemble member holds it: one number, or one per class as a tuple."""
    return tuple(temperature) if isinstance(temperature, (list, tuple)) else temperature


def _ensemble_metadata(folds: Sequence[FoldRun], settings: BundleMetadata, choices: dict[str, Any]
                       ) -> BundleMetadata:
    """The ensemble's metadata: the members' ``settings``, every fold's patients as its training patients (each
    trained four of the five members), the folds' test patients, and where each member came from."""
    first = folds[0].bundle.metadata
    labelled = sorted({patient for fold in folds for side in ("train", "val")
                       for patient in fold.bundle.metadata.data.get(side) or []})
    data = {"dataset": first.data.get("dataset"), "split_file": first.data.get("split_file"), "train": labelled,
            "val": [], "test": list(first.data.get("test") or [])}
    members = tuple(EnsembleMember(fold.fold, tuple(fold.bundle.metadata.data.get("val") or []),
                                   _own_temperature(fold.bundle.metadata.temperature),
                                   fold.bundle.metadata.training.get("best_epoch"), fold.bundle.metadata.weights_sha256)
                    for fold in folds)
    return dataclasses.replace(
        settings, ensemble_size=len(folds), data=data, test_metrics={},
        training={**first.training, "folds": len(folds)},
        validation_metrics={"out_of_fold_dice": choices["out_of_fold_dice"],
                            "out_of_fold_foreground_ece": choices["out_of_fold_foreground_ece"], "choices": choices},
        ensemble=Ensemble(members, "one, fitted on the out-of-fold predictions of all folds"))


def judging_patients(metadata: BundleMetadata) -> tuple[list[str], list[str]]:
    """The patients an ensemble bundle's input statistics come from: those its first member trained on (the four
    families), and the fold it never saw (a new patient is exchangeable with those, not with patients the ensemble
    trained on). A bundle judged through its first member alone (``features``, before ``member_features``) took its
    feature Gaussian and distance threshold from these too."""
    return member_patients(metadata)[0]


def member_patients(metadata: BundleMetadata) -> list[tuple[list[str], list[str]]]:
    """Per member of an ensemble bundle, the patients it trained on and the fold it never saw: its feature Gaussian
    comes from the first, its distances of the second set the pooled threshold."""
    return [(member.training_patients(metadata.data["train"]), list(member.validation))
            for member in metadata.ensemble.members]


def member_cases(metadata: BundleMetadata, cases: Sequence[Case]) -> tuple[list[list[Case]], list[list[Case]]]:
    """``cases`` (the ensemble's labelled patients') split per member by :func:`member_patients`: the cases each
    member trained on, and those it never saw (:func:`CalibSegLib.features.fit_member_features` takes both)."""
    split = member_patients(metadata)
    return ([[case for case in cases if case.patient_id in trained] for trained, _ in split],
            [[case for case in cases if case.patient_id in unseen] for _, unseen in split])


def _input_statistics(folds: Sequence[FoldRun], metadata: BundleMetadata, device: str, batch_size: int
                      ) -> tuple[dict[str, Any], str]:
    """The ensemble's input statistics: the four families on :func:`judging_patients`' training patients, the
    network's features from every member (:func:`member_patients`), each read at the member's own bottleneck.
    Features that cannot be fitted leave the statistics without them, and the record says why."""
    members = [fold.bundle.build_model().to(resolve_device(device)) for fold in folds]
    training, _ = judging_patients(metadata)
    cases = [case for fold in folds for case in fold.cases]
    try:
        features = fit_member_features(members, metadata, *member_cases(metadata, cases), batch_size)
        record = (f"every member's network features, distance threshold {features.threshold:.3g} pooled over "
                  f"{features.members[0].validation_volumes} out-of-fold volumes, the majority deciding")
    except FeatureStatisticsError as error:
        features, record = None, f"no network features: {error}"
    statistics = statistics_of_cases(metadata, [case for case in cases if case.patient_id in training],
                                     features=features)
    return statistics, f"from the {statistics['volumes']} training volumes; {record}"


def build_ensemble(cross_validation: str | Path, out: str | Path | None = None, data: str | Path | None = None,
                   device: str = "auto", batch_size: int = 16, temperature_fit: str = "auto"
                   ) -> tuple[Path, dict[str, Any]]:
    """Choose, fit and write the ensemble bundle of a cross-validation's folds (module docstring); returns its path
    and the record written beside it.

    Raises:
        DataError, BundleError, QualityModelError: unusable folds or data (one sentence each).
    """
    out = check_output_file(out or Path(cross_validation) / ENSEMBLE_NAME)  # before hours of predictions
    record_path = check_output_file(out.with_name(ENSEMBLE_RECORD))
    folds = read_folds(cross_validation, data)
    settings, choices = out_of_fold_choices(folds, device, batch_size, temperature_fit)
    metadata = _ensemble_metadata(folds, settings, choices)
    fitted: dict[str, Any] = {}
    quality = or_neutral("quality_model", lambda: out_of_fold_quality(folds, metadata, device, batch_size), None,
                          fitted)
    statistics = or_neutral("input_statistics", lambda: _input_statistics(folds, metadata, device, batch_size),
                            None, fitted)
    metadata = dataclasses.replace(metadata, quality_model=quality.to_dict() if quality is not None else None,
                                   input_statistics=statistics)
    state = {f"{MEMBER_PREFIX}.{index}.{name}": tensor for index, fold in enumerate(folds)
             for name, tensor in fold.bundle.state_dict.items()}
    half = all(fold.bundle.metadata.weights_dtype == "float16" for fold in folds)
    path = save_bundle(out, state, metadata, half=half)
    record = {"bundle": recorded_path(path), "folds": [recorded_path(fold.run_dir) for fold in folds],
              "choices": choices, "quality": fitted["quality_model"], "input_statistics": fitted["input_statistics"]}
    write_json_atomic(record_path, record)
    return path, record


def _lines(path: Path, record: dict[str, Any]) -> list[str]:
    """What the command prints: the choices, the review rule's out-of-fold check, where the files went."""
    choices, quality = record["choices"], record["quality"]
    temperature = choices["temperature"]
    chosen_temperature = temperature["candidates"][temperature["fitted_on"]]["temperature"]
    lines = [f"ensemble of {len(record['folds'])} folds, chosen on {choices['volumes']} out-of-fold volumes: "
             f"mirroring {'on' if choices['mirroring']['used'] else 'off'}, T = {chosen_temperature:.3f} "
             f"({temperature['fitted_on']}), largest component of classes "
             f"{choices['postprocessing']['largest_component'] or 'none'}",
             f"  out of fold: Dice {choices['out_of_fold_dice']:.3f}, foreground ECE "
             f"{choices['out_of_fold_foreground_ece']:.3f}"]
    if isinstance(quality, str):  # "none: <why>"
        lines.append(f"  no quality model: {quality}")
    else:
        held_out = quality["held_out"]
        recall, false_flags = held_out["recall"], held_out["false_flag_share"]
        thresholds = thresholds_text(held_out["review_below"], held_out["review_below_by_structure"])
        lines.append(f"  review below predicted Dice {thresholds}: {held_out['poor_flagged']} of "
                     f"{held_out['poor']} poor structures flagged ({recall['value']:.0%}, 95 % interval "
                     f"{recall['low']:.0%}-{recall['high']:.0%}), {held_out['good_flagged']} of {held_out['good']} "
                     f"good ones ({false_flags['value']:.0%}, {false_flags['low']:.0%}-{false_flags['high']:.0%})")
        lines += [f"  {name}: held-out predicted-Dice MAE {entry['mae']:.3f} ({entry['low']:.3f}-{entry['high']:.3f})"
                  for name, entry in quality["held_out_mae"].items()]
    return lines + [f"bundle: {path}", f"record: {path.with_name(ENSEMBLE_RECORD)}"]


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibseg-ensemble`` command: prints the choices and the bundle's path; returns the exit status 0. Bad
    input exits with one sentence, no traceback."""
    parser = argparse.ArgumentParser(prog="calibseg-ensemble", description=__doc__.split("\n\n")[0])
    parser.add_argument("cross_validation", type=Path, help="the folder holding fold_0 ... fold_K")
    parser.add_argument("--out", type=Path, default=None, help=f"the bundle (default <folder>/{ENSEMBLE_NAME})")
    parser.add_argument("--data", type=Path, default=None,
                        help="data folder (default: found from the dataset the folds record)")
    parser.add_argument("--temperature-fit", choices=TEMPERATURE_FITS, default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=16)
    arguments = parser.parse_args(argv)
    try:
        path, record = build_ensemble(arguments.cross_validation, arguments.out, arguments.data, arguments.device,
                                      arguments.batch_size, arguments.temperature_fit)
    except (BundleError, DataError, QualityModelError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    except OSError as error:
        raise SystemExit(f"error: {os_error_sentence(error)}") from None
    except KeyboardInterrupt:  # the bundle and its record are written atomically, at the very end
        raise SystemExit("interrupted: no ensemble was written.") from None
    print("\n".join(_lines(path, record)))
    return 0


if __name__ == "__main__":
    main()
