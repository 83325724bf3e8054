"""Command line: segment a volume with a bundle and write labels, confidence and entropy images.

    python -m CalibSegLib.predict --bundle model.calibseg --image case.nii.gz --out-dir out/ [--reference ref.nii.gz]

Outputs, all on the input's exact grid: ``<stem>_labels.nii.gz`` (uint8),
``<stem>_confidence.nii.gz`` (max probability) and ``<stem>_entropy.nii.gz`` (normalised
entropy in [0, 1]); with ``--reference`` also ``<stem>_metrics.json``. This is the same
library path the Slicer module runs. Errors print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from CalibSegLib.bundle import BundleError
from CalibSegLib.evaluation import case_metrics_row, predict_and_evaluate
from CalibSegLib.inference import Predictor
from CalibSegLib.io import read_image, write_image

__all__ = ["main", "write_json_atomic", "image_stem"]


def image_stem(path: Path) -> str:
    """File name without image extensions (``case.nii.gz`` → ``case``)."""
    name = path.name
    for suffix in (".nii.gz", ".nii", ".nrrd", ".mha", ".mhd"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def write_json_atomic(path: Path, payload: dict) -> Path:
    """Write JSON to a temporary file beside ``path``, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w") as handle:
            json.dump(payload, handle, indent=2, allow_nan=True)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m CalibSegLib.predict", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, type=Path, help="model bundle (.calibseg)")
    parser.add_argument("--image", required=True, type=Path, help="3D image (NIfTI, NRRD, MHA)")
    parser.add_argument("--out-dir", required=True, type=Path, help="folder for the output images")
    parser.add_argument("--reference", type=Path, help="reference label image on the same grid, for metrics")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    parser.add_argument("--batch-size", type=int, default=16, help="slices per forward pass")
    return parser


def run(arguments: argparse.Namespace) -> dict[str, Path]:
    """Predict, write the outputs and return their paths."""
    predictor = Predictor(arguments.bundle, device=arguments.device, batch_size=arguments.batch_size)
    image, geometry = read_image(arguments.image)
    stem = image_stem(arguments.image)
    outputs: dict[str, Path] = {}
    if arguments.reference is not None:
        reference, reference_geometry = read_image(arguments.reference)
        if reference.shape != image.shape or not np.allclose(reference_geometry.spacing, geometry.spacing, atol=1e-4):
            raise ValueError(
                f"The reference {arguments.reference.name} is not on the image's grid "
                f"(shape {reference.shape} vs {image.shape}); resample it onto the image first."
            )
        evaluation = predict_and_evaluate(predictor, image, reference.astype(np.int64), geometry.spacing)
        prediction = evaluation.prediction
        names = predictor.bundle.metadata.class_names
        outputs["metrics"] = write_json_atomic(
            arguments.out_dir / f"{stem}_metrics.json", case_metrics_row(evaluation, names)
        )
    else:
        prediction = predictor.predict(image, geometry.spacing)
    for name, array in (("labels", prediction.labels), ("confidence", prediction.confidence),
                        ("entropy", prediction.entropy)):
        outputs[name] = write_image(arguments.out_dir / f"{stem}_{name}.nii.gz", array, geometry)
    return outputs


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    try:
        outputs = run(arguments)
    except (BundleError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for name, path in outputs.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
