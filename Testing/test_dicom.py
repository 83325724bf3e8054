"""DICOM series in (``CalibSegLib.dicom``): series written with pydicom (``Datasets/dicom_series.py``, geometry
from the standard's formulas, not SimpleITK's) read back with their values and grid; an ACDC volume as a DICOM
folder gives the labels of the same volume as NIfTI with the shipped model; several series listed or chosen;
``--image-dir`` takes each series as a case; multi-phase cines, classic and Enhanced MR, read back phase by phase
in time order with their grid and trigger times; a single-phase Enhanced MR file segmented like the classic
series of the same volume."""

from __future__ import annotations

import json

import highdicom as hd
import numpy as np
import pydicom
import pytest

from CalibSegLib.dicom import find_series, read_cine_series, read_dicom_folder, series_case_names
from CalibSegLib.dicom_seg import CONFIDENCE_SCALE
from CalibSegLib.io import ImageGeometry, read_image, write_image
from CalibSegLib.predict import batch_row, main
from Datasets.dicom_series import write_cine, write_enhanced, write_series
from conftest import REPO_ROOT
from dicom_series import edit_file
from fault_checks import assert_one_sentence
from tiny_bundles import make_test_bundle

ACDC_IMAGE = REPO_ROOT / "CalibSeg" / "Resources" / "SampleData" / "acdc_patient_image.nii.gz"


def _oblique(spacing=(8.0, 1.40625, 1.25), origin=(-120.5, 33.25, 80.0)) -> ImageGeometry:
    """A right-handed short-axis-like grid: tilted about two axes, away from the origin."""
    first, second = 0.4, 0.7
    about_z = np.array([[np.cos(first), -np.sin(first), 0], [np.sin(first), np.cos(first), 0], [0, 0, 1]])
    about_x = np.array([[1, 0, 0], [0, np.cos(second), -np.sin(second)], [0, np.sin(second), np.cos(second)]])
    return ImageGeometry(spacing, origin, tuple((about_z @ about_x).ravel()))


def test_a_series_reads_back_with_its_values_and_grid(tmp_path):
    volume = np.random.default_rng(0).integers(-200, 3000, size=(5, 20, 16)).astype(np.float32)
    geometry = _oblique()
    write_series(tmp_path / "series", volume, geometry)
    image, read, series = read_dicom_folder(tmp_path / "series")
    np.testing.assert_array_equal(image, volume)
    assert image.dtype == np.float32 and read.matches(geometry, tolerance=1e-5)
    assert series.kind == "MR Image Storage" and series.description == "SA stack" and series.number == 3


def test_files_out_of_order_are_stacked_along_the_slice_normal(tmp_path):
    volume = np.arange(4 * 12 * 10, dtype=np.float32).reshape(4, 12, 10)
    files = write_series(tmp_path / "series", volume, _oblique())
    for index, path in enumerate(files):  # names no longer sort as the slices do
        path.rename(path.with_name(f"{(7 * index) % 5}_{path.name}"))
    np.testing.assert_array_equal(read_dicom_folder(tmp_path / "series")[0], volume)


def test_rescale_gives_hounsfield_units_and_every_slices_own_slope(tmp_path):
    hounsfield = np.random.default_rng(1).integers(-1024, 2000, size=(3, 16, 16)).astype(np.float32)
    write_series(tmp_path / "ct", hounsfield, ImageGeometry((2.5, 0.7, 0.7)), modality="CT",
                 intercept=-1024.0)
    np.testing.assert_array_equal(read_dicom_folder(tmp_path / "ct")[0], hounsfield)
    # Per-slice slopes, one of them fractional: the first slice's integer type must not drop the fractions.
    stored = np.random.default_rng(2).integers(0, 4000, size=(3, 16, 16))
    slopes = [1.0, 0.25, 2.0]
    values = (stored * np.array(slopes)[:, None, None]).astype(np.float32)
    write_series(tmp_path / "slopes", values, ImageGeometry((2.5, 0.7, 0.7)), slope=slopes)
    np.testing.assert_array_equal(read_dicom_folder(tmp_path / "slopes")[0], values)


def test_an_acdc_volume_as_dicom_gives_the_labels_of_the_same_volume_as_nifti(tmp_path):
    """The issue's first 'done when': the shipped model on an ACDC volume, from a DICOM folder and from
    NIfTI."""
    image, _ = read_image(ACDC_IMAGE)
    volume = np.rint(image * 4095).astype(np.float32)  # 12-bit whole numbers, as an MR scanner stores them
    geometry = _oblique(spacing=(10.0, 1.5, 1.5))
    write_series(tmp_path / "patient069", volume, geometry)
    write_image(tmp_path / "patient069.nii.gz", volume, geometry)
    for source, out in ((tmp_path / "patient069", "dicom"), (tmp_path / "patient069.nii.gz", "nifti")):
        assert main(["--bundle", "acdc_ce_dice", "--image", str(source), "--out-dir", str(tmp_path / out),
                     "--device", "cpu"]) == 0
    from_dicom, dicom_grid = read_image(tmp_path / "dicom" / "patient069_labels.nii.gz")
    from_nifti, nifti_grid = read_image(tmp_path / "nifti" / "patient069_labels.nii.gz")
    np.testing.assert_array_equal(from_dicom, from_nifti)
    assert set(np.unique(from_dicom)) == {0, 1, 2, 3} and dicom_grid.matches(nifti_grid, tolerance=1e-4)
    summaries = [json.loads((tmp_path / out / "patient069_summary.json").read_text())
                 for out in ("dicom", "nifti")]
    # Equal up to the slice spacing, which SimpleITK computes from positions written with 6 decimals.
    dicom_row, nifti_row = ({key: value for key, value in batch_row("patient069", "ok", summary).items()
                             if not isinstance(value, str)} for summary in summaries)
    assert dicom_row == pytest.approx(nifti_row, rel=1e-6) and len(dicom_row) == 18  # the feature distance too


def test_several_series_are_listed_and_one_is_chosen_by_uid(tmp_path, capsys):
    folder = tmp_path / "study"
    volume = np.random.default_rng(3).normal(300, 60, size=(3, 24, 20)).astype(np.float32)
    write_series(folder, volume, ImageGeometry((5.0, 1.2, 0.9)), description="first")
    write_series(folder / "b", volume[:, ::-1], ImageGeometry((5.0, 1.2, 0.9)), series_number=4,
                 description="second")
    make_test_bundle(tmp_path / "model.calibseg")
    arguments = ["--bundle", str(tmp_path / "model.calibseg"), "--image", str(folder), "--out-dir",
                 str(tmp_path / "out"), "--device", "cpu", "--batch-size", "2"]
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert_one_sentence(error,
                        "^error: .* holds 2 image series \\(series 3 'first' \\(3 MR Image Storage file",
                        "series 4 'second'", "choose one with --series-uid")
    assert not (tmp_path / "out").exists()
    second = [series for series in find_series(folder) if series.description == "second"][0]
    assert main([*arguments, "--series-uid", second.uid]) == 0
    labels, _ = read_image(tmp_path / "out" / "study_labels.nii.gz")
    assert labels.shape == volume.shape


def test_image_dir_takes_every_series_as_a_case_and_skips_other_objects(tmp_path, capsys):
    cases = tmp_path / "cases"
    volume = np.random.default_rng(4).normal(300, 60, size=(3, 24, 20)).astype(np.float32)
    write_series(cases / "patientA", volume, ImageGeometry((5.0, 1.2, 0.9)))
    write_series(cases / "shared", volume, ImageGeometry((5.0, 1.2, 0.9)), series_number=5, prefix="five")
    write_series(cases / "shared", volume[::-1], ImageGeometry((5.0, 1.2, 0.9)), series_number=6,
                 prefix="six")
    write_image(cases / "plain.nii.gz", volume, ImageGeometry((5.0, 1.2, 0.9)))
    make_test_bundle(tmp_path / "model.calibseg")
    bundle = ["--bundle", str(tmp_path / "model.calibseg"), "--device", "cpu", "--batch-size", "2"]
    # A Segmentation and a Parametric Map beside the series: not cases.
    assert main([*bundle, "--image", str(cases / "patientA"), "--out-dir", str(cases / "patientA"),
                 "--dicom-seg"]) == 0
    capsys.readouterr()
    assert main([*bundle, "--image-dir", str(cases), "--out-dir", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert ("skipped: 2 DICOM series that are not images (series 902 'CalibSeg model.calibseg confidence'"
            in printed)
    table = (tmp_path / "out" / "predictions.csv").read_text().splitlines()
    assert [line.split(",")[:2] for line in table[1:]] == [
        ["plain", "ok"], ["patientA", "ok"], ["shared_series5", "ok"], ["shared_series6", "ok"]]
    for name in ("plain", "patientA", "shared_series5", "shared_series6"):
        assert (tmp_path / "out" / f"{name}_labels.nii.gz").is_file()


def test_series_case_names_are_folders_unless_they_share_one(tmp_path):
    volume = np.zeros((2, 8, 8), np.float32)
    write_series(tmp_path / "a", volume, ImageGeometry((5.0, 1.0, 1.0)))
    write_series(tmp_path, volume, ImageGeometry((5.0, 1.0, 1.0)), series_number=2)
    for prefix in ("one", "two"):  # two series of one number in one folder
        write_series(tmp_path / "b", volume, ImageGeometry((5.0, 1.0, 1.0)), series_number=7, prefix=prefix)
    names = series_case_names(find_series(tmp_path), tmp_path)
    shared = [name for name in names if name.startswith("b_series7_")]
    assert sorted(set(names) - set(shared)) == sorted(["a", tmp_path.name]) and len(set(shared)) == 2


@pytest.mark.parametrize("count", [1, 3])
def test_a_dicom_folder_for_a_bundle_of_several_channels_is_one_sentence(count, tmp_path, capsys):
    write_series(tmp_path / "series", np.zeros((3, 24, 20), np.float32), ImageGeometry((5.0, 1.0, 1.0)))
    make_test_bundle(tmp_path / "model.calibseg", in_channels=2, channel_names=["T1", "T2"])
    images = sum((["--image", str(tmp_path / "series")] for _ in range(count)), [])
    assert main(["--bundle", str(tmp_path / "model.calibseg"), *images, "--out-dir", str(tmp_path / "out"),
                 "--device", "cpu"]) == 2
    assert_one_sentence(capsys.readouterr().err, "^error: ",
                        "a DICOM series \\(one channel\\) was given" if count == 1 else "is one channel")


TRIGGER_TIMES = [0.0, 38.5, 77.0, 115.5]


def _phases(count: int = 4, slices: int = 5, seed: int = 10) -> np.ndarray:
    """``(t, z, y, x)`` whole numbers, every voxel different from phase to phase."""
    return np.random.default_rng(seed).integers(-200, 3000, size=(count, slices, 20, 16)).astype(np.float32)


def _shuffle_names(folder) -> None:
    for index, path in enumerate(sorted(folder.iterdir())):  # names no longer sort as phases or slices do
        path.rename(path.with_name(f"{(7 * index) % 23:02d}_{path.name}"))


def test_a_classic_cine_reads_back_phase_by_phase_in_time_order_whatever_the_files_order(tmp_path):
    volumes, geometry = _phases(), _oblique()
    written = [2, 0, 3, 1]  # the files of time point 0 are the second phase written, ...
    files = write_cine(tmp_path / "cine", volumes[written], geometry,
                       trigger_times_ms=[TRIGGER_TIMES[phase] for phase in written])
    for index, path in enumerate(files):  # each slice position triggered 0.5 ms later than the one before
        phase, position = written[index // 5], index % 5
        edit_file(path, TriggerTime=f"{float(pydicom.dcmread(path).TriggerTime) + 0.5 * position:g}",
                  InstanceNumber=phase * 5 + position + 1)  # numbered in time order, as a scanner numbers them
    _shuffle_names(tmp_path / "cine")
    cine = read_cine_series(tmp_path / "cine")
    np.testing.assert_array_equal(cine.volumes, volumes)
    assert cine.volumes.dtype == np.float32 and cine.geometry.matches(geometry, tolerance=1e-5)
    assert cine.trigger_times_ms == pytest.approx([time + 1.0 for time in TRIGGER_TIMES])  # 0.5 · mean(0..4)
    assert (cine.series.phases, cine.series.slices, cine.series.description) == (4, 5, "SA cine")


@pytest.mark.parametrize("time", ["TemporalPositionIdentifier", "InstanceNumber"])
def test_without_trigger_times_the_temporal_position_or_the_instance_number_orders_the_phases(time, tmp_path):
    volumes = _phases(count=3)
    files = write_cine(tmp_path / "cine", volumes, _oblique())  # no Trigger Time; Instance Numbers rise
    if time == "TemporalPositionIdentifier":
        for index, path in enumerate(files):  # Instance Numbers slice by slice: in time order at each position only
            edit_file(path, TemporalPositionIdentifier=index // 5 + 1, InstanceNumber=(index % 5) * 3 + index // 5 + 1)
    _shuffle_names(tmp_path / "cine")
    cine = read_cine_series(tmp_path / "cine")
    np.testing.assert_array_equal(cine.volumes, volumes)
    assert cine.trigger_times_ms is None


@pytest.mark.parametrize("shared", [True, False], ids=["shared orientation", "orientation per frame"])
def test_an_enhanced_mr_cine_reads_back_with_its_frames_positions_times_and_rescale(shared, tmp_path):
    stored, geometry = _phases(), _oblique()
    rng = np.random.default_rng(11)
    slopes = rng.choice([0.25, 0.5, 1.0, 2.0], size=stored.shape[0] * stored.shape[1])  # one per frame
    values = (stored * slopes.reshape(stored.shape[:2])[:, :, None, None]).astype(np.float32)
    write_enhanced(tmp_path / "enhanced" / "cine.dcm", values, geometry, trigger_times_ms=TRIGGER_TIMES,
                   frame_order=rng.permutation(len(slopes)), slopes=slopes, shared=shared)
    cine = read_cine_series(tmp_path / "enhanced")
    np.testing.assert_array_equal(cine.volumes, values)
    assert cine.volumes.dtype == np.float32 and cine.geometry.matches(geometry, tolerance=1e-5)
    assert cine.trigger_times_ms == TRIGGER_TIMES and cine.series.kind == "Enhanced MR Image Storage"
    # the grid SimpleITK builds for the same phases as classic files
    write_cine(tmp_path / "classic", stored, geometry)
    assert cine.geometry.matches(read_cine_series(tmp_path / "classic").geometry, tolerance=1e-6)


def test_an_enhanced_mr_cine_without_temporal_index_or_trigger_times_is_ordered_by_its_dimension_index(tmp_path):
    volumes = _phases(count=3)
    # frames in reverse order: their numbers would give the phases backwards
    write_enhanced(tmp_path / "enhanced" / "cine.dcm", volumes, _oblique(), frame_order=range(14, -1, -1),
                   temporal_index=False)
    cine = read_cine_series(tmp_path / "enhanced")
    np.testing.assert_array_equal(cine.volumes, volumes)
    assert cine.trigger_times_ms is None


def test_read_cine_series_takes_the_folders_one_cine_beside_other_series(tmp_path):
    write_cine(tmp_path / "study" / "cine", _phases(count=2), _oblique(), trigger_times_ms=[0.0, 40.0])
    write_series(tmp_path / "study" / "localizer", _phases(count=1)[0], _oblique(), series_number=1)
    cine = read_cine_series(tmp_path / "study")
    assert cine.series.phases == 2 and cine.volumes.shape == (2, 5, 20, 16)


def test_a_single_phase_enhanced_mr_file_is_segmented_like_the_classic_series(tmp_path):
    volume = np.random.default_rng(12).normal(300, 80, size=(1, 4, 30, 26))
    volume[..., 8:20, 6:18] += 400
    volume, geometry, order = np.rint(volume), _oblique(spacing=(6.0, 1.25, 1.1)), [2, 0, 3, 1]
    write_series(tmp_path / "classic", volume[0], geometry)
    write_enhanced(tmp_path / "enhanced" / "stack.dcm", volume, geometry, frame_order=order, shared=False)
    make_test_bundle(tmp_path / "model.calibseg")
    for name in ("classic", "enhanced"):
        assert main(["--bundle", str(tmp_path / "model.calibseg"), "--image", str(tmp_path / name), "--out-dir",
                     str(tmp_path / f"out_{name}"), "--dicom-seg", "--device", "cpu", "--batch-size", "2"]) == 0
    classic, classic_grid = read_image(tmp_path / "out_classic" / "classic_labels.nii.gz")
    enhanced, enhanced_grid = read_image(tmp_path / "out_enhanced" / "enhanced_labels.nii.gz")
    np.testing.assert_array_equal(enhanced, classic)
    assert enhanced_grid.matches(classic_grid, tolerance=1e-5) and set(np.unique(enhanced)) > {0}
    # the Segmentation's frames are the source's frames: frame f holds slice order[f]
    source = pydicom.dcmread(tmp_path / "enhanced" / "stack.dcm", stop_before_pixels=True)
    segmentation = hd.seg.segread(tmp_path / "out_enhanced" / "enhanced_seg.dcm")
    assert segmentation.FrameOfReferenceUID == source.FrameOfReferenceUID
    frames = segmentation.get_pixels_by_source_frame(source.SOPInstanceUID, source_frame_numbers=[1, 2, 3, 4],
                                                     combine_segments=True)
    np.testing.assert_array_equal(frames, enhanced[order])
    # and the Parametric Map's frame at each slice's position holds that slice's confidence
    confidence, _ = read_image(tmp_path / "out_enhanced" / "enhanced_confidence.nii.gz")
    parametric_map = pydicom.dcmread(tmp_path / "out_enhanced" / "enhanced_confidence.dcm")
    normal = np.array(geometry.direction).reshape(3, 3)[:, 2]
    slices = [int(round((np.array(frame.PlanePositionSequence[0].ImagePositionPatient, dtype=float)
                         - geometry.origin) @ normal / geometry.spacing[0]))
              for frame in parametric_map.PerFrameFunctionalGroupsSequence]
    assert sorted(slices) == [0, 1, 2, 3]
    np.testing.assert_allclose(parametric_map.pixel_array / CONFIDENCE_SCALE, confidence[slices],
                               atol=0.5 / CONFIDENCE_SCALE + 1e-7)
