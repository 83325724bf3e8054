"""Fault catalogue, command lines: ``python -m CalibSegLib.predict`` and ``Evaluation/evaluate.py`` run in
process through ``main(argv)``; each fault is one line on stderr, exit status 2 (130 for Ctrl-C),
no traceback, the output folder checked before any inference, and the outputs written as one set:
earlier files byte-identical, no temporaries, no new folders."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from CalibSegLib import predict
from CalibSegLib.inference import Predictor
from CalibSegLib.io import ImageGeometry, write_image
from CalibSegLib.io import images as image_files
from CalibSegLib.io import outputs as output_files
from tiny_bundles import make_test_bundle
from fault_checks import BROKEN_BUNDLES, assert_one_sentence, normal_file_mode, tree_snapshot
from Evaluation import evaluate
from Training import fit_input_check, fit_quality

GRID = ImageGeometry(spacing=(5.0, 1.2, 0.9), origin=(-20.0, 4.0, 9.5))
MAPS = ("labels", "confidence", "entropy")


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> Path:
    """Inputs in one folder: a small NIfTI image, a reference, a NaN image and a bundle."""
    folder = tmp_path_factory.mktemp("inputs")
    image = np.random.default_rng(3).normal(300, 60, size=(3, 24, 20)).astype(np.float32)
    reference = np.zeros(image.shape, np.uint8)
    reference[:, 6:16, 5:14] = 1
    write_image(folder / "case.nii.gz", image, GRID)
    write_image(folder / "case_ref.nii.gz", reference, GRID)
    image[1, 2, 3] = np.nan
    write_image(folder / "nan.nii.gz", image, GRID)
    make_test_bundle(folder / "model.calibseg")
    return folder


def predict_cli(case: Path, out_dir: Path, *extra: str, bundle: Path | None = None,
                image: str = "case.nii.gz") -> int:
    return predict.main(["--bundle", str(bundle or case / "model.calibseg"), "--image", str(case / image),
                         "--out-dir", str(out_dir), "--device", "cpu", "--batch-size", "2", *extra])


@pytest.fixture()
def previous(case, tmp_path) -> Path:
    """An output folder holding the outputs of an earlier run (with metrics), to be kept intact."""
    out = tmp_path / "out"
    assert predict_cli(case, out, "--reference", str(case / "case_ref.nii.gz")) == 0
    return out


def no_inference(monkeypatch) -> None:
    """Make any inference fail the test: the fault must be found before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("inference ran although the fault was detectable before it")

    monkeypatch.setattr(Predictor, "predict_variants", refuse)


def fail_on_second_write(monkeypatch, error: BaseException) -> None:
    """The second image written raises ``error`` after writing part of its file."""
    real, calls = image_files.sitk.WriteImage, []

    def write(image, name, useCompression=False):
        calls.append(name)
        if len(calls) == 2:
            Path(name).write_bytes(b"partial")
            raise error
        real(image, name, useCompression=useCompression)

    monkeypatch.setattr(image_files.sitk, "WriteImage", write)


def _out_is_file(case, tmp_path, monkeypatch) -> Path:
    no_inference(monkeypatch)
    (tmp_path / "out").write_text("a file")
    return tmp_path / "out"


def _out_below_file(case, tmp_path, monkeypatch) -> Path:
    no_inference(monkeypatch)
    (tmp_path / "file").write_text("a file")
    return tmp_path / "file" / "sub"


def _out_unwritable(case, tmp_path, monkeypatch) -> Path:
    # Tests may run as root, for whom chmod does not take away write access: ask os.access instead.
    no_inference(monkeypatch)
    (tmp_path / "locked").mkdir()
    monkeypatch.setattr(output_files.os, "access", lambda path, mode: Path(path) != tmp_path / "locked")
    return tmp_path / "locked" / "out"


def _map_name_taken_by_folder(case, tmp_path, monkeypatch) -> Path:
    no_inference(monkeypatch)
    (tmp_path / "out" / "case_entropy.nii.gz").mkdir(parents=True)
    return tmp_path / "out"


# case → (prepare(case, tmp_path, monkeypatch) -> out dir, regexes of the sentence)
BAD_OUT_DIRS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "--out-dir is a file": (_out_is_file, ("Cannot write into", "is a file, not a folder")),
    "--out-dir below a file": (_out_below_file, ("is a file, not a folder",)),
    "--out-dir not writable": (_out_unwritable, ("is not writable",)),
    "an output name is a folder": (
        _map_name_taken_by_folder, ("case_entropy.nii.gz: a folder of that name",)),
}


@pytest.mark.parametrize("name", list(BAD_OUT_DIRS))
def test_bad_out_dir_is_one_sentence_before_inference(name, case, tmp_path, monkeypatch, capsys):
    prepare, patterns = BAD_OUT_DIRS[name]
    out = prepare(case, tmp_path, monkeypatch)
    before = tree_snapshot(tmp_path)
    assert predict_cli(case, out) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ")
    assert_one_sentence(error, *patterns)
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("name", list(BROKEN_BUNDLES))
def test_broken_bundle_is_one_sentence_and_writes_nothing(name, case, previous, tmp_path, capsys):
    make, pattern = BROKEN_BUNDLES[name]
    bundle = make(case / "model.calibseg", tmp_path / "broken.calibseg")
    before = tree_snapshot(tmp_path)
    assert predict_cli(case, previous, bundle=bundle) == 2
    error = capsys.readouterr().err
    assert_one_sentence(error, "^error: ", pattern)
    assert tree_snapshot(tmp_path) == before


def test_nan_nifti_image_is_one_sentence_and_writes_nothing(case, previous, tmp_path, capsys):
    before = tree_snapshot(tmp_path)
    assert predict_cli(case, previous, image="nan.nii.gz") == 2
    assert_one_sentence(capsys.readouterr().err, "nan.nii.gz stores NaN or infinite voxel values")
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), RuntimeError("ITK: disk full")],
                         ids=["OSError", "ITK RuntimeError"])
def test_failed_write_keeps_every_previous_output(failure, case, previous, tmp_path, monkeypatch, capsys):
    fail_on_second_write(monkeypatch, failure)
    before = tree_snapshot(tmp_path)
    assert predict_cli(case, previous, "--reference", str(case / "case_ref.nii.gz")) == 2
    assert_one_sentence(capsys.readouterr().err, "^error: ", "No space left on device|disk full")
    assert tree_snapshot(tmp_path) == before  # old labels, confidence, entropy and metrics; no temporaries


def test_failed_write_into_a_new_folder_leaves_no_folder(case, tmp_path, monkeypatch, capsys):
    fail_on_second_write(monkeypatch, OSError(28, "No space left on device"))
    assert predict_cli(case, tmp_path / "new" / "deeper") == 2
    assert_one_sentence(capsys.readouterr().err, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_inference_exits_130_with_nothing_written(case, tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Predictor, "predict_variants", interrupted)
    assert predict_cli(case, tmp_path / "out") == 130
    assert_one_sentence(capsys.readouterr().err, "^interrupted: nothing was written")
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_writing_keeps_the_previous_outputs(case, previous, tmp_path, monkeypatch, capsys):
    fail_on_second_write(monkeypatch, KeyboardInterrupt())
    before = tree_snapshot(tmp_path)
    assert predict_cli(case, previous) == 130
    assert_one_sentence(capsys.readouterr().err, "interrupted")
    assert tree_snapshot(tmp_path) == before


def test_rename_failure_midway_restores_the_replaced_outputs(case, previous, tmp_path, monkeypatch, capsys):
    """All temporaries are written; the second rename fails: the first output gets its old content back."""
    real, calls = os.replace, []

    def replace(source, destination):
        if not Path(source).name.startswith(".."):  # the set's renames, not write_image's own (".." names)
            calls.append(destination)
            if len(calls) == 2:
                raise OSError(5, "Input/output error")
        real(source, destination)

    monkeypatch.setattr(output_files.os, "replace", replace)
    before = tree_snapshot(tmp_path)
    assert predict_cli(case, previous) == 2
    assert_one_sentence(capsys.readouterr().err, "Input/output error")
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_outputs_get_the_umask_mode_not_0600(umask, case, tmp_path):
    old = os.umask(umask)
    try:
        assert predict_cli(case, tmp_path / "out", "--reference", str(case / "case_ref.nii.gz")) == 0
        expected = normal_file_mode()
    finally:
        os.umask(old)
    modes = {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "out").iterdir()}
    assert modes == {f"case_{name}": expected
                     for name in ("metrics.json", "summary.json", *(f"{m}.nii.gz" for m in MAPS))}


@pytest.fixture()
def bundle_beside_data(tmp_path) -> Path:
    return make_test_bundle(tmp_path / "run" / "model.calibseg")


def _evaluate_out_is_file(tmp_path, monkeypatch) -> list[str]:
    (tmp_path / "taken").write_text("a file")
    return ["--out", str(tmp_path / "taken")]


def _evaluate_out_unwritable(tmp_path, monkeypatch) -> list[str]:
    monkeypatch.setattr(output_files.os, "access", lambda path, mode: False)
    return ["--out", str(tmp_path / "evaluation")]


@pytest.mark.parametrize("prepare,pattern", [(_evaluate_out_is_file, "is a file, not a folder"),
                                             (_evaluate_out_unwritable, "is not writable")],
                         ids=["--out is a file", "--out not writable"])
def test_evaluate_checks_its_out_folder_before_any_work(prepare, pattern, bundle_beside_data, tmp_path,
                                                        monkeypatch):
    extra = prepare(tmp_path, monkeypatch)

    def no_work(*args, **kwargs):
        raise AssertionError("evaluate loaded the bundle before checking --out")

    monkeypatch.setattr(evaluate, "load_bundle", no_work)
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        evaluate.main(["--bundle", str(bundle_beside_data), *extra])
    assert_one_sentence(str(caught.value.code), "^error: ", pattern)
    assert tree_snapshot(tmp_path) == before


def test_evaluate_refuses_a_nan_bundle_with_one_sentence(case, tmp_path):
    make, pattern = BROKEN_BUNDLES["NaN weights"]
    bundle = make(case / "model.calibseg", tmp_path / "nan.calibseg")
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        evaluate.main(["--bundle", str(bundle), "--data", str(tmp_path)])
    assert_one_sentence(str(caught.value.code), "^error: ", pattern)
    assert tree_snapshot(tmp_path) == before


def truncate_second_write_silently(monkeypatch) -> None:
    """The second image written is cut in half without an error, as ITK's NIfTI writer leaves a file when
    the disk fills (it prints a warning and returns normally)."""
    real, calls = image_files.sitk.WriteImage, []

    def write(image, name, useCompression=False):
        calls.append(name)
        real(image, name, useCompression=useCompression)
        if len(calls) == 2:
            data = Path(name).read_bytes()
            Path(name).write_bytes(data[: len(data) // 2])

    monkeypatch.setattr(image_files.sitk, "WriteImage", write)


def test_a_silently_truncated_write_fails_the_command_and_keeps_the_previous_set(case, previous, tmp_path,
                                                                                monkeypatch, capsys):
    truncate_second_write_silently(monkeypatch)
    before = tree_snapshot(tmp_path)
    assert predict_cli(case, previous, "--reference", str(case / "case_ref.nii.gz")) == 2
    assert_one_sentence(capsys.readouterr().err, "^error: Cannot write case_confidence.nii.gz ",
                        "only part of its .* reached the disk", "check the free space")
    assert tree_snapshot(tmp_path) == before


@pytest.fixture()
def small_disk(tmp_path):
    """A 5 MiB tmpfs mounted for the test (skipped where this process may not mount one)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mount)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"cannot run mount here ({error})")
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not allowed here ({done.stderr.strip() or done.returncode})")
    yield mount
    subprocess.run(["umount", str(mount)], capture_output=True, timeout=30)


def test_predict_on_a_full_disk_exits_with_one_sentence_and_keeps_the_earlier_set(small_disk, tmp_path, capsys):
    """The issue's case on a real file system: the disk fills while the new set's confidence map is written."""
    inputs = tmp_path / "inputs"
    rng = np.random.default_rng(8)
    shape = (8, 128, 128)
    write_image(inputs / "big.nii.gz", rng.normal(300, 60, size=shape).astype(np.float32), GRID)
    bundle = make_test_bundle(inputs / "model.calibseg")
    out = small_disk / "out"
    assert predict_cli(inputs, out, bundle=bundle, image="big.nii.gz") == 0
    earlier = tree_snapshot(out)
    # A new image with another structure, so that the new outputs differ from the earlier ones.
    write_image(inputs / "big.nii.gz", rng.gamma(2.0, 150, size=shape).astype(np.float32), GRID)
    disk = os.statvfs(small_disk)
    block = disk.f_frsize
    # Room for the summary and the labels (a block each) and half the earlier confidence map: its
    # successor runs out of space half-way (tmpfs allocates whole blocks).
    room = 2 * block + (out / "big_confidence.nii.gz").stat().st_size // 2
    (small_disk / "filler").write_bytes(bytes(disk.f_bavail * block - room))
    capsys.readouterr()
    assert predict_cli(inputs, out, bundle=bundle, image="big.nii.gz") == 2
    assert_one_sentence(capsys.readouterr().err, "^error: ", "big_confidence.nii.gz",
                        "No space left on device|reached the disk")
    assert tree_snapshot(out) == earlier  # byte-identical, and no temporaries left on the disk
    assert sorted(path.name for path in small_disk.iterdir()) == ["filler", "out"]
    (small_disk / "filler").unlink()  # with room again the same command replaces the set: the check could fail
    assert predict_cli(inputs, out, bundle=bundle, image="big.nii.gz") == 0
    assert tree_snapshot(out) != earlier


def _patient_images(tmp_path: Path) -> Path:
    """A folder of four image/label pairs, patients p1 ... p4."""
    data = tmp_path / "data"
    rng = np.random.default_rng(4)
    for patient in ("p1", "p2", "p3", "p4"):
        label = np.zeros((3, 24, 20), np.uint8)
        label[:, 4:12, 3:9], label[:, 12:20, 9:15], label[:, 5:9, 14:18] = 1, 2, 3
        write_image(data / f"{patient}_image.nii.gz", rng.normal(300, 60, label.shape).astype(np.float32), GRID)
        write_image(data / f"{patient}_label.nii.gz", label, GRID)
    return data


@pytest.fixture()
def recorded_data(tmp_path) -> tuple[Path, Path]:
    """A folder of four image/label pairs and a tiny bundle recording p1, p2, p3 as validation, p4 as test."""
    recorded = {"dataset": "data", "train": [], "val": ["p1", "p2", "p3"], "test": ["p4"]}
    return _patient_images(tmp_path), make_test_bundle(tmp_path / "run" / "model.calibseg", data=recorded)


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def test_ctrl_c_in_fit_quality_is_one_line_and_keeps_the_bundle(recorded_data, tmp_path, monkeypatch):
    data, bundle = recorded_data
    monkeypatch.setattr(fit_quality, "observe_cases", _interrupt)  # Ctrl-C while the cases are predicted
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        fit_quality.main(["--bundle", str(bundle), "--data", str(data), "--device", "cpu"])
    assert_one_sentence(str(caught.value.code), "^interrupted: ", "model.calibseg was not written")
    assert tree_snapshot(tmp_path) == before


def test_ctrl_c_in_fit_input_check_is_one_line_and_keeps_the_bundle(tmp_path, monkeypatch):
    data = _patient_images(tmp_path)
    bundle = make_test_bundle(tmp_path / "run" / "model.calibseg",
                              data={"dataset": "data", "train": ["p1", "p2"], "val": ["p3"], "test": ["p4"]})
    monkeypatch.setattr(fit_input_check, "fit_network_features", _interrupt)  # while the network runs
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        fit_input_check.main(["--bundle", str(bundle), "--data", str(data), "--device", "cpu"])
    assert_one_sentence(str(caught.value.code), "^interrupted: ", "model.calibseg was not written")
    assert tree_snapshot(tmp_path) == before


def test_fit_input_check_without_validation_patients_is_one_sentence_and_keeps_the_bundle(tmp_path):
    """The feature distance's threshold is chosen on validation volumes: a bundle recording none is refused
    before the network runs."""
    data = _patient_images(tmp_path)
    bundle = make_test_bundle(tmp_path / "run" / "model.calibseg",
                              data={"dataset": "data", "train": ["p1", "p2", "p3"], "test": ["p4"]})
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        fit_input_check.main(["--bundle", str(bundle), "--data", str(data), "--device", "cpu"])
    assert_one_sentence(str(caught.value.code), "^error: model.calibseg records no validation patients",
                        "nothing to choose its feature distance threshold on")
    assert tree_snapshot(tmp_path) == before


def test_ctrl_c_in_evaluate_is_one_line(recorded_data, tmp_path, monkeypatch):
    data, bundle = recorded_data
    monkeypatch.setattr(evaluate, "evaluate_bundle", _interrupt)  # Ctrl-C while the test cases are predicted
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        evaluate.main(["--bundle", str(bundle), "--data", str(data), "--device", "cpu"])
    assert_one_sentence(str(caught.value.code), "^interrupted: the evaluation did not finish", "run calibseg-evaluate")
    assert tree_snapshot(tmp_path) == before
