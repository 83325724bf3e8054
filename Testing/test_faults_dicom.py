"""Fault catalogue, DICOM input and output: each broken series, folder or flag is one sentence on stderr (exit
2) before any inference, and nothing is written; with ``--image-dir`` a broken series is one row and the
others are segmented; a cine that cannot be read as one is one sentence of ``read_cine_series``; a pixel spacing
no grid has, or a cine whose times are not one order, is one sentence of every command that reads DICOM."""

from __future__ import annotations

import csv
import shutil
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset

from CalibSegLib.cardiac import command
from CalibSegLib.dicom import SinglePhaseError, read_cine_series
from CalibSegLib.inference import Predictor
from CalibSegLib.io import ImageGeometry, write_image
from CalibSegLib.predict import main
from Datasets.dicom_series import write_cine, write_enhanced, write_series
from dicom_series import edit_file, edit_shared_group, swap_attribute
from fault_checks import assert_one_sentence, tree_snapshot
from tiny_bundles import make_test_bundle

GRID = ImageGeometry((5.0, 1.2, 0.9), (-20.0, 4.0, 9.5))
SLICES = 5


def _series(folder: Path, **options) -> list[Path]:
    volume = np.random.default_rng(9).normal(300, 60, size=(SLICES, 24, 20)).round()
    return write_series(folder, volume, GRID, **options)


def _position(path: Path, z: float) -> None:
    header = pydicom.dcmread(path)
    edit_file(path, ImagePositionPatient=[*header.ImagePositionPatient[:2], f"{z:.6f}"])


def _missing_slice(folder: Path) -> list[str]:
    _series(folder)[2].unlink()
    return []


def _two_orientations(folder: Path) -> list[str]:
    edit_file(_series(folder)[3], ImageOrientationPatient=[1, 0, 0, 0, 0, -1])
    return []


def _uneven_spacing(folder: Path) -> list[str]:
    files = _series(folder)
    _position(files[4], 9.5 + 3 * 5.0 + 7.0)  # steps 5, 5, 5, 7
    return []


def _repeats(folder: Path) -> list[str]:
    _series(folder, prefix="t0")
    files = _series(folder, prefix="t1")
    study = pydicom.dcmread(folder / "t0_000.dcm")
    for path in files:  # a repeat of the stack joins the first one's series, with the same Instance Numbers
        edit_file(path, SeriesInstanceUID=study.SeriesInstanceUID)
    return []


def _phases(count: int = 2) -> np.ndarray:
    """``(count, SLICES, 24, 20)`` whole numbers: the time points of a cine on GRID."""
    return np.random.default_rng(8).normal(300, 60, size=(count, SLICES, 24, 20)).round()


def _cine(folder: Path) -> list[str]:
    write_cine(folder, _phases(), GRID, trigger_times_ms=[0.0, 45.0])
    return []


def _enhanced_cine(folder: Path) -> list[str]:
    write_enhanced(folder / "cine.dcm", _phases(), GRID, trigger_times_ms=[0.0, 45.0])
    return []


def _no_frame_of_reference(folder: Path) -> list[str]:
    _series(folder, frame_uid=None)
    return []


def _sheared(folder: Path) -> list[str]:
    for index, path in enumerate(_series(folder)):
        edit_file(path, ImagePositionPatient=[-20.0, 4.0 + 2.0 * index, 9.5 + 5.0 * index])
    return []


def _two_sizes(folder: Path) -> list[str]:
    _series(folder)
    small = write_series(folder / "tmp", np.zeros((1, 12, 10)), GRID)[0]
    header = pydicom.dcmread(folder / "slice_001.dcm")
    edit_file(small, SeriesInstanceUID=header.SeriesInstanceUID,
              ImagePositionPatient=[-20.0, 4.0, 9.5 + 5 * SLICES])
    shutil.move(small, folder / "slice_extra.dcm")
    shutil.rmtree(folder / "tmp")
    return []


def _one_image(folder: Path) -> list[str]:
    for path in _series(folder)[1:]:
        path.unlink()
    return []


def _no_position(folder: Path) -> list[str]:
    for path in _series(folder):
        header = pydicom.dcmread(path)
        del header.ImagePositionPatient
        header.save_as(path)
    return []


def _multi_frame(folder: Path) -> list[str]:
    for path in _series(folder):
        edit_file(path, NumberOfFrames=2)
    return []


def _not_images(folder: Path) -> list[str]:
    folder.mkdir(parents=True)
    report = Dataset()
    report.file_meta = pydicom.dataset.FileMetaDataset()
    report.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.88.33"  # Comprehensive SR
    report.file_meta.MediaStorageSOPInstanceUID = pydicom.uid.generate_uid()
    report.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    report.SOPClassUID = report.file_meta.MediaStorageSOPClassUID
    report.SOPInstanceUID = report.file_meta.MediaStorageSOPInstanceUID
    report.SeriesInstanceUID, report.Modality, report.SeriesNumber = pydicom.uid.generate_uid(), "SR", 9
    report.save_as(folder / "report.dcm", enforce_file_format=True)
    return []


def _cut_short(folder: Path) -> list[str]:
    path = _series(folder)[1]
    path.write_bytes(path.read_bytes()[:-300])  # the header whole, the pixel data cut short
    return []


def _enhanced_cut_short(folder: Path) -> list[str]:
    path = write_enhanced(folder / "stack.dcm", _phases(1), GRID)
    path.write_bytes(path.read_bytes()[:-300])
    return []


def _no_dicom(folder: Path) -> list[str]:
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("no images here")
    return []


def _several_series(folder: Path) -> list[str]:
    _series(folder / "a")
    _series(folder / "b", series_number=4)
    return []


def _unknown_uid(folder: Path) -> list[str]:
    _series(folder)
    return ["--series-uid", "1.2.3.4"]


# case → (make(folder) -> extra arguments, regexes of the sentence); the folder is --image
BAD_DICOM_SERIES: dict[str, tuple[Callable[[Path], list[str]], tuple[str, ...]]] = {
    "a slice missing": (_missing_slice, ("has 1 slice\\(s\\) missing: its slices are 5 mm apart but 10 mm "
                                         "between slices 2 and 3", "export the complete series")),
    "a slice in another orientation": (_two_orientations, ("holds images in 2 orientations", "localizer")),
    "uneven slice spacing": (_uneven_spacing, ("uneven slice spacing \\(steps from 5 to 7 mm",)),
    "a cine of several time points": (_cine, ("is a cine of 2 time points at 5 slice positions, and "
                                              "calibseg-predict segments one volume; give it to "
                                              "calibseg-function --cine",)),
    "an Enhanced MR cine": (_enhanced_cine, ("series 5 'SA cine enhanced' \\(1 Enhanced MR Image Storage file\\(s\\) "
                                             "of 10 frames", "is a cine of 2 time points", "calibseg-function --cine")),
    "repeats that no time tells apart": (_repeats, ("holds 2 images at each of its 5 slice positions that no "
                                                    "trigger time, temporal position or instance number tells apart",
                                                    "export one image per position and time point")),
    "slices shifted in-plane (tilted gantry)": (_sheared, ("shifted in-plane", "tilted CT gantry")),
    "images of two sizes": (_two_sizes, ("holds images of 2 sizes \\(12×10, 24×20\\)",)),
    "one image": (_one_image, ("is one image, not a stack of slices",)),
    "no image position": (_no_position, ("lacks the position, orientation or pixel spacing",)),
    "multi-frame images": (_multi_frame, ("holds multi-frame images without per-frame functional groups",
                                          "single-frame images or as one Enhanced MR file")),
    "--dicom-seg without a Frame of Reference": (
        _no_frame_of_reference, ("--dicom-seg writes a DICOM Segmentation, which must share its source's Frame "
                                 "of Reference UID, and the DICOM series 3 .* has none; leave out --dicom-seg",)),
    "a structured report, not images": (_not_images, ("holds objects that are not images \\(1 "
                                                      "Comprehensive SR Storage\\)",)),
    "a slice file cut short": (_cut_short, ("Cannot read the pixel data of the DICOM series 3",
                                            "\\(Cannot read requested file: a file cut short",
                                            "export the series again")),
    "an Enhanced MR file cut short": (_enhanced_cut_short, (
        "Cannot read the pixel data of the DICOM series 5 .* \\(The number of bytes of pixel data is less than "
        "expected .*: a file cut short, or a compression pydicom cannot decode\\); export the series again",)),
    "no DICOM file in the folder": (_no_dicom, ("holds no DICOM file",)),
    "several image series": (_several_series, ("holds 2 image series", "choose one with --series-uid")),
    "an unknown --series-uid": (_unknown_uid, ("holds no series with UID 1.2.3.4; its series: series 3",)),
}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return make_test_bundle(tmp_path_factory.mktemp("bundle") / "model.calibseg")


def _no_inference(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("inference ran although the fault was detectable before it")

    monkeypatch.setattr(Predictor, "predict_variants", refuse)


def _predict(bundle: Path, *arguments: str) -> int:
    return main(["--bundle", str(bundle), *arguments, "--device", "cpu", "--batch-size", "2"])


@pytest.mark.parametrize("name", list(BAD_DICOM_SERIES))
def test_broken_dicom_is_one_sentence_before_inference_and_writes_nothing(name, bundle, tmp_path, monkeypatch,
                                                                          capsys):
    make, patterns = BAD_DICOM_SERIES[name]
    extra = make(tmp_path / "series")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "earlier.txt").write_text("kept")
    _no_inference(monkeypatch)
    before = tree_snapshot(tmp_path)
    assert _predict(bundle, "--image", str(tmp_path / "series"), "--out-dir", str(tmp_path / "out"),
                    "--dicom-seg", "--report", *extra) == 2
    error = capsys.readouterr().err
    assert_one_sentence(error, "^error: ", *patterns)
    assert tree_snapshot(tmp_path) == before


# case → (make(folder with one NIfTI image and a DICOM series) -> arguments, regex of the sentence)
BAD_DICOM_FLAGS: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "--dicom-seg with a NIfTI image": (
        lambda folder: ["--image", str(folder / "case.nii.gz"), "--dicom-seg"],
        "--dicom-seg writes a DICOM Segmentation that references the series it was predicted from, and "
        "case.nii.gz is no DICOM series; give --image a DICOM folder"),
    "--dicom-seg with image files in --image-dir": (
        lambda folder: ["--image-dir", str(folder), "--dicom-seg"],
        "--dicom-seg needs DICOM series, and .* holds image files too \\(case.nii.gz, ...\\)"),
    "--series-uid with a NIfTI image": (
        lambda folder: ["--image", str(folder / "case.nii.gz"), "--series-uid", "1.2.3"],
        "--series-uid chooses a series of a DICOM folder; give --image the folder that holds it"),
    "--series-uid with --image-dir": (
        lambda folder: ["--image-dir", str(folder), "--series-uid", "1.2.3"],
        "with --image-dir every series is a case"),
    "a DICOM folder beside an image file": (
        lambda folder: ["--image", str(folder / "series"), "--image", str(folder / "case.nii.gz")],
        "is a DICOM folder, and a DICOM series is one channel"),
}


@pytest.mark.parametrize("name", list(BAD_DICOM_FLAGS))
def test_dicom_flags_that_cannot_apply_are_one_sentence_before_inference(name, bundle, tmp_path, monkeypatch,
                                                                         capsys):
    make, pattern = BAD_DICOM_FLAGS[name]
    inputs = tmp_path / "inputs"
    _series(inputs / "series")
    write_image(inputs / "case.nii.gz", np.zeros((3, 24, 20), np.float32), GRID)
    _no_inference(monkeypatch)
    before = tree_snapshot(tmp_path)
    assert _predict(bundle, *make(inputs), "--out-dir", str(tmp_path / "out")) == 2
    assert_one_sentence(capsys.readouterr().err, "^error: ", pattern)
    assert tree_snapshot(tmp_path) == before


def _cine_missing_slice(folder: Path) -> None:
    _cine(folder)
    (folder / "t01_002.dcm").unlink()


def _cine_moved_time_point(folder: Path) -> None:
    _cine(folder)
    for path in sorted(folder.glob("t01_*.dcm")):  # the second time point 2 mm to the side
        position = [float(value) for value in pydicom.dcmread(path).ImagePositionPatient]
        edit_file(path, ImagePositionPatient=[f"{position[0] + 2.0:.6f}", *map(str, position[1:])])


def _enhanced_moved_time_point(folder: Path) -> None:
    path = write_enhanced(folder / "cine.dcm", _phases(), GRID, trigger_times_ms=[0.0, 45.0])
    dataset = pydicom.dcmread(path)
    for frame in dataset.PerFrameFunctionalGroupsSequence:
        if frame.FrameContentSequence[0].TemporalPositionIndex == 2:
            plane = frame.PlanePositionSequence[0]
            plane.ImagePositionPatient = [plane.ImagePositionPatient[0], plane.ImagePositionPatient[1] + 3.0,
                                          plane.ImagePositionPatient[2]]
    dataset.save_as(path)


def _single_slice_cine(folder: Path) -> None:
    write_cine(folder, _phases()[:, :1], GRID, trigger_times_ms=[0.0, 45.0])


# case → (make(folder), the exception's type, regexes of its sentence); the folder is read_cine_series'
BAD_DICOM_CINES: dict[str, tuple[Callable[[Path], object], type[ValueError], tuple[str, ...]]] = {
    "a time point missing a slice": (_cine_missing_slice, ValueError, (
        "holds 9 images at 5 slice positions, 1 to 2 at a position \\(a cine whose time points differ in their "
        "slices or geometry", "export a complete cine")),
    "a time point at other positions": (_cine_moved_time_point, ValueError, (
        "is a cine whose time points differ in geometry \\(time point 2's slices lie up to 2 mm from the first's\\)",)),
    "an Enhanced MR time point at other positions": (_enhanced_moved_time_point, ValueError, (
        "1 Enhanced MR Image Storage file\\(s\\) of 10 frames", "time point 2's slices lie up to 3 mm")),
    "two images at one time point": (
        lambda folder: write_cine(folder, _phases(4), GRID, trigger_times_ms=[0.0, 0.0, 45.0, 45.0]), ValueError,
        ("holds 4 images at each of its 5 slice positions that no trigger time, temporal position or instance "
         "number tells apart \\(echoes, magnitude and phase images or repeats",)),
    "a single-slice cine": (_single_slice_cine, ValueError, ("holds 2 images at one slice position",
                                                             "give a series of two or more slice positions")),
    "one time point (a volume)": (_series, SinglePhaseError, ("holds one time point of 5 slices, not a cine; give "
                                                              "a series of several time points",)),
    "an Enhanced MR file of one time point": (lambda folder: write_enhanced(folder / "one.dcm", _phases()[:1], GRID),
                                              SinglePhaseError, ("Enhanced MR Image Storage", "holds one time point")),
}


@pytest.mark.parametrize("name", list(BAD_DICOM_CINES))
def test_a_series_that_is_no_cine_is_one_sentence_of_read_cine_series(name, tmp_path):
    make, kind, patterns = BAD_DICOM_CINES[name]
    make(tmp_path / "cine")
    with pytest.raises(ValueError) as raised:
        read_cine_series(tmp_path / "cine")
    assert type(raised.value) is kind  # a volume is the caller's to judge, the others are broken cines
    assert_one_sentence(f"error: {raised.value}", "^error: The DICOM series ", *patterns)


def test_a_broken_series_in_image_dir_is_its_row_and_the_others_are_segmented(bundle, tmp_path, capsys):
    _series(tmp_path / "cases" / "good")
    _missing_slice(tmp_path / "cases" / "gap")
    assert _predict(bundle, "--image-dir", str(tmp_path / "cases"), "--out-dir", str(tmp_path / "out"),
                    "--dicom-seg", "--report") == 2
    assert_one_sentence(capsys.readouterr().err,
                        "^error: 1 of 2 cases failed \\(first: gap: The DICOM series 3",
                        "slice\\(s\\) missing")
    with (tmp_path / "out" / "predictions.csv").open() as table:
        rows = list(csv.DictReader(table))
    assert [row["case"] for row in rows] == ["gap", "good"] and rows[1]["status"] == "ok"
    assert rows[0]["status"].startswith("error: The DICOM series 3 'SA stack' (4 MR Image Storage file(s)")
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [
        "good_confidence.dcm", "good_confidence.nii.gz", "good_entropy.nii.gz", "good_labels.nii.gz",
        "good_seg.dcm", "good_summary.json", "predictions.csv", "report.html"]
    assert "NOT SEGMENTED" in (tmp_path / "out" / "report.html").read_text()


CINE_TIMES_MS = (0.0, 40.0, 80.0)
# Each slice position's trigger times off by a few ms: one breath-hold per position, each its own heart rate.
JITTER_MS = (0.0, 3.0, -2.0, 6.0, 1.0)


def _jittered_cine(folder: Path) -> list[Path]:
    """A classic cine of 3 time points at SLICES positions, Trigger Times CINE_TIMES_MS plus each position's
    JITTER_MS, Instance Numbers in time order at every position; the files, time point by time point."""
    files = write_cine(folder, _phases(3), GRID, trigger_times_ms=CINE_TIMES_MS)
    for index, path in enumerate(files):
        phase, position = divmod(index, SLICES)
        edit_file(path, TriggerTime=f"{CINE_TIMES_MS[phase] + JITTER_MS[position]:g}")
    return files


def _swapped_at_third_position(keyword: str) -> Callable[[Path], list[str]]:
    """A jittered cine whose first two time points exchange ``keyword`` at the third slice position."""
    def make(folder: Path) -> list[str]:
        files = _jittered_cine(folder)
        swap_attribute(files[2], files[SLICES + 2], keyword)
        return []
    return make


def _third_position_later(folder: Path) -> list[str]:
    for path in _jittered_cine(folder)[2::SLICES]:  # 35 ms later there, in the same order
        edit_file(path, TriggerTime=f"{float(pydicom.dcmread(path).TriggerTime) + 35.0:g}")
    return []


def _pixel_spacing(*spacing: str) -> Callable[[Path], list[str]]:
    def make(folder: Path) -> list[str]:
        with warnings.catch_warnings():  # pydicom warns that nan and inf are no decimal strings: the fault itself
            warnings.simplefilter("ignore", UserWarning)
            for path in _series(folder):
                edit_file(path, PixelSpacing=list(spacing))
        return []
    return make


def _enhanced_zero_spacing(folder: Path) -> list[str]:
    path = write_enhanced(folder / "cine.dcm", _phases(), GRID, trigger_times_ms=[0.0, 45.0])
    edit_shared_group(path, "PixelMeasuresSequence", PixelSpacing=["0", "0"])
    return []


def _positions_too_far_apart(folder: Path) -> list[str]:
    files = _series(folder)
    for path, z in ((files[0], "-1.7e308"), (files[-1], "1.7e308")):  # 16 characters at most, as DS allows
        edit_file(path, ImagePositionPatient=[*pydicom.dcmread(path).ImagePositionPatient[:2], z])
    return []


# case → (make(folder) -> [], regexes of the sentence); the folder goes to every command that reads DICOM
BAD_DICOM_GRIDS_AND_TIMES: dict[str, tuple[Callable[[Path], list[str]], tuple[str, ...]]] = {
    "Instance Numbers against the trigger times": (_swapped_at_third_position("InstanceNumber"), (
        "orders its images at slice position 3 of 5 differently by Trigger Time than by Instance Number",
        "export the cine again, or fix the trigger times or instance numbers")),
    "trigger times against the Instance Numbers": (_swapped_at_third_position("TriggerTime"), (
        "orders its images at slice position 3 of 5 differently by Trigger Time than by Instance Number",)),
    "time points that mix trigger times": (_third_position_later, (
        "is a cine whose time points mix trigger times \\(time point 1's image at slice position 3 of 5 is at 33 "
        "ms, in its position's own heart rate nearer time point 2 than its own\\); export the cine again, or fix "
        "the trigger times",)),
    "a Pixel Spacing of 0": (_pixel_spacing("0", "0"), (
        "gives a Pixel Spacing of 0 × 0 mm, which is not positive and finite, so its voxel grid is unknown; fix "
        "the Pixel Spacing or export the series again",)),
    "a negative Pixel Spacing": (_pixel_spacing("1.2", "-0.9"), ("Pixel Spacing of 1.2 × -0.9 mm, which is not "
                                                                "positive and finite",)),
    "a NaN Pixel Spacing": (_pixel_spacing("nan", "nan"), ("Pixel Spacing of nan × nan mm, which is not positive",)),
    "an infinite Pixel Spacing": (_pixel_spacing("inf", "0.9"), ("Pixel Spacing of inf × 0.9 mm, which is not "
                                                                "positive",)),
    "an Enhanced MR Pixel Spacing of 0": (_enhanced_zero_spacing, (
        "1 Enhanced MR Image Storage file\\(s\\) of 10 frames", "Pixel Spacing of 0 × 0 mm, which is not positive")),
    "a Pixel Spacing of 0.0005 mm": (_pixel_spacing("0.0005", "0.0005"), (
        "gives a Pixel Spacing of 0.0005 × 0.0005 mm, outside the 0.001 to 100 mm of any scanner's images, and "
        "volumes in mL are measured with it; fix the Pixel Spacing",)),
    "a Pixel Spacing of 200 mm": (_pixel_spacing("200", "200"), ("Pixel Spacing of 200 × 200 mm, outside the 0.001 "
                                                                 "to 100 mm",)),
    "slice positions too far apart for a finite step": (_positions_too_far_apart, (
        "has slice positions so far apart along the slice normal that the step between them is not a finite "
        "number of mm; fix the Image Position \\(Patient\\)",)),
}

# command → run(bundle, DICOM folder, out folder) -> exit status
DICOM_COMMANDS: dict[str, Callable[[Path, Path, Path], int]] = {
    "calibseg-predict --image": lambda bundle, folder, out: _predict(bundle, "--image", str(folder), "--out-dir",
                                                                     str(out)),
    "calibseg-function --cine": lambda bundle, folder, out: command.main([
        "--bundle", str(bundle), "--cine", str(folder), "--out-dir", str(out), "--device", "cpu"]),
    "calibseg-function --ed --es": lambda bundle, folder, out: command.main([
        "--bundle", str(bundle), "--ed", str(folder), "--es", str(folder), "--out-dir", str(out), "--device", "cpu"]),
}


@pytest.mark.parametrize("reader", list(DICOM_COMMANDS))
@pytest.mark.parametrize("name", list(BAD_DICOM_GRIDS_AND_TIMES))
def test_a_spacing_or_time_order_no_cine_has_is_one_sentence_of_every_command(name, reader, bundle, tmp_path,
                                                                             monkeypatch, capsys):
    make, patterns = BAD_DICOM_GRIDS_AND_TIMES[name]
    make(tmp_path / "series")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "earlier.txt").write_text("kept")
    _no_inference(monkeypatch)
    before = tree_snapshot(tmp_path)
    assert DICOM_COMMANDS[reader](bundle, tmp_path / "series", tmp_path / "out") == 2
    assert_one_sentence(capsys.readouterr().err, "^error: The DICOM series ", *patterns)
    assert tree_snapshot(tmp_path) == before


def test_trigger_time_jitter_across_positions_is_read_in_time_order(tmp_path):
    """The counterpart of the refusals above: a few ms of spread per time point, Instance Numbers that agree, and
    file names that say nothing of the order."""
    files = _jittered_cine(tmp_path / "cine")
    for index, path in enumerate(files):
        path.rename(path.with_name(f"image{(7 * index) % len(files):02d}.dcm"))
    cine = read_cine_series(tmp_path / "cine")
    np.testing.assert_array_equal(cine.volumes, _phases(3))
    assert cine.trigger_times_ms == pytest.approx([time + np.mean(JITTER_MS) for time in CINE_TIMES_MS])


def test_a_heart_rate_that_differs_between_breath_holds_still_reads(tmp_path):
    """25 retrospectively gated time points, each at k/25 of its own position's cycle, at positions whose heart rates
    differ by up to ±5 % (the last time point 38 ms apart across positions, its neighbours 38-40 ms away): the time
    points do not mix, since each position's times are compared in its own steps."""
    phases = 25
    cycles_ms = (950.0, 1000.0, 1039.0, 980.0, 1010.0)
    files = write_cine(tmp_path / "cine", _phases(phases), GRID, trigger_times_ms=[0.0] * phases)
    for index, path in enumerate(files):
        phase, position = divmod(index, SLICES)
        edit_file(path, TriggerTime=f"{phase * cycles_ms[position] / phases:.2f}")
    cine = read_cine_series(tmp_path / "cine")
    np.testing.assert_array_equal(cine.volumes, _phases(phases))
