"""``python -m CalibSegLib.predict``: outputs on the input's exact grid, the quality summary always,
metrics with a reference (measured Dice beside the predicted one), one-line errors with exit status 2,
a printed summary per case and progress; the shipped sample labelmap on its image's grid."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from CalibSegLib.inference import Predictor
from CalibSegLib.io import ImageGeometry, read_image, write_image
from CalibSegLib.predict import ProgressReport, main, summary_lines
from tiny_bundles import make_test_bundle
from conftest import REPO_ROOT

# Anisotropic voxels on an oblique grid (axes swapped and flipped), away from the origin.
GRID = ImageGeometry(
    spacing=(7.0, 1.25, 0.8),
    origin=(-80.5, 12.0, 33.3),
    direction=(0.0, 1.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 1.0),
)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """A small NIfTI case with a reference, and a bundle: paths in one folder."""
    folder = tmp_path_factory.mktemp("case")
    rng = np.random.default_rng(1)
    image = rng.normal(300, 80, size=(3, 30, 26)).astype(np.int16)
    reference = np.zeros(image.shape, np.uint8)
    reference[:, 8:20, 6:18] = 1
    reference[:, 12:16, 10:14] = 2
    write_image(folder / "case.nii.gz", image, GRID)
    write_image(folder / "case_ref.nii.gz", reference, GRID)
    make_test_bundle(folder / "model.calibseg")
    return folder


def run_cli(case, out_dir, *extra: str) -> int:
    # --image is repeatable (one per channel): the case's image only where extra gives none.
    image = [] if "--image" in extra else ["--image", str(case / "case.nii.gz")]
    return main(
        [
            "--bundle",
            str(case / "model.calibseg"),
            *image,
            "--out-dir",
            str(out_dir),
            "--device",
            "cpu",
            "--batch-size",
            "2",
            *extra,
        ]
    )


def test_outputs_have_the_input_shape_and_exact_geometry(case, tmp_path, capsys):
    assert run_cli(case, tmp_path) == 0
    image, geometry = read_image(case / "case.nii.gz")
    expected = Predictor(case / "model.calibseg", device="cpu", batch_size=2).predict(image, geometry.spacing)
    for name, dtype in (("labels", np.uint8), ("confidence", np.float32), ("entropy", np.float32)):
        array, written = read_image(tmp_path / f"case_{name}.nii.gz")
        assert array.shape == image.shape and array.dtype == dtype
        assert written == geometry  # bit-identical spacing, origin and direction
        np.testing.assert_array_equal(array, getattr(expected, name))
    assert not (tmp_path / "case_metrics.json").exists()
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("segmenting case.nii.gz: ") and printed[-11].endswith(": 100 %")  # not a terminal
    assert printed[-10] == "case: input not checked: this bundle stores no statistics of its training inputs " \
                           "(add them with python -m Training.fit_input_check --bundle <bundle>)"
    assert printed[-9] == "3 of 3 structures found" and printed[-5].startswith("This bundle has no quality model")
    assert [line.split(":")[0] for line in printed[-4:]] == ["summary", "labels", "confidence", "entropy"]
    summary = json.loads((tmp_path / "case_summary.json").read_text())
    assert summary["quality_model"] is None and summary["note"].startswith("no quality model")
    assert list(summary["structures"]) == ["class 1", "class 2", "class 3"]


def test_reference_adds_segmentation_and_calibration_metrics(case, tmp_path):
    assert run_cli(case, tmp_path, "--reference", str(case / "case_ref.nii.gz")) == 0
    metrics = json.loads((tmp_path / "case_metrics.json").read_text())
    assert {
        "dice_class_1",
        "dice_mean",
        "hd95_mean",
        "asd_mean",
        "ece",
        "cece",
        "tace",
        "brier",
        "nll",
        "error_auroc",
        "aurc",
    } <= set(metrics)
    assert 0.0 <= metrics["ece"] <= 1.0 and 0.0 <= metrics["dice_mean"] <= 1.0


def _constant_image(case, folder):
    write_image(folder / "flat.nii.gz", np.full((2, 20, 20), 5, np.int16), GRID)
    return ["--image", str(folder / "flat.nii.gz")]


def _reference_on_another_grid(case, folder):
    moved = ImageGeometry(GRID.spacing, (0.0, 0.0, 0.0), GRID.direction)
    write_image(folder / "moved.nii.gz", read_image(case / "case_ref.nii.gz")[0], moved)
    return ["--reference", str(folder / "moved.nii.gz")]


def _reference_with_unknown_labels(case, folder):
    write_image(folder / "ref9.nii.gz", np.full((3, 30, 26), 9, np.uint8), GRID)
    return ["--reference", str(folder / "ref9.nii.gz")]


@pytest.mark.parametrize(
    "arguments,message",
    [
        (lambda case, folder: ["--bundle", str(folder / "none.calibseg")], "error: No model bundle at"),
        (lambda case, folder: ["--image", str(folder / "none.nii.gz")], "error: No image file at"),
        (_constant_image, "error: The image is constant"),
        (_reference_on_another_grid, "error: The reference moved.nii.gz is not on the image's grid"),
        (_reference_with_unknown_labels, "error: reference labels must lie in \\[0, 3\\]"),
        (lambda case, folder: ["--batch-size", "0"], "error: batch_size must be a positive integer"),
    ],
    ids=[
        "missing bundle",
        "missing image",
        "constant image",
        "reference grid",
        "reference labels",
        "batch size",
    ],
)
def test_bad_input_prints_one_line_and_exits_2(case, tmp_path, capsys, arguments, message):
    # Later options override the defaults given by run_cli.
    assert run_cli(case, tmp_path / "out", *arguments(case, tmp_path)) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.out == ""
    assert re.match(message, captured.err)
    assert not (tmp_path / "out").exists()


def test_module_entry_point_exits_2_without_traceback(case, tmp_path):
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "CalibSegLib.predict",
            "--bundle",
            str(tmp_path / "absent.calibseg"),
            "--image",
            str(case / "case.nii.gz"),
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2
    assert completed.stderr.startswith("error: No model bundle") and "Traceback" not in completed.stderr


def _summary(input_check=None, **structures) -> dict:
    return {"input_check": input_check or {"suitable": True, "reasons": []}, "structures": structures,
            "review": any(entry["review"] for entry in structures.values()),
            "quality_model": {"review_below": 0.8}}


def test_summary_lines_say_what_was_found_and_what_to_review():
    found = {"volume_ml": 53.6, "mean_confidence": 0.937, "predicted_dice": 0.81,
             "predicted_dice_interval": [0.716, 0.881], "review": False}
    missing = {"volume_ml": 0.0, "mean_confidence": None, "predicted_dice": None, "predicted_dice_interval": None,
               "review": True}
    lines = summary_lines(_summary(**{"right ventricle": found, "myocardium": missing}),
                          {"dice_right_ventricle": 0.9, "dice_myocardium": 0.0})
    assert lines == ["input suitable: like the model's training volumes", "1 of 2 structures found",
                     "  right ventricle     53.6 mL  mean confidence 0.94  predicted Dice 0.81 [0.72, 0.88]  "
                     "measured Dice 0.90  ok",
                     "  myocardium       not found  measured Dice 0.00  REVIEW",
                     "Review: myocardium (predicted nowhere)."]


def test_summary_lines_say_first_when_the_input_is_unsuitable():
    found = {"volume_ml": 53.6, "mean_confidence": 0.937, "predicted_dice": 0.81,
             "predicted_dice_interval": [0.716, 0.881], "review": False}
    reason = "No myocardium was found, though every training volume has it."
    lines = summary_lines(_summary({"suitable": False, "reasons": [reason]}, **{"right ventricle": found}))
    assert lines[:3] == ["INPUT UNSUITABLE: unlike the model's training volumes, so no Dice here can be trusted.",
                         reason,
                         "1 of 1 structures found"]


def test_the_console_and_the_batch_table_give_the_network_feature_distance_with_its_threshold():
    from CalibSegLib.predict import batch_row

    found = {"volume_ml": 53.6, "mean_confidence": 0.937, "predicted_dice": 0.81,
             "predicted_dice_interval": [0.716, 0.881], "review": False}
    features = {"distance": 27.1, "threshold": 35.64, "false_alarm_rate": 0.05, "validation_volumes": 20,
                "validation_within": 20}
    summary = _summary({"suitable": True, "reasons": [], "features": features}, **{"right ventricle": found})
    assert summary_lines(summary)[:2] == [
        "input suitable: like the model's training volumes",
        "network features: distance 27.1, like the training images the network saw (all 20 validation "
        "volumes ≤ 35.6)"]
    row = batch_row("a", "ok", summary)
    assert (row["feature_distance"], row["feature_threshold"]) == (27.1, 35.64)
    assert row["input_check"] == " ".join(summary_lines(summary)[:2])


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal_and_quarter_lines_in_a_log():
    log = io.StringIO()
    progress = ProgressReport(log, "segmenting case.nii.gz")
    for fraction in (0.1, 0.3, 0.35, 0.55, 0.8, 1.0, 1.0):
        progress(fraction)
    progress.close()
    assert log.getvalue().splitlines() == [f"segmenting case.nii.gz: {percent} %" for percent in (25, 50, 75, 100)]
    terminal = _Terminal()
    progress = ProgressReport(terminal, "segmenting case.nii.gz")
    progress(0.5)
    progress(1.0)
    progress.close()
    assert progress.bar is not None and "segmenting case.nii.gz: 100%|" in terminal.getvalue()


SHIPPED_IMAGE = REPO_ROOT / "CalibSeg" / "Resources" / "SampleData" / "acdc_patient_image.nii.gz"
SHIPPED_LABELS = SHIPPED_IMAGE.with_name("acdc_patient_labels.nii.gz")
SHIPPED_CASE = "patient069_frame01"  # the volume behind SHIPPED_IMAGE (scripts/make_slicer_sample_data.py)


def test_sample_labelmap_is_the_reference_on_the_image_grid(tmp_path, sample_acdc_dir, capsys):
    import h5py

    labels, geometry = read_image(SHIPPED_LABELS)
    image, image_geometry = read_image(SHIPPED_IMAGE)
    with h5py.File(sample_acdc_dir / f"{SHIPPED_CASE}.h5", "r") as handle:
        np.testing.assert_array_equal(labels, handle["label"][...])
    assert labels.dtype == np.uint8 and labels.shape == image.shape and geometry == image_geometry
    make_test_bundle(tmp_path / "model.calibseg")
    assert main(["--bundle", str(tmp_path / "model.calibseg"), "--image", str(SHIPPED_IMAGE), "--reference",
                 str(SHIPPED_LABELS), "--out-dir", str(tmp_path / "out"), "--device", "cpu"]) == 0
    assert (tmp_path / "out" / "acdc_patient_image_metrics.json").is_file()
    assert "measured Dice" in capsys.readouterr().out


@pytest.mark.parametrize("with_reference", [False, True], ids=["no reference", "reference"])
def test_shipped_model_writes_the_quality_summary(tmp_path, with_reference):
    extra = ["--reference", str(SHIPPED_LABELS)] if with_reference else []
    out = tmp_path / "out"
    assert main(["--bundle", "acdc_ce_dice", "--image", str(SHIPPED_IMAGE), "--out-dir", str(out), "--device", "cpu",
                 *extra]) == 0
    summary = json.loads((out / "acdc_patient_image_summary.json").read_text())
    predicted, geometry = read_image(out / "acdc_patient_image_labels.nii.gz")
    voxel_mm3 = float(np.prod(geometry.spacing))
    assert set(summary) >= {"structures", "review", "uncertain_slices", "quality_model", "note"}
    # The shipped models check their input first: this test patient's cine MRI is like their training volumes,
    # to the statistics and to the network's features (every member's distance below the threshold that its three
    # members' 78 out-of-fold volumes set, each scored by the member that never saw it).
    check = summary["input_check"]
    assert list(summary)[0] == "input_check" and (check["suitable"], check["reasons"]) == (True, [])
    assert max(check["features"]["member_distances"]) < check["features"]["threshold"]
    assert (check["features"]["validation_volumes"], check["features"]["false_alarm_rate"]) == (78, 0.05)
    assert len(check["features"]["member_distances"]) == 3
    for label, (_name, entry) in enumerate(summary["structures"].items(), start=1):
        assert entry["volume_ml"] == int((predicted == label).sum()) * voxel_mm3 / 1000.0  # exactly
        low, high = entry["predicted_dice_interval"]
        assert 0.0 <= low <= entry["predicted_dice"] <= high <= 1.0
        assert entry["review"] is (entry["predicted_dice"] < summary["quality_model"]["review_below"])
    assert summary["uncertain_slices"] and all(0 <= index < predicted.shape[0] for index in summary["uncertain_slices"])
    if with_reference:
        metrics = json.loads((out / "acdc_patient_image_metrics.json").read_text())
        keys = list(metrics)
        for name, entry in summary["structures"].items():
            key = name.replace(" ", "_")
            assert keys[keys.index(f"dice_{key}") + 1] == f"predicted_dice_{key}"  # side by side
            assert metrics[f"predicted_dice_{key}"] == entry["predicted_dice"]
    else:
        assert not (out / "acdc_patient_image_metrics.json").exists()


def _batch(folder: Path, images: dict[str, np.ndarray]) -> Path:
    """A folder of images (name → array on the test grid)."""
    folder.mkdir()
    for name, image in images.items():
        write_image(folder / f"{name}.nii.gz", image, GRID)
    return folder


def test_image_dir_writes_every_case_and_one_table(case, tmp_path, capsys):
    import csv

    image = read_image(case / "case.nii.gz")[0]
    cases = _batch(tmp_path / "cases", {"a": image, "b": image[::-1].copy(), "c": image[:, ::-1].copy()})
    out = tmp_path / "out"
    assert main(["--bundle", str(case / "model.calibseg"), "--image-dir", str(cases), "--out-dir", str(out),
                 "--device", "cpu", "--batch-size", "2"]) == 0
    for name in "abc":
        assert {path.name for path in out.glob(f"{name}_*")} == {f"{name}_{output}" for output in
                                                                 ("summary.json", "labels.nii.gz",
                                                                  "confidence.nii.gz", "entropy.nii.gz")}
    with (out / "predictions.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [row["case"] for row in rows] == ["a", "b", "c"] and {row["status"] for row in rows} == {"ok"}
    summary = json.loads((out / "b_summary.json").read_text())
    assert float(rows[1]["volume_ml_class_1"]) == pytest.approx(summary["structures"]["class 1"]["volume_ml"])
    assert rows[1]["input_check"] == (summary["input_check"]["note"] if summary["input_check"]["suitable"] is None
                                      else "input suitable: like the model's training volumes")
    # the network's feature distance and its threshold are columns of their own, empty without statistics
    assert (rows[1]["feature_distance"], rows[1]["feature_threshold"]) == ("", "")
    assert "table: " in capsys.readouterr().out


def test_a_failing_case_is_reported_in_its_row_and_the_others_are_kept(case, tmp_path, capsys):
    import csv

    image = read_image(case / "case.nii.gz")[0]
    cases = _batch(tmp_path / "cases", {"a": image, "flat": np.full(image.shape, 5, np.int16), "z": image})
    out = tmp_path / "out"
    assert main(["--bundle", str(case / "model.calibseg"), "--image-dir", str(cases), "--out-dir", str(out),
                 "--device", "cpu"]) == 2
    with (out / "predictions.csv").open() as handle:
        rows = {row["case"]: row for row in csv.DictReader(handle)}
    assert rows["a"]["status"] == rows["z"]["status"] == "ok"
    assert rows["flat"]["status"].startswith("error: The image is constant") and rows["flat"]["review"] == ""
    assert (out / "z_labels.nii.gz").is_file() and not list(out.glob("flat_*"))
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("error: 1 of 3 cases failed (first: flat: The image is constant")


@pytest.mark.parametrize("arguments,message", [
    (lambda folder: ["--image-dir", str(folder / "none")], "^error: Image folder .*none does not exist"),
    (lambda folder: ["--image-dir", str(folder)], "^error: .* holds no image"),
    (lambda folder: ["--image-dir", str(folder), "--reference", str(folder / "r.nii.gz")],
     "^error: --reference names one case's reference; use it with --image, not --image-dir.$"),
])
def test_image_dir_refusals_are_one_sentence_before_any_output(case, tmp_path, capsys, arguments, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--bundle", str(case / "model.calibseg"), *arguments(empty), "--out-dir", str(tmp_path / "out"),
                 "--device", "cpu"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and re.match(message, error.strip())
    assert not (tmp_path / "out").exists()
