"""Which phases of a cine are end-diastole and end-systole.

The rule (the one ACDC's and most cardiac tools' automatic choice uses): ED is the phase with the largest LV blood
pool, ES the one with the smallest, each measured on the segmentation (the volumes given). Ties go to the earliest
phase in time: by the DICOM trigger times when the series has them (phases are ordered by them first), else by
their order in the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["PhaseChoice", "choose_phases", "phase_order"]


@dataclass(frozen=True)
class PhaseChoice:
    """The chosen phases (indices into the cine's phases as given) and the rule's words for the printout."""

    ed: int
    es: int
    rule: str


def phase_order(phase_count: int, trigger_times_ms: Sequence[float] | None = None) -> list[int]:
    """The phases' indices in time order: by ``trigger_times_ms`` (one per phase, ms after the R wave) when given,
    else as given.

    Raises:
        ValueError: not one trigger time per phase.
    """
    if trigger_times_ms is None:
        return list(range(phase_count))
    if len(trigger_times_ms) != phase_count:
        raise ValueError(f"The cine has {phase_count} phases but {len(trigger_times_ms)} trigger times; "
                         "give one per phase.")
    return [int(index) for index in np.argsort(np.asarray(trigger_times_ms, dtype=np.float64), kind="stable")]


def choose_phases(lv_volumes_ml: Sequence[float], trigger_times_ms: Sequence[float] | None = None) -> PhaseChoice:
    """ED = the phase of the largest LV volume, ES = that of the smallest (module docstring).

    Args:
        lv_volumes_ml: the LV blood pool's volume of every phase, in mL, in the cine's order (at least two).
        trigger_times_ms: each phase's trigger time in ms, or None.

    Raises:
        ValueError: fewer than two phases, or a trigger time missing.
    """
    if len(lv_volumes_ml) < 2:
        raise ValueError(f"A cine needs at least two phases to choose ED and ES from, got {len(lv_volumes_ml)}.")
    order = phase_order(len(lv_volumes_ml), trigger_times_ms)
    volumes = np.asarray(lv_volumes_ml, dtype=np.float64)[order]
    ed, es = order[int(np.argmax(volumes))], order[int(np.argmin(volumes))]
    timing = "by trigger time" if trigger_times_ms is not None else "in the order given"
    rule = (f"ED = phase {ed}, the largest LV blood pool ({lv_volumes_ml[ed]:.1f} mL); ES = phase {es}, the "
            f"smallest ({lv_volumes_ml[es]:.1f} mL); ties go to the earlier phase {timing}")
    return PhaseChoice(ed, es, rule)
