"""Training crops: foreground oversampling by class (both samplers), image/label alignment under augmentation,
determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from CalibSegLib.preprocessing import Preprocessing
from Training.batches import (FOREGROUND_SAMPLERS, NO_AUGMENTATION, Augmentation, CropSampler, assemble,
                              iterate_batches, plan_epoch)
from Datasets.errors import DataError
from Datasets.loading import Case
from Datasets.model_grid import GridVolume, to_model_grid


def synthetic_volume(depth: int = 4, size: int = 96) -> GridVolume:
    """Labels: a large class-1 square, a small class-2 square and a tiny class-3 blob; the image encodes them."""
    labels = torch.zeros(depth, size, size, dtype=torch.uint8)
    labels[:, 10:70, 10:70] = 1
    labels[:, 75:85, 75:85] = 2
    labels[:, 5:7, 85:87] = 3
    return GridVolume("synthetic", (labels.float() / 3).unsqueeze(1), labels)


@pytest.mark.parametrize("sampling", FOREGROUND_SAMPLERS)
def test_foreground_crops_are_centred_on_every_class_equally_often(sampling):
    """Every class in every slice: both samplers draw each class a third of the time."""
    sampler = CropSampler([synthetic_volume()], 4)
    slices, centres = sampler.foreground_centres(3000, torch.Generator().manual_seed(0), sampling)
    classes = sampler.labels[slices, 0, centres[:, 0].long(), centres[:, 1].long()]
    counts = torch.bincount(classes.long(), minlength=4)
    assert counts[0] == 0  # always a foreground voxel
    # 3600, 100 and 4 voxels per slice, yet each class is drawn about a third of the time.
    assert all(abs(int(count) / 3000 - 1 / 3) < 0.04 for count in counts[1:])


def volume_with_a_class_in_few_slices(depth: int, size: int = 48) -> GridVolume:
    """Classes 1 and 2 in every one of ``depth`` slices; class 3 in slices 3 (4 voxels) and 4 (12 voxels) only."""
    labels = torch.zeros(depth, size, size, dtype=torch.uint8)
    labels[:, 4:30, 4:30] = 1
    labels[:, 32:40, 32:40] = 2
    labels[3, 40:42, 2:4] = 3
    labels[4, 40:43, 2:6] = 3
    return GridVolume(f"few-slices-{depth}", (labels.float() / 3).unsqueeze(1), labels)


def classes_at(sampler: CropSampler, items: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """The label ``(n,)`` at each crop centre ``(n, d)`` of the stacked ``items``."""
    return sampler.labels[(items, 0, *centres.long().T)].long()


def test_class_first_crops_draw_every_class_of_a_volume_equally_often_however_few_slices_hold_it():
    """nnU-Net's draw: a volume, then a class present in it, then a voxel of that class anywhere in it. Class 3
    lies in 2 of a volume's 20 (or 10) slices: the class-first sampler draws it a third of the time, the
    slice-first one about 2/20 · 1/3 of it; volumes are drawn equally often whatever their depth, and the class's
    voxels uniformly (its 4- and 12-voxel slices 1 : 3)."""
    volumes = [volume_with_a_class_in_few_slices(20), volume_with_a_class_in_few_slices(10, size=44)]
    sampler = CropSampler(volumes, 4)
    draws = 6000  # a share's binomial sd is at most 0.0065
    items, centres = sampler.foreground_centres(draws, torch.Generator().manual_seed(0), "class")
    classes = classes_at(sampler, items, centres)
    assert (classes > 0).all()  # every centre on a voxel of the class drawn
    shares = torch.bincount(classes, minlength=4)[1:] / draws
    assert (shares - 1 / 3).abs().max() < 0.03
    assert abs(float((sampler.slice_volume[items] == 0).float().mean()) - 0.5) < 0.03
    lesion_slices = torch.bincount(sampler.slice_z[items[classes == 3]], minlength=5)[3:5].float()
    assert 2.5 < float(lesion_slices[1] / lesion_slices[0]) < 3.6
    items, centres = sampler.foreground_centres(draws, torch.Generator().manual_seed(0), "slice")
    slice_first_share = float((classes_at(sampler, items, centres) == 3).float().mean())
    assert 0.01 < slice_first_share < 0.06  # 2 of 20 and 2 of 10 slices: about 0.033


def test_for_a_3d_network_both_samplers_make_the_same_draw():
    """A 3D network's items are whole volumes, so drawing an item holding foreground is drawing a volume:
    class-first and slice-first centring give the very same crops from the same generator."""
    volumes = [synthetic_volume_3d(), synthetic_volume_3d(depth=10, size=36), synthetic_volume_3d(depth=8, size=30)]
    sampler = CropSampler(volumes, 4)
    slice_first = sampler.foreground_centres(500, torch.Generator().manual_seed(3), "slice")
    class_first = sampler.foreground_centres(500, torch.Generator().manual_seed(3), "class")
    assert torch.equal(slice_first[0], class_first[0]) and torch.equal(slice_first[1], class_first[1])
    assert (classes_at(sampler, *class_first) > 0).all()


def test_an_unknown_foreground_sampling_is_one_sentence():
    sampler = CropSampler([synthetic_volume()], 4)
    with pytest.raises(ValueError, match="Unknown foreground sampling 'volume'; choose one of class, slice"):
        plan_epoch(sampler, 4, 1, torch.Generator(), (32, 32), foreground_sampling="volume")


def test_foreground_share_decides_how_many_crops_hold_foreground():
    sampler = CropSampler([synthetic_volume(size=200)], 4)
    generator = torch.Generator().manual_seed(1)
    plans = plan_epoch(sampler, 50, 20, generator, (16, 16), NO_AUGMENTATION, foreground_share=1.0)
    for plan in plans[:3]:
        images, target = assemble(sampler, plan, (16, 16), torch.device("cpu"))
        assert (target > 0).flatten(1).any(dim=1).all()


@pytest.mark.parametrize("augmentation", [NO_AUGMENTATION, Augmentation(gamma_probability=0.0,
                                                                         contrast_probability=0.0,
                                                                         brightness_probability=0.0,
                                                                         noise_probability=0.0)])
def test_rotated_scaled_mirrored_crops_keep_images_and_labels_aligned(augmentation):
    """The image is label / 3, so away from label edges (where bilinear and nearest differ) they must agree."""
    sampler = CropSampler([synthetic_volume()], 4)
    plans = plan_epoch(sampler, 16, 4, torch.Generator().manual_seed(2), (48, 48), augmentation)
    for plan in plans:
        images, target = assemble(sampler, plan, (48, 48), torch.device("cpu"))
        agreement = (torch.round(images[:, 0] * 3).long() == target).float().mean()
        assert agreement > 0.93


def test_plans_are_reproducible_and_threads_assemble_the_same_batches():
    sampler = CropSampler([synthetic_volume()], 4)
    first = plan_epoch(sampler, 8, 5, torch.Generator().manual_seed(3), (32, 32))
    second = plan_epoch(sampler, 8, 5, torch.Generator().manual_seed(3), (32, 32))
    for a, b in zip(first, second):
        torch.testing.assert_close(a.centre, b.centre)
        torch.testing.assert_close(a.angle, b.angle)
        assert a.noise_seed == b.noise_seed
    in_loop = list(iterate_batches(sampler, first, (32, 32), torch.device("cpu"), workers=0))
    threaded = list(iterate_batches(sampler, first, (32, 32), torch.device("cpu"), workers=2))
    for (images, target), (threaded_images, threaded_target) in zip(in_loop, threaded):
        torch.testing.assert_close(images, threaded_images, rtol=0, atol=0)
        torch.testing.assert_close(target, threaded_target, rtol=0, atol=0)


def reference_crops(volumes: list[GridVolume], sampler: CropSampler, plan, patch_size
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per crop, one grid_sample on its own volume's slice (unpadded), with the source position of every
    crop voxel written out: centre + scale · rotation(angle) · mirror · offset from the crop centre."""
    height, width = patch_size
    offset_y, offset_x = torch.meshgrid(torch.arange(height) + 0.5 - height / 2,
                                        torch.arange(width) + 0.5 - width / 2, indexing="ij")
    images, labels = [], []
    for crop, index in enumerate(plan.slice_index.tolist()):
        volume = volumes[int(sampler.slice_volume[index])]
        z = int(sampler.slice_z[index])
        mirrored_x = -offset_x if bool(plan.flip[crop]) else offset_x
        angle, scale = float(plan.angle[crop]), float(plan.scale[crop])
        source_x = plan.centre[crop, 1] + scale * (math.cos(angle) * mirrored_x - math.sin(angle) * offset_y)
        source_y = plan.centre[crop, 0] + scale * (math.sin(angle) * mirrored_x + math.cos(angle) * offset_y)
        slice_height, slice_width = volume.labels.shape[1:]
        grid = torch.stack([2 * source_x / slice_width - 1, 2 * source_y / slice_height - 1], dim=-1)[None].float()
        images.append(F.grid_sample(volume.images[z:z + 1], grid, mode="bilinear", align_corners=False))
        labels.append(F.grid_sample(volume.labels[z:z + 1, None].float(), grid, mode="nearest", align_corners=False))
    return torch.cat(images), torch.cat(labels)[:, 0].long()


def test_batched_crops_equal_one_grid_sample_per_crop_on_slices_of_different_sizes():
    """Slices padded into one stack and cut by one grid_sample give what each slice alone gives."""
    volumes = [synthetic_volume(depth=3, size=96), synthetic_volume(depth=2, size=120)]
    ramp = torch.linspace(0, 1, 120)
    volumes[1] = GridVolume("ramp", (volumes[1].images + ramp).clamp(0, 1) * 0.5, volumes[1].labels[:, :, :])
    sampler = CropSampler(volumes, 4)
    no_intensity = Augmentation(gamma_probability=0.0, contrast_probability=0.0, brightness_probability=0.0,
                                noise_probability=0.0)
    for plan in plan_epoch(sampler, 16, 3, torch.Generator().manual_seed(4), (40, 56), no_intensity):
        images, target = assemble(sampler, plan, (40, 56), torch.device("cpu"))
        expected_images, expected_target = reference_crops(volumes, sampler, plan, (40, 56))
        torch.testing.assert_close(images, expected_images, rtol=0, atol=1e-4)
        # Nearest neighbour may round the other way exactly between two voxels: at most a few voxels.
        assert (target != expected_target).float().mean() < 1e-3


def test_an_unaugmented_crop_on_voxel_boundaries_is_the_slice_itself():
    volume = synthetic_volume(depth=2, size=96)
    volume = GridVolume("noise", torch.rand(2, 1, 96, 96, generator=torch.Generator().manual_seed(0)), volume.labels)
    sampler = CropSampler([volume, synthetic_volume(depth=1, size=128)], 4)
    plan = plan_epoch(sampler, 1, 1, torch.Generator().manual_seed(0), (32, 48), NO_AUGMENTATION)[0]
    plan = type(plan)(**{**plan.__dict__, "slice_index": torch.tensor([1]), "centre": torch.tensor([[30.0, 50.0]])})
    images, target = assemble(sampler, plan, (32, 48), torch.device("cpu"))
    torch.testing.assert_close(images[0, 0], volume.images[1, 0, 14:46, 26:74], rtol=0, atol=1e-5)
    assert torch.equal(target[0], volume.labels[1, 14:46, 26:74].long())


def test_shares_of_a_batch_are_its_crops_with_the_same_noise():
    sampler = CropSampler([synthetic_volume()], 4)
    noisy = Augmentation(noise_probability=1.0, noise_std=(0.05, 0.1))
    plan = plan_epoch(sampler, 8, 1, torch.Generator().manual_seed(5), (32, 32), noisy)[0]
    whole, whole_target = assemble(sampler, plan, (32, 32), torch.device("cpu"))
    shares = [assemble(sampler, plan.share(rank, 2), (32, 32), torch.device("cpu")) for rank in range(2)]
    torch.testing.assert_close(torch.cat([images for images, _ in shares]), whole, rtol=0, atol=1e-6)
    assert torch.equal(torch.cat([target for _, target in shares]), whole_target)
    assert plan.share(0, 16) is None and len(plan.share(2, 3)) == 2


def test_volumes_are_resampled_to_the_model_spacing_with_their_labels():
    image = np.zeros((2, 40, 60), np.float32)
    image[:, 10:30, 20:40] = 1.0
    label = (image > 0).astype(np.uint8)
    case = Case("c", "p", image, label, (5.0, 0.75, 0.75))
    volume, = to_model_grid([case], Preprocessing(target_spacing=(1.5, 1.5)), 2)
    assert volume.images.shape == (2, 1, 20, 30) and volume.labels.shape == (2, 20, 30)
    assert int(volume.labels.sum()) == 2 * 10 * 10  # the 20×20 mm square keeps its physical size


def test_a_volume_without_foreground_cannot_feed_foreground_crops():
    empty = GridVolume("e", torch.zeros(2, 1, 32, 32), torch.zeros(2, 32, 32, dtype=torch.uint8))
    with pytest.raises(DataError, match="no foreground voxel"):
        CropSampler([empty], 4).foreground_centres(4, torch.Generator())


def synthetic_volume_3d(depth: int = 12, size: int = 40) -> GridVolume:
    """A 3D network's item: one ``(1, 1, z, y, x)`` volume with a large class-1 box, a small class-2 box and a tiny
    class-3 blob; the image is label / 3."""
    labels = torch.zeros(1, depth, size, size, dtype=torch.uint8)
    labels[0, 2:10, 4:30, 4:30] = 1
    labels[0, 4:8, 32:38, 32:38] = 2
    labels[0, 9:11, 2:4, 34:36] = 3
    return GridVolume("synthetic-3d", (labels.float() / 3).unsqueeze(1), labels)


def test_3d_foreground_crops_are_centred_on_voxels_of_every_class_equally_often():
    sampler = CropSampler([synthetic_volume_3d(), synthetic_volume_3d(depth=10, size=36)], 4)
    assert sampler.images.shape == (2, 1, 12, 40, 40) and sampler.coordinates.shape[1] == 3
    items, centres = sampler.foreground_centres(3000, torch.Generator().manual_seed(0))
    position = centres.long()
    classes = sampler.labels[items, 0, position[:, 0], position[:, 1], position[:, 2]]
    counts = torch.bincount(classes.long(), minlength=4)
    assert counts[0] == 0  # every centre lies on a voxel of the class it claims, never on background
    assert counts[1:].min() > 0.28 * 3000  # the two-voxel-wide blob as often as the large box


def test_3d_crops_keep_images_and_labels_aligned_and_hold_the_foreground_share():
    """Rotated, scaled, mirrored 3D crops of one sampling grid: image (label / 3) and labels agree away from edges,
    and the planned share of crops is centred on foreground."""
    sampler = CropSampler([synthetic_volume_3d()], 4)
    no_intensity = Augmentation(gamma_probability=0.0, contrast_probability=0.0, brightness_probability=0.0,
                                noise_probability=0.0)
    plans = plan_epoch(sampler, 8, 6, torch.Generator().manual_seed(2), (8, 24, 24), no_intensity,
                       foreground_share=0.5)
    centred_on_foreground = 0
    for plan in plans:
        images, target = assemble(sampler, plan, (8, 24, 24), torch.device("cpu"))
        assert images.shape == (8, 1, 8, 24, 24) and target.shape == (8, 8, 24, 24)
        assert (torch.round(images[:, 0] * 3).long() == target).float().mean() > 0.93
        centred_on_foreground += int((target[:, 4, 12, 12] > 0).sum())
    assert 0.4 < centred_on_foreground / 48 <= 0.9  # half the crops planned on foreground, plus chance hits


def test_an_unaugmented_3d_crop_on_voxel_boundaries_is_the_volume_block_itself():
    volume = synthetic_volume_3d()
    volume = GridVolume("noise", torch.rand(1, 1, 12, 40, 40, generator=torch.Generator().manual_seed(0)),
                        volume.labels)
    sampler = CropSampler([volume], 4)
    plan = plan_epoch(sampler, 1, 1, torch.Generator().manual_seed(0), (6, 16, 20), NO_AUGMENTATION)[0]
    plan = type(plan)(**{**plan.__dict__, "centre": torch.tensor([[5.0, 20.0, 18.0]])})
    images, target = assemble(sampler, plan, (6, 16, 20), torch.device("cpu"))
    torch.testing.assert_close(images[0, 0], volume.images[0, 0, 2:8, 12:28, 8:28], rtol=0, atol=1e-5)
    assert torch.equal(target[0], volume.labels[0, 2:8, 12:28, 8:28].long())


@pytest.mark.parametrize("sampling", FOREGROUND_SAMPLERS)
@pytest.mark.parametrize("volume, patch_size", [(volume_with_a_class_in_few_slices(12), (32, 32)),
                                                (synthetic_volume_3d(), (8, 16, 16))], ids=["2d", "3d"])
def test_a_resumed_generator_draws_the_same_batches(volume, patch_size, sampling):
    """Every random draw of an epoch comes from the data-order generator: restoring its state (as a resumed run
    does from the checkpoint) gives the very batches the uninterrupted run drew, with either sampler."""
    sampler = CropSampler([volume], 4)
    generator = torch.Generator().manual_seed(7)
    plan_epoch(sampler, 4, 2, generator, patch_size, foreground_sampling=sampling)  # epoch 1
    saved = generator.get_state()
    uninterrupted = plan_epoch(sampler, 4, 3, generator, patch_size, foreground_share=0.5,
                               foreground_sampling=sampling)
    resumed = plan_epoch(sampler, 4, 3, torch.Generator().set_state(saved), patch_size, foreground_share=0.5,
                         foreground_sampling=sampling)
    for a, b in zip(uninterrupted, resumed, strict=True):
        assert torch.equal(a.slice_index, b.slice_index) and torch.equal(a.centre, b.centre)
        first, second = (assemble(sampler, plan, patch_size, torch.device("cpu")) for plan in (a, b))
        torch.testing.assert_close(first[0], second[0], rtol=0, atol=0)
        assert torch.equal(first[1], second[1])


def test_volumes_for_a_3d_network_are_resampled_whole_to_the_target_spacing():
    image = np.zeros((8, 40, 60), np.float32)
    image[2:6, 10:30, 20:40] = 1.0
    label = (image > 0).astype(np.uint8)
    case = Case("c", "p", image, label, (2.0, 0.75, 0.75))
    volume, = to_model_grid([case], Preprocessing(target_spacing=(4.0, 1.5, 1.5)), 2)
    assert volume.images.shape == (1, 1, 4, 20, 30) and volume.labels.shape == (1, 4, 20, 30)
    assert int(volume.labels.sum()) == 2 * 10 * 10  # the 8 × 20 × 20 mm box keeps its physical size
