"""The end-of-run choices, made on the validation volumes for the best weights, as nnU-Net chooses its
post-processing after training: test-time mirroring, the temperature, largest-component post-processing and the
quality model; and what the training volumes looked like, for the input check. Each returns the setting for the
bundle and the numbers behind it for ``run.json``.

No choice may lose a trained run: one that fails falls back to its neutral setting (no mirroring, T = 1, no
post-processing, no quality model, no input statistics), and ``run.json`` and the console say
``"<choice>: none: <why>"``. ``calibseg-train --out RUN --resume`` on a finished run makes them again from
its checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
import torch

from CalibSegLib.bundle import BundleMetadata
from CalibSegLib.inference import Predictor
from CalibSegLib.feature_statistics import FeatureStatisticsError
from CalibSegLib.features import fit_network_features
from CalibSegLib.input_check import statistics_of_cases
from CalibSegLib.metrics import CalibrationStatistics, dice
from CalibSegLib.metrics.calibration import masked_probabilities
from CalibSegLib.postprocessing import Postprocessing, choose_postprocessing
from CalibSegLib.quality import QualityModel, fit_quality_model
from CalibSegLib.temperature import apply_temperature, fit_temperature
from Datasets.loading import Case
from Datasets.model_grid import GridVolume

__all__ = ["MIRRORING", "TEMPERATURE_FITS", "ValidationPass", "validation_pass", "volume_dice", "foreground_ece",
           "choose_mirroring", "mirrored", "mirroring_choice", "pooled",
           "choose_temperature", "choose_largest_component", "fit_quality", "input_statistics", "or_neutral",
           "make_choices"]

# "auto": mirror at test time where it raises the validation Dice; "off": never (the papers' protocol).
MIRRORING: tuple[str, ...] = ("auto", "off")
# "none" ships T = 1: a fitted temperature is only worth shipping where it lowers the validation foreground ECE.
TEMPERATURE_FITS: tuple[str, ...] = ("auto", "all", "foreground", "none")
# Temperature scaling fits one number: a million validation voxels pin it down to well under 1 %.
_TEMPERATURE_VOXELS = 1_000_000

Setting = TypeVar("Setting")


@dataclass
class ValidationPass:
    """Logits of every validation volume on the model's grid, with the labels they are scored against."""

    logits: list[torch.Tensor]  # per volume (z, C, y, x) float32, CPU
    labels: list[torch.Tensor]  # per volume (z, y, x) int64, CPU


def validation_pass(predictor: Predictor, volumes: Sequence[GridVolume], batch_size: int) -> ValidationPass:
    """Logits of every volume, whole items (slices, or the volume for a 3D network) through ``predictor``'s sliding
    window, ``batch_size`` items at a time; a 3D network's ``(1, C, z, y, x)`` logits are laid out slice-first
    like a 2D network's, so every choice below reads both alike."""
    logits, labels = [], []
    for volume in volumes:
        volume_logits = [predictor.network_logits(volume.images[start:start + batch_size]).cpu()
                         for start in range(0, volume.images.shape[0], batch_size)]
        logits.append(torch.cat(volume_logits).movedim(1, -3).flatten(0, -4))
        labels.append(volume.labels.long().flatten(0, -3))
    return ValidationPass(logits, labels)


def _volume_labels(logits: torch.Tensor, postprocessing: Postprocessing) -> np.ndarray:
    """``(z, y, x)`` uint8 labels of one volume's logits after ``postprocessing``."""
    return postprocessing.apply(logits.argmax(dim=1).to(torch.uint8).numpy())


def volume_dice(validation: ValidationPass, postprocessing: Postprocessing, num_classes: int,
                per_class: bool = False) -> np.ndarray:
    """Per validation volume: mean foreground Dice ``(V,)``, or per class ``(V, C - 1)`` with ``per_class``."""
    scores = np.stack([dice(_volume_labels(logits, postprocessing), labels.numpy(), num_classes)
                       for logits, labels in zip(validation.logits, validation.labels)])
    return scores if per_class else np.nanmean(scores, axis=1)


def foreground_ece(validation: ValidationPass, temperature: float) -> float:
    """Pooled ECE over the reference-foreground validation voxels at ``temperature``."""
    statistics = CalibrationStatistics(validation.logits[0].shape[1])
    for logits, labels in zip(validation.logits, validation.labels):
        probabilities = torch.softmax(apply_temperature(logits, temperature), dim=1).movedim(1, 0).numpy()
        statistics.add(*masked_probabilities(probabilities, labels.numpy()))
    return statistics.ece()


def _passed(network: torch.nn.Module, metadata: BundleMetadata, volumes: Sequence[GridVolume], device: torch.device,
            batch_size: int) -> ValidationPass:
    """The validation pass of ``network`` with the sliding window ``metadata`` records."""
    return validation_pass(Predictor.from_network(network, metadata, device=device, batch_size=batch_size), volumes,
                           batch_size)


def choose_mirroring(network: torch.nn.Module, metadata: BundleMetadata, volumes: Sequence[GridVolume],
                     device: torch.device, batch_size: int,
                     ) -> tuple[tuple[BundleMetadata, ValidationPass], dict[str, Any]]:
    """Test-time mirroring over both in-plane axes (the window's last two) where it raises the validation Dice (it
    costs 4× the inference time): the metadata with the chosen sliding window and the validation pass it gives."""
    mirrored_metadata = mirrored(metadata)
    plain = _passed(network, metadata, volumes, device, batch_size)
    with_mirroring = _passed(network, mirrored_metadata, volumes, device, batch_size)
    used, record = mirroring_choice(plain, with_mirroring, metadata.num_classes)
    return ((mirrored_metadata, with_mirroring) if used else (metadata, plain)), record


def mirrored(metadata: BundleMetadata) -> BundleMetadata:
    """``metadata`` with test-time mirroring over both in-plane axes (the window's last two)."""
    in_plane = (metadata.spatial_dims - 2, metadata.spatial_dims - 1)
    return replace(metadata, sliding_window=replace(metadata.sliding_window, mirror_axes=in_plane))


def mirroring_choice(plain: ValidationPass, with_mirroring: ValidationPass, num_classes: int
                     ) -> tuple[bool, dict[str, Any]]:
    """Whether mirroring raises the mean validation Dice of the same volumes passed without and with it, and the
    record of both."""
    dice_plain = float(np.nanmean(volume_dice(plain, Postprocessing(), num_classes)))
    dice_mirrored = float(np.nanmean(volume_dice(with_mirroring, Postprocessing(), num_classes)))
    used = dice_mirrored > dice_plain
    return used, {"used": used, "val_dice_without": dice_plain, "val_dice_with": dice_mirrored}


def pooled(passes: Sequence[ValidationPass]) -> ValidationPass:
    """Several networks' validation passes as one (each volume scored by the network that passed it): e.g. the
    folds of a cross-validation, each on its own validation patients."""
    return ValidationPass([logits for item in passes for logits in item.logits],
                          [labels for item in passes for labels in item.labels])


def _temperature_samples(validation: ValidationPass, foreground: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """At most about ``_TEMPERATURE_VOXELS`` validation ``(N, C)`` logits and ``(N,)`` labels, drawn with a
    fixed seed (reproducible, bounded memory); ``foreground``: reference-foreground voxels only."""
    num_classes = validation.logits[0].shape[1]
    flat_logits = [logits.movedim(1, -1).reshape(-1, num_classes) for logits in validation.logits]
    flat_labels = [labels.reshape(-1) for labels in validation.labels]
    if foreground:
        keep = [labels > 0 for labels in flat_labels]
        flat_logits = [logits[mask] for logits, mask in zip(flat_logits, keep)]
        flat_labels = [labels[mask] for labels, mask in zip(flat_labels, keep)]
    total = sum(len(labels) for labels in flat_labels)
    keep_fraction = min(1.0, _TEMPERATURE_VOXELS / max(total, 1))
    sampler = torch.Generator().manual_seed(seed)
    kept = [torch.rand(len(labels), generator=sampler) < keep_fraction for labels in flat_labels]
    return (torch.cat([logits[mask] for logits, mask in zip(flat_logits, kept)]),
            torch.cat([labels[mask] for labels, mask in zip(flat_labels, kept)]))


def choose_temperature(validation: ValidationPass, fit: str = "auto", seed: int = 0) -> tuple[float, dict[str, Any]]:
    """The temperature to ship: fitted by NLL on all or on reference-foreground validation voxels, or 1
    (``"none"``) — ``fit`` (one of :data:`TEMPERATURE_FITS`), or with ``"auto"`` the candidate with the lowest
    validation foreground ECE (T = 1 on a tie)."""
    fits = ("none", "all", "foreground") if fit == "auto" else (fit,)
    foreground_ece_t1 = foreground_ece(validation, 1.0)
    candidates = {"none": {"temperature": 1.0, "foreground_ece": foreground_ece_t1}} if "none" in fits else {}
    for name in fits:
        if name != "none":
            temperature = float(fit_temperature(*_temperature_samples(validation, name == "foreground", seed)))
            candidates[name] = {"temperature": temperature, "foreground_ece": foreground_ece(validation, temperature)}
    chosen = min(candidates, key=lambda name: candidates[name]["foreground_ece"])
    return candidates[chosen]["temperature"], {"fitted_on": chosen, "candidates": candidates,
                                               "foreground_ece_t1": foreground_ece_t1}


def choose_largest_component(validation: ValidationPass, num_classes: int) -> tuple[Postprocessing, dict[str, Any]]:
    """Keep only the largest connected component of the classes where that raises their validation Dice."""
    without = volume_dice(validation, Postprocessing(), num_classes, per_class=True)
    with_component = np.stack([volume_dice(validation, Postprocessing((class_id,)), num_classes,
                                           per_class=True)[:, class_id - 1] for class_id in range(1, num_classes)],
                              axis=1)
    postprocessing = choose_postprocessing(without, with_component)
    return postprocessing, {"largest_component": list(postprocessing.largest_component),
                            "val_dice_per_class_without": np.nanmean(without, axis=0).tolist(),
                            "val_dice_per_class_largest_component": np.nanmean(with_component, axis=0).tolist()}


def fit_quality(network: torch.nn.Module, metadata: BundleMetadata, cases: Sequence[Case], device: torch.device,
                batch_size: int) -> tuple[QualityModel, str]:
    """The quality model fitted on the validation ``cases`` as the bundle described by ``metadata`` segments them
    (its mirroring, temperature and post-processing); checked by the very parser ``load_bundle`` uses."""
    predictor = Predictor.from_network(network, metadata, device=device, batch_size=batch_size)
    model = fit_quality_model(predictor, cases)
    QualityModel.from_dict(model.to_dict(), metadata.class_names)
    return model, f"fitted on {len(cases)} validation volumes"


def or_neutral(name: str, choose: Callable[[], tuple[Setting, Any]], neutral: Setting,
                choices: dict[str, Any]) -> Setting:
    """``choose()``'s setting, its record in ``choices[name]``; when it fails, ``neutral`` and ``"none: <why>"``
    (said on the console too): a failed choice must not lose the trained run."""
    try:
        setting, choices[name] = choose()
    except Exception as error:  # noqa: BLE001  (whatever went wrong, the weights are worth a bundle)
        reason = str(error).strip() or type(error).__name__
        choices[name] = f"none: {reason}"
        print(f"no {name.replace('_', ' ')}: {reason}", flush=True)
        return neutral
    return setting


def input_statistics(network: torch.nn.Module, metadata: BundleMetadata, cases: Sequence[Case],
                     validation: Sequence[Case], batch_size: int) -> tuple[dict[str, Any], str]:
    """What the training ``cases`` looked like to the bundle described by ``metadata``
    (:func:`CalibSegLib.input_check.statistics_of_cases`) and to its ``network``
    (:func:`CalibSegLib.features.fit_network_features`, the threshold from the ``validation`` cases), for the
    input check. Features that cannot be fitted leave the statistics without them, and the record says why."""
    try:
        features = fit_network_features(network, metadata, cases, validation, batch_size)
        record = (f"network features of the {features.training_volumes} training volumes, distance threshold "
                  f"{features.threshold:.3g} from {features.validation_volumes} validation volumes")
    except FeatureStatisticsError as error:
        features, record = None, f"no network features: {error}"
    statistics = statistics_of_cases(metadata, cases, features=features)
    return statistics, f"from the {statistics['volumes']} training volumes; {record}"


def make_choices(network: torch.nn.Module, metadata: BundleMetadata, volumes: Sequence[GridVolume],
                 cases: Sequence[Case], training_cases: Sequence[Case], device: torch.device, batch_size: int,
                 temperature_fit: str = "auto", seed: int = 0, mirroring: str = "auto"
                 ) -> tuple[BundleMetadata, dict[str, Any]]:
    """Every end-of-run choice for ``network`` (the best weights) on the validation ``volumes`` (model grid) and
    ``cases`` (as read), and the input statistics of ``training_cases`` (the network's features too, their
    threshold from ``cases``): the metadata to write into the bundle and the ``choices`` record for ``run.json``;
    ``mirroring`` (:data:`MIRRORING`) ``"off"`` leaves test-time mirroring untried.

    ``metadata`` describes the network without any choice made; its ``validation_metrics`` gets the final
    validation Dice and foreground ECE with the choices.
    """
    choices: dict[str, Any] = {}
    mirrored_choice = None
    if mirroring == "off":
        choices["mirroring"] = "off: not tried (--mirroring off)"
    else:
        mirrored_choice = or_neutral("mirroring", lambda: choose_mirroring(network, metadata, volumes, device,
                                                                           batch_size), None, choices)
    chosen, validation = mirrored_choice or (metadata, _passed(network, metadata, volumes, device, batch_size))
    num_classes = metadata.num_classes
    temperature = or_neutral("temperature", lambda: choose_temperature(validation, temperature_fit, seed), 1.0,
                              choices)
    postprocessing = or_neutral("postprocessing", lambda: choose_largest_component(validation, num_classes),
                                 Postprocessing(), choices)
    final_dice = float(np.nanmean(volume_dice(validation, postprocessing, num_classes)))
    if isinstance(choices["postprocessing"], dict):
        choices["postprocessing"]["val_dice_final"] = final_dice
    validation_metrics = {"dice": final_dice, "foreground_ece": foreground_ece(validation, temperature),
                          "choices": choices}
    chosen = replace(chosen, temperature=temperature, postprocessing=postprocessing,
                     validation_metrics={**metadata.validation_metrics, **validation_metrics})
    quality = or_neutral("quality_model", lambda: fit_quality(network, chosen, cases, device, batch_size), None,
                          choices)
    statistics = or_neutral("input_statistics",
                            lambda: input_statistics(network, chosen, training_cases, cases, batch_size), None,
                            choices)
    return replace(chosen, quality_model=quality.to_dict() if quality is not None else None,
                   input_statistics=statistics), choices
