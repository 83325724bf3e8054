"""The GPU step's CPU half: the batch and learning-rate rule, the GPU schedule (its crops budget, resume),
the CUDA-graph path's fallback where it cannot capture, the optimiser per device, ``--gpu`` refused without
CUDA, and the compact ACDC cache's exact round trip."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from Datasets.build_cache import write_cache
from Datasets.cache import CACHE_MARKER, decode_volume, encode_volume
from Datasets.dataset_names import dataset_name
from Datasets.errors import DataError
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Testing.test_training import tiny_trainer
from Training import train as train_cli
from Training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from Training.command_line import parser
from Training.config import train_config
from Training.fingerprint import Fingerprint
from Training.plan import Plan
from Training.schedules import (GPU_CROPS, REFERENCE_BATCH, REFERENCE_LR, SCHEDULES, chosen_schedule,
                                device_batch_size, scaled_lr, warmup_steps)
from Training.step_mode import StepChoice, build_optimizer, choose_step


def _plan(patch: tuple[int, ...]) -> Plan:
    spacing = (1.5,) * len(patch)
    return Plan("test", Fingerprint((), (), (), ()), len(patch), spacing, patch, None, None, ("background", "a"),
                ((0.0, 0.0, 0.0), (1.0, 0.0, 0.0)))


# ----------------------------------------------------------------- the batch and learning-rate rule
@pytest.mark.parametrize("patch,batch", [((128, 128), 256), ((224, 224), 64), ((160, 160), 128),
                                         ((16, 128, 128), 16), ((96, 96, 96), 4), ((512, 512, 512), 2)])
def test_the_device_batch_fills_the_same_voxels_with_a_power_of_two(patch, batch):
    assert device_batch_size(patch) == batch
    assert batch & (batch - 1) == 0  # a power of two


def test_the_learning_rate_grows_with_the_square_root_of_the_batch_after_a_warm_up():
    assert scaled_lr(REFERENCE_BATCH) == REFERENCE_LR
    assert scaled_lr(256) == pytest.approx(4 * REFERENCE_LR) and scaled_lr(64) == pytest.approx(2 * REFERENCE_LR)
    # the warm-up covers the same crops whatever the batch, and the reference batch has none
    assert warmup_steps(REFERENCE_BATCH) == 0
    assert warmup_steps(256) == 63 and warmup_steps(64) == 250


def test_the_trainer_warms_the_learning_rate_up_linearly(sample_cases, tmp_path):
    trainer = tiny_trainer(tmp_path, sample_cases, method="ce_dice", lr_schedule="poly", warmup_steps=4, epochs=3)
    factors = [trainer._lr_factor(step) for step in range(6)]
    poly = [max(1 - step / (3 * trainer.steps_per_epoch), 0) ** 0.9 for step in range(6)]
    assert factors[:4] == pytest.approx([(step + 1) / 4 * poly[step] for step in range(4)])
    assert factors[4:] == pytest.approx(poly[4:])


# ----------------------------------------------------------------- the GPU schedule
def test_the_gpu_schedule_trains_nnunets_crops_at_the_batch_that_fills_the_device():
    arguments = parser().parse_args(["--gpu"])
    config = train_config(_plan((128, 128)), chosen_schedule(arguments), arguments)
    assert (config.batch_size, config.lr, config.warmup_steps) == (256, scaled_lr(256), warmup_steps(256))
    assert GPU_CROPS == 100 * SCHEDULES["cpu"].epochs * SCHEDULES["cpu"].iterations_per_epoch * REFERENCE_BATCH
    crops = config.epochs * config.iterations_per_epoch * config.batch_size
    assert GPU_CROPS <= crops < GPU_CROPS + config.iterations_per_epoch * config.batch_size
    # a batch given on the command line keeps the crops and gets its own learning rate
    arguments = parser().parse_args(["--gpu", "--batch-size", "64"])
    config = train_config(_plan((128, 128)), chosen_schedule(arguments), arguments)
    assert (config.batch_size, config.epochs, config.lr) == (64, 4 * SCHEDULES["gpu"].epochs, scaled_lr(64))
    # a 3D patch gets its own batch
    config = train_config(_plan((16, 128, 128)), chosen_schedule(arguments := parser().parse_args(["--gpu"])),
                          arguments)
    assert config.batch_size == 16 and config.warmup_steps == 0


@pytest.mark.parametrize("flags", [[], ["--cpu"], ["--paper"], ["--cpu", "--batch-size", "64"]])
def test_the_cpu_schedules_keep_their_batch_learning_rate_and_epochs(flags):
    arguments = parser().parse_args(flags)
    schedule = chosen_schedule(arguments)
    config = train_config(_plan((128, 128)), schedule, arguments)
    assert config.lr == REFERENCE_LR and config.warmup_steps == 0 and config.epochs == schedule.epochs
    assert config.batch_size == (64 if "--batch-size" in flags else REFERENCE_BATCH)


def test_a_warm_up_run_resumes_and_refuses_another_warm_up(sample_cases, tmp_path):
    trainer = tiny_trainer(tmp_path, sample_cases, method="ce_dice", warmup_steps=5, epochs=2)
    trainer.train_epoch()
    trainer.epoch = 1
    save_checkpoint(tmp_path / "checkpoint.pt", trainer.state())
    resumed = tiny_trainer(tmp_path, sample_cases, method="ce_dice", warmup_steps=5, epochs=2)
    resumed.resume(tmp_path / "checkpoint.pt")
    assert resumed.optimizer.param_groups[0]["lr"] == trainer.optimizer.param_groups[0]["lr"] < 1e-3
    with pytest.raises(CheckpointError, match="warmup_steps=5"):
        tiny_trainer(tmp_path, sample_cases, method="ce_dice", warmup_steps=0, epochs=2).resume(
            tmp_path / "checkpoint.pt")


def test_a_checkpoint_from_before_the_warm_up_resumes_as_without_one(sample_cases, tmp_path):
    trainer = tiny_trainer(tmp_path, sample_cases, method="ce_dice", epochs=1)
    state = trainer.state()
    state["config"] = state["config"].replace(', "warmup_steps": 0', "")
    save_checkpoint(tmp_path / "checkpoint.pt", state)
    assert "warmup_steps" not in load_checkpoint(tmp_path / "checkpoint.pt")["config"]
    tiny_trainer(tmp_path, sample_cases, method="ce_dice", epochs=1).resume(tmp_path / "checkpoint.pt")


@pytest.mark.parametrize("flags,sentence", [
    (["--gpu"], "--gpu needs a CUDA GPU and PyTorch sees none on this machine"),
    (["--gpu", "--device", "cpu"], "--gpu trains on a CUDA device; drop --device cpu"),
])
def test_gpu_is_refused_in_one_sentence_where_it_cannot_run(flags, sentence, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        train_cli.main([*flags, "--out", str(tmp_path / "run")])
    assert str(stop.value).startswith(f"error: {sentence}") and str(stop.value).count("\n") == 0
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------- CUDA graphs and their fallback
def test_cuda_graphs_are_chosen_only_where_they_can_replay():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert choose_step(cuda, True, None, True, False, False) == StepChoice("cuda_graphs")
    assert choose_step(cpu, True, None, True, False, False) == StepChoice("compiled")  # silent on a CPU
    assert choose_step(cuda, False, False, True, False, False) == StepChoice("eager")
    for arguments, reason in [((cpu, False, True, True, False, False), "the device is not CUDA"),
                              ((cuda, True, None, False, False, False), "the batches change shape"),
                              ((cuda, True, None, True, True, False), "the loss runs the network twice"),
                              ((cuda, True, True, True, False, True), "several processes")]:
        choice = choose_step(*arguments)
        assert choice.mode == ("compiled" if arguments[1] else "eager") and reason in choice.note


def test_cuda_graphs_asked_for_on_a_cpu_train_without_them_and_say_so_once(sample_cases, tmp_path, capsys):
    trainer = tiny_trainer(tmp_path, sample_cases, method="ce_dice", cuda_graphs=True, epochs=1)
    trainer.train_epoch()
    out = capsys.readouterr().out
    assert out.count("CUDA graphs off: the device is not CUDA; the step runs eager.") == 1
    assert trainer.step_choice.mode == "eager"


def test_a_failed_capture_falls_back_once_and_the_step_still_trains(sample_cases, tmp_path, capsys):
    trainer = tiny_trainer(tmp_path, sample_cases, method="ce_dice", epochs=1)

    def capture_fails(images):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    trainer.step_choice, trainer.training_model = StepChoice("cuda_graphs"), capture_fails
    images, target = next(iter(trainer.epoch_batches()))
    before = [parameter.detach().clone() for parameter in trainer.model.parameters()]
    value = trainer.train_step(images, target)
    trainer.train_step(images, target)
    assert torch.isfinite(value) and trainer.step_choice.mode == "eager"
    assert any(not torch.equal(old, new) for old, new in zip(before, trainer.model.parameters()))
    assert capsys.readouterr().out.count("CUDA graphs off: their capture failed (RuntimeError") == 1


def test_a_step_error_after_the_capture_steps_is_not_hidden(sample_cases, tmp_path):
    trainer = tiny_trainer(tmp_path, sample_cases, method="ce_dice", epochs=1)
    trainer.step_choice, trainer.graph_steps = StepChoice("cuda_graphs"), 3

    def fails(images):
        raise RuntimeError("out of memory")

    trainer.training_model = fails
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.train_step(*next(iter(trainer.epoch_batches())))


def test_adam_is_multi_tensor_on_a_cpu():
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(3))], 1e-3, torch.device("cpu"))
    assert optimizer.defaults["foreach"] is True and not optimizer.defaults["fused"]


# ----------------------------------------------------------------- the ACDC cache
def test_encoding_a_volume_gives_back_every_bit():
    generator = np.random.default_rng(0)
    levels = np.sort(generator.random(700, dtype=np.float32))
    image = levels[generator.integers(0, 700, (3, 20, 17))]
    label = generator.integers(0, 4, (3, 20, 17), dtype=np.uint8)
    decoded_image, decoded_label = decode_volume(encode_volume(image, label))
    assert decoded_image.dtype == np.float32 and np.array_equal(decoded_image.view(np.uint32), image.view(np.uint32))
    assert np.array_equal(decoded_label, label)


def test_the_cache_of_acdc_files_reads_back_the_same_arrays(sample_acdc_dir, tmp_path):
    source = tmp_path / "acdc"
    source.mkdir()
    for path in sorted(sample_acdc_dir.glob("*.h5"))[:2]:
        shutil.copy(path, source)
    assert write_cache(source, tmp_path / "cache")[0] == 2
    original, cached = load_cases(find_cases(source), 4), load_cases(find_cases(tmp_path / "cache"), 4)
    assert [case.case_id for case in cached] == [case.case_id for case in original]
    for left, right in zip(original, cached):
        assert np.array_equal(left.image.view(np.uint32), right.image.view(np.uint32))
        assert np.array_equal(left.label, right.label) and left.spacing == right.spacing
        assert left.patient_id == right.patient_id
    assert dataset_name(tmp_path / "cache", find_cases(tmp_path / "cache")) == "acdc"
    # smaller than the HDF5 files it came from
    assert sum(path.stat().st_size for path in (tmp_path / "cache").glob("*.npz")) < \
        sum(path.stat().st_size for path in source.glob("*.h5"))


def test_a_damaged_cache_file_is_one_sentence(sample_acdc_dir, tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / CACHE_MARKER).write_text("{}")
    (tmp_path / "cache" / "patient001_frame01.npz").write_bytes(b"not an archive")
    with pytest.raises(DataError, match=r"^Cannot read patient001_frame01.npz as a cached volume .*rebuild"):
        load_cases(find_cases(tmp_path / "cache"), 4)

