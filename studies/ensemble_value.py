"""What the ensemble is for, measured: the shipped five-member ensemble against each member alone and every
three-member sub-ensemble, on the bundle's test patients (issue 63, item 4).

    OMP_NUM_THREADS=1 nice -n 5 python -m studies.ensemble_value pass acdc_ce_dice --data "$CALIBSEG_ACDC" \\
        --out <folder>
    python -m studies.ensemble_value report acdc_ce_dice --records <folder> \\
        --record docs/records/quality/acdc_ce_dice_ensemble_value.json
    python -m studies.ensemble_value table acdc_ce_dice --record docs/records/quality/acdc_ce_dice_ensemble_value.json

``pass``: every test volume is predicted once by each member alone under the ensemble's settings
(:func:`Training.ensemble.member_metadata`: its window, mirroring and post-processing) at the ensemble's temperature,
at the member's own fold temperature and at T = 1, and once by the shipped ensemble (its wall time, and a check that
the average of the members' maps is what it gives). Any subset's average of the members' probability maps is that
sub-ensemble (:func:`subset_maps`), so the five members alone, the ten three-member subsets and the five together
come from one pass. Per volume and configuration only compact statistics are kept: Dice and HD95 per structure, the
calibration metrics (:mod:`CalibSegLib.metrics`) with the foreground reliability sums, the error-detection AUROC of
every voxel and of the predicted-or-reference foreground, with histograms of the scores of wrong and right voxels
(:func:`score_histogram`) so that AUROCs can be pooled over any set of volumes, and each member's predicted Dice (the
bundle's quality model applied per member, as it was fitted). One JSON per volume under ``<folder>`` (temporary
name, then rename); a volume already written is skipped, so a stopped pass goes on where it stopped.

``report``: means over the volumes with 95 % patient-bootstrap intervals (:mod:`Evaluation.bootstrap`), the
ensemble's paired differences against the members' mean and the three-member subsets' mean, the review flag's recall
and false flags at the bundle's threshold, predicted-Dice MAE, cost, and the single networks' out-of-fold numbers
from the bundle's metrics file (no ensemble prediction of a cross-validation patient exists: four of the five
members trained on each one).

It runs the networks rather than reading the store: its sub-ensembles, calibration sums, HD95 and voxel AUROCs are
made of the members' probability maps, which the store does not keep.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from CalibSegLib.bundle import BundleError, load_bundle
from CalibSegLib.inference import Predictor, confidence_maps, ensemble_average
from CalibSegLib.io import recorded_path, write_json_atomic
from CalibSegLib.metrics import dice, error_detection_auroc, hd95
from CalibSegLib.metrics.calibration import CalibrationStatistics, masked_probabilities
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.quality import structure_features, structure_key
from CalibSegLib.quality.members import combined_predicted_dice, member_predicted_dice
from CalibSegLib.quality.review_rule import GOOD_ABOVE, POOR_BELOW, flagged
from Datasets.dataset_names import data_folder
from Datasets.errors import DataError
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Datasets.splits import select_patients
from Evaluation.bootstrap import group_draws, mean_interval, paired_difference, ratio_interval
from Training.ensemble import member_metadata

__all__ = ["SCORE_EDGES", "subsets", "subset_maps", "score_histogram", "histogram_auroc", "run_pass", "report",
           "table", "main"]

# Bins of an error score (1 - confidence, or the members' disagreement), both in [0, 1]: [0, 1e-8), then 1000 bins
# equally spaced in log10 from 1e-8 to 1 (each 1.9 % wide), so the many voxels near full confidence are told apart.
SCORE_EDGES = np.concatenate([[0.0], np.logspace(-8.0, 0.0, 1001)])
SMALLER_SIZE = 3  # the smaller ensemble: every three of the five members
REGIONS = ("every_voxel", "foreground")  # the whole volume; the predicted or the reference foreground


def subsets(members: int, size: int) -> list[tuple[int, ...]]:
    """Every ``size`` of ``members`` member indices, in lexicographic order."""
    return list(itertools.combinations(range(members), size))


def subset_maps(member_probabilities: Sequence[np.ndarray], subset: Sequence[int]
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """The sub-ensemble of the members ``subset`` of ``member_probabilities`` (each ``(C, z, y, x)``, at the
    temperature the ensemble applies to each): their average ``(C, z, y, x)`` and their disagreement ``(z, y, x)``
    (None for one member), as the predictor combines members (:func:`CalibSegLib.inference.ensemble_average`)."""
    average, disagreement = ensemble_average((torch.from_numpy(member_probabilities[index])[None]
                                              for index in subset), len(subset))
    return average[0].numpy(), None if disagreement is None else disagreement[0].numpy()


def score_histogram(score: np.ndarray, wrong: np.ndarray, edges: np.ndarray = SCORE_EDGES) -> np.ndarray:
    """``(2, len(edges) - 1)`` int64 counts of the wrong (row 0) and right (row 1) voxels per bin of an error
    ``score`` (higher: more likely wrong); bin i is ``[edges[i], edges[i + 1])``, the last one closed."""
    score = np.asarray(score, np.float64).ravel()
    wrong = np.asarray(wrong, bool).ravel()
    bins = np.clip(np.searchsorted(edges, score, side="right") - 1, 0, len(edges) - 2)
    counts = len(edges) - 1
    return np.stack([np.bincount(bins[wrong], minlength=counts), np.bincount(bins[~wrong], minlength=counts)])


def histogram_auroc(histogram: np.ndarray) -> float:
    """Error-detection AUROC of a :func:`score_histogram`: P(a wrong voxel's score bin is above a right voxel's),
    voxels in one bin counting one half (:func:`CalibSegLib.metrics.error_detection_auroc` of the binned scores);
    NaN when every voxel is right or every one wrong."""
    wrong, right = np.asarray(histogram, np.float64)
    n_wrong, n_right = wrong.sum(), right.sum()
    if n_wrong == 0 or n_right == 0:
        return float("nan")
    right_below = np.cumsum(right) - right  # right voxels in lower bins than each bin
    return float((wrong * (right_below + right / 2.0)).sum() / (n_wrong * n_right))


def _calibration(probabilities: np.ndarray, reference: np.ndarray, reliability: bool = False) -> dict[str, Any]:
    """The library's calibration metrics over the reference foreground, ``ece_all`` over every voxel, and with
    ``reliability`` the foreground's per-bin sums (to pool a reliability diagram)."""
    foreground = CalibrationStatistics(probabilities.shape[0])
    foreground.add(*masked_probabilities(probabilities, reference))
    everywhere = CalibrationStatistics(probabilities.shape[0], track_tace=False)
    everywhere.add(*masked_probabilities(probabilities, reference, np.ones(reference.shape, bool)))
    values: dict[str, Any] = {**foreground.metrics(), "ece_all": everywhere.ece(),
                              "class_ece": foreground.class_ece().tolist()}
    if reliability:
        values["reliability"] = {"count": foreground.bin_count.tolist(),
                                 "confidence": foreground.bin_confidence.tolist(),
                                 "correct": foreground.bin_correct.tolist()}
    return values


def _error_detection(labels: np.ndarray, confidence: np.ndarray, disagreement: np.ndarray | None,
                     reference: np.ndarray) -> dict[str, Any]:
    """Per region (:data:`REGIONS`) and score (1 - confidence; the disagreement for an ensemble): the exact AUROC of
    the volume's wrong voxels and the score's :func:`score_histogram`, sparse (``[[bin, wrong, right], ...]``)."""
    wrong = labels != reference
    masks = {"every_voxel": np.ones(reference.shape, bool), "foreground": (labels > 0) | (reference > 0)}
    scores = {"confidence": 1.0 - confidence.astype(np.float64)}
    if disagreement is not None:
        scores["disagreement"] = disagreement.astype(np.float64)
    values: dict[str, Any] = {}
    for region, mask in masks.items():
        for name, score in scores.items():
            histogram = score_histogram(score[mask], wrong[mask])
            filled = np.flatnonzero(histogram.sum(axis=0))
            values[f"{region}_{name}"] = {
                "auroc": error_detection_auroc(-score[mask], ~wrong[mask]),
                "histogram": [[int(index), int(histogram[0, index]), int(histogram[1, index])] for index in filled]}
    return values


def _configurations(members: int) -> dict[str, tuple[int, ...]]:
    """Name → member indices: the ensemble, each member alone, each three-member subset."""
    named = {"ensemble": tuple(range(members))}
    named |= {f"member{index}": (index,) for index in range(members)}
    named |= {"members_" + "".join(str(index) for index in subset): subset
              for subset in subsets(members, SMALLER_SIZE)}
    return named


def _volume_record(case: Any, metadata: Any, member_predictors: Sequence[Predictor], ensemble: Predictor
                   ) -> dict[str, Any]:
    """Every configuration's statistics of one volume (module docstring)."""
    num_classes = metadata.num_classes
    reference = np.asarray(case.label).astype(np.int64)
    own = [member.own_temperature for member in metadata.ensemble.members]
    temperatures = {"ensemble": [], "own": [], "one": []}  # each member's probabilities at T_ens, its own T, T = 1
    seconds, features = [], []
    for index, predictor in enumerate(member_predictors):
        start = time.perf_counter()
        variants = predictor.predict_variants(case.image, case.spacing, [metadata.temperature, own[index], 1.0],
                                              keep_probabilities=True)
        seconds.append(time.perf_counter() - start)
        for name, variant in zip(temperatures, variants):
            temperatures[name].append(variant.probabilities)
        model = metadata.quality
        features.append(structure_features(variants[0], num_classes, model.low_confidence_threshold,
                                           model.boundary_ring, case.spacing))
    predicted = member_predicted_dice(metadata.quality, features, metadata.class_names)
    start = time.perf_counter()
    shipped = ensemble.predict(case.image, case.spacing, keep_probabilities=True)
    ensemble_seconds = time.perf_counter() - start
    configurations = {}
    for name, subset in _configurations(len(member_predictors)).items():
        probabilities, disagreement = subset_maps(temperatures["ensemble"], subset)
        labels, confidence, _ = (array[0].numpy() for array in confidence_maps(torch.from_numpy(probabilities)[None]))
        metadata.postprocessing.apply(labels)
        entry: dict[str, Any] = {
            "members": list(subset),
            "dice": dice(labels, reference, num_classes).tolist(),
            "hd95": hd95(labels, reference, num_classes, case.spacing).tolist(),
            "predicted_dice": combined_predicted_dice(predicted[list(subset)]).tolist(),
            "calibration": {"ensemble": _calibration(probabilities, reference, reliability=True),
                            "one": _calibration(subset_maps(temperatures["one"], subset)[0], reference)},
            "error_detection": _error_detection(labels, confidence, disagreement, reference)}
        if len(subset) == 1:
            entry["calibration"]["own"] = _calibration(temperatures["own"][subset[0]], reference)
        configurations[name] = entry
    whole = configurations["ensemble"]
    average = subset_maps(temperatures["ensemble"], whole["members"])[0]
    shipped_dice = dice(shipped.labels, reference, num_classes)
    check = {"largest_probability_difference": float(np.abs(average - shipped.probabilities).max()),
             "dice_difference": float(np.abs(np.asarray(whole["dice"]) - shipped_dice).max())}
    return {"case": case.case_id, "patient": case.patient_id, "shape": list(case.image.shape),
            "spacing": list(case.spacing), "temperature": {"ensemble": metadata.temperature, "own": own},
            "seconds": {"members": seconds, "ensemble": ensemble_seconds}, "shipped_check": check,
            "member_predicted_dice": predicted.tolist(), "configurations": configurations}


def run_pass(bundle_name: str, out: Path, data: Path | None = None, batch_size: int = 16) -> int:
    """Write the record of every test volume of ``bundle_name`` not yet under ``out``; returns how many were
    written."""
    bundle = load_bundle(resolve_bundle_path(bundle_name))
    metadata = bundle.metadata
    if metadata.ensemble_size < 2 or metadata.quality is None:
        raise DataError(f"{bundle_name} is not an ensemble with a quality model.")
    settings = member_metadata(metadata)
    member_predictors = [Predictor.from_network(member, settings, device="cpu", batch_size=batch_size)
                         for member in bundle.build_model().eval().members]
    ensemble = Predictor(bundle, device="cpu", batch_size=batch_size)
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for case_file in select_patients(find_cases(data_folder(metadata.data, data)), metadata.data["test"]):
        target = out / f"{case_file.case_id}.json"
        if target.exists():
            continue
        case = load_cases([case_file], metadata.num_classes)[0]
        record = _volume_record(case, metadata, member_predictors, ensemble)
        write_json_atomic(target, record)
        written += 1
        alone = ", ".join(f"{np.mean(record['configurations'][f'member{index}']['dice']):.3f}"
                          for index in range(len(member_predictors)))
        print(f"{case.case_id}: ensemble Dice {np.mean(record['configurations']['ensemble']['dice']):.3f}, members "
              f"{alone}; {sum(record['seconds']['members']):.0f} s members, {record['seconds']['ensemble']:.0f} s "
              "ensemble", flush=True)
    return written


# ---------------------------------------------------------------------------------------------------------- report

def _interval(values: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    mean, low, high = mean_interval(values, groups)
    return {"mean": mean, "low": low, "high": high}


def _ratio(numerator: np.ndarray, denominator: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    ratio, low, high = ratio_interval(numerator, denominator, groups)
    return {"share": ratio, "low": low, "high": high, "count": int(np.sum(numerator)), "of": int(np.sum(denominator))}


def _volume_metrics(entry: dict[str, Any], structures: Sequence[str], calibration: str = "ensemble"
                    ) -> dict[str, float]:
    """One configuration's scalar metrics of one volume."""
    values: dict[str, float] = {}
    for metric in ("dice", "hd95"):
        per_structure = np.asarray(entry[metric], np.float64)
        values |= {f"{metric}_{name}": float(value) for name, value in zip(structures, per_structure)}
        values[f"{metric}_mean"] = float(np.nanmean(per_structure))
    chosen = entry["calibration"][calibration]
    values |= {key: float(chosen[key]) for key in ("ece", "ece_all", "cece", "tace", "brier", "nll")}
    values["ece_at_t1"] = float(entry["calibration"]["one"]["ece"])
    values["cece_at_t1"] = float(entry["calibration"]["one"]["cece"])
    for key, detection in entry["error_detection"].items():
        values[f"auroc_{key}"] = float(detection["auroc"])
    error = np.abs(np.asarray(entry["predicted_dice"]) - np.asarray(entry["dice"]))
    values |= {f"predicted_dice_error_{name}": float(value) for name, value in zip(structures, error)}
    return values


def _histogram(entry: dict[str, Any], key: str) -> np.ndarray:
    dense = np.zeros((2, len(SCORE_EDGES) - 1))
    for index, wrong, right in entry["error_detection"][key]["histogram"]:
        dense[:, index] = wrong, right
    return dense


def _pooled_auroc(histograms: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    """AUROC of ``(volumes, 2, bins)`` histograms summed over the volumes, with its patient-bootstrap interval."""
    draws = group_draws(groups)
    pooled = histogram_auroc(histograms.sum(axis=0))
    if draws is None:  # fewer than three patients
        return {"auroc": pooled, "low": float("nan"), "high": float("nan")}
    resampled = [histogram_auroc(np.tensordot(weights, histograms, axes=1)) for weights in draws]
    low, high = np.nanpercentile(resampled, [2.5, 97.5])
    return {"auroc": pooled, "low": float(low), "high": float(high)}


def _flags(predicted: np.ndarray, measured: np.ndarray, groups: np.ndarray, review_below: float
           ) -> dict[str, dict[str, float]]:
    """Recall of the poor structures, share of good ones flagged, and precision (the flagged that are poor); rows
    are (volume, structure) pairs."""
    marked = flagged(predicted, review_below)
    poor, good = measured < POOR_BELOW, measured > GOOD_ABOVE
    return {"poor_caught": _ratio(marked & poor, poor, groups), "good_flagged": _ratio(marked & good, good, groups),
            "flagged_poor": _ratio(marked & poor, marked, groups)}


def _group_summary(records: Sequence[dict[str, Any]], names: Sequence[str], structures: Sequence[str],
                   groups: np.ndarray, review_below: float, calibration: str = "ensemble") -> dict[str, Any]:
    """Means with intervals of the configurations ``names`` taken together: each volume's value is their mean
    (flags: their (volume, structure, configuration) rows pooled); ``per_configuration`` their own means."""
    metrics = [[_volume_metrics(record["configurations"][name], structures, calibration) for name in names]
               for record in records]
    keys = list(metrics[0][0])
    table = {key: np.array([[row[key] for row in volume] for volume in metrics]) for key in keys}  # (volumes, names)
    summary: dict[str, Any] = {"configurations": list(names),
                               "metrics": {key: _interval(np.nanmean(values, axis=1), groups)
                                           for key, values in table.items()}}
    summary["per_configuration"] = {key: [float(np.nanmean(values[:, column])) for column in range(len(names))]
                                    for key, values in table.items()}
    predicted = np.array([[record["configurations"][name]["predicted_dice"] for name in names] for record in records])
    measured = np.array([[record["configurations"][name]["dice"] for name in names] for record in records])
    rows = np.repeat(groups, len(names) * len(structures))
    summary["flag"] = _flags(predicted.ravel(), measured.ravel(), rows, review_below)
    summary["flag_per_configuration"] = [
        _flags(predicted[:, column].ravel(), measured[:, column].ravel(), np.repeat(groups, len(structures)),
               review_below) for column in range(len(names))]
    for key in ("every_voxel_confidence", "foreground_confidence", "every_voxel_disagreement",
                "foreground_disagreement"):
        if key in records[0]["configurations"][names[0]]["error_detection"]:
            histograms = np.array([sum(_histogram(record["configurations"][name], key) for name in names)
                                   for record in records])
            summary[f"pooled_auroc_{key}"] = _pooled_auroc(histograms, groups)
    summary["table"] = table
    return summary


def _out_of_fold(metrics: dict[str, Any], review_below: float) -> dict[str, Any]:
    """The single fold networks' out-of-fold numbers the bundle's metrics file holds (each cross-validation patient
    by the member that never trained on it, at the ensemble's temperature)."""
    summary = metrics["out_of_fold"]["summary"]
    quality = metrics["out_of_fold"]["ensemble"]["quality"]
    row = next(row for row in quality["table"] if abs(row["review_below"] - review_below) < 1e-9)
    return {"volumes": summary["volumes"], "patients": summary["patients"],
            "at_ensemble_temperature": {key: summary["variants"]["scaled"][key]
                                        for key in ("dice_mean", "hd95_mean", "ece", "cece", "tace", "brier",
                                                    "error_auroc")},
            "at_t1": {key: summary["variants"]["uncalibrated"][key] for key in ("ece", "cece")},
            "review_flag": {key: row[key] for key in ("review_below", "poor", "poor_flagged", "recall", "good",
                                                      "good_flagged", "false_flag_share")},
            "why_no_ensemble": "every cross-validation patient was trained on by four of the five members, so no "
                               "ensemble of two or more members predicts any of them out of fold"}


def report(bundle_name: str, folder: Path, metrics_file: Path, command: str) -> dict[str, Any]:
    """The record (module docstring) from the per-volume records under ``folder``."""
    bundle_path = resolve_bundle_path(bundle_name)
    metadata = load_bundle(bundle_path).metadata
    records = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
    if not records:
        raise DataError(f"No per-volume records under {folder}; run the pass first.")
    structures = [structure_key(name) for name in metadata.class_names[1:]]
    groups = np.array([record["patient"] for record in records])
    review_below = metadata.quality.review_below
    members = metadata.ensemble_size
    trios = [name for name in _configurations(members) if name.startswith("members_")]
    single = [f"member{index}" for index in range(members)]
    summaries = {
        "ensemble": _group_summary(records, ["ensemble"], structures, groups, review_below),
        "single_members": _group_summary(records, single, structures, groups, review_below),
        "single_members_own_temperature": _group_summary(records, single, structures, groups, review_below, "own"),
        "three_members_all_subsets": _group_summary(records, trios, structures, groups, review_below),
        "members_012": _group_summary(records, ["members_012"], structures, groups, review_below)}
    reference = summaries["ensemble"].pop("table")
    summaries["ensemble"]["disagreement_minus_confidence"] = {
        region: paired_difference(reference[f"auroc_{region}_disagreement"][:, 0],
                                  reference[f"auroc_{region}_confidence"][:, 0], groups) for region in REGIONS}
    for name in ("single_members", "three_members_all_subsets"):
        table = summaries[name].pop("table")
        summaries[name]["ensemble_minus_this"] = {
            key: paired_difference(reference[key][:, 0], np.nanmean(table[key], axis=1), groups) for key in table}
    for name in ("single_members_own_temperature", "members_012"):
        summaries[name].pop("table")
    member_seconds = np.array([record["seconds"]["members"] for record in records])
    ensemble_seconds = np.array([record["seconds"]["ensemble"] for record in records])
    parameters = sum(tensor.numel() for tensor in load_bundle(bundle_path).state_dict.values())
    binning = [abs(histogram_auroc(_histogram(record["configurations"][name], key))
                   - record["configurations"][name]["error_detection"][key]["auroc"])
               for record in records for name in ("ensemble", "member0")
               for key in record["configurations"][name]["error_detection"]]
    checks = np.array([[record["shipped_check"]["largest_probability_difference"],
                        record["shipped_check"]["dice_difference"]] for record in records])
    return {
        "bundle": bundle_name, "weights_sha256": metadata.weights_sha256, "command": command,
        "volumes": len(records), "patients": int(len(set(groups))),
        "structures": structures, "temperature": records[0]["temperature"], "review_below": review_below,
        "interval": "95 % percentile bootstrap over patients (Evaluation.bootstrap, 2000 resamples, seed 2024)",
        "definitions": {
            "single_members": "each member alone under the ensemble's settings and temperature; a volume's value is "
                              "the five members' mean, per_configuration each member's own mean",
            "three_members_all_subsets": "every 3 of the 5 members averaged, as the predictor averages members; a "
                                         "volume's value is the ten subsets' mean",
            "calibration": "ece, cece, tace, brier, nll over the reference foreground; ece_all over every voxel; "
                           "at the ensemble's temperature (single_members_own_temperature: each member's own fold "
                           "temperature); ece_at_t1 at T = 1",
            "error_detection": "AUROC of per-voxel wrongness by 1 - confidence and by the members' disagreement, "
                               "per volume then averaged (auroc_*), and pooled over the volumes' histograms "
                               "(pooled_auroc_*); every_voxel or the predicted-or-reference foreground",
            "flag": f"predicted Dice below {review_below} or predicted nowhere; poor: measured below {POOR_BELOW}, "
                    f"good: above {GOOD_ABOVE}; rows are (volume, structure[, configuration])",
            "predicted_dice": "each member's own predicted Dice (the bundle's quality model per member); a "
                              "sub-ensemble's is its members' mean, as the shipped ensemble's"},
        "summaries": summaries,
        "cost": {"seconds_per_volume_member": _interval(member_seconds.mean(axis=1), groups),
                 "seconds_per_volume_members_summed": _interval(member_seconds.sum(axis=1), groups),
                 "seconds_per_volume_ensemble": _interval(ensemble_seconds, groups),
                 "bundle_bytes": bundle_path.stat().st_size, "parameters": int(parameters),
                 "parameters_per_member": int(parameters // members),
                 "how": "wall time of Predictor.predict per volume on this 2-core CPU with one torch thread, "
                        "shared with other work; a member alone with three temperatures' probabilities kept, the "
                        "ensemble as shipped (members' maps kept for its quality model)"},
        "shipped_check": {"largest_probability_difference": float(checks[:, 0].max()),
                          "largest_dice_difference": float(checks[:, 1].max())},
        "binned_auroc_largest_difference": float(np.nanmax(binning)),
        "out_of_fold_single_network": _out_of_fold(json.loads(metrics_file.read_text()), review_below)}


# (row label, metric key, digits) of the comparison table
_ROWS: tuple[tuple[str, str, int], ...] = (
    ("Dice right ventricle", "dice_right_ventricle", 3), ("Dice myocardium", "dice_myocardium", 3),
    ("Dice left ventricle", "dice_left_ventricle", 3), ("Dice mean", "dice_mean", 3),
    ("HD95 mean (mm)", "hd95_mean", 2),
    ("ECE, reference foreground", "ece", 4), ("ECE, every voxel", "ece_all", 4), ("class-wise ECE", "cece", 4),
    ("ECE at T = 1", "ece_at_t1", 4), ("Brier", "brier", 3), ("NLL", "nll", 3),
    ("error AUROC by 1 − confidence, every voxel", "auroc_every_voxel_confidence", 4),
    ("error AUROC by 1 − confidence, foreground", "auroc_foreground_confidence", 3),
    ("error AUROC by disagreement, every voxel", "auroc_every_voxel_disagreement", 4),
    ("error AUROC by disagreement, foreground", "auroc_foreground_disagreement", 3),
    ("predicted-Dice MAE right ventricle", "predicted_dice_error_right_ventricle", 3),
    ("predicted-Dice MAE myocardium", "predicted_dice_error_myocardium", 3),
    ("predicted-Dice MAE left ventricle", "predicted_dice_error_left_ventricle", 3))


def _cell(values: dict[str, float], digits: int, spread: Sequence[float] | None = None) -> str:
    """``mean [low, high]`` and, for a group of configurations, their range in parentheses."""
    text = f"{values['mean']:.{digits}f} [{values['low']:.{digits}f}, {values['high']:.{digits}f}]"
    if spread is not None and len(spread) > 1:
        text += f" ({min(spread):.{digits}f}–{max(spread):.{digits}f})"
    return text


def _difference(values: dict[str, float], digits: int) -> str:
    return f"{values['difference']:+.{digits}f} [{values['low']:+.{digits}f}, {values['high']:+.{digits}f}]"


def _flag_cell(flag: dict[str, Any], per_configuration: Sequence[dict[str, Any]] | None = None) -> str:
    text = f"{flag['count']}/{flag['of']} = {flag['share']:.2f} [{flag['low']:.2f}, {flag['high']:.2f}]"
    if per_configuration is not None and len(per_configuration) > 1:
        text += f" ({min(row['share'] for row in per_configuration):.2f}–" \
                f"{max(row['share'] for row in per_configuration):.2f})"
    return text


def table(record: dict[str, Any]) -> str:
    """The record's comparison as a Markdown table: means [95 % patient interval] (range over the configurations)."""
    summaries = record["summaries"]
    columns = ("ensemble", "single_members", "three_members_all_subsets", "members_012")
    lines = ["| | five members (shipped) | one member: mean of 5 (range) | three members: mean of 10 subsets (range) "
             "| members 0, 1, 2 | ensemble − one member | ensemble − three members |", "|" + " --- |" * 7]
    for label, key, digits in _ROWS:
        cells = []
        for column in columns:
            metrics = summaries[column]["metrics"]
            cells.append(_cell(metrics[key], digits, summaries[column]["per_configuration"][key])
                         if key in metrics else "—")
        for column in ("single_members", "three_members_all_subsets"):
            differences = summaries[column]["ensemble_minus_this"]
            cells.append(_difference(differences[key], digits) if key in differences else "—")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    own = summaries["single_members_own_temperature"]
    lines.append("| ECE, reference foreground, member at its own fold temperature | — | "
                 f"{_cell(own['metrics']['ece'], 4, own['per_configuration']['ece'])} | — | — | — | — |")
    for label, key in (("poor structures (< 0.80) flagged", "poor_caught"),
                       ("good structures (> 0.90) flagged", "good_flagged"),
                       ("flagged structures that are poor (precision)", "flagged_poor")):
        cells = [_flag_cell(summaries[column]["flag"][key],
                            [row[key] for row in summaries[column]["flag_per_configuration"]]) for column in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " | — | — |")
    cost = record["cost"]
    member = cost["seconds_per_volume_member"]["mean"]
    lines.append(f"| seconds per volume (measured: ensemble as shipped, member alone) | "
                 f"{cost['seconds_per_volume_ensemble']['mean']:.1f} | {member:.1f} | {3 * member:.1f} (3 members' "
                 f"sum) | {3 * member:.1f} | — | — |")
    megabytes = cost["bundle_bytes"] / 1e6
    lines.append(f"| size (MB; the shipped file, members in proportion) | {megabytes:.1f} | {megabytes / 5:.1f} | "
                 f"{megabytes * 3 / 5:.1f} | {megabytes * 3 / 5:.1f} | — | — |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Returns 0; bad input exits with one sentence."""
    parser = argparse.ArgumentParser(prog="python -m studies.ensemble_value", description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("pass", "report", "table"))
    parser.add_argument("bundle", help="a shipped ensemble's name or a .calibseg path")
    parser.add_argument("--data", type=Path, default=None, help="pass: the data folder (else CALIBSEG_ACDC)")
    parser.add_argument("--out", type=Path, help="pass: folder of the per-volume records")
    parser.add_argument("--records", type=Path, help="report: the pass's folder")
    parser.add_argument("--metrics", type=Path, default=None,
                        help="report: the bundle's metrics file (default: beside the shipped bundle)")
    parser.add_argument("--record", type=Path, help="report: the JSON record to write; table: the record to show")
    arguments = parser.parse_args(argv)
    try:
        if arguments.step == "pass":
            if arguments.out is None:
                raise DataError("The pass needs --out, the folder of its per-volume records.")
            torch.set_num_threads(1)  # the shared 2-core CPU: two threads of two processes wait on each other
            written = run_pass(arguments.bundle, arguments.out, arguments.data)
            print(f"{written} volumes written under {arguments.out}")
            return 0
        if arguments.step == "table":
            if arguments.record is None:
                raise DataError("The table needs --record, the report's JSON.")
            print(table(json.loads(arguments.record.read_text())))
            return 0
        if arguments.records is None or arguments.record is None:
            raise DataError("The report needs --records (the pass's folder) and --record (the JSON to write).")
        metrics = arguments.metrics or resolve_bundle_path(arguments.bundle).with_suffix(".metrics.json")
        command = (f"python -m studies.ensemble_value report {arguments.bundle} --records <folder> "
                   f"--record {recorded_path(arguments.record)}")
        write_json_atomic(arguments.record, report(arguments.bundle, arguments.records, metrics, command))
    except (BundleError, DataError, OSError) as error:
        raise SystemExit(f"error: {error}") from None
    print(f"written {arguments.record}")
    return 0


if __name__ == "__main__":
    main()
