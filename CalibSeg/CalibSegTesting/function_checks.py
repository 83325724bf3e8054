"""Cardiac function in the module: from an ED and an ES volume, a cine sequence or a multi-volume, in the calling
thread and in the background; its table, curve and files; its refusals, one sentence each with the scene unchanged.

The bundle is tiny and untrained, with the heart's SNOMED CT codes (:func:`~.scene.cardiac_terminology`) and a
hand-made interval rule (value ± 5); the phases are phantoms whose rings grow and shrink, so each phase's structures
differ in volume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from CalibSegRunner import FunctionJob, FunctionRunner, cine_phases, ed_es_phases
from CalibSegRunner.function import function_text

from .scene import (ORIGIN, cardiac_terminology, hand_made_interval_rule, make_volume_node, scene_is_unchanged_after,
                    scene_snapshot, table_columns, tiny_bundle)

__all__ = ["check_function_of_ed_and_es_is_the_label_volumes_with_their_intervals",
           "check_a_cine_sequence_gives_every_phase_and_chooses_ed_and_es",
           "check_a_multi_volume_gives_what_its_sequence_gives",
           "check_function_in_the_background_publishes_what_run_publishes",
           "check_function_refusals_are_one_sentence_and_change_nothing"]

SHAPE = (4, 48, 40)
SPACING = (6.0, 0.8, 1.25)  # scene.SPACING_XYZ in (z, y, x) order, mm


def _heart_and_labels(scale: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A phantom phase (z, y, x) and its labels: rings whose radii are ``scale`` times the phantom's, the bright
    centre growing with it as a blood pool does."""
    rng = np.random.default_rng(seed)
    k, j, i = np.indices(SHAPE)
    radius = np.hypot(j - SHAPE[1] / 2, i - SHAPE[2] / 2) / scale
    labels = np.select([radius < 6, radius < 10, radius < 14], [3, 2, 1], 0).astype(np.uint8)
    return (labels * 40.0 + rng.normal(0, 10, SHAPE) + k).astype(np.float32), labels


def _heart(scale: float, seed: int = 0) -> np.ndarray:
    return _heart_and_labels(scale, seed)[0]


def _cardiac_bundle(work_dir: Path, rule: bool = True) -> Path:
    overrides = {"class_terminology": cardiac_terminology()}
    if rule:
        overrides["function_intervals"] = hand_made_interval_rule()
    return tiny_bundle(Path(work_dir) / ("rule" if rule else "no_rule"), **overrides)


def _input_checked_bundle(work_dir: Path) -> Path:
    """The cardiac bundle with input statistics fitted on 8 phantom hearts (4 more for the feature threshold), so
    an image unlike them is unsuitable."""
    from types import SimpleNamespace

    from CalibSegLib.bundle import load_bundle
    from CalibSegLib.features import fit_network_features
    from CalibSegLib.input_check import statistics_of_cases

    plain = load_bundle(_cardiac_bundle(work_dir))
    cases = [SimpleNamespace(image=image, label=labels, spacing=SPACING) for image, labels in
             (_heart_and_labels(scale, seed) for seed, scale in enumerate(np.linspace(0.7, 1.2, 12)))]
    features = fit_network_features(plain.build_model(), plain.metadata, cases[:8], cases[8:])
    return tiny_bundle(Path(work_dir) / "checked", class_terminology=cardiac_terminology(),
                       function_intervals=hand_made_interval_rule(),
                       input_statistics=statistics_of_cases(plain.metadata, cases[:8], features=features))


def _label_indices(bundle: Path, ed: np.ndarray, es: np.ndarray, spacing) -> dict[str, float]:
    """The indices computed here from the bundle's label maps of ED and ES (class 3 LV, 1 RV, 2 myocardium)."""
    from CalibSegLib.inference import Predictor

    predictor = Predictor(bundle, device="cpu")
    voxel = float(np.prod(spacing)) / 1000.0
    counts = [np.bincount(predictor.predict(image, spacing).labels.ravel(), minlength=4) * voxel for image in (ed, es)]
    (ed_ml, es_ml) = counts

    def ejection(diastole: float, systole: float) -> float:
        return 100.0 * (diastole - systole) / diastole if diastole > 0 else math.nan

    return {"lv_edv_ml": ed_ml[3], "lv_esv_ml": es_ml[3], "lv_sv_ml": ed_ml[3] - es_ml[3],
            "lv_ef_percent": ejection(ed_ml[3], es_ml[3]), "rv_edv_ml": ed_ml[1], "rv_esv_ml": es_ml[1],
            "rv_ef_percent": ejection(ed_ml[1], es_ml[1]), "myocardium_mass_g": 1.05 * ed_ml[2]}


def _assert_values(function: dict, expected: dict[str, float], half_width: float | None = 5.0) -> None:
    for index, value in expected.items():
        entry = function[index]
        if math.isnan(value):
            assert entry["value"] is None, (index, entry)
            continue
        assert math.isclose(entry["value"], value, rel_tol=1e-6, abs_tol=1e-9), (index, entry, value)
        if half_width is None:
            assert entry["interval"] is None, (index, entry)
        else:  # the rule's value ± 5, within what the index can be: no volume below 0, no EF above 100
            highest = 100.0 if index.endswith("_percent") else math.inf
            np.testing.assert_allclose(entry["interval"], [max(value - half_width, 0.0),
                                                           min(value + half_width, highest)], rtol=1e-6)


def check_function_of_ed_and_es_is_the_label_volumes_with_their_intervals(scene, work_dir: Path) -> None:
    """ED and ES volumes on the module's oblique, anisotropic grid: the indices are the label maps' volumes, each with
    the bundle's interval; the table holds them, and function.json and report.html are written."""
    bundle = _cardiac_bundle(work_dir)
    ed_image, es_image = _heart(1.2), _heart(0.7)
    ed, es = make_volume_node(scene, ed_image, "ED"), make_volume_node(scene, es_image, "ES")
    folder = Path(work_dir) / "out"
    outputs = FunctionRunner().run(ed_es_phases(ed, es), bundle, "cpu", outputFolder=folder)
    function = outputs.function
    assert function["level"] == 0.9 and "phases" not in function and outputs.chart is None
    _assert_values(function, _label_indices(bundle, ed_image, es_image, SPACING))
    columns = table_columns(outputs.table)
    assert columns["Index"][3] == "LV ejection fraction" and columns["Unit"][3] == "%"
    lv_edv = function["lv_edv_ml"]
    assert (columns["Value"][0], columns["Interval low"][0], columns["Interval high"][0]) == (
        lv_edv["value"], *lv_edv["interval"])
    assert outputs.table.GetName() == "ED cardiac function" and outputs.table.GetScene() is scene
    ef = function["lv_ef_percent"]["value"]
    assert function_text(function).splitlines()[3] == (
        f"LV ejection fraction: {ef:.1f} % (90 % interval {ef - 5:.1f} to {ef + 5:.1f})")  # what the panel shows
    assert function["review"] == []  # the tiny bundle has no quality model to flag with
    assert function_text({**function, "review": ["Check the LV at ES."]}).splitlines()[-1] == \
        "Review before signing: Check the LV at ES."  # what the panel shows of a review list
    assert json.loads((folder / "function.json").read_text()) == function
    page = (folder / "report.html").read_text()
    assert "LV ejection fraction" in page and "an ED and an ES volume" in page
    assert sorted(path.name for path in folder.iterdir()) == ["function.json", "report.html"]
    # Without a fitted rule the values stay, the intervals are absent and the file says why.
    plain = FunctionRunner().run(ed_es_phases(ed, es), _cardiac_bundle(work_dir, rule=False), "cpu").function
    _assert_values(plain, {index: function[index]["value"] if function[index]["value"] is not None else math.nan
                           for index in ("lv_edv_ml", "rv_esv_ml", "myocardium_mass_g")}, half_width=None)
    assert "interval rule" in plain["intervals_absent"]
    assert function_text(plain).splitlines()[0] == f"LV end-diastolic volume: {lv_edv['value']:.1f} mL (no interval)"


def _sequence(scene, images: list[np.ndarray], name: str = "cine", times=None, unit: str = "ms", **grid):
    """A sequence node of one scalar volume per image, indexed by ``times`` in ``unit``."""
    sequence = scene.AddNewNodeByClass("vtkMRMLSequenceNode", name)
    sequence.SetIndexName("time")
    sequence.SetIndexUnit(unit)
    for index, image in enumerate(images):
        volume = make_volume_node(scene, image, f"{name} phase {index}", **(grid if index else {}))
        sequence.SetDataNodeAtValue(volume, str(index * 40 if times is None else times[index]))
        scene.RemoveNode(volume)  # the sequence keeps its own copy
    return sequence


def check_a_cine_sequence_gives_every_phase_and_chooses_ed_and_es(scene, work_dir: Path) -> None:
    """Five phases whose blood pool grows and shrinks: every phase's volume in the phase table and the curve, ED and
    ES the largest and smallest LV of them, the sequence's times (s) as trigger times in ms."""
    bundle = _cardiac_bundle(work_dir)
    scales = (1.0, 1.25, 0.85, 0.7, 1.1)
    images = [_heart(scale, seed) for seed, scale in enumerate(scales)]
    sequence = _sequence(scene, images, times=["0", "0.04", "0.08", "0.12", "0.16"], unit="s")
    outputs = FunctionRunner().run(cine_phases(sequence), bundle, "cpu")
    function = outputs.function
    rows = function["phase_volumes"]
    lv = [row["lv_ml"] for row in rows]
    assert [row["trigger_time_ms"] for row in rows] == [0.0, 40.0, 80.0, 120.0, 160.0]
    assert function["phases"] == {"ed": int(np.argmax(lv)), "es": int(np.argmin(lv))} and max(lv) > min(lv)
    ed, es = function["phases"]["ed"], function["phases"]["es"]
    _assert_values(function, _label_indices(bundle, images[ed], images[es], SPACING))
    columns = table_columns(outputs.phase_table)
    assert columns == {"trigger time (ms)": [0.0, 40.0, 80.0, 120.0, 160.0], "LV volume (mL)": lv,
                       "RV volume (mL)": [row["rv_ml"] for row in rows]}
    chart = outputs.chart
    assert chart.GetNumberOfPlotSeriesNodes() == 2 and f"ED: phase {ed}, ES: phase {es}" in chart.GetTitle()
    assert outputs.table.GetScene() is scene and outputs.table.GetName() == "cine cardiac function"
    assert function_text(function).splitlines()[-1] == (
        f"ED: phase {ed} (largest LV blood pool), ES: phase {es} (smallest).")


def check_a_multi_volume_gives_what_its_sequence_gives(scene, work_dir: Path) -> None:
    """A MultiVolume node (one scalar volume, a component per frame, MultiVolumeExplorer's attributes; its class
    needs that extension, so a scalar volume with those attributes stands in) reads as the sequence of its frames."""
    import vtk
    import vtk.util.numpy_support

    from CalibSegRunner.phases import MULTIVOLUME_FRAMES

    images = [_heart(scale, seed) for seed, scale in enumerate((1.0, 0.75, 1.2))]
    multi = make_volume_node(scene, images[0], "multi")
    frames = vtk.vtkImageData()  # (z, y, x) voxels of three components, as MultiVolumeExplorer stores a cine
    frames.SetDimensions(*reversed(SHAPE))
    frames.GetPointData().SetScalars(vtk.util.numpy_support.numpy_to_vtk(np.stack(images, axis=-1).reshape(-1, 3),
                                                                         deep=True))
    multi.SetAndObserveImageData(frames)
    multi.SetAttribute(MULTIVOLUME_FRAMES, "3")
    multi.SetAttribute("MultiVolume.FrameLabels", "0,35.5,71")
    multi.SetAttribute("MultiVolume.FrameIdentifyingDICOMTagUnits", "ms")
    from_frames = cine_phases(multi)
    from_sequence = cine_phases(_sequence(scene, images, times=["0", "35.5", "71"]))
    np.testing.assert_array_equal(from_frames.images, from_sequence.images)
    assert from_frames.trigger_times_ms == from_sequence.trigger_times_ms == [0.0, 35.5, 71.0]
    assert from_frames.spacing == from_sequence.spacing == SPACING
    function = FunctionRunner().run(from_frames, _cardiac_bundle(work_dir), "cpu").function
    assert len(function["phase_volumes"]) == 3


def check_function_in_the_background_publishes_what_run_publishes(scene, work_dir: Path) -> None:
    """A :class:`FunctionJob` (the widget's: the child process measures) gives the in-process run's function and
    files; a cancelled one adds nothing."""
    from CalibSegLib.inference import InferenceCancelled

    bundle = _cardiac_bundle(work_dir)
    sequence = _sequence(scene, [_heart(scale, seed) for seed, scale in enumerate((1.0, 0.7, 1.2))])
    runner = FunctionRunner()
    folder = Path(work_dir) / "background"
    job = FunctionJob(runner.request(cine_phases(sequence), bundle, "cpu", folder)).start()
    assert job.wait(timeout=120)
    in_background = job.finish()
    assert job.fraction == 1.0
    in_foreground = runner.run(cine_phases(sequence), bundle, "cpu")
    assert in_background.function == in_foreground.function
    assert json.loads((folder / "function.json").read_text()) == in_background.function
    cancelled = FunctionJob(runner.request(cine_phases(sequence), bundle, "cpu", Path(work_dir) / "cancelled"))
    before = scene_snapshot(scene)
    cancelled.start().cancel()
    assert cancelled.wait(timeout=120)
    try:
        cancelled.finish()
    except InferenceCancelled as error:
        assert str(error) == "The cardiac function was cancelled; the scene is unchanged."
    else:
        raise AssertionError("finish() of a cancelled function job did not raise InferenceCancelled")
    assert scene_snapshot(scene) == before and not (Path(work_dir) / "cancelled").exists()


def check_function_refusals_are_one_sentence_and_change_nothing(scene, work_dir: Path) -> None:
    """ED and ES on different grids, one volume as both, a single-phase cine, a cine whose phases differ in grid, a
    bundle without the heart's codes, a copy of ED given as ES, ED and ES swapped, a cine repeating a phase, an image
    of noise: one sentence each, the scene and the output folder as they were."""
    bundle = _cardiac_bundle(work_dir)
    ed = make_volume_node(scene, _heart(1.0), "ED")
    shifted = make_volume_node(scene, _heart(0.8), "ES shifted", origin=(ORIGIN[0] + 5.0, ORIGIN[1], ORIGIN[2]))
    cropped = make_volume_node(scene, _heart(0.8)[:, :40], "ES cropped")
    single = _sequence(scene, [_heart(1.0)], "single")
    uneven = _sequence(scene, [_heart(1.0), _heart(0.8)], "uneven", spacing=(1.25, 0.8, 8.0))
    es = make_volume_node(scene, _heart(0.8), "ES")
    ed_copy = make_volume_node(scene, _heart(1.0), "ED copy")
    large, small = make_volume_node(scene, _heart(1.2), "large"), make_volume_node(scene, _heart(0.7), "small")
    repeating = _sequence(scene, [_heart(1.2), _heart(0.7), _heart(1.2)], "repeating")
    noise = make_volume_node(scene, np.random.default_rng(5).normal(0, 50, SHAPE).astype(np.float32), "noise")
    input_checked = _input_checked_bundle(Path(work_dir) / "input_checked")
    not_cardiac = tiny_bundle(Path(work_dir) / "plain")
    folder = Path(work_dir) / "out"
    runner = FunctionRunner()
    cases = {
        "ES on a shifted grid": (lambda: runner.run(ed_es_phases(ed, shifted), bundle, "cpu", folder),
                                 "The ED volume 'ED' (40×48×4 voxels of 1.25 × 0.8 × 6 mm) and the ES volume 'ES "
                                 "shifted' (40×48×4 voxels of 1.25 × 0.8 × 6 mm) differ in geometry"),
        "ES of other size": (lambda: runner.run(ed_es_phases(ed, cropped), bundle, "cpu", folder),
                             "(40×40×4 voxels of 1.25 × 0.8 × 6 mm) differ in geometry"),
        "one volume as both": (lambda: runner.run(ed_es_phases(ed, ed), bundle, "cpu", folder),
                               "The volume 'ED' is chosen as both ED and ES"),
        "no ES": (lambda: runner.run(ed_es_phases(ed, None), bundle, "cpu", folder), "Choose an end-diastolic"),
        "single phase": (lambda: runner.run(cine_phases(single), bundle, "cpu", folder),
                         "The cine 'single' holds 1 phase; cardiac function needs the phases of a whole cycle"),
        "uneven phases": (lambda: runner.run(cine_phases(uneven), bundle, "cpu", folder),
                          "Phase 1 of the cine 'uneven' (40×48×4 voxels of 1.25 × 0.8 × 8 mm) is not on the grid of "
                          "its phase 0"),
        "a volume as cine": (lambda: runner.run(cine_phases(ed), bundle, "cpu", folder), "Choose a cine"),
        "no heart codes": (lambda: runner.run(ed_es_phases(ed, es), not_cardiac, "cpu", folder),
                           "The bundle's terminology codes no class as left ventricle (SCT 87878005)"),
        "a copy of ED as ES": (lambda: runner.run(ed_es_phases(ed, ed_copy), bundle, "cpu", folder),
                               "ED and ES are the same image (equal voxels)"),
        "ED and ES swapped": (lambda: runner.run(ed_es_phases(small, large), bundle, "cpu", folder),
                              "not smaller at ES, so ED and ES look swapped"),
        "a cine repeating a phase": (lambda: runner.run(cine_phases(repeating), bundle, "cpu", folder),
                                     "Phase 0 of the cine and phase 2 of the cine are the same image"),
        "noise as ED": (lambda: runner.run(ed_es_phases(noise, es), input_checked, "cpu", folder),
                        "ED is unlike the model's training images (unlike the training images the network saw: "
                        "feature distance"),
    }
    for case, (action, expected) in cases.items():
        error = scene_is_unchanged_after(scene, action, case)
        assert expected in error, (case, error)
        assert error.count(". ") == 0 and error.endswith("."), f"{case}: not one sentence: {error}"
        assert not folder.exists(), case
