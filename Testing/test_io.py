"""Image IO: NIfTI/NRRD/MHA keep array and geometry exactly; atomic writes; one ValueError per bad file."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import SimpleITK as sitk

from CalibSegLib.io import (ImageGeometry, group_channels, image_stem, read_image, write_image,
                            write_json_atomic)
from CalibSegLib.io import images as image_files

# Anisotropic spacing and an oblique (rotated about z, then tilted) direction.
_ANGLE = math.radians(30)
OBLIQUE = ImageGeometry(
    spacing=(6.5, 1.4, 0.9),
    origin=(-12.0, 30.5, 4.25),
    direction=(
        math.cos(_ANGLE),
        -math.sin(_ANGLE),
        0.0,
        math.sin(_ANGLE),
        math.cos(_ANGLE),
        0.0,
        0.0,
        0.0,
        1.0,
    ),
)


@pytest.mark.parametrize("suffix", [".nii.gz", ".nii", ".nrrd", ".mha"])
@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.uint8])
def test_round_trip_keeps_array_dtype_and_geometry(tmp_path, suffix, dtype):
    array = (np.random.default_rng(0).random((4, 6, 5)) * 100).astype(dtype)
    path = write_image(tmp_path / f"image{suffix}", array, OBLIQUE)
    loaded, geometry = read_image(path)
    assert loaded.dtype == dtype
    np.testing.assert_array_equal(loaded, array)
    assert geometry.matches(OBLIQUE, tolerance=1e-5)
    assert [item.name for item in tmp_path.iterdir()] == [path.name]


def test_geometry_converts_between_array_and_physical_order():
    image = sitk.Image(5, 6, 4, sitk.sitkFloat32)  # SimpleITK size is (x, y, z)
    OBLIQUE.apply(image)
    assert image.GetSpacing() == (0.9, 1.4, 6.5)
    assert ImageGeometry.from_sitk(image) == OBLIQUE
    assert sitk.GetArrayViewFromImage(image).shape == (4, 6, 5)


def test_bool_arrays_are_written_as_uint8(tmp_path):
    mask = np.zeros((2, 8, 8), bool)
    mask[0, 2:5, 3:6] = True
    loaded, _ = read_image(write_image(tmp_path / "mask.nii.gz", mask, OBLIQUE))
    assert loaded.dtype == np.uint8 and loaded.sum() == 9


def test_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = write_image(tmp_path / "out.nrrd", np.ones((2, 8, 8), np.float32), OBLIQUE)
    before = path.read_bytes()

    def crash_half_way(image, name, useCompression):
        with open(name, "wb") as handle:
            handle.write(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(image_files.sitk, "WriteImage", crash_half_way)
    with pytest.raises(OSError, match="Cannot write out.nrrd \\(disk full\\)"):
        write_image(path, np.zeros((2, 8, 8), np.float32), OBLIQUE)
    assert path.read_bytes() == before
    assert [item.name for item in tmp_path.iterdir()] == ["out.nrrd"]


def test_json_is_written_atomically_with_nan(tmp_path):
    path = write_json_atomic(tmp_path / "sub" / "metrics.json", {"dice": 0.5, "hd95": float("nan")})
    assert json.loads(path.read_text())["dice"] == 0.5
    assert [item.name for item in path.parent.iterdir()] == ["metrics.json"]


def _unreadable(folder):
    (folder / "garbage.nii.gz").write_bytes(b"definitely not an image")
    return folder / "garbage.nii.gz"


def _two_dimensional(folder):
    sitk.WriteImage(sitk.Image(9, 9, sitk.sitkFloat32), str(folder / "flat.nii.gz"))
    return folder / "flat.nii.gz"


def _four_dimensional(folder):
    sitk.WriteImage(sitk.Image([9, 9, 3, 2], sitk.sitkFloat32), str(folder / "time.nii.gz"))
    return folder / "time.nii.gz"


def _vector(folder):
    sitk.WriteImage(sitk.Image([9, 9, 3], sitk.sitkVectorFloat32, 3), str(folder / "rgb.mha"))
    return folder / "rgb.mha"


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda folder: folder / "absent.nii.gz", "No image file at"),
        (lambda folder: folder, "No image file at"),
        (_unreadable, "Cannot read garbage.nii.gz as an image"),
        (_two_dimensional, "is a 2D image; CalibSeg needs a 3D volume"),
        (_four_dimensional, "is a 4D image; CalibSeg needs a 3D volume"),
        (_vector, "3 components per voxel"),
    ],
    ids=["missing", "directory", "unreadable", "2D", "4D", "vector"],
)
def test_bad_files_raise_one_clear_value_error(tmp_path, make, message):
    with pytest.raises(ValueError, match=message) as caught:
        read_image(make(tmp_path))
    assert "\n" not in str(caught.value)


def test_write_refuses_unsupported_extension_and_non_3d_arrays(tmp_path):
    with pytest.raises(ValueError, match="extensions .nii.gz"):
        write_image(tmp_path / "out.mhd", np.zeros((2, 8, 8)), OBLIQUE)
    with pytest.raises(ValueError, match="shape \\(8, 8\\)"):
        write_image(tmp_path / "out.nii.gz", np.zeros((8, 8)), OBLIQUE)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "name,stem", [("case.nii.gz", "case"), ("a.b.NRRD", "a.b"), ("x.mha", "x"), ("y.png", "y")]
)
def test_image_stem_drops_image_extensions(name, stem):
    assert image_stem(name) == stem


def test_group_channels_gathers_a_cases_channel_images_in_order_of_first_appearance():
    stems = ["b_0001", "a", "b_0000", "c_0002", "a_0000", "b_0003"]
    assert group_channels(stems) == [
        ("b", {1: 0, 0: 2, 3: 5}),  # a gap (no b_0002) is kept for the caller to name
        ("a", {0: 1}),  # an image without a channel suffix is a case of its own, even beside a_0000
        ("c", {2: 3}),
        ("a", {0: 4}),
    ]
