"""Where data and outputs are: bundles record datasets by name (no path of the training machine),
readers find the data again, shipped model names work in every CLI that takes a bundle, outputs
about a shipped model stay out of the package, and evaluating on seen patients is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import CalibSegLib.pretrained as pretrained
from CalibSegLib.bundle import load_bundle
from CalibSegLib.quality import QualityModel, StructureQuality
from acdc_release import write_release
from tiny_bundles import make_test_bundle
from fault_checks import assert_one_sentence, tree_snapshot
from Evaluation import evaluate as evaluate_cli
from Training import fit_quality as fit_quality_cli
from Training import train as train_cli
from Training.command_line import parser
from Training.run_folder import run_folder
from Datasets import convert_acdc
from Datasets.dataset_names import ACDC_ENVIRONMENT, SAMPLE_DATA, data_folder, dataset_name, recorded_dataset
from Datasets.errors import DataError
from Datasets.layouts import find_cases
from Datasets.splits import SPLITS_DIR, default_split_for, load_split, recorded_split, split_reference
from Datasets.splits.make_splits import RELEASE_PATIENTS, split_unseen

SAMPLE_SPLIT = load_split(SPLITS_DIR / "acdc_sample.json")
# A model trained on the full split: the sample's "test" patients 016 and 054 are among its training patients.
FULL = load_split(SPLITS_DIR / "acdc.json")


class Stop(Exception):
    """Raised by a stand-in trainer: the test has what it needs before any training."""


def test_train_records_the_dataset_by_name_and_prints_where_everything_goes(tmp_path, monkeypatch, capsys):
    seen = {}

    def trainer(config, train, val, run_dir, data_description, processes):
        seen["data"] = data_description
        raise Stop

    monkeypatch.setattr(train_cli, "Trainer", trainer)
    with pytest.raises(Stop):
        train_cli.main(["--out", str(tmp_path / "run"), "--device", "cpu", "--no-compile"])
    assert seen["data"] == {"dataset": "acdc-sample", "split_file": "acdc_sample.json", **SAMPLE_SPLIT}
    assert str(tmp_path.parent) not in str(seen["data"]) and "/" not in str(seen["data"])
    printed = capsys.readouterr().out
    assert "6 training, 2 validation, 2 test patients = 12, 4, 4 volumes (ACDC has an end-diastole" in printed
    for name in ("checkpoint.pt", "history.jsonl", str(tmp_path / "run" / "tensorboard"), "run.json", "evaluation/"):
        assert name in printed


def test_default_run_folder_is_under_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arguments = parser().parse_args([])
    assert run_folder(arguments) == Path("runs") / "ce_dice"


def test_dataset_names_and_where_readers_find_them(tmp_path, monkeypatch):
    assert dataset_name(SAMPLE_DATA, find_cases(SAMPLE_DATA)) == "acdc-sample"
    copy = tmp_path / "acdc"
    copy.mkdir()
    for path in sorted(SAMPLE_DATA.glob("patient01*.h5")):
        shutil.copy(path, copy)
    assert dataset_name(copy, find_cases(copy)) == "acdc"
    assert data_folder({"dataset": "acdc-sample"}) == SAMPLE_DATA
    assert data_folder({"dataset": "acdc"}, given=tmp_path) == tmp_path
    monkeypatch.setenv(ACDC_ENVIRONMENT, str(copy))
    assert data_folder({"dataset": "acdc"}) == copy
    monkeypatch.delenv(ACDC_ENVIRONMENT)
    with pytest.raises(DataError) as caught:
        data_folder({"dataset": "acdc"})
    assert_one_sentence(str(caught.value), "pass --data", ACDC_ENVIRONMENT)
    with pytest.raises(DataError, match="dataset 'mine'.*pass --data"):
        data_folder({"dataset": "mine"})


def test_bundles_that_recorded_an_absolute_folder_still_work(tmp_path):
    legacy = {"dataset": "acdc", "folder": str(tmp_path), "split_file": "/elsewhere/Training/splits/acdc.json"}
    assert data_folder(legacy) == tmp_path and recorded_dataset(legacy) == "acdc"
    assert recorded_split(legacy) == FULL  # the shipped split of that name, the machine's path being gone
    sample = {"dataset": "acdc", "folder": "/other/machine/SampleData/ACDC"}
    assert data_folder(sample) == SAMPLE_DATA and recorded_dataset(sample) == "acdc-sample"
    with pytest.raises(DataError, match="not known here"):
        data_folder({"dataset": "folder", "folder": "/gone/mydata"})


def test_split_references_and_the_superset_rule(tmp_path):
    assert split_reference(SPLITS_DIR / "acdc.json") == "acdc.json"
    mine = tmp_path / "acdc.json"
    mine.write_text((SPLITS_DIR / "acdc.json").read_text())
    assert split_reference(mine) == str(mine)  # same name, not the shipped file: its path as given
    recorded = {"train": ["a"], "val": ["b"], "test": ["c"]}
    assert recorded_split(recorded) == recorded and recorded_split(recorded, SPLITS_DIR / "acdc.json") == FULL
    sample = find_cases(SAMPLE_DATA)
    assert default_split_for(sample) == SPLITS_DIR / "acdc_sample.json"
    assert default_split_for(sample[:-2]) is None  # a patient of the sample split missing: no shipped split


def _bundle(path: Path, quality_model: dict | None = None, **data) -> Path:
    return make_test_bundle(path, quality_model=quality_model,
                            data={"dataset": "acdc-sample", "split_file": "acdc.json", **FULL, **data})


def _captured_evaluation(monkeypatch) -> dict:
    seen: dict = {}

    def evaluate(bundle, cases, out, device="auto", batch_size=16, **kwargs):
        seen.update(cases=[case.case_id for case in cases], out=Path(out), degradations=kwargs.get("degradations"))
        raise Stop

    monkeypatch.setattr(evaluate_cli, "evaluate_bundle", evaluate)
    return seen


def test_degraded_copies_are_evaluated_only_with_degraded(tmp_path, monkeypatch, capsys):
    from Evaluation.quality_report import DEGRADATIONS

    bundle = _bundle(tmp_path / "model.calibseg", train=["patient013"], val=["patient022"], test=["patient016"])
    arguments = ["--bundle", str(bundle), "--data", str(SAMPLE_DATA), "--device", "cpu"]
    seen = _captured_evaluation(monkeypatch)
    with pytest.raises(Stop):
        evaluate_cli.main(arguments)
    assert seen["degradations"] == ()
    with pytest.raises(Stop):
        evaluate_cli.main([*arguments, "--degraded"])
    assert seen["degradations"] == tuple(DEGRADATIONS) and len(DEGRADATIONS) == 3
    with pytest.raises(SystemExit):
        evaluate_cli.main(["--help"])
    assert "--degraded" in capsys.readouterr().out


def test_evaluating_seen_patients_is_refused_unless_forced(tmp_path, monkeypatch):
    bundle = _bundle(tmp_path / "model.calibseg")
    before = tree_snapshot(tmp_path)
    arguments = ["--bundle", str(bundle), "--split-file", str(SPLITS_DIR / "acdc_sample.json"), "--device", "cpu"]
    with pytest.raises(SystemExit) as caught:
        evaluate_cli.main(arguments)
    assert_one_sentence(str(caught.value.code), "^error: ", "trained or validated on patient016, patient054",
                        "--force")
    assert tree_snapshot(tmp_path) == before
    seen = _captured_evaluation(monkeypatch)
    with pytest.raises(Stop):
        evaluate_cli.main(arguments + ["--force"])
    assert seen["cases"] == ["patient016_frame01", "patient016_frame12", "patient054_frame01", "patient054_frame12"]


def test_the_unseen_split_evaluates_every_shipped_model_on_the_release_patients_our_copy_lacks(tmp_path, monkeypatch):
    unseen = load_split(SPLITS_DIR / "acdc_unseen.json")
    copy = {patient for side in FULL.values() for patient in side}
    assert unseen == split_unseen(sorted(copy))  # the committed file is what make_splits.py writes
    assert not copy & set(unseen["test"]) and len(copy | set(unseen["test"])) == RELEASE_PATIENTS
    release = write_release(tmp_path / "database", {patient: (1, 12) for patient in unseen["test"]})
    converted = tmp_path / "acdc"
    assert convert_acdc.main(["--source", str(release), "--out", str(converted)]) == 0
    monkeypatch.chdir(tmp_path)
    seen = _captured_evaluation(monkeypatch)
    for name in pretrained.pretrained_models():
        seen.clear()
        with pytest.raises(Stop):  # not refused: no shipped model was trained or validated on any of them
            evaluate_cli.main(["--bundle", name, "--data", str(converted), "--split-file",
                               str(SPLITS_DIR / "acdc_unseen.json"), "--device", "cpu"])
        assert seen["cases"] == [f"{patient}_frame{frame}" for patient in unseen["test"] for frame in ("01", "12")]


def _shipped(tmp_path, monkeypatch, **data) -> Path:
    """A tiny bundle shipped as ``tiny_model`` in a temporary package folder."""
    folder = tmp_path / "pretrained"
    folder.mkdir()
    model = QualityModel({name: StructureQuality("mean_entropy", "linear", {"intercept": 0.9, "slope": 0.0},
                                                 (-0.1, 0.05), 0.05, 0.1, 4)
                          for name in ("class 1", "class 2", "class 3")},
                         validation={"cases": 4, "patients": 2, "scheme": "leave-one-patient-out"})
    _bundle(folder / "tiny_model.calibseg", quality_model=model.to_dict(), **data)
    monkeypatch.setattr(pretrained, "PRETRAINED_DIR", folder)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return folder


def test_evaluate_takes_a_shipped_name_and_writes_under_runs(tmp_path, monkeypatch):
    _shipped(tmp_path, monkeypatch, test=SAMPLE_SPLIT["test"], train=[], val=[])
    seen = _captured_evaluation(monkeypatch)
    with pytest.raises(Stop):
        evaluate_cli.main(["--bundle", "tiny_model", "--device", "cpu"])  # data: the sample, found by name
    assert seen["out"] == Path("runs") / "tiny_model" / "evaluation" and len(seen["cases"]) == 4


def test_fit_quality_takes_a_shipped_name_and_leaves_the_package_alone(tmp_path, monkeypatch, capsys):
    folder = _shipped(tmp_path, monkeypatch, val=SAMPLE_SPLIT["val"])
    package = tree_snapshot(folder)
    fitted = QualityModel.from_dict(load_bundle(folder / "tiny_model.calibseg").metadata.quality_model)
    seen = {}

    def fit(observations, class_names, review_below=None, validation=None):
        seen["patients"] = [item.patient for item in observations]
        return fitted

    monkeypatch.setattr(fit_quality_cli, "fit_from_observations", fit)
    assert fit_quality_cli.main(["--bundle", "tiny_model", "--device", "cpu"]) == 0
    written = Path("runs") / "tiny_model" / "tiny_model.calibseg"
    assert load_bundle(written).metadata
    assert seen["patients"] == ["patient036", "patient036", "patient069", "patient069"]  # both frames each
    assert tree_snapshot(folder) == package
    assert f"bundle: {written}" in capsys.readouterr().out
