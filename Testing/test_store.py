"""The store (CalibSegLib.store, calibseg-store) and the fits that read it (calibseg-fit): a tiny ensemble's pass
over sample ACDC patients against the collection and observations the fits read before the store, its records
validated on read, and each fit of the table from a small store fixture against its function called directly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from CalibSegLib.bundle import load_bundle
from CalibSegLib.cardiac.members import member_predictors
from CalibSegLib.quality import Observation, observe_cases
from CalibSegLib.store import ENSEMBLE, OUT_OF_FOLD, TEST, StoreError, StoreRecord, read_records, record_path, \
    write_record
from Datasets.acdc import ACDC_CLASS_NAMES, ACDC_TERMINOLOGY
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Datasets.splits import select_patients
from Evaluation.function_intervals import (attach_predicted_dice, collect_volumes, fit_and_measure, read_collected,
                                           stored_collection, stored_records)
from Training.ensemble import quality_from_observations
from Training.fit import FITS, FitInputs, largest_difference, main as fit_main, refit
from Training.store_pass import fill_store, main as store_main
from test_cardiac_fit import _observations, _records
from tiny_bundles import make_test_bundle, make_test_ensemble

OUT_OF_FOLD_PATIENTS = (["patient013"], ["patient016"])
TEST_PATIENTS = ["patient022"]


@pytest.fixture(scope="module")
def tiny_ensemble(tmp_path_factory, sample_acdc_dir):
    """Two tiny members over ACDC's classes, each never trained on one sample patient, one test patient; its
    store filled by calibseg-store."""
    folder = tmp_path_factory.mktemp("store")
    path = make_test_ensemble(folder / "tiny.calibseg", size=2, validation=OUT_OF_FOLD_PATIENTS,
                              class_names=list(ACDC_CLASS_NAMES), class_colors=[(0, 0, 0)] * 4,
                              class_terminology=ACDC_TERMINOLOGY,
                              data={"dataset": "acdc", "train": ["patient013", "patient016"], "val": [],
                                    "test": TEST_PATIENTS})
    written = fill_store(path, folder / "store", sample_acdc_dir, device="cpu", progress=lambda line: None)
    return path, folder / "store", written


def test_the_pass_writes_one_record_per_out_of_fold_and_test_prediction(tiny_ensemble, sample_acdc_dir):
    path, store, written = tiny_ensemble
    bundle = load_bundle(path)
    records = read_records(store, bundle.metadata.weights_sha256)
    assert written == len(records) == 2 * 2 + 2 * 3  # two volumes each: one member out of fold; two + ensemble
    out_of_fold = {(record.patient, record.member) for record in records if record.role == OUT_OF_FOLD}
    assert out_of_fold == {("patient013", 0), ("patient016", 1)}
    tested = {record.member for record in records if record.role == TEST}
    assert tested == {0, 1, ENSEMBLE}
    quiet = {"device": "cpu", "progress": lambda line: None}
    assert fill_store(path, store, sample_acdc_dir, **quiet) == 0  # resumed: nothing left
    first = record_path(store, bundle.metadata.weights_sha256, records[0].case, records[0].member)
    first.unlink()
    assert fill_store(path, store, sample_acdc_dir, **quiet) >= 1
    assert first.is_file()


def test_a_record_is_the_observation_and_the_collection_of_the_same_prediction(tiny_ensemble, sample_acdc_dir,
                                                                                tmp_path):
    """What the quality fit read (observe_cases) and the function fit read (collect_volumes) before the store,
    computed by their own code: the store gives both, number for number."""
    path, store, _ = tiny_ensemble
    bundle = load_bundle(path)
    records = read_records(store, bundle.metadata.weights_sha256)
    predictor = member_predictors(bundle, device="cpu")[1]
    cases = load_cases(select_patients(find_cases(sample_acdc_dir), OUT_OF_FOLD_PATIENTS[1]), 4)
    for case, observation in zip(cases, observe_cases(predictor, cases)):
        stored, = [record for record in records if record.key == (case.case_id, 1)]
        assert stored.features == observation.features
        np.testing.assert_array_equal(stored.dice, observation.dice)
    collect_volumes(bundle, tmp_path, sample_acdc_dir, device="cpu", progress=lambda line: None)
    collected = read_collected(tmp_path, bundle.metadata.weights_sha256)
    assert stored_collection(records) == [{key: value for key, value in record.items()} for record in collected]


def _fixture_store(tmp_path, rng: np.random.Generator) -> tuple[list[dict], list[StoreRecord]]:
    """The function fit's synthetic collection with quality observations (test_cardiac_fit's), as store records."""
    collected = _records(rng, "oof", 14, 1) + _records(rng, "test", 3, 5)
    _observations(rng, collected, tmp_path / "observations")
    records = []
    for entry in collected:
        side = "out_of_fold" if entry["side"] == "oof" else "test"
        for member, volumes in entry["members"].items():
            observed = json.loads((tmp_path / "observations" / side / f"{entry['case']}.member{member}.json")
                                  .read_text())
            records.append(StoreRecord(entry["case"], entry["patient"], int(member), side, "abc",
                                       observed["dice"], observed["features"], volumes, entry["reference"]))
        if "ensemble" in entry:
            records.append(StoreRecord(entry["case"], entry["patient"], ENSEMBLE, TEST, "abc", [0.0] * 3,
                                       [None] * 3, entry["ensemble"], entry["reference"]))
    for record in records:
        write_record(tmp_path / "store", record)
    return collected, records


def test_each_fit_reads_the_store_as_its_function_reads_its_inputs(tmp_path):
    """Every fit of calibseg-fit's table on a small store: the function interval rule is the collection's (with
    and without predicted Dice), the quality model the one fitted on the same observations."""
    from types import SimpleNamespace

    from cardiac_standins import cardiac_metadata
    from CalibSegLib.quality.fitting import fit_from_observations
    from CalibSegLib.quality.model import APPLIED_TO, MEMBERS

    collected, records = _fixture_store(tmp_path, np.random.default_rng(3))
    assert set(FITS) == {"quality_model", "function_intervals"}
    stored = read_records(tmp_path / "store", "abc")
    assert stored_collection(stored) == collected
    observations = [Observation(record.patient, record.features, np.asarray(record.dice))
                    for record in sorted(stored, key=lambda record: (str(record.member), record.case))
                    if record.role == OUT_OF_FOLD]
    model = fit_from_observations(observations, ACDC_CLASS_NAMES, validation={APPLIED_TO: MEMBERS})
    metadata = cardiac_metadata(quality_model=model.to_dict(), ensemble={"members": [{}] * 5}, weights_sha256="abc")
    bundle = SimpleNamespace(metadata=metadata)
    with_dice = stored_records(bundle, tmp_path / "store", predicted_dice=True)
    assert with_dice == attach_predicted_dice(collected, tmp_path / "observations", bundle)
    inputs = FitInputs(metadata, stored, lambda: with_dice)
    section, _ = FITS["function_intervals"](inputs)
    assert section == fit_and_measure(with_dice)[0].to_dict()
    section, record = FITS["quality_model"](inputs)
    expected, expected_record = quality_from_observations(observations, ACDC_CLASS_NAMES, 5)
    assert largest_difference(section, expected.to_dict()) == 0.0 and record == expected_record
    assert section["review_below"] == expected.review_below


def test_refit_checks_and_writes_through_the_one_rewrite(tiny_ensemble, tmp_path, capsys):
    path, store, _ = tiny_ensemble
    with pytest.raises(SystemExit, match="^error: Only 2 out-of-fold patients are collected"):
        fit_main(["--bundle", str(path), "--store", str(store), "--sections", "function_intervals", "--check"])
    with pytest.raises(SystemExit, match="^error: .* holds no record of the weights"):
        fit_main(["--bundle", str(path), "--store", str(tmp_path / "empty")])
    with pytest.raises(KeyError, match="No fit of section temperature"):
        refit(path, store, ["temperature"])
    with pytest.raises(SystemExit, match="^error: .*is no cross-validation ensemble"):
        store_main(["--bundle", str(make_test_bundle(tmp_path / "single.calibseg")), "--store", str(tmp_path)])


def test_a_record_is_read_only_as_its_version_writes_it(tmp_path):
    record = StoreRecord("c_frame01", "c", 0, OUT_OF_FOLD, "abc", [0.9], [{"voxels": 3.0}])
    path = write_record(tmp_path, record)
    (path.parent / f".{path.name}.tmp.json").write_text("{")  # an interrupted write's temporary: not a record
    assert read_records(tmp_path, "abc") == [record]
    for change, message in (({"version": 0}, "is store version 0, this CalibSeg reads version 1"),
                            ({"member": -1}, "has member -1, neither a member number nor 'ensemble'"),
                            ({"role": "train"}, "has role 'train'"), ({"dice": "high"}, "has no list of measured"),
                            ({"features": []}, "has no quality features of each of its 1 classes"),
                            ({"weights_sha256": "other"}, "is a record of other weights")):
        path.write_text(json.dumps({**record.to_dict(), **change}))
        with pytest.raises(StoreError, match=message):
            read_records(tmp_path, "abc")
    path.write_text('{"version": 1, "case"')
    with pytest.raises(StoreError, match="cannot be read as JSON"):
        read_records(tmp_path, "abc")
