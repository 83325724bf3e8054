"""The choice of ED and ES in a cine (CalibSegLib.cardiac.phases and measure_cine) on synthetic cines."""

from __future__ import annotations

import numpy as np
import pytest

from CalibSegLib.cardiac.function import measure_cine
from CalibSegLib.cardiac.phases import choose_phases, phase_order
from CalibSegLib.io import ImageGeometry
from cardiac_standins import LabelPredictor

GRID = ImageGeometry(spacing=(10.0, 1.5, 1.5))


def _beating(phases: int = 20, systole: int = 7) -> list[float]:
    """An LV volume curve: 150 mL at phase 0, down to 60 mL at ``systole``, back up."""
    times = np.arange(phases)
    curve = 105.0 + 45.0 * np.cos(np.pi * np.minimum(times, 2 * systole - times).clip(0) / systole)
    curve[times >= 2 * systole] = 150.0 - 0.5 * (times[times >= 2 * systole] - 2 * systole)
    return curve.tolist()


def test_ed_is_the_largest_lv_and_es_the_smallest():
    volumes = _beating()
    choice = choose_phases(volumes)
    assert (choice.ed, choice.es) == (int(np.argmax(volumes)), 7) == (0, 7)
    assert "largest LV blood pool" in choice.rule


def test_trigger_times_order_the_phases_and_break_ties():
    volumes = [100.0, 150.0, 60.0, 150.0, 60.0]
    assert (choose_phases(volumes).ed, choose_phases(volumes).es) == (1, 2)  # ties: first in the order given
    times = [400.0, 300.0, 200.0, 100.0, 0.0]  # the series stored backwards in time
    assert phase_order(5, times) == [4, 3, 2, 1, 0]
    choice = choose_phases(volumes, times)
    assert (choice.ed, choice.es) == (3, 4)  # the earlier in time of each tie
    assert "by trigger time" in choice.rule


@pytest.mark.parametrize("volumes, times, message", [
    ([100.0], None, "at least two phases"),
    ([100.0, 60.0], [0.0], "2 phases but 1 trigger times"),
])
def test_what_cannot_be_chosen_is_one_sentence(volumes, times, message):
    with pytest.raises(ValueError, match=message):
        choose_phases(volumes, times)


def test_measure_cine_segments_every_phase_and_reports_each_volume():
    """A synthetic cine of label maps whose LV (class 3) shrinks and grows: ED and ES are the phases drawn with the
    most and the fewest LV voxels, and every phase's LV and RV volume is the count times the voxel volume."""
    lv_voxels = [300, 240, 120, 80, 150, 290]
    phases = []
    for count in lv_voxels:
        labels = np.zeros((2, 20, 20), np.uint8)
        labels.reshape(-1)[:count] = 3
        labels.reshape(-1)[-50:] = 1  # an RV of 50 voxels
        labels[1, 10, :5] = 2
        phases.append((labels, GRID))
    predictor = LabelPredictor()
    result = measure_cine(predictor, phases, trigger_times_ms=[40.0 * index for index in range(6)])
    assert predictor.calls == 6
    assert result.phases == {"ed": 0, "es": 3}
    voxel = 10.0 * 1.5 * 1.5 / 1000.0
    assert [row["lv_ml"] for row in result.phase_volumes] == pytest.approx([count * voxel for count in lv_voxels])
    assert [row["rv_ml"] for row in result.phase_volumes] == pytest.approx([50 * voxel] * 6)
    assert result.values["lv_ef_percent"] == pytest.approx(100.0 * (300 - 80) / 300)
    payload = result.to_json()
    assert payload["phases"] == {"ed": 0, "es": 3}
    assert [row["trigger_time_ms"] for row in payload["phase_volumes"]] == [0.0, 40.0, 80.0, 120.0, 160.0, 200.0]
