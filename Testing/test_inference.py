"""Predictor: grid, value ranges, known toy outputs, temperature, progress, cancel, bad input."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch

from CalibSegLib.bundle import Bundle, BundleMetadata, Preprocessing
from CalibSegLib.inference import InferenceCancelled, Predictor
from CalibSegLib.networks import build_network
from bundle_factory import make_test_bundle


@pytest.fixture(scope="module")
def predictor(tmp_path_factory):
    path = make_test_bundle(tmp_path_factory.mktemp("bundle") / "tiny.calibseg")
    return Predictor(path, device="cpu", batch_size=2)


def volume(shape=(5, 41, 37), seed=0):
    return np.random.default_rng(seed).normal(100, 20, size=shape).astype(np.float32)


def test_outputs_are_on_the_input_grid_with_valid_ranges(predictor):
    image = volume()
    prediction = predictor.predict(image, (8.0, 1.3, 0.7), keep_probabilities=True)
    assert prediction.labels.shape == prediction.confidence.shape == prediction.entropy.shape == image.shape
    assert prediction.labels.dtype == np.uint8 and prediction.confidence.dtype == np.float32
    assert prediction.probabilities.shape == (4,) + image.shape
    assert prediction.confidence.min() >= 0.25 - 1e-6 and prediction.confidence.max() <= 1 + 1e-6
    assert prediction.entropy.min() >= 0 and prediction.entropy.max() <= 1
    np.testing.assert_array_equal(prediction.labels, prediction.probabilities.argmax(0))
    np.testing.assert_allclose(prediction.confidence, prediction.probabilities.max(0), rtol=1e-6)
    p = prediction.probabilities.astype(np.float64)
    np.testing.assert_allclose(prediction.entropy, -(p * np.log(np.clip(p, 1e-12, 1))).sum(0) / math.log(4), atol=1e-5)


def constant_logit_bundle(logits: list[float], temperature=1.0) -> Bundle:
    """A 2-class network whose output is a fixed logit pair everywhere: a 1×1 conv with zero weight and set bias."""
    model = build_network("unet", 1, 2, channels=[4, 8], strides=[2], num_res_units=0)
    state = {name: torch.zeros_like(tensor) for name, tensor in model.state_dict().items()}
    final_bias = [name for name in state if name.endswith("bias")][-1]
    state[final_bias] = torch.tensor(logits)
    metadata = BundleMetadata(network="unet", network_kwargs={"channels": [4, 8], "strides": [2], "num_res_units": 0},
                              in_channels=1, num_classes=2, spatial_dims=2, class_names=["bg", "fg"],
                              class_colors=[(0, 0, 0), (1, 0, 0)], preprocessing=Preprocessing(target_size=(16, 16)),
                              temperature=temperature)
    return Bundle(metadata, state)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_known_weights_give_known_confidence(temperature):
    predictor = Predictor(constant_logit_bundle([0.0, 2.0], temperature), device="cpu")
    prediction = predictor.predict(volume((2, 20, 20)), (1, 1, 1))
    expected = 1 / (1 + math.exp(-2.0 / temperature))
    assert np.all(prediction.labels == 1)
    np.testing.assert_allclose(prediction.confidence, expected, rtol=1e-5)
    binary_entropy = -(expected * math.log(expected) + (1 - expected) * math.log(1 - expected)) / math.log(2)
    np.testing.assert_allclose(prediction.entropy, binary_entropy, rtol=1e-4)


def test_progress_reaches_one_exactly_once(predictor):
    calls = []
    predictor.predict(volume((5, 20, 20)), (1, 1, 1), progress=calls.append)
    assert calls == sorted(calls) and calls.count(1.0) == 1 and calls[-1] == 1.0 and len(calls) == 3


def test_cancel_stops_before_the_next_batch(predictor):
    cancel = threading.Event()
    calls = []

    def progress(fraction):
        calls.append(fraction)
        cancel.set()

    with pytest.raises(InferenceCancelled):
        predictor.predict(volume((9, 20, 20)), (1, 1, 1), progress=progress, cancel=cancel)
    assert len(calls) == 1


def test_probability_sink_sees_every_slice_once(predictor):
    seen = []
    predictor.predict(volume((5, 20, 22)), (1, 1, 1), probability_sink=lambda s, p: seen.append((s, p.shape)))
    assert [s for s, _ in seen] == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert all(shape[0] == 4 and shape[2:] == (20, 22) for _, shape in seen)


@pytest.mark.parametrize("image,spacing,message", [
    (np.zeros((4, 4)), (1, 1, 1), "3D"),
    (np.zeros((1, 4, 20, 20)), (1, 1, 1), "3D"),
    (np.zeros((0, 20, 20)), (1, 1, 1), "empty"),
    (np.full((3, 20, 20), np.nan), (1, 1, 1), "NaN"),
    (np.where(np.eye(20)[None] > 0, np.inf, 1.0).repeat(3, 0), (1, 1, 1), "NaN or infinite"),
    (np.ones((3, 20, 20)), (1, 1, 1), "constant"),
    (np.random.rand(3, 4, 20), (1, 1, 1), "at least"),
    (np.random.rand(3, 20, 20), (1, 0, 1), "spacing"),
])
def test_bad_input_raises_value_error(predictor, image, spacing, message):
    with pytest.raises(ValueError, match=message):
        predictor.predict(image, spacing)


def test_cuda_request_without_cuda_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match="no CUDA device"):
        Predictor(make_test_bundle(tmp_path / "b.calibseg"), device="cuda")
