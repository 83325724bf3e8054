"""How each way of choosing the review thresholds holds on patients it was not chosen on. Read from the store.

    python -m studies.review_rule_nested --bundle acdc_crac --store store \
        --record docs/records/quality/acdc_crac_review_rule_nested.json

The review rule is chosen on the out-of-fold patients' held-out predicted Dice (:mod:`CalibSegLib.quality.review_rule`)
and its recall and false flags were then counted on the same patients: a per-structure threshold placed on a
structure's few poor cases looks better there than it will on new patients. Here every candidate way of choosing is
judged **nested**: for each cross-validation fold (the patients one member never trained on), the thresholds are
chosen on the other folds' patients and count the flags of this fold's; the folds' flags are pooled. The candidates
(:data:`CHOICES`):

- ``pooled``: one threshold for every structure;
- ``per_structure``: each structure's own;
- ``pooled_unless``: the product's rule (:func:`~CalibSegLib.quality.review_rule.choose_review_rule`): per structure
  only when, judged nested itself, the pooled threshold misses a target and the per-structure ones meet both (so
  here it is nested twice: inside each fold's outside patients too);
- ``shrunk``: each structure's threshold pulled toward the pooled one by how few poor cases placed it,
  ``pooled + n / (n + PRIOR_POOR) · (own − pooled)`` with ``n`` the structure's poor cases, on the grid.

Each is then chosen on all out-of-fold patients and applied on the test patients as the product applies it (each
member's own predicted Dice, their mean, against the ensemble's measured Dice:
:func:`studies.ensemble_rules.judged_on_test`).
"""

from __future__ import annotations

import datetime
from typing import Any, Callable, Sequence

import numpy as np

from CalibSegLib.quality.model import thresholds_text
from CalibSegLib.quality.review_rule import (POOR_BELOW, THRESHOLDS, choose_review_rule, nested_thresholds,
                                             per_structure_thresholds, pooled_thresholds)
from Training.ensemble import flag_counts
from studies.ensemble_rules import judged_on_test
from studies.store_study import HeldOut, flag_cells, held_out_study, report_study, study_arguments

__all__ = ["PRIOR_POOR", "CHOICES", "nested", "judged_nested", "main"]

# How many poor cases a structure's own threshold must rest on before it counts as much as the pooled one: decided
# before any nested count (a quarter of the about 40 poor structures 65 ACDC patients show, so a structure with 10
# poor cases moves halfway to its own threshold).
PRIOR_POOR = 10


def _pooled(predicted: np.ndarray, measured: np.ndarray, _names: Sequence[str], _folds: np.ndarray) -> np.ndarray:
    return pooled_thresholds(predicted, measured)


def _per_structure(predicted: np.ndarray, measured: np.ndarray, _names: Sequence[str], _folds: np.ndarray
                   ) -> np.ndarray:
    return per_structure_thresholds(predicted, measured)


def _pooled_unless(predicted: np.ndarray, measured: np.ndarray, names: Sequence[str], folds: np.ndarray
                   ) -> np.ndarray:
    rule = choose_review_rule(predicted, measured, names, folds)
    return np.array([rule["review_below_by_structure"].get(name, rule["review_below"]) for name in names])


def _shrunk(predicted: np.ndarray, measured: np.ndarray, _names: Sequence[str], _folds: np.ndarray) -> np.ndarray:
    pooled, own = pooled_thresholds(predicted, measured), per_structure_thresholds(predicted, measured)
    poor = (measured < POOR_BELOW).sum(axis=0)
    pulled = pooled + poor / (poor + PRIOR_POOR) * (own - pooled)
    grid = np.asarray(THRESHOLDS)
    return grid[np.abs(pulled[:, None] - grid[None, :]).argmin(axis=1)]


# Name → the thresholds ``(structures,)`` it chooses on ``(volumes, structures)`` held-out predicted and measured Dice
# (with the structures' names and each volume's fold, which the product's rule judges itself nested over).
CHOICES: dict[str, Callable[[np.ndarray, np.ndarray, Sequence[str], np.ndarray], np.ndarray]] = {
    "pooled": _pooled, "per_structure": _per_structure, "pooled_unless": _pooled_unless, "shrunk": _shrunk}


def nested(held: HeldOut, choose: Callable[..., np.ndarray], names: Sequence[str]) -> np.ndarray:
    """``(volumes, structures)``: each out-of-fold volume's thresholds as ``choose`` (one of :data:`CHOICES`) sets
    them on the patients of the other folds (:func:`~CalibSegLib.quality.review_rule.nested_thresholds`)."""
    return nested_thresholds(held.predicted, held.measured, held.volume_folds,
                             lambda predicted, measured, folds: choose(predicted, measured, names, folds))


def _rule(thresholds: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
    """Thresholds ``(structures,)`` as a bundle's quality model stores them (one pooled when they are all equal)."""
    if len(set(thresholds.tolist())) == 1:
        return {"review_below": float(thresholds[0]), "review_below_by_structure": {}}
    return {"review_below": float(np.median(thresholds)),
            "review_below_by_structure": {name: float(value) for name, value in zip(names, thresholds)}}


def judged_nested(held: HeldOut, names: Sequence[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Per choice, its nested flags out of fold and the thresholds it chooses on every out-of-fold patient (what a
    bundle would ship, which the test part applies)."""
    counted, shipped = {}, {}
    for name, choose in CHOICES.items():
        counted[name] = flag_counts(held.predicted, held.measured, held.patients, nested(held, choose, names))
        shipped[name] = _rule(choose(held.predicted, held.measured, names, held.volume_folds), names)
    return counted, shipped


def markdown(result: dict[str, Any]) -> list[str]:
    """One table: per choice, its thresholds on all out-of-fold patients, its nested and its test flags."""
    lines = ["| choice | thresholds (all out-of-fold patients) | where | poor flagged / poor | good flagged / good |",
             "| --- | --- | --- | --- | --- |"]
    for name, rule in result["thresholds"].items():
        text = thresholds_text(rule["review_below"], rule["review_below_by_structure"])
        lines.append(f"| {name} | {text} | nested out of fold | {flag_cells(result['nested'][name], 1)} |")
        if "test" in result:
            lines.append(f"| {name} | {text} | test | {flag_cells(result['test']['flags_members_mean'][name], 1)} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the table; writes the record with ``--record``. Returns 0; bad input exits with one sentence."""
    arguments = study_arguments("python -m studies.review_rule_nested", __doc__.split("\n\n")[0], argv)
    bundle, records, held = held_out_study(arguments)
    metadata = bundle.metadata
    names = list(metadata.class_names[1:])
    counted, thresholds = judged_nested(held, names)
    result: dict[str, Any] = {
        "bundle": arguments.bundle, "weights_sha256": metadata.weights_sha256,
        "recorded": datetime.date.today().isoformat(), "prior_poor": PRIOR_POOR,
        "command": f"python -m studies.review_rule_nested --bundle {arguments.bundle} --store <store>"
                   + ("" if arguments.record is None else f" --record {arguments.record}"),
        "folds": len(held.folds), "volumes": len(held.observations), "patients": len(set(held.patients)),
        "nested": counted, "thresholds": thresholds}
    tested = judged_on_test(metadata, records, thresholds)
    if tested is not None:
        result["test"] = {"volumes": tested["volumes"], "patients": tested["patients"],
                          "flags_members_mean": tested["flags_members_mean"]}
    return report_study(markdown(result), result, arguments.record)


if __name__ == "__main__":
    main()
