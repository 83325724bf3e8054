"""A shipped ensemble re-recorded from the store (calibseg-ship --rerecord --store): the quality columns and the
quality section the store gives are those its networks give, on the test volumes and their degraded copies, and a
re-record from the store writes the metrics a re-record with the networks writes, number for number."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from CalibSegLib.analysis import analyse_case
from CalibSegLib.bundle import load_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.quality import summary_columns
from CalibSegLib.quality.fitting import fit_from_observations
from CalibSegLib.quality.model import APPLIED_TO, MEMBERS
from CalibSegLib.store import StoreError, read_records, record_path
from Datasets.acdc import ACDC_CLASS_NAMES, ACDC_TERMINOLOGY
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Datasets.splits import select_patients
from Evaluation.quality_report import DEGRADATIONS, degraded_rows
from Evaluation.stored_quality import stored_quality, stored_rows
from Reporting.ship import main as ship_main, rerecord
from Training.bundle_rewrite import rewrite_bundle
from Training.fit import largest_difference
from Training.store_pass import fill_store
from test_quality import _observations
from tiny_bundles import make_test_ensemble

NAME = "tiny_ensemble"
TEST_PATIENTS = ["patient022"]


def _quality_model(review_below: float = 0.8, by_structure: dict[str, float] | None = None):
    """A quality model over ACDC's structures, fitted on members (synthetic observations: Dice falls with the
    entropy)."""
    return fit_from_observations(_observations(lambda values: 1.0 - values["mean_entropy"], count=10, structures=3),
                                 ACDC_CLASS_NAMES, review_below, validation={APPLIED_TO: MEMBERS},
                                 review_below_by_structure=by_structure)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, sample_acdc_dir):
    """A shipped two-member ensemble with a quality model, its metrics recorded by its networks (calibseg-ship
    --rerecord), and the store of its test volumes and their degraded copies (calibseg-store)."""
    folder = tmp_path_factory.mktemp("stored_quality")
    pretrained = folder / "pretrained"
    pretrained.mkdir()
    make_test_ensemble(pretrained / f"{NAME}.calibseg", size=2, validation=(["patient013"], ["patient016"]),
                       class_names=list(ACDC_CLASS_NAMES), class_colors=[(0, 0, 0)] * 4,
                       class_terminology=ACDC_TERMINOLOGY, quality_model=_quality_model().to_dict(),
                       data={"dataset": "acdc", "train": ["patient013", "patient016"], "val": [],
                             "test": TEST_PATIENTS})
    (pretrained / f"{NAME}.metrics.json").write_text(json.dumps({"source_run": "tests"}))
    rerecord(NAME, out_dir=pretrained, data=sample_acdc_dir, device="cpu")  # the float16 file and its metrics
    for part in ("test", "degraded"):
        fill_store(pretrained / f"{NAME}.calibseg", folder / "store", sample_acdc_dir, device="cpu", part=part,
                   progress=lambda line: None)
    return pretrained, folder / "store"


def test_the_store_gives_the_quality_columns_the_networks_give(shipped, sample_acdc_dir):
    """Each test volume and each degraded copy analysed by the shipped ensemble itself (its Predictor, as
    calibseg-evaluate and calibseg-predict do) against the rows read from the store."""
    pretrained, store = shipped
    bundle = load_bundle(pretrained / f"{NAME}.calibseg")
    metadata = bundle.metadata
    cases = load_cases(select_patients(find_cases(sample_acdc_dir), TEST_PATIENTS), 4)
    names = [case.case_id for case in cases]
    predictor = Predictor(bundle, device="cpu")
    clean = [summary_columns(analyse_case(predictor, case.image, case.spacing).summary) for case in cases]
    stored = stored_rows(read_records(store, metadata.weights_sha256), metadata, names)
    assert largest_difference([{key: row[key] for key in columns} for row, columns in zip(stored, clean)],
                              clean) <= 1e-9
    for degradation in DEGRADATIONS:
        direct = degraded_rows(predictor, cases, degradation)
        from_store = stored_rows(read_records(store, metadata.weights_sha256, degradation), metadata, names)
        assert largest_difference([{key: row[key] for key in from_store[0]} for row in direct], from_store) <= 1e-9
    recorded = json.loads((pretrained / f"{NAME}.metrics.json").read_text())
    _, quality = stored_quality(metadata, str(store), names, [case.patient_id for case in cases])
    assert largest_difference(quality, recorded["quality"]) <= 1e-9


def test_a_rerecord_from_the_store_writes_what_the_networks_write(shipped, sample_acdc_dir, tmp_path):
    """A refitted quality model (other thresholds, one per structure) re-recorded both ways from the same shipped
    model: the same metrics JSON, the machine and the source aside."""
    pretrained, store = shipped
    shipped_bundle = load_bundle(pretrained / f"{NAME}.calibseg")
    refitted = _quality_model(0.6, {"right ventricle": 0.7, "myocardium": 0.5, "left ventricle": 0.65})
    replacement = rewrite_bundle(shipped_bundle, dataclasses.replace(shipped_bundle.metadata,
                                                                     quality_model=refitted.to_dict()),
                                 tmp_path / "refitted.calibseg")
    recorded = {}
    for way in ("networks", "store"):
        copy = shutil.copytree(pretrained, tmp_path / way)
        if way == "store":
            assert ship_main(["--rerecord", NAME, "--bundle", str(replacement), "--out", str(copy),
                              "--store", str(store)]) == 0
        else:
            rerecord(NAME, replacement, copy, sample_acdc_dir, device="cpu")
        recorded[way] = json.loads((copy / f"{NAME}.metrics.json").read_text())
        assert load_bundle(copy / f"{NAME}.calibseg").metadata.quality == refitted
    by_store, by_networks = recorded["store"], recorded["networks"]
    assert by_store.pop("quality_measured_from") == "store"
    for record in (by_store, by_networks):
        record.pop("environment")
    assert largest_difference(by_store, by_networks) <= 1e-9
    before = json.loads((pretrained / f"{NAME}.metrics.json").read_text())
    assert by_store["quality"]["review_below_by_structure"]["myocardium"] == 0.5
    assert largest_difference(before["quality"], by_store["quality"]) > 1e-9  # the thresholds moved the flags' counts


def test_a_rerecord_from_the_store_refuses_what_it_cannot_measure(shipped, tmp_path, capsys):
    pretrained, store = shipped
    shipped_bundle = load_bundle(pretrained / f"{NAME}.calibseg")
    warmer = rewrite_bundle(shipped_bundle, dataclasses.replace(shipped_bundle.metadata, temperature=1.7),
                            tmp_path / "warmer.calibseg")
    copy = shutil.copytree(pretrained, tmp_path / "copy")
    kept = (copy / f"{NAME}.metrics.json").read_bytes()
    with pytest.raises(SystemExit, match="^error: The bundle changes temperature, which the recorded metric rows "
                                         "depend on; re-record it with its networks"):
        ship_main(["--rerecord", NAME, "--bundle", str(warmer), "--out", str(copy), "--store", str(store)])
    with pytest.raises(SystemExit, match="^error: .* holds no record of the weights"):
        ship_main(["--rerecord", NAME, "--out", str(copy), "--store", str(tmp_path / "empty")])
    partial = shutil.copytree(store, tmp_path / "partial")
    weights = shipped_bundle.metadata.weights_sha256
    record = read_records(partial, weights, "gamma 3")[0]
    record_path(partial, weights, record.case, record.member, "gamma 3").unlink()
    with pytest.raises(SystemExit, match=f"^error: The store lacks the record of {record.case} \\(its copy under "
                                         "gamma 3\\)"):
        ship_main(["--rerecord", NAME, "--out", str(copy), "--store", str(partial)])
    with pytest.raises(SystemExit):
        ship_main(["--runs", str(tmp_path), "--store", str(store)])
    assert "--store measures a re-record" in capsys.readouterr().err
    assert (copy / f"{NAME}.metrics.json").read_bytes() == kept  # nothing written by a refusal
    assert sorted(path.name for path in copy.iterdir()) == sorted(path.name for path in pretrained.iterdir())


def test_a_store_of_other_predictions_is_refused(shipped, tmp_path):
    """A store whose ensemble measured another Dice than the recorded rows holds other predictions."""
    pretrained, store = shipped
    weights = load_bundle(pretrained / f"{NAME}.calibseg").metadata.weights_sha256
    other = shutil.copytree(store, tmp_path / "other")
    record = next(record for record in read_records(other, weights) if record.member == "ensemble")
    path = record_path(other, weights, record.case, record.member)
    values = json.loads(path.read_text())
    values["dice"] = list(np.asarray(values["dice"]) * 0.5 + 0.01)
    path.write_text(json.dumps(values))
    with pytest.raises(ValueError, match=f"^The store's ensemble measures another dice_right_ventricle on "
                                         f"{record.case} than the recorded metrics"):
        rerecord(NAME, out_dir=shutil.copytree(pretrained, tmp_path / "copy"), store=other)
    values.pop("voxels")
    path.write_text(json.dumps(values))
    with pytest.raises(StoreError, match=f"ensemble record of {record.case} \\(the test volumes\\) does not say"):
        rerecord(NAME, out_dir=tmp_path / "copy", store=other)
