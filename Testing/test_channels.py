"""Own data: dataset.json in both forms, multi-channel cases, channel names in the bundle (issue 41)."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from CalibSegLib.bundle import BundleError, load_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.io import read_image, write_image
from CalibSegLib.predict import folder_cases
from CalibSegLib.predict import main as predict_main
from CalibSegLib.preprocessing import Preprocessing, intensity_range, normalize_channels, scale_intensity
from CalibSegLib.pretrained import resolve_bundle_path
from Datasets.dataset_defaults import default_scheme
from Datasets.dataset_json import read_dataset_description
from Datasets.dataset_names import SAMPLE_DATA, SAMPLE_DATASET
from Datasets.errors import DataError
from Datasets.layouts import find_cases
from Datasets.loading import Case, load_cases
from Datasets.phantoms import lesion_case, write_phantom
from Datasets.splits import make_split
from Training.command_line import parser
from Training.fingerprint import make_fingerprint
from Training.plan import Plan, channel_normalization, make_plan, patch_3d
from Training.train import main as train_main
from tiny_bundles import make_test_metadata


@pytest.fixture(scope="module")
def ct_folder(tmp_path_factory) -> Path:
    return write_phantom(tmp_path_factory.mktemp("ct") / "ct", "ct", cases=6)


@pytest.fixture(scope="module")
def mr_folder(tmp_path_factory) -> Path:
    return write_phantom(tmp_path_factory.mktemp("mr") / "mr", "multichannel", cases=6)


def test_both_dataset_json_forms_are_read(ct_folder, mr_folder):
    decathlon, nnunet = read_dataset_description(ct_folder), read_dataset_description(mr_folder)
    assert decathlon.channel_names == ["CT"] and nnunet.channel_names == ["T1", "T1ce", "T2", "FLAIR"]
    assert decathlon.class_names == ["background", "liver", "spleen", "kidney"]
    assert nnunet.class_names == ["background", "edema", "necrosis", "enhancing"]
    assert nnunet.file_ending == ".nii.gz" and decathlon.test_cases == []


def test_multichannel_cases_are_stacked_channels_first(mr_folder):
    files = find_cases(mr_folder)
    assert [path.name for path in files[0].channel_paths] == [f"mr_000_000{index}.nii.gz" for index in range(4)]
    case = load_cases(files[:1], 4)[0]
    assert case.image.shape == (4, *case.label.shape)
    # Structure k is bright in channel k only: the channels are not mixed up.
    for channel in (1, 2, 3):
        inside = case.image[channel][case.label == channel].mean()
        assert inside > case.image[channel][case.label == (channel % 3) + 1].mean()


def test_a_missing_channel_is_named_in_one_sentence(tmp_path, mr_folder):
    import shutil

    copy = shutil.copytree(mr_folder, tmp_path / "copy")
    (copy / "imagesTr" / "mr_002_0003.nii.gz").unlink()
    with pytest.raises(DataError, match=r"Case mr_002 .* _0000, _0001, _0002 .* 4 channel"):
        find_cases(copy)


def test_channels_on_different_grids_are_refused(tmp_path, mr_folder):
    import shutil

    from CalibSegLib.io import read_image, write_image

    copy = shutil.copytree(mr_folder, tmp_path / "copy")
    path = copy / "imagesTr" / "mr_001_0002.nii.gz"
    image, geometry = read_image(path)
    write_image(path, image[:, :-2], geometry)
    with pytest.raises(DataError, match=r"mr_001_0002.nii.gz is not on mr_001_0000.nii.gz.s grid"):
        load_cases([file for file in find_cases(copy) if file.case_id == "mr_001"], 4)


def test_dataset_json_test_list_is_the_made_splits_test_side(tmp_path):
    (tmp_path / "dataset.json").write_text(json.dumps({
        "labels": {"0": "background", "1": "organ"}, "modality": {"0": "CT"},
        "test": ["./imagesTs/p7.nii.gz", {"image": "./imagesTs/p3_0000.nii.gz"}]}))
    description = read_dataset_description(tmp_path)
    assert description.test_cases == ["p7", "p3"]
    patients = [f"p{index}" for index in range(10)]
    split = make_split(patients, seed=1, test=description.test_cases)
    assert split["test"] == ["p3", "p7"] and len(split["val"]) == 1 and len(split["train"]) == 7
    assert sorted(sum(split.values(), [])) == sorted(patients)


def test_bundle_channel_names_are_validated():
    metadata = make_test_metadata()
    metadata.channel_names = ["T1", "T2"]  # one channel declared
    with pytest.raises(BundleError, match="channel_names must name each of its 1"):
        metadata.validate()
    metadata.channel_names = ["CT"]
    metadata.validate()


# ----------------------------------------------------------------- the plan
def _plan(folder: Path, flags: list[str], preferred_patch_2d: int = 128) -> Plan:
    """The plan calibseg-train makes of ``folder``'s cases (all of them as training cases) with ``flags``."""
    description = read_dataset_description(folder)
    cases = load_cases(find_cases(folder), len(description.class_names) if description else 4)
    names = description.channel_names if description else None
    dataset = SAMPLE_DATASET if folder == SAMPLE_DATA else folder.name
    return make_plan(cases, dataset, parser().parse_args(["--data", str(folder), *flags]), preferred_patch_2d,
                     names, description)


def test_plan_of_the_ct_phantom_reads_its_spacing_shape_and_foreground(ct_folder):
    cases = load_cases(find_cases(ct_folder), 4)
    plan, volumetric = _plan(ct_folder, []), _plan(ct_folder, ["--spatial-dims", "3"])
    spacings = np.array([case.spacing for case in cases])
    np.testing.assert_allclose(volumetric.target_spacing, np.median(spacings, axis=0))
    assert plan.target_spacing == volumetric.target_spacing[1:]  # a 2D network works at the in-plane pair
    # The phantom's 96 mm field of view at its median in-plane spacing: slices of about 96 / 0.8 = 120 voxels.
    median = plan.fingerprint.median_shape(plan.fingerprint.median_spacing())
    assert abs(median[1] - 96 / plan.target_spacing[0]) <= 2
    assert plan.patch_size == (112, 112)  # 128 does not fit a 120-voxel slice; 112, a multiple of 16, does
    assert all(side % 16 == 0 for side in volumetric.patch_size)
    assert np.prod(volumetric.patch_size) <= 128 ** 3
    (ct,) = plan.fingerprint.channels
    # The organs and the body (40-90 HU, 12 HU noise) are the foreground: air (-1000 HU) is clipped out.
    assert 40 < ct.mean < 90 and 0 < ct.percentile_00_5 < 40 < 90 < ct.percentile_99_5 < 150
    (normalization,) = plan.channel_normalization
    assert normalization.scheme == "ct" and normalization.clip == (ct.percentile_00_5, ct.percentile_99_5)
    assert plan.class_names == ("background", "liver", "spleen", "kidney") and plan.channel_names == ("CT",)


def test_plan_keeps_acdcs_shipped_recipe():
    assert _plan(SAMPLE_DATA, []).patch_size == (128, 128)  # quick and --cpu
    plan = _plan(SAMPLE_DATA, ["--paper"], 224)
    assert plan.patch_size == (224, 224) and plan.target_spacing == (1.5, 1.5)
    # ACDC keeps the shipped models' per-image percentile scaling: its bundles record nothing new
    assert plan.channel_normalization is None and default_scheme(SAMPLE_DATASET) == "percentile"
    assert plan.class_names[1:] == ("right ventricle", "myocardium", "left ventricle")


def test_the_plans_patch_is_a_multiple_of_the_networks_own_stride(ct_folder):
    """The plan's patch follows the network's down-sampling: multiples of 16 for the default UNet (four
    halvings), of 2 for one that halves once, which can then take a patch of the median slice's own size."""
    default = _plan(ct_folder, ["--spatial-dims", "3"])
    once = _plan(ct_folder, ["--spatial-dims", "3", "--network-arg", "channels=[4,8]", "--network-arg",
                             "strides=[2]", "--network-arg", "num_res_units=0"])
    median = default.fingerprint.median_shape(default.fingerprint.median_spacing())
    assert all(side % 16 == 0 for side in default.patch_size)
    assert all(side % 2 == 0 for side in once.patch_size) and any(side % 16 for side in once.patch_size)
    assert all(abs(side - size) < 2 for side, size in zip(once.patch_size, median))


def test_a_3d_patch_is_shrunk_along_its_longest_axis_to_the_budget():
    patch = patch_3d((200, 300, 300), (1.0, 1.0, 1.0), voxel_budget=128 ** 3)
    assert np.prod(patch) <= 128 ** 3 and all(side % 16 == 0 for side in patch)
    assert patch_3d((40, 64, 64), (3.0, 1.0, 1.0)) == (32, 64, 64)  # fits: only rounded to multiples of 16


# ----------------------------------------------------------------- normalisation
def test_bundles_without_channel_normalization_predict_as_before():
    """A shipped bundle through today's code path by hand (one volume-level percentile range, (n, y, x) slices)
    against Predictor: the same probabilities, bit for bit."""
    predictor = Predictor(resolve_bundle_path("acdc_nacl"), device="cpu", batch_size=4)  # five networks
    assert predictor.metadata.preprocessing.channel_normalization is None
    image = load_cases(find_cases(SAMPLE_DATA)[:1], 4)[0].image[:3]
    spacing = (10.0, 1.5, 1.5)
    predicted = predictor.predict(image, spacing, keep_probabilities=True).probabilities
    intensity = intensity_range(image, "percentile", 99.0)
    logits = predictor.slice_logits(scale_intensity(image, intensity), spacing[1:])
    by_hand, disagreement = predictor.input_grid_probabilities(logits, predictor.metadata.temperature,
                                                               image.shape[1:])
    assert disagreement.shape == image.shape and disagreement.max() > 0  # the networks' spread, per voxel
    np.testing.assert_array_equal(predicted, by_hand.transpose(0, 1).numpy())
    np.testing.assert_array_equal(predicted, predictor.predict(image[None], spacing, keep_probabilities=True)
                                  .probabilities)  # (1, z, y, x) is the same one channel


def test_a_small_bright_lesion_survives_the_planned_normalisation():
    """The lesion phantom's T2-only lesion (0.1-0.5 % of the voxels): the plan's per-image z-score keeps it
    brighter than the tissue around it; the percentile scaling puts all of it on the clip, among tissue."""
    phantom = lesion_case(np.random.default_rng(3))
    case = Case("lesion_000", "lesion_000", np.stack(phantom.channels), phantom.label, phantom.spacing)
    lesion = case.label == 3
    assert 0.001 <= lesion.mean() <= 0.005
    fingerprint = make_fingerprint([case], ["T1", "T2", "FLAIR"])
    schemes = channel_normalization(fingerprint.channels, default_scheme("lesion30"))
    planned = Preprocessing(channel_normalization=schemes)
    assert [item.scheme for item in planned.channel_normalization] == ["zscore"] * 3
    t2 = normalize_channels(case.image, planned)[1]
    brightest_other = t2[~lesion].max()
    assert np.mean(t2[lesion] > brightest_other) > 0.9  # the lesion stands apart (its blurred rim aside)
    assert np.median(t2[lesion]) > brightest_other + 2 * t2[~lesion & (case.label > 0)].std()
    clipped = normalize_channels(case.image, Preprocessing())[1]  # ACDC's scaling, [min, p99] → [0, 1]
    on_the_clip = clipped == clipped.max()
    assert on_the_clip[lesion].all() and np.count_nonzero(on_the_clip & ~lesion) > lesion.sum()


def test_data_alone_learns_the_small_lesion_in_a_short_run(tmp_path):
    """Issue 49's case end to end: ``--data`` with no method or normalisation flag (CE+Dice, per-image z-score)
    learns the T2-only lesion of 0.1-0.5 % of the voxels to Dice >= 0.8 on every held-back case, in 6 epochs of
    50 batches (about a minute on the 2-core CPU; CRaC's multipliers dropped it in the quick schedule,
    docs/training.md)."""
    folder = write_phantom(tmp_path / "lesion12", "lesion", cases=12)
    out = tmp_path / "run"
    assert train_main(["--data", str(folder), "--epochs", "6", "--iterations-per-epoch", "50", "--no-compile",
                       "--device", "cpu", "--out", str(out)]) == 0
    assert json.loads((out / "run.json").read_text())["method"] == "ce_dice"
    with (out / "evaluation" / "per_case.csv").open() as rows:
        lesion = [float(row["dice_lesion"]) for row in csv.DictReader(rows) if row["variant"] == "scaled"]
    assert len(lesion) == 2 and min(lesion) >= 0.8, lesion


def test_z_score_keeps_the_top_one_percent_of_intensities_apart():
    """An affine map of the whole image, nothing clipped: the order and the distinct values of the brightest
    1 % survive whatever their range (a long tail, a few extreme voxels)."""
    rng = np.random.default_rng(0)
    image = np.concatenate([rng.normal(380, 24, 20_000), rng.lognormal(7, 1.5, 200)]).astype(np.float32)
    image = image.reshape(20, 10, 101)
    fingerprint = make_fingerprint([Case("a", "a", image, np.ones(image.shape, np.uint8), (1.0, 1.0, 1.0))],
                                   ["image"])
    zscore = Preprocessing(channel_normalization=channel_normalization(fingerprint.channels))
    scaled = normalize_channels(image, zscore)
    scaled, values = scaled.ravel(), image.ravel()
    top = np.argsort(values)[-len(values) // 100:]
    assert np.all(np.diff(scaled[top]) >= 0) and len(np.unique(scaled[top])) == len(np.unique(values[top]))
    expected = (values - image.mean(dtype=np.float64)) / image.std(dtype=np.float64)
    np.testing.assert_allclose(scaled, expected, rtol=1e-5, atol=1e-5)


def test_channel_normalization_is_validated_on_load():
    metadata = make_test_metadata()
    metadata.preprocessing = Preprocessing(channel_normalization=[{"scheme": "ct", "clip": [90, 10], "mean": 1.0,
                                                                   "std": 2.0}])
    with pytest.raises(BundleError, match=r"channel_normalization\[0\]: a ct channel's clip must be .* low < high"):
        metadata.validate()
    metadata.preprocessing = Preprocessing(channel_normalization=[{"scheme": "ct", "clip": [10, 90], "mean": 1.0,
                                                                   "std": 2.0}])
    metadata.validate()
    ct = metadata.preprocessing.channel_normalization[0]
    image = np.array([[[-1000.0, 50.0], [300.0, 12.0]]])
    np.testing.assert_allclose(normalize_channels(image, metadata.preprocessing)[0],
                               (np.clip(image, 10, 90) - ct.mean) / ct.std, rtol=1e-6)


# ----------------------------------------------------------------- training and prediction
_TINY = ["--network-arg", "channels=[8,16]", "--network-arg", "strides=[2]", "--network-arg", "num_res_units=0",
         "--epochs", "1", "--iterations-per-epoch", "2", "--batch-size", "4", "--no-compile", "--method", "ce_dice",
         "--no-eval", "--temperature-fit", "none"]


@pytest.fixture(scope="module")
def ct_run(ct_folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ct_run") / "run"
    train_main(["--data", str(ct_folder), "--out", str(out), *_TINY])
    return out


@pytest.fixture(scope="module")
def mr_run(mr_folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mr_run") / "run"
    train_main(["--data", str(mr_folder), "--out", str(out), *_TINY])
    return out


def test_ct_run_records_names_plan_and_its_normalization(ct_run):
    metadata = load_bundle(ct_run / "model.calibseg").metadata
    assert metadata.channel_names == ["CT"] and metadata.class_names == ["background", "liver", "spleen", "kidney"]
    plan = metadata.training["plan"]
    (ct,) = metadata.preprocessing.channel_normalization
    (channel,) = plan["fingerprint"]["channels"]
    assert ct.scheme == "ct" and list(ct.clip) == [channel["percentile_00_5"], channel["percentile_99_5"]]
    assert ct.mean == channel["mean"] and ct.std == channel["std"]
    assert list(metadata.preprocessing.target_spacing) == plan["target_spacing"]
    assert list(metadata.sliding_window.patch_size) == plan["patch_size"]
    run = json.loads((ct_run / "run.json").read_text())
    assert run["config"]["plan"] == plan == json.loads((ct_run / "plan.json").read_text())


def test_four_channel_bundle_round_trips_and_predicts(mr_run, mr_folder, tmp_path):
    metadata = load_bundle(mr_run / "model.calibseg").metadata
    assert metadata.in_channels == 4 and metadata.channel_names == ["T1", "T1ce", "T2", "FLAIR"]
    assert metadata.class_names == ["background", "edema", "necrosis", "enhancing"]
    # MRI channels of one's own data: z-scored per image, nothing clipped (nnU-Net's choice)
    assert [item.scheme for item in metadata.preprocessing.channel_normalization] == ["zscore"] * 4
    predictor = Predictor(mr_run / "model.calibseg", device="cpu")
    case = load_cases(find_cases(mr_folder)[:1], 4)[0]
    prediction = predictor.predict(case.image, case.spacing)
    assert prediction.labels.shape == case.label.shape
    with pytest.raises(ValueError, match=r"takes 4 channel\(s\) \(T1, T1ce, T2, FLAIR\) but the image has 1"):
        predictor.predict(case.image[0], case.spacing)
    images = [str(mr_folder / "imagesTr" / f"mr_000_000{index}.nii.gz") for index in range(4)]
    out = tmp_path / "out"
    assert predict_main(["--bundle", str(mr_run / "model.calibseg"), *sum((["--image", path] for path in images), []),
                         "--out-dir", str(out), "--device", "cpu"]) == 0
    labels, _ = read_image(out / "mr_000_labels.nii.gz")  # named after the case, not its first channel file
    np.testing.assert_array_equal(labels, prediction.labels)


def test_predict_refuses_a_wrong_image_count_and_other_grids(mr_run, mr_folder, tmp_path, capsys):
    bundle = str(mr_run / "model.calibseg")
    images = [mr_folder / "imagesTr" / f"mr_001_000{index}.nii.gz" for index in range(4)]
    arguments = ["--bundle", bundle, "--out-dir", str(tmp_path / "out"), "--device", "cpu"]
    assert predict_main([*arguments, *sum((["--image", str(path)] for path in images[:3]), [])]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("error: The model reads 4 channel(s) (T1, T1ce, T2, "
                                                       "FLAIR), one file each, but 3 file(s) were given.")
    image, geometry = read_image(images[3])
    write_image(tmp_path / "mr_001_0003.nii.gz", image, replace(geometry, origin=(5.0, 0.0, 0.0)))
    assert predict_main([*arguments, *sum((["--image", str(path)] for path in images[:3]), []),
                         "--image", str(tmp_path / "mr_001_0003.nii.gz")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "mr_001_0003.nii.gz is not on mr_001_0000.nii.gz's grid" in error
    assert not (tmp_path / "out").exists()


def test_image_dir_groups_channel_files_into_cases(mr_run, mr_folder, tmp_path):
    import shutil

    folder = tmp_path / "in"
    folder.mkdir()
    for path in sorted((mr_folder / "imagesTr").glob("mr_00[45]_*.nii.gz")):
        shutil.copy(path, folder / path.name)
    assert [[path.name for path in case] for case in folder_cases(folder)] == [
        [f"mr_00{number}_000{index}.nii.gz" for index in range(4)] for number in (4, 5)]
    assert predict_main(["--bundle", str(mr_run / "model.calibseg"), "--image-dir", str(folder),
                         "--out-dir", str(tmp_path / "out"), "--device", "cpu"]) == 0
    assert (tmp_path / "out" / "mr_004_labels.nii.gz").is_file()
    assert (tmp_path / "out" / "mr_005_summary.json").is_file()


def test_gamma_of_z_scored_channels_works_on_each_crop_channels_own_range():
    from Training.batches import _gamma

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    images = torch.randn(3, 2, 8, 8) * torch.tensor([1.0, 50.0]).view(1, 2, 1, 1)  # z-scored, any range
    gamma = torch.tensor([0.5, 1.0, 2.0]).view(3, 1, 1, 1)
    changed = _gamma(images, gamma, unit_range=False)
    # Each crop channel keeps its range and its order of intensities; gamma 1 changes nothing.
    torch.testing.assert_close(changed.amin(dim=(2, 3)), images.amin(dim=(2, 3)))
    torch.testing.assert_close(changed.amax(dim=(2, 3)), images.amax(dim=(2, 3)))
    in_order = changed.flatten(2).gather(2, images.flatten(2).argsort())  # monotonic: sorted stays sorted
    assert (in_order.diff(dim=2) >= -1e-4 * in_order.abs().amax()).all()
    torch.testing.assert_close(changed[1], images[1])
    assert not torch.allclose(changed[0], images[0])
    unit = torch.rand(3, 1, 8, 8)
    assert torch.equal(_gamma(unit, gamma, unit_range=True), unit.pow(gamma))  # percentile channels: as before
