"""Training crops: foreground oversampling by class, image/label alignment under augmentation, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from CalibSegLib.preprocessing import Preprocessing
from Training.batches import NO_AUGMENTATION, Augmentation, CropSampler, assemble, iterate_batches, plan_epoch
from Datasets.cases import Case, DataError, GridVolume, to_model_grid


def synthetic_volume(depth: int = 4, size: int = 96) -> GridVolume:
    """Labels: a large class-1 square, a small class-2 square and a tiny class-3 blob; the image encodes them."""
    labels = torch.zeros(depth, size, size, dtype=torch.uint8)
    labels[:, 10:70, 10:70] = 1
    labels[:, 75:85, 75:85] = 2
    labels[:, 5:7, 85:87] = 3
    return GridVolume("synthetic", (labels.float() / 3).unsqueeze(1), labels)


def test_foreground_crops_are_centred_on_every_class_equally_often():
    sampler = CropSampler([synthetic_volume()], 4)
    slices, centres = sampler.foreground_centres(3000, torch.Generator().manual_seed(0))
    volume = sampler.volumes[0]
    classes = volume.labels[sampler.slice_z[slices], centres[:, 0].long(), centres[:, 1].long()]
    counts = torch.bincount(classes.long(), minlength=4)
    assert counts[0] == 0  # always a foreground voxel
    # 3600, 100 and 4 voxels per slice, yet each class is drawn about a third of the time.
    assert all(abs(int(count) / 3000 - 1 / 3) < 0.04 for count in counts[1:])


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
