"""Cardiac function end to end: measure_function's result and function.json on a stand-in predictor whose
volumes are known, and calibseg-function on the shipped sample with the shipped ensemble."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from CalibSegLib.bundle import load_bundle
from CalibSegLib.cardiac import command
from CalibSegLib.cardiac.members import ensemble_labels, member_predictors
from CalibSegLib.cardiac.function import measure_function
from CalibSegLib.cardiac.indices import cardiac_classes, label_volumes_ml
from CalibSegLib.cardiac.intervals import index_values
from CalibSegLib.inference import Predictor
from CalibSegLib.io import ImageGeometry, write_image
from CalibSegLib.interval_rule import INDICES, IntervalRule
from CalibSegLib.pretrained import resolve_bundle_path
from Datasets.acdc import ACDC_CLASS_NAMES, ACDC_SPACING, ACDC_TERMINOLOGY
from Datasets.dicom_series import write_cine
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from cardiac_standins import LabelPredictor, cardiac_metadata
from dicom_series import edit_file

GRID = ImageGeometry(spacing=(6.0, 1.4, 1.4), origin=(3.0, -2.0, 7.0))


def _heart(lv: int, rv: int, myocardium: int) -> np.ndarray:
    labels = np.zeros((3, 30, 30), np.uint8)
    flat = labels.reshape(-1)
    flat[:lv], flat[lv:lv + rv], flat[lv + rv:lv + rv + myocardium] = 3, 1, 2
    return labels


def test_the_result_and_its_json_without_a_rule():
    ed, es = _heart(900, 700, 400), _heart(400, 350, 420)
    result = measure_function(LabelPredictor(), (ed, GRID), (es, GRID))
    classes = cardiac_classes(ACDC_CLASS_NAMES, ACDC_TERMINOLOGY)
    expected = index_values(label_volumes_ml(ed, GRID.spacing, classes), label_volumes_ml(es, GRID.spacing, classes))
    assert result.values == pytest.approx(expected)
    assert result.values["lv_ef_percent"] == pytest.approx(100.0 * 500 / 900)
    payload = json.loads(json.dumps(result.to_json()))
    assert set(payload) == {*INDICES, "level", "volumes_from", "review", "intervals_absent"} and payload["review"] == []
    assert payload["level"] == 0.9 and payload["volumes_from"] == "label voxels"
    assert all(payload[index] == {"value": pytest.approx(expected[index]), "interval": None} for index in INDICES)
    assert payload["intervals_absent"].startswith("the bundle holds no fitted interval rule")
    assert "phases" not in payload


def test_a_stored_rule_gives_every_index_its_interval():
    rule = IntervalRule("soft", "spread", dict.fromkeys(INDICES, 2.0), 0.9, {"patients": 3})
    predictor = LabelPredictor(cardiac_metadata(function_intervals=rule.to_dict()))
    result = measure_function(predictor, (_heart(900, 700, 400), GRID), (_heart(400, 350, 420), GRID))
    payload = result.to_json()
    assert "intervals_absent" not in payload and payload["volumes_from"] == "probability sums"
    for index in INDICES:
        low, high = payload[index]["interval"]
        assert low < payload[index]["value"] < high
    band = result.ed_volumes.lv.spread
    assert payload["lv_edv_ml"]["interval"] == pytest.approx([result.values["lv_edv_ml"] - 2.0 * band,
                                                              result.values["lv_edv_ml"] + 2.0 * band])
    assert result.values["lv_edv_ml"] == pytest.approx(result.ed_volumes.lv.soft)


def test_a_rule_scaled_by_predicted_dice_needs_the_bundles_quality_model():
    """A rule whose scale reads the quality model's predicted Dice, in a bundle without a quality model: every value,
    no interval, and the sentence says why."""
    rule = IntervalRule("hard", "dice", dict.fromkeys(INDICES, 2.0), 0.9, {"patients": 3})
    predictor = LabelPredictor(cardiac_metadata(function_intervals=rule.to_dict()))
    result = measure_function(predictor, (_heart(900, 700, 400), GRID), (_heart(400, 350, 420), GRID))
    payload = result.to_json()
    assert payload["lv_ef_percent"]["value"] == pytest.approx(100.0 * 500 / 900)
    assert all(payload[index]["interval"] is None for index in INDICES)
    assert payload["intervals_absent"].startswith("the bundle's interval rule scales by the quality model's "
                                                  "predicted Dice (dice), and the bundle holds no quality model")


def test_a_recalibration_line_that_would_make_a_volume_negative_leaves_it_as_measured():
    """A line of intercept −5 mL maps an LV of 2.352 mL at ES (200 voxels of 11.76 mm³) below zero: that volume stays
    as measured, the other lines apply, and the review list says which volume and why."""
    voxel = 6.0 * 1.4 * 1.4 / 1000.0
    lines = {"lv_ed": (2.0, 1.1), "lv_es": (-5.0, 1.0), "rv_ed": (0.0, 1.0), "rv_es": (0.0, 1.0),
             "myocardium_ed": (0.0, 1.0)}
    rule = IntervalRule("hard", "constant", dict.fromkeys(INDICES, 1.0), 0.9, recalibration=lines)
    predictor = LabelPredictor(cardiac_metadata(function_intervals=rule.to_dict()))
    result = measure_function(predictor, (_heart(900, 700, 400), GRID), (_heart(200, 350, 420), GRID))
    assert result.values["lv_esv_ml"] == pytest.approx(200 * voxel)  # as measured
    assert result.values["lv_edv_ml"] == pytest.approx(2.0 + 1.1 * 900 * voxel)  # its line applied
    assert result.values["lv_ef_percent"] == pytest.approx(100.0 * (1 - 200 * voxel / (2.0 + 1.1 * 900 * voxel)))
    assert result.review == ["The LV blood pool at ES is given as measured: the interval rule's recalibration line "
                             "would make it 0 mL or less, so this cavity is smaller than any the line was fitted on; "
                             "check its contours."]
    assert result.to_json()["review"] == result.review
    assert f"REVIEW before signing: {result.review[0]}" in result.table_lines()


def test_the_review_list_names_the_lv_where_the_review_flag_marks_it():
    """A quality model that predicts Dice 0.50 for the RV, 0.95 for the myocardium and, for the LV, 0.85 (flagged
    below 0.90) and then 0.95 (not flagged): the review list names the LV at ED and at ES with its predicted Dice and
    threshold, and nothing of the RV or the myocardium (their flags are in the quality summary); the values are
    those without a quality model."""
    from CalibSegLib.quality import QualityModel, StructureQuality

    def constant(dice: float) -> StructureQuality:
        return StructureQuality("mean_entropy", "linear", {"intercept": dice, "slope": 0.0}, (-0.1, 0.1), 0.05, 0.1, 20)

    phases = (_heart(900, 700, 400), GRID), (_heart(400, 350, 420), GRID)
    reviews = []
    for lv_dice in (0.85, 0.95):
        model = QualityModel({"right ventricle": constant(0.5), "myocardium": constant(0.95),
                              "left ventricle": constant(lv_dice)}, review_below=0.8,
                             review_below_by_structure={"right ventricle": 0.8, "myocardium": 0.96,
                                                        "left ventricle": 0.9})
        result = measure_function(LabelPredictor(cardiac_metadata(quality_model=model.to_dict())), *phases)
        assert result.values == measure_function(LabelPredictor(), *phases).values
        reviews.append(result.review)
    assert reviews == [[f"The LV blood pool at {phase} is flagged for review (predicted Dice 0.85, below 0.90), so the "
                        "indices made of it may be off; check its contours before signing." for phase in ("ED", "ES")],
                       []]


def test_published_intervals_stay_within_what_each_index_can_be():
    """A rule of ± 30 (constant scale) around a small heart: volume intervals start at 0 and EF intervals end at 100,
    the other ends are the rule's."""
    rule = IntervalRule("hard", "constant", dict.fromkeys(INDICES, 30.0))
    predictor = LabelPredictor(cardiac_metadata(function_intervals=rule.to_dict()))
    result = measure_function(predictor, (_heart(900, 700, 400), GRID), (_heart(100, 350, 420), GRID))
    values = result.values
    for index in INDICES:
        highest = 100.0 if index.endswith("_percent") else np.inf
        assert result.intervals[index] == pytest.approx((max(values[index] - 30.0, 0.0),
                                                         min(values[index] + 30.0, highest)))
    assert result.intervals["lv_esv_ml"][0] == 0.0 and result.intervals["lv_ef_percent"][1] == 100.0


def test_the_command_on_the_shipped_sample(tmp_path, sample_acdc_dir, capsys):
    """calibseg-function with the shipped ensemble on a sample patient's whole ED and ES volumes (a crop of a few
    slices is unlike the training images, and refused): function.json is written with every index and an empty
    review list, and the LV EF is within 10 points of the one the reference labels give."""
    files = [item for item in find_cases(sample_acdc_dir) if item.patient_id == "patient013"]
    ed_case, es_case = load_cases(sorted(files, key=lambda item: item.case_id), 4)
    grid = ImageGeometry(spacing=ACDC_SPACING)
    for name, case in (("ed", ed_case), ("es", es_case)):
        write_image(tmp_path / f"{name}.nii.gz", case.image, grid)
    started = time.perf_counter()
    status = command.main(["--bundle", "acdc_ce_dice", "--ed", str(tmp_path / "ed.nii.gz"), "--es",
                           str(tmp_path / "es.nii.gz"), "--out-dir", str(tmp_path / "out"), "--device", "cpu"])
    assert status == 0
    assert time.perf_counter() - started < 60
    payload = json.loads((tmp_path / "out" / "function.json").read_text())
    assert set(INDICES) <= set(payload) and payload["level"] == 0.9 and payload["review"] == []
    classes = cardiac_classes(ACDC_CLASS_NAMES, ACDC_TERMINOLOGY)
    reference = index_values(label_volumes_ml(ed_case.label, ACDC_SPACING, classes),
                             label_volumes_ml(es_case.label, ACDC_SPACING, classes))
    assert abs(payload["lv_ef_percent"]["value"] - reference["lv_ef_percent"]) < 10
    if payload[INDICES[0]]["interval"] is not None:  # the shipped bundle carries a fitted rule
        assert all(payload[index]["interval"][0] <= payload[index]["value"] <= payload[index]["interval"][1]
                   for index in INDICES)
    printed = capsys.readouterr().out
    assert "LV ejection fraction (%)" in printed and f"function: {tmp_path / 'out' / 'function.json'}" in printed
    assert list((tmp_path / "out").iterdir()) == [tmp_path / "out" / "function.json"]  # no temporaries left


def test_the_command_on_a_multi_phase_dicom_cine(tmp_path, sample_acdc_dir, capsys):
    """A classic multi-phase cine series written from the sample's ES and ED (stored in that order, their trigger
    times and Instance Numbers saying ED came first): ED and ES are found by the LV blood pool, in time order, and
    function.json holds every phase's volumes with its trigger time."""
    files = [item for item in find_cases(sample_acdc_dir) if item.patient_id == "patient013"]
    ed_case, es_case = load_cases(sorted(files, key=lambda item: item.case_id), 4)
    phases = np.stack([es_case.image, ed_case.image])  # whole volumes: the input check judges each phase
    files = write_cine(tmp_path / "cine", phases, ImageGeometry(spacing=ACDC_SPACING), trigger_times_ms=[320.0, 0.0],
                       slope=1e-3)
    slices = len(phases[0])
    for index, path in enumerate(files):  # numbered in time order, as a scanner numbers them
        stored, position = divmod(index, slices)
        edit_file(path, InstanceNumber=(1 - stored) * slices + position + 1)
    assert command.main(["--bundle", "acdc_ce_dice", "--cine", str(tmp_path / "cine"), "--out-dir",
                         str(tmp_path / "out"), "--device", "cpu", "--report"]) == 0
    payload = json.loads((tmp_path / "out" / "function.json").read_text())
    assert payload["phases"] == {"ed": 0, "es": 1}
    page = (tmp_path / "out" / "report.html").read_text()  # --report: the table and the cine's volume curve
    assert "LV ejection fraction" in page and "data:image/png;base64," in page
    assert [row["trigger_time_ms"] for row in payload["phase_volumes"]] == [0.0, 320.0]
    volumes = [row["lv_ml"] for row in payload["phase_volumes"]]
    rule = load_bundle(resolve_bundle_path("acdc_ce_dice")).metadata.function_intervals
    intercept, slope = ((rule or {}).get("recalibration") or {}).get("lv_ed", (0.0, 1.0))
    assert volumes[0] > volumes[1]
    assert payload["lv_edv_ml"]["value"] == pytest.approx(intercept + slope * volumes[0])  # the rule's line, if any
    assert "ED = phase 0, the largest LV blood pool" in capsys.readouterr().out


def test_the_members_run_one_by_one_and_averaged_are_the_ensemble(sample_acdc_dir):
    """What the interval fit measures per member (CalibSegLib.cardiac.members) rebuilds what the shipped ensemble
    predicts: the same labels and probability sums on a cropped sample volume."""
    bundle = load_bundle(resolve_bundle_path("acdc_ce_dice"))
    case = load_cases([item for item in find_cases(sample_acdc_dir) if item.case_id == "patient013_frame01"], 4)[0]
    image = case.image[3:5, 64:192, 40:168]
    members = member_predictors(bundle, device="cpu")
    assert len(members) == bundle.metadata.ensemble_size == 3
    mean, labels = ensemble_labels([member.predict(image, case.spacing, keep_probabilities=True).probabilities
                                    for member in members], bundle)
    whole = Predictor(bundle, device="cpu").predict(image, case.spacing)
    assert np.mean(labels == whole.labels) > 0.9999
    assert np.allclose(mean.sum(axis=(1, 2, 3)), whole.probability_sums, rtol=1e-4)
