"""Fault catalogue, images: NaN/inf voxels are refused whatever the format (NIfTI included, whose
reader zeroes them), a header that disagrees with its data is refused before any voxel is
allocated, a write cut short never replaces the previous file, extreme intensities normalise
without overflow, and non-finite probabilities never reach an output."""

from __future__ import annotations

import re
import struct
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import SimpleITK as sitk

from CalibSegLib.bundle import Bundle, load_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.io import ImageGeometry, read_image, write_image
from CalibSegLib.io import images as image_files
from CalibSegLib.preprocessing import intensity_range, normalize_intensity, scale_intensity
from tiny_bundles import make_test_bundle
from fault_checks import (NIFTI_DIM_OFFSET as DIM_OFFSET, NIFTI_PIXDIM_OFFSET as PIXDIM_OFFSET,
                          assert_one_sentence, edit_stored_bytes, tree_snapshot)

GRID = ImageGeometry(spacing=(4.0, 1.5, 1.25), origin=(3.0, -7.0, 11.0))
SCALING_OFFSET = 112  # scl_slope, scl_inter: two float32 at this byte of a NIfTI-1 header


def volume(dtype=np.float32, shape=(3, 16, 12)) -> np.ndarray:
    return (np.random.default_rng(0).normal(200, 40, size=shape)).astype(dtype)


def _with_value(suffix: str, value: float, dtype=np.float32) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        image = volume(dtype)
        image[1, 5, 7] = value
        return write_image(folder / f"bad{suffix}", image, GRID)

    return make


def _analyze_pair(folder: Path) -> Path:
    """A NIfTI pair (``.hdr`` + ``.img``), NaN in the ``.img``."""
    image = volume()
    image[2, 0, 0] = np.nan
    sitk.WriteImage(GRID.apply(sitk.GetImageFromArray(image)), str(folder / "pair.hdr"))
    return folder / "pair.hdr"


def _scaled(slope: float, intercept: float) -> Callable[[Path], Path]:
    """An int16 ``.nii`` whose header scaling is patched to (slope, intercept)."""
    def make(folder: Path) -> Path:
        path = write_image(folder / "scaled.nii", volume(np.int16), GRID)
        raw = bytearray(path.read_bytes())
        raw[SCALING_OFFSET : SCALING_OFFSET + 8] = struct.pack("<ff", slope, intercept)
        path.write_bytes(bytes(raw))
        return path

    return make


NAN, INF = float("nan"), float("inf")
BAD_IMAGES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "NaN in .nii.gz": (_with_value(".nii.gz", NAN), "stores NaN or infinite voxel values"),
    "NaN in .nii": (_with_value(".nii", NAN), "stores NaN or infinite voxel values"),
    "NaN in .nrrd": (_with_value(".nrrd", NAN), "holds NaN or infinite voxel values"),
    "NaN in .mha": (_with_value(".mha", NAN), "holds NaN or infinite voxel values"),
    "+inf in .nii.gz": (_with_value(".nii.gz", INF), "stores NaN or infinite"),
    "-inf in .nrrd": (_with_value(".nrrd", -INF), "holds NaN or infinite"),
    "NaN in float64 .nii.gz": (_with_value(".nii.gz", NAN, np.float64), "stores NaN or infinite"),
    "NaN in a .hdr/.img pair": (_analyze_pair, "stores NaN or infinite"),
    "NaN scl_slope": (_scaled(NAN, 0.0), r"NaN or infinite intensity scaling \(scl_slope/scl_inter\)"),
    "inf scl_slope": (_scaled(INF, 0.0), "intensity scaling"),
    "NaN scl_inter": (_scaled(2.0, NAN), "intensity scaling"),
    "scl_slope overflowing float32": (_scaled(1e38, 0.0), "holds NaN or infinite voxel values"),
}


@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_non_finite_image_is_one_sentence_whatever_the_format(case, tmp_path):
    make, pattern = BAD_IMAGES[case]
    path = make(tmp_path)
    before = tree_snapshot(tmp_path)
    with pytest.raises(ValueError) as caught:
        read_image(path)
    assert_one_sentence(str(caught.value), re_name(path), pattern)
    assert tree_snapshot(tmp_path) == before


def re_name(path: Path) -> str:
    return path.name.replace(".", r"\.")


@pytest.mark.parametrize("suffix", [".nii.gz", ".nii"])
def test_clean_and_scaled_nifti_still_read(tmp_path, suffix):
    image = volume()
    loaded, _ = read_image(write_image(tmp_path / f"clean{suffix}", image, GRID))
    np.testing.assert_array_equal(loaded, image)
    scaled, _ = read_image(_scaled(2.0, 5.0)(tmp_path))
    np.testing.assert_allclose(scaled, volume(np.int16) * 2.0 + 5.0)


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory) -> Bundle:
    return load_bundle(make_test_bundle(tmp_path_factory.mktemp("bundle") / "tiny.calibseg"))


def test_extreme_float32_intensities_normalise_without_overflow(tiny_bundle):
    image = volume()
    image[0, :4] = -3e38
    image[2, :4] = 3e38
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow RuntimeWarning fails the test
        low, high = intensity_range(image)
        normalised = normalize_intensity(image)
        predictor = Predictor(tiny_bundle, device="cpu")
        prediction = predictor.predict(image, GRID.spacing, keep_probabilities=True)
    assert np.isfinite([low, high]).all() and high > low
    assert np.isfinite(normalised).all() and normalised.min() == 0.0 and normalised.max() == 1.0
    assert np.isfinite(prediction.probabilities).all()
    np.testing.assert_allclose(prediction.probabilities.sum(axis=0), 1.0, atol=1e-5)


def test_float32_normalisation_matches_float64_reference():
    image = volume()
    image[1, 3] = 3e38
    low, high = intensity_range(image, upper_percentile=90.0)
    reference = (np.clip(image.astype(np.float64), low, high) - low) / (high - low)
    np.testing.assert_allclose(scale_intensity(image, (low, high)), reference, rtol=1e-6, atol=1e-7)


def test_scaling_never_changes_the_callers_float64_array():
    image = volume(np.float64)
    copy = image.copy()
    scale_intensity(image, (150.0, 250.0))
    np.testing.assert_array_equal(image, copy)


def test_intensity_range_beyond_float64_is_one_sentence():
    image = volume(np.float64)
    image[0, 0, :3] = -1e308
    image[2, :, :] = 1e308
    with pytest.raises(ValueError) as caught:
        intensity_range(image, upper_percentile=99.0)
    assert_one_sentence(str(caught.value), "too wide to normalise")


def exploding_bundle(bundle: Bundle) -> Bundle:
    """Finite weights whose logits overflow to inf: the last convolution's weights are 3e38."""
    state = {name: tensor.clone() for name, tensor in bundle.state_dict.items()}
    last_weight = [name for name in state if name.endswith("weight")][-1]
    state[last_weight].fill_(3e38)
    return Bundle(bundle.metadata, state)


def test_non_finite_probabilities_raise_before_any_output_exists(tiny_bundle):
    outputs = []
    predictor = Predictor(exploding_bundle(tiny_bundle), device="cpu")
    with pytest.raises(ValueError) as caught:
        predictor.predict(volume(), GRID.spacing, probability_sink=lambda *args: outputs.append(args))
    assert_one_sentence(str(caught.value), "NaN or infinite probabilities")
    assert outputs == []


def test_nan_in_an_in_memory_volume_is_refused(tiny_bundle):
    image = volume()
    image[0, 0, 0] = np.nan
    with pytest.raises(ValueError) as caught:
        Predictor(tiny_bundle, device="cpu").predict(image, GRID.spacing)
    assert_one_sentence(str(caught.value), "NaN or infinite")


def _nifti(suffix: str = ".nii", dtype=np.int16, patch: Callable[[bytearray], None] | None = None,
           keep: float = 1.0) -> Callable[[Path], Path]:
    """A NIfTI-1 file of :func:`volume` whose uncompressed bytes ``patch`` edits and of which only the first
    ``keep`` fraction is kept (:func:`fault_checks.edit_stored_bytes`)."""
    return lambda folder: edit_stored_bytes(write_image(folder / f"header{suffix}", volume(dtype), GRID), patch, keep)


def _dims(*sizes: int) -> Callable[[bytearray], None]:
    return lambda raw: struct.pack_into("<3h", raw, DIM_OFFSET + 2, *sizes)


def _pixdim(value: float) -> Callable[[bytearray], None]:
    return lambda raw: struct.pack_into("<f", raw, PIXDIM_OFFSET + 3 * 4, value)  # pixdim[3]: the slice spacing


def _meta_image(edit: Callable[[str], str], detached: bool = False) -> Callable[[Path], Path]:
    """A MetaImage (.mha, or .mhd + .raw when ``detached``) of :func:`volume` whose header text ``edit`` changes."""
    def make(folder: Path) -> Path:
        path = folder / ("header.mhd" if detached else "header.mha")
        sitk.WriteImage(GRID.apply(sitk.GetImageFromArray(volume())), str(path), useCompression=not detached)
        raw = path.read_bytes()
        end = raw.index(b"ElementDataFile")
        end = raw.index(b"\n", end) + 1
        path.write_bytes(edit(raw[:end].decode()).encode() + raw[end:])
        return path

    return make


HEADER_FAULTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "int16 .nii cut short": (_nifti(keep=0.6), r"is cut short: its NIfTI header declares 1\.1 KiB of voxels"),
    "float32 .nii cut short": (_nifti(dtype=np.float32, keep=0.9), "is cut short"),
    "int16 .nii.gz cut short": (_nifti(".nii.gz", keep=0.7), "is cut short"),
    "0 slices in .nii": (_nifti(patch=_dims(12, 16, 0)), r"declares 0 × 16 × 12 voxels .*an axis without voxels"),
    "0 slices in .nii.gz": (_nifti(".nii.gz", patch=_dims(12, 16, 0)), "an axis without voxels"),
    "slice spacing 0": (_nifti(patch=_pixdim(0.0)), r"spacing \(pixdim\) of 0 × 1\.5 × 1\.25 mm .*not positive"),
    "slice spacing NaN": (_nifti(".nii.gz", patch=_pixdim(float("nan"))), "spacing .pixdim. of nan × "),
    "slice spacing -4": (_nifti(patch=_pixdim(-4.0)), "of -4 × 1.5 × 1.25 mm"),
    "slice spacing inf": (_nifti(patch=_pixdim(float("inf"))), "of inf × "),
    "small .nii claiming 2048×2048×300": (_nifti(patch=_dims(2048, 2048, 300)), r"is cut short: .* declares 2\.3 GiB"),
    "small .nii.gz claiming 2048×2048×300": (
        _nifti(".nii.gz", patch=_dims(2048, 2048, 300)),
        r"declares 300 × 2048 × 2048 voxels \(2\.3 GiB\) .*more than its .* of compressed data can hold"),
    ".mha spacing 0": (_meta_image(lambda text: text.replace("ElementSpacing = 1.25 1.5 4",
                                                             "ElementSpacing = 1.25 1.5 0")),
                       r"voxel spacing of 0 × 1\.5 × 1\.25 mm, which is not positive and finite"),
    ".mha claiming 2048×2048×300": (
        _meta_image(lambda text: text.replace("DimSize = 12 16 3", "DimSize = 2048 2048 300")),
        r"declares 300 × 2048 × 2048 voxels \(4\.7 GiB\), more than its .* of data can hold even compressed"),
    ".mhd claiming more than its .raw holds": (
        _meta_image(lambda text: text.replace("DimSize = 12 16 3", "DimSize = 2048 2048 300"), detached=True),
        "more than its 2.2 KiB of data can hold"),
}


class _NoPixelReader(sitk.ImageFileReader):
    """A reader that fails the test when asked for the voxels: a refusal must come from the header alone."""

    def Execute(self):  # noqa: N802  (SimpleITK's name)
        raise AssertionError("the voxels were read (and allocated) before the header was checked")


@pytest.mark.parametrize("case", list(HEADER_FAULTS))
def test_header_that_disagrees_with_its_data_is_refused_before_allocation(case, tmp_path, monkeypatch):
    make, pattern = HEADER_FAULTS[case]
    path = make(tmp_path)
    before = tree_snapshot(tmp_path)
    monkeypatch.setattr(image_files.sitk, "ImageFileReader", _NoPixelReader)
    with pytest.raises(ValueError) as caught:
        read_image(path)
    assert_one_sentence(str(caught.value), "^" + re_name(path), pattern, "fix or re-export the file")
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
def test_a_whole_nifti_with_odd_but_valid_header_values_still_reads(suffix, tmp_path):
    """The checks refuse only what cannot be true: extra bytes after the voxels and a fine spacing are fine."""
    path = _nifti(suffix, patch=_pixdim(0.001))(tmp_path)
    if suffix == ".nii":
        path.write_bytes(path.read_bytes() + b"\0" * 64)
    loaded, geometry = read_image(path)
    np.testing.assert_array_equal(loaded, volume(np.int16))
    assert geometry.spacing == pytest.approx((0.001, 1.5, 1.25))


def test_a_large_hdr_img_pair_is_bounded_by_its_img_not_its_header(tmp_path):
    """The size bound reads the ``.img`` beside a ``.hdr`` (348 bytes, which could hold at most ~350 KiB)."""
    image = np.random.default_rng(1).normal(size=(8, 128, 128)).astype(np.float32)  # 512 KiB
    sitk.WriteImage(GRID.apply(sitk.GetImageFromArray(image)), str(tmp_path / "pair.hdr"))
    loaded, _ = read_image(tmp_path / "pair.hdr")
    np.testing.assert_array_equal(loaded, image)


def _silently_truncating(fraction: float):
    """``sitk.WriteImage`` as ITK's NIfTI writer behaves on a full disk: the file is cut short, no error raised."""
    real = sitk.WriteImage

    def write(image, name, useCompression=False):
        real(image, name, useCompression=useCompression)
        data = Path(name).read_bytes()
        Path(name).write_bytes(data[: int(len(data) * fraction)])

    return write


@pytest.mark.parametrize("suffix", [".nii.gz", ".nii", ".nrrd", ".mha"])
@pytest.mark.parametrize("fraction", [0.5, 0.99], ids=["half written", "last bytes missing"])
def test_a_write_cut_short_raises_and_keeps_the_previous_file(suffix, fraction, tmp_path, monkeypatch):
    path = write_image(tmp_path / f"out{suffix}", volume(), GRID)
    before = tree_snapshot(tmp_path)
    monkeypatch.setattr(image_files.sitk, "WriteImage", _silently_truncating(fraction))
    with pytest.raises(OSError) as caught:
        write_image(path, volume() + 1, GRID)
    assert_one_sentence(str(caught.value), f"^Cannot write out{re.escape(suffix)} ", "check the free space")
    assert tree_snapshot(tmp_path) == before
