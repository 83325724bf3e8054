"""(Re)fit a bundle's quality model on its validation patients and write it into the bundle.

    calibseg-fit-quality --bundle runs/crac/model.calibseg [--data DIR] [--out PATH]
    calibseg-fit-quality --bundle acdc_ce_dice --data /path/to/acdc   # → runs/acdc_ce_dice/acdc_ce_dice.calibseg

The validation patients are the ones the bundle records (``bundle.json``: ``data["val"]``),
read from ``--data`` or the folder of the dataset the bundle records
(:func:`Datasets.cases.data_folder`). Every validation volume is
predicted with the bundle as it is (its temperature), its Dice per structure measured against
the reference, and :func:`CalibSegLib.quality.fit_quality_model` fits each structure's
predicted-Dice model: the mean of one linear fit per feature, as ``calibseg-train`` fits it
(the rule is in :mod:`CalibSegLib.quality.fitting`). The bundle is
then rewritten atomically (``--out``: elsewhere; a shipped model is never rewritten inside the
package: its default is ``runs/<name>/<name>.calibseg`` under the current folder) with the same
weights in the same dtype (float16 stays float16), so only ``quality_model`` changes. Prints what was fitted and its
held-out error beside the constant baseline's.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Sequence

from CalibSegLib.bundle import BUNDLE_SUFFIX, BundleError, BundleMetadata, load_bundle, save_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.io import check_output_file
from CalibSegLib.pretrained import resolve_bundle_path, shipped_name
from CalibSegLib.quality import QualityModel, QualityModelError, fit_quality_model
from Datasets.cases import Case, DataError, data_folder, find_cases, load_cases
from Datasets.splits import select_patients

__all__ = ["refit_bundle", "validation_cases", "describe", "main"]


def refit_bundle(bundle: str | Path, data: str | Path | None = None, out: str | Path | None = None,
                 device: str = "auto", batch_size: int = 16) -> tuple[Path, QualityModel]:
    """Fit the quality model of ``bundle`` on its recorded validation patients and save the bundle.

    Args:
        bundle: a ``.calibseg`` path or a shipped model's name.
        data: the data folder (default: found from the dataset the bundle records).
        out: where to write the bundle (default: over ``bundle``, atomically; for a shipped
            model ``runs/<name>/<name>.calibseg``).

    Returns:
        The written bundle's path and the fitted model.

    Raises:
        BundleError, DataError, QualityModelError: unreadable bundle, missing data or validation
            patients, or too few validation cases (one sentence each).
    """
    path = resolve_bundle_path(bundle)
    shipped = shipped_name(path)
    if out is None:
        out = Path("runs") / shipped / f"{shipped}{BUNDLE_SUFFIX}" if shipped else path
    check_output_file(out)  # before the fit: a bad destination must not cost the predictions
    loaded = load_bundle(path)
    metadata = loaded.metadata
    cases = validation_cases(metadata, path.name, data, "fit")
    model = fit_quality_model(Predictor(loaded, device=device, batch_size=batch_size), cases, metadata.class_names)
    refitted = dataclasses.replace(metadata, quality_model=model.to_dict())
    written = save_bundle(out, loaded.state_dict, refitted, half=metadata.weights_dtype == "float16")
    return written, model


def validation_cases(metadata: BundleMetadata, name: str, data: str | Path | None, purpose: str) -> list[Case]:
    """The validation volumes a bundle records (``data["val"]``), loaded from ``data`` or the recorded dataset.

    Raises:
        DataError: the bundle ``name`` records no validation patients (nothing to ``purpose`` on), or the
            data is missing.
    """
    patients = metadata.data.get("val")
    if not patients:
        raise DataError(f"{name} records no validation patients (data['val']), so there is nothing to {purpose} on.")
    return load_cases(select_patients(find_cases(data_folder(metadata.data, data)), patients), metadata.num_classes)


def describe(model: QualityModel) -> list[str]:
    """One line per structure: chosen feature and form, held-out MAE vs the constant baseline, interval."""
    validation = model.validation
    lines = [f"quality model ({validation.get('scheme')} on {validation.get('cases')} validation volumes of "
             f"{validation.get('patients')} patients; review below predicted Dice {model.review_below:.2f})"]
    for name, structure in model.structures.items():
        low, high = structure.interval
        lines.append(f"  {name}: {structure.feature} ({structure.form}), held-out MAE {structure.loo_mae:.3f} "
                     f"(constant {structure.constant_loo_mae:.3f}), {model.interval_coverage:.0%} interval "
                     f"{low:+.3f}/{high:+.3f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibseg-fit-quality`` command: prints the written bundle's path; returns the exit status 0. Bad input
    exits with one sentence, no traceback."""
    parser = argparse.ArgumentParser(prog="calibseg-fit-quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, help="bundle (.calibseg) or a shipped model's name")
    parser.add_argument("--data", type=Path, default=None,
                        help="data folder (default: found from the dataset the bundle records)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the bundle here (default: rewrite it in place; a shipped model: "
                             "runs/<name>/<name>.calibseg)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=16)
    arguments = parser.parse_args(argv)
    try:
        written, model = refit_bundle(arguments.bundle, arguments.data, arguments.out, arguments.device,
                                      arguments.batch_size)
    except (BundleError, DataError, QualityModelError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    except KeyboardInterrupt:  # the bundle is rewritten atomically, at the very end
        raise SystemExit(f"interrupted: {arguments.out or arguments.bundle} was not written.") from None
    print("\n".join(describe(model)))
    print(f"bundle: {written}")
    return 0


if __name__ == "__main__":
    main()
