"""Network registry: every MONAI architecture maps images to full-resolution logits, one tensor."""

from __future__ import annotations

import pytest
import torch

from CalibSegLib.networks import (NETWORKS, build_network, build_network_on_meta, input_size_problem,
                                  network_stride)

# Small overrides per network, given as a bundle would store them in network_kwargs.
SMALL = {
    "unet": {"channels": (4, 8), "strides": (2,), "num_res_units": 0},
    "attention_unet": {"channels": (4, 8), "strides": (2,)},
    "unetpp": {"features": (4, 4, 8, 8, 8, 4)},
    "basic_unet": {"features": (4, 4, 8, 8, 8, 4)},
    "dynunet": {"kernel_size": [3, 3, 3], "strides": [1, 2, 2], "upsample_kernel_size": [2, 2], "filters": [4, 8, 8]},
}


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_every_network_has_small_overrides_in_this_file():
    assert set(SMALL) == set(NETWORKS)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", NETWORKS)
def test_default_network_returns_2d_logits_tensor_of_input_size(name, mode):
    model = build_network(name, 1, 4)
    model.train(mode == "train")
    with torch.no_grad():
        logits = model(torch.zeros(2, 1, 32, 32))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 4, 32, 32)


@pytest.mark.parametrize("name", NETWORKS)
def test_kwargs_override_the_defaults(name):
    small = build_network(name, 2, 3, **SMALL[name])
    assert parameter_count(small) < parameter_count(build_network(name, 2, 3))
    with torch.no_grad():
        assert small(torch.zeros(2, 2, 32, 32)).shape == (2, 3, 32, 32)


@pytest.mark.parametrize("name", NETWORKS)
def test_3d_network_returns_3d_logits(name):
    model = build_network(name, 1, 2, spatial_dims=3, **SMALL[name])
    with torch.no_grad():  # 32³: the fixed five-level MONAI nets still have 2³ voxels at the bottom
        assert model(torch.zeros(1, 1, 32, 32, 32)).shape == (1, 2, 32, 32, 32)


def test_same_kwargs_rebuild_the_same_state_dict_keys():
    first, second = (build_network("unetpp", 1, 3, **SMALL["unetpp"]) for _ in range(2))
    second.load_state_dict(first.state_dict())


def test_unknown_network_lists_known_names():
    with pytest.raises(KeyError, match="choose one of unet, attention_unet, unetpp, basic_unet, dynunet"):
        build_network("resnet", 1, 2)


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError):
        build_network("unet", 1, 2, widths=(4, 8))


@pytest.mark.parametrize("name", ["unetpp", "dynunet"])
def test_deep_supervision_is_refused(name):
    with pytest.raises(ValueError, match="deep supervision"):
        build_network(name, 1, 2, deep_supervision=True)


@pytest.mark.parametrize("arguments,message", [
    ({"spatial_dims": 4}, "spatial_dims"),
    ({"num_classes": 1}, "num_classes"),
    ({"in_channels": 0}, "in_channels"),
])
def test_bad_dimensions_are_refused(arguments, message):
    options = {"in_channels": 1, "num_classes": 2, **arguments}
    with pytest.raises(ValueError, match=message):
        build_network("unet", **options)


# A 3D DynUNet that halves z once and y, x twice (strides per axis).
_ANISOTROPIC = {"kernel_size": [3, 3, 3], "strides": [[1, 1, 1], [1, 2, 2], [2, 2, 2]],
                "upsample_kernel_size": [[1, 2, 2], [2, 2, 2]], "filters": [4, 8, 8]}


@pytest.mark.parametrize("name,options,dims,expected", [
    ("unet", {}, 2, (16, 16)), ("unet", SMALL["unet"], 3, (2, 2, 2)), ("attention_unet", {}, 2, (16, 16)),
    ("dynunet", {}, 3, (16, 16, 16)), ("dynunet", _ANISOTROPIC, 3, (2, 4, 4)),
    ("basic_unet", SMALL["basic_unet"], 2, (16, 16)), ("unetpp", {}, 3, (16, 16, 16))])
def test_network_stride_is_the_product_of_its_strides_per_axis(name, options, dims, expected):
    """What the training plan rounds its patch to: windows of twice the stride per axis go through."""
    assert network_stride(name, dims, **options) == expected
    model = build_network_on_meta(name, 1, 2, dims, **options)
    assert input_size_problem(model, 1, tuple(2 * side for side in expected)) is None
