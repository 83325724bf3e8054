"""The store (CalibSegLib.store, calibseg-store) and the fits that read it (calibseg-fit): a tiny ensemble's pass
over sample ACDC patients against the volumes and observations the fits read, computed by their own code, its records
validated on read, and each fit of the table from a small store fixture against its function called directly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from CalibSegLib.bundle import load_bundle
from CalibSegLib.cardiac.indices import ProbabilityTally, cardiac_classes, label_volumes_ml, phase_volumes
from CalibSegLib.cardiac.members import member_predictors
from CalibSegLib.inference import Predictor
from CalibSegLib.quality import Observation, observe_cases
from CalibSegLib.store import ENSEMBLE, OUT_OF_FOLD, TEST, StoreError, StoreRecord, input_record_path, \
    read_fit_records, read_input_records, read_records, record_path, write_record
from Datasets.acdc import ACDC_CLASS_NAMES, ACDC_TERMINOLOGY
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Datasets.splits import select_patients
from Evaluation.quality_report import DEGRADATIONS
from Evaluation.function_intervals import attach_observed_dice, fit_and_measure, stored_collection, stored_records
from Training.ensemble import quality_from_observations
from Training.fit import FITS, FitInputs, largest_difference, main as fit_main, refit
from Training.fit_input_check import refit_input_check
from Training.store_pass import fill_store, main as store_main
from test_cardiac_fit import _records, observations
from tiny_bundles import ensemble_section, make_test_bundle, make_test_ensemble

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
    assert len(records) == 2 * 2 + 2 * 3  # two volumes each: one member out of fold; two + ensemble
    degraded = {name: read_records(store, bundle.metadata.weights_sha256, name) for name in DEGRADATIONS}
    assert {len(copies) for copies in degraded.values()} == {2 * 3}  # the test volumes' copies: two + ensemble
    assert all(record.degradation == name and record.role == TEST for name, copies in degraded.items()
               for record in copies)
    inputs = read_input_records(store, bundle.metadata.weights_sha256)
    assert written == len(records) + 3 * 6 + len(inputs) == 10 + 18 + 6
    assert all(record.voxels is not None and len(record.voxels) == 3 for record in records)
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
    ensemble = next(record for record in records if record.member == ENSEMBLE)
    uncounted = record_path(store, bundle.metadata.weights_sha256, ensemble.case, ENSEMBLE)
    uncounted.write_text(json.dumps({**ensemble.to_dict(), "voxels": None}))
    assert fill_store(path, store, sample_acdc_dir, part="test", **quiet) == 3  # the case predicted anew
    assert read_records(store, bundle.metadata.weights_sha256) == records


def test_a_record_is_the_observation_and_the_volumes_of_the_same_prediction(tiny_ensemble, sample_acdc_dir):
    """What the quality fit reads (observe_cases) and the function fit reads (the structures' volumes, hard, soft
    and spread, of a member's prediction and of the ensemble's own Predictor), computed by their own code: the
    store gives both."""
    path, store, _ = tiny_ensemble
    bundle = load_bundle(path)
    records = {record.key: record for record in read_records(store, bundle.metadata.weights_sha256)}
    classes = cardiac_classes(bundle.metadata.class_names, bundle.metadata.class_terminology)
    predictor = member_predictors(bundle, device="cpu")[1]
    cases = load_cases(select_patients(find_cases(sample_acdc_dir), OUT_OF_FOLD_PATIENTS[1]), 4)
    for case, observation in zip(cases, observe_cases(predictor, cases)):
        stored = records[(case.case_id, 1)]
        assert stored.features == observation.features
        np.testing.assert_array_equal(stored.dice, observation.dice)
        tally = ProbabilityTally(4)
        labels = predictor.predict(case.image, case.spacing, probability_sink=tally).labels
        assert stored.volumes == phase_volumes(labels, tally, case.spacing, classes).to_dict()
        assert stored.reference_ml == label_volumes_ml(case.label, case.spacing, classes)
    ensemble = Predictor(bundle, device="cpu")
    for case in load_cases(select_patients(find_cases(sample_acdc_dir), TEST_PATIENTS), 4):
        prediction = ensemble.predict(case.image, case.spacing, keep_probabilities=True)
        expected = phase_volumes(prediction.labels, ProbabilityTally(4).add_volume(prediction.probabilities),
                                 case.spacing, classes).to_dict()
        stored = records[(case.case_id, ENSEMBLE)].volumes
        for structure, volumes in expected.items():
            assert stored[structure]["hard"] == volumes["hard"] and stored[structure].keys() == volumes.keys()
            for name in ("soft", "spread"):
                assert stored[structure][name] == pytest.approx(volumes[name], rel=1e-6)


def _fixture_store(tmp_path, rng: np.random.Generator) -> tuple[list[dict], list[StoreRecord], list[dict], list[dict]]:
    """The function fit's synthetic per-volume records (test_cardiac_fit's) as store records, with their quality
    observations out of fold and on the test volumes."""
    collected = _records(rng, "oof", 14, 1) + _records(rng, "test", 3, 5)
    fitted, tested = observations(rng, collected)
    observed = {(item["case"], item["member"]): item for item in fitted + tested}
    records = []
    for entry in collected:
        role = OUT_OF_FOLD if entry["side"] == "oof" else TEST
        for member, volumes in entry["members"].items():
            item = observed[(entry["case"], int(member))]
            records.append(StoreRecord(entry["case"], entry["patient"], int(member), role, "abc", item["dice"],
                                       item["features"], volumes, entry["reference"]))
        if "ensemble" in entry:
            records.append(StoreRecord(entry["case"], entry["patient"], ENSEMBLE, TEST, "abc", [0.0] * 3,
                                       [None] * 3, entry["ensemble"], entry["reference"]))
    for record in records:
        write_record(tmp_path / "store", record)
    return collected, records, fitted, tested


def test_each_fit_reads_the_store_as_its_function_reads_its_inputs(tmp_path):
    """Every fit of calibseg-fit's table on a small store: the function interval rule is the collection's (with
    and without predicted Dice), the quality model the one fitted on the same observations."""
    from types import SimpleNamespace

    from cardiac_standins import cardiac_metadata
    from CalibSegLib.quality.fitting import fit_from_observations
    from CalibSegLib.quality.model import APPLIED_TO, MEMBERS

    collected, records, fitted, tested = _fixture_store(tmp_path, np.random.default_rng(3))
    assert set(FITS) == {"quality_model", "function_intervals", "input_statistics"}
    stored = read_records(tmp_path / "store", "abc")
    assert stored_collection(stored) == collected
    observations = [Observation(record.patient, record.features, np.asarray(record.dice))
                    for record in sorted(stored, key=lambda record: (str(record.member), record.case))
                    if record.role == OUT_OF_FOLD]
    model = fit_from_observations(observations, ACDC_CLASS_NAMES, validation={APPLIED_TO: MEMBERS})
    metadata = cardiac_metadata(quality_model=model.to_dict(), ensemble_size=5, ensemble=ensemble_section(5),
                                weights_sha256="abc")
    bundle = SimpleNamespace(metadata=metadata)
    with_dice = stored_records(bundle, tmp_path / "store", predicted_dice=True)
    assert with_dice == attach_observed_dice(collected, fitted, tested, bundle, "the store")
    inputs = FitInputs(metadata, lambda: stored, lambda: with_dice, lambda: [])
    section, _ = FITS["function_intervals"](inputs)
    assert section == fit_and_measure(with_dice)[0].to_dict()
    section, record = FITS["quality_model"](inputs)
    folds = [sorted({record.patient for record in stored if record.role == OUT_OF_FOLD and record.member == member})
             for member in range(5)]
    expected, expected_record = quality_from_observations(observations, ACDC_CLASS_NAMES, folds)
    assert largest_difference(section, expected.to_dict()) == 0.0 and record == expected_record
    assert section["review_below"] == expected.review_below


def test_refit_checks_and_writes_through_the_one_rewrite(tiny_ensemble, tmp_path, capsys):
    path, store, _ = tiny_ensemble
    with pytest.raises(SystemExit, match="^error: Only 2 out-of-fold patients are stored"):
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


def test_a_sub_ensemble_fits_on_the_out_of_fold_records_of_the_ensemble_it_keeps_members_of(tmp_path):
    def record(case, member, role, weights):
        return StoreRecord(case, case[:4], member, role, weights, [0.9], [{"voxels": 3.0}])

    for item in (record("a_01", 0, OUT_OF_FOLD, "sub"), record("t_01", 0, TEST, "sub"),
                 record("t_01", ENSEMBLE, TEST, "sub"), record("a_01", 0, OUT_OF_FOLD, "five"),
                 record("b_01", 4, OUT_OF_FOLD, "five"), record("t_01", 0, TEST, "five")):
        write_record(tmp_path, item)
    read = read_fit_records(tmp_path, "sub", "five")
    assert [(item.case, item.member, item.role, item.weights_sha256) for item in read] == [
        ("a_01", 0, OUT_OF_FOLD, "five"), ("b_01", 4, OUT_OF_FOLD, "five"), ("t_01", 0, TEST, "sub"),
        ("t_01", ENSEMBLE, TEST, "sub")]
    assert read_fit_records(tmp_path, "five", "five") == read_records(tmp_path, "five")
    with pytest.raises(StoreError, match=r"holds no record of the ensemble these members were selected from "
                                         r"\(weights other…\), whose out-of-fold predictions the fits read; fill it"):
        read_fit_records(tmp_path, "sub", "other")
    write_record(tmp_path, record("t_01", 0, TEST, "tested"))  # an origin with records, none of them out of fold
    with pytest.raises(StoreError, match=r"holds no record of the ensemble these members were selected from "
                                         r"\(weights tested…\)"):
        read_fit_records(tmp_path, "sub", "tested")


INPUT_FOLDS = (["patient013", "patient016", "patient022"], ["patient036", "patient041", "patient054"])


@pytest.fixture(scope="module")
def input_ensemble(tmp_path_factory, sample_acdc_dir):
    """Two tiny members, each trained on three sample patients and never on the other three, one test patient;
    the store's input records filled by calibseg-store --part inputs."""
    folder = tmp_path_factory.mktemp("inputs")
    labelled = [patient for fold in INPUT_FOLDS for patient in fold]
    path = make_test_ensemble(folder / "tiny.calibseg", size=2, validation=INPUT_FOLDS,
                              class_names=list(ACDC_CLASS_NAMES), class_colors=[(0, 0, 0)] * 4,
                              class_terminology=ACDC_TERMINOLOGY,
                              data={"dataset": "acdc", "train": labelled, "val": [], "test": ["patient068"]})
    assert store_main(["--bundle", str(path), "--store", str(folder / "store"), "--data", str(sample_acdc_dir),
                       "--device", "cpu", "--part", "inputs"]) == 0
    return path, folder / "store"


def test_the_input_statistics_refitted_from_the_store_are_those_the_networks_fit(input_ensemble, sample_acdc_dir,
                                                                                  tmp_path):
    """The input check's section from the store's records against Training.fit_input_check, which runs every
    member's encoder over the cases itself: the same section, number for number."""
    path, store = input_ensemble
    weights = load_bundle(path).metadata.weights_sha256
    records = read_input_records(store, weights)
    assert [record.case[:10] for record in records] == sorted(
        [patient for fold in INPUT_FOLDS for patient in fold for _ in range(2)] + ["patient068"] * 2)
    assert all(len(record.encoders) == 2 for record in records)
    _, fitted, fit_records = refit(path, store, ["input_statistics"])
    direct = load_bundle(refit_input_check(path, sample_acdc_dir, tmp_path / "direct.calibseg", device="cpu"))
    assert largest_difference(direct.metadata.input_statistics, fitted["input_statistics"]) == 0.0
    assert fit_records["input_statistics"]["member_training_volumes"] == [6, 6]
    assert fit_records["input_statistics"]["unseen_volumes"] == 12
    assert fit_records["input_statistics"]["training_volumes"] == 6  # the first member's training volumes


def test_input_records_are_read_only_whole_and_complete(input_ensemble, tmp_path):
    path, store = input_ensemble
    weights = load_bundle(path).metadata.weights_sha256
    first = read_input_records(store, weights)[0]
    copy = tmp_path / "store"
    written = input_record_path(copy, weights, first.case)
    written.parent.mkdir(parents=True)
    values = first.to_dict()
    for change, message in (({"version": 2}, "is store version 2"), ({"encoders": []}, "has no encoder vector"),
                            ({"encoders": [{"layer": "a", "vector": [1.0]}, {"layer": "a", "vector": [1.0, 2.0]}]},
                             "has no encoder vector of one length for each member"),
                            ({"observation": {"quantiles": []}}, "has no image observation"),
                            ({"weights_sha256": "other"}, "is a record of other weights")):
        written.write_text(json.dumps({**values, **change}))
        with pytest.raises(StoreError, match=message):
            read_input_records(copy, weights)
    written.write_text(json.dumps(values))
    with pytest.raises(SystemExit, match="^error: The store's input records lack 5 of the bundle's training patients"):
        fit_main(["--bundle", str(path), "--store", str(copy), "--sections", "input_statistics", "--check"])
