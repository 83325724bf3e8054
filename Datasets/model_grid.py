"""Volumes put on the model's grid for training and validation, cached in memory as tensors (:func:`to_model_grid`).

Intensities go through the same :func:`CalibSegLib.preprocessing.normalize_channels` the predictor uses; a 2D
network's volumes are resampled slice by slice in-plane from the volume's own spacing to
``Preprocessing.target_spacing``, a 3D network's whole (images linearly, labels by the argmax of their resampled
one-hot maps). Volumes are kept whole: crops are cut from them per batch (:mod:`Training.batches`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from CalibSegLib.preprocessing import (Preprocessing, in_plane_spacing, network_grid_shape, normalize_channels,
                                       resample_slices, resample_volume, volume_grid_shape)
from Datasets.errors import DataError
from Datasets.loading import Case

__all__ = ["GridVolume", "to_model_grid"]


@dataclass
class GridVolume:
    """One volume on the model's grid, cached for training or validation, as items of the network's input.

    ``images (n, K, *spatial)`` float32 normalised (K input channels), ``labels (n, *spatial)`` uint8 (an eighth of
    int64's memory, widened per batch): for a 2D network the items are the ``n = z`` slices, ``spatial = (y, x)``;
    for a 3D network the one item is the whole volume, ``spatial = (z, y, x)``; sizes at the model's spacing.
    """

    case_id: str
    images: torch.Tensor
    labels: torch.Tensor

    def to(self, device: torch.device) -> "GridVolume":
        """The same volume on ``device`` (e.g. cached on the GPU so batches never wait for the host)."""
        return GridVolume(self.case_id, self.images.to(device), self.labels.to(device))


def _labels_to_grid(label: np.ndarray, size: tuple[int, ...], num_classes: int) -> torch.Tensor:
    """``(n, *spatial)`` labels on the grid ``size`` (2D: in-plane ``(y, x)`` of ``n`` slices; 3D: ``(z, y, x)``):
    argmax of the linearly resampled one-hot maps (smoother and fairer to thin structures than nearest neighbour)."""
    labels = torch.from_numpy(label.astype(np.int64))
    if tuple(labels.shape[-len(size):]) == size:
        return labels.to(torch.uint8)
    one_hot = torch.nn.functional.one_hot(labels, num_classes).movedim(-1, 1).float()
    resample = resample_slices if len(size) == 2 else resample_volume
    return resample(one_hot, size).argmax(dim=1).to(torch.uint8)


def _slices_on_grid(case: Case, preprocessing: Preprocessing, num_classes: int) -> GridVolume:
    """A 2D network's items: the volume's slices, each resampled in-plane."""
    size = network_grid_shape(case.label.shape[1:], in_plane_spacing(case.spacing, 0), preprocessing.target_spacing)
    normalized = normalize_channels(case.image, preprocessing)  # (K, z, y, x)
    images = resample_slices(torch.from_numpy(normalized).transpose(0, 1), size)
    return GridVolume(case.case_id, images.contiguous(), _labels_to_grid(case.label, size, num_classes))


def _volume_on_grid(case: Case, preprocessing: Preprocessing, num_classes: int) -> GridVolume:
    """A 3D network's item: the whole volume resampled to the (z, y, x) target spacing (trilinear)."""
    size = volume_grid_shape(case.label.shape, case.spacing, preprocessing.target_spacing)
    normalized = normalize_channels(case.image, preprocessing)  # (K, z, y, x)
    images = resample_volume(torch.from_numpy(normalized)[None], size)
    return GridVolume(case.case_id, images.contiguous(), _labels_to_grid(case.label[None], size, num_classes))


# How a volume becomes the network's items, by the number of target-spacing values (the network's spatial dims).
_GRID_ITEMS = {2: _slices_on_grid, 3: _volume_on_grid}


def to_model_grid(cases: Sequence[Case], preprocessing: Preprocessing, num_classes: int) -> list[GridVolume]:
    """Normalise each volume as ``preprocessing`` says and resample it from the volume's spacing to
    ``preprocessing.target_spacing`` (the predictor does the same at inference): slice by slice in-plane for a 2D
    target spacing ``(y, x)``, the whole volume for a 3D one ``(z, y, x)``.

    Raises:
        DataError: no volume, or a volume whose spacing puts it outside the model's grid limits.
    """
    if not cases:
        raise DataError("No volumes to train on; the split selected no volume.")
    if preprocessing.slice_axis != 0:
        raise DataError("Training reads slices along the first array axis (z); use slice_axis 0.")
    on_grid = _GRID_ITEMS[len(preprocessing.target_spacing)]
    volumes = []
    for case in cases:
        try:
            volumes.append(on_grid(case, preprocessing, num_classes))
        except ValueError as error:
            raise DataError(f"{case.case_id}: {error}") from None
    return volumes
