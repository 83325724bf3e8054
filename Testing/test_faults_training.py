"""Fault catalogue, training: ``Training/train.py`` refuses bad flags with one sentence before any
run folder exists, and everything training writes (checkpoints, history, bundles) is atomic and
gets the umask's usual mode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from CalibSegLib.bundle import BundleError, save_bundle
from CalibSegLib.io import atomic_output, write_json_atomic
from CalibSegLib.networks import build_network
from tiny_bundles import TINY_UNET, make_test_bundle, make_test_metadata
from fault_checks import assert_one_sentence, normal_file_mode, tree_snapshot
from Datasets.dataset_json import read_dataset_description
from Training import train
from Training.checkpoint import load_checkpoint, save_checkpoint
from Training.command_line import parser
from Training.run_lock import LOCK_NAME, RunFolderBusy, run_folder_lock
from Training.split_choice import load_split_cases


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
    "--patch-size 33": (_flags("--patch-size", "33"), ("cannot segment 33×33-voxel windows", "32 and 48")),
    "--patch-size 40 --no-compile": (_flags("--patch-size", "40", "--no-compile"), ("cannot segment 40×40",)),
    "--patch-size 8": (_flags("--patch-size", "8"), ("cannot segment 8×8",)),
    "--patch-size 64 33": (_flags("--patch-size", "64", "33"), ("cannot segment 64×33",)),
    "--lr nan": (_flags("--lr", "nan"), ("--lr must be positive and finite, got nan",)),
    "--lr inf": (_flags("--lr", "inf"), ("--lr must be positive and finite",)),
    "--lr-step-to nan": (_flags("--lr-step-to", "nan"), ("--lr-step-to must be",)),
    "--target-spacing inf": (_flags("--target-spacing", "inf"), ("--target-spacing must be positive and finite",)),
    "--patch-size 1024": (_flags("--patch-size", "1024"), (
        "--patch-size 1024 1024 is larger than every training slice",
        "\\(largest 256×256 voxels at 1.5 mm\\)")),
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


@pytest.fixture(scope="module")
def sample_split(sample_acdc_dir):
    """What ``load_split_cases`` gives for the shipped sample, loaded once for the tests below."""
    return load_split_cases(parser().parse_args(["--data", str(sample_acdc_dir)]), 4,
                            sample_acdc_dir / "no-run", read_dataset_description(sample_acdc_dir))


def _cached_data(monkeypatch, loaded) -> None:
    monkeypatch.setattr(train, "load_split_cases",
                        lambda arguments, num_classes, run_dir, description: loaded)


def test_a_second_run_on_a_locked_run_folder_is_refused_and_changes_nothing(sample_split, tmp_path, monkeypatch):
    _cached_data(monkeypatch, sample_split)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with run_folder_lock(run_dir):  # the first run, still before its first checkpoint
        before = tree_snapshot(tmp_path)
        monkeypatch.setattr(train, "Trainer", lambda *args, **kwargs: pytest.fail("the second run trained"))
        with pytest.raises(SystemExit) as caught:
            train.main(["--out", str(run_dir), "--no-eval"])
        assert tree_snapshot(tmp_path) == before
    assert_one_sentence(str(caught.value.code), "^error: ", "in use by another calibseg-train", "choose another --out")
    assert not (run_dir / LOCK_NAME).exists()  # released with the first run


def test_the_run_folder_lock_is_exclusive_and_released(tmp_path):
    with run_folder_lock(tmp_path) as lock:
        assert lock.read_text() == str(os.getpid())
        with pytest.raises(RunFolderBusy) as caught:
            with run_folder_lock(tmp_path):
                pass
        assert_one_sentence(str(caught.value), f"process {os.getpid()}")
    with run_folder_lock(tmp_path):  # free again once the holder is done
        pass
    assert list(tmp_path.iterdir()) == []


def _plan_of_other_flags(run_dir: Path) -> None:
    train.main(["--out", str(run_dir), "--plan-only", "--patch-size", "64"])


def _no_plan(run_dir: Path) -> None:
    run_dir.mkdir()
    (run_dir / "plan.json").write_text('{"patch_size": [64, 64]')


# case → (make the run folder's plan.json, regexes of the sentence)
BAD_STORED_PLANS = {
    "plan.json of other flags": (_plan_of_other_flags, (
        "plan.json plans patch size 64×64 but these flags and data plan 128×128", "remove it to plan again")),
    "plan.json that is no plan": (_no_plan, (
        "plan.json is not a plan calibseg-train wrote", "JSONDecodeError", "remove it to plan again")),
}


@pytest.mark.parametrize("case", list(BAD_STORED_PLANS))
def test_a_stored_plan_the_run_would_not_make_is_one_sentence_and_kept(case, sample_split, tmp_path,
                                                                       monkeypatch):
    _cached_data(monkeypatch, sample_split)
    make, patterns = BAD_STORED_PLANS[case]
    run_dir = tmp_path / "run"
    make(run_dir)
    monkeypatch.setattr(train, "Trainer", lambda *args, **kwargs: pytest.fail("another plan trained"))
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as caught:
        train.main(["--out", str(run_dir), "--no-eval"])
    assert_one_sentence(str(caught.value.code), "^error: ", *patterns)
    assert tree_snapshot(tmp_path) == before


class _InterruptedTrainer:
    """A Trainer that the user interrupts (Ctrl-C) while it sets up, before any epoch."""

    def __init__(self, *args, **kwargs):
        raise KeyboardInterrupt


@pytest.mark.parametrize("resume", [False, True], ids=["fresh run", "--resume"])
def test_ctrl_c_says_whether_a_checkpoint_exists(resume, sample_split, tmp_path, monkeypatch):
    _cached_data(monkeypatch, sample_split)
    monkeypatch.setattr(train, "Trainer", _InterruptedTrainer)
    run_dir = tmp_path / "run"
    if resume:
        save_checkpoint(run_dir / "checkpoint.pt", {"epoch": 2, "model": {}})
    with pytest.raises(SystemExit) as caught:
        train.main(["--out", str(run_dir), "--no-eval", *(["--resume"] if resume else [])])
    message = str(caught.value.code)
    if resume:
        assert_one_sentence(message, "^interrupted: ", "checkpoint.pt is kept", "--resume")
    else:  # the folder the run made is gone with its split.json: nothing is left to resume or to clean up
        assert_one_sentence(message, "^interrupted before the first epoch ended", "no checkpoint was written",
                            "run folder .*run is removed")
        assert not run_dir.exists()


def test_a_run_killed_with_sigkill_leaves_its_folder_free_to_resume(tmp_path):
    """The kernel drops a flock with its process: no stale lock stops ``--resume`` after ``kill -9``."""
    script = ("import sys, time\nfrom Training.run_lock import run_folder_lock\n"
              "with run_folder_lock(sys.argv[1]):\n    print('locked', flush=True)\n    time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderBusy, match=f"process {holder.pid}"):
            with run_folder_lock(tmp_path):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert (tmp_path / LOCK_NAME).exists()  # left behind by the killed run, but no longer held
    with run_folder_lock(tmp_path) as lock:
        assert lock.read_text() == str(os.getpid())
