"""Image IO keeps geometry; the predict command line writes outputs on the input's exact grid."""

from __future__ import annotations

import json

import numpy as np
import pytest
import SimpleITK as sitk

from CalibSegLib.io import ImageGeometry, read_image, write_image
from CalibSegLib.predict import main as predict_main
from bundle_factory import make_test_bundle

GEOMETRY = ImageGeometry(spacing=(6.5, 1.4, 0.9), origin=(-12.0, 30.5, 4.0),
                         direction=(0.0, 1.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 1.0))


@pytest.mark.parametrize("suffix", [".nii.gz", ".nrrd", ".mha"])
def test_write_read_round_trip_keeps_array_and_geometry(tmp_path, suffix):
    array = np.random.default_rng(0).random((4, 6, 5)).astype(np.float32)
    path = write_image(tmp_path / f"image{suffix}", array, GEOMETRY)
    loaded, geometry = read_image(path)
    np.testing.assert_array_equal(loaded, array)
    np.testing.assert_allclose(geometry.spacing, GEOMETRY.spacing)
    np.testing.assert_allclose(geometry.origin, GEOMETRY.origin)
    np.testing.assert_allclose(geometry.direction, GEOMETRY.direction, atol=1e-6)
    assert [p.name for p in tmp_path.iterdir()] == [f"image{suffix}"]  # no temporary file left


def test_read_refuses_missing_and_2d_images(tmp_path):
    with pytest.raises(ValueError, match="No image"):
        read_image(tmp_path / "none.nii.gz")
    sitk.WriteImage(sitk.Image(5, 5, sitk.sitkFloat32), str(tmp_path / "flat.nii.gz"))
    with pytest.raises(ValueError, match="2D"):
        read_image(tmp_path / "flat.nii.gz")


def test_cli_writes_outputs_with_input_geometry_and_metrics(tmp_path, capsys):
    rng = np.random.default_rng(1)
    image = rng.normal(size=(3, 30, 26)).astype(np.float32)
    reference = rng.integers(0, 4, size=image.shape).astype(np.uint8)
    write_image(tmp_path / "case.nii.gz", image, GEOMETRY)
    write_image(tmp_path / "case_ref.nii.gz", reference, GEOMETRY)
    bundle = make_test_bundle(tmp_path / "m.calibseg")
    code = predict_main(["--bundle", str(bundle), "--image", str(tmp_path / "case.nii.gz"), "--out-dir",
                         str(tmp_path / "out"), "--reference", str(tmp_path / "case_ref.nii.gz"), "--device", "cpu"])
    assert code == 0
    for name in ("labels", "confidence", "entropy"):
        array, geometry = read_image(tmp_path / "out" / f"case_{name}.nii.gz")
        assert array.shape == image.shape
        assert geometry == read_image(tmp_path / "case.nii.gz")[1]
    metrics = json.loads((tmp_path / "out" / "case_metrics.json").read_text())
    assert {"dice_mean", "hd95_mean", "ece", "tace", "error_auroc"} <= set(metrics)
    assert "labels:" in capsys.readouterr().out


def test_cli_bad_bundle_prints_one_line_and_exits_2(tmp_path, capsys):
    write_image(tmp_path / "case.nii.gz", np.random.rand(2, 20, 20).astype(np.float32), GEOMETRY)
    code = predict_main(["--bundle", str(tmp_path / "none.calibseg"), "--image", str(tmp_path / "case.nii.gz"),
                         "--out-dir", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert code == 2 and error.startswith("error: No model bundle") and error.count("\n") == 1
    assert not (tmp_path / "out").exists()
