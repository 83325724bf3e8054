"""Fault catalogue, channels, batches, dataset.json and 3D: a multi-channel model reads each channel from the
input that holds it or refuses in one sentence, every input of a batch is its own case with its own outputs
and row, training data are checked against their ``dataset.json``, and a refused or interrupted run leaves
nothing behind (issue 49)."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from CalibSegLib.bundle import load_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.input_check import check_input, statistics_of_cases
from CalibSegLib.io import ImageGeometry, read_image, write_image
from CalibSegLib.predict import main as predict_main
from CalibSegLib.preprocessing import ChannelNormalization, Preprocessing
from Datasets.layouts import find_cases, ignored_images
from Datasets.loading import Case
from Datasets.phantoms import ct_case, write_phantom
from fault_checks import assert_one_sentence, tree_snapshot
from tiny_bundles import make_test_bundle, make_test_metadata
from Training import train

GRID = ImageGeometry(spacing=(4.0, 1.5, 1.5))
CHANNELS = ["T1", "T2", "FLAIR"]


def _volume(seed: int, shape=(4, 32, 28)) -> np.ndarray:
    return np.random.default_rng(seed).normal(300, 60, size=shape).astype(np.float32)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """A three-channel bundle (T1, T2, FLAIR), a one-channel bundle, and the channel files of cases a, b."""
    folder = tmp_path_factory.mktemp("channels")
    make_test_bundle(folder / "three.calibseg", patch_size=(32, 32), in_channels=3, channel_names=CHANNELS)
    make_test_bundle(folder / "one.calibseg", patch_size=(32, 32))
    for case, seed in (("a", 0), ("b", 10)):
        for channel in range(4):
            write_image(folder / f"{case}_{channel:04d}.nii.gz", _volume(seed + channel), GRID)
    write_image(folder / "t2.nii.gz", _volume(1), GRID)
    os.symlink(folder / "a_0001.nii.gz", folder / "link_0001.nii.gz")
    return folder


def _predict(folder: Path, out: Path, *images: str, bundle: str = "three.calibseg") -> int:
    flags = [flag for name in images for flag in ("--image", str(folder / name))]
    return predict_main(["--bundle", str(folder / bundle), *flags, "--out-dir", str(out), "--device", "cpu"])


# --image files given for the three-channel bundle → the sentence; nothing is read, nothing written.
BAD_IMAGES = {
    "the same file twice": (("a_0000.nii.gz", "a_0000.nii.gz", "a_0002.nii.gz"),
                            r"a_0000\.nii\.gz is given twice; give each of the model's 3 channels "
                            r"\(T1, T2, FLAIR\)"),
    "a link to a file beside it": (("a_0000.nii.gz", "a_0001.nii.gz", "link_0001.nii.gz"),
                                   "a_0001.nii.gz and link_0001.nii.gz are the same file"),
    "channels of two cases": (("a_0000.nii.gz", "b_0001.nii.gz", "a_0002.nii.gz"),
                              r"belong to different cases \(a, b\) by their channel suffixes"),
    "a channel the bundle lacks": (("a_0000.nii.gz", "a_0001.nii.gz", "a_0003.nii.gz"),
                                   r"Case a's files are the channels _0000, _0001, _0003, but the model "
                                   r"reads a_0000 to a_0002 \(T1, T2, FLAIR\)"),
    "a suffix on some files only": (("a_0000.nii.gz", "t2.nii.gz", "a_0002.nii.gz"),
                                    "'a_0000' carries a channel suffix but 't2' does not"),
    "two files for three channels": (("a_0000.nii.gz", "a_0001.nii.gz"),
                                     r"reads 3 channel\(s\) \(T1, T2, FLAIR\), one file each, but 2 "
                                     r"file\(s\)"),
    "four files for three channels": (("a_0000.nii.gz", "a_0001.nii.gz", "a_0002.nii.gz", "a_0003.nii.gz"),
                                      r"but 4 file\(s\) were given"),
}


@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_files_that_are_not_the_bundles_channels_are_refused_before_reading(case, inputs, tmp_path, capsys,
                                                                            monkeypatch):
    images, pattern = BAD_IMAGES[case]
    monkeypatch.setattr("CalibSegLib.predict.read_channels", lambda paths: pytest.fail("an image was read"))
    before = tree_snapshot(tmp_path)
    assert _predict(inputs, tmp_path / "out", *images) == 2
    assert_one_sentence(capsys.readouterr().err, "^error: ", pattern)
    assert tree_snapshot(tmp_path) == before


def test_channel_files_in_any_order_are_read_by_their_suffixes(inputs, tmp_path):
    """``a_0002 a_0000 a_0001`` used to be read as T1 = a_0002: now each file is the channel its suffix names,
    the outputs are named after the case, and they equal the prediction of the channels in order."""
    assert _predict(inputs, tmp_path / "shuffled", "a_0002.nii.gz", "a_0000.nii.gz", "a_0001.nii.gz") == 0
    predictor = Predictor(inputs / "three.calibseg", device="cpu")
    image = np.stack([read_image(inputs / f"a_000{channel}.nii.gz")[0] for channel in range(3)])
    labels, _ = read_image(tmp_path / "shuffled" / "a_labels.nii.gz")
    np.testing.assert_array_equal(labels, predictor.predict(image, GRID.spacing).labels)
    assert not np.array_equal(labels, predictor.predict(image[::-1].copy(), GRID.spacing).labels)


def test_a_constant_channel_is_named(inputs, tmp_path, capsys):
    write_image(tmp_path / "c_0000.nii.gz", _volume(3), GRID)
    write_image(tmp_path / "c_0001.nii.gz", np.full((4, 32, 28), 7.0, np.float32), GRID)
    write_image(tmp_path / "c_0002.nii.gz", _volume(4), GRID)
    shutil.copy(inputs / "three.calibseg", tmp_path / "three.calibseg")
    assert _predict(tmp_path, tmp_path / "out", "c_0000.nii.gz", "c_0001.nii.gz", "c_0002.nii.gz") == 2
    assert_one_sentence(capsys.readouterr().err, r"^error: The T2 channel is constant \(every voxel is "
                                                 r"7\.0\)")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------- --image-dir
def _folder(tmp_path: Path, inputs: Path, names: dict[str, str]) -> Path:
    """A folder of images: ``{name in the folder: file of inputs}``."""
    folder = tmp_path / "images"
    folder.mkdir()
    for name, source in names.items():
        image, geometry = read_image(inputs / source)
        write_image(folder / name, image, geometry)
    return folder


# --image-dir contents → (bundle, the sentence); refused before the bundle loads, nothing written.
BAD_FOLDERS = {
    "case.nii.gz and case.nrrd": ({"case.nii.gz": "t2.nii.gz", "case.nrrd": "a_0000.nii.gz"}, "one.calibseg",
                                  r"case\.nii\.gz and case\.nrrd in .* would both be case 'case'"),
    "a.nii.gz beside a_0000.nii.gz": ({"a.nii.gz": "t2.nii.gz", "a_0000.nii.gz": "a_0000.nii.gz"},
                                      "one.calibseg", r"a\.nii\.gz and a_0000\.nii\.gz in .* would both be "
                                                      r"case 'a'"),
    "a channel file in two formats": ({"a_0000.nii.gz": "a_0000.nii.gz", "a_0000.mha": "a_0000.nii.gz",
                                       "a_0001.nii.gz": "a_0001.nii.gz", "a_0002.nii.gz": "a_0002.nii.gz"},
                                      "three.calibseg",
                                      r"a_0000\.mha and a_0000\.nii\.gz .* both be case 'a'"),
}


@pytest.mark.parametrize("case", list(BAD_FOLDERS))
def test_images_of_a_folder_that_would_be_one_case_are_refused_before_any_work(case, inputs, tmp_path, capsys,
                                                                              monkeypatch):
    names, bundle, pattern = BAD_FOLDERS[case]
    folder = _folder(tmp_path, inputs, names)
    monkeypatch.setattr("CalibSegLib.predict.Predictor",
                        lambda *args, **kwargs: pytest.fail("the bundle loaded"))
    before = tree_snapshot(tmp_path)
    assert predict_main(["--bundle", str(inputs / bundle), "--image-dir", str(folder), "--out-dir",
                         str(tmp_path / "out")]) == 2
    assert_one_sentence(capsys.readouterr().err, "^error: ", pattern)
    assert tree_snapshot(tmp_path) == before


def test_the_image_folder_as_output_folder_is_refused(inputs, tmp_path, capsys):
    folder = _folder(tmp_path, inputs, {"t2.nii.gz": "t2.nii.gz"})
    before = tree_snapshot(tmp_path)
    assert predict_main(["--bundle", str(inputs / "one.calibseg"), "--image-dir", str(folder), "--out-dir",
                         str(folder), "--device", "cpu"]) == 2
    assert_one_sentence(capsys.readouterr().err, "^error: The output folder is the image folder",
                        "would be read as cases by the next run")
    assert tree_snapshot(tmp_path) == before


def test_every_case_of_a_folder_gets_one_row_and_its_own_outputs(inputs, tmp_path):
    """A whole case given in shuffled file order, a case missing a channel, and an image without suffixes:
    three rows, the whole case segmented, each other case's sentence in its row."""
    folder = _folder(tmp_path, inputs, {"a_0002.nii.gz": "a_0002.nii.gz", "a_0000.nii.gz": "a_0000.nii.gz",
                                        "a_0001.nii.gz": "a_0001.nii.gz", "b_0000.nii.gz": "b_0000.nii.gz",
                                        "b_0001.nii.gz": "b_0001.nii.gz", "t2.nii.gz": "t2.nii.gz"})
    out = tmp_path / "out"
    assert predict_main(["--bundle", str(inputs / "three.calibseg"), "--image-dir", str(folder), "--out-dir",
                         str(out), "--device", "cpu"]) == 2
    rows = {row["case"]: row["status"] for row in csv.DictReader((out / "predictions.csv").open())}
    assert list(rows) == ["a", "b", "t2"] and rows["a"] == "ok"
    assert rows["b"].startswith("error: The model reads 3 channel(s) (T1, T2, FLAIR), one file each, but 2")
    assert rows["t2"].startswith("error: The model reads 3 channel(s)")
    assert sorted(path.name for path in out.iterdir()) == [
        "a_confidence.nii.gz", "a_entropy.nii.gz", "a_labels.nii.gz", "a_summary.json", "predictions.csv"]


# ------------------------------------------------------------------------------------------- training data
@pytest.fixture(scope="module")
def phantom(tmp_path_factory) -> Path:
    return write_phantom(tmp_path_factory.mktemp("phantom") / "mr", "multichannel", cases=5)


def _stray_nrrd(folder: Path) -> None:
    image, geometry = read_image(folder / "imagesTr" / "mr_000_0000.nii.gz")
    write_image(folder / "imagesTr" / "mr_000_0000.nrrd", image, geometry)


def _description(**changes):
    def change(folder: Path) -> None:
        path = folder / "dataset.json"
        values = json.loads(path.read_text())
        for key, value in changes.items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        path.write_text(json.dumps(values))
    return change


def _without_file_ending_and_a_stray_nrrd(folder: Path) -> None:
    _description(file_ending=None)(folder)
    _stray_nrrd(folder)


def _four_d(folder: Path) -> None:
    """The Medical Segmentation Decathlon's original layout: one 4D file per case."""
    import SimpleITK as sitk

    for case in range(5):
        parts = [folder / "imagesTr" / f"mr_{case:03d}_{channel:04d}.nii.gz" for channel in range(4)]
        volume = sitk.JoinSeries([sitk.ReadImage(str(path)) for path in parts])
        sitk.WriteImage(volume, str(folder / "imagesTr" / f"mr_{case:03d}.nii.gz"))
        for path in parts:
            path.unlink()


def _bare_beside_suffixed(folder: Path) -> None:
    shutil.copy(folder / "imagesTr" / "mr_001_0000.nii.gz", folder / "imagesTr" / "mr_001.nii.gz")


def _all_nrrd(folder: Path) -> None:
    for path in sorted((folder / "imagesTr").glob("*.nii.gz")):
        image, geometry = read_image(path)
        write_image(path.with_name(path.name.replace(".nii.gz", ".nrrd")), image, geometry)
        path.unlink()


def _missing_channel(folder: Path) -> None:
    (folder / "imagesTr" / "mr_003_0002.nii.gz").unlink()


def _pairs_in_two_formats(folder: Path) -> None:
    """The image/label pair layout: case mr_000's image also as .nrrd."""
    for case in range(5):
        image, geometry = read_image(folder / "imagesTr" / f"mr_{case:03d}_0000.nii.gz")
        write_image(folder / f"mr_{case:03d}_image.nii.gz", image, geometry)
        shutil.copy(folder / "labelsTr" / f"mr_{case:03d}.nii.gz", folder / f"mr_{case:03d}_label.nii.gz")
    write_image(folder / "mr_000_image.nrrd", *read_image(folder / "mr_000_image.nii.gz"))
    shutil.rmtree(folder / "imagesTr")
    shutil.rmtree(folder / "labelsTr")
    (folder / "dataset.json").unlink()


# How the phantom folder is broken → the sentence; refused before the run folder exists.
BAD_TRAINING_DATA = {
    "two files for one channel": (_without_file_ending_and_a_stray_nrrd,
                                  r"Case mr_000 has 2 files for channel 0 .* \(mr_000_0000\.nii\.gz, "
                                  r"mr_000_0000\.nrrd\); remove all but one"),
    "numTraining larger than the cases": (_description(numTraining=7),
                                          r"says numTraining 7 but .* holds 5 case\(s\) ending in \.nii\.gz"),
    "numTraining not a number": (_description(numTraining="five"), "numTraining must be the number of"),
    "file_ending .png": (_description(file_ending=".png"), r"file_ending '\.png' is not an image format"),
    "file_ending without its dot": (_description(file_ending="nii.gz"), "file_ending 'nii.gz' is not an"),
    "file_ending of no image": (_all_nrrd, r"holds no image ending in \.nii\.gz, the file_ending of its "
                                           r"dataset\.json, but 20 of another format"),
    "4D images of the Decathlon": (_four_d, r"mr_000\.nii\.gz in .* holds its channels in one 4D image .* "
                                            r"split it into mr_000_0000 \.\.\. mr_000_0003"),
    "a file without suffix beside its channels": (_bare_beside_suffixed,
                                                  r"Case mr_001 .* has mr_001\.nii\.gz, without a channel "
                                                  r"suffix, beside mr_001_0000\.nii\.gz"),
    "a case missing a channel": (_missing_channel, r"Case mr_003 .* has the channel file\(s\) _0000, _0001, "
                                                   r"_0003 but the dataset has 4 channel\(s\)"),
    "an image pair in two formats": (_pairs_in_two_formats,
                                     r"Case mr_000 has two images in .* \(mr_000_image\.nii\.gz, "
                                     r"mr_000_image\.nrrd\)"),
}


def _no_training(*args, **kwargs):
    raise AssertionError("a Trainer was built for a run that should have been refused")


@pytest.mark.parametrize("case", list(BAD_TRAINING_DATA))
def test_training_data_unlike_their_dataset_json_are_refused_before_anything_is_written(
        case, phantom, tmp_path, monkeypatch):
    change, pattern = BAD_TRAINING_DATA[case]
    data = shutil.copytree(phantom, tmp_path / "data")
    change(data)
    monkeypatch.setattr(train, "Trainer", _no_training)
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        train.main(["--data", str(data), "--out", str(tmp_path / "run"), "--no-eval"])
    assert_one_sentence(str(caught.value.code), "^error: ", pattern)
    assert tree_snapshot(tmp_path) == before


class _Interrupted:
    """A Trainer the user interrupts (Ctrl-C) while it reads the data, before the first epoch."""

    def __init__(self, *args, **kwargs):
        raise KeyboardInterrupt


def test_file_ending_decides_and_the_other_file_is_named_as_ignored(phantom, tmp_path, monkeypatch, capsys):
    data = shutil.copytree(phantom, tmp_path / "data")
    _stray_nrrd(data)
    assert [path.name for path in ignored_images(data)] == ["mr_000_0000.nrrd"]
    assert [path.name for path in find_cases(data)[0].channel_paths][0] == "mr_000_0000.nii.gz"
    monkeypatch.setattr(train, "Trainer", _Interrupted)
    with pytest.raises(SystemExit):
        train.main(["--data", str(data), "--out", str(tmp_path / "run"), "--no-eval"])
    assert "data: ignored, as dataset.json's file_ending says: mr_000_0000.nrrd" in capsys.readouterr().out


def _tiny_3d_phantom(folder: Path) -> Path:
    """Five cases of 6 × 12 × 12 voxels at 1 mm, smaller than the default UNet's smallest 3D window from the
    plan's 16³ (32 × 16 × 16) along every axis."""
    for case in range(5):
        image = _volume(case, (6, 12, 12))
        label = np.zeros(image.shape, np.uint8)
        label[2:4, 4:8, 4:8] = 1
        write_image(folder / "imagesTr" / f"t_{case:03d}_0000.nii.gz", image, ImageGeometry((1.0, 1.0, 1.0)))
        write_image(folder / "labelsTr" / f"t_{case:03d}.nii.gz", label, ImageGeometry((1.0, 1.0, 1.0)))
    (folder / "dataset.json").write_text(json.dumps({"channel_names": {"0": "MR"}, "numTraining": 5,
                                                     "labels": {"background": 0, "spot": 1},
                                                     "file_ending": ".nii.gz"}))
    return folder


# 3D runs on volumes too small for the network → the sentence; refused before the run folder (and split.json).
BAD_3D_RUNS = {
    "the plan's patch no data can take": ([], r"The training volumes are too small for --network unet: the "
                                              r"smallest patch it segments from the plan's 16×16×16 is "
                                              r"32×16×16 voxels, larger than every training volume \(largest "
                                              r"6×12×12 voxels at 1 mm\)"),
    "--patch-size 32 on smaller volumes": (["--patch-size", "32"],
                                           r"--patch-size 32 32 32 is larger than every training volume "
                                           r"\(largest 6×12×12"),
    "--patch-size 16 on the same volumes": (["--patch-size", "16"], "cannot segment 16×16×16-voxel windows"),
}


@pytest.mark.parametrize("case", list(BAD_3D_RUNS))
def test_a_3d_run_the_data_cannot_take_is_explained_and_leaves_no_folder(case, tmp_path, monkeypatch):
    flags, pattern = BAD_3D_RUNS[case]
    data = _tiny_3d_phantom(tmp_path / "data")
    monkeypatch.setattr(train, "Trainer", _no_training)
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        train.main(["--data", str(data), "--spatial-dims", "3", "--out", str(tmp_path / "run"), "--no-eval",
                    *flags])
    assert_one_sentence(str(caught.value.code), "^error: ", pattern)
    assert tree_snapshot(tmp_path) == before


class _Refused:
    """A Trainer that refuses the data after the run folder and split.json exist (as one reading a volume
    whose spacing is wrong would)."""

    def __init__(self, *args, **kwargs):
        from Datasets.errors import DataError

        raise DataError("mr_004: the image's spacing is probably wrong (check its units).")


@pytest.mark.parametrize("out", ["new folder", "existing folder", "fold of a new cross-validation"])
@pytest.mark.parametrize("trainer", [_Refused, _Interrupted], ids=["refused", "Ctrl-C"])
def test_a_fresh_run_that_stops_before_its_first_epoch_leaves_nothing(out, trainer, phantom, tmp_path,
                                                                      monkeypatch):
    """No run folder, no split.json or folds.json, no cross-validation folder after a refusal or Ctrl-C before
    the first checkpoint; an existing --out folder is kept as it was."""
    run_dir = tmp_path / "runs" / "mr"
    if out == "existing folder":
        run_dir.mkdir(parents=True)
        (run_dir / "notes.txt").write_text("mine")
    monkeypatch.setattr(train, "Trainer", trainer)
    before = tree_snapshot(tmp_path)
    fold = ["--fold", "0"] if out.startswith("fold") else []
    with pytest.raises(SystemExit) as caught:
        train.main(["--data", str(phantom), "--out", str(run_dir), "--no-eval", *fold])
    if trainer is _Interrupted:
        kept = "kept as it was" if out == "existing folder" else "removed"
        assert_one_sentence(str(caught.value.code), "^interrupted before the first epoch ended", kept)
    else:
        assert_one_sentence(str(caught.value.code), "^error: mr_004: the image's spacing")
    assert tree_snapshot(tmp_path) == before


# ------------------------------------------------------------------------------------------- the input check
def test_a_ct_block_of_a_million_hu_makes_the_input_unsuitable():
    """Its training window clips 10⁶ HU to the window's top, where no quantile need move: the check tells."""
    rng = np.random.default_rng(0)
    cases = [ct_case(rng) for _ in range(3)]
    metadata = make_test_metadata(channel_names=["CT"], preprocessing=Preprocessing(
        channel_normalization=[ChannelNormalization("ct", (20.0, 110.0), 60.0, 16.0)]))
    metadata.input_statistics = statistics_of_cases(metadata, [
        Case(str(index), str(index), case.channels[0], case.label, case.spacing)
        for index, case in enumerate(cases)])
    clean = ct_case(rng)
    assert check_input(metadata, clean.channels[0], clean.spacing, clean.label)["suitable"]
    block = clean.channels[0].copy()
    block[:2, :8, :8] = 1e6
    check = check_input(metadata, block, clean.spacing, clean.label)
    assert check["suitable"] is False
    assert_one_sentence(check["reasons"][0], r"^Its CT channel holds values from .* to 1e\+06 HU, beyond any "
                                             r"CT \(-4096 to 32767 HU\): its rescale slope or intercept is "
                                             r"wrong")


def test_a_bundle_whose_window_its_network_cannot_take_is_refused_on_load(tmp_path):
    from fault_checks import rewrite_bundle

    good = Path(__file__).resolve().parents[1] / "CalibSegLib" / "pretrained" / "acdc_nacl.calibseg"
    for patch, nearest in (([120, 120], "112 and 128"), ([8, 8], "32 and 48")):
        bundle = rewrite_bundle(good, tmp_path / f"{patch[0]}.calibseg",
                                lambda metadata, patch=patch: metadata["sliding_window"].update(patch_size=patch))
        with pytest.raises(ValueError) as caught:
            load_bundle(bundle)
        assert_one_sentence(str(caught.value), f"patch {patch[0]}×{patch[1]} does not fit its network 'unet'",
                            f"nearest sizes it takes are {nearest}", "retrain it")
