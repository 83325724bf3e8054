"""The report pages: one self-contained ``report.html`` over finished cases, worst first (the QC page), or over
one heart's cardiac function (the function page).

``calibseg-predict --report`` writes it for one image or a folder of cases and ``calibseg-evaluate --report``
for a test set (with the pooled reliability diagram). The page needs nothing but itself: its pictures are PNG
data URIs, its style is inline CSS, it has no script and names no other file or address; printed (or saved as
PDF) every case starts its own block, kept on one page where it fits, with the colours as on screen.

**Order.** Cases that could not be segmented come first, with their error's sentence. Then the segmented
cases, worst first: those whose input the input check calls unsuitable (their predicted Dice is not to be
read), then by their lowest predicted structure Dice (a structure predicted nowhere counts as 0), cases
without a predicted Dice (a bundle without a quality model) last; ties by name.

**A case.** Its input check's sentence, its review sentence, per structure the volume (mL), the predicted Dice
with its interval and the review flag (with a reference the measured Dice and HD95 beside them, and the case's
ECE over the reference foreground), and pictures of its worst slices (:mod:`CalibSegLib.slice_pictures`) under
one legend for the page: the structures' outline colours and the hot-spot colour scale.

**The function page** (``calibseg-function --report``, :func:`write_function_report`) shows a ``function.json``
(:mod:`CalibSegLib.cardiac`): a table of the indices (LV and RV volumes and ejection fractions, myocardial mass),
each value with its interval at the file's level, the file's reasons to review the contours before signing (when
it has any), and for a cine the LV and RV volume of every phase as a curve (:func:`volume_curve_png`), ED and ES
marked.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from CalibSegLib import __version__
from CalibSegLib.analysis import CaseAnalysis
from CalibSegLib.bundle import BundleMetadata
from CalibSegLib.input_check import input_check_lines
from CalibSegLib.interval_rule import INDEX_LABELS, INDICES
from CalibSegLib.io import atomic_output
from CalibSegLib.quality import review_sentence, structure_key
from CalibSegLib.slice_pictures import SlicePicture, case_pictures, hot_spot_colors

__all__ = ["REPORT_NAME", "ReportCase", "report_case", "lowest_predicted_dice", "worst_first", "report_html",
           "write_report", "function_table_html", "phase_curve", "volume_curve_png",
           "function_report_html", "write_function_report"]

REPORT_NAME = "report.html"
_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; color: #1d1d1f; margin: 24px auto; max-width: 1000px;
  padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 0 0 6px; }
.meta, .note { color: #555; } .legend, .case, .failed, .test-set { border: 1px solid #ccc; border-radius: 6px;
  padding: 10px 14px; margin: 14px 0; break-inside: avoid; page-break-inside: avoid; }
table { border-collapse: collapse; margin: 6px 0; } th, td { padding: 3px 10px; text-align: left;
  border-bottom: 1px solid #e2e2e2; } td.number { text-align: right; font-variant-numeric: tabular-nums; }
.flag { font-weight: 700; padding: 1px 6px; border-radius: 4px; }
.review { background: #fde2e1; color: #9b1c1c; } .ok { background: #e3f4e5; color: #1e6b2a; }
.unsuitable { background: #fff1c2; color: #7a4d00; } .error { background: #fde2e1; color: #9b1c1c; }
.swatch { display: inline-block; width: 14px; height: 14px; border: 2px solid; vertical-align: -2px;
  margin: 0 4px 0 12px; } .scale { display: inline-block; width: 160px; height: 12px; vertical-align: -1px;
  margin: 0 6px; border: 1px solid #999; }
.pictures { display: flex; flex-wrap: wrap; gap: 10px; } figure { margin: 0; }
figure img { display: block; border: 1px solid #999; } figcaption { font-size: 12px; color: #555; }
* { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
@page { size: A4; margin: 12mm; }
@media print { body { margin: 0; max-width: none; font-size: 11px; }
  figure img { width: 150px; height: auto; } }
"""


@dataclass
class ReportCase:
    """One case of the page: its name and either its quality ``summary`` (with ``input_check``), the measured
    ``metrics`` row with a reference and its ``pictures``, or the ``error`` sentence it failed with."""

    name: str
    summary: dict[str, Any] | None = None
    metrics: dict[str, float] | None = None
    pictures: list[SlicePicture] = field(default_factory=list)
    error: str | None = None


def report_case(name: str, image: np.ndarray, spacing: Sequence[float], analysis: CaseAnalysis,
                metadata: BundleMetadata) -> ReportCase:
    """A segmented case with the pictures of its worst slices; ``image``: ``(z, y, x)`` or ``(K, z, y, x)``,
    ``spacing``: ``(z, y, x)`` mm."""
    prediction = analysis.prediction
    pictures = case_pictures(image, prediction.labels, prediction.entropy, spacing, analysis.summary,
                             metadata.class_colors)
    return ReportCase(name, analysis.summary, analysis.metrics, pictures)


def lowest_predicted_dice(summary: dict[str, Any]) -> float | None:
    """The case's lowest predicted structure Dice (0 for a structure predicted nowhere); None without a
    quality model."""
    if summary.get("quality_model") is None:
        return None
    values = [0.0 if entry["mean_confidence"] is None else entry["predicted_dice"]
              for entry in summary["structures"].values()]
    return min((value for value in values if value is not None), default=None)


def worst_first(cases: Sequence[ReportCase]) -> list[ReportCase]:
    """``cases`` in the page's order (see the module docstring)."""
    def key(case: ReportCase) -> tuple:
        if case.summary is None:
            return (0, 0.0, case.name)
        lowest = lowest_predicted_dice(case.summary)
        unsuitable = case.summary["input_check"].get("suitable") is False
        return (1 if unsuitable else 2, math.inf if lowest is None else lowest, case.name)

    return sorted(cases, key=key)


def _text(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _number(value: Any, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}{suffix}"


def _flag(review: bool | None) -> str:
    if review is None:
        return ""
    return '<span class="flag review">REVIEW</span>' if review else '<span class="flag ok">ok</span>'


def _image(png: bytes, alt: str, width: int | None = None) -> str:
    size = f' width="{width}"' if width else ""
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{_text(alt)}"{size}>'


def _rgb(color: Sequence[float]) -> str:
    """A CSS colour of RGB in [0, 1]: ``rgb(230, 77, 64)``."""
    return f"rgb({', '.join(str(round(255 * float(value))) for value in color[:3])})"


def _legend(metadata: BundleMetadata, hot_spot_level: float) -> str:
    swatches = "".join(f'<span class="swatch" style="border-color: {_rgb(color)}"></span>{_text(name)}'
                       for name, color in zip(metadata.class_names[1:], metadata.class_colors[1:]))
    stops = ", ".join(_rgb(color) for color in hot_spot_colors(8))
    return (f'<section class="legend"><b>Legend.</b> Outlines: predicted structures{swatches}.<br>'
            f"Uncertainty hot spots (normalised entropy, shown from {hot_spot_level:.1f}): "
            f'{hot_spot_level:.1f}<span class="scale" style="background: linear-gradient(to right, {stops})">'
            '</span>1.0. <span class="flag review">REVIEW</span>: predicted Dice below the model\'s review '
            'threshold, or the structure predicted nowhere; <span class="flag unsuitable">INPUT UNSUITABLE'
            "</span>: the image is unlike the model's training images, read none of its numbers.</section>")


def _structure_table(summary: dict[str, Any], metrics: dict[str, float] | None) -> str:
    measured = metrics is not None
    head = ["structure", "volume (mL)", "predicted Dice [80 % interval]"] + (
        ["measured Dice", "HD95 (mm)"] if measured else []) + ["review"]
    rows = []
    for name, entry in summary["structures"].items():
        if entry["predicted_dice"] is not None:
            low, high = entry["predicted_dice_interval"]
            predicted = f"{entry['predicted_dice']:.2f} [{low:.2f}, {high:.2f}]"
        else:
            predicted = "not found" if entry["mean_confidence"] is None else "–"
        cells = [_text(name), f'<td class="number">{_number(entry["volume_ml"], 1)}</td>',
                 f'<td class="number">{predicted}</td>']
        if measured:
            key = structure_key(name)
            cells += [f'<td class="number">{_number(metrics.get(f"dice_{key}"))}</td>',
                      f'<td class="number">{_number(metrics.get(f"hd95_{key}"))}</td>']
        cells.append(_flag(entry["review"]))
        rows.append("<tr>" + "".join(cell if cell.startswith("<td") else f"<td>{cell}</td>" for cell in cells)
                    + "</tr>")
    header = "".join(f"<th>{_text(title)}</th>" for title in head)
    return f"<table><tr>{header}</tr>{''.join(rows)}</table>"


def _case_section(number: int, case: ReportCase) -> str:
    anchor = f'id="case-{number}"'
    if case.summary is None:
        return (f'<section class="failed" {anchor}><h2>{number}. {_text(case.name)} '
                f'<span class="flag error">NOT SEGMENTED</span></h2><p>{_text(case.error)}</p></section>')
    summary = case.summary
    suitable = summary["input_check"].get("suitable")
    badges = ('<span class="flag unsuitable">INPUT UNSUITABLE</span> ' if suitable is False else "") + _flag(
        summary["review"])
    parts = [f'<section class="case" {anchor}><h2>{number}. {_text(case.name)} {badges}</h2>',
             f'<p class="note">{"<br>".join(map(_text, input_check_lines(summary["input_check"])))}</p>',
             _structure_table(summary, case.metrics)]
    if case.metrics is not None:
        parts.append(f'<p>Measured over the reference foreground: ECE {_number(case.metrics.get("ece"), 3)}, '
                     f'mean Dice {_number(case.metrics.get("dice_mean"), 3)}, mean HD95 '
                     f'{_number(case.metrics.get("hd95_mean"))} mm.</p>')
    parts.append(f"<p><b>{_text(review_sentence(summary))}</b></p>")
    figures = [f"<figure>{_image(picture.png, f'{case.name}, slice {picture.index}')}<figcaption>slice "
               f"{picture.index}: {picture.hot_spots} hot-spot voxels</figcaption></figure>"
               for picture in case.pictures]
    parts.append(f'<div class="pictures">{"".join(figures)}</div></section>')
    return "".join(parts)


def _overview(cases: Sequence[ReportCase]) -> str:
    measured = any(case.metrics is not None for case in cases)
    head = ["#", "case", "input", "lowest predicted Dice", "flagged"] + (
        ["measured mean Dice"] if measured else [])
    rows = []
    for number, case in enumerate(cases, start=1):
        link = f'<a href="#case-{number}">{_text(case.name)}</a>'
        if case.summary is None:
            rows.append(f'<tr><td>{number}</td><td>{link}</td><td colspan="{len(head) - 2}">'
                        f'<span class="flag error">NOT SEGMENTED</span></td></tr>')
            continue
        suitable = case.summary["input_check"].get("suitable")
        flagged = [name for name, entry in case.summary["structures"].items() if entry["review"]]
        checked = {True: "suitable", False: '<span class="flag unsuitable">UNSUITABLE</span>',
                   None: "not checked"}[suitable]
        cells = [str(number), link, checked,
                 f'<td class="number">{_number(lowest_predicted_dice(case.summary))}</td>',
                 _text(", ".join(flagged) or "none")]
        if measured:
            cells.append(f'<td class="number">{_number((case.metrics or {}).get("dice_mean"), 3)}</td>')
        rows.append("<tr>" + "".join(cell if cell.startswith("<td") else f"<td>{cell}</td>" for cell in cells)
                    + "</tr>")
    header = "".join(f"<th>{_text(title)}</th>" for title in head)
    return f'<section><h2>Cases, worst first</h2><table><tr>{header}</tr>{"".join(rows)}</table></section>'


def report_html(cases: Sequence[ReportCase], metadata: BundleMetadata, bundle_name: str, command: str,
                reliability_png: bytes | None = None, test_set_lines: Sequence[str] = ()) -> str:
    """The page's HTML (see the module docstring).

    ``command``: what made it (``calibseg-predict``, ``calibseg-evaluate``); ``reliability_png`` and
    ``test_set_lines``: a test set's pooled reliability diagram and its summary lines, shown before the cases.
    """
    ordered = worst_first(cases)
    segmented = [case for case in ordered if case.summary is not None]
    flagged = sum(bool(case.summary["review"]) for case in segmented)
    unsuitable = sum(case.summary["input_check"].get("suitable") is False for case in segmented)
    level = float(segmented[0].summary.get("hot_spot_level", 0.4)) if segmented else 0.4
    created = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M")
    parts = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>CalibSeg report: '
             f"{_text(bundle_name)}, {len(cases)} case(s)</title><style>{_STYLE}</style></head><body>",
             f"<header><h1>CalibSeg quality report</h1><p class=\"meta\">Model {_text(bundle_name)} "
             f"({_text(metadata.training.get('method', 'unknown method'))}), {len(cases)} case(s): "
             f"{len(ordered) - len(segmented)} not segmented, {unsuitable} with an unsuitable input, "
             f"{flagged} with a structure to review. Made by {_text(command)} (CalibSeg {__version__}) on "
             f"{created}.</p>"
             "</header>", _legend(metadata, level)]
    if reliability_png is not None or test_set_lines:
        lines = "".join(f"<p>{_text(line)}</p>" for line in test_set_lines)
        diagram = _image(reliability_png, "reliability diagram of the test set", 300) if reliability_png \
            else ""
        parts.append(f'<section class="test-set"><h2>The test set</h2>{lines}{diagram}</section>')
    parts.append(_overview(ordered))
    parts += [_case_section(number, case) for number, case in enumerate(ordered, start=1)]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(path: str | Path, cases: Sequence[ReportCase], metadata: BundleMetadata, bundle_name: str,
                 command: str, reliability_png: bytes | None = None,
                 test_set_lines: Sequence[str] = ()) -> Path:
    """Write :func:`report_html` to ``path`` atomically (temporary name, then rename)."""
    return _write_page(path, report_html(cases, metadata, bundle_name, command, reliability_png, test_set_lines))


def _write_page(path: str | Path, text: str) -> Path:
    with atomic_output(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
    return Path(path)


_LV_COLOR, _RV_COLOR = "#c62828", "#1565c0"


def function_table_html(function: Mapping[str, Any]) -> str:
    """The indices of a ``function.json`` dictionary as an HTML table, in
    :data:`~CalibSegLib.interval_rule.INDICES`' order under their
    :data:`~CalibSegLib.interval_rule.INDEX_LABELS`: index, value, interval at the file's ``level`` and unit
    (``–`` where a value or an interval is null: an EF of an empty ventricle, a bundle without an interval rule)."""
    level = float(function["level"])
    rows = []
    for key in INDICES:
        title, unit = INDEX_LABELS[key]
        entry = function[key]
        low, high = entry["interval"] or (None, None)
        interval = "–" if low is None or high is None else f"{_number(low, 1)} – {_number(high, 1)}"
        rows.append(f'<tr><td>{_text(title)}</td><td class="number">{_number(entry["value"], 1)}</td>'
                    f'<td class="number">{interval}</td><td>{_text(unit)}</td></tr>')
    return (f'<table class="function"><tr><th>index</th><th>value</th><th>{100 * level:.0f} % interval</th>'
            f'<th>unit</th></tr>{"".join(rows)}</table>')


def phase_curve(function: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, str] | None:
    """A cine's volume curve from its ``function.json`` (its ``phase_volumes``): ``(x, lv_ml, rv_ml, x_label)``,
    each array ``(T,)`` in the cine's phase order, x the trigger times (ms) where the file has them, else the phase
    numbers; None for an ED/ES pair."""
    rows = function.get("phase_volumes")
    if rows is None:
        return None
    lv = np.array([row["lv_ml"] for row in rows], dtype=np.float64)
    rv = np.array([row["rv_ml"] for row in rows], dtype=np.float64)
    times = [row["trigger_time_ms"] for row in rows]
    if all(time is not None for time in times):
        return np.array(times, dtype=np.float64), lv, rv, "trigger time (ms)"
    return np.array([row["phase"] for row in rows], dtype=np.float64), lv, rv, "phase"


def volume_curve_png(function: Mapping[str, Any], width_px: int = 640, height_px: int = 320) -> bytes | None:
    """PNG bytes of a cine's LV and RV volume (mL) over its phases (:func:`phase_curve`, in time order), ED and ES
    marked with a dashed line each; None for an ED/ES pair."""
    curve = phase_curve(function)
    if curve is None:
        return None
    x, lv, rv, x_label = curve
    order = np.argsort(x, kind="stable")
    dpi = 100
    figure = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi, layout="constrained")
    axis = figure.add_subplot()
    axis.plot(x[order], lv[order], "o-", color=_LV_COLOR, markersize=3, label="LV blood pool")
    axis.plot(x[order], rv[order], "s-", color=_RV_COLOR, markersize=3, label="RV blood pool")
    for name in ("ed", "es"):
        index = int(function["phases"][name])
        axis.axvline(x[index], color="#555", linestyle="--", linewidth=1)
        axis.annotate(f"{name.upper()} (phase {index})", (x[index], 1.0), xycoords=("data", "axes fraction"),
                      xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8,
                      color="#333")  # above the plot, clear of the curves
    axis.set_xlabel(x_label)
    axis.set_ylabel("volume (mL)")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right", fontsize=8)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def function_report_html(function: Mapping[str, Any], bundle_name: str, command: str, case_name: str = "") -> str:
    """The function page's HTML (see the module docstring) of a ``function.json`` dictionary; ``command``: what
    made it (``calibseg-function``, the Slicer module), ``case_name``: what was measured (e.g. the input's name)."""
    created = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M")
    title = f"cardiac function{f' of {case_name}' if case_name else ''}"
    phase_count = len(function.get("phase_volumes") or ())
    measured = f"a cine of {phase_count} phases" if phase_count else "an ED and an ES volume"
    absent = function.get("intervals_absent")
    note = (f"No intervals: {absent}" if absent else
            f"Each interval is meant to hold the true value for {100 * float(function['level']):.0f} % of patients "
            "like the model's cross-validation patients.")
    parts = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>CalibSeg {_text(title)}</title>'
             f"<style>{_STYLE}</style></head><body>",
             f'<header><h1>CalibSeg {_text(title)}</h1><p class="meta">Model {_text(bundle_name)}, {measured}. '
             f"Made by {_text(command)} (CalibSeg {__version__}) on {created}.</p></header>",
             f'<section class="case"><h2>Indices</h2>{function_table_html(function)}<p class="note">Volumes from '
             f"{_text(function.get('volumes_from', 'label voxels'))}. {_text(note)}</p></section>"]
    review = function.get("review") or []  # files written before the review list have none
    if review:
        items = "".join(f"<li>{_text(reason)}</li>" for reason in review)
        parts.append(f'<section class="case"><h2>Review before signing</h2><ul class="review">{items}</ul></section>')
    picture = volume_curve_png(function)
    if picture is not None:
        parts.append(f'<section class="case"><h2>Volume over the cardiac cycle</h2>'
                     f"<p>{_text(function.get('phase_rule') or '')}.</p>"
                     f"{_image(picture, 'LV and RV volume over the phases, ED and ES marked')}</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_function_report(path: str | Path, function: Mapping[str, Any], bundle_name: str, command: str,
                          case_name: str = "") -> Path:
    """Write :func:`function_report_html` to ``path`` atomically (temporary name, then rename)."""
    return _write_page(path, function_report_html(function, bundle_name, command, case_name))
