"""Fault catalogue, training: ``Training/train.py`` refuses bad flags with one sentence before any
run folder exists, and everything training writes (checkpoints, history, bundles) is atomic and
gets the umask's usual mode."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from CalibSegLib.bundle import BundleError, save_bundle
from CalibSegLib.io import atomic_output, write_json_atomic
from CalibSegLib.networks import build_network
from tiny_bundles import TINY_UNET, make_test_bundle, make_test_metadata
from fault_checks import assert_one_sentence, normal_file_mode, tree_snapshot
from Training import train
from Training.checkpoint import load_checkpoint, save_checkpoint


def _file(tmp_path: Path) -> list[str]:
    (tmp_path / "taken").write_text("a file")
    return ["--out", str(tmp_path / "taken")]


def _below_file(tmp_path: Path) -> list[str]:
    (tmp_path / "taken").write_text("a file")
    return ["--out", str(tmp_path / "taken" / "run")]


def _flags(*flags: str):
    return lambda tmp_path: [*flags, "--out", str(tmp_path / "run")]


# case → (flags(tmp_path), regexes of the sentence); none of them may create tmp_path / "run".
BAD_RUNS = {
    "--network-arg bogus=1": (_flags("--network-arg", "bogus=1"), ("unexpected keyword argument 'bogus'",)),
    "--network-arg channels=[-4,8]": (_flags("--network-arg", "channels=[-4,8]"), ("negative dimension",)),
    "--network-arg channels=[4,8e9]": (_flags("--network-arg", "channels=[4,8e9]"), ("cannot be built",)),
    "unetpp with deep supervision": (
        _flags("--network", "unetpp", "--network-arg", "deep_supervision=true"),
        ("without deep supervision",)),
    "--loss-arg bogus=1": (_flags("--loss-arg", "bogus=1"), ("has no hyper-parameter bogus",)),
    "--epochs 0": (_flags("--epochs", "0"), ("--epochs must be positive",)),
    "--data missing": (_flags("--data", "/nonexistent/calibseg-data"), ("calibseg-data",)),
    "--split missing": (_flags("--split", "/nonexistent/split.json"), ("split.json",)),
    "--resume without a run": (_flags("--resume"), ("does not exist",)),
    "--out is a file": (_file, ("is a file, not a folder",)),
    "--out below a file": (_below_file, ("is a file, not a folder",)),
}
if not torch.cuda.is_available():
    BAD_RUNS["--device cuda without CUDA"] = (_flags("--device", "cuda"), ("no CUDA device",))


@pytest.mark.filterwarnings("ignore::UserWarning:monai.networks.nets.unet")  # strides vs bad channels
@pytest.mark.parametrize("case", list(BAD_RUNS))
def test_bad_flags_are_one_sentence_and_leave_no_run_folder(case, tmp_path, monkeypatch):
    flags, patterns = BAD_RUNS[case]
    argv = [*flags(tmp_path), "--no-eval"]

    def no_training(*args, **kwargs):
        raise AssertionError("a Trainer was built for a run that should have been refused")

    monkeypatch.setattr(train, "Trainer", no_training)
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        train.main(argv)
    assert_one_sentence(str(caught.value.code), "^error: ", *patterns)
    assert tree_snapshot(tmp_path) == before


@pytest.fixture()
def umask_027():
    old = os.umask(0o027)
    yield 0o640
    os.umask(old)


def test_checkpoint_bundle_history_and_json_get_the_umask_mode(umask_027, tmp_path):
    assert normal_file_mode() == umask_027
    written = [
        save_checkpoint(tmp_path / "checkpoint.pt", {"epoch": 1, "model": {}}),
        make_test_bundle(tmp_path / "model.calibseg"),
        write_json_atomic(tmp_path / "summary.json", {"a": 1}),
    ]
    with atomic_output(tmp_path / "history.jsonl") as temporary:  # how the trainer writes its history
        temporary.write_text('{"epoch": 1}\n')
    written.append(tmp_path / "history.jsonl")
    modes = {path.name: path.stat().st_mode & 0o777 for path in written}
    assert modes == {path.name: 0o640 for path in written}


@pytest.mark.parametrize("interruption", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk full", "Ctrl-C"])
def test_failed_checkpoint_keeps_the_previous_one(interruption, tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "checkpoint.pt", {"epoch": 3, "model": {"w": torch.ones(2)}})
    before = tree_snapshot(tmp_path)

    def broken_save(state, handle):
        handle.write(b"half a checkpoint")
        raise interruption

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(type(interruption)):
        save_checkpoint(path, {"epoch": 4, "model": {}})
    assert tree_snapshot(tmp_path) == before
    assert load_checkpoint(path)["epoch"] == 3


@pytest.mark.parametrize("value,half,pattern", [
    (float("nan"), False, "holds NaN or infinite values, so the model cannot be saved"),
    (float("inf"), False, "holds NaN or infinite values"),
    (1e6, True, "holds NaN or infinite values in float16"),  # finite in float32, inf in float16
], ids=["NaN", "inf", "float16 overflow"])
def test_save_bundle_refuses_non_finite_weights_before_writing(value, half, pattern, tmp_path):
    model = build_network("unet", 1, 4, **TINY_UNET)
    with torch.no_grad():
        next(iter(model.parameters())).view(-1)[0] = value
    with pytest.raises(BundleError) as caught:
        save_bundle(tmp_path / "model.calibseg", model, make_test_metadata(), half=half)
    assert_one_sentence(str(caught.value), "weight model.0.conv.weight", pattern)
    assert list(tmp_path.iterdir()) == []
