"""Training: every method learns, CRaC's schedule survives resume, exact resume, bad data, checkpoints."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Callable

import h5py
import numpy as np
import pytest
import torch

from CalibSegLib.bundle import load_bundle
from CalibSegLib.io import recorded_path
from CalibSegLib.losses import LOSSES
from Reporting import benchmark as benchmark_cli
from Reporting import results as results_cli
from Reporting import ship as ship_cli
from Training import train as train_cli
from Training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from Datasets.acdc import ACDC_CLASS_COLORS, ACDC_CLASS_NAMES, ACDC_TERMINOLOGY
from Datasets.errors import DataError
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Datasets.splits import SPLITS_DIR, load_split, make_split
from Training.command_line import parser
from Training.config import TrainConfig, train_config
from Training.distributed import SINGLE_PROCESS
from Training.fingerprint import Fingerprint
from Training.plan import Plan, read_plan, spacing_text
from Training.records import RunSummary
from Training.schedules import chosen_schedule
from Training.trainer import Trainer

TINY = {"channels": [4, 8, 16], "strides": [2, 2], "num_res_units": 0}
# Every choice of a tiny 2D run on the sample's cases; each test replaces what it varies.
TINY_CONFIG = dict(method="crac", loss_args={}, network="unet", network_kwargs=TINY, epochs=2,
                   iterations_per_epoch=3, batch_size=4, lr=1e-3, lr_schedule="step", lr_step_to=1e-4,
                   lr_step_epoch=1, spatial_dims=2, target_spacing=(1.5, 1.5), patch_size=(64, 64),
                   foreground_share=1 / 3, foreground_sampling="class", augment=True, compile=False,
                   temperature_fit="auto", mirroring="auto", device="cpu", amp=None, seed=0, val_every=1,
                   deterministic=True,
                   num_classes=4, class_names=list(ACDC_CLASS_NAMES), class_colors=list(ACDC_CLASS_COLORS),
                   channel_names=None, channel_normalization=None, plan=None, workers=0, progress=False)


def tiny_trainer(tmp_path, cases, method="crac", processes=SINGLE_PROCESS, **overrides) -> Trainer:
    config = TrainConfig(**{**TINY_CONFIG, "method": method, **overrides})
    train_cases, val_cases = cases
    return Trainer(config, train_cases, val_cases, tmp_path, {"dataset": "test"}, processes)


@pytest.mark.parametrize("method", LOSSES)
def test_every_method_decreases_its_loss_on_a_fixed_batch(method, sample_cases, tmp_path):
    trainer = tiny_trainer(tmp_path, sample_cases, method, seed=1, batch_size=8)
    images, target = next(iter(trainer.epoch_batches()))
    trainer.model.train()
    values = []
    for _ in range(15):
        torch.manual_seed(0)  # the same BWCR view each step, so the loss sequence is comparable
        values.append(trainer.train_step(images, target))
    assert values[-1] < values[0]


def test_crac_multipliers_change_and_survive_resume(sample_cases, tmp_path):
    trainer = tiny_trainer(tmp_path / "a", sample_cases)
    initial = trainer.loss.multipliers.clone()
    trainer.fit()
    assert not torch.equal(trainer.loss.multipliers, initial)
    resumed = tiny_trainer(tmp_path / "b", sample_cases)
    resumed.resume(tmp_path / "a" / "checkpoint.pt")
    torch.testing.assert_close(resumed.loss.multipliers, trainer.loss.multipliers)
    torch.testing.assert_close(resumed.loss.penalty, trainer.loss.penalty)
    assert resumed.epoch == 2 and int(resumed.loss.updates) == 2


def killed_and_resumed(make_trainer: Callable[[], Trainer], kill_at_step: int) -> Trainer:
    """A run killed at step ``kill_at_step`` (in the middle of epoch 2), then resumed from its checkpoint to the end."""
    killed = make_trainer()
    step = killed.train_step

    def dying_step(images, target):  # as if the process were killed
        if killed.steps == kill_at_step:
            raise KeyboardInterrupt
        return step(images, target)

    killed.train_step = dying_step
    with pytest.raises(KeyboardInterrupt):
        killed.fit()
    assert load_checkpoint(killed.run_dir / "checkpoint.pt")["epoch"] == 1
    resumed = make_trainer()
    resumed.resume(resumed.run_dir / "checkpoint.pt")
    resumed.fit()
    return resumed


def test_interrupted_run_resumes_to_identical_weights(sample_cases, tmp_path):
    uninterrupted = tiny_trainer(tmp_path / "full", sample_cases, epochs=3)
    uninterrupted.fit()
    resumed = killed_and_resumed(lambda: tiny_trainer(tmp_path / "killed", sample_cases, epochs=3), kill_at_step=5)
    for name, tensor in uninterrupted.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], tensor, rtol=0, atol=0)
    torch.testing.assert_close(resumed.loss.multipliers, uninterrupted.loss.multipliers, rtol=0, atol=0)
    history = [json.loads(line)["epoch"] for line in (tmp_path / "killed" / "history.jsonl").read_text().splitlines()]
    assert history == [1, 2, 3]


def test_finished_run_records_its_validation_choices_in_run_json_and_bundle(sample_cases, tmp_path):
    trainer = tiny_trainer(tmp_path, sample_cases, method="ce_dice", epochs=1)
    result = trainer.fit()
    summary = RunSummary.read(tmp_path)
    assert summary.steps == 3 and summary.epochs == 1 and summary.training_wall_s > 0
    assert set(summary.choices) >= {"mirroring", "temperature", "postprocessing", "quality_model", "input_statistics"}
    metadata = load_bundle(result.bundle_path).metadata
    # The input check's statistics come from the training volumes; ACDC's classes carry their SNOMED CT codes.
    assert metadata.input_statistics["volumes"] == len(trainer.train_cases)
    # Two training volumes are too few for the network's features: the statistics keep their four families.
    assert metadata.input_statistics["features"] is None and summary.choices["input_statistics"] == (
        "from the 2 training volumes; no network features: the network's features need at least 3 training "
        "volumes and 1 validation volume, got 2 and 2")
    assert metadata.class_terminology == ACDC_TERMINOLOGY
    mirrored = summary.choices["mirroring"]["used"]
    assert metadata.sliding_window.mirror_axes == ((0, 1) if mirrored else ())
    assert list(metadata.postprocessing.largest_component) == summary.choices["postprocessing"]["largest_component"]
    temperature = summary.choices["temperature"]
    assert set(temperature["candidates"]) == {"none", "all", "foreground"}
    assert temperature["candidates"]["none"] == {"temperature": 1.0, "foreground_ece": temperature["foreground_ece_t1"]}
    chosen = temperature["candidates"][temperature["fitted_on"]]
    assert chosen["foreground_ece"] == min(candidate["foreground_ece"]
                                           for candidate in temperature["candidates"].values())
    assert metadata.temperature == pytest.approx(chosen["temperature"])


def test_mirroring_off_leaves_test_time_mirroring_untried(sample_cases, tmp_path, monkeypatch):
    from Training import choices

    monkeypatch.setattr(choices, "choose_mirroring", lambda *arguments: pytest.fail("mirroring was tried"))
    result = tiny_trainer(tmp_path, sample_cases, method="ce_dice", epochs=1, mirroring="off").fit()
    metadata = load_bundle(result.bundle_path).metadata
    assert metadata.sliding_window.mirror_axes == () and metadata.training["mirroring"] == "off"
    assert RunSummary.read(tmp_path).choices["mirroring"].startswith("off: not tried")


def test_a_failed_end_of_run_choice_falls_back_and_never_loses_the_run(sample_cases, tmp_path, monkeypatch, capsys):
    from CalibSegLib.quality import QualityModelError
    from Training import choices

    def no_fit(*arguments, **options):
        raise QualityModelError("Only 1 validation case(s) of 1 patient(s) predict 'myocardium'.")

    def broken(*arguments, **options):
        raise RuntimeError("connected components failed")

    monkeypatch.setattr(choices, "fit_quality_model", no_fit)
    monkeypatch.setattr(choices, "choose_largest_component", broken)
    result = tiny_trainer(tmp_path, sample_cases, method="ce_dice", epochs=1).fit()
    metadata = load_bundle(result.bundle_path).metadata  # written, and loads
    assert metadata.quality_model is None and metadata.postprocessing.largest_component == ()
    summary = RunSummary.read(tmp_path)
    assert summary.choices["quality_model"] == "none: Only 1 validation case(s) of 1 patient(s) predict 'myocardium'."
    assert summary.choices["postprocessing"] == "none: connected components failed"
    assert isinstance(summary.choices["temperature"], dict)  # the other choices were still made
    printed = capsys.readouterr().out
    assert "no quality model: Only 1 validation case(s)" in printed and "no postprocessing: connected" in printed


def test_resuming_a_finished_run_makes_its_end_of_run_choices_again(sample_cases, tmp_path):
    tiny_trainer(tmp_path, sample_cases, method="ce_dice", epochs=1).fit()
    first = load_bundle(tmp_path / "model.calibseg")
    (tmp_path / "model.calibseg").unlink()
    again = tiny_trainer(tmp_path, sample_cases, method="ce_dice", epochs=1)
    again.resume(tmp_path / "checkpoint.pt")
    again.fit()  # no epoch left: straight to the choices and the bundle
    remade = load_bundle(tmp_path / "model.calibseg")
    assert remade.metadata == first.metadata
    assert all(torch.equal(remade.state_dict[name], tensor) for name, tensor in first.state_dict.items())


@pytest.mark.parametrize("schedule,expected", [("poly", [1.0, (1 - 1 / 6) ** 0.9, (1 - 5 / 6) ** 0.9]),
                                               ("step", [1.0, 1.0, 0.1])])
def test_learning_rate_follows_its_schedule_step_by_step(sample_cases, tmp_path, schedule, expected):
    trainer = tiny_trainer(tmp_path, sample_cases, epochs=2, lr_schedule=schedule, lr_step_epoch=1)  # 3 steps/epoch
    factors = [trainer._lr_factor(step) for step in (0, 1, 5)]
    assert factors == pytest.approx(expected)


@pytest.mark.parametrize("flags,expected", [
    (["--method", "crac"], {"warmup_epochs": 3}),  # the quick schedule holds CRaC's multipliers for 300 steps
    (["--method", "crac", "--loss-arg", "warmup_epochs=0", "--loss-arg", "margin=1"],
     {"warmup_epochs": 0, "margin": 1}),
    (["--method", "crac", "--cpu"], {}),
    ([], {}),  # the default loss, CE+Dice, has no schedule arguments
])
def test_schedule_loss_arguments_yield_to_the_flags(flags, expected):
    plan = Plan("test", Fingerprint((), (), (), ()), 2, (1.5, 1.5), (64, 64), None, None, ("background", "a"),
                ((0.0, 0.0, 0.0), (1.0, 0.0, 0.0)))
    arguments = parser().parse_args(flags)
    assert train_config(plan, chosen_schedule(arguments), arguments).loss_args == expected


def test_corrupt_checkpoint_is_refused_and_kept(sample_cases, tmp_path):
    trainer = tiny_trainer(tmp_path, sample_cases, epochs=1)
    trainer.fit()
    checkpoint = tmp_path / "checkpoint.pt"
    truncated = checkpoint.read_bytes()[:1000]
    checkpoint.write_bytes(truncated)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        tiny_trainer(tmp_path, sample_cases).resume(checkpoint)
    assert checkpoint.read_bytes() == truncated


def test_cli_trains_writes_bundle_and_evaluates(sample_acdc_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli.main(["--method", "nacl", "--epochs", "1", "--iterations-per-epoch", "2", "--patch-size", "128",
                           "--batch-size", "4", "--network-arg", "channels=[4,8]", "--network-arg", "strides=[2]",
                           "--network-arg", "num_res_units=0", "--device", "cpu", "--no-compile",
                           "--out", str(out)]) == 0
    bundle_path = out / "model.calibseg"
    bundle = load_bundle(bundle_path)
    assert bundle.metadata.training["method"] == "nacl" and bundle.metadata.temperature > 0
    # two steps of training: whether or not a quality model could be fitted, the run is kept and says which
    quality = RunSummary.read(out).choices["quality_model"]
    assert (bundle.metadata.quality_model is None) == quality.startswith("none: ")
    assert (f"no quality model: {quality[len('none: '):]}" in capsys.readouterr().out) == quality.startswith("none: ")
    summary = json.loads((out / "evaluation" / "summary.json").read_text())
    assert len(summary["cases"]) == 4 and "pooled_calibration" in summary["scaled"]
    assert (out / "evaluation" / "reliability.png").stat().st_size > 1000
    assert (out / "evaluation" / "per_case.csv").read_text().count("\n") == 9
    # a second run into the same folder must not overwrite it
    with pytest.raises(SystemExit, match="already holds a run"):
        train_cli.main(["--out", str(out), "--epochs", "1"])
    # the papers' table from the finished run: its numbers are the run's own summary means
    assert benchmark_cli.main(["--collect", str(out), "--out", str(tmp_path / "benchmark")]) == 0
    table, table_csv = tmp_path / "benchmark" / "benchmark.md", tmp_path / "benchmark" / "benchmark.csv"
    dice_mean = summary["uncalibrated"]["per_metric"]["dice_mean"]["mean"]
    assert f"| nacl | {dice_mean:.3f} |" in table.read_text()
    assert table_csv.read_text().count("nacl") == 2  # one row per temperature variant
    with pytest.raises(SystemExit, match="error: "):
        benchmark_cli.main(["--collect", str(tmp_path / "no-run"), "--out", str(tmp_path / "benchmark")])
    # the results page: regenerated block with the run's own numbers, hand-written text kept
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text(f"# Results\n\nHand-written discussion.\n\n{results_cli.BEGIN_MARKER}\nstale\n"
                    f"{results_cli.END_MARKER}\n")
    assert results_cli.main(["--runs", str(out), "--out", str(page), "--ablations", str(out)]) == 0
    text = page.read_text()
    assert "Hand-written discussion." in text and "stale" not in text and text.count(results_cli.BEGIN_MARKER) == 1
    assert f"| nacl | {dice_mean:.3f} |" in text and "0.854" in text  # ours beside the paper's NACL DSC
    assert "num_res_units=0, iterations_per_epoch=2 |" in text  # the short-run table names what it changed
    assert (page.parent / "results" / "results.csv").read_text().count("nacl") == 2
    assert (page.parent / "results" / "reliability_uncalibrated.png").stat().st_size > 1000
    # shipping: a float16 bundle whose recorded metrics come from evaluating that file
    assert ship_cli.main(["--runs", str(out), "--prefix", "tiny", "--out", str(tmp_path / "models"),
                          "--data", str(sample_acdc_dir)]) == 0
    shipped, = (tmp_path / "models").glob("*.calibseg")
    assert shipped.name == "tiny_nacl.calibseg" and load_bundle(shipped).metadata.weights_dtype == "float16"
    recorded = json.loads((tmp_path / "models" / "tiny_nacl.metrics.json").read_text())
    assert recorded["cases"] == summary["cases"] and len(recorded["per_case"]["scaled"]) == 4
    assert recorded["summary"]["uncalibrated"]["dice_mean"] == pytest.approx(dice_mean, abs=0.02)
    assert not list((tmp_path / "models").glob(".*"))  # no staging left behind
    # re-recording a shipped model after a metadata change: the same weights measured again, the run kept
    assert ship_cli.main(["--rerecord", "tiny_nacl", "--out", str(tmp_path / "models"),
                          "--data", str(sample_acdc_dir)]) == 0
    again = json.loads((tmp_path / "models" / "tiny_nacl.metrics.json").read_text())
    assert again["per_case"] == recorded["per_case"]
    assert again["source_run"] == recorded["source_run"] == recorded_path(out)  # named relative to the repository
    with pytest.raises(SystemExit, match="holds other weights than the shipped tiny_nacl and is no sub-ensemble of "
                                         "it; ship a new run with --runs"):
        ship_cli.main(["--rerecord", "tiny_nacl", "--bundle", str(out / "model.calibseg"), "--out",
                       str(tmp_path / "models"), "--data", str(sample_acdc_dir)])


def write_h5(path, image, label):
    with h5py.File(path, "w") as handle:
        handle["image"] = image
        handle["label"] = label


@pytest.mark.parametrize("prepare,message", [
    (lambda d: d / "missing", "does not exist"),
    (lambda d: d, "No training volumes"),
    (lambda d: (d / "a_image.nii.gz").write_bytes(b"") and d or d, "No label file"),
    (lambda d: write_h5(d / "patient001_frame01.h5", np.random.rand(3, 20, 20), np.zeros((3, 20, 21), np.uint8)) or d,
     "same 3D shape"),
    (lambda d: write_h5(d / "patient001_frame01.h5", np.random.rand(3, 20, 20), np.full((3, 20, 20), 7, np.uint8)) or d,
     "labels range"),
])
def test_bad_data_stops_before_training_with_one_sentence(tmp_path, prepare, message):
    data = tmp_path / "data"
    data.mkdir()
    target = prepare(data)
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"train": ["patient001"], "val": ["patient001x"], "test": []}))
    with pytest.raises(SystemExit) as stopped:
        train_cli.main(["--data", str(target), "--split", str(split), "--out", str(tmp_path / "run")])
    error = str(stopped.value)
    assert error.startswith("error: ") and message in error and "\n" not in error
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_a_seeded_split_is_patient_level_repeatable_and_needs_three_patients():
    patients = [f"case{index:02d}" for index in range(20)]
    split = make_split(patients, seed=3)
    assert [len(split[side]) for side in ("train", "val", "test")] == [14, 2, 4]
    assert sorted(split["train"] + split["val"] + split["test"]) == patients
    assert make_split(list(reversed(patients)), seed=3) == split and make_split(patients, seed=4) != split
    assert [len(side) for side in make_split(["a", "b", "c"]).values()] == [1, 1, 1]
    with pytest.raises(DataError, match=r"^The data holds 2 patient\(s\); a split needs at least 3"):
        make_split(["a", "b", "b"])


def _write_cases(data, count=5, decathlon=False):
    """``count`` small two-class volumes as ``<case>_image/_label`` pairs, or imagesTr/labelsTr."""
    from CalibSegLib.io import ImageGeometry, write_image

    rng = np.random.default_rng(0)
    for folder in (["imagesTr", "labelsTr"] if decathlon else ["."]):
        (data / folder).mkdir(parents=True, exist_ok=True)
    for index in range(count):
        label = np.zeros((3, 40, 40), np.uint8)
        label[:, 8 + index:24, 10:26] = 1
        image = rng.normal(0, 0.1, label.shape).astype(np.float32) + label
        geometry = ImageGeometry((3.0, 1.5, 1.5))
        image_path, label_path = ((data / "imagesTr" / f"case{index}_0000.nii.gz",
                                   data / "labelsTr" / f"case{index}.nii.gz") if decathlon else
                                  (data / f"case{index}_image.nii.gz", data / f"case{index}_label.nii.gz"))
        write_image(image_path, image, geometry)
        write_image(label_path, label, geometry)


TINY_FLAGS = ["--epochs", "1", "--iterations-per-epoch", "1", "--patch-size", "32", "--batch-size", "2",
              "--network-arg", "channels=[4,8]", "--network-arg", "strides=[2]", "--network-arg", "num_res_units=0",
              "--device", "cpu", "--no-compile", "--no-eval"]


def test_training_without_a_split_makes_one_writes_it_and_resumes_with_it(tmp_path, capsys):
    data = tmp_path / "data"
    _write_cases(data)
    out = tmp_path / "run"
    flags = ["--data", str(data), "--num-classes", "2", *TINY_FLAGS, "--out", str(out)]
    assert train_cli.main(flags) == 0
    written = json.loads((out / "split.json").read_text())
    expected = make_split([f"case{index}" for index in range(5)], seed=0)
    assert {side: written[side] for side in ("train", "val", "test")} == expected
    assert load_split(out / "split.json") == expected  # a file --split takes as it is
    data_record = load_bundle(out / "model.calibseg").metadata.data
    assert {side: data_record[side] for side in ("train", "val", "test")} == expected
    assert data_record["split_file"] == str(out / "split.json")
    assert "a seeded patient-level split (70%/10%/20%) is written to" in capsys.readouterr().out
    (out / "split.json").write_text(json.dumps({**written, "description": "kept"}))
    assert train_cli.main([*flags, "--resume"]) == 0  # the run's own split, not a new one
    assert json.loads((out / "split.json").read_text())["description"] == "kept"
    assert "seeded patient-level split" not in capsys.readouterr().out


def test_a_run_writes_its_plan_and_a_config_built_from_it_reproduces_the_run(tmp_path):
    data = tmp_path / "data"
    _write_cases(data)
    out = tmp_path / "run"
    flags = ["--data", str(data), "--num-classes", "2", *TINY_FLAGS, "--out", str(out)]
    assert train_cli.main(flags) == 0
    arguments = parser().parse_args(flags)
    config = train_config(read_plan(out), chosen_schedule(arguments), arguments)
    recorded = json.loads(json.dumps(asdict(config), default=str))
    checkpointed = json.loads(load_checkpoint(out / "checkpoint.pt")["config"])
    assert recorded == RunSummary.read(out).config == checkpointed
    assert config.patch_size == (32, 32) and config.class_names == ["background", "class 1"]


def test_plan_only_writes_the_plan_alone_and_the_run_keeps_it(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    _write_cases(data)  # no shipped split covers it: a real run would write its own split.json
    out = tmp_path / "runs" / "own"
    flags = ["--data", str(data), "--num-classes", "2", *TINY_FLAGS, "--out", str(out)]
    monkeypatch.setattr(train_cli, "Trainer", lambda *arguments, **options: pytest.fail("it trained"))
    assert train_cli.main([*flags, "--plan-only"]) == 0
    assert [path.name for path in out.iterdir()] == ["plan.json"]
    assert "plan.json only (--plan-only)" in capsys.readouterr().out
    planned = (out / "plan.json").read_text()
    monkeypatch.undo()
    assert train_cli.main(flags) == 0
    assert (out / "plan.json").read_text() == planned and (out / "split.json").is_file()


def test_a_run_folder_from_before_plans_resumes_and_gains_its_plan(tmp_path):
    """A run folder written before plan.json existed (the checkpoint's config holds the old plan record, the
    folder no plan.json) resumes: the run plans again, as that run did, and writes its plan."""
    data = tmp_path / "data"
    _write_cases(data)
    out = tmp_path / "run"
    flags = ["--data", str(data), "--num-classes", "2", *TINY_FLAGS, "--out", str(out)]
    assert train_cli.main(flags) == 0
    planned = read_plan(out)
    (out / "plan.json").unlink()
    state = load_checkpoint(out / "checkpoint.pt")
    config = json.loads(state["config"])
    config["plan"] = {"target_spacing": [3.0, 1.5, 1.5], "median_shape": [4, 32, 32], "patch_2d": [32, 32],
                      "patch_3d": [16, 32, 32], "channels": config["plan"]["fingerprint"]["channels"]}
    save_checkpoint(out / "checkpoint.pt", {**state, "config": json.dumps(config)})
    assert train_cli.main([*flags, "--resume"]) == 0
    assert read_plan(out) == planned


@pytest.mark.parametrize("labels", [{"background": 0, "liver": 1}, {"0": "background", "1": "liver"}])
def test_class_names_and_their_number_come_from_dataset_json_in_either_form(tmp_path, labels):
    data = tmp_path / "data"
    _write_cases(data, decathlon=True)
    (data / "dataset.json").write_text(json.dumps({"name": "phantom", "labels": labels}))
    assert train_cli.main(["--data", str(data), *TINY_FLAGS, "--out", str(tmp_path / "run")]) == 0
    assert load_bundle(tmp_path / "run" / "model.calibseg").metadata.class_names == ["background", "liver"]
    with pytest.raises(SystemExit, match=r"^error: --num-classes 3 contradicts the data's dataset.json, which names 2 "
                                         r"classes \(background, liver\); leave --num-classes out\.$"):
        train_cli.main(["--data", str(data), "--num-classes", "3", *TINY_FLAGS, "--out", str(tmp_path / "other")])
    (data / "dataset.json").write_text(json.dumps({"labels": {"background": 0, "liver": 2}}))
    with pytest.raises(SystemExit, match=r"labels must give the ids 0 to 1 one name each"):
        train_cli.main(["--data", str(data), *TINY_FLAGS, "--out", str(tmp_path / "other")])
    (data / "dataset.json").write_text(json.dumps({"labels": {"background": 0}}))
    with pytest.raises(SystemExit, match=r"^error: The data's dataset.json \(one class\) leaves nothing to "
                                         r"segment; a run needs the background and one class more\.$"):
        train_cli.main(["--data", str(data), *TINY_FLAGS, "--out", str(tmp_path / "other")])
    assert not (tmp_path / "other").exists()


def test_splits_have_no_patient_on_two_sides():
    for name in ("acdc.json", "acdc_sample.json"):
        split = load_split(SPLITS_DIR / name)
        sides = [set(split[key]) for key in ("train", "val", "test")]
        assert not (sides[0] & sides[1] or sides[0] & sides[2] or sides[1] & sides[2])
    full = load_split(SPLITS_DIR / "acdc.json")
    assert (len(full["train"]), len(full["val"]), len(full["test"])) == (55, 10, 15)


def test_overlapping_split_file_is_refused(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"train": ["a", "b"], "val": ["b"], "test": []}))
    with pytest.raises(DataError, match="two sides"):
        load_split(path)


def test_nifti_pairs_and_decathlon_layouts(tmp_path):
    from CalibSegLib.io import ImageGeometry, write_image
    geometry = ImageGeometry((3.0, 1.0, 1.0), (0.0, 0.0, 0.0), (1, 0, 0, 0, 1, 0, 0, 0, 1))
    image, label = np.random.rand(3, 20, 20).astype(np.float32), np.random.randint(0, 3, (3, 20, 20)).astype(np.uint8)
    (tmp_path / "pairs").mkdir()
    write_image(tmp_path / "pairs" / "c1_image.nii.gz", image, geometry)
    write_image(tmp_path / "pairs" / "c1_label.nii.gz", label, geometry)
    for sub in ("imagesTr", "labelsTr"):
        (tmp_path / "msd" / sub).mkdir(parents=True)
    write_image(tmp_path / "msd" / "imagesTr" / "c2_0000.nii.gz", image, geometry)
    write_image(tmp_path / "msd" / "labelsTr" / "c2.nii.gz", label, geometry)
    for folder, case_id in (("pairs", "c1"), ("msd", "c2")):
        cases = load_cases(find_cases(tmp_path / folder), 3)
        assert cases[0].case_id == case_id and cases[0].spacing == (3.0, 1.0, 1.0)
        np.testing.assert_array_equal(cases[0].label, label)


def test_a_loss_that_becomes_nan_stops_the_epoch_before_its_checkpoint(sample_cases, tmp_path):
    trainer = tiny_trainer(tmp_path, sample_cases, epochs=1)
    trainer._loss_value = lambda logits, target, images: logits.mean() * float("nan")
    with pytest.raises(ValueError, match="training loss became NaN or infinite in epoch 1; the last checkpoint"):
        trainer.fit()
    assert not (tmp_path / "checkpoint.pt").exists()


VOLUMETRIC_FLAGS = ["--spatial-dims", "3", "--target-spacing", "8", "3.2", "3.2", "--patch-size", "8", "16", "16",
                    "--network-arg", "channels=[8,16]", "--network-arg", "strides=[2]", "--network-arg",
                    "num_res_units=0", "--method", "ce_dice", "--batch-size", "2", "--device", "cpu", "--no-compile"]


@pytest.fixture(scope="module")
def ct_phantom(tmp_path_factory):
    from Datasets.phantoms import write_phantom

    return write_phantom(tmp_path_factory.mktemp("phantom") / "ct", "ct", cases=5)


def test_a_3d_run_trains_validates_chooses_writes_a_3d_bundle_and_evaluates(ct_phantom, tmp_path, capsys):
    out = tmp_path / "run3d"
    assert train_cli.main(["--data", str(ct_phantom), *VOLUMETRIC_FLAGS, "--epochs", "2", "--iterations-per-epoch",
                           "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "3 training volumes, 1 validation volumes" in printed and "8×16×16 crops at 8×3.2×3.2 mm" in printed
    metadata = load_bundle(out / "model.calibseg").metadata
    assert metadata.spatial_dims == 3 and metadata.preprocessing.target_spacing == (8.0, 3.2, 3.2)
    assert metadata.sliding_window.patch_size == (8, 16, 16)
    assert metadata.class_names == ["background", "liver", "spleen", "kidney"]
    choices = RunSummary.read(out).choices
    for name in ("mirroring", "temperature", "postprocessing"):
        assert isinstance(choices[name], dict), (name, choices[name])  # made on the 3D validation pass, not failed
    assert choices["input_statistics"].startswith(
        "from the 3 training volumes; network features of the 3 training volumes, distance threshold ")
    assert metadata.input_statistics["features"]["validation_volumes"] == 1  # a 3D network's: one per volume
    if choices["mirroring"]["used"]:
        assert metadata.sliding_window.mirror_axes == (1, 2)  # in-plane, as the crops were mirrored and turned
    summary = json.loads((out / "evaluation" / "summary.json").read_text())
    assert len(summary["cases"]) == 1 and "pooled_calibration" in summary["scaled"]
    assert 0 <= summary["uncalibrated"]["per_metric"]["dice_mean"]["mean"] <= 1


def test_an_interrupted_3d_run_resumes_to_identical_weights(ct_phantom, tmp_path):
    files = find_cases(ct_phantom)
    cases = load_cases(files[:2], 4), load_cases(files[2:3], 4)
    volumetric = dict(method="ce_dice", spatial_dims=3, target_spacing=(8.0, 3.2, 3.2), patch_size=(8, 16, 16),
                      network_kwargs={"channels": [8, 16], "strides": [2], "num_res_units": 0}, epochs=2,
                      iterations_per_epoch=2, batch_size=2, temperature_fit="none")
    uninterrupted = tiny_trainer(tmp_path / "full", cases, **volumetric)
    uninterrupted.fit()
    resumed = killed_and_resumed(lambda: tiny_trainer(tmp_path / "killed", cases, **volumetric), kill_at_step=3)
    for name, tensor in uninterrupted.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], tensor, rtol=0, atol=0)


@pytest.mark.parametrize("flags,message", [
    (["--spatial-dims", "3", "--patch-size", "7"], r"^error: --patch-size 7 7 7 does not fit --network unet: "),
    (["--spatial-dims", "3", "--patch-size", "8", "16"], r"^error: --patch-size takes one value or 3 \(z y x\) "),
    (["--target-spacing", "4", "1", "1"],
     r"^error: --target-spacing takes one value or 2 \(y x\) with --spatial-dims 2"),
])
def test_3d_flags_that_do_not_fit_are_refused_in_one_sentence(ct_phantom, tmp_path, flags, message):
    with pytest.raises(SystemExit, match=message) as stopped:
        train_cli.main(["--data", str(ct_phantom), *flags, "--out", str(tmp_path / "run")])
    assert "\n" not in str(stopped.value) and not (tmp_path / "run").exists()


def test_the_start_line_shows_a_spacing_to_three_significant_digits():
    assert spacing_text((1.5, 1.5)) == "1.5"
    assert spacing_text((3.67805, 0.834099, 0.834099)) == "3.68×0.834×0.834"


def test_a_checkpoint_from_before_the_class_first_sampler_resumes_only_as_slice_first(sample_cases, tmp_path):
    """Runs checkpointed before ``foreground_sampling`` existed drew their crops slice first: they resume with
    ``--foreground-sampling slice`` and are refused, in one sentence naming the key, with today's default."""
    state = tiny_trainer(tmp_path, sample_cases, method="ce_dice", epochs=1).state()
    state["config"] = state["config"].replace(', "foreground_sampling": "class"', "")
    save_checkpoint(tmp_path / "checkpoint.pt", state)
    assert "foreground_sampling" not in load_checkpoint(tmp_path / "checkpoint.pt")["config"]
    tiny_trainer(tmp_path, sample_cases, method="ce_dice", epochs=1, foreground_sampling="slice").resume(
        tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="foreground_sampling='slice'"):
        tiny_trainer(tmp_path, sample_cases, method="ce_dice", epochs=1).resume(tmp_path / "checkpoint.pt")


def test_the_foreground_sampling_flag_reaches_the_run_and_its_bundle():
    arguments = parser().parse_args(["--foreground-sampling", "slice"])
    assert arguments.foreground_sampling == "slice"
    assert parser().parse_args([]).foreground_sampling == "class"
