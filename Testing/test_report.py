"""The QC report page (``CalibSegLib.report``, ``slice_pictures``): the order of its cases, what each case
shows, that it is one self-contained file, the pictures' layers pixel by pixel, and the page as headless
Chromium renders it (skipped where Chromium is absent; ``.ci/run`` installs it)."""

from __future__ import annotations

import base64
import io
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
from matplotlib import colormaps
from matplotlib.image import imread

from CalibSegLib.io import ImageGeometry, write_image
from CalibSegLib.predict import main
from CalibSegLib.report import REPORT_NAME, ReportCase, lowest_predicted_dice, worst_first
from CalibSegLib.slice_pictures import HOT_SPOT_OPACITY, slice_picture
from Datasets.dataset_names import SAMPLE_DATA
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Reporting.chromium import CHROMIUM, screenshot
from tiny_bundles import make_test_bundle


class _Page(HTMLParser):
    """What a reader sees: section ids and classes in order, headings, images, and every tag and attribute."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.sections: list[tuple[str, str]] = []
        self.headings: list[str] = []
        self.images: list[str] = []
        self.tags: set[str] = set()
        self.links: list[str] = []
        self._heading: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attributes):
        values = dict(attributes)
        self.tags.add(tag)
        if tag == "section" and values.get("id", "").startswith("case-"):
            self.sections.append((values["id"], values.get("class", "")))
        if tag == "img":
            self.images.append(values["src"])
        if tag in ("a", "link", "script", "iframe") or "href" in values:
            self.links.append(values.get("href") or values.get("src") or "")
        if tag == "h2":
            self._heading = []

    def handle_data(self, data):
        if self._heading is not None:
            self._heading.append(data)

    def handle_endtag(self, tag):
        if tag == "h2" and self._heading is not None:
            self.headings.append("".join(self._heading).strip())
            self._heading = None


def _summary(dice: dict[str, float | None], suitable: bool | None = True, model: bool = True) -> dict:
    structures = {name: {"volume_ml": 10.0, "mean_confidence": None if value is None else 0.9,
                         "predicted_dice": value if model else None,
                         "predicted_dice_interval": [value - 0.05, min(value + 0.05, 1.0)]
                         if value is not None and model else None,
                         "review": (value is None or value < 0.8) if model else (value is None or None)}
                  for name, value in dice.items()}
    return {"input_check": {"suitable": suitable, "reasons": [] if suitable else ["it is too dark."]},
            "structures": structures, "review": any(entry["review"] for entry in structures.values()),
            "uncertain_slices": [], "slice_axis": 0, "hot_spot_level": 0.4,
            "quality_model": {"review_below": 0.8} if model else None}


def test_predict_names_the_page_as_the_report_module_does():
    from CalibSegLib import predict

    assert predict.REPORT_NAME == REPORT_NAME


def test_cases_go_failed_then_unsuitable_then_by_lowest_predicted_dice():
    cases = [ReportCase("good", _summary({"a": 0.95, "b": 0.9})),
             ReportCase("no model", _summary({"a": 0.5, "b": 0.9}, model=False)),
             ReportCase("missing b", _summary({"a": 0.95, "b": None})),
             ReportCase("dark", _summary({"a": 0.97, "b": 0.96}, suitable=False)),
             ReportCase("poor a", _summary({"a": 0.7, "b": 0.99})),
             ReportCase("broken", error="It is broken.")]
    assert [case.name for case in worst_first(cases)] == ["broken", "dark", "missing b", "poor a", "good",
                                                         "no model"]
    assert lowest_predicted_dice(cases[2].summary) == 0.0 and lowest_predicted_dice(cases[1].summary) is None


def test_a_picture_shows_outlines_in_class_colours_and_hot_spots_in_inferno():
    """Pixel by pixel against the layers computed here: grey image, inferno blended above the level,
    outlines."""
    image = np.tile(np.linspace(0, 100, 40, dtype=np.float32), (40, 1))
    labels = np.zeros((40, 40), np.uint8)
    labels[10:30, 10:30] = 1
    entropy = np.zeros((40, 40), np.float32)
    entropy[2:6, 30:36] = 0.7
    colors = [(0, 0, 0), (1.0, 0.0, 0.0)]
    picture = slice_picture(image, labels, entropy, (1.0, 1.0), (0.0, 100.0), colors, 0.4, size=40)
    assert picture.shape == (40, 40, 3) and picture.dtype == np.uint8
    assert tuple(picture[10, 20]) == (255, 0, 0) and tuple(picture[11, 20]) == (255, 0, 0)  # 2 px inside
    grey = round(255 * image[20, 20] / 100)
    assert tuple(picture[20, 20]) == (grey,) * 3
    assert tuple(picture[12, 20]) == (round(255 * image[12, 20] / 100),) * 3
    expected = (1 - HOT_SPOT_OPACITY) * image[3, 32] / 100 + HOT_SPOT_OPACITY * np.array(
        colormaps["inferno"]((0.7 - 0.4) / 0.6)[:3])
    np.testing.assert_allclose(picture[3, 32], np.round(255 * expected), atol=1)
    # Anisotropic pixels keep their physical aspect: 40 × 40 voxels of 2 × 1 mm are twice as tall as wide.
    tall = slice_picture(image, labels, entropy, (2.0, 1.0), (0, 100), colors, 0.4, size=40)
    assert tall.shape == (40, 20, 3)


@pytest.fixture(scope="module")
def sample_report(tmp_path_factory):
    """acdc_ce_dice over the two volumes of a test patient of the shipped models, as NIfTI, with --report."""
    folder = tmp_path_factory.mktemp("report")
    for case in load_cases([file for file in find_cases(SAMPLE_DATA) if file.patient_id == "patient041"], 4):
        write_image(folder / "cases" / f"{case.case_id}.nii.gz", case.image, ImageGeometry(case.spacing))
    assert main(["--bundle", "acdc_ce_dice", "--image-dir", str(folder / "cases"), "--out-dir",
                 str(folder / "out"), "--report", "--device", "cpu"]) == 0
    return folder / "out"


def test_the_page_puts_the_worst_case_first_with_its_flags_and_pictures(sample_report):
    text = (sample_report / REPORT_NAME).read_text()
    page = _Page(text)
    lowest = {}
    for name in ("patient041_frame01", "patient041_frame11"):
        lowest[name] = lowest_predicted_dice(json.loads((sample_report / f"{name}_summary.json").read_text()))
    worst, best = sorted(lowest, key=lowest.get)
    assert lowest[worst] < lowest[best]
    assert [heading.split(" ")[1] for heading in page.headings if heading[0].isdigit()] == [worst, best]
    assert [section for section, _ in page.sections] == ["case-1", "case-2"]
    summary = json.loads((sample_report / f"{worst}_summary.json").read_text())
    flagged = [name for name, entry in summary["structures"].items() if entry["review"]]
    assert flagged and page.headings[1] == f"1. {worst} REVIEW"  # after the overview's heading
    assert f"Review: {flagged[0]} (predicted Dice" in text
    assert "input suitable: like the model&#x27;s training volumes" in text
    assert len(page.images) == 6  # three worst slices per case


def test_the_page_is_one_self_contained_file_without_scripts(sample_report):
    page = _Page((sample_report / REPORT_NAME).read_text())
    assert not {"script", "iframe", "link", "object", "embed"} & page.tags
    assert all(link.startswith("#case-") for link in page.links)
    for source in page.images:
        assert source.startswith("data:image/png;base64,")
        picture = imread(io.BytesIO(base64.b64decode(source.split(",", 1)[1])), format="png")
        assert picture.ndim == 3 and min(picture.shape[:2]) > 50 and picture.std() > 0.05  # not blank


def test_a_failed_case_comes_first_with_its_sentence(tmp_path):
    make_test_bundle(tmp_path / "model.calibseg")
    rng = np.random.default_rng(7)
    for name in ("a", "b"):
        image = rng.normal(300, 60, (3, 24, 20)).astype(np.float32)
        write_image(tmp_path / "cases" / f"{name}.nii.gz", image, ImageGeometry((5.0, 1.2, 0.9)))
    (tmp_path / "cases" / "broken.nii.gz").write_bytes(b"not an image")
    assert main(["--bundle", str(tmp_path / "model.calibseg"), "--image-dir", str(tmp_path / "cases"),
                 "--out-dir", str(tmp_path / "out"), "--report", "--device", "cpu", "--batch-size", "2"]) == 2
    text = (tmp_path / "out" / REPORT_NAME).read_text()
    page = _Page(text)
    assert [classes for _, classes in page.sections] == ["failed", "case", "case"]
    assert page.headings[1].startswith("1. broken NOT SEGMENTED") and "Cannot read broken.nii.gz" in text
    assert "This bundle has no quality model" in text


def test_evaluate_report_shows_measured_beside_predicted_and_the_reliability_diagram(tmp_path):
    from Evaluation.evaluate import evaluate_bundle

    from CalibSegLib.bundle import load_bundle

    rng = np.random.default_rng(8)
    for patient in ("p1", "p2"):
        label = np.zeros((3, 24, 20), np.uint8)
        label[:, 4:12, 3:9], label[:, 12:20, 9:15], label[:, 5:9, 14:18] = 1, 2, 3
        image = rng.normal(300, 60, label.shape).astype(np.float32)
        write_image(tmp_path / "data" / f"{patient}_image.nii.gz", image, ImageGeometry((5.0, 1.2, 0.9)))
        write_image(tmp_path / "data" / f"{patient}_label.nii.gz", label, ImageGeometry((5.0, 1.2, 0.9)))
    bundle = load_bundle(make_test_bundle(tmp_path / "model.calibseg"))
    cases = load_cases(find_cases(tmp_path / "data"), 4)
    evaluate_bundle(bundle, cases, tmp_path / "evaluation", device="cpu", batch_size=2, report=True)
    text = (tmp_path / "evaluation" / REPORT_NAME).read_text()
    page = _Page(text)
    assert page.headings[0] == "The test set"
    assert "test, 2 volumes of 2 patients (means over the volumes)" in text
    assert page.images[0] == "data:image/png;base64," + base64.b64encode(
        (tmp_path / "evaluation" / "reliability.png").read_bytes()).decode()
    assert "<th>measured Dice</th><th>HD95 (mm)</th>" in text
    assert "Measured over the reference foreground: ECE" in text
    rows = (tmp_path / "evaluation" / "per_case.csv").read_text()
    assert "report.html" not in rows and len(page.sections) == 2


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs Debian's chromium)")
def test_chromium_renders_the_page_with_its_pictures_and_outlines(sample_report, tmp_path):
    picture = screenshot(sample_report / REPORT_NAME, tmp_path / "page.png", width=1000, height=1400)
    pixels = (imread(picture)[..., :3] * 255).round().astype(int)
    assert pixels.shape[:2] == (1400, 1000)
    white = (pixels > 245).all(axis=2)
    assert 0.05 < 1 - white.mean() < 0.9  # text, tables and pictures, neither blank nor a black screen
    # The pictures are drawn at their own size: the right ventricle's outline colour appears exactly.
    outline = np.round(255 * np.array([0.90, 0.30, 0.25])).astype(int)
    assert (np.abs(pixels - outline).max(axis=2) <= 2).sum() > 50


def _function(cine: bool = False, trigger_times: bool = False) -> dict:
    """A function.json dictionary (:meth:`CalibSegLib.cardiac.function.FunctionResult.to_json`'s shape) of made-up
    values; with ``cine`` 8 phases, LV 150 → 60 mL, RV 10 mL more, ED phase 0 and ES phase 4."""
    values = {"lv_edv_ml": (150.0, 140.0, 161.0), "lv_esv_ml": (60.0, 52.5, 66.0), "lv_sv_ml": (90.0, 80.0, 99.0),
              "lv_ef_percent": (60.0, 55.25, 64.75), "rv_edv_ml": (160.0, 150.0, 171.0),
              "rv_esv_ml": (80.0, 70.0, 90.0), "rv_ef_percent": (50.0, None, None),
              "myocardium_mass_g": (120.0, 110.0, 131.5)}
    function = {key: {"value": value, "interval": [low, high]} for key, (value, low, high) in values.items()}
    function.update(level=0.9, volumes_from="label voxels")
    if cine:
        lv = [150.0, 140.0, 110.0, 80.0, 60.0, 75.0, 110.0, 140.0]
        function["phases"] = {"ed": 0, "es": 4}
        function["phase_rule"] = "ED = phase 0, the largest LV blood pool (150.0 mL); ES = phase 4, the smallest"
        function["phase_volumes"] = [{"phase": index, "trigger_time_ms": 40.0 * index if trigger_times else None,
                                      "lv_ml": value, "rv_ml": value + 10} for index, value in enumerate(lv)]
    return function


def test_the_function_table_shows_every_index_with_its_interval():
    from CalibSegLib.interval_rule import INDEX_LABELS, INDICES
    from CalibSegLib.report import function_table_html

    text = function_table_html(_function())
    rows = re.findall(r"<tr><td>([^<]+)</td><td class=\"number\">([^<]+)</td><td class=\"number\">([^<]+)</td>"
                      r"<td>([^<]+)</td></tr>", text)
    assert [row[0] for row in rows] == [INDEX_LABELS[key][0] for key in INDICES]
    assert rows[3] == ("LV ejection fraction", "60.0", "55.2 – 64.8", "%")  # rounded as the value, 1 digit
    assert rows[6] == ("RV ejection fraction", "50.0", "–", "%")  # an interval with undefined ends
    assert "<th>90 % interval</th>" in text
    absent = dict(_function(), lv_ef_percent={"value": 60.0, "interval": None})  # a bundle without a rule
    assert "<td>LV ejection fraction</td><td class=\"number\">60.0</td><td class=\"number\">–</td>" in \
        function_table_html(absent)


def test_the_function_page_lists_the_reasons_to_review_escaped_and_none_without_them():
    from CalibSegLib.report import function_report_html

    reason = "The RV blood pool at ES is flagged for review (predicted Dice 0.75, below 0.88) <b>&"
    page = function_report_html(dict(_function(), review=[reason]), "acdc_ce_dice", "calibseg-function", "p041")
    assert ("<h2>Review before signing</h2><ul class=\"review\"><li>The RV blood pool at ES is flagged for review "
            "(predicted Dice 0.75, below 0.88) &lt;b&gt;&amp;</li></ul>") in page
    for quiet in (dict(_function(), review=[]), _function()):  # empty, and a file written before the list
        assert "Review before signing" not in function_report_html(quiet, "acdc_ce_dice", "calibseg-function")


def test_a_cine_page_draws_the_volume_curve_with_ed_and_es_marked(tmp_path):
    from CalibSegLib.report import phase_curve, volume_curve_png, write_function_report

    cine = _function(cine=True, trigger_times=True)
    x, lv, rv, label = phase_curve(cine)
    np.testing.assert_array_equal(x, 40.0 * np.arange(8))
    assert label == "trigger time (ms)" and lv[4] == 60.0 and rv[0] == 160.0
    assert phase_curve(_function(cine=True))[3] == "phase"
    picture = imread(io.BytesIO(volume_curve_png(cine)), format="png")
    assert picture.shape[:2] == (320, 640) and picture[..., :3].std() > 0.05
    # The LV curve is drawn in its colour, and the ED / ES marks move with the phases the file names.
    lv_red = np.all(np.abs(picture[..., :3] - np.array([0xc6, 0x28, 0x28]) / 255) < 0.02, axis=-1)
    assert lv_red.sum() > 200
    moved = dict(cine, phases={"ed": 1, "es": 5})
    assert not np.array_equal(imread(io.BytesIO(volume_curve_png(moved)), format="png"), picture)

    page = write_function_report(tmp_path / REPORT_NAME, cine, "acdc_ce_dice", "calibseg-function", "patient001")
    text = page.read_text()
    parsed = _Page(text)
    assert parsed.headings == ["Indices", "Volume over the cardiac cycle"]
    assert len(parsed.images) == 1 and parsed.links == [] and not {"script", "link", "iframe"} & parsed.tags
    assert parsed.images[0] == "data:image/png;base64," + base64.b64encode(volume_curve_png(cine)).decode()
    assert "a cine of 8 phases" in text and "ED = phase 0, the largest LV blood pool (150.0 mL)" in text
    assert "Each interval is meant to hold the true value for 90 % of patients" in text
    assert sorted(path.name for path in tmp_path.iterdir()) == [REPORT_NAME]  # no temporary left


def test_an_ed_es_page_has_the_table_and_no_curve():
    from CalibSegLib.report import function_report_html, volume_curve_png

    pair = _function()
    assert volume_curve_png(pair) is None
    page = _Page(function_report_html(pair, "acdc_ce_dice", "calibseg-function"))
    assert page.headings == ["Indices"] and page.images == []
    ruleless = dict(pair, intervals_absent="the bundle holds no fitted interval rule.")
    assert "No intervals: the bundle holds no fitted interval rule." in function_report_html(ruleless, "tiny", "x")
