"""Which way of fitting the quality model predicts Dice best, judged on out-of-fold training patients.

    python -m Training.quality_folds --folds runs/oof/crac-fold*/model.calibseg [--data DIR]
    python -m Training.quality_folds --folds runs/oof/crac-fold*/model.calibseg --refit acdc_crac --procedure B
    python -m Training.quality_folds --folds runs/oof/crac-fold*/model.calibseg --own acdc_crac --procedures L M
    python -m Training.quality_folds --folds runs/oof/crac-fold*/model.calibseg --own-folds LONG0 LONG1 …

Ten validation patients are too few to choose a quality model's feature reliably (docs/results.md,
"Predicted Dice and the review flag"). Fold networks (trained on ``Datasets/splits/acdc_folds``,
each validated on a fold of the training patients) predict all 55 training patients out of fold.
Every fold then plays the part a shipped bundle's validation split plays, and each procedure of
:data:`FOLD_PROCEDURES` predicts each of its patients from a model built without that patient:

- ``A``: chosen and fitted on the other patients of the same fold (what ``calibseg-train`` fitted before ``G``);
  ``A`` to ``H`` with the six features there were before ``log_volume_ml``;
- ``B``: feature and form chosen on the other folds' patients, fitted on the same fold's others;
- ``C``: chosen and fitted on the other folds' patients and the same fold's others together;
- ``D``: nothing chosen: the mean of one linear fit per feature, fitted on the same patients as ``C``, of the
  five features there were when it was measured and shipped;
- ``E``: ``D`` with the six features of :data:`~CalibSegLib.quality.FEATURES_WITHOUT_SIZE` (the five and
  ``boundary_low_confidence_ratio``);
- ``F``: ``C`` with ``E``'s average as one more candidate: per structure, one feature or the average, whichever
  has the lower held-out error on the pooled patients;
- ``G`` and ``H``: ``E`` and ``F`` on the same fold's other patients alone, as a bundle without fold networks is
  fitted (``calibseg-train`` fitted ``G`` after a rule in docs/results.md adopted it over ``A``);
- ``I``, ``J`` and ``K``: ``E``, ``F`` and ``G`` with the structure's size, ``log_volume_ml``, as a seventh feature
  (``calibseg-train`` fitted ``K`` after the next rule adopted it over ``G``, until ``N``);
- ``L``: ``E`` with the size in the left ventricle's average only (ACDC's class name; a task without one gets
  ``E``); the shipped models' procedure from its rule, decided on a third set of fold networks, until ``P``;
- ``M``: ``L``, each structure then shifted by the mean residual of the same fold's volumes under that fit: at
  refit, the level of the bundle's own network on its validation patients.
- ``N``: ``K`` with the size in the left ventricle's average only, as ``L`` is ``I`` with it there only (``G`` for a
  task without one); what ``calibseg-train`` fitted from its rule, decided on the third set, until ``O``.
- ``O`` and ``P``: ``N`` and ``L`` with the mirrored passes' agreement (``mirror_agreement``) in every structure's
  average; fold networks that do not mirror cannot be scored by them. Their rule, decided on all three sets,
  adopted ``O`` for what ``calibseg-train`` fits and ``P`` for the shipped models.
- ``Q``: ``P`` shifted as ``M`` shifts ``L``; for the level test of full-length fold networks under ``P``.

The table has per structure the Spearman ρ of those held-out predictions against the measured
Dice within each fold (a fold is about the test split's size), their mean, and the mean absolute
error and the bias (mean predicted − measured) over all volumes. ``--refit`` applies a procedure
to a bundle: the fold networks' patients play "the other folds" and the bundle's own validation
patients "the same fold"; the bundle is written as ``calibseg-fit-quality`` writes it.
``--also-folds`` adds a second set of fold networks of the same folds (another seed): the other
folds' patients then enter the pooled fits as both sets predict them, the held-out fold's patients
left out of both. ``--own`` scores the procedures on a bundle's own validation patients as one fold, the fold
networks' patients its other folds: what each procedure does with the network it is refitted for. ``--own-folds``
does the same across all folds without a shipped bundle: networks of the same folds trained otherwise (longer, as
the shipped ones are) predict each fold's own patients, ``--folds`` (and ``--also-folds``) the other folds'. No test
patient is read.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from CalibSegLib.bundle import BUNDLE_SUFFIX, Bundle, BundleError, load_bundle, save_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.io import check_output_file
from CalibSegLib.pretrained import resolve_bundle_path, shipped_name
from CalibSegLib.quality import (FEATURES_WITHOUT_MIRRORING, FEATURES_WITHOUT_SIZE, MIRROR_AGREEMENT, QualityModel,
                                 QualityModelError, size_candidates)
from Datasets.cases import DataError
from Training.fit_quality import describe, validation_cases
from Training.quality_choice import Observation, fit_on, held_out_predictions, observe_validation, rank_correlation

__all__ = ["FoldProcedure", "FOLD_PROCEDURES", "observe_fold_sets", "observe_own_and_folds", "fold_held_out",
           "fold_table", "match_folds", "refit_with_folds", "main"]

# A procedure, given the other folds' observations and the class names, returns how to build a model from the
# same fold's observations (the choice on the other folds is made once per fold, not once per held-out patient).
Builder = Callable[[Sequence[Observation]], QualityModel]
FoldProcedure = Callable[[Sequence[Observation], Sequence[str]], Builder]


def _own_only(**options: Any) -> FoldProcedure:
    """Fit on the same fold's observations alone, as ``calibseg-train`` fits on its own validation patients;
    ``options`` as :func:`fit_on`'s."""
    return lambda others, class_names: lambda own: fit_on(own, class_names, **options)


def _chosen_elsewhere(others: Sequence[Observation], class_names: Sequence[str]) -> Builder:
    structures = fit_on(others, class_names, candidates=_SIX).structures
    choices = {name: (quality.feature, quality.form) for name, quality in structures.items()}
    return lambda own: fit_on(own, class_names, fixed=choices)


def _pooled(**options: Any) -> FoldProcedure:
    """Fit on the other folds' and the same fold's observations together; ``options`` as :func:`fit_on`'s."""
    return lambda others, class_names: lambda own: fit_on([*others, *own], class_names, **options)


# A-H were measured (and C-F shipped, before L) before the size feature existed: they keep the six features before it.
_SIX = FEATURES_WITHOUT_SIZE
# D's features: those it was measured and shipped with before the sixth was added (docs/results.md).
_D_FEATURES = tuple(name for name in _SIX if name != "boundary_low_confidence_ratio")
_WITH_SIZE = FEATURES_WITHOUT_MIRRORING
_WITH_AGREEMENT = (*_SIX, MIRROR_AGREEMENT)


def _size_for_left_ventricle(fit: Callable[..., FoldProcedure], candidates: Sequence[str] = _SIX) -> FoldProcedure:
    """``fit`` (:func:`_pooled` or :func:`_own_only`) averaging ``candidates``, with ``log_volume_ml`` in the
    average of a structure named ``left ventricle`` (ACDC's, :data:`~CalibSegLib.quality.SIZED_STRUCTURES`) too;
    without one, ``candidates`` alone."""
    def procedure(others: Sequence[Observation], class_names: Sequence[str]) -> Builder:
        build = fit(averaged=True, candidates=candidates, extra_candidates=size_candidates(class_names))
        return build(others, class_names)

    return procedure


_L = _size_for_left_ventricle(_pooled)
_P = _size_for_left_ventricle(_pooled, _WITH_AGREEMENT)


def _at_own_level(base: FoldProcedure) -> FoldProcedure:
    """``base``, each structure then shifted by the mean residual (measured − predicted) of the same fold's volumes
    (a bundle's own validation volumes) under that fit: the level of the network that predicted them."""
    def procedure(others: Sequence[Observation], class_names: Sequence[str]) -> Builder:
        build = base(others, class_names)

        def build_with_level(own: Sequence[Observation]) -> QualityModel:
            model = build(own)
            structures = dict(model.structures)
            for index, name in enumerate(class_names[1:]):
                residuals = [float(item.dice[index]) - model.structures[name].predict(item.features[index])
                             for item in own if item.features[index] is not None]
                if residuals:
                    structures[name] = structures[name].shifted(float(np.mean(residuals)))
            return dataclasses.replace(model, structures=structures)

        return build_with_level

    return procedure


# key → (what the table calls it, the procedure)
FOLD_PROCEDURES: dict[str, tuple[str, FoldProcedure]] = {
    "A": ("own fold only, one feature chosen", _own_only(candidates=_SIX)),
    "B": ("chosen on other folds, fitted on own", _chosen_elsewhere),
    "C": ("other folds + own, pooled", _pooled(candidates=_SIX)),
    "D": ("features averaged, pooled", _pooled(averaged=True, candidates=_D_FEATURES)),
    "E": ("six features averaged, pooled", _pooled(averaged=True, candidates=_SIX)),
    "F": ("one feature or the average, pooled", _pooled(with_average=True, candidates=_SIX)),
    "G": ("own fold only, six features averaged", _own_only(averaged=True, candidates=_SIX)),
    "H": ("own fold only, one feature or the average", _own_only(with_average=True, candidates=_SIX)),
    "I": ("seven features averaged, pooled", _pooled(averaged=True, candidates=_WITH_SIZE)),
    "J": ("one of seven features or their average, pooled", _pooled(with_average=True, candidates=_WITH_SIZE)),
    "K": ("own fold only, seven features averaged", _own_only(averaged=True, candidates=_WITH_SIZE)),
    "L": ("six features averaged, the size too for the left ventricle, pooled", _L),
    "M": ("L at the level of the own fold's network", _at_own_level(_L)),
    "N": ("own fold only, six features averaged, the size too for the left ventricle",
          _size_for_left_ventricle(_own_only)),
    "O": ("own fold only, six features and the mirrored passes' agreement averaged, the size too for the left "
          "ventricle", _size_for_left_ventricle(_own_only, _WITH_AGREEMENT)),
    "P": ("six features and the mirrored passes' agreement averaged, the size too for the left ventricle, pooled",
          _P),
    "Q": ("P at the level of the own fold's network", _at_own_level(_P)),
}


def observe_fold_sets(sets: Sequence[Sequence[str | Path]], data: str | Path | None = None, device: str = "auto",
                      batch_size: int = 16, method: str | None = None, class_names: Sequence[str] | None = None,
                      ) -> tuple[list[dict[str, list[Observation]]], list[str]]:
    """Per set of fold networks, each fold bundle's clean validation observations by bundle name; the class names.

    A set is one bundle per fold of one fold split (its bundles validate on disjoint patients); several sets are
    the same folds trained again (another seed). ``method``: the training method every fold network must share
    (default: the first one's). Uncertainty features depend on the loss a network was trained with, so one
    method's observations do not fit another's. ``class_names``: the classes (background first) every fold network
    must have (default: the first one's).

    Raises:
        DataError: a set without bundles; two bundles of a set share a validation patient; bundles disagree on the
            classes or the method; a bundle records no validation patients (all checked before anything is
            predicted).
    """
    loaded = [{str(bundle): load_bundle(resolve_bundle_path(bundle)) for bundle in bundles} for bundles in sets]
    if not loaded or not all(loaded):
        raise DataError("No fold bundle given; pass --folds (and --also-folds) with the fold networks' bundles.")
    first = next(iter(loaded[0].values())).metadata
    whose = "the first fold" if class_names is None else "the bundle"
    class_names = list(first.class_names if class_names is None else class_names)
    method = method if method is not None else first.training.get("method")
    for bundles in loaded:
        held: dict[str, str] = {}
        for name, bundle in bundles.items():
            if list(bundle.metadata.class_names) != class_names:
                raise DataError(f"{name} has classes {bundle.metadata.class_names}, {whose} {class_names}; "
                                "pass fold networks of one task.")
            if bundle.metadata.training.get("method") != method:
                raise DataError(f"{name} was trained with {bundle.metadata.training.get('method')}, not {method}; "
                                f"pass fold networks trained with {method}.")
            for patient in bundle.metadata.data.get("val") or []:
                if patient in held:
                    raise DataError(f"{name} validates on {patient}, which fold {held[patient]} already holds; pass "
                                    "one bundle per fold of one fold split.")
                held[patient] = name
    cases = [{name: validation_cases(bundle.metadata, name, data, "observe") for name, bundle in bundles.items()}
             for bundles in loaded]
    observed = [{name: observe_validation(Predictor(bundle, device, batch_size), set_cases[name], degradations=())
                 for name, bundle in bundles.items()} for bundles, set_cases in zip(loaded, cases)]
    return observed, class_names


def fold_held_out(folds: Mapping[str, Sequence[Observation]], class_names: Sequence[str], procedure: FoldProcedure,
                  extra: Sequence[Observation] = (), own_by: Mapping[str, Sequence[Observation]] | None = None,
                  ) -> dict[str, list[tuple[np.ndarray, np.ndarray, Counter]]]:
    """Per structure, per fold: held-out predicted and measured Dice of the fold's volumes and the features chosen.

    ``extra``: observations by another set of fold networks, added to the other folds' except the fold's own
    patients'. ``own_by``: per fold of ``folds`` (same keys), its patients as other networks predict them (trained
    longer, as a shipped bundle's network is); they are then the fold's own volumes, and ``folds`` only the others'.
    """
    results: dict[str, list[tuple[np.ndarray, np.ndarray, Counter]]] = {name: [] for name in class_names[1:]}
    for name, own in folds.items():
        own = own if own_by is None else own_by[name]
        held = {item.patient for item in own}
        others = [*(item for other, items in folds.items() if other != name for item in items),
                  *(item for item in extra if item.patient not in held)]
        build = procedure(others, class_names)
        per_structure = held_out_predictions(own, class_names,
                                             lambda patient: build([item for item in own if item.patient != patient]))
        for structure, result in per_structure.items():
            results[structure].append(result)
    return results


def fold_table(folds: Mapping[str, Sequence[Observation]], class_names: Sequence[str],
               procedures: Mapping[str, tuple[str, FoldProcedure]] = FOLD_PROCEDURES,
               extra: Sequence[Observation] = (), own_by: Mapping[str, Sequence[Observation]] | None = None,
               ) -> list[str]:
    """Markdown rows: per procedure and structure, the within-fold ρ (each fold, their mean), the MAE and the bias
    (mean predicted − measured: above 0, optimistic) over all volumes and the most chosen feature; then the means
    over the structures, one place more. ``extra`` and ``own_by`` as :func:`fold_held_out`'s."""
    lines = ["| Procedure | Structure | ρ per fold | mean ρ | MAE | bias | feature chosen (volumes) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for key, (description, procedure) in procedures.items():
        label = f"{key}: {description}"
        means, errors, biases = [], [], []
        for structure, per_fold in fold_held_out(folds, class_names, procedure, extra, own_by).items():
            rhos = [rank_correlation(predicted, measured) for predicted, measured, _ in per_fold]
            residuals = np.concatenate([predicted - measured for predicted, measured, _ in per_fold])
            chosen = sum((counts for _, _, counts in per_fold), Counter())
            feature, volumes = chosen.most_common(1)[0]
            means.append(float(np.nanmean(rhos)))
            errors.append(float(np.abs(residuals).mean()))
            biases.append(float(residuals.mean()))
            lines.append(f"| {label} | {structure} | {' '.join(f'{rho:+.2f}' for rho in rhos)} | {means[-1]:+.3f} | "
                         f"{errors[-1]:.4f} | {biases[-1]:+.4f} | {feature} ({volumes} of {sum(chosen.values())}) |")
        # one place more than the rows: the rules in docs/results.md compare these means at 0.002 and 0.01
        lines.append(f"| {label} | mean | | {np.mean(means):+.4f} | {np.mean(errors):.5f} | {np.mean(biases):+.4f} | |")
    return lines


def observe_own_and_folds(loaded: Bundle, name: str, sets: Sequence[Sequence[str | Path]],
                          data: str | Path | None, device: str, batch_size: int, purpose: str,
                          ) -> tuple[list[Observation], list[Observation], int]:
    """A bundle's own clean validation observations, every fold network's of ``sets`` (trained with the bundle's
    method, on its classes) in one list, and how many fold networks predicted them. ``purpose``: what the bundle's
    validation patients are for, in the error when it records none.

    Raises:
        DataError: as :func:`observe_fold_sets` and ``validation_cases``; the fold networks' classes are not the
            bundle's (all checked before anything is predicted).
    """
    metadata = loaded.metadata
    cases = validation_cases(metadata, name, data, purpose)
    observed, _ = observe_fold_sets(sets, data, device, batch_size, metadata.training.get("method"),
                                    metadata.class_names)
    own = observe_validation(Predictor(loaded, device, batch_size), cases, degradations=())
    others = [item for folds in observed for items in folds.values() for item in items]
    return own, others, sum(len(folds) for folds in observed)


def match_folds(folds: Mapping[str, Sequence[Observation]], own_set: Mapping[str, Sequence[Observation]],
                ) -> dict[str, list[Observation]]:
    """``own_set``'s observations keyed by the fold of ``folds`` that holds the same patients.

    Raises:
        DataError: a fold of ``folds`` has no network in ``own_set`` that validates on exactly its patients.
    """
    by_patients = {frozenset(item.patient for item in items): list(items) for items in own_set.values()}
    matched = {}
    for name, items in folds.items():
        patients = frozenset(item.patient for item in items)
        if patients not in by_patients:
            raise DataError(f"No network of --own-folds validates on exactly the patients of {name}; pass one network "
                            "per fold of the same fold split as --folds.")
        matched[name] = by_patients[patients]
    return matched


def refit_with_folds(bundle: str | Path, fold_bundles: Sequence[str | Path], procedure: str,
                     data: str | Path | None = None, out: str | Path | None = None, device: str = "auto",
                     batch_size: int = 16, also_folds: Sequence[str | Path] = ()) -> tuple[Path, QualityModel]:
    """Fit ``bundle``'s quality model by ``procedure`` (a key of :data:`FOLD_PROCEDURES`), the fold bundles'
    validation patients as the other folds and the bundle's own as its fold; save as ``calibseg-fit-quality`` does.
    ``also_folds``: a second set of fold networks whose observations join the other folds'.

    Raises:
        BundleError, DataError, QualityModelError: as :func:`observe_fold_sets` (whose fold networks must be
            trained with ``bundle``'s method) and ``calibseg-fit-quality``.
    """
    path = resolve_bundle_path(bundle)
    shipped = shipped_name(path)
    if out is None:
        out = Path("runs") / shipped / f"{shipped}{BUNDLE_SUFFIX}" if shipped else path
    check_output_file(out)  # before the predictions: a bad destination must not cost them
    loaded = load_bundle(path)
    metadata = loaded.metadata
    sets = [fold_bundles, *([also_folds] if also_folds else [])]
    own, others, fold_networks = observe_own_and_folds(loaded, path.name, sets, data, device, batch_size, "fit")
    description, build = FOLD_PROCEDURES[procedure]
    model = build(others, metadata.class_names)(own)
    # The bundle says how its quality model was made: which procedure, on how many out-of-fold patients.
    model = dataclasses.replace(model, validation={
        **model.validation, "procedure": f"{procedure}: {description}",
        "fold_patients": len({item.patient for item in others}),
        "fold_networks": fold_networks})
    refitted = dataclasses.replace(metadata, quality_model=model.to_dict())
    return save_bundle(out, loaded.state_dict, refitted, half=metadata.weights_dtype == "float16"), model


def main(argv: Sequence[str] | None = None) -> int:
    """Print the fold table, or refit a bundle with ``--refit``; returns 0. Bad input exits with one sentence."""
    parser = argparse.ArgumentParser(prog="python -m Training.quality_folds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--folds", nargs="+", required=True, help="the fold networks' bundles, one per fold")
    parser.add_argument("--also-folds", nargs="+", default=[],
                        help="a second set of fold networks of the same folds (another seed), one per fold: their "
                             "observations join the other folds' in every pooled fit")
    parser.add_argument("--data", type=Path, default=None,
                        help="data folder (default: found from the dataset the bundles record)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--refit", default=None, help="bundle (.calibseg) or shipped model to refit by --procedure")
    target.add_argument("--own", default=None,
                        help="bundle (.calibseg) or shipped model: score the procedures on its own validation patients "
                             "instead, each predicted by the procedure run without it on the fold networks' patients "
                             "and its other validation patients")
    target.add_argument("--own-folds", nargs="+", default=None,
                        help="networks of the same folds trained otherwise (longer, as a shipped network is), one per "
                             "fold: each fold's own patients as these predict them, the other folds' as --folds (and "
                             "--also-folds) predict them")
    parser.add_argument("--procedure", choices=sorted(FOLD_PROCEDURES), default="B")
    parser.add_argument("--procedures", nargs="+", choices=sorted(FOLD_PROCEDURES), default=sorted(FOLD_PROCEDURES),
                        help="the procedures the table scores (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="where --refit writes (default as calibseg-fit-quality)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=16)
    arguments = parser.parse_args(argv)
    try:
        if arguments.refit is not None:
            written, model = refit_with_folds(arguments.refit, arguments.folds, arguments.procedure, arguments.data,
                                              arguments.out, arguments.device, arguments.batch_size,
                                              arguments.also_folds)
            print(f"{written}: quality model by procedure {arguments.procedure} "
                  f"({FOLD_PROCEDURES[arguments.procedure][0]})")
            print("\n".join(describe(model)))
            return 0
        sets = [arguments.folds, *([arguments.also_folds] if arguments.also_folds else [])]
        chosen = {key: FOLD_PROCEDURES[key] for key in arguments.procedures}
        if arguments.own is not None:
            path = resolve_bundle_path(arguments.own)
            loaded = load_bundle(path)
            own, others, fold_networks = observe_own_and_folds(loaded, path.name, sets, arguments.data,
                                                                arguments.device, arguments.batch_size, "score")
            # One "fold": the bundle's own patients, the fold networks' patients its other folds.
            lines = fold_table({path.name: own}, list(loaded.metadata.class_names), chosen, extra=others)
            print(f"{path.name}: held-out predictions of its {len(own)} validation volumes of "
                  f"{len({item.patient for item in own})} patients; the other folds are "
                  f"{len({item.patient for item in others})} patients as {fold_networks} fold networks predict them")
            print("\n".join(lines))
            return 0
        own_folds = [arguments.own_folds] if arguments.own_folds else []
        observed, class_names = observe_fold_sets([*sets, *own_folds], arguments.data, arguments.device,
                                                  arguments.batch_size)
        own_by = match_folds(observed[0], observed.pop()) if own_folds else None
        folds = observed[0]
        extra = [item for added in observed[1:] for items in added.values() for item in items]
        lines = fold_table(folds, class_names, chosen, extra=extra, own_by=own_by)
    except (BundleError, DataError, QualityModelError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    patients = len({item.patient for items in folds.values() for item in items})
    print(f"{len(folds)} folds: held-out predictions of {sum(map(len, folds.values()))} volumes of {patients} patients"
          + (f"; the other folds also as {len(observed) - 1} more set(s) of fold networks predict them" if extra
             else "")
          + ("; each fold's own patients as the networks of --own-folds predict them" if own_by else ""))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    main()
