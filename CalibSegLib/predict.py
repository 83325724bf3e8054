"""Command line: segment a volume with a bundle and write labels, confidence and entropy images.

    calibseg-predict --bundle model.calibseg --image case.nii.gz --out-dir out/ \
        [--reference ref.nii.gz] [--device auto] [--batch-size 16]
    calibseg-predict --bundle acdc_crac --image case.nii.gz --out-dir out/
    calibseg-predict --bundle acdc_crac --image-dir cases/ --out-dir out/     # every image of a folder
    calibseg-predict --bundle brats.calibseg --image a_0000.nii.gz --image a_0001.nii.gz ... --out-dir out/
    calibseg-predict --bundle acdc_crac --image dicom/series/ --out-dir out/ --dicom-seg --report

``--bundle`` is a bundle file or the name of a shipped model (:mod:`CalibSegLib.pretrained`).

A bundle of several channels takes one ``--image`` per channel, in the order of its ``channel_names``, all on one
grid; ``<stem>`` is then the case's name (``a`` for ``a_0000.nii.gz``, ``a_0001.nii.gz``, ...), as it is for one
file with a channel suffix.

Outputs, all on the input's exact grid: ``<stem>_labels.nii.gz`` (uint8),
``<stem>_confidence.nii.gz`` (max probability, float32) and ``<stem>_entropy.nii.gz``
(normalised entropy in [0, 1], float32), and for an ensemble bundle ``<stem>_disagreement.nii.gz`` (its members'
disagreement, the mutual information normalised by log C, float32 in [0, entropy]); always ``<stem>_summary.json``, the
quality summary without a reference (first ``input_check``, :func:`CalibSegLib.input_check.check_input`: is the image
like the model's training images; then :func:`CalibSegLib.quality.quality_summary`: per structure volume in mL,
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

**DICOM.** A folder given as ``--image`` is read as DICOM (:mod:`CalibSegLib.dicom`): its one image series
(single-frame files or one Enhanced MR multi-frame file), or the one ``--series-uid`` names; a broken series
(missing slices, mixed orientations, uneven spacing, not images) is one sentence and nothing is written, and so is
a cine of several time points, which ``calibseg-function --cine`` reads. With ``--image-dir`` every image series
under the folder is a case too (objects that are not images, such as Segmentations written earlier, are skipped
and counted). ``--dicom-seg`` adds ``<stem>_seg.dcm``, a DICOM Segmentation of the labels, and
``<stem>_confidence.dcm``, a Parametric Map of the confidence, both referencing the source series
(:mod:`CalibSegLib.dicom_seg`); it refuses, before inference, an input that is no DICOM series and a series
without a Frame of Reference UID. The NIfTI outputs are written as for any input.

**Report.** ``--report`` adds ``report.html`` (:mod:`CalibSegLib.report`): one self-contained page over the
case (or the folder's cases, worst first) with each case's input check, per structure volume, predicted Dice
and review flag (with ``--reference`` the measured Dice and HD95 beside them) and pictures of its worst
slices.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Hashable, Sequence, TextIO

import numpy as np

from CalibSegLib.bundle import BundleError
from CalibSegLib.analysis import analyse_case
from CalibSegLib.channels import channel_order, first_collision, first_repeat, input_names
from CalibSegLib.dicom import (
    DicomSeries,
    choose_series,
    find_series,
    in_source_order,
    read_series,
    series_case_names,
    series_headers,
)
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
from CalibSegLib.pretrained import bundle_label, pretrained_models, resolve_bundle_path
from CalibSegLib.quality import review_sentence, structure_key, summary_columns

if TYPE_CHECKING:
    from CalibSegLib.report import ReportCase

# The Slicer module imports this module (batch_row) without highdicom or matplotlib, which only the DICOM
# outputs (CalibSegLib.dicom_seg) and the report page (CalibSegLib.report) need: those are imported where they
# are made.
REPORT_NAME = "report.html"  # CalibSegLib.report.REPORT_NAME, checked by Testing/test_report.py

__all__ = ["BATCH_TABLE", "CaseInput", "case_name", "case_input", "channel_files", "predict_files",
           "folder_images", "folder_cases", "folder_inputs", "batch_row", "predict_folder", "summary_lines",
           "ProgressReport", "main"]

OUTPUT_MAPS: tuple[str, ...] = ("labels", "confidence", "entropy")
ENSEMBLE_MAPS: tuple[str, ...] = ("disagreement",)  # an ensemble bundle's further map
JSON_OUTPUTS: tuple[str, ...] = ("metrics", "summary")
# --dicom-seg: output name → file ending
DICOM_OUTPUTS: dict[str, str] = {"dicom_seg": "_seg.dcm", "dicom_confidence": "_confidence.dcm"}
BATCH_TABLE = "predictions.csv"


def case_name(image_paths: Sequence[Path]) -> str:
    """The name a case's outputs carry: its files' case name when they are its channels 0, 1, ... by their suffixes
    (``a_0000.nii.gz``, ``a_0001.nii.gz`` → ``a``; ``a_0000.nii.gz`` alone → ``a``), else the first file's stem."""
    stems = [image_stem(path) for path in image_paths]
    cases = group_channels(stems)
    if len(cases) == 1 and cases[0][1] == {index: index for index in range(len(stems))}:
        return cases[0][0]
    return stems[0]


@dataclass(frozen=True)
class CaseInput:
    """One case to segment: its name (its outputs' stem) and either its image files (one per channel) or one
    DICOM series."""

    name: str
    files: tuple[Path, ...] = ()
    series: DicomSeries | None = None

    @property
    def shown(self) -> str:
        """How progress names the case: its file, or its name when it is several files or a series."""
        return self.files[0].name if len(self.files) == 1 else self.name


def case_input(image_paths: str | Path | Sequence[str | Path], series_uid: str | None = None) -> CaseInput:
    """The case of ``--image``: image files (one per channel), or one folder of DICOM files whose image series
    (or the one ``series_uid`` names) is the case, named after the folder.

    Raises:
        ValueError: a folder beside other images, ``series_uid`` without a folder, or a folder whose series
            cannot be chosen (:func:`CalibSegLib.dicom.choose_series`).
    """
    paths = [Path(image_paths)] if isinstance(image_paths, (str, Path)) else list(map(Path, image_paths))
    folders = [path for path in paths if path.is_dir()]
    if folders and len(paths) > 1:
        raise ValueError(f"{folders[0]} is a DICOM folder, and a DICOM series is one channel; give one "
                         "--image folder alone, or one image file per channel.")
    if folders:
        series = choose_series(find_series(folders[0]), folders[0], series_uid)
        return CaseInput(folders[0].name, series=series)
    if series_uid is not None:
        raise ValueError("--series-uid chooses a series of a DICOM folder; give --image the folder that "
                         "holds it.")
    return CaseInput(case_name(paths), tuple(paths))


def _file_key(path: Path) -> Hashable:
    """What makes two paths one file (a link, another spelling of the path): its device and inode."""
    try:
        status = path.stat()
    except OSError:  # read_channels says why it cannot be read
        return str(path.resolve())
    return status.st_dev, status.st_ino


def channel_files(predictor: Predictor, image_paths: Sequence[Path]) -> list[Path]:
    """``image_paths`` in the order of ``predictor``'s channels: by their ``_0000`` ... suffixes when they all
    carry one, else as given (:func:`CalibSegLib.channels.channel_order`).

    Raises:
        ValueError: a file given twice, another number of files than the bundle has channels, or suffixes that
            do not name exactly the bundle's channels of one case.
    """
    channel_names = input_names(predictor.metadata)
    repeat = first_repeat([_file_key(path) for path in image_paths])
    if repeat is not None:
        first, second = (image_paths[position] for position in repeat)
        given = f"{first.name} is given twice" if first.name == second.name else \
            f"{first.name} and {second.name} are the same file"
        raise ValueError(f"{given}; give each of the model's {len(channel_names)} channels "
                         f"({', '.join(channel_names)}) its own file.")
    order = channel_order([image_stem(path) for path in image_paths], channel_names)
    return [image_paths[position] for position in order]


def _in_channel_order(predictor: Predictor, case: CaseInput) -> CaseInput:
    """``case`` as ``predictor``'s bundle reads it: its files in the order of the bundle's channels
    (:func:`channel_files`) and named after them; a DICOM series (one channel) checked against the bundle.

    Raises:
        ValueError: files that are not the bundle's channels, or a series for a bundle of several channels.
    """
    if case.series is None:
        files = channel_files(predictor, list(case.files))
        return CaseInput(case_name(files), tuple(files))
    expected = predictor.metadata.in_channels
    if expected != 1:
        raise ValueError(f"The model reads {expected} channels ({', '.join(input_names(predictor.metadata))}), but "
                         "a DICOM series (one channel) was given; give one image file per channel.")
    return case


def predict_files(
    predictor: Predictor,
    image_path: str | Path | Sequence[str | Path] | CaseInput,
    out_dir: str | Path,
    reference_path: str | Path | None = None,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
    dicom_seg: bool = False,
    report_cases: list[ReportCase] | None = None,
) -> dict[str, Path]:
    """Predict the image at ``image_path`` (one path per channel of the bundle, in its order, a DICOM folder
    or a :class:`CaseInput`) and write its maps (and metrics) into ``out_dir``, named after the case.

    ``dicom_seg``: also write the DICOM Segmentation and confidence Parametric Map of a DICOM series;
    ``report_cases``: a list that gets the case for the report page (:func:`CalibSegLib.report.report_case`).

    Returns:
        ``{["metrics",] "summary", "labels", "confidence", "entropy"[, "disagreement"][, "dicom_seg",
        "dicom_confidence"]}`` → written paths (the disagreement for an ensemble bundle).

    Raises:
        ValueError: image files that are not the bundle's channels (:func:`channel_files`), ``out_dir`` cannot
            take the outputs (both checked before any image is read), an unreadable image/reference, channels on
            different grids, ``dicom_seg`` for an input that is no DICOM series or one a Segmentation cannot
            reference (:func:`CalibSegLib.dicom_seg.check_source`), a reference not on the
            image's grid or with labels the model does not have, an image the predictor refuses, or non-finite
            probabilities. Nothing is written then, and earlier outputs of the same case stay as they were.
    """
    case = _in_channel_order(predictor, image_path if isinstance(image_path, CaseInput) else case_input(image_path))
    out_dir = Path(out_dir)
    stem = case.name
    maps = OUTPUT_MAPS + (ENSEMBLE_MAPS if predictor.members > 1 else ())
    names = (("metrics",) if reference_path is not None else ()) + ("summary",) + maps
    # Checked before the image is even read: a bad --out-dir must not cost an inference.
    outputs = {
        name: check_output_file(out_dir / f"{stem}_{name}{'.json' if name in JSON_OUTPUTS else '.nii.gz'}")
        for name in names
    }
    if dicom_seg:
        if case.series is None:
            raise ValueError(f"--dicom-seg writes a DICOM Segmentation that references the series it was "
                             f"predicted from, and {case.shown} is no DICOM series; give --image a DICOM "
                             "folder, or leave out --dicom-seg.")
        for name, ending in DICOM_OUTPUTS.items():
            outputs[name] = check_output_file(out_dir / f"{stem}{ending}")
    image, geometry = read_series(case.series) if case.series is not None else read_channels(list(case.files))
    source = None
    if dicom_seg:  # what highdicom would refuse after the inference is refused before it
        from CalibSegLib.dicom_seg import check_source

        source = series_headers(case.series)
        check_source(source, case.series.label)
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
    datasets = {}
    if dicom_seg:
        from CalibSegLib.dicom_seg import confidence_dataset, segmentation_dataset

        label, metadata = bundle_label(predictor.bundle.path), predictor.metadata
        labels, confidence = (in_source_order(volume, case.series)
                              for volume in (prediction.labels, prediction.confidence))
        datasets = {"dicom_seg": segmentation_dataset(labels, source, metadata, label, analysis.summary),
                    "dicom_confidence": confidence_dataset(confidence, source, metadata, label)}
    with OutputSet() as output_set:
        if analysis.metrics is not None:
            write_json_atomic(output_set.stage(outputs["metrics"]), analysis.metrics)
        write_json_atomic(output_set.stage(outputs["summary"]), analysis.summary)
        for name in maps:
            write_image(output_set.stage(outputs[name]), getattr(prediction, name), geometry)
        for name, dataset in datasets.items():
            dataset.save_as(output_set.stage(outputs[name]), enforce_file_format=True)
    if report_cases is not None:
        from CalibSegLib.report import report_case

        report_cases.append(report_case(stem, image, geometry.spacing, analysis, predictor.metadata))
    return outputs


def _listed_images(folder: Path) -> list[Path]:
    """The image files directly in ``folder`` (:data:`~CalibSegLib.io.IMAGE_SUFFIXES`), not hidden ones."""
    return sorted(path for path in folder.iterdir() if path.is_file() and not path.name.startswith(".")
                  and path.name.lower().endswith(IMAGE_SUFFIXES))


def folder_images(folder: str | Path) -> list[Path]:
    """The images of ``folder`` (:data:`~CalibSegLib.io.IMAGE_SUFFIXES`, hidden files left out), sorted.

    Raises:
        ValueError: the folder does not exist or holds no image.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"Image folder {folder} does not exist; pass --image-dir with a folder of images.")
    images = _listed_images(folder)
    if not images:
        raise ValueError(f"{folder} holds no image ({', '.join(IMAGE_SUFFIXES)}); pass --image-dir with a folder "
                         "of images.")
    return images


def _channel_cases(images: Sequence[Path], folder: Path) -> list[list[Path]]:
    """``images`` of ``folder`` grouped into cases, channel 0 first.

    Raises:
        ValueError: two images would be one case (the same name in two formats, ``a.nii.gz`` beside
            ``a_0000.nii.gz``: :func:`CalibSegLib.channels.first_collision`), which would merge them or write one's
            outputs over the other's.
    """
    stems = [image_stem(path) for path in images]
    collision = first_collision(stems)
    if collision is not None:
        first, second = (images[position] for position in collision)
        raise ValueError(f"{first.name} and {second.name} in {folder} would both be case "
                         f"'{case_name([first])}'; rename or move one of them, so that each case gets its "
                         "own outputs.")
    return [[images[channels[index]] for index in sorted(channels)] for _, channels in group_channels(stems)]


def folder_cases(folder: str | Path) -> list[list[Path]]:
    """The cases of ``folder``'s images (:func:`folder_images`): the ``<case>_0000`` ... ``_000K`` files of a case
    together, channel 0 first; every other image a case of its own.

    Raises:
        ValueError: the folder does not exist or holds no image, or two images would be one case.
    """
    return _channel_cases(folder_images(folder), Path(folder))


def folder_inputs(folder: str | Path) -> tuple[list[CaseInput], list[DicomSeries]]:
    """The cases of ``--image-dir``: those of its image files (:func:`folder_cases`), then every DICOM image
    series under it (subfolders included), named by :func:`CalibSegLib.dicom.series_case_names`; and the DICOM
    series that are no images (Segmentations, reports, ...), which are not cases.

    Raises:
        ValueError: the folder does not exist, holds neither an image file nor a DICOM image series, or
            holds a DICOM file that cannot be read.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"Image folder {folder} does not exist; pass --image-dir with a folder of images.")
    cases = [CaseInput(case_name(paths), tuple(paths)) for paths in _channel_cases(_listed_images(folder), folder)]
    every_series = find_series(folder)
    images = [series for series in every_series if series.is_image]
    names = series_case_names(images, folder)
    cases += [CaseInput(name, series=series) for name, series in zip(names, images)]
    if not cases:
        raise ValueError(f"{folder} holds no image ({', '.join(IMAGE_SUFFIXES)}) and no DICOM image series; "
                         "pass --image-dir with a folder of images or DICOM series.")
    repeat = first_repeat([case.name for case in cases])
    if repeat is not None:
        first, second = (cases[position] for position in repeat)
        raise ValueError(f"{first.shown} and {second.shown} in {folder} would both be case '{first.name}'; rename "
                         "or move one of them, so that each case gets its own outputs.")
    return cases, [series for series in every_series if not series.is_image]


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
                   progress_stream: TextIO | None = None, dicom_seg: bool = False,
                   report: bool = False) -> tuple[list[dict[str, Any]], Path]:
    """Segment every case of ``image_dir`` (:func:`folder_inputs`) into ``out_dir`` (each one output set, as
    :func:`predict_files` writes it) and write :data:`BATCH_TABLE` over them, and with ``report`` the page
    :data:`~CalibSegLib.report.REPORT_NAME`; a case that fails gets its error in its row (and on the page).

    Returns:
        The table's rows and its path.

    Raises:
        ValueError: no case in ``image_dir``, cases that would share a name (:func:`folder_inputs`), ``dicom_seg``
            with image files among the cases, or ``out_dir`` is ``image_dir`` or cannot take the outputs (before
            any inference).
    """
    cases, others = folder_inputs(image_dir)
    if Path(out_dir).resolve() == Path(image_dir).resolve():
        raise ValueError(f"The output folder is the image folder {image_dir}: the outputs "
                         "(<case>_labels.nii.gz, ...) would be read as cases by the next run; choose another "
                         "--out-dir.")
    files = [case.shown for case in cases if case.series is None]
    if dicom_seg and files:
        raise ValueError(f"--dicom-seg needs DICOM series, and {image_dir} holds image files too "
                         f"({files[0]}, ...); segment those without --dicom-seg.")
    out_dir = check_output_folder(out_dir)
    table = check_output_file(Path(out_dir) / BATCH_TABLE)
    page = check_output_file(Path(out_dir) / REPORT_NAME) if report else None
    if others and progress_stream is not None:
        print(f"skipped: {len(others)} DICOM series that are not images ({others[0].label}, ...)",
              file=progress_stream)
    rows: list[dict[str, Any]] = []
    report_cases: list[ReportCase] | None = [] if report else None
    for number, case in enumerate(cases, start=1):
        progress = ProgressReport(progress_stream, f"segmenting {case.shown} ({number} of {len(cases)})") \
            if progress_stream is not None else None
        error = None
        try:
            outputs = predict_files(predictor, case, out_dir, progress=progress, dicom_seg=dicom_seg,
                                    report_cases=report_cases)
            rows.append(batch_row(case.name, "ok", json.loads(outputs["summary"].read_text())))
        except ValueError as raised:
            error = str(raised)
        except OSError as raised:
            error = os_error_sentence(raised)
        finally:
            if progress is not None:
                progress.close()
        if error is not None:
            rows.append(batch_row(case.name, f"error: {error}"))
            if report_cases is not None:
                from CalibSegLib.report import ReportCase

                report_cases.append(ReportCase(case.name, error=error))
    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(rows)
    with atomic_output(table) as temporary:
        temporary.write_text(buffer.getvalue())
    if page is not None:
        from CalibSegLib.report import write_report

        write_report(page, report_cases, predictor.metadata, bundle_label(predictor.bundle.path),
                     "calibseg-predict")
    return rows, table


def summary_lines(summary: dict[str, Any], metrics: dict[str, float] | None = None) -> list[str]:
    """A short, printable account of one case's quality summary (``<stem>_summary.json``).

    First the input check (:func:`CalibSegLib.input_check.input_check_lines`), then one line per structure: volume (mL),
    mean confidence, predicted Dice with its interval (when the bundle has a quality model), the measured Dice when
    ``metrics`` (``<stem>_metrics.json``) are given, and REVIEW or ok; then :func:`CalibSegLib.quality.review_sentence`.
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
    lines.append(review_sentence(summary))
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
                        help="3D image (NIfTI, NRRD, MHA) or a folder of one DICOM series; for a bundle of "
                             "several channels one --image file per channel: <case>_0000, <case>_0001, ... in any "
                             "order, or files without these suffixes in the bundle's order")
    source.add_argument("--image-dir", type=Path,
                        help=f"a folder of 3D images and DICOM series: each one a case (<case>_0000 ... "
                             f"_000K files one case of several channels), and {BATCH_TABLE}")
    parser.add_argument("--series-uid",
                        help="with an --image DICOM folder of several series: the one to segment")
    parser.add_argument("--out-dir", required=True, type=Path, help="folder for the output images")
    parser.add_argument("--reference", type=Path, help="reference label image on the same grid, for metrics")
    parser.add_argument("--dicom-seg", action="store_true",
                        help="also write <case>_seg.dcm (DICOM Segmentation) and <case>_confidence.dcm "
                             "(DICOM Parametric Map), referencing the source series (DICOM input only)")
    parser.add_argument("--report", action="store_true",
                        help=f"also write {REPORT_NAME}: one page over the cases, worst first, with pictures")
    parser.add_argument(
        "--device", default="auto", help="auto (CUDA when present), cpu or cuda (default: auto)"
    )
    parser.add_argument("--batch-size", type=int, default=16, help="slices per forward pass (default: 16)")
    return parser


def _predict_case(arguments: argparse.Namespace) -> int:
    """``--image``: one case; prints its account and the written paths."""
    check_output_folder(arguments.out_dir)  # a bad --out-dir is reported before the bundle loads
    case = case_input(arguments.image, arguments.series_uid)
    page = check_output_file(arguments.out_dir / REPORT_NAME) if arguments.report else None
    predictor = Predictor(resolve_bundle_path(arguments.bundle), device=arguments.device,
                          batch_size=arguments.batch_size)
    # stdout, like the summary: stderr carries nothing but the one-sentence error
    progress = ProgressReport(sys.stdout, f"segmenting {case.shown}")
    report_cases: list[ReportCase] | None = [] if page is not None else None
    try:
        outputs = predict_files(predictor, case, arguments.out_dir, arguments.reference, progress=progress,
                                dicom_seg=arguments.dicom_seg, report_cases=report_cases)
    finally:
        progress.close()
    if page is not None:
        from CalibSegLib.report import write_report

        outputs["report"] = write_report(page, report_cases, predictor.metadata,
                                         bundle_label(predictor.bundle.path),
                                         "calibseg-predict")
    summary = json.loads(outputs["summary"].read_text())
    metrics = json.loads(outputs["metrics"].read_text()) if "metrics" in outputs else None
    print(f"{case.name}: " + "\n".join(summary_lines(summary, metrics)))
    for name, path in outputs.items():
        print(f"{name}: {path}")
    return 0


def _predict_folder(arguments: argparse.Namespace) -> int:
    """``--image-dir``: every image a case; 0 when all were segmented, 2 when any failed (said on stderr)."""
    if arguments.reference is not None:
        raise ValueError("--reference names one case's reference; use it with --image, not --image-dir.")
    if arguments.series_uid is not None:
        raise ValueError("--series-uid chooses a series of one --image folder; with --image-dir every series "
                         "is a case.")
    folder_inputs(arguments.image_dir)
    check_output_folder(arguments.out_dir)
    predictor = Predictor(resolve_bundle_path(arguments.bundle), device=arguments.device,
                          batch_size=arguments.batch_size)
    rows, table = predict_folder(predictor, arguments.image_dir, arguments.out_dir, sys.stdout,
                                 dicom_seg=arguments.dicom_seg, report=arguments.report)
    for row in rows:
        flag = {True: "REVIEW", False: "ok", None: "not judged"}[row["review"]] if row["status"] == "ok" else ""
        print(f"{row['case']}: {flag or row['status']}")
    print(f"table: {table}")
    if arguments.report:
        print(f"report: {Path(arguments.out_dir) / REPORT_NAME}")
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
