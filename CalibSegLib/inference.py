"""Prediction of a 3D volume with a bundle: labels, per-voxel confidence and normalised entropy.

Data flow per batch of slices along the bundle's slice axis: scale intensities with the
whole volume's range → resize in-plane to the bundle's ``target_size`` → network → resize the
logits back to the input's in-plane size → divide by the bundle's temperature → softmax →
labels, confidence, entropy written into the output arrays. Memory is bounded by the batch:
the ``(C, z, y, x)`` probability volume exists only when asked for. Preprocessing comes
only from the bundle.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from CalibSegLib.bundle import Bundle, load_bundle
from CalibSegLib.preprocessing import check_volume, intensity_range, resize_slices, scale_intensity
from CalibSegLib.temperature import apply_temperature

__all__ = [
    "InferenceCancelled",
    "Prediction",
    "Predictor",
    "ProbabilitySink",
    "confidence_maps",
    "resolve_device",
]

ProbabilitySink = Callable[[slice, np.ndarray], None]
"""``sink(slices, probabilities)``: ``slices`` indexes the slice axis, ``probabilities`` is
``(C, n, *in-plane)`` float32 on the input grid."""


class InferenceCancelled(Exception):
    """Raised by :meth:`Predictor.predict` when its ``cancel`` event was set."""


@dataclass
class Prediction:
    """Outputs on the input's grid, all ``(z, y, x)`` like the input.

    ``labels`` uint8 argmax; ``confidence`` float32 max probability in [1/C, 1];
    ``entropy`` float32 softmax entropy divided by log C, in [0, 1];
    ``probabilities`` ``(C, z, y, x)`` float32 when asked for, else None.
    """

    labels: np.ndarray
    confidence: np.ndarray
    entropy: np.ndarray
    probabilities: np.ndarray | None = None


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` → CUDA when available, else CPU; anything else as torch understands it."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except RuntimeError:
        raise ValueError(f"Unknown device {device!r}; use 'auto', 'cpu' or 'cuda'.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("Device 'cuda' was asked for but no CUDA device is available; use 'cpu' or 'auto'.")
    return device


def confidence_maps(probabilities: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Labels, confidence and normalised entropy of ``(n, C, *spatial)`` probabilities.

    Returns:
        ``labels`` uint8 argmax, ``confidence`` max probability clamped to [1/C, 1] (float
        rounding can put it a hair outside), ``entropy`` ``-Σ p log p / log C`` in [0, 1];
        each ``(n, *spatial)``.

    Raises:
        ValueError: a probability is NaN or infinite (broken weights, or logits that overflowed);
            raised here, before any map exists, so no caller can write or show a wrong result.
    """
    if not torch.isfinite(probabilities).all():
        raise ValueError(
            "The network produced NaN or infinite probabilities, so no result is given; "
            "the bundle's weights or the image's intensities are broken."
        )
    num_classes = probabilities.shape[1]
    confidence, labels = probabilities.max(dim=1)
    entropy = -torch.special.xlogy(probabilities, probabilities).sum(dim=1) / math.log(num_classes)
    return labels.to(torch.uint8), confidence.clamp(1.0 / num_classes, 1.0), entropy.clamp(0.0, 1.0)


class Predictor:
    """Runs a slice-wise (2D) bundle's network over 3D volumes.

    Args:
        bundle: a :class:`Bundle` or the path of a ``.calibseg`` file.
        device: ``"auto"`` (CUDA when present), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        batch_size: slices per forward pass; memory grows with it, not with the volume.
    """

    def __init__(
        self, bundle: Bundle | str | Path, device: str | torch.device = "auto", batch_size: int = 16
    ) -> None:
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
        metadata = self.bundle.metadata
        metadata.validate()
        if metadata.spatial_dims != 2 or metadata.in_channels != 1:
            raise ValueError(
                f"Predictor runs single-channel 2D networks slice by slice; this bundle has spatial_dims="
                f"{metadata.spatial_dims} and in_channels={metadata.in_channels}."
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.model = self.bundle.build_model().to(self.device)

    @property
    def num_classes(self) -> int:
        return self.bundle.metadata.num_classes

    @torch.inference_mode()
    def slice_probabilities(self, slices: np.ndarray) -> torch.Tensor:
        """Normalised ``(n, y, x)`` slices → ``(n, C, y, x)`` float32 probabilities on ``device``."""
        metadata = self.bundle.metadata
        batch = torch.from_numpy(np.ascontiguousarray(slices, dtype=np.float32)).to(self.device).unsqueeze(1)
        logits = self.model(resize_slices(batch, metadata.preprocessing.target_size))
        # Back to the input's in-plane grid before the softmax, so probabilities are interpolated as logits.
        logits = resize_slices(logits.float(), slices.shape[1:])
        return torch.softmax(apply_temperature(logits, metadata.temperature), dim=1)

    def predict(
        self,
        image: np.ndarray,
        spacing: Sequence[float],
        progress: Callable[[float], None] | None = None,
        cancel: threading.Event | None = None,
        keep_probabilities: bool = False,
        probability_sink: ProbabilitySink | None = None,
    ) -> Prediction:
        """Segment a ``(z, y, x)`` volume with voxel ``spacing`` ``(z, y, x)`` in mm.

        Args:
            image: the volume, any real dtype; never modified.
            spacing: voxel size; checked (three positive numbers), the resize is to the
                bundle's ``target_size``.
            progress: called with the fraction done after every batch; the last call is 1.0,
                made exactly once.
            cancel: checked before every batch; once set, :class:`InferenceCancelled` is raised.
            keep_probabilities: also return the ``(C, z, y, x)`` probabilities (C × 4 bytes per voxel).
            probability_sink: called once per batch with the slice range along the slice axis
                and that batch's ``(C, n, *in-plane)`` float32 probabilities on the input grid,
                to stream metrics without keeping the probability volume.

        Raises:
            ValueError: the image is not 3D, empty, constant, too small, has NaN/inf values, or
                ``spacing`` is not three positive numbers.
            InferenceCancelled: ``cancel`` was set.
        """
        preprocessing = self.bundle.metadata.preprocessing
        axis = preprocessing.slice_axis
        check_volume(image, spacing, slice_axis=axis)
        intensity = intensity_range(image, preprocessing.normalization, preprocessing.upper_percentile)
        prediction = Prediction(
            labels=np.empty(image.shape, np.uint8),
            confidence=np.empty(image.shape, np.float32),
            entropy=np.empty(image.shape, np.float32),
            probabilities=np.empty((self.num_classes, *image.shape), np.float32)
            if keep_probabilities
            else None,
        )
        # Slice-first views: writing into them fills the outputs in the input's own layout.
        source = np.moveaxis(image, axis, 0)
        targets = [
            np.moveaxis(array, axis, 0)
            for array in (prediction.labels, prediction.confidence, prediction.entropy)
        ]
        kept = (
            None if prediction.probabilities is None else np.moveaxis(prediction.probabilities, axis + 1, 1)
        )
        count = source.shape[0]
        for start in range(0, count, self.batch_size):
            if cancel is not None and cancel.is_set():
                raise InferenceCancelled(f"Inference was cancelled after {start} of {count} slices.")
            batch = slice(start, min(start + self.batch_size, count))
            probabilities = self.slice_probabilities(scale_intensity(source[batch], intensity))
            for target, values in zip(targets, confidence_maps(probabilities), strict=True):
                target[batch] = values.cpu().numpy()
            if kept is not None or probability_sink is not None:
                class_first = probabilities.transpose(0, 1).cpu().numpy()
                if kept is not None:
                    kept[:, batch] = class_first
                if probability_sink is not None:
                    probability_sink(batch, class_first)
            if progress is not None:
                progress(batch.stop / count)
        return prediction
