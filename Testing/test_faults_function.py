"""Fault catalogue, calibseg-function (CalibSegLib.cardiac.command) run in process through ``main(argv)``: each
refusal is one line on stderr after ``error:``, exit status 2, nothing written; a fault that the input shows is
found before any inference, one that only the segmentation shows (a phase unlike the training images, swapped
phases, a structure drawn nowhere, an impossible result) right after it, before anything is written."""

from __future__ import annotations

import errno
import json
import struct
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import SimpleITK as sitk

from CalibSegLib.bundle import read_metadata
from CalibSegLib.cardiac import command
from CalibSegLib.cardiac.function import measure_cine
from CalibSegLib.cardiac.indices import CardiacError
from CalibSegLib.inference import Predictor
from CalibSegLib.io import ImageGeometry, write_image
from CalibSegLib.interval_rule import INDICES, IntervalRule
from CalibSegLib.pretrained import resolve_bundle_path
from CalibSegLib.store import ENSEMBLE, TEST, StoreRecord, write_record
from Datasets.acdc import ACDC_CLASS_NAMES, ACDC_SPACING, ACDC_TERMINOLOGY
from Datasets.dicom_series import write_cine, write_series
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Evaluation import function_intervals
from cardiac_standins import LabelPredictor
from fault_checks import (NIFTI_DIM_OFFSET, NIFTI_PIXDIM_OFFSET, assert_one_sentence, edit_stored_bytes,
                          rewrite_bundle, tree_snapshot)
from tiny_bundles import make_test_bundle

GRID = ImageGeometry(spacing=(8.0, 1.5, 1.5), origin=(-10.0, 4.0, 9.5))
OTHER_GRID = ImageGeometry(spacing=(8.0, 1.25, 1.25), origin=(-10.0, 4.0, 9.5))


def _volume(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(300, 60, size=(3, 24, 20)).round().astype(np.float32)


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


def _selected_members_only(folder: Path) -> Path:
    """A store holding one record of the shipped acdc_ce_dice's own weights and none of the five-member ensemble
    its members were selected from."""
    metadata = read_metadata(resolve_bundle_path("acdc_ce_dice"))
    write_record(folder / "store", StoreRecord("patient101_frame01", "patient101", ENSEMBLE, TEST,
                                               metadata.weights_sha256, [0.9] * 3, [None] * 3))
    return folder / "store"


# The interval fit (Evaluation.function_intervals) given a store it cannot fit from → its sentence.
BAD_FIT_INPUTS: dict[str, tuple[list[str], Callable[[Path], Path], str]] = {
    "a quality model applied to the members' average": (
        ["--with-predicted-dice"], lambda folder: folder / "absent",
        r"^The bundle's quality model is absent or applied to the members' average, so its predicted Dice"),
    "an empty store": (
        [], lambda folder: folder / "absent",
        r"^.*absent holds no record of the weights [0-9a-f]{12}…; fill it with calibseg-store --bundle <bundle> "),
    "a sub-ensemble's store without the out-of-fold records of the ensemble it was selected from": (
        [], _selected_members_only,
        r"^.*store holds no record of the ensemble these members were selected from \(weights 59fd4da5"),
}


@pytest.mark.parametrize("case", sorted(BAD_FIT_INPUTS))
def test_the_interval_fit_refuses_a_store_it_cannot_fit_from(case, tmp_path):
    """A store without the records the rule is fitted on, or a quality model whose predicted Dice the store's
    observations cannot give as the bundle shows them at inference: one sentence after ``error:``, no record."""
    options, store, pattern = BAD_FIT_INPUTS[case]
    bundle = _applied_to_the_average(tmp_path) if "--with-predicted-dice" in options else "acdc_ce_dice"
    record = tmp_path / "record.json"
    with pytest.raises(SystemExit) as exit_status:
        function_intervals.main(["--bundle", bundle, "--store", str(store(tmp_path)), "--record", str(record),
                                 *options])
    message = str(exit_status.value.code)
    assert message.startswith("error: ")
    assert_one_sentence(message[len("error: "):], pattern)
    assert not record.exists()


# --- Cine files: one reader for 3D and 4D images, the same checks before any voxel is allocated ---------------------

def _cine_file(suffix: str = ".nii", patch: Callable[[bytearray], None] | None = None, keep: float = 1.0,
               phases: np.ndarray | None = None) -> Callable[[Path], Path]:
    """A 4D NIfTI-1 cine (two phases of :func:`_volume` unless ``phases`` given) whose uncompressed bytes ``patch``
    edits and of which the first ``keep`` fraction is kept (a copy cut short)."""
    def make(folder: Path) -> Path:
        volumes = phases if phases is not None else np.stack([_volume(5), _volume(6)])
        image = sitk.JoinSeries([GRID.apply(sitk.GetImageFromArray(volume)) for volume in volumes])
        path = folder / f"cine{suffix}"
        sitk.WriteImage(image, str(path), useCompression=suffix.endswith(".gz"))
        return edit_stored_bytes(path, patch, keep)

    return make


def _pixdim(axis: int, value: float) -> Callable[[bytearray], None]:
    """pixdim[axis] set to ``value`` (1: x, 2: y, 3: the slice spacing, 4: time)."""
    return lambda raw: struct.pack_into("<f", raw, NIFTI_PIXDIM_OFFSET + 4 * axis, value)


def _phase_count(count: int) -> Callable[[bytearray], None]:
    return lambda raw: struct.pack_into("<h", raw, NIFTI_DIM_OFFSET + 2 * 4, count)


def _detached_cine_claiming(gib: float) -> Callable[[Path], Path]:
    """A 4D MetaImage header (.mhd) naming 5 MiB of raw voxels but declaring ``gib`` GiB of float32 voxels: within
    deflate's ratio of the data file's size, beyond what is read into memory."""
    def make(folder: Path) -> Path:
        (folder / "cine.raw").write_bytes(bytes(5 << 20))
        phases = int(gib * (1 << 30) / (4 * 256 * 256 * 16))
        (folder / "cine.mhd").write_text(
            "ObjectType = Image\nNDims = 4\nDimSize = 256 256 16 {}\nElementSpacing = 1.5 1.5 8 1\n"
            "ElementType = MET_FLOAT\nElementDataFile = cine.raw\n".format(phases))
        return folder / "cine.mhd"

    return make


def _nan_voxels(raw: bytearray) -> None:
    struct.pack_into("<f", raw, 352 + 4 * 100, float("nan"))  # a voxel of phase 0 (float32 after the 352-byte head)


BAD_CINE_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "a 4D .nii cut short": (_cine_file(keep=0.6), r"^cine\.nii is cut short: its NIfTI header declares "),
    "a 4D .nii.gz cut short": (_cine_file(".nii.gz", keep=0.7), r"^cine\.nii\.gz is cut short"),
    "a 4D slice spacing of 0": (_cine_file(patch=_pixdim(3, 0.0)),
                                r"spacing \(pixdim\) of 0 × 1\.5 × 1\.5 mm in its NIfTI header, which is not positive"),
    "a 4D slice spacing of NaN": (_cine_file(".nii.gz", patch=_pixdim(3, float("nan"))), r"spacing \(pixdim\) of nan "),
    "a 4D in-plane spacing of 0": (_cine_file(patch=_pixdim(1, 0.0)), r"of 8 × 1\.5 × 0 mm .*not positive"),
    "a 4D in-plane spacing of inf": (_cine_file(patch=_pixdim(2, float("inf"))), r"of 8 × inf × 1\.5 mm"),
    "a 4D slice spacing of 1e-20 mm": (_cine_file(patch=_pixdim(3, 1e-20)),
                                       r"voxel spacing of 1e-20 × 1\.5 × 1\.5 mm, outside the 0\.001 to 100 mm"),
    "a .nii.gz of 4 KiB declaring 16000 phases": (
        _cine_file(".nii.gz", patch=_phase_count(16000)),
        r"declares 16000 × 3 × 24 × 20 voxels \(87\.9 MiB\) in its NIfTI header, more than its 4\.4 KiB of "
        "compressed data can hold"),
    "a 4D .mhd declaring 4.5 GiB its 5 MiB could hold compressed": (
        _detached_cine_claiming(4.5), r"more than the 4\.0 GiB CalibSeg reads into memory at once; crop or resample"),
    "a 4D file with a NaN voxel": (_cine_file(".nii.gz", patch=_nan_voxels), r"stores NaN or infinite voxel values"),
}


@pytest.fixture
def no_inference(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("inference ran although the fault was detectable before it")

    monkeypatch.setattr(Predictor, "predict_variants", refuse)


@pytest.mark.parametrize("case", list(BAD_CINE_FILES))
def test_a_broken_cine_file_is_one_sentence_before_allocation(case, inputs, tmp_path, no_inference, capsys):
    """The 4D reader is the 3D one (CalibSegLib.io.read_image): a header that disagrees with its file, a spacing
    that is not positive, finite and plausible, more voxels than memory should hold, NaN voxels."""
    make, pattern = BAD_CINE_FILES[case]
    (tmp_path / "cine").mkdir()
    path = make(tmp_path / "cine")
    before = tree_snapshot(tmp_path)
    status = command.main(["--bundle", str(inputs / "cardiac.calibseg"), "--cine", str(path), "--out-dir",
                           str(tmp_path / "out"), "--device", "cpu"])
    assert status == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ")
    assert_one_sentence(error[len("error: "):], pattern)
    assert tree_snapshot(tmp_path) == before


# --- ED and ES: two images of one heart, checked before the network runs --------------------------------------------

def _copy_of(name: str, copy: str) -> Callable[[Path], tuple[Path, Path]]:
    def make(folder: Path) -> tuple[Path, Path]:
        original = folder / name
        (folder / copy).write_bytes(original.read_bytes())
        return original, folder / copy
    return make


def _same_voxels_as_nrrd(folder: Path) -> tuple[Path, Path]:
    """ED's voxels (float32 whole numbers) written as int16 NRRD: other bytes, the same image."""
    write_image(folder / "es.nrrd", _volume(0).astype(np.int16), GRID)
    return folder / "ed.nii.gz", folder / "es.nrrd"


BAD_PHASE_PAIRS: dict[str, tuple[Callable[[Path], tuple[Path, Path]], str]] = {
    "one file as ED and ES": (lambda folder: (folder / "ed.nii.gz", folder / "ed.nii.gz"),
                              r"^ED and ES are the same image \(equal voxels\), so no heart's contraction lies"),
    "a byte copy of ED as ES": (_copy_of("ed.nii.gz", "ed_copy.nii.gz"), r"^ED and ES are the same image"),
    "ED's voxels in another format as ES": (_same_voxels_as_nrrd, r"^ED and ES are the same image"),
}


@pytest.mark.parametrize("case", list(BAD_PHASE_PAIRS))
def test_ed_and_es_that_are_one_image_are_refused_before_inference(case, tmp_path, no_inference, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    write_image(folder / "ed.nii.gz", _volume(0), GRID)
    make_test_bundle(folder / "cardiac.calibseg", class_names=list(ACDC_CLASS_NAMES),
                     class_terminology=ACDC_TERMINOLOGY)
    ed, es = BAD_PHASE_PAIRS[case][0](folder)
    before = tree_snapshot(tmp_path)
    status = command.main(["--bundle", str(folder / "cardiac.calibseg"), "--ed", str(ed), "--es", str(es),
                           "--out-dir", str(tmp_path / "out"), "--device", "cpu"])
    assert status == 2
    assert_one_sentence(capsys.readouterr().err[len("error: "):], BAD_PHASE_PAIRS[case][1],
                        "give the end-diastolic and the end-systolic phase of one cine")
    assert tree_snapshot(tmp_path) == before


def test_a_cine_repeating_a_phase_is_refused_before_inference(inputs, tmp_path, no_inference, capsys):
    """Two identical phases in a 4D file (an export that copied a frame): refused, naming both."""
    path = _cine_file(phases=np.stack([_volume(5), _volume(6), _volume(5)]))(tmp_path)
    before = tree_snapshot(tmp_path)
    assert command.main(["--bundle", str(inputs / "cardiac.calibseg"), "--cine", str(path), "--out-dir",
                         str(tmp_path / "out"), "--device", "cpu"]) == 2
    assert_one_sentence(capsys.readouterr().err[len("error: "):],
                        r"^Phase 0 of the cine and phase 2 of the cine are the same image \(equal voxels\)")
    assert tree_snapshot(tmp_path) == before


# --- What only the segmentation shows: checked after it, before anything is written ---------------------------------

SHAPE = (3, 24, 20)


def _labels(lv: int, rv: int, myocardium: int = 30) -> np.ndarray:
    """A label map (LabelPredictor predicts its input) of ``lv``, ``rv`` and ``myocardium`` voxels (ACDC's classes
    3, 1, 2), the rest background."""
    values = np.zeros(int(np.prod(SHAPE)), np.uint8)
    values[:lv] = 3
    values[lv:lv + rv] = 1
    values[lv + rv:lv + rv + myocardium] = 2
    return values.reshape(SHAPE)


# case → (ED labels, ES labels, the sentence); voxels of 8 × 1.5 × 1.5 mm = 0.018 mL
BAD_MEASUREMENTS: dict[str, tuple[np.ndarray, np.ndarray, str]] = {
    "ED and ES swapped": (_labels(200, 300), _labels(400, 500),
                          r"^The LV blood pool is 7\.2 mL at ES and 3\.6 mL at ED, not smaller at ES, so ED and ES "
                          "look swapped .*give the end-diastolic phase as ED and the end-systolic one as ES"),
    "no heart at all": (_labels(0, 0, 0), _labels(100, 100),
                        r"^No LV blood pool and no RV blood pool and no myocardium is segmented at ED"),
    "no RV at ES": (_labels(400, 500), _labels(200, 0), r"^No RV blood pool is segmented at ES, so its volumes"),
    "an RV larger at ES": (_labels(400, 300), _labels(200, 350),
                           r"^The RV end-systolic volume \(6\.3 mL\) exceeds its end-diastolic volume \(5\.4 mL\), "
                           "which no heart does"),
}


@pytest.fixture
def label_predictor(monkeypatch):
    """calibseg-function's predictor replaced by :class:`LabelPredictor` (its prediction is its input)."""
    monkeypatch.setattr(command, "Predictor", lambda *args, **kwargs: LabelPredictor())


@pytest.mark.parametrize("case", list(BAD_MEASUREMENTS))
def test_a_segmentation_no_heart_has_is_one_sentence_and_writes_nothing(case, inputs, tmp_path, label_predictor,
                                                                         capsys):
    ed_labels, es_labels, pattern = BAD_MEASUREMENTS[case]
    write_image(tmp_path / "ed.nii.gz", ed_labels, GRID)
    write_image(tmp_path / "es.nii.gz", es_labels, GRID)
    out = tmp_path / "out"
    out.mkdir()
    (out / "function.json").write_text("{\"earlier\": true}")
    before = tree_snapshot(tmp_path)
    assert command.main(["--bundle", str(inputs / "cardiac.calibseg"), "--ed", str(tmp_path / "ed.nii.gz"), "--es",
                         str(tmp_path / "es.nii.gz"), "--out-dir", str(out), "--report"]) == 2
    assert_one_sentence(capsys.readouterr().err[len("error: "):], pattern)
    assert tree_snapshot(tmp_path) == before


def _sample_pair(folder: Path, crop: tuple[slice, ...]) -> tuple[Path, Path]:
    files = [item for item in find_cases(Path(__file__).resolve().parents[1] / "SampleData" / "ACDC")
             if item.patient_id == "patient013"]
    ed, es = load_cases(sorted(files, key=lambda item: item.case_id), 4)
    for name, case in (("ed", ed), ("es", es)):
        write_image(folder / f"{name}.nii.gz", case.image[crop], ImageGeometry(spacing=ACDC_SPACING))
    return folder / "ed.nii.gz", folder / "es.nii.gz"


def _noise_as_ed(folder: Path) -> tuple[Path, Path]:
    ed, es = _sample_pair(folder, (slice(None),) * 3)
    image, geometry = command.read_phase(ed)
    write_image(ed, np.random.default_rng(3).normal(float(image.mean()), float(image.std()), image.shape), geometry)
    return ed, es


# case → (make(folder) -> (ED, ES) files for the shipped acdc_ce_dice, the sentence)
BAD_PHASE_IMAGES: dict[str, tuple[Callable[[Path], tuple[Path, Path]], str]] = {
    "noise as ED": (_noise_as_ed, r"^ED is unlike the model's training images \(.*\), so no volume measured on it can "
                                  "be trusted; check it with calibseg-predict"),
    "3 slices cropped to 128 × 128": (
        lambda folder: _sample_pair(folder, (slice(3, 6), slice(64, 192), slice(40, 168))),
        r"^ED is unlike the model's training images \(unlike the training images the networks saw: 3 of 3 members "
        "find it so"),
}


@pytest.mark.parametrize("case", list(BAD_PHASE_IMAGES))
def test_a_phase_the_input_check_calls_unsuitable_stops_the_measurement(case, tmp_path, capsys):
    """Each phase is judged as calibseg-predict judges a volume; an unsuitable one publishes no number."""
    make, pattern = BAD_PHASE_IMAGES[case]
    (tmp_path / "in").mkdir()
    ed, es = make(tmp_path / "in")
    before = tree_snapshot(tmp_path)
    assert command.main(["--bundle", "acdc_ce_dice", "--ed", str(ed), "--es", str(es), "--out-dir",
                         str(tmp_path / "out"), "--device", "cpu"]) == 2
    assert_one_sentence(capsys.readouterr().err[len("error: "):], pattern)
    assert tree_snapshot(tmp_path) == before


# --- The interval rule: validated when the bundle is read ------------------------------------------------------------

def _rule_edit(edit: Callable[[dict], None]) -> Callable[[dict], None]:
    """A change of the stored rule (a hand-made one with recalibration lines) in ``bundle.json``."""
    def change(metadata: dict) -> None:
        rule = IntervalRule("hard", "constant", dict.fromkeys(INDICES, 5.0),
                            recalibration={key: (1.0, 1.02) for key in ("lv_ed", "lv_es", "rv_ed", "rv_es",
                                                                          "myocardium_ed")}).to_dict()
        edit(rule)
        metadata["function_intervals"] = rule
    return change


def _line(volume: str, intercept: float, slope: float) -> Callable[[dict], None]:
    return lambda rule: rule["recalibration"].__setitem__(volume, [intercept, slope])


BAD_INTERVAL_RULES: dict[str, tuple[Callable[[dict], None], str]] = {
    "a recalibration slope of 0": (_line("lv_es", 1.0, 0.0),
                                   r"its recalibration slope of lv_es must be a finite number from 0\.5 to 2, got 0"),
    "a recalibration slope of -1": (_line("rv_ed", 1.0, -1.0), r"slope of rv_ed must be .* got -1"),
    "a recalibration slope of 1e300": (_line("lv_ed", 0.0, 1e300), r"slope of lv_ed must be .* got 1e\+300"),
    "a recalibration intercept of 1e6 mL": (_line("myocardium_ed", 1e6, 1.0),
                                            r"intercept of myocardium_ed must be a finite number from -100 to 100"),
    "a recalibration slope given as text": (_line("lv_ed", 0.0, "1"), r"slope of lv_ed .* got '1'"),
    "a negative quantile": (lambda rule: rule["quantiles"].__setitem__("lv_ef_percent", -1.0),
                            r"its quantile of lv_ef_percent must be a finite number from 0 to 1000, got -1"),
    "an infinite quantile": (lambda rule: rule["quantiles"].__setitem__("rv_edv_ml", float("inf")),
                             r"quantile of rv_edv_ml .* got inf"),
    "an unknown scale": (lambda rule: rule.__setitem__("scale", "variance"), r"its scale one of .* got .*'variance'"),
    "a level of 1": (lambda rule: rule.__setitem__("level", 1.0), r"its level must be a number in \(0, 1\), got 1\.0"),
    "a recalibration line missing": (lambda rule: rule["recalibration"].pop("rv_es"),
                                     r"its recalibration must be null or give each of lv_ed, lv_es"),
}


@pytest.mark.parametrize("case", list(BAD_INTERVAL_RULES))
def test_a_malformed_interval_rule_is_refused_when_the_bundle_is_read(case, inputs, tmp_path, no_inference, capsys):
    edit, pattern = BAD_INTERVAL_RULES[case]
    bundle = rewrite_bundle(inputs / "cardiac.calibseg", tmp_path / "edited.calibseg", _rule_edit(edit))
    before = tree_snapshot(tmp_path)
    assert command.main(["--bundle", str(bundle), "--ed", str(inputs / "ed.nii.gz"), "--es", str(inputs / "es.nii.gz"),
                         "--out-dir", str(tmp_path / "out"), "--device", "cpu"]) == 2
    assert_one_sentence(capsys.readouterr().err[len("error: "):], r"^The bundle's function_intervals are malformed \(",
                        pattern, r"refit them with python -m Evaluation\.function_intervals\.$")
    assert tree_snapshot(tmp_path) == before


# --- Outputs: function.json and report.html both, or neither ---------------------------------------------------------

def test_a_folder_in_the_way_of_report_html_is_one_sentence_before_reading(inputs, tmp_path, no_inference, capsys):
    out = tmp_path / "out"
    (out / "report.html").mkdir(parents=True)
    (out / "function.json").write_text("{\"earlier\": true}")
    before = tree_snapshot(tmp_path)
    assert command.main(["--bundle", str(inputs / "cardiac.calibseg"), "--ed", str(inputs / "ed.nii.gz"), "--es",
                         str(inputs / "es.nii.gz"), "--out-dir", str(out), "--report"]) == 2
    assert_one_sentence(capsys.readouterr().err[len("error: "):], r"report\.html: a folder of that name is in the way")
    assert tree_snapshot(tmp_path) == before


def test_a_full_disk_while_writing_the_report_keeps_the_earlier_pair(inputs, tmp_path, label_predictor, monkeypatch,
                                                                    capsys):
    """The report fails half-way (the disk fills): the earlier function.json and report.html stay as they were, no
    temporary is left, and the sentence names the folder."""
    write_image(tmp_path / "ed.nii.gz", _labels(400, 500), GRID)
    write_image(tmp_path / "es.nii.gz", _labels(200, 300), GRID)
    out = tmp_path / "out"
    out.mkdir()
    (out / "function.json").write_text("{\"earlier\": true}")
    (out / "report.html").write_text("<p>earlier</p>")

    def fill_the_disk(path, *args, **kwargs):
        Path(path).write_text("<!DOCTYPE html><html")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(command, "write_function_report", fill_the_disk)
    before = tree_snapshot(tmp_path)
    assert command.main(["--bundle", str(inputs / "cardiac.calibseg"), "--ed", str(tmp_path / "ed.nii.gz"), "--es",
                         str(tmp_path / "es.nii.gz"), "--out-dir", str(out), "--report"]) == 2
    assert_one_sentence(capsys.readouterr().err[len("error: "):],
                        rf"^Cannot write the results into {out} \(No space left on device",
                        "nothing there was changed, so free some space or choose another --out-dir")
    assert tree_snapshot(tmp_path) == before
