"""Command line: segment a volume with a bundle and write labels, confidence and entropy images.

    calibseg-predict --bundle model.calibseg --image case.nii.gz --out-dir out/ \
        [--reference ref.nii.gz] [--device auto] [--batch-size 16]
    calibseg-predict --bundle acdc_crac --image case.nii.gz --out-dir out/
    calibseg-predict --bundle acdc_crac --image-dir cases/ --out-dir out/     # every image of a folder
    calibseg-predict --bundle brats.calibseg --image a_0000.nii.gz --image a_0001.nii.gz ... --out-dir out/

``--bundle`` is a bundle file or the name of a shipped model (:mod:`CalibSegLib.pretrained`).

A bundle of several channels takes one ``--image`` per channel, in the order of its ``channel_names``, all on one
grid; ``<stem>`` is then the case's name (``a`` for ``a_0000.nii.gz``, ``a_0001.nii.gz``, ...), as it is for one
file with a channel suffix.

Outputs, all on the input's exact grid: ``<stem>_labels.nii.gz`` (uint8),
``<stem>_confidence.nii.gz`` (max probability, float32) and ``<stem>_entropy.nii.gz``
(normalised entropy in [0, 1], float32); always ``<stem>_summary.json``, the quality summary
without a reference (first ``input_check``, :func:`CalibSegLib.input_check.check_input`: is the image like the model's training
images; then :func:`CalibSegLib.quality.quality_summary`: per structure volume in mL,
mean confidence and entropy, low-confidence fraction, predicted Dice with its interval and a
review flag; the most uncertain slices); with ``--reference`` also ``<stem>_metrics.json``
(Dice/HD95/ASD per class in mm, each measured Dice followed by the predicted one, calibration
metrics streamed batch by batch, error detection). The work is done by :func:`predict_files`
on the same library path the Slicer module runs; errors print one line and exit with status 2
(Ctrl-C: 130).

With ``--image-dir`` every image of the folder is one such case, or the ``<case>_0000`` ... ``_000K`` files of one
case together (:func:`folder_cases`, :func:`predict_folder`), and
``predictions.csv`` in the output folder holds one row per case: its status (``ok`` or the error's
sentence), the case's review flag and per structure the volume, predicted Dice and review flag. A case
that fails is reported in its row and does not stop the others; the command then exits with status 2.

While it runs it shows a progress bar on a terminal (tqdm, when installed) or a line at every
quarter otherwise (logs, CI); at the end it prints a short summary of the case
(:func:`summary_lines`: each structure's volume in mL, mean confidence and predicted Dice, the
review sentence; with a reference the measured Dice) and the written paths.

The outputs are one set (:class:`CalibSegLib.io.OutputSet`): the output folder is checked
before inference, every file is written under a temporary name and all are renamed at the
end, so an error or Ctrl-C leaves the previous outputs (or none) exactly as they were.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

import numpy as np

from CalibSegLib.bundle import BundleError
from CalibSegLib.analysis import analyse_case
from CalibSegLib.inference import Predictor
from CalibSegLib.input_check import input_check_lines
from CalibSegLib.io import (
    IMAGE_SUFFIXES,
    OutputSet,
    atomic_output,
    check_output_file,
    check_output_folder,
    group_channels,
    image_stem,
    os_error_sentence,
    read_channels,
    read_image,
    write_image,
    write_json_atomic,
)
from CalibSegLib.pretrained import pretrained_models, resolve_bundle_path
from CalibSegLib.quality import review_text, structure_key, summary_columns

__all__ = ["BATCH_TABLE", "case_name", "predict_files", "folder_images", "folder_cases", "batch_row",
           "predict_folder", "summary_lines", "ProgressReport", "main"]

OUTPUT_MAPS: tuple[str, ...] = ("labels", "confidence", "entropy")
JSON_OUTPUTS: tuple[str, ...] = ("metrics", "summary")
BATCH_TABLE = "predictions.csv"


def case_name(image_paths: Sequence[Path]) -> str:
    """The name a case's outputs carry: its files' case name when they are its channels 0, 1, ... by their suffixes
    (``a_0000.nii.gz``, ``a_0001.nii.gz`` → ``a``; ``a_0000.nii.gz`` alone → ``a``), else the first file's stem."""
    stems = [image_stem(path) for path in image_paths]
    cases = group_channels(stems)
    if len(cases) == 1 and cases[0][1] == {index: index for index in range(len(stems))}:
        return cases[0][0]
    return stems[0]


def _shown(image_paths: Sequence[Path]) -> str:
    """How progress names a case: its file, or its name when it is several files."""
    return image_paths[0].name if len(image_paths) == 1 else case_name(image_paths)


def _read_case(predictor: Predictor, image_paths: Sequence[Path]) -> tuple[np.ndarray, Any]:
    """The ``(z, y, x)`` or ``(K, z, y, x)`` image of one file per channel of ``predictor``'s bundle, and its grid.

    Raises:
        ValueError: another number of files than the bundle has channels, or channels on different grids.
    """
    expected = predictor.metadata.in_channels
    if len(image_paths) != expected:
        names = ", ".join(predictor.metadata.channel_names or ["image"])
        raise ValueError(f"The bundle takes {expected} channel(s) ({names}), one --image each in that order, but "
                         f"{len(image_paths)} image(s) were given.")
    return read_channels(list(image_paths))


def predict_files(
    predictor: Predictor,
    image_path: str | Path | Sequence[str | Path],
    out_dir: str | Path,
    reference_path: str | Path | None = None,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Path]:
    """Predict the image at ``image_path`` (or one path per channel of the bundle, in its order) and write its maps
    (and metrics) into ``out_dir``, named after the case (:func:`case_name`).

    Returns:
        ``{["metrics",] "summary", "labels", "confidence", "entropy"}`` → written paths.

    Raises:
        ValueError: ``out_dir`` cannot take the outputs (checked before anything else), an
            unreadable image/reference, another number of images than the bundle has channels, channels on
            different grids, a reference not on the image's grid or with labels the
            model does not have, an image the predictor refuses, or non-finite probabilities.
            Nothing is written then, and earlier outputs of the same case stay as they were.
    """
    paths = [Path(image_path)] if isinstance(image_path, (str, Path)) else [Path(path) for path in image_path]
    out_dir = Path(out_dir)
    stem = case_name(paths)
    names = (("metrics",) if reference_path is not None else ()) + ("summary",) + OUTPUT_MAPS
    # Checked before the image is even read: a bad --out-dir must not cost an inference.
    outputs = {
        name: check_output_file(out_dir / f"{stem}_{name}{'.json' if name in JSON_OUTPUTS else '.nii.gz'}")
        for name in names
    }
    image, geometry = _read_case(predictor, paths)
    reference = None
    if reference_path is not None:
        reference, reference_geometry = read_image(reference_path)
        if reference.shape != image.shape[-3:] or not reference_geometry.matches(geometry):
            raise ValueError(
                f"The reference {Path(reference_path).name} is not on the image's grid "
                f"(shape {reference.shape} vs {image.shape[-3:]}, or different spacing, origin or direction); "
                f"resample it onto the image first."
            )
        if not np.issubdtype(reference.dtype, np.integer):
            reference = _integer_labels(reference, Path(reference_path).name)
        reference = reference.astype(np.int64)
    analysis = analyse_case(predictor, image, geometry.spacing, reference, progress=progress, cancel=cancel)
    prediction = analysis.prediction
    with OutputSet() as output_set:
        if analysis.metrics is not None:
            write_json_atomic(output_set.stage(outputs["metrics"]), analysis.metrics)
        write_json_atomic(output_set.stage(outputs["summary"]), analysis.summary)
        for name in OUTPUT_MAPS:
            write_image(output_set.stage(outputs[name]), getattr(prediction, name), geometry)
    return outputs


def folder_images(folder: str | Path) -> list[Path]:
    """The images of ``folder`` (:data:`~CalibSegLib.io.IMAGE_SUFFIXES`, hidden files left out), sorted.

    Raises:
        ValueError: the folder does not exist or holds no image.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"Image folder {folder} does not exist; pass --image-dir with a folder of images.")
    images = sorted(path for path in folder.iterdir()
                    if path.is_file() and not path.name.startswith(".") and path.name.lower().endswith(IMAGE_SUFFIXES))
    if not images:
        raise ValueError(f"{folder} holds no image ({', '.join(IMAGE_SUFFIXES)}); pass --image-dir with a folder "
                         "of images.")
    return images


def folder_cases(folder: str | Path) -> list[list[Path]]:
    """The cases of ``folder``'s images (:func:`folder_images`): the ``<case>_0000`` ... ``_000K`` files of a case
    together, channel 0 first; every other image a case of its own.

    Raises:
        ValueError: the folder does not exist or holds no image.
    """
    images = folder_images(folder)
    return [[images[channels[index]] for index in sorted(channels)]
            for _, channels in group_channels([image_stem(path) for path in images])]


def batch_row(case: str, status: str, summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """One row of :data:`BATCH_TABLE` (and of the Slicer module's batch table): the case, its status (``ok``,
    ``error: <sentence>``, ...) and, when it was segmented, its input check (the lines
    :func:`~CalibSegLib.input_check.input_check_lines` prints, joined, as the Slicer quality table shows
    them; the network's feature distance and its threshold as numbers, None where not checked),
    its review flag, per structure the volume (mL) and the :func:`~CalibSegLib.quality.summary_columns` of its
    ``summary``."""
    if summary is None:
        return {"case": case, "status": status}
    volumes = {f"volume_ml_{structure_key(name)}": entry["volume_ml"] for name, entry in summary["structures"].items()}
    features = summary["input_check"].get("features") or {}  # none where the input was not checked
    return {"case": case, "status": status, "input_check": " ".join(input_check_lines(summary["input_check"])),
            "feature_distance": features.get("distance"), "feature_threshold": features.get("threshold"),
            "review": summary["review"], **volumes, **summary_columns(summary)}


def predict_folder(predictor: Predictor, image_dir: str | Path, out_dir: str | Path,
                   progress_stream: TextIO | None = None) -> tuple[list[dict[str, Any]], Path]:
    """Segment every image of ``image_dir`` into ``out_dir`` (each one output set, as :func:`predict_files`
    writes it) and write :data:`BATCH_TABLE` over them; a case that fails gets its error in its row.

    Returns:
        The table's rows and its path.

    Raises:
        ValueError: no image in ``image_dir``, or ``out_dir`` cannot take the outputs (before any inference).
    """
    cases = folder_cases(image_dir)
    out_dir = check_output_folder(out_dir)
    table = check_output_file(Path(out_dir) / BATCH_TABLE)
    rows = []
    for number, images in enumerate(cases, start=1):
        name = case_name(images)
        progress = ProgressReport(progress_stream, f"segmenting {_shown(images)} ({number} of {len(cases)})") \
            if progress_stream is not None else None
        try:
            outputs = predict_files(predictor, images, out_dir, progress=progress)
            rows.append(batch_row(name, "ok", json.loads(outputs["summary"].read_text())))
        except ValueError as error:
            rows.append(batch_row(name, f"error: {error}"))
        except OSError as error:
            rows.append(batch_row(name, f"error: {os_error_sentence(error)}"))
        finally:
            if progress is not None:
                progress.close()
    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(rows)
    with atomic_output(table) as temporary:
        temporary.write_text(buffer.getvalue())
    return rows, table


def summary_lines(summary: dict[str, Any], metrics: dict[str, float] | None = None) -> list[str]:
    """A short, printable account of one case's quality summary (``<stem>_summary.json``).

    First the input check (:func:`CalibSegLib.input_check.input_check_lines`), then one line per structure: volume (mL), mean confidence, predicted Dice with its interval (when
    the bundle has a quality model), the measured Dice when ``metrics`` (``<stem>_metrics.json``)
    are given, and REVIEW or ok; then :func:`CalibSegLib.quality.review_text`.
    """
    structures = summary["structures"]
    width = max(len(name) for name in structures)
    # A structure predicted nowhere has volume 0 and no means (CalibSegLib.quality).
    found = sum(entry["mean_confidence"] is not None for entry in structures.values())
    lines = [*input_check_lines(summary["input_check"]), f"{found} of {len(structures)} structures found"]
    for name, entry in structures.items():
        if entry["mean_confidence"] is None:
            cells = ["not found"]
        else:
            cells = [f"{entry['volume_ml']:7.1f} mL", f"mean confidence {entry['mean_confidence']:.2f}"]
            if entry["predicted_dice"] is not None:
                low, high = entry["predicted_dice_interval"]
                cells.append(f"predicted Dice {entry['predicted_dice']:.2f} [{low:.2f}, {high:.2f}]")
        if metrics is not None:
            cells.append(f"measured Dice {metrics[f'dice_{structure_key(name)}']:.2f}")
        flag = {True: "REVIEW", False: "ok", None: ""}[entry["review"]]
        lines.append(f"  {name:<{width}}  {'  '.join(cells)}  {flag}".rstrip())
    lines.append(review_text(summary))
    return lines


class ProgressReport:
    """A ``progress(fraction)`` callback for :class:`~CalibSegLib.inference.Predictor`: a tqdm bar when
    ``stream`` is a terminal and tqdm is installed, else one line per quarter (25 %, 50 %, ...), so
    logs stay short. Call :meth:`close` when done."""

    def __init__(self, stream: TextIO, label: str) -> None:
        self.stream, self.label, self.printed = stream, label, 0
        self.bar = None
        if stream.isatty():
            try:
                from tqdm import tqdm  # installed with the training extra; the core does not need it

                # mininterval 0: the predictor reports once per batch, never often enough to flood
                self.bar = tqdm(total=100, desc=label, unit="%", file=stream, leave=False, mininterval=0,
                                bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}")
            except ImportError:
                pass

    def __call__(self, fraction: float) -> None:
        percent = int(round(100 * min(max(float(fraction), 0.0), 1.0)))
        if self.bar is not None:
            self.bar.update(percent - self.bar.n)
            return
        quarter = percent // 25 * 25
        if quarter > self.printed:
            self.printed = quarter
            print(f"{self.label}: {quarter} %", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _integer_labels(reference: np.ndarray, name: str) -> np.ndarray:
    """Label images saved as floats (common for NIfTI) are accepted when every value is a whole number."""
    rounded = np.rint(reference)
    if not np.array_equal(rounded, reference):
        raise ValueError(f"The reference {name} holds non-integer values; give a label image.")
    return rounded.astype(np.int64)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calibseg-predict", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--bundle", required=True,
                        help="model bundle (.calibseg) or a shipped model's name: "
                             + (", ".join(pretrained_models()) or "none shipped"))
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--image", type=Path, action="append",
                        help="3D image (NIfTI, NRRD, MHA); for a bundle of several channels one --image per channel, "
                             "in the bundle's order")
    source.add_argument("--image-dir", type=Path, help=f"a folder of 3D images: each one a case (<case>_0000 ... "
                                                      f"_000K files one case of several channels), and {BATCH_TABLE}")
    parser.add_argument("--out-dir", required=True, type=Path, help="folder for the output images")
    parser.add_argument("--reference", type=Path, help="reference label image on the same grid, for metrics")
    parser.add_argument(
        "--device", default="auto", help="auto (CUDA when present), cpu or cuda (default: auto)"
    )
    parser.add_argument("--batch-size", type=int, default=16, help="slices per forward pass (default: 16)")
    return parser


def _predict_case(arguments: argparse.Namespace) -> int:
    """``--image``: one case; prints its account and the written paths."""
    check_output_folder(arguments.out_dir)  # a bad --out-dir is reported before the bundle loads
    predictor = Predictor(resolve_bundle_path(arguments.bundle), device=arguments.device,
                          batch_size=arguments.batch_size)
    # stdout, like the summary: stderr carries nothing but the one-sentence error
    name = case_name(arguments.image)
    progress = ProgressReport(sys.stdout, f"segmenting {_shown(arguments.image)}")
    try:
        outputs = predict_files(predictor, arguments.image, arguments.out_dir, arguments.reference, progress=progress)
    finally:
        progress.close()
    summary = json.loads(outputs["summary"].read_text())
    metrics = json.loads(outputs["metrics"].read_text()) if "metrics" in outputs else None
    print(f"{name}: " + "\n".join(summary_lines(summary, metrics)))
    for name, path in outputs.items():
        print(f"{name}: {path}")
    return 0


def _predict_folder(arguments: argparse.Namespace) -> int:
    """``--image-dir``: every image a case; 0 when all were segmented, 2 when any failed (said on stderr)."""
    if arguments.reference is not None:
        raise ValueError("--reference names one case's reference; use it with --image, not --image-dir.")
    folder_images(arguments.image_dir)
    check_output_folder(arguments.out_dir)
    predictor = Predictor(resolve_bundle_path(arguments.bundle), device=arguments.device,
                          batch_size=arguments.batch_size)
    rows, table = predict_folder(predictor, arguments.image_dir, arguments.out_dir, sys.stdout)
    for row in rows:
        flag = {True: "REVIEW", False: "ok", None: "not judged"}[row["review"]] if row["status"] == "ok" else ""
        print(f"{row['case']}: {flag or row['status']}")
    print(f"table: {table}")
    failed = [row for row in rows if row["status"] != "ok"]
    if failed:
        print(f"error: {len(failed)} of {len(rows)} cases failed (first: {failed[0]['case']}: "
              f"{failed[0]['status'][len('error: '):]}); the others' outputs and {table.name} are written.",
              file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 done, 2 bad input or a failed case, 130 interrupted)."""
    arguments = _parser().parse_args(argv)
    try:
        return (_predict_folder if arguments.image_dir is not None else _predict_case)(arguments)
    except (BundleError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
    except OSError as error:  # writing failed: the output set has put the previous files back
        print(f"error: {os_error_sentence(error)}", file=sys.stderr)
    except KeyboardInterrupt:
        kept = (f"the cases finished before are kept in {arguments.out_dir}, without {BATCH_TABLE}"
                if arguments.image_dir else f"nothing was written to {arguments.out_dir}")
        print(f"interrupted: {kept}.", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
