"""Datasets/convert_acdc.py on a tiny generated copy of the official ACDC NIfTI layout: real spacing
kept, pairs the loader groups by patient, one-sentence errors that leave the output folder as it was."""

from __future__ import annotations

import numpy as np
import pytest

from CalibSegLib.io import read_image
from acdc_release import SPACING_XYZ, write_release, write_volume
from fault_checks import assert_one_sentence, tree_snapshot
from Datasets import convert_acdc
from Datasets.dataset_defaults import default_classes
from Datasets.dataset_names import dataset_name
from Datasets.layouts import find_cases
from Datasets.loading import load_cases

FRAMES = {"patient001": (1, 12), "patient002": (1, 9)}


@pytest.fixture
def release(tmp_path):
    return write_release(tmp_path / "database", FRAMES)


def test_pairs_keep_the_real_spacing_and_group_by_patient(release, tmp_path, capsys):
    out = tmp_path / "acdc"
    assert convert_acdc.main(["--source", str(release), "--out", str(out)]) == 0
    assert [path.name for path in sorted(out.glob("*_image.nii.gz"))] == [
        "patient001_frame01_image.nii.gz", "patient001_frame12_image.nii.gz",
        "patient002_frame01_image.nii.gz", "patient002_frame09_image.nii.gz"]
    files = find_cases(out)
    assert [(file.case_id, file.patient_id) for file in files] == [
        ("patient001_frame01", "patient001"), ("patient001_frame12", "patient001"),
        ("patient002_frame01", "patient002"), ("patient002_frame09", "patient002")]
    cases = load_cases(files, 4)
    original, geometry = read_image(release / "training" / "patient001" / "patient001_frame12.nii.gz")
    np.testing.assert_array_equal(cases[1].image, original)
    np.testing.assert_allclose(cases[1].spacing, SPACING_XYZ[::-1])
    _, label_geometry = read_image(out / "patient001_frame12_label.nii.gz")
    assert label_geometry.matches(geometry) and cases[1].label.dtype == np.uint8 and cases[1].label.max() == 3
    assert dataset_name(out, files) == "acdc" and default_classes(4, "acdc")[0][1] == "right ventricle"
    assert "wrote 4 volumes of 2 patients" in capsys.readouterr().out


def _missing_label(release):
    (release / "training" / "patient002" / "patient002_frame09_gt.nii.gz").unlink()


def _no_es_line(release):
    (release / "training" / "patient001" / "Info.cfg").write_text("ED: 1\nGroup: NOR\n")


def _label_on_another_grid(release):
    write_volume(release / "training" / "patient002" / "patient002_frame01_gt.nii.gz", np.zeros((4, 20, 17)), np.uint8)


def _label_out_of_range(release):
    write_volume(release / "training" / "patient002" / "patient002_frame09_gt.nii.gz", np.full((4, 20, 18), 7),
                 np.uint8)


@pytest.mark.parametrize("damage,pattern", [
    (_missing_label, "patient002: patient002_frame09_gt.nii.gz is missing"),
    (_no_es_line, "patient001: Info.cfg has no 'ES: <frame number>' line"),
    (_label_on_another_grid, "patient002_frame01: the image .* are not 3D volumes on the same grid"),
    (_label_out_of_range, "patient002_frame09: the _gt label holds values other than 0–3"),
], ids=["missing _gt file", "no ES in Info.cfg", "label on another grid", "labels outside 0-3"])
def test_bad_input_is_one_sentence_and_writes_nothing(release, tmp_path, damage, pattern):
    damage(release)
    out = tmp_path / "acdc"
    out.mkdir()
    (out / "kept.txt").write_text("earlier content")
    before = tree_snapshot(out)
    with pytest.raises(SystemExit) as caught:
        convert_acdc.main(["--source", str(release), "--out", str(out)])
    assert_one_sentence(str(caught.value.code), "^error: ", pattern)
    assert tree_snapshot(out) == before


def test_source_without_patients_says_what_to_pass(tmp_path):
    with pytest.raises(SystemExit) as caught:
        convert_acdc.main(["--source", str(tmp_path), "--out", str(tmp_path / "out")])
    assert_one_sentence(str(caught.value.code), "^error: No patientNNN/Info.cfg below", "--source")
