"""Network registry: every MONAI architecture maps (B, 1, H, W) images to (B, C, H, W) logits."""

from __future__ import annotations

import pytest
import torch

from CalibSegLib.networks import NETWORKS, build_network


@pytest.mark.parametrize("name", NETWORKS)
def test_network_returns_logits_of_input_size(name):
    model = build_network(name, 1, 4)
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 4, 32, 32)


def test_kwargs_override_defaults():
    small = build_network("unet", 1, 3, channels=(4, 8), strides=(2,))
    large = build_network("unet", 1, 3)
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in large.parameters())


def test_3d_network():
    assert build_network("unet", 1, 2, spatial_dims=3, channels=(4, 8), strides=(2,))(torch.zeros(1, 1, 8, 8, 8)).shape == (1, 2, 8, 8, 8)


def test_unknown_network_lists_known_names():
    with pytest.raises(KeyError, match="unet"):
        build_network("resnet", 1, 2)
