"""The network's own view of an image: its deepest encoder features, averaged over each slice.

Intensity quantiles, field of view and predicted volumes cannot tell one cardiac MRI sequence from
another; the features a segmentation network computes can (a Mahalanobis distance in the encoder's
feature space detects distribution shift: Lee et al., NeurIPS 2018; González et al., Medical Image
Analysis 2022). This module reads them; :mod:`CalibSegLib.feature_statistics` fits their distribution
and measures a volume's distance from it.

How they are read:

- :func:`bottleneck_layer` names the layer: of the declared network's modules, the one whose output
  has the fewest voxels (the bottom of the encoder), the widest of those (most channels), the
  outermost of equals. For MONAI's UNet that is the innermost skip connection (the last
  down-sampling block's output and the bottom block's, concatenated), for BasicUNet ``down_4``, for
  DynUNet ``bottleneck``. The name is stored with the statistics, so the fit and every later check
  read the same layer.
- :func:`encoder_features` runs the network over its input in the windows the prediction uses (the
  bundle's ``patch_size`` and ``overlap``, Gaussian blending, MONAI's sliding window, no mirroring)
  with a forward hook on that layer, which stops the pass there (the decoder's work is not needed);
  MONAI stitches the windows' maps into one map per slice (per volume for a 3D network), averaged over
  its positions: a vector of F features per slice.
- :func:`volume_features` is the same for a volume as read: normalised and resampled to the model's
  grid as the predictor does (:mod:`CalibSegLib.preprocessing`), in batches of slices.

Both take a network and its input, not a bundle, so an ensemble calls them once per member network;
so do :func:`fit_network_features` (a bundle's statistics from its training and validation cases) and
:func:`feature_distance` (a volume's distance under them), which take the network beside the metadata.
An ensemble judged by every member (:func:`fit_member_features`) reads each member's features at that member's
own bottleneck: five encoder passes for five members, one distance each.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from monai.inferers import sliding_window_inference
from torch import nn

from CalibSegLib.bundle import BundleError
from CalibSegLib.feature_statistics import (FeatureStatistics, FeatureStatisticsError, MemberFeatureStatistics,
                                            fit_feature_statistics, fit_member_statistics)
from CalibSegLib.networks import MemberNetworks
from CalibSegLib.preprocessing import (Preprocessing, as_channels, network_grid_shape, normalize_channels,
                                       resample_slices, resample_volume, volume_grid_shape)
from CalibSegLib.sliding_window import SlidingWindow

if TYPE_CHECKING:
    from CalibSegLib.bundle import BundleMetadata

__all__ = ["FeatureLayerError", "bottleneck_layer", "encoder_features", "model_grid_batches",
           "volume_features", "fit_network_features", "fit_member_features", "feature_distance"]


class FeatureLayerError(ValueError):
    """The named layer is not a module of the network, or gives no feature map (a phrase saying which)."""


class _Reached(Exception):
    """Raised by the forward hook once the layer has run: the rest of the network is not needed."""

    def __init__(self, output: torch.Tensor) -> None:
        super().__init__()
        self.output = output


def _spatial_output(output: object, spatial_dims: int) -> torch.Tensor | None:
    """``output`` when it is one ``(B, F, *spatial)`` map, else None (a list of heads, a scalar...)."""
    return output if isinstance(output, torch.Tensor) and output.ndim == spatial_dims + 2 else None


def bottleneck_layer(network: nn.Module, in_channels: int, patch_size: Sequence[int]) -> str:
    """The name of ``network``'s deepest encoder layer (see the module docstring for the rule), found by
    passing one zero window of ``patch_size`` voxels with ``in_channels`` channels through it on its own
    device.

    Raises:
        FeatureLayerError: no module gives a feature map (not a convolutional segmentation network).
    """
    outputs: dict[str, tuple[int, ...]] = {}
    handles = []
    for name, module in network.named_modules():
        if name:  # the whole network's output is the logits, not a feature
            def record(_module: nn.Module, _inputs: object, output: object, name: str = name) -> None:
                feature = _spatial_output(output, len(patch_size))
                if feature is not None:
                    outputs[name] = tuple(feature.shape[1:])
            handles.append(module.register_forward_hook(record))
    device = next(network.parameters()).device
    was_training = network.training
    network.eval()
    try:
        with torch.inference_mode():
            network(torch.zeros(1, in_channels, *patch_size, device=device))
    finally:
        network.train(was_training)
        for handle in handles:
            handle.remove()
    if not outputs:
        raise FeatureLayerError("no layer of the network gives a feature map")
    fewest = min(math.prod(shape[1:]) for shape in outputs.values())
    deepest = [name for name, shape in outputs.items() if math.prod(shape[1:]) == fewest]
    return max(deepest, key=lambda name: (outputs[name][0], -name.count(".")))


def encoder_features(network: nn.Module, layer: str, images: torch.Tensor,
                     window: SlidingWindow) -> torch.Tensor:
    """``(n, F)`` float32 features of ``images (n, K, *spatial)``, normalised and on the model's grid (as
    the network's input), on the network's device: the ``layer``'s output stitched over the ``window``'s
    tiles (its ``patch_size`` and ``overlap``, Gaussian blending, no mirroring) and averaged over each
    item's positions.

    The items are padded (zeros, the network's background) to a multiple of the layer's down-sampling,
    so every window starts on a whole voxel of the layer's map.

    Raises:
        FeatureLayerError: ``layer`` is not a module of ``network`` or gives no feature map.
    """
    modules = dict(network.named_modules())
    if not layer or layer not in modules:
        raise FeatureLayerError(f"the network has no layer {layer!r}")
    spatial_dims = images.ndim - 2

    def features(windows: torch.Tensor) -> torch.Tensor:
        try:
            network(windows)
        except _Reached as reached:
            return reached.output.float()
        raise FeatureLayerError(f"the layer {layer!r} does not run when the network does")

    def stop(_module: nn.Module, _inputs: object, output: object) -> None:
        feature = _spatial_output(output, spatial_dims)
        if feature is None:
            raise FeatureLayerError(f"the layer {layer!r} gives no {spatial_dims}D feature map")
        raise _Reached(feature)

    device = next(network.parameters()).device
    patch = window.patch_size
    handle = modules[layer].register_forward_hook(stop)
    was_training = network.training
    network.eval()
    try:
        with torch.inference_mode():
            probe = features(torch.zeros(1, images.shape[1], *patch, device=device))
            scale = [side // size for side, size in zip(patch, probe.shape[2:])]
            padding = [(-side) % step for side, step in zip(images.shape[2:], scale)]
            # F.pad takes (last axis before, after, the one before it ...): padding after each axis.
            padded = F.pad(images.to(device), [amount for pad in reversed(padding) for amount in (0, pad)])
            stitched = sliding_window_inference(
                padded, roi_size=patch, sw_batch_size=window.batch_size, predictor=features,
                overlap=window.overlap, mode="gaussian", padding_mode="constant", cval=0.0)
    finally:
        network.train(was_training)
        handle.remove()
    return stitched.flatten(2).mean(dim=2)


def model_grid_batches(image: np.ndarray, spacing: Sequence[float], preprocessing: Preprocessing,
                       spatial_dims: int, batch_size: int) -> Iterator[torch.Tensor]:
    """A ``(z, y, x)`` or ``(K, z, y, x)`` volume with ``spacing (z, y, x)`` mm as the network takes it:
    each channel normalised (:func:`~CalibSegLib.preprocessing.normalize_channels`), then for a 2D network
    ``(n, K, y', x')`` batches of at most ``batch_size`` slices resampled in-plane to the model's spacing,
    for a 3D one the whole ``(1, K, z', y', x')`` volume on its grid. The caller has checked the volume
    (the predictor has, when it ran)."""
    normalized = torch.from_numpy(normalize_channels(image, preprocessing))  # (K, z, y, x)
    if spatial_dims == 3:
        grid = volume_grid_shape(normalized.shape[1:], [float(value) for value in spacing],
                                 preprocessing.target_spacing)
        yield resample_volume(normalized[None], grid)
        return
    axis = preprocessing.slice_axis
    slices = normalized.movedim(axis + 1, 0)  # (z, K, y, x) along the slice axis
    plane = [float(value) for index, value in enumerate(spacing) if index != axis]
    grid = network_grid_shape(slices.shape[2:], plane, preprocessing.target_spacing)
    for start in range(0, len(slices), batch_size):
        yield resample_slices(slices[start:start + batch_size].contiguous(), grid)


def volume_features(network: nn.Module, layer: str, image: np.ndarray, spacing: Sequence[float],
                    preprocessing: Preprocessing, window: SlidingWindow, batch_size: int = 16) -> np.ndarray:
    """:func:`encoder_features` of a volume as read (:func:`model_grid_batches`): ``(slices, F)`` float64
    for a 2D network, ``(1, F)`` for a 3D one."""
    spatial_dims = len(window.patch_size)
    batches = model_grid_batches(as_channels(image), spacing, preprocessing, spatial_dims, batch_size)
    return np.concatenate([encoder_features(network, layer, batch, window).cpu().double().numpy()
                           for batch in batches])


def _cases_features(network: nn.Module, layer: str, metadata: "BundleMetadata", cases: Sequence[Any],
                    batch_size: int) -> list[np.ndarray]:
    """:func:`volume_features` of each case (``image``, ``spacing`` (z, y, x) mm) under the bundle's settings."""
    return [volume_features(network, layer, case.image, case.spacing, metadata.preprocessing,
                            metadata.sliding_window, batch_size) for case in cases]


def fit_network_features(network: nn.Module, metadata: "BundleMetadata", training: Sequence[Any],
                         validation: Sequence[Any], batch_size: int = 16) -> FeatureStatistics:
    """The feature statistics of a bundle's network (``input_statistics["features"]``): the Gaussian of
    its ``training`` cases' features and the distance threshold from its ``validation`` cases (each with
    ``image`` and ``spacing`` (z, y, x) mm, as :class:`Datasets.loading.Case`) at
    :data:`~CalibSegLib.feature_statistics.FALSE_ALARM_RATE`.

    Raises:
        FeatureStatisticsError: too few cases, or features that cannot be modelled (a phrase).
    """
    layer = bottleneck_layer(network, metadata.in_channels, metadata.sliding_window.patch_size)
    return fit_feature_statistics(layer, _cases_features(network, layer, metadata, training, batch_size),
                                  _cases_features(network, layer, metadata, validation, batch_size))


def fit_member_features(members: Sequence[nn.Module], metadata: "BundleMetadata",
                        training: Sequence[Sequence[Any]], unseen: Sequence[Sequence[Any]],
                        batch_size: int = 16) -> MemberFeatureStatistics:
    """An ensemble's feature statistics judged by every member (``input_statistics["member_features"]``): member
    m's Gaussian from ``training[m]``, the cases of the patients it trained on, read at its own bottleneck; one
    threshold pooled over every member's distances of ``unseen[m]``, the cases it never trained on
    (:func:`~CalibSegLib.feature_statistics.pool_member_statistics`).

    Raises:
        FeatureStatisticsError: too few members or cases, or features that cannot be modelled (a phrase).
    """
    if len(training) != len(members) or len(unseen) != len(members):
        raise FeatureStatisticsError(f"the members' features need the training and unseen cases of each of the "
                                     f"{len(members)} members, got {len(training)} and {len(unseen)}")
    layers = [bottleneck_layer(member, metadata.in_channels, metadata.sliding_window.patch_size) for member in members]
    return fit_member_statistics(
        layers, [_cases_features(member, layer, metadata, trained, batch_size)
                 for member, layer, trained in zip(members, layers, training)],
        [_cases_features(member, layer, metadata, never, batch_size)
         for member, layer, never in zip(members, layers, unseen)])


def feature_distance(network: nn.Module, metadata: "BundleMetadata", image: np.ndarray,
                     spacing: Sequence[float], batch_size: int = 16) -> float | list[float] | None:
    """The distance of a ``(z, y, x)`` or ``(K, z, y, x)`` volume (``spacing`` (z, y, x) mm) from the
    training volumes in ``network``'s feature space, under the feature statistics of ``metadata`` (the
    bundle the network is, or one member's); for an ensemble judged by every member (``member_features``) one
    distance per member, each at that member's bottleneck under its own Gaussian; None where the bundle stores
    none.

    Raises:
        BundleError: the stored layer is not one of the network's, or gives features of another length
            (statistics fitted for another network), or the member statistics are not one per member network.
    """
    statistics = metadata.input_statistics
    if statistics is None or (statistics.get("features") is None and statistics.get("member_features") is None):
        return None
    try:
        if statistics.get("member_features") is not None:  # checked by load_bundle: cannot fail
            judges = MemberFeatureStatistics.from_dict(statistics["member_features"]).members
            members = list(network.members) if isinstance(network, MemberNetworks) else []
            if len(members) != len(judges):
                raise FeatureStatisticsError(f"{len(judges)} members' statistics for {len(members) or 'no'} "
                                             "member networks")
            return [judge.distance(volume_features(member, judge.layer, image, spacing, metadata.preprocessing,
                                                   metadata.sliding_window, batch_size))
                    for member, judge in zip(members, judges)]
        stored = FeatureStatistics.from_dict(statistics["features"])
        features = volume_features(network, stored.layer, image, spacing, metadata.preprocessing,
                                   metadata.sliding_window, batch_size)
        return stored.distance(features)
    except (FeatureLayerError, FeatureStatisticsError) as error:
        raise BundleError(f"The bundle's feature statistics do not fit its network ({error}); refit them "
                          "with python -m Training.fit_input_check.") from None
