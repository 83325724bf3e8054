"""Fault catalogue, calibseg-function (CalibSegLib.cardiac.command) run in process through ``main(argv)``: each
refusal is one line on stderr after ``error:``, exit status 2, found before any inference, nothing written."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from CalibSegLib.cardiac import command
from CalibSegLib.cardiac.function import measure_cine
from CalibSegLib.cardiac.indices import CardiacError
from CalibSegLib.inference import Predictor
from CalibSegLib.io import ImageGeometry, write_image
from CalibSegLib.pretrained import resolve_bundle_path
from Datasets.cases import ACDC_CLASS_NAMES, ACDC_TERMINOLOGY
from Datasets.dicom_series import write_cine, write_series
from Evaluation import function_intervals
from cardiac_standins import LabelPredictor
from fault_checks import assert_one_sentence, tree_snapshot
from tiny_bundles import make_test_bundle

GRID = ImageGeometry(spacing=(8.0, 1.5, 1.5), origin=(-10.0, 4.0, 9.5))
OTHER_GRID = ImageGeometry(spacing=(8.0, 1.25, 1.25), origin=(-10.0, 4.0, 9.5))


def _volume(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(300, 60, size=(3, 24, 20)).astype(np.float32)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Images, DICOM folders and bundles (a cardiac one, one without the cardiac codes) in one folder."""
    folder = tmp_path_factory.mktemp("function_inputs")
    write_image(folder / "ed.nii.gz", _volume(0), GRID)
    write_image(folder / "es.nii.gz", _volume(1), GRID)
    write_image(folder / "es_other_grid.nii.gz", _volume(1), OTHER_GRID)
    write_series(folder / "one_phase", _volume(2), GRID, trigger_time_ms=0.0)
    write_cine(folder / "cine", np.stack([_volume(3), _volume(4)]), GRID, trigger_times_ms=[0.0, 350.0])
    make_test_bundle(folder / "cardiac.calibseg", class_names=list(ACDC_CLASS_NAMES),
                     class_terminology=ACDC_TERMINOLOGY)
    make_test_bundle(folder / "generic.calibseg")
    return folder


def _pair(ed: str, es: str, bundle: str = "cardiac.calibseg") -> Callable[[Path], list[str]]:
    return lambda folder: ["--bundle", str(folder / bundle), "--ed", str(folder / ed), "--es", str(folder / es)]


def _cine(name: str) -> Callable[[Path], list[str]]:
    return lambda folder: ["--bundle", str(folder / "cardiac.calibseg"), "--cine", str(folder / name)]


BAD_FUNCTION_INPUTS: dict[str, tuple[Callable[[Path], list[str]], tuple[str, ...]]] = {
    "ED and ES on different grids": (_pair("ed.nii.gz", "es_other_grid.nii.gz"),
                                     (r"^ED \(\(3, 24, 20\), spacing \(8\.0, 1\.5, 1\.5\) mm\) and ES .* differ in "
                                      "geometry", "give phases of one acquisition")),
    "a 3D image as --cine": (_cine("ed.nii.gz"), (r"^ed\.nii\.gz holds one phase, not a cine",
                                                  "one phase each to --ed and --es")),
    "a single-phase DICOM series as --cine": (_cine("one_phase"), (r"^one_phase holds one phase, not a cine",)),
    "a bundle without the cardiac codes": (_pair("ed.nii.gz", "es.nii.gz", "generic.calibseg"),
                                           (r"^The bundle's terminology codes no class as left ventricle \(SCT "
                                            r"87878005\), right ventricle", "use a cardiac bundle")),
}


@pytest.mark.parametrize("case", sorted(BAD_FUNCTION_INPUTS))
def test_refusals_are_one_sentence_before_inference_and_write_nothing(case, inputs, tmp_path, monkeypatch, capsys):
    arguments, patterns = BAD_FUNCTION_INPUTS[case]

    def refuse(*args, **kwargs):
        raise AssertionError("inference ran although the fault was detectable before it")

    monkeypatch.setattr(Predictor, "predict_variants", refuse)
    out = tmp_path / "out"
    out.mkdir()
    (out / "function.json").write_text("{\"earlier\": true}")
    before = tree_snapshot(tmp_path)
    status = command.main([*arguments(inputs), "--out-dir", str(out), "--device", "cpu"])
    error = capsys.readouterr().err
    assert status == 2
    assert error.startswith("error: ")
    assert_one_sentence(error[len("error: "):], *patterns)
    assert tree_snapshot(tmp_path) == before


def test_a_cine_whose_phases_differ_in_geometry_is_one_sentence():
    """measure_cine (the Slicer section's and the command's path) refuses phases on different grids, naming the
    first that differs, before any phase is segmented."""
    labels = np.zeros((3, 24, 20), np.uint8)
    predictor = LabelPredictor()
    with pytest.raises(CardiacError) as error:
        measure_cine(predictor, [(labels, GRID), (labels, GRID), (labels, OTHER_GRID)])
    assert_one_sentence(str(error.value), r"^phase 0 \(.*\) and phase 2 \(.*spacing \(8\.0, 1\.25, 1\.25\) mm\) "
                                          "differ in geometry")
    with pytest.raises(CardiacError) as error:
        measure_cine(predictor, [(labels[:2], GRID), (labels, GRID)])
    assert_one_sentence(str(error.value), r"^phase 0 \(\(2, 24, 20\).*and phase 1 \(\(3, 24, 20\)")
    assert predictor.calls == 0


def test_either_cine_or_ed_and_es(inputs, tmp_path, capsys):
    """argparse's own usage error (status 2) for --cine with --ed, and for --ed without --es."""
    for arguments, message in ((["--cine", str(inputs / "cine"), "--ed", str(inputs / "ed.nii.gz")],
                                "give either --cine or --ed and --es, not both"),
                               (["--ed", str(inputs / "ed.nii.gz")], "give --ed and --es (one phase each), or --cine")):
        with pytest.raises(SystemExit) as exit_status:
            command.main(["--bundle", str(inputs / "cardiac.calibseg"), *arguments, "--out-dir", str(tmp_path)])
        assert exit_status.value.code == 2
        assert capsys.readouterr().err.strip().endswith(f"error: {message}")
    assert list(tmp_path.iterdir()) == []


def _applied_to_the_average(folder: Path) -> str:
    """A copy of the shipped CRaC ensemble whose quality model is applied to the members' average, as bundles made
    before per-member quality models were (the weights' bytes unchanged)."""
    with zipfile.ZipFile(resolve_bundle_path("acdc_crac")) as archive:
        stored = json.loads(archive.read("bundle.json"))
        weights = archive.read("weights.safetensors")
    stored["quality_model"]["validation"].pop("applied_to")
    path = folder / "average.calibseg"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("bundle.json", json.dumps(stored))
        archive.writestr("weights.safetensors", weights)
    return str(path)


# The interval fit (Evaluation.function_intervals) given quality observations it cannot use → its sentence.
BAD_QUALITY_OBSERVATIONS: dict[str, tuple[Callable[[Path], str], Callable[[Path], Path], str]] = {
    "a quality model applied to the members' average": (
        _applied_to_the_average, lambda folder: folder,
        r"^The bundle's quality model is absent or applied to the members' average, so its predicted Dice"),
    "no folder of quality observations": (
        lambda folder: "acdc_ce_dice", lambda folder: folder / "absent",
        r"^.*absent/out_of_fold is no folder of quality observations; write it with python -m "
        r"scripts\.ensemble_quality_pass"),
}


@pytest.mark.parametrize("case", sorted(BAD_QUALITY_OBSERVATIONS))
def test_the_interval_fit_refuses_quality_observations_it_cannot_use(case, tmp_path):
    """``--quality-observations`` that cannot give the predicted Dice the bundle shows at inference: one sentence
    after ``error:``, no record written."""
    bundle, observations, pattern = BAD_QUALITY_OBSERVATIONS[case]
    record = tmp_path / "record.json"
    with pytest.raises(SystemExit) as exit_status:
        function_intervals.main(["--bundle", bundle(tmp_path), "--cache", str(tmp_path), "--no-collect", "--record",
                                 str(record), "--quality-observations", str(observations(tmp_path))])
    message = str(exit_status.value.code)
    assert message.startswith("error: ")
    assert_one_sentence(message[len("error: "):], pattern)
    assert not record.exists()


def test_a_sub_ensembles_interval_fit_without_the_out_of_fold_volumes_is_one_sentence(tmp_path):
    """The shipped acdc_ce_dice keeps three of five networks and the rule fitted on all five out of fold: a cache
    without those five's out-of-fold volumes cannot refit it, and says so, no record written."""
    record = tmp_path / "record.json"
    (tmp_path / "cache").mkdir()
    with pytest.raises(SystemExit) as exit_status:
        function_intervals.main(["--bundle", "acdc_ce_dice", "--cache", str(tmp_path / "cache"), "--no-collect",
                                 "--record", str(record)])
    message = str(exit_status.value.code)
    assert message.startswith("error: ")
    assert_one_sentence(message[len("error: "):], r"^.*cache holds no out-of-fold volume of the ensemble acdc_ce_dice "
                        r"keeps members of, and its rule was fitted on them; give --cache a copy of that ensemble's")
    assert not record.exists()
