"""Reading the network's encoder features (CalibSegLib/features.py): the layer each network gives, the
stitched and averaged maps against a direct forward pass, the volume as the predictor sees it, and the
distance a bundle's statistics give."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny_bundles import disc_case, make_test_bundle

from CalibSegLib.bundle import BundleError, load_bundle
from CalibSegLib.features import (FeatureLayerError, bottleneck_layer, encoder_features, feature_distance,
                                  fit_network_features, volume_features)
from CalibSegLib.input_check import statistics_of_cases
from CalibSegLib.networks import NETWORKS, build_network
from CalibSegLib.sliding_window import SlidingWindow

PATCH = (64, 64)
# The deepest encoder layer of each network with CalibSeg's default options (five levels, four halvings).
BOTTLENECKS = {"unet": ("model.1.submodule.1.submodule.1.submodule.1", "SkipConnection"),
               "attention_unet": ("model.1.submodule.1.submodule.1.submodule.1.submodule", "ConvBlock"),
               "unetpp": ("network.conv_4_0", "Down"), "basic_unet": ("down_4", "Down"),
               "dynunet": ("bottleneck", "UnetBasicBlock")}


@pytest.mark.parametrize("name", NETWORKS)
def test_each_network_gives_its_bottom_encoder_layer(name):
    torch.manual_seed(0)
    network = build_network(name, 1, 4, 2)
    layer = bottleneck_layer(network, 1, PATCH)
    assert (layer, type(dict(network.named_modules())[layer]).__name__) == BOTTLENECKS[name]
    features = encoder_features(network, layer, torch.rand(1, 1, *PATCH), SlidingWindow(patch_size=PATCH))
    assert features.shape[0] == 1 and torch.isfinite(features).all()
    assert not any(module._forward_hooks for module in network.modules())  # every hook removed again


def _unet() -> torch.nn.Module:
    torch.manual_seed(1)
    return build_network("unet", 1, 4, 2, channels=(4, 8, 16), strides=(2, 2), num_res_units=1)


def _direct(network: torch.nn.Module, layer: str, images: torch.Tensor) -> torch.Tensor:
    """The layer's output averaged over its positions, from one plain forward pass (no windows)."""
    captured = []
    handle = dict(network.named_modules())[layer].register_forward_hook(lambda m, i, o: captured.append(o))
    with torch.no_grad():
        network.eval()(images)
    handle.remove()
    return captured[0].flatten(2).mean(dim=2)


def test_a_window_sized_slice_gives_the_layers_own_output_averaged():
    network = _unet()
    layer = bottleneck_layer(network, 1, PATCH)
    images = torch.rand(3, 1, *PATCH)
    expected = _direct(network, layer, images)
    assert expected.shape == (3, 8 + 16)  # the skip connection: the last down-sampling block and the bottom
    torch.testing.assert_close(encoder_features(network, layer, images, SlidingWindow(patch_size=PATCH)),
                               expected, rtol=1e-5, atol=1e-6)


def test_slices_larger_than_the_window_are_tiled_and_each_slice_is_its_own():
    network = _unet().train()
    layer = bottleneck_layer(network, 1, PATCH)
    window = SlidingWindow(patch_size=PATCH, overlap=0.5, batch_size=4)
    images = torch.rand(3, 1, 90, 150)  # not a multiple of the layer's down-sampling (4)
    together = encoder_features(network, layer, images, window)
    alone = torch.cat([encoder_features(network, layer, images[index:index + 1], window)
                       for index in range(3)])
    assert together.shape == (3, 24) and torch.isfinite(together).all()
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)
    assert network.training  # run in eval mode, the caller's mode given back


def test_a_missing_layer_is_a_phrase():
    with pytest.raises(FeatureLayerError, match="no layer 'model.9'"):
        encoder_features(_unet(), "model.9", torch.rand(1, 1, *PATCH), SlidingWindow(patch_size=PATCH))


@pytest.fixture
def tiny(tmp_path):
    """A tiny UNet bundle (two levels) with 64 × 64 windows."""
    return load_bundle(make_test_bundle(tmp_path / "tiny.calibseg", patch_size=PATCH))


def test_a_volume_is_read_as_the_predictor_sees_it(tiny):
    """A 0.75 mm volume: intensities scaled to [min, p99], slices shrunk (anti-aliased) to the 1.5 mm grid."""
    network, metadata = tiny.build_model(), tiny.metadata
    layer = bottleneck_layer(network, 1, PATCH)
    volume = (np.random.default_rng(2).random((4, 96, 128)) * 700.0 + 40.0).astype(np.float32)
    features = volume_features(network, layer, volume, (8.0, 0.75, 0.75), metadata.preprocessing,
                               metadata.sliding_window, batch_size=3)
    low, high = float(volume.min()), float(np.percentile(volume, 99))
    scaled = torch.from_numpy(np.clip((volume - low) / (high - low), 0, 1)).unsqueeze(1)
    shrunk = F.interpolate(scaled, size=(48, 64), mode="bilinear", align_corners=False, antialias=True)
    expected = encoder_features(network, layer, shrunk, metadata.sliding_window).double().numpy()
    assert features.shape == (4, _direct(network, layer, shrunk[:1, :, :32, :32]).shape[1])
    np.testing.assert_allclose(features, expected, rtol=1e-4, atol=1e-5)


def test_a_bundles_feature_statistics_give_each_volume_its_distance(tiny):
    network, metadata = tiny.build_model(), tiny.metadata
    assert feature_distance(network, metadata, disc_case(0).image, (10.0, 1.5, 1.5)) is None  # none stored
    features = fit_network_features(network, metadata, [disc_case(seed) for seed in range(8)],
                                    [disc_case(seed) for seed in range(8, 12)])
    assert features.layer == bottleneck_layer(network, 1, PATCH)
    assert (features.training_volumes, features.validation_volumes, features.validation_within) == (8, 4, 4)
    fitted = dataclasses.replace(metadata, input_statistics=statistics_of_cases(
        metadata, [disc_case(seed) for seed in range(8)], features=features))
    distances = [feature_distance(network, fitted, disc_case(seed).image, (10.0, 1.5, 1.5))
                 for seed in range(8, 12)]
    assert max(distances) == pytest.approx(features.threshold)  # four validation volumes: their largest
    # new volumes: like the training ones within the threshold, contrast-inverted ones far beyond it
    for seed in range(12, 15):
        assert feature_distance(network, fitted, disc_case(seed).image, (10.0, 1.5, 1.5)) < features.threshold
        inverted = feature_distance(network, fitted, disc_case(seed, invert=True).image, (10.0, 1.5, 1.5))
        assert math.isfinite(inverted) and inverted > 5 * features.threshold


def test_statistics_naming_a_layer_the_network_lacks_are_one_sentence(tiny):
    network, metadata = tiny.build_model(), tiny.metadata
    features = fit_network_features(network, metadata, [disc_case(seed) for seed in range(4)], [disc_case(4)])
    statistics = statistics_of_cases(metadata, [disc_case(seed) for seed in range(4)],
                                     features=dataclasses.replace(features, layer="model.7"))
    with pytest.raises(BundleError, match=r"do not fit its network \(the network has no layer 'model.7'\)"):
        feature_distance(network, dataclasses.replace(metadata, input_statistics=statistics), disc_case(5).image,
                         (10.0, 1.5, 1.5))
