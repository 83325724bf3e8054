"""What every study of the function rule starts from: its command line and the bundle's rule and store records."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

from CalibSegLib.bundle import Bundle, BundleError, load_bundle
from CalibSegLib.cardiac.intervals import IntervalRule
from CalibSegLib.pretrained import resolve_bundle_path
from Evaluation.function_intervals import stored_records

__all__ = ["study_arguments", "function_study"]


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
