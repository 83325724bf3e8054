"""The measured tables of README.md and docs/*.md equal what their recorded files give
(Reporting/readme_tables.py), every generated block has a generator, and the generator leaves blocks without a
record alone."""

from __future__ import annotations

import importlib
import json
import re

import pytest

from tiny_bundles import make_test_bundle
from conftest import REPO_ROOT
from Reporting import readme_tables
from benchmarks.record import write_record

README = (REPO_ROOT / "README.md").read_text()
DOCUMENTS = {document: document.read_text() for document in readme_tables.DOCUMENTS}


def _block(text: str, name: str) -> str:
    return next(text[start:end] for found, start, end in readme_tables.blocks(text) if found == name)


@pytest.mark.parametrize("document", list(DOCUMENTS), ids=lambda path: path.name)
def test_generated_blocks_equal_what_their_records_give(document):
    text = DOCUMENTS[document]
    regenerated, rebuilt, skipped = readme_tables.regenerate(text, tables=readme_tables.DOCUMENTS[document])
    # every document's records are in the repository (the shipped models' metrics files, docs/records), so each
    # document has blocks that are rebuilt, not merely left alone
    assert rebuilt
    for name in rebuilt:
        assert _block(text, name) == _block(regenerated, name), (
            f"{document.name}'s {name} table differs from its records; run python -m Reporting.readme_tables")
    assert set(rebuilt) | set(skipped) == {name for name, _, _ in readme_tables.blocks(text)}


@pytest.mark.parametrize("document", list(DOCUMENTS), ids=lambda path: path.name)
def test_every_marker_pair_has_a_generator_and_every_generator_a_block(document):
    text = DOCUMENTS[document]
    names = [name for name, _, _ in readme_tables.blocks(text)]
    assert len(names) == len(set(names))
    assert set(names) == set(readme_tables.DOCUMENTS[document])
    # no stray marker outside the pairs (a typo in begin/end would hide a block)
    assert len(re.findall(r"<!-- generated:", text)) == 2 * len(names)


def test_a_changed_number_is_caught():
    block = _block(README, "shipped_models")
    number = re.search(r"\| 0\.\d{3} \|", block).group(0)
    tampered = README.replace(block, block.replace(number, "| 0.999 |", 1))
    assert tampered != README
    assert readme_tables.regenerate(tampered)[0] == README


def test_missing_record_leaves_its_block_and_present_one_is_rebuilt(tmp_path):
    (tmp_path / "present.json").write_text("{}")
    tables = {"present": readme_tables.Table(("present.json",), lambda paths: [f"| rows from {paths[0].name} |"]),
              "absent": readme_tables.Table(("absent.json",), lambda paths: ["never"])}
    text = ("intro\n<!-- generated:present begin -->\nold\n<!-- generated:present end -->\nmiddle\n"
            "<!-- generated:absent begin -->\nhand-written\n<!-- generated:absent end -->\nend\n")
    new, rebuilt, skipped = readme_tables.regenerate(text, tmp_path, tables)
    assert (rebuilt, skipped) == (["present"], ["absent"])
    assert new == text.replace("\nold\n", "\n| rows from present.json |\n")


@pytest.mark.parametrize("text,message", [
    ("<!-- generated:a begin -->\nx\n", "has no end marker"),
    ("<!-- generated:a begin -->\n<!-- generated:b begin -->\n", "does not pair up"),
    ("<!-- generated:a end -->\n", "does not pair up"),
    ("<!-- generated:unknown begin -->\n<!-- generated:unknown end -->\n", "has no generator"),
])
def test_bad_markers_are_one_sentence(text, message):
    with pytest.raises(ValueError, match=message) as caught:
        readme_tables.regenerate(text)
    assert "\n" not in str(caught.value)


def _metrics_record(name: str) -> dict:
    summary = {"dice_mean": 0.8123, "hd95_mean": 12.345, "ece": 0.1, "tace": 0.2, "error_auroc": 0.9}
    return {"model": name, "temperature": 1.5, "cases": ["p1_frame01", "p1_frame12"],
            "summary": {"scaled": {**summary, "ece": 0.05}, "uncalibrated": summary},
            "spearman_entropy_vs_dice": {"scaled": -0.5, "uncalibrated": -0.61}}


def test_shipped_models_table_from_metrics_and_bundle(tmp_path):
    make_test_bundle(tmp_path / "tiny.calibseg", half=True,
                     data={"dataset": "acdc", "split_file": "acdc.json", "train": [], "val": [], "test": ["p1"]})
    (tmp_path / "tiny.metrics.json").write_text(json.dumps(_metrics_record("tiny")))
    lines = readme_tables.shipped_models_table([tmp_path / "tiny.metrics.json"])
    assert lines[-1] == "| `tiny` | 0.812 | 12.35 | 0.100 | 0.200 | 0.050 (T = 1.50) | 0.900 | -0.61 |"
    assert "2 test volumes (1 test patients of `acdc.json`)" in lines[0]


def test_shipped_quality_table_from_the_recorded_quality_report(tmp_path):
    def statistics(spearman, mae, poor, flagged, flagged_poor):
        return {"spearman": spearman, "mae": mae, "poor": poor, "flagged": flagged, "flagged_poor": flagged_poor,
                "cases": poor + 2, "mean_predicted": 0.9, "mean_measured": 0.85, "review_auroc": 0.7,
                "predicted_dice_auroc": 0.8, "interval_coverage": 0.75}

    clean = {"right ventricle": statistics(0.71, 0.051, 3, 2, 2),
             "myocardium": {**statistics(0.6, 0.04, 5, 4, 3), "spearman_interval": [0.3, 0.8]},
             "all structures": statistics(0.8, 0.045, 8, 6, 5)}
    degraded = {"all structures": statistics(0.5, 0.2, 40, 38, 37)}
    record = {**_metrics_record("tiny"), "quality": {"review_below": 0.86, "clean": clean,
                                                     "degraded": {"gamma 3": degraded, "degraded (all)": degraded}}}
    (tmp_path / "tiny.metrics.json").write_text(json.dumps(record))
    lines = readme_tables.shipped_quality_table([tmp_path / "tiny.metrics.json"])
    assert lines[0] == ("| Model | right ventricle: ρ / MAE | myocardium: ρ / MAE | review below | "
                        "flagged, test volumes | flagged, degraded copies |")
    assert lines[2] == ("| `tiny` | +0.71 / 0.051 | +0.60 / 0.040 | 0.86 | 5 of 8 poor, 1 other | "
                        "37 of 40 poor, 1 other |")
    assert "poor: measured Dice below 0.80;" in lines[-1]  # poor is fixed, whatever the model's threshold

    report = readme_tables.shipped_quality_report([tmp_path / "tiny.metrics.json"])
    myocardium = "| tiny | myocardium | 7 | +0.60 | +0.30 to +0.80 | 0.040 | 0.900 / 0.850 | 3 / 5 | 1 |"
    assert myocardium in "\n".join(report)
    # a report written before ρ's interval was measured says so instead of failing
    assert any(line.startswith("| tiny | gamma 3 | 42 | +0.50 | n/a | 0.200 |") for line in report)
    (tmp_path / "tiny.metrics.json").write_text(json.dumps(_metrics_record("tiny")))  # no quality report
    assert readme_tables.shipped_quality_report([tmp_path / "tiny.metrics.json"]) == [
        "*No shipped model carries a quality report.*"]


def _finished_run(folder, wall_s=100.0):
    """A run folder with the run.json and evaluation/summary.json a finished quick-start run writes."""
    from Training.records import RunSummary

    run = RunSummary(method="crac", config={}, bundle="model.calibseg", best_epoch=7, best_validation_dice=0.4567,
                     epochs=10, steps=1000, training_wall_s=wall_s, finish_wall_s=20.0, choices={}, loss_state={},
                     environment={"device": "cpu", "cpu_count": 2, "torch": "2.13.0"})
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(run.to_json()))
    variant = {"per_metric": {"dice_mean": {"mean": 0.5}, "hd95_mean": {"mean": 40.04}, "ece": {"mean": 0.3}},
               "pooled_calibration": {"ece": 0.25}}
    (folder / "evaluation").mkdir()
    (folder / "evaluation" / "summary.json").write_text(json.dumps({
        "cases": ["a", "b", "c", "d"], "patients": ["p1", "p2"], "temperature": 0.5, "wall_s": 30.0,
        "scaled": variant, "uncalibrated": {**variant, "per_metric": {**variant["per_metric"], "ece": {"mean": 0.2}}}}))
    return folder


def test_quick_start_record_replaces_its_command_and_gives_the_row(tmp_path):
    record = tmp_path / "records" / "quick_start.json"
    readme_tables.record_quick_start(_finished_run(tmp_path / "a"), "Training/train.py", None, record)
    readme_tables.record_quick_start(_finished_run(tmp_path / "b", wall_s=200.0), "Training/train.py", 283.4, record)
    runs = json.loads(record.read_text())["runs"]
    assert len(runs) == 1 and runs[0]["wall_s"] == 283.4 and runs[0]["wall_measured"] == "the command (measured)"
    lines = readme_tables.quick_start_table([record])
    assert lines[2] == ("| `Training/train.py` | 4 min 43 s | 0.457 (7 of 10) | "
                        "0.500 / 40.0 mm / 0.300 (T = 0.50) | 0.200 |")
    assert "4 volumes of 2 patients" in lines[-1]
    logged = readme_tables.quick_start_entry(tmp_path / "a", "x")
    assert logged["wall_s"] == 100.0 + 20.0 + 30.0 and "logged" in logged["wall_measured"]
    with pytest.raises(ValueError, match="no finished run"):
        readme_tables.quick_start_entry(tmp_path, "x")


_BENCHMARK_RESULTS = {
    "metrics": ({"shape": [40, 500, 500], "foreground_voxels": 1, "chunks": 40, "reference_s": 2.0,
                 "streaming_s": 3.0, "peak_bytes": 2**20 * 100, "probability_bytes": 2**20 * 200}, "| 1.50× time |"),
    "losses": ({"shape": [16, 4, 192, 192], "step_s": 0.5,
                "losses": {"ce": 0.01, "nacl": 0.035, "crac": 0.06, "bwcr": 0.3}},
               "| crac | 0.0600 | 6.00 | +10.0 % |"),
    "inference": ({"batch_size": 16, "repeats": 1, "runs": [{"case": "acdc", "shape": [10, 256, 256], **{
        pipeline: {"seconds": seconds, "peak_rss_gb": 0.5, "peak_gpu_gb": None, "mean_confidence": 0.7,
                   "label_fractions": [1.0, 0, 0, 0], "device": "cpu"}
        for pipeline, seconds in (("calibseg", 1.0), ("monai", 2.0))}}]}, "| 0.50× | 0.50 / 0.50 GB |"),
    "training_throughput": ({"method": "crac", "steps": 10, "cpu_capability": "AVX2", "settings": [
        {"setting": "fp32", "crops_per_s": 20.0, "data_wait": 0.01, "warmup_s": 3, "threads": 2},
        {"setting": "compile", "crops_per_s": 30.0, "data_wait": 0.0, "warmup_s": 40, "threads": 2}]},
        "| compile | 30.0 | 1.50× |"),
    "mirror_agreement": ({"slices": 10, "side": 256, "passes": 4, "repeats": 3, "reference_s": 2.0,
                          "agreement_s": 2.1}, "| 2.10 s | without it: 2.00 s | 1.05× time | ≤ 1.1× |"),
}


@pytest.mark.parametrize("name", list(_BENCHMARK_RESULTS))
def test_benchmark_records_give_their_tables(name, tmp_path):
    results, expected = _BENCHMARK_RESULTS[name]
    record = {"benchmark": name, "command": f"benchmarks/{name}.py", "recorded": "2025-01-02",
              "environment": {"device": "cpu", "cpu": "x86_64", "cpu_count": 2, "torch_threads": 2, "torch": "2.13.0",
                              "platform": "Linux"}, "results": results}
    path = tmp_path / "docs" / "records" / f"benchmark_{name}.json"
    path.parent.mkdir(parents=True)
    write_record(path, record, importlib.import_module(f"benchmarks.{name}").record_table(record))
    text = f"<!-- generated:benchmark_{name} begin -->\n<!-- generated:benchmark_{name} end -->\n"
    new, rebuilt, _ = readme_tables.regenerate(text, tmp_path)
    assert rebuilt == [f"benchmark_{name}"] and expected in new
    assert f"`python benchmarks/{name}.py` on the CPU (x86_64, 2 cores, 2 torch threads" in new


def test_a_benchmark_record_without_its_table_is_one_sentence(tmp_path):
    path = tmp_path / "docs" / "records" / "benchmark_inference.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"benchmark": "inference", "results": {}}))
    text = "<!-- generated:benchmark_inference begin -->\n<!-- generated:benchmark_inference end -->\n"
    with pytest.raises(ValueError, match=r"^benchmark_inference.json holds no table; run python -m "
                                         r"benchmarks.inference --record .* again\.$"):
        readme_tables.regenerate(text, tmp_path)


def test_the_results_page_stays_a_page_of_at_most_500_lines():
    """Results, not their history: how each choice was made belongs in docs/decisions.md."""
    assert len(readme_tables.RESULTS_PAGE.read_text().splitlines()) <= 500
