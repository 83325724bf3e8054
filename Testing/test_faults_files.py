"""Fault catalogue, files a user writes or assembles by hand: split files of the wrong shape, a release
copy missing a patient's ``Info.cfg``, a bundle naming one class twice and validation references
that lack a structure. Each is one sentence, before any expensive work, and changes nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from CalibSegLib.bundle import BundleError, load_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.io import ImageGeometry, write_image
from CalibSegLib.quality import QualityModelError, fit_quality_model
from acdc_release import write_release
from tiny_bundles import make_test_bundle
from fault_checks import assert_one_sentence, rewrite_bundle, tree_snapshot
from Datasets import convert_acdc
from Datasets.errors import DataError
from Datasets.splits import load_split
from Evaluation import evaluate
from Training import fit_quality, train

# split file content → the sentence it must get
BAD_SPLITS = {
    "an array": ('["patient001", "patient002"]', r"holds an array, not an object \{\"train\""),
    "null": ("null", "holds null, not an object"),
    "a string": ('"train"', "holds a string, not an object"),
    "a number": ("3", "holds a number, not an object"),
    "true": ("true", "holds true or false, not an object"),
    "numbers as ids": ('{"train": [1, 2], "val": [3], "test": []}',
                       r"something other than patient ids .* in train, val"),
    "null as an id": ('{"train": ["patient001"], "val": [null], "test": []}', "other than patient ids .* in val;"),
    "a side as an object": ('{"train": {"patient001": 1}, "val": [], "test": []}', "lacks the list.s. train"),
}


def _split_file(folder: Path, text: str) -> Path:
    path = folder / "split.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", list(BAD_SPLITS))
def test_split_file_of_the_wrong_shape_is_one_sentence(case, tmp_path):
    text, pattern = BAD_SPLITS[case]
    with pytest.raises(DataError) as caught:
        load_split(_split_file(tmp_path, text))
    assert_one_sentence(str(caught.value), "^Split file .*split.json ", pattern)


def test_train_with_a_split_file_that_is_an_array_leaves_no_run_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "Trainer", lambda *args, **kwargs: pytest.fail("a Trainer was built"))
    split = _split_file(tmp_path, BAD_SPLITS["an array"][0])
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        train.main(["--split", str(split), "--out", str(tmp_path / "run"), "--no-eval"])
    assert_one_sentence(str(caught.value.code), "^error: Split file", "holds an array")
    assert tree_snapshot(tmp_path) == before


def test_evaluate_with_a_null_split_file_is_one_sentence(tmp_path):
    bundle = make_test_bundle(tmp_path / "model.calibseg")
    split = _split_file(tmp_path, "null")
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        evaluate.main(["--bundle", str(bundle), "--split-file", str(split), "--data", str(tmp_path),
                       "--out", str(tmp_path / "evaluation")])
    assert_one_sentence(str(caught.value.code), "^error: Split file", "holds null")
    assert tree_snapshot(tmp_path) == before


def test_converter_refuses_a_patient_folder_without_info_cfg(tmp_path):
    release = write_release(tmp_path / "database", {"patient001": (1, 12), "patient002": (1, 9)})
    (release / "training" / "patient002" / "Info.cfg").unlink()
    out = tmp_path / "acdc"
    with pytest.raises(SystemExit) as caught:
        convert_acdc.main(["--source", str(release), "--out", str(out)])
    assert_one_sentence(str(caught.value.code), "^error: patient002: Info.cfg is missing", "restore it or remove")
    assert not out.exists()


@pytest.mark.parametrize("names,repeated", [
    (["background", "ventricle", "ventricle", "myocardium"], "'ventricle'"),
    (["background", "right ventricle", "right_ventricle", "myocardium"], "'right ventricle', 'right_ventricle'"),
], ids=["same name", "same metric key"])
def test_a_class_named_twice_is_refused_on_save_and_load(names, repeated, tmp_path):
    good = make_test_bundle(tmp_path / "good.calibseg")
    with pytest.raises(BundleError) as saving:
        make_test_bundle(tmp_path / "twice.calibseg", class_names=names)
    assert not (tmp_path / "twice.calibseg").exists()
    edited = rewrite_bundle(good, tmp_path / "edited.calibseg", lambda metadata: metadata.update(class_names=names))
    with pytest.raises(BundleError) as loading:
        load_bundle(edited)
    for caught in (saving, loading):
        assert_one_sentence(str(caught.value), f"class_names {repeated} name one class twice")


class _Case:
    """A validation case: ``image``, ``label`` and ``spacing`` as :func:`fit_quality_model` reads them."""

    def __init__(self, patient: str, label: np.ndarray) -> None:
        self.patient_id, self.label, self.spacing = patient, label, (5.0, 1.5, 1.5)
        self.image = np.random.default_rng(len(patient)).normal(100, 20, label.shape).astype(np.float32)


def _labels(classes: tuple[int, ...]) -> np.ndarray:
    label = np.zeros((3, 32, 32), np.uint8)
    for index, value in enumerate(classes):
        label[:, 4 + 8 * index : 10 + 8 * index, 8:20] = value
    return label


@pytest.mark.parametrize("classes,pattern", [
    ((), "Only 0 of 4 validation references contain 'class 1'"),
    ((1, 2), "Only 0 of 4 validation references contain 'class 3'"),
], ids=["all background", "one structure never present"])
def test_quality_fit_refuses_references_without_a_structure_before_predicting(classes, pattern, tmp_path,
                                                                               monkeypatch):
    predictor = Predictor(make_test_bundle(tmp_path / "model.calibseg"), device="cpu")
    monkeypatch.setattr(Predictor, "predict", lambda *args, **kwargs: pytest.fail("a case was predicted"))
    cases = [_Case(f"p{index}", _labels(classes)) for index in range(4)]
    with pytest.raises(QualityModelError) as caught:
        fit_quality_model(predictor, cases)
    assert_one_sentence(str(caught.value), pattern, "check the validation labels")


def test_fit_quality_command_on_all_background_validation_labels_keeps_the_bundle(tmp_path):
    data = tmp_path / "data"
    grid = ImageGeometry(spacing=(5.0, 1.5, 1.5))
    for case in ("p1", "p2", "p3", "p4"):
        write_image(data / f"{case}_image.nii.gz", _Case(case, _labels(())).image, grid)
        write_image(data / f"{case}_label.nii.gz", _labels(()), grid)
    bundle = make_test_bundle(tmp_path / "model.calibseg",
                              data={"dataset": "data", "train": [], "val": ["p1", "p2", "p3", "p4"], "test": []})
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        fit_quality.main(["--bundle", str(bundle), "--data", str(data), "--device", "cpu"])
    assert_one_sentence(str(caught.value.code), "^error: Only 0 of 4 validation references contain 'class 1'")
    assert tree_snapshot(tmp_path) == before
