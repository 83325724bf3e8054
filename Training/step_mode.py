"""How the training step runs on its device: eager, ``torch.compile``d, or replayed as CUDA graphs, and the
optimiser that suits the device.

On a GPU the UNet's step is launch-bound at small batches (issue 61: about 18 ms a step whatever the batch,
1,236 kernel launches, the GPU busy 11 % of the wall time at batch 16). CUDA graphs replay the compiled
forward and backward as one launch each (``torch.compile(mode="reduce-overhead")``); fused Adam updates every
parameter in a few kernels instead of several per parameter. Graphs need every step to have the same shapes
and the same code path, so they are used only where that holds; elsewhere the step runs compiled or eager,
and the reason is said once (:func:`choose_step`). A capture that fails at the first steps falls back the same
way (:class:`Training.trainer.Trainer` retries the step once without graphs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["StepChoice", "choose_step", "build_optimizer", "STEP_MODES"]

STEP_MODES: tuple[str, ...] = ("cuda_graphs", "compiled", "eager")


@dataclass(frozen=True)
class StepChoice:
    """How the step runs (``mode``, one of :data:`STEP_MODES`) and, when CUDA graphs were wanted but are not
    used, why (``note``: one sentence for the log, else None)."""

    mode: str
    note: str | None = None


def choose_step(device: torch.device, compile_requested: bool, graphs_requested: bool | None,
                static_shapes: bool, calls_model_twice: bool, distributed: bool) -> StepChoice:
    """The step's mode.

    Args:
        device: the training device.
        compile_requested: ``torch.compile`` the network (the schedule's or ``--compile``).
        graphs_requested: ``--cuda-graphs`` (True), ``--no-cuda-graphs`` (False) or left open (None: graphs on
            CUDA where they can run, silently not elsewhere).
        static_shapes: every batch has the same shape (a fixed number of batches per epoch, one process
            each with its whole share).
        calls_model_twice: the loss runs the network a second time in the step (two-view losses), which a
            replayed graph would overwrite.
        distributed: DDP, whose gradient hooks graphs do not capture here.
    """
    plain = "compiled" if compile_requested else "eager"
    if graphs_requested is False:
        return StepChoice(plain)
    reason = ("the device is not CUDA" if device.type != "cuda" else
              "the batches change shape (one pass per epoch ends with a smaller batch)" if not static_shapes else
              "the loss runs the network twice per step" if calls_model_twice else
              "several processes train data-parallel" if distributed else None)
    if reason is None:
        return StepChoice("cuda_graphs")
    # Left open, graphs are simply not for a CPU: no note in every CPU run's log.
    quiet = graphs_requested is None and device.type != "cuda"
    return StepChoice(plain, None if quiet else f"CUDA graphs off: {reason}; the step runs {plain}.")


def build_optimizer(parameters, lr: float, device: torch.device) -> torch.optim.Adam:
    """Adam for ``parameters`` on ``device``: fused (one kernel family for every parameter) on CUDA, the
    multi-tensor (``foreach``) implementation elsewhere."""
    if device.type == "cuda":
        return torch.optim.Adam(parameters, lr=lr, fused=True)
    return torch.optim.Adam(parameters, lr=lr, foreach=True)
