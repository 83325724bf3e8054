"""The generated datasets (Datasets/phantoms.py): the layouts real downloads use, the contrasts they
promise (CT organs 15-20 HU apart, each MRI structure visible in one channel only), reproducible from a
seed, and a refused folder left as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest

from CalibSegLib.io import read_image
from Datasets import phantoms
from Datasets.dataset_json import read_dataset_description
from fault_checks import assert_one_sentence, tree_snapshot


def _means(image: np.ndarray, label: np.ndarray, classes: int) -> list[float]:
    return [float(image[label == index].mean()) for index in range(classes)]


def test_ct_phantom_is_a_decathlon_folder_in_hounsfield_units_with_anisotropic_slices(tmp_path):
    folder = phantoms.write_phantom(tmp_path / "ct", "ct", cases=5, seed=3)
    description = json.loads((folder / "dataset.json").read_text())
    assert description["modality"] == {"0": "CT"}
    assert read_dataset_description(folder).class_names == ["background", "liver", "spleen", "kidney"]
    images = sorted((folder / "imagesTr").iterdir())
    assert [path.name for path in images] == [f"ct_{index:03d}_0000.nii.gz" for index in range(5)]
    spacings = []
    for path in images:
        image, geometry = read_image(path)
        label, label_geometry = read_image(folder / "labelsTr" / path.name.replace("_0000", ""))
        assert label_geometry.matches(geometry) and label.shape == image.shape
        assert set(np.unique(label)) == {0, 1, 2, 3}
        tissue = np.median(image[(label == 0) & (image > -500)])  # the body, not its blurred rim
        liver, spleen, kidney = _means(image, label, 4)[1:]
        # Neighbours 15-20 HU apart (partial volume pulls small organs' means a little towards their surroundings).
        assert 10 < liver - tissue < 20 and 10 < spleen - liver < 20 and 12 < kidney - spleen < 25
        assert image.min() < -900  # air
        spacings.append(geometry.spacing)
    assert all(z > 2 * y and y == x for z, y, x in spacings)
    assert len({spacing for spacing in spacings}) == 5  # every case its own scanner setting


def test_multichannel_phantom_shows_each_structure_in_its_own_channel_only(tmp_path):
    folder = phantoms.write_phantom(tmp_path / "mr", "multichannel", cases=5, seed=1)
    description = json.loads((folder / "dataset.json").read_text())
    assert description["channel_names"] == {"0": "T1", "1": "T1ce", "2": "T2", "3": "FLAIR"}
    assert description["file_ending"] == ".nii.gz" and description["labels"]["background"] == 0
    label, _ = read_image(folder / "labelsTr" / "mr_002.nii.gz")
    channels = [read_image(folder / "imagesTr" / f"mr_002_{channel:04d}.nii.gz")[0] for channel in range(4)]
    head = channels[0] > 0.5 * channels[0].max()
    for channel in range(1, 4):
        means = _means(channels[channel], label, 4)
        tissue = float(channels[channel][head & (label == 0)].mean())
        assert means[channel] > 1.5 * tissue  # the channel's own structure is bright ...
        others = [means[index] for index in range(1, 4) if index != channel]
        assert all(abs(value - tissue) < 0.2 * tissue for value in others)  # ... the others invisible


def test_lesion_phantom_hides_a_small_bright_lesion_in_t2_only(tmp_path):
    folder = phantoms.write_phantom(tmp_path / "lesion", "lesion", cases=5, seed=2)
    description = read_dataset_description(folder)
    assert description.channel_names == ["T1", "T2", "FLAIR"]
    assert description.class_names == ["background", "edema", "core", "lesion"]
    for case in range(5):
        label, _ = read_image(folder / "labelsTr" / f"lesion_{case:03d}.nii.gz")
        t1, t2, flair = (read_image(folder / "imagesTr" / f"lesion_{case:03d}_{channel:04d}.nii.gz")[0]
                         for channel in range(3))
        assert 0.001 <= np.mean(label == 3) <= 0.005  # 0.1-0.5 % of the voxels
        head = (label == 0) & (t2 > 0.5 * np.median(t2[label == 1]))  # edema does not show in T2
        # about 800 against tissue of 380 ± 24 (each case has its own gain)
        assert 1.8 < np.median(t2[label == 3]) / np.median(t2[head]) < 2.4
        for image, shown in ((t1, 2), (t2, 3), (flair, 1)):  # each structure bright in its own channel only
            means, tissue = _means(image, label, 4), float(np.median(image[head]))
            assert means[shown] > 1.5 * tissue
            assert all(abs(means[other] - tissue) < 0.2 * tissue for other in (1, 2, 3) if other != shown)


def test_flat_lesion_phantom_puts_the_lesion_in_a_quarter_of_the_foreground_slices(tmp_path):
    """Issue 61's case: a T2-only lesion of about 0.2 % of the voxels in about 5 of some 20 slices holding
    foreground; the rest as the lesion phantom."""
    folder = phantoms.write_phantom(tmp_path / "flat", "flat-lesion", cases=5, seed=4)
    assert read_dataset_description(folder).class_names == ["background", "edema", "core", "lesion"]
    for case in range(5):
        label, geometry = read_image(folder / "labelsTr" / f"flatlesion_{case:03d}.nii.gz")
        t2, flair = (read_image(folder / "imagesTr" / f"flatlesion_{case:03d}_{channel:04d}.nii.gz")[0]
                     for channel in (1, 2))
        assert geometry.spacing == (1.0, 1.0, 1.0)
        assert 0.0013 <= np.mean(label == 3) <= 0.0027
        lesion_slices = int((label == 3).any(axis=(1, 2)).sum())
        foreground_slices = int((label > 0).any(axis=(1, 2)).sum())
        assert 4 <= lesion_slices <= 6 and 14 <= foreground_slices <= 30
        head = (label == 0) & (t2 > 0.5 * np.median(t2[label == 1]))
        assert 1.8 < np.median(t2[label == 3]) / np.median(t2[head]) < 2.4
        assert abs(np.mean(flair[label == 3]) - np.median(flair[head])) < 0.2 * np.median(flair[head])


def test_the_same_seed_writes_the_same_phantom(tmp_path):
    first = phantoms.write_phantom(tmp_path / "a", "ct", cases=5, seed=7)
    second = phantoms.write_phantom(tmp_path / "b", "ct", cases=5, seed=7)
    assert tree_snapshot(first) == tree_snapshot(second)


@pytest.mark.parametrize("arguments, phrase", [
    (["--kind", "ct", "--cases", "3"], "at least 5 cases"),
    (["--kind", "ct"], "not empty"),
])
def test_bad_requests_are_one_sentence_and_leave_the_folder_alone(tmp_path, capsys, arguments, phrase):
    out = tmp_path / "existing"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    before = tree_snapshot(tmp_path)
    with pytest.raises(SystemExit) as stop:
        phantoms.main([*arguments, "--out", str(out)])
    assert_one_sentence(str(stop.value.code), phrase)
    assert tree_snapshot(tmp_path) == before
