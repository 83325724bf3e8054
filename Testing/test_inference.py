"""Predictor: input grid, value ranges, known toy outputs, temperature, slice axis, streaming, progress,
cancel and bad input."""

from __future__ import annotations

import math
import threading
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from CalibSegLib import networks
from CalibSegLib import inference
from CalibSegLib.bundle import Bundle, load_bundle, save_bundle
from CalibSegLib.device import resolve_device
from CalibSegLib.inference import InferenceCancelled, Predictor, confidence_maps
from CalibSegLib.postprocessing import Postprocessing
from CalibSegLib.preprocessing import Preprocessing
from CalibSegLib.sliding_window import MirrorAgreement, SlidingWindow
from tiny_bundles import make_test_bundle, make_test_metadata

SPACING = (8.0, 1.3, 0.7)  # anisotropic, mm


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory):
    return load_bundle(make_test_bundle(tmp_path_factory.mktemp("bundle") / "tiny.calibseg"))


@pytest.fixture(scope="module")
def predictor(tiny_bundle):
    return Predictor(tiny_bundle, device="cpu", batch_size=2)


def noise_volume(shape=(5, 41, 37), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).normal(100, 20, size=shape).astype(np.float32)


def _pixel_linear(spatial_dims: int, in_channels: int, num_classes: int, **kw) -> nn.Module:
    return nn.Conv2d(in_channels, num_classes, kernel_size=1)


@pytest.fixture()
def linear_bundle(monkeypatch, tmp_path):
    """Saved 2-class bundles of a hand-set 1×1 conv: logits (0, 8·x − 3) for normalised intensity x."""
    monkeypatch.setitem(networks._BUILDERS, "pixel_linear", _pixel_linear)

    def make(temperature=1.0, patch_size=(16, 16)):
        state = {"weight": torch.tensor([[[[0.0]]], [[[8.0]]]]), "bias": torch.tensor([0.0, -3.0])}
        metadata = make_test_metadata(
            2, patch_size, network="pixel_linear", network_kwargs={}, temperature=temperature
        )
        return load_bundle(save_bundle(tmp_path / f"linear_{temperature}.calibseg", state, metadata))

    return make


def expected_foreground_probability(normalised: np.ndarray, temperature: float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(8.0 * normalised - 3.0) / temperature))


def test_outputs_are_on_the_input_grid_with_valid_ranges(predictor):
    image = noise_volume()
    prediction = predictor.predict(image, SPACING, keep_probabilities=True)
    assert prediction.labels.shape == prediction.confidence.shape == prediction.entropy.shape == image.shape
    assert (prediction.labels.dtype, prediction.confidence.dtype, prediction.entropy.dtype) == (
        np.uint8,
        np.float32,
        np.float32,
    )
    assert all(
        array.flags.c_contiguous for array in (prediction.labels, prediction.confidence, prediction.entropy)
    )
    assert prediction.probabilities.shape == (4, *image.shape)
    assert prediction.confidence.min() >= 0.25 and prediction.confidence.max() <= 1.0
    assert prediction.entropy.min() >= 0.0 and prediction.entropy.max() <= 1.0
    probabilities = prediction.probabilities.astype(np.float64)
    np.testing.assert_allclose(probabilities.sum(0), 1.0, atol=1e-5)
    np.testing.assert_array_equal(prediction.labels, probabilities.argmax(0))
    np.testing.assert_allclose(prediction.confidence, probabilities.max(0), rtol=1e-6)
    entropy = -(probabilities * np.log(np.clip(probabilities, 1e-30, 1))).sum(0) / math.log(4)
    np.testing.assert_allclose(prediction.entropy, entropy, atol=1e-5)


def test_input_is_not_modified_and_integer_images_work(predictor):
    image = (noise_volume((3, 20, 20)) * 10).astype(np.int16)
    copy = image.copy()
    prediction = predictor.predict(image, SPACING)
    np.testing.assert_array_equal(image, copy)
    assert prediction.labels.shape == image.shape and prediction.probabilities is None


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_known_weights_give_known_confidence_through_resampling(linear_bundle, temperature):
    # Each slice is constant, so resampling from 1 mm to the model's 1.5 mm and back is exact and the
    # Gaussian blending of windows of a 1×1 convolution averages equal values; slice k normalises to k/4.
    image = np.repeat(np.arange(5, dtype=np.float32)[:, None, None] * 10.0, 20 * 24).reshape(5, 20, 24)
    prediction = Predictor(linear_bundle(temperature), device="cpu", batch_size=2).predict(image, (2, 1, 1))
    foreground = expected_foreground_probability(np.arange(5) / 4.0, temperature)[:, None, None]
    np.testing.assert_allclose(
        prediction.confidence, np.broadcast_to(np.maximum(foreground, 1 - foreground), image.shape), rtol=1e-5
    )
    np.testing.assert_array_equal(prediction.labels, np.broadcast_to(foreground > 0.5, image.shape))
    binary_entropy = -(
        foreground * np.log(foreground) + (1 - foreground) * np.log(1 - foreground)
    ) / math.log(2)
    np.testing.assert_allclose(prediction.entropy, np.broadcast_to(binary_entropy, image.shape), rtol=1e-4)


def test_known_weights_voxel_by_voxel_with_percentile_clipping(linear_bundle):
    image = np.random.default_rng(1).gamma(2.0, 50.0, size=(3, 16, 16)).astype(np.float32)
    low, high = image.min(), np.percentile(image, 99.0)
    normalised = (np.clip(image, low, high) - low) / (high - low)
    # At the model's own 1.5 mm nothing is resampled, so every voxel is checked against the formula.
    prediction = Predictor(linear_bundle(patch_size=(16, 16)), device="cpu").predict(
        image, (2, 1.5, 1.5), keep_probabilities=True
    )
    np.testing.assert_allclose(
        prediction.probabilities[1], expected_foreground_probability(normalised, 1.0), rtol=1e-5, atol=1e-6
    )


def test_per_class_temperature_divides_each_logit(linear_bundle):
    image = np.random.default_rng(2).random((2, 16, 16)).astype(np.float32)
    one = Predictor(linear_bundle(1.0), device="cpu").predict(image, (1, 1.5, 1.5), keep_probabilities=True)
    per_class = Predictor(linear_bundle([1.0, 2.0]), device="cpu").predict(
        image, (1, 1.5, 1.5), keep_probabilities=True
    )
    logit = np.log(one.probabilities[1]) - np.log(one.probabilities[0])  # 8x − 3 at T = 1
    np.testing.assert_allclose(
        per_class.probabilities[1], 1 / (1 + np.exp(-logit / 2.0)), rtol=1e-4, atol=1e-6
    )


def test_slice_axis_runs_along_the_declared_axis(tiny_bundle):
    along_x = Bundle(
        make_test_metadata(preprocessing=Preprocessing(slice_axis=2)),
        tiny_bundle.state_dict,
    )
    image = noise_volume((24, 20, 3))
    rotated = Predictor(along_x, device="cpu").predict(image, SPACING, keep_probabilities=True)
    moved_spacing = (SPACING[2], SPACING[0], SPACING[1])  # the spacing travels with its axis
    reference = Predictor(tiny_bundle, device="cpu").predict(
        np.ascontiguousarray(np.moveaxis(image, 2, 0)), moved_spacing, keep_probabilities=True
    )
    assert rotated.labels.shape == image.shape and rotated.labels.flags.c_contiguous
    np.testing.assert_allclose(
        rotated.confidence, np.moveaxis(reference.confidence, 0, 2), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        rotated.probabilities, np.moveaxis(reference.probabilities, 1, 3), rtol=1e-5, atol=1e-6
    )


def test_probability_sink_streams_each_batch_on_the_input_grid(predictor):
    image = noise_volume((5, 20, 22))
    batches = []
    kept = predictor.predict(
        image,
        SPACING,
        keep_probabilities=True,
        probability_sink=lambda slices, probs: batches.append((slices, probs.copy())),
    )
    assert [slices for slices, _ in batches] == [slice(0, 2), slice(2, 4), slice(4, 5)]
    np.testing.assert_array_equal(np.concatenate([probs for _, probs in batches], axis=1), kept.probabilities)


def test_probability_sums_are_the_kept_probabilities_summed_per_class(tiny_bundle):
    along_x = Bundle(make_test_metadata(preprocessing=Preprocessing(slice_axis=2)), tiny_bundle.state_dict)
    image = noise_volume((12, 18, 14))
    for bundle in (tiny_bundle, along_x):  # batches cut along either axis add up to the whole volume
        fitted, plain = Predictor(bundle, device="cpu", batch_size=5).predict_variants(
            image, (1.5, 1.5, 1.5), [0.5, 1.0], keep_probabilities=True)
        for prediction in (fitted, plain):
            expected = prediction.probabilities.reshape(4, -1).sum(axis=1, dtype=np.float64)
            np.testing.assert_allclose(prediction.probability_sums, expected, rtol=1e-6)
            assert prediction.probability_sums.sum() == pytest.approx(image.size, rel=1e-5)
        assert not np.allclose(fitted.probability_sums, plain.probability_sums)  # one sum per temperature


def test_batch_size_does_not_change_the_result(tiny_bundle):
    image = noise_volume((5, 24, 24))
    one = Predictor(tiny_bundle, device="cpu", batch_size=1).predict(image, SPACING)
    five = Predictor(tiny_bundle, device="cpu", batch_size=5).predict(image, SPACING)
    np.testing.assert_allclose(one.confidence, five.confidence, rtol=1e-5, atol=1e-6)


def test_progress_rises_and_reaches_one_exactly_once(predictor):
    calls = []
    predictor.predict(noise_volume((5, 20, 20)), SPACING, progress=calls.append)
    assert calls == [0.4, 0.8, 1.0]


def test_cancel_stops_before_the_next_batch(predictor):
    cancel, calls = threading.Event(), []

    def progress(fraction):
        calls.append(fraction)
        cancel.set()  # as if the user pressed Cancel during the first batch

    with pytest.raises(InferenceCancelled, match="after 2 of 9 slices"):
        predictor.predict(noise_volume((9, 20, 20)), SPACING, progress=progress, cancel=cancel)
    assert calls == [2 / 9]


def test_cancel_set_beforehand_runs_no_batch(predictor):
    cancel, sink_calls = threading.Event(), []
    cancel.set()
    with pytest.raises(InferenceCancelled):
        predictor.predict(
            noise_volume((4, 20, 20)),
            SPACING,
            cancel=cancel,
            probability_sink=lambda *args: sink_calls.append(args),
        )
    assert sink_calls == []


BAD_INPUTS = {
    "2D": (np.random.rand(20, 20), SPACING, "3D"),
    "two channels for one": (np.random.rand(2, 4, 20, 20), SPACING,
                             r"takes 1 channel\(s\) \(image\) but the image has 2"),
    "5D": (np.random.rand(1, 1, 4, 20, 20), SPACING, "3D"),
    "zero-sized": (np.zeros((0, 20, 20)), SPACING, "empty"),
    "NaN": (np.where(np.eye(20) > 0, np.nan, 1.0)[None].repeat(3, 0), SPACING, "NaN or infinite"),
    "inf": (np.where(np.eye(20) > 0, np.inf, 1.0)[None].repeat(3, 0), SPACING, "NaN or infinite"),
    "constant": (np.full((3, 20, 20), 7.0), SPACING, "constant"),
    "too small": (np.random.rand(3, 4, 20), SPACING, "at least 8×8"),
    "complex": (np.random.rand(3, 20, 20).astype(np.complex64), SPACING, "real numbers"),
    "not an array": ([[[1.0]]], SPACING, "NumPy array"),
    "zero spacing": (np.random.rand(3, 20, 20), (1, 0, 1), "in-plane spacing .* is missing, zero"),
    "NaN spacing": (np.random.rand(3, 20, 20), (1, float("nan"), 1), "in-plane spacing .* is missing, zero"),
    "spacing in metres": (np.random.rand(3, 20, 20), (0.01, 0.0015, 0.0015), "spacing is probably wrong"),
    "two spacings": (np.random.rand(3, 20, 20), (1, 1), "spacing"),
    "text spacing": (np.random.rand(3, 20, 20), ("a", 1, 1), "spacing"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_raises_one_clear_value_error(predictor, case):
    image, spacing, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message) as caught:
        predictor.predict(image, spacing)
    assert "\n" not in str(caught.value)


def test_confidence_maps_of_uniform_probabilities():
    labels, confidence, entropy = confidence_maps(torch.full((1, 4, 2, 2), 0.25))
    assert labels.dtype == torch.uint8
    torch.testing.assert_close(confidence, torch.full((1, 2, 2), 0.25))
    torch.testing.assert_close(entropy, torch.ones(1, 2, 2))


def test_device_auto_and_missing_cuda(tiny_bundle):
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            Predictor(tiny_bundle, device="cuda")
    with pytest.raises(ValueError, match="batch_size"):
        Predictor(tiny_bundle, device="cpu", batch_size=0)


@pytest.mark.parametrize("spacing,grid", [((5.0, 1.5, 1.5), (30, 40)), ((5.0, 0.75, 0.75), (15, 20)),
                                          ((5.0, 3.0, 1.5), (60, 40))])
def test_the_network_sees_slices_at_the_models_spacing(tiny_bundle, monkeypatch, spacing, grid):
    """A (30, 40) slice is resampled by its in-plane spacing to the model's 1.5 mm before the windows run."""
    seen = []

    def recording(model, images, settings, agreement):
        seen.append(tuple(images.shape[-2:]))
        return torch.zeros(images.shape[0], 4, *images.shape[-2:])

    monkeypatch.setattr(inference, "window_logits", recording)
    prediction = Predictor(tiny_bundle, device="cpu").predict(noise_volume((3, 30, 40)), spacing)
    assert seen == [grid] and prediction.labels.shape == (3, 30, 40)


def test_windows_cover_slices_larger_and_smaller_than_the_patch(tiny_bundle):
    """Slices of 20×20 (padded up to the 64×64 window) and 150×90 (several windows) come back on their grid."""
    predictor = Predictor(tiny_bundle, device="cpu")
    for shape in ((2, 20, 20), (2, 150, 90)):
        probabilities = predictor.predict(noise_volume(shape), (3.0, 1.5, 1.5), keep_probabilities=True).probabilities
        assert probabilities.shape == (4, *shape)
        np.testing.assert_allclose(probabilities.sum(0), 1.0, atol=1e-5)


def test_mirroring_averages_the_logits_of_the_flipped_slices_and_counts_their_agreement(tiny_bundle):
    """At the model's own spacing the network's grid is the input's: each flip's labels (the plain predictor's on
    the flipped slices, flipped back) against the average's give the agreement by hand."""
    image = noise_volume((2, 40, 40))
    mirrored = Bundle(make_test_metadata(sliding_window=SlidingWindow((64, 64), mirror_axes=(0, 1))),
                      tiny_bundle.state_dict)
    plain = Predictor(tiny_bundle, device="cpu")
    flipped_sum, pass_labels = 0, []
    for dims in ((), (1,), (2,), (1, 2)):
        source = np.ascontiguousarray(np.flip(image, dims)) if dims else image
        logits = np.log(plain.predict(source, (3.0, 1.5, 1.5), keep_probabilities=True).probabilities)
        logits = np.flip(logits, tuple(d + 1 for d in dims)) if dims else logits
        flipped_sum = flipped_sum + logits
        pass_labels.append(logits.argmax(axis=0))
    expected = torch.softmax(torch.from_numpy(flipped_sum / 4), dim=0).numpy()
    result = Predictor(mirrored, device="cpu").predict(image, (3.0, 1.5, 1.5), keep_probabilities=True)
    np.testing.assert_allclose(result.probabilities, expected, atol=1e-4)
    average = expected.argmax(axis=0)
    by_hand = [np.mean([2 * np.sum((labels == c) & (average == c)) / (np.sum(labels == c) + np.sum(average == c))
                        for labels in pass_labels]) for c in range(4)]
    assert len({int(c) for c in np.unique(average)}) >= 2  # more than one class drawn: the counts say something
    np.testing.assert_allclose(result.mirror_agreement, by_hand, rtol=1e-12)
    assert not np.allclose(by_hand, 1.0)  # the passes disagree somewhere on noise
    assert plain.predict(image, (3.0, 1.5, 1.5)).mirror_agreement is None  # a bundle that does not mirror


def test_mirror_agreement_counts_a_class_only_where_a_pass_draws_it():
    """Identical passes agree fully; a class one pass of two draws alone has Dice 0 there (the other pass does not
    count); a class nobody draws has none (NaN)."""
    agreement = MirrorAgreement(num_classes=4, passes=2)
    average = torch.tensor([[[0, 1], [1, 0]]], dtype=torch.uint8)
    odd = average.clone()
    odd[0, 0, 0] = 2  # the second pass draws class 2 on one of class 0's two voxels
    agreement.add([average, odd], average)
    dice = agreement.dice()
    assert dice[1] == 1.0 and dice[2] == 0.0 and math.isnan(dice[3])
    assert dice[0] == pytest.approx(np.mean([1.0, 2 * 1 / (1 + 2)]))
    agreement.add([average, average], average)  # counts add up over batches before the Dice is taken
    assert agreement.dice()[0] == pytest.approx(np.mean([1.0, 2 * 3 / (3 + 4)]))
    with pytest.raises(ValueError, match="^Got 1 passes for an agreement of 2"):
        agreement.add([average], average)


def test_bundle_postprocessing_keeps_the_largest_component_of_its_classes(linear_bundle):
    """Two bright blobs of class 1: with post-processing for class 1 only the larger survives."""
    image = np.zeros((3, 24, 24), np.float32)
    image[:, 2:10, 2:10] = 100.0
    image[:, 16:19, 16:19] = 100.0
    bundle = linear_bundle()
    processed = Bundle(replace(bundle.metadata, postprocessing=Postprocessing((1,))), bundle.state_dict)
    raw = Predictor(bundle, device="cpu").predict(image, (2, 1.5, 1.5))
    kept = Predictor(processed, device="cpu").predict(image, (2, 1.5, 1.5))
    assert raw.labels[:, 17, 17].all() and not kept.labels[:, 17, 17].any()
    np.testing.assert_array_equal(kept.labels[:, :12, :12], raw.labels[:, :12, :12])
    np.testing.assert_array_equal(kept.confidence, raw.confidence)  # labels only: the maps stay the network's


@pytest.fixture(scope="module")
def tiny_3d_bundle(tmp_path_factory):
    """A saved 3-class 3D UNet bundle: (z, y, x) target spacing and window, mirrored over the in-plane axes."""
    path = make_test_bundle(tmp_path_factory.mktemp("bundle3d") / "tiny3d.calibseg", num_classes=3,
                            patch_size=(8, 32, 32), spatial_dims=3,
                            preprocessing=Preprocessing(target_spacing=(4.0, 1.5, 1.5)),
                            sliding_window=SlidingWindow(patch_size=(8, 32, 32), mirror_axes=(1, 2)))
    return load_bundle(path)


def test_a_3d_bundle_round_trips_and_predicts_every_output_on_the_input_grid(tiny_3d_bundle, monkeypatch):
    assert tiny_3d_bundle.metadata.spatial_dims == 3
    assert tiny_3d_bundle.metadata.preprocessing.target_spacing == (4.0, 1.5, 1.5)
    assert tiny_3d_bundle.metadata.sliding_window.patch_size == (8, 32, 32)
    seen = []
    window = inference.window_logits
    monkeypatch.setattr(inference, "window_logits",
                        lambda model, images, *rest: seen.append(tuple(images.shape)) or window(model, images, *rest))
    image, chunks = noise_volume((9, 30, 27)), []
    variants = Predictor(tiny_3d_bundle, device="cpu", batch_size=4).predict_variants(
        image, (3.0, 1.2, 1.4), [1.0, 0.5], keep_probabilities=True,
        probability_sinks=[lambda slices, probs: chunks.append((slices, probs.copy())), None])
    assert seen == [(1, 1, 7, 24, 25)]  # one pass over the whole volume on the model's (4, 1.5, 1.5) mm grid
    for prediction in variants:
        assert prediction.labels.shape == prediction.confidence.shape == prediction.entropy.shape == image.shape
        assert prediction.probabilities.shape == (3, *image.shape)
        np.testing.assert_allclose(prediction.probabilities.sum(axis=0), 1.0, rtol=1e-5)
        np.testing.assert_array_equal(prediction.labels, prediction.probabilities.argmax(axis=0))
        np.testing.assert_allclose(prediction.confidence, prediction.probabilities.max(axis=0), rtol=1e-6)
        assert prediction.entropy.min() >= 0 and prediction.entropy.max() <= 1
        assert prediction.mirror_agreement.shape == (3,)
    # the metrics stream by chunks of input slices, the first variant's to its sink
    assert [slices for slices, _ in chunks] == [slice(0, 4), slice(4, 8), slice(8, 9)]
    np.testing.assert_array_equal(np.concatenate([probs for _, probs in chunks], axis=1), variants[0].probabilities)
    assert not np.allclose(variants[0].confidence, variants[1].confidence)  # T = 0.5 sharpens


def test_a_3d_prediction_keeps_no_probability_volume_unless_asked_and_batch_size_changes_nothing(tiny_3d_bundle):
    image = noise_volume((9, 30, 27))
    chunks = []
    one = Predictor(tiny_3d_bundle, device="cpu", batch_size=1).predict(
        image, (3.0, 1.2, 1.4), probability_sink=lambda slices, probs: chunks.append(probs.shape))
    assert one.probabilities is None
    assert chunks == [(3, 1, 30, 27)] * 9  # never more than a chunk of batch_size slices on the input grid
    five = Predictor(tiny_3d_bundle, device="cpu", batch_size=5).predict(image, (3.0, 1.2, 1.4))
    np.testing.assert_allclose(one.confidence, five.confidence, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one.probability_sums, five.probability_sums, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_3d_chunks_are_the_trilinear_resampling_of_the_whole_probability_volume(temperature):
    logits = torch.randn(3, 5, 12, 10, generator=torch.Generator().manual_seed(0)) * 3
    shape = (13, 24, 20)
    whole = torch.nn.functional.interpolate(torch.softmax(logits / temperature, dim=0)[None], size=shape,
                                            mode="trilinear", align_corners=False)[0]
    chunks = [inference.volume_chunk_probabilities(logits, temperature, shape, slice(start, min(start + 4, 13)))
              for start in range(0, 13, 4)]
    torch.testing.assert_close(torch.cat(chunks).movedim(1, 0), whole, rtol=1e-5, atol=1e-6)


def test_a_3d_bundle_refuses_a_missing_slice_spacing_in_one_sentence(tiny_3d_bundle):
    with pytest.raises(ValueError, match=r"^The image's slice spacing 0 mm is missing, zero or not finite; [^\n]*\.$"):
        Predictor(tiny_3d_bundle, device="cpu").predict(noise_volume((9, 30, 27)), (0.0, 1.2, 1.4))
