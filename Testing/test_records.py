"""Records name files relative to the repository: the committed ones (docs/records, the shipped models' metrics)
hold no absolute path of the machine that made them, and the writers name every file through
:func:`CalibSegLib.io.recorded_path`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from CalibSegLib.io import recorded_path
from Evaluation.summary import EvaluationSummary
from Training.records import RunSummary
from benchmarks.record import make_record

ROOT = Path(__file__).resolve().parents[1]
COMMITTED_RECORDS = (ROOT / "docs" / "records", ROOT / "CalibSegLib" / "pretrained")
RECORD_SUFFIXES = {".json", ".jsonl", ".csv", ".log", ".txt"}  # README.md there says how they are made
# A POSIX path of two or more parts starting at a word boundary ("/work/main/runs", not "40 / 46" or "mm/s"),
# or a Windows one with its drive ("C:\runs", "D:/runs").
ABSOLUTE_PATH = re.compile(r"(?:(?<![\w./~-])/[\w.-]+(?:/[\w.-]+)+)|(?:\b[A-Za-z]:[\\/]+\w)")


def absolute_paths(text: str) -> list[str]:
    """The absolute file paths written in ``text``."""
    return ABSOLUTE_PATH.findall(text)


def _committed_record_files() -> list[Path]:
    return sorted(path for folder in COMMITTED_RECORDS for path in folder.rglob("*")
                  if path.is_file() and path.suffix in RECORD_SUFFIXES)


def test_committed_records_hold_no_absolute_path():
    files = _committed_record_files()
    assert len(files) > 50  # the cross-validation folds' records are among them
    found = {str(path.relative_to(ROOT)): paths for path in files if (paths := absolute_paths(path.read_text()))}
    assert found == {}


@pytest.mark.parametrize("text, expected", [
    ('"bundle": "/work/main/runs/cv/nacl/fold_2/model.calibseg"', ["/work/main/runs/cv/nacl/fold_2/model.calibseg"]),
    ('File "/home/user/benchmarks/x.py", line 3', ["/home/user/benchmarks/x.py"]),
    ("--data C:\\data\\acdc", ["C:\\d"]),
    ('"bundle": "runs/cv/nacl/fold_2/model.calibseg"', []),
    ("40 / 46 (87 %), 10 mm/s, ../runs/folds/a, 1/2, docs/records/x.json, 12:30", []),
])
def test_the_check_finds_absolute_paths_and_passes_relative_ones(text, expected):
    assert absolute_paths(text) == expected


def test_recorded_path_is_relative_to_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert recorded_path(tmp_path / "runs" / "cv" / "model.calibseg") == "runs/cv/model.calibseg"
    assert recorded_path("runs/./cv/../cv") == "runs/cv"
    assert recorded_path("acdc_ce_dice") == "acdc_ce_dice"  # a shipped model's name stays a name
    outside = recorded_path(tmp_path.parent / "elsewhere" / "model.calibseg")
    assert outside == "../elsewhere/model.calibseg"
    assert recorded_path("") == ""


def test_the_writers_name_files_relative_to_the_repository(tmp_path, monkeypatch):
    """run.json, summary.json and benchmark records given absolute paths write them relative to the current
    folder (tmp_path here, the repository root for the documented commands)."""
    monkeypatch.chdir(tmp_path)
    bundle = tmp_path / "runs" / "ce_dice" / "model.calibseg"
    run = RunSummary(method="ce_dice", config={}, bundle=str(bundle), best_epoch=1, best_validation_dice=0.5,
                     epochs=1, steps=2, training_wall_s=1.0, finish_wall_s=1.0, choices={}, loss_state={},
                     environment={})
    assert run.to_json()["bundle"] == "runs/ce_dice/model.calibseg"
    summary = EvaluationSummary(cases=[], variants={}, bundle=str(bundle)).to_json()
    assert summary["bundle"] == "runs/ce_dice/model.calibseg"
    record = make_record("inference", {}, ["--bundle", str(bundle), "--steps", "10", "--record", str(tmp_path / "r")])
    assert record["command"] == "-m benchmarks.inference --bundle runs/ce_dice/model.calibseg --steps 10"
    assert not absolute_paths(json.dumps([run.to_json(), summary, record]))
