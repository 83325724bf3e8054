"""(Re)fit a bundle's quality model and write it into the bundle.

    calibseg-fit-quality --bundle runs/ce_dice/model.calibseg [--data DIR] [--out PATH]
    calibseg-fit-quality --bundle acdc_crac --fold-bundles runs/folds/crac_f*/model.calibseg --out X.calibseg
    calibseg-fit-quality --bundle acdc_crac --keep-fit --review-below 0.85   # the fit kept, another threshold
    calibseg-fit-quality --bundle runs/ce_dice-cv/ensemble.calibseg --folds runs/ce_dice-cv   # an ensemble's

The quality model (:mod:`CalibSegLib.quality.fitting`: per structure, the mean of one linear fit per uncertainty
feature) is fitted on predicted volumes whose Dice is measured against their reference:

- the bundle's own validation patients (``bundle.json``: ``data["val"]``), as ``calibseg-train`` fits it;
- with ``--fold-bundles``, also every fold network's out-of-fold predictions of its own validation patients
  (networks trained with the bundle's method on folds of its training patients, e.g.
  ``calibseg-train --split Datasets/splits/acdc_folds/fold<k>.json``): many more patients than one validation
  split, which is how the shipped models' quality models were fitted (docs/results.md, "The quality check").

An ensemble bundle (``calibseg-ensemble``) has no validation patients of its own: ``--folds`` refits its quality model
and review threshold as ``calibseg-ensemble`` fitted them, on the out-of-fold predictions of its cross-validation's
fold networks under the ensemble's settings, the threshold chosen by the review rule
(:func:`Training.ensemble.out_of_fold_quality`).

The data is read from ``--data`` or the folder of the dataset the bundle records
(:func:`Datasets.dataset_names.data_folder`). The bundle is then rewritten atomically (``--out``: elsewhere; a shipped
model is never rewritten inside the package: its default is ``runs/<name>/<name>.calibseg`` under the current
folder) with the same weights in the same dtype (float16 stays float16), so only ``quality_model`` changes. Prints
what was fitted and its held-out error beside the constant baseline's.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Sequence

from CalibSegLib.bundle import Bundle, BundleError, BundleMetadata, load_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.quality import (REVIEW_BELOW, Observation, QualityModel, QualityModelError, check_references,
                                 fit_from_observations, observe_cases)
from CalibSegLib.quality.model import thresholds_text
from Datasets.errors import DataError
from Datasets.loading import Case
from Training.bundle_rewrite import add_data_arguments, recorded_cases, rewrite_bundle, rewrite_destination
from Training.ensemble import out_of_fold_quality, read_folds

__all__ = ["refit_bundle", "refit_from_folds", "set_review_below", "fold_observations", "describe", "main"]


def refit_bundle(bundle: str | Path, data: str | Path | None = None, out: str | Path | None = None,
                 device: str = "auto", batch_size: int = 16,
                 fold_bundles: Sequence[str | Path] = (), review_below: float = REVIEW_BELOW
                 ) -> tuple[Path, QualityModel]:
    """Fit the quality model of ``bundle`` on its recorded validation patients (and the fold networks' out-of-fold
    predictions) and save the bundle.

    Args:
        bundle: a ``.calibseg`` path or a shipped model's name.
        data: the data folder (default: found from the dataset the bundle records).
        out: where to write the bundle (default: over ``bundle``, atomically; for a shipped
            model ``runs/<name>/<name>.calibseg``).
        fold_bundles: fold networks (see :func:`fold_observations`).
        review_below: the review threshold on the predicted Dice (chosen on out-of-fold patients by
            ``studies/review_rule_table.py``; docs/results.md, "The review rule").

    Returns:
        The written bundle's path and the fitted model.

    Raises:
        BundleError, DataError, QualityModelError: unreadable bundle, missing data or validation
            patients, unsuitable fold networks, or too few validation cases (one sentence each).
    """
    path = resolve_bundle_path(bundle)
    out = rewrite_destination(path, out)  # before the fit: a bad destination must not cost the predictions
    loaded = load_bundle(path)
    metadata = loaded.metadata
    cases = recorded_cases(metadata, path.name, data, "val", "fit")
    check_references(cases, metadata.class_names)  # before any prediction
    observed = fold_observations(fold_bundles, metadata, data, device, batch_size)
    record = ({"fold_networks": len(fold_bundles), "fold_patients": len({item.patient for item in observed})}
              if fold_bundles else {})
    observed += observe_cases(Predictor(loaded, device=device, batch_size=batch_size), cases)
    model = fit_from_observations(observed, metadata.class_names, review_below=review_below, validation=record)
    return rewrite_bundle(loaded, dataclasses.replace(metadata, quality_model=model.to_dict()), out), model


def refit_from_folds(bundle: str | Path, cross_validation: str | Path, data: str | Path | None = None,
                     out: str | Path | None = None, device: str = "auto", batch_size: int = 16
                     ) -> tuple[Path, QualityModel]:
    """Fit the quality model and review threshold of ensemble ``bundle`` on the out-of-fold predictions of the
    fold networks in ``cross_validation`` (:func:`Training.ensemble.out_of_fold_quality`) and save the bundle as
    :func:`refit_bundle` does.

    Raises:
        BundleError, DataError, QualityModelError: unreadable bundle or folds, folds that are not the bundle's
            members, too few out-of-fold volumes (one sentence each).
    """
    path = resolve_bundle_path(bundle)
    out = rewrite_destination(path, out)
    loaded = load_bundle(path)
    folds = read_folds(cross_validation, data)
    ensemble = loaded.metadata.ensemble
    members = [] if ensemble is None else [member.weights_sha256 for member in ensemble.members]
    if members != [fold.bundle.metadata.weights_sha256 for fold in folds]:
        raise DataError(f"The folds of {cross_validation} are not the members of {path.name}; pass the "
                        "cross-validation folder its ensemble was built from.")
    model, _ = out_of_fold_quality(folds, loaded.metadata, device, batch_size)
    return rewrite_bundle(loaded, dataclasses.replace(loaded.metadata, quality_model=model.to_dict()), out), model


def set_review_below(bundle: str | Path, review_below: float,
                     out: str | Path | None = None) -> tuple[Path, QualityModel]:
    """Keep ``bundle``'s fitted quality model and change only its review threshold (e.g. to the one
    ``studies/review_rule_table.py`` chose on out-of-fold patients), then one for every structure (any per-structure
    thresholds dropped); written as :func:`refit_bundle` writes.

    Raises:
        BundleError: unreadable bundle, or one without a quality model (fit one first).
    """
    path = resolve_bundle_path(bundle)
    out = rewrite_destination(path, out)
    loaded = load_bundle(path)
    model = loaded.metadata.quality
    if model is None:
        raise BundleError(f"{path.name} has no quality model whose threshold could change; fit one first "
                          "(calibseg-fit-quality without --keep-fit).")
    model = dataclasses.replace(model, review_below=review_below, review_below_by_structure={})  # one for all
    metadata = dataclasses.replace(loaded.metadata, quality_model=model.to_dict())
    return rewrite_bundle(loaded, metadata, out), model


def fold_observations(fold_bundles: Sequence[str | Path], metadata: BundleMetadata, data: str | Path | None = None,
                      device: str = "auto", batch_size: int = 16) -> list[Observation]:
    """Each fold network's predictions of its own validation patients, measured: out-of-fold observations for the
    quality model of the bundle described by ``metadata``.

    Raises:
        DataError: a fold network has other classes or another training method than the bundle (uncertainty
            depends on the loss a network was trained with), records no validation patients, or validates on one
            of the bundle's test patients (checked for all before anything is predicted).
    """
    folds = [load_bundle(resolve_bundle_path(fold)) for fold in fold_bundles]
    cases = [_fold_cases(fold, str(name), metadata, data) for fold, name in zip(folds, fold_bundles)]
    return [observation for fold, fold_cases in zip(folds, cases)
            for observation in observe_cases(Predictor(fold, device=device, batch_size=batch_size), fold_cases)]


def _fold_cases(fold: Bundle, name: str, metadata: BundleMetadata, data: str | Path | None) -> list[Case]:
    """The validation volumes of fold network ``fold`` (file ``name``), once it is checked against the bundle."""
    fold_metadata = fold.metadata
    if list(fold_metadata.class_names) != list(metadata.class_names):
        raise DataError(f"{name} has classes {fold_metadata.class_names}, the bundle {metadata.class_names}; pass "
                        "fold networks of the bundle's task.")
    method = metadata.training.get("method")
    if fold_metadata.training.get("method") != method:
        raise DataError(f"{name} was trained with {fold_metadata.training.get('method')}, the bundle with {method}; "
                        f"pass fold networks trained with {method}.")
    tested = set(fold_metadata.data.get("val") or []) & set(metadata.data.get("test") or [])
    if tested:
        raise DataError(f"{name} validates on {sorted(tested)[0]}, one of the bundle's test patients; pass fold "
                        "networks whose folds split the bundle's training patients.")
    return recorded_cases(fold_metadata, name, data, "val", "predict out of fold")


def describe(model: QualityModel) -> list[str]:
    """One line per structure: the features averaged, held-out MAE vs the constant baseline, interval."""
    validation = model.validation
    folds = (f", {validation['fold_networks']} fold networks' out-of-fold predictions of "
             f"{validation['fold_patients']} patients among them" if validation.get("fold_networks") else "")
    lines = [f"quality model ({validation.get('scheme')} on {validation.get('cases')} volumes of "
             f"{validation.get('patients')} patients{folds}; review below predicted Dice "
             f"{thresholds_text(model.review_below, model.review_below_by_structure)})"]
    for name, structure in model.structures.items():
        low, high = structure.interval
        lines.append(f"  {name}: mean of {', '.join(structure.inputs)}; held-out MAE {structure.loo_mae:.3f} "
                     f"(constant {structure.constant_loo_mae:.3f}), {model.interval_coverage:.0%} interval "
                     f"{low:+.3f}/{high:+.3f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibseg-fit-quality`` command: prints the written bundle's path; returns the exit status 0. Bad input
    exits with one sentence, no traceback."""
    parser = argparse.ArgumentParser(prog="calibseg-fit-quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, help="bundle (.calibseg) or a shipped model's name")
    parser.add_argument("--fold-bundles", nargs="+", default=(), metavar="BUNDLE",
                        help="fold networks (same method and classes) whose out-of-fold predictions of their own "
                             "validation patients join the fit")
    parser.add_argument("--folds", type=Path, default=None, metavar="CROSS_VALIDATION",
                        help="an ensemble bundle's cross-validation folder: fit on its folds' out-of-fold predictions "
                             "and choose the review threshold by the review rule (--review-below is then ignored)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the bundle here (default: rewrite it in place; a shipped model: "
                             "runs/<name>/<name>.calibseg)")
    parser.add_argument("--review-below", type=float, default=REVIEW_BELOW,
                        help=f"flag structures whose predicted Dice is below this, one threshold for all "
                             f"(default {REVIEW_BELOW}; studies/review_rule_table.py chooses it on out-of-fold "
                             "patients)")
    parser.add_argument("--keep-fit", action="store_true",
                        help="keep the bundle's fitted model and only set --review-below (no data needed)")
    add_data_arguments(parser)
    arguments = parser.parse_args(argv)
    try:
        if not 0.0 <= arguments.review_below <= 1.0:  # NaN fails both comparisons
            raise ValueError(f"--review-below must be a Dice in [0, 1], got {arguments.review_below}.")
        if arguments.keep_fit:
            written, model = set_review_below(arguments.bundle, arguments.review_below, arguments.out)
        elif arguments.folds is not None:
            written, model = refit_from_folds(arguments.bundle, arguments.folds, arguments.data, arguments.out,
                                              arguments.device, arguments.batch_size)
        else:
            written, model = refit_bundle(arguments.bundle, arguments.data, arguments.out, arguments.device,
                                          arguments.batch_size, arguments.fold_bundles, arguments.review_below)
    except (BundleError, DataError, QualityModelError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    except KeyboardInterrupt:  # the bundle is rewritten atomically, at the very end
        raise SystemExit(f"interrupted: {arguments.out or arguments.bundle} was not written.") from None
    print("\n".join(describe(model)))
    print(f"bundle: {written}")
    return 0


if __name__ == "__main__":
    main()
