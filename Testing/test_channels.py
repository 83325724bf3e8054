"""Own data: dataset.json in both forms, multi-channel cases, channel names in the bundle (issue 41)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from CalibSegLib.bundle import BundleError
from Datasets.cases import DataError, find_cases, load_cases, read_dataset_description
from Datasets.phantoms import write_phantom
from Datasets.splits import make_split
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
    with pytest.raises(DataError, match="Channel 2 of mr_001 .* one grid"):
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
