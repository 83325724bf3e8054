"""Data-parallel training over several processes with ``torch.distributed``, as ``torchrun`` starts them.

    torchrun --standalone --nproc_per_node 2 -m Training.train --device cpu ...     # 2 gloo processes
    torchrun --standalone --nproc_per_node 4 -m Training.train ...                  # 4 GPUs, NCCL
    torchrun --nnodes 2 --node_rank R --rdzv_endpoint HOST:PORT --nproc_per_node 8 -m Training.train ...

torchrun sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` in each process's environment
(:meth:`Processes.from_environment`); without them the run is one process, as without torchrun.
Every process plans the same batches from the same data-order generator and trains on its share
of each (``Training.batches.BatchPlan.share``), DDP averages the gradients (NCCL on GPUs, gloo
on CPUs), and the first process alone validates, writes the checkpoint, history, TensorBoard
log and bundle; the loss's epoch statistics reach every process, so all hold the same multipliers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Processes", "SINGLE_PROCESS", "start_processes", "stop_processes"]

# Non-main processes wait in a collective while the main one validates (once per epoch): on the full
# cardiac dataset on a CPU that takes minutes, beyond NCCL's 10-minute default.
_COLLECTIVE_TIMEOUT = timedelta(minutes=60)


@dataclass(frozen=True)
class Processes:
    """This process's place among the training processes: ``rank`` in ``[0, world_size)``, and its
    ``local_rank`` on its machine (which GPU it drives)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_environment(cls) -> "Processes":
        """The place torchrun gave this process (one process when it was not started by torchrun)."""
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                   int(os.environ.get("LOCAL_RANK", 0)))

    @property
    def is_main(self) -> bool:
        """The process that validates and writes every file of the run."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def device(self, device: torch.device) -> torch.device:
        """The device this process trains on: its own GPU (``cuda:local_rank``) when ``device`` is CUDA."""
        if device.type == "cuda" and self.is_distributed:
            return torch.device("cuda", self.local_rank)
        return device

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the processes (itself with one process)."""
        if self.is_distributed:
            tensor = tensor.clone()
            dist.all_reduce(tensor)
        return tensor

    def from_main(self, values: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
        """The main process's ``values`` on every process, on ``device`` (the others pass anything)."""
        if not self.is_distributed:
            return values
        message: list[Any] = [{key: value.cpu() for key, value in values.items()} if self.is_main else None]
        dist.broadcast_object_list(message, src=0)
        return {key: value.to(device) for key, value in message[0].items()}


SINGLE_PROCESS = Processes()


def start_processes(processes: Processes, device: torch.device) -> None:
    """Join the process group torchrun set up (NCCL for CUDA, gloo for CPUs); nothing for one process."""
    if not processes.is_distributed:
        return
    device = processes.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=_COLLECTIVE_TIMEOUT,
                            rank=processes.rank, world_size=processes.world_size)


def stop_processes(processes: Processes) -> None:
    """Leave the process group (after the last collective of the run)."""
    if processes.is_distributed and dist.is_initialized():
        dist.destroy_process_group()
