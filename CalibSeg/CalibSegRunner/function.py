"""Cardiac function on MRML nodes: an ED and an ES volume, or a cine, measured with a bundle, without Qt.

From Slicer's Python console (the module's ``CalibSegLogic.cardiacFunction`` and ``cardiacFunctionCine`` call
these)::

    from CalibSegRunner import FunctionRunner, cine_phases, ed_es_phases
    runner = FunctionRunner()
    outputs = runner.run(ed_es_phases(getNode("patient001_frame01"), getNode("patient001_frame12")), "acdc_ce_dice",
                         outputFolder="/tmp/patient001")
    outputs.function["lv_ef_percent"]  # {"value": ..., "interval": [low, high]}, at outputs.function["level"]
    cine = runner.run(cine_phases(getNode("cine")), "acdc_ce_dice")  # a Sequence or MultiVolume node
    cine.function["phases"]["ed"], cine.chart

The work is split as a segmentation run's (:mod:`CalibSegRunner.runner`): :meth:`FunctionRunner.request` reads and
checks the scene and the bundle's metadata (main thread; the phases by :mod:`CalibSegRunner.phases`, one sentence
for ED and ES on different grids, a cine of one phase or of phases on different grids, a bundle whose terminology
codes no heart), :meth:`FunctionRunner.compute` measures (arrays only: in the calling thread, or in a child process
as a :class:`FunctionJob`, :mod:`CalibSegLib.function_process`) and :meth:`FunctionRunner.publish` adds the nodes
and writes the files at once, removing them again if anything fails:

- a table *<name> cardiac function*: per index (LV EDV, ESV, SV, EF; RV EDV, ESV, EF; myocardial mass) its value,
  the ends of its interval at the measurement's level and its unit;
- for a cine, a table of every phase's LV and RV volume and a plot chart of them over the phases, with the ED and ES
  phases named in its title;
- with an output folder, ``function.json`` (what ``calibseg-function`` writes, the same function) and the report
  page ``report.html`` (:func:`CalibSegLib.report.write_function_report`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .job import ChildJob
from .nodes import NodeTransaction, add_table
from .phases import Phases

__all__ = ["FunctionRequest", "FunctionOutputs", "FunctionRunner", "FunctionJob", "function_columns",
           "phase_columns", "function_text"]

MODULE_LABEL = "the CalibSeg Slicer module"  # the report page's "made by"


@dataclass
class FunctionRequest:
    """What to measure: the phases read from the scene, the bundle (metadata checked), the device and where the
    files go (None: no files)."""

    phases: Phases
    bundle_path: Path
    device: str = "auto"
    output_folder: Path | None = None


@dataclass
class FunctionOutputs:
    """What a measurement added: its ``function.json`` dictionary, the nodes, and the files written (or None)."""

    function: dict
    table: object
    phase_table: object | None = None  # a cine's: every phase's LV and RV volume
    chart: object | None = None  # a cine's volume curve
    json_path: Path | None = None
    report_path: Path | None = None


def function_columns(function: dict) -> dict[str, list]:
    """Columns of the function table, one row per index of :data:`CalibSegLib.interval_rule.INDICES`: ``Index``
    (its :data:`~CalibSegLib.interval_rule.INDEX_LABELS` name), ``Value``, ``Interval low``, ``Interval high``
    (at the file's level) and ``Unit``; NaN where the file has null (an undefined EF, a bundle without an interval
    rule)."""
    from CalibSegLib.interval_rule import INDEX_LABELS, INDICES

    def number(value) -> float:
        return math.nan if value is None else float(value)

    entries = [function[index] for index in INDICES]
    intervals = [entry["interval"] or (None, None) for entry in entries]
    return {"Index": [INDEX_LABELS[index][0] for index in INDICES],
            "Value": [number(entry["value"]) for entry in entries],
            "Interval low": [number(low) for low, _ in intervals],
            "Interval high": [number(high) for _, high in intervals],
            "Unit": [INDEX_LABELS[index][1] for index in INDICES]}


def phase_columns(function: dict) -> dict[str, list] | None:
    """Columns of a cine's phase table (:func:`CalibSegLib.report.phase_curve`): the x axis (``phase`` or
    ``trigger time (ms)``), ``LV volume (mL)`` and ``RV volume (mL)``; None for an ED/ES pair."""
    from CalibSegLib.report import phase_curve

    curve = phase_curve(function)
    if curve is None:
        return None
    x, lv, rv, x_label = curve
    return {x_label: [float(value) for value in x], "LV volume (mL)": [float(value) for value in lv],
            "RV volume (mL)": [float(value) for value in rv]}


def function_text(function: dict) -> str:
    """The module panel's lines: one per index, ``LV ejection fraction: <value> % (90 % interval <low> to <high>)``
    (``(no interval)`` where the file has none, ``not measurable`` for a null value), for a cine which phases are
    ED and ES, and each reason of the file's ``review`` list."""
    columns = function_columns(function)
    level = float(function["level"])
    lines = []
    for title, value, low, high, unit in zip(*columns.values()):
        interval = (f" ({100 * level:.0f} % interval {low:.1f} to {high:.1f})"
                    if math.isfinite(low) and math.isfinite(high) else " (no interval)")
        lines.append(f"{title}: {value:.1f} {unit}{interval}" if math.isfinite(value) else f"{title}: not measurable")
    phases = function.get("phases")
    if phases is not None:
        lines.append(f"ED: phase {phases['ed']} (largest LV blood pool), ES: phase {phases['es']} (smallest).")
    lines += [f"Review before signing: {reason}" for reason in function.get("review") or []]
    return "\n".join(lines)


def _add_volume_chart(scene, name: str, table, columns: dict[str, list], function: dict):
    """A plot chart of the phase table's LV and RV columns over its first column."""
    x_column = next(iter(columns))
    chart = scene.AddNewNodeByClass("vtkMRMLPlotChartNode", scene.GenerateUniqueName(name))
    phases = function["phases"]
    chart.SetTitle(f"Volume over the cardiac cycle (ED: phase {phases['ed']}, ES: phase {phases['es']})")
    chart.SetXAxisTitle(x_column)
    chart.SetYAxisTitle("volume (mL)")
    for column, color in (("LV volume (mL)", (0.78, 0.16, 0.16)), ("RV volume (mL)", (0.08, 0.40, 0.75))):
        series = scene.AddNewNodeByClass("vtkMRMLPlotSeriesNode", scene.GenerateUniqueName(f"{name} {column}"))
        series.SetAndObserveTableNodeID(table.GetID())
        series.SetXColumnName(x_column)
        series.SetYColumnName(column)
        series.SetPlotType(series.PlotTypeScatter)
        series.SetMarkerStyle(series.MarkerStyleCircle)
        series.SetColor(*color)
        chart.AddAndObservePlotSeriesNodeID(series.GetID())
    return chart


class FunctionRunner:
    """Measures cardiac function on nodes: request (reads the scene), compute (arrays only), publish (adds the nodes,
    writes the files)."""

    @staticmethod
    def request(phases: Phases, bundlePath, device: str = "auto", outputFolder=None) -> FunctionRequest:
        """Check the bundle (its metadata only: a file or a shipped model's name whose terminology codes the left and
        right ventricles and the myocardium) and the output folder; raises ValueError with one sentence, nothing
        added."""
        from CalibSegLib.bundle import read_metadata
        from CalibSegLib.cardiac.command import FUNCTION_NAME
        from CalibSegLib.cardiac.indices import cardiac_classes
        from CalibSegLib.io import check_output_file
        from CalibSegLib.pretrained import resolve_bundle_path
        from CalibSegLib.report import REPORT_NAME

        if not bundlePath:
            raise ValueError("Choose a model bundle (.calibseg file).")
        path = resolve_bundle_path(bundlePath)
        metadata = read_metadata(path)
        cardiac_classes(metadata.class_names, metadata.class_terminology)  # refused here, before any inference
        folder = None if outputFolder in (None, "", ".") else Path(outputFolder)
        for name in (FUNCTION_NAME, REPORT_NAME) if folder is not None else ():
            check_output_file(folder / name)
        return FunctionRequest(phases, path, device, folder)

    @staticmethod
    def compute(request: FunctionRequest, progress: Callable[[float], None] | None = None,
                cancel: threading.Event | None = None) -> dict:
        """Measure in the calling thread (:func:`CalibSegLib.function_process.measure_phases`); touches no node."""
        from CalibSegLib.function_process import measure_phases

        phases = request.phases
        return measure_phases(request.bundle_path, phases.images, phases.spacing, phases.trigger_times_ms,
                              phases.cine, request.device, progress, cancel)

    @staticmethod
    def publish(request: FunctionRequest, function: dict) -> FunctionOutputs:
        """Add the tables (and a cine's chart) to the scene of the phases' grid volume and write the files into the
        output folder; on any error remove what was added, write nothing, and re-raise."""
        from CalibSegLib.cardiac.command import write_function_files

        phases = request.phases
        scene = phases.source_node.GetScene()
        if scene is None:  # the user deleted it while the measurement ran
            raise ValueError(f"The node '{phases.name}' was removed from the scene before its function was added; "
                             "nothing was added.")
        with NodeTransaction(scene):
            outputs = FunctionOutputs(function, add_table(scene, f"{phases.name} cardiac function",
                                                          function_columns(function)))
            columns = phase_columns(function)
            if columns is not None:
                outputs.phase_table = add_table(scene, f"{phases.name} phase volumes", columns)
                outputs.chart = _add_volume_chart(scene, f"{phases.name} volume curve", outputs.phase_table, columns,
                                                  function)
            if request.output_folder is not None:
                outputs.json_path, outputs.report_path = write_function_files(
                    request.output_folder, function, request.bundle_path.stem, MODULE_LABEL, phases.name)
        return outputs

    def run(self, phases: Phases, bundlePath, device: str = "auto", outputFolder=None,
            progress: Callable[[float], None] | None = None) -> FunctionOutputs:
        """Request, compute and publish in the calling thread (the Python console, tests)."""
        request = self.request(phases, bundlePath, device, outputFolder)
        return self.publish(request, self.compute(request, progress))


class FunctionJob(ChildJob):
    """One measurement of ``request`` in a child process (:mod:`CalibSegLib.function_process`), with progress and
    cancel; :meth:`finish` publishes it as :meth:`FunctionRunner.publish` does."""

    module = "CalibSegLib.function_process"
    what = "cardiac function"

    def __init__(self, request: FunctionRequest, python: str | None = None) -> None:
        super().__init__(python)
        self.request = request

    def _write_request(self, folder: Path) -> None:
        from CalibSegLib.function_process import write_function_request

        phases = self.request.phases
        write_function_request(folder, self.request.bundle_path, phases.images, phases.spacing,
                               phases.trigger_times_ms, phases.cine, self.request.device)

    def _publish(self, folder: Path) -> FunctionOutputs:
        from CalibSegLib.function_process import read_function_result

        return FunctionRunner.publish(self.request, read_function_result(folder))
