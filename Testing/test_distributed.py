"""Data-parallel training: two gloo processes train as one process on the same global batches, and hold the
same CRaC multipliers; a checkpoint is only resumed by as many processes as wrote it."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as multiprocessing

from Datasets.errors import DataError
from Training.checkpoint import CheckpointError, save_checkpoint
from Training.distributed import Processes, start_processes, stop_processes
from test_training import tiny_trainer

EPOCHS = 2
WORLD_SIZE = 2


def _train(trainer) -> dict:
    """Steps' losses, then each epoch's validation, as the fit loop does (without its files)."""
    step, losses = trainer.train_step, []

    def recording_step(images, target):
        value = step(images, target)
        losses.append(float(value))
        return value

    trainer.train_step = recording_step
    for _ in range(EPOCHS):
        trainer.train_epoch()
        trainer.validate()
    return {"losses": losses, "multipliers": trainer.loss.multipliers.clone()}


def _rank(rank: int, port: int, cases, folder) -> None:
    """One of torchrun's processes: its environment, the process group, training; the results in a file."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    processes = Processes.from_environment()
    start_processes(processes, torch.device("cpu"))
    try:
        trainer = tiny_trainer(folder / f"rank{rank}", cases, processes=processes)
        torch.save(_train(trainer), folder / f"rank{rank}.pt")
    finally:
        stop_processes(processes)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_processes_train_as_one_with_the_same_global_batch(sample_cases, tmp_path):
    multiprocessing.spawn(_rank, args=(_free_port(), sample_cases, tmp_path), nprocs=WORLD_SIZE)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(WORLD_SIZE)]
    alone = _train(tiny_trainer(tmp_path / "alone", sample_cases))
    # Every process updates CRaC from the same statistics: identical multipliers, moved from their start.
    assert torch.equal(ranks[0]["multipliers"], ranks[1]["multipliers"])
    assert not torch.equal(ranks[0]["multipliers"], tiny_trainer(tmp_path / "new", sample_cases).loss.multipliers)
    # Each process's loss is its half's mean: their mean is the whole batch's, step by step.
    together = torch.tensor([ranks[0]["losses"], ranks[1]["losses"]]).mean(dim=0)
    assert len(together) == EPOCHS * 3
    torch.testing.assert_close(together, torch.tensor(alone["losses"]), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ranks[0]["multipliers"], alone["multipliers"], rtol=1e-3, atol=1e-4)


def test_a_checkpoint_is_resumed_only_by_as_many_processes_as_wrote_it(sample_cases, tmp_path):
    trainer = tiny_trainer(tmp_path, sample_cases)
    state = trainer.state()
    state["world_size"] = 2
    save_checkpoint(tmp_path / "checkpoint.pt", state)
    with pytest.raises(CheckpointError, match="trained by 2 process\\(es\\) but this run has 1; resume it with "
                                              "torchrun --nproc_per_node 2"):
        tiny_trainer(tmp_path, sample_cases).resume(tmp_path / "checkpoint.pt")


def test_a_batch_that_does_not_split_over_the_processes_is_refused(sample_cases, tmp_path):
    with pytest.raises(DataError, match="--batch-size 4 does not split evenly over 3 processes"):
        tiny_trainer(tmp_path, sample_cases, processes=Processes(0, 3, 0))
