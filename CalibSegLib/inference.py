"""Prediction of a 3D volume with a bundle: labels, per-voxel confidence and normalised entropy.

2D networks run slice by slice in batches along the bundle's slice axis, so memory is
bounded by the batch, not the volume. Preprocessing comes only from the bundle.
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
from CalibSegLib.preprocessing import check_volume, normalize_intensity, resize_slices
from CalibSegLib.temperature import apply_temperature

__all__ = ["InferenceCancelled", "Prediction", "Predictor", "resolve_device"]


class InferenceCancelled(Exception):
    """Raised by :meth:`Predictor.predict` when its ``cancel`` event was set."""


@dataclass
class Prediction:
    """Outputs on the input's grid, all ``(z, y, x)``.

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
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA device is available; use 'cpu' or 'auto'.")
    return device


ProbabilitySink = Callable[[slice, np.ndarray], None]


class Predictor:
    """Runs a bundle's network over volumes.

    Args:
        bundle: a loaded :class:`Bundle` or the path of a ``.calibseg`` file.
        device: ``"auto"`` (CUDA when present), ``"cpu"``, ``"cuda"``, ...
        batch_size: slices per forward pass.
    """

    def __init__(self, bundle: Bundle | str | Path, device: str | torch.device = "auto", batch_size: int = 16) -> None:
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
        if self.bundle.metadata.spatial_dims != 2:
            raise ValueError("Only slice-wise (2D) bundles are supported by Predictor; this bundle is 3D.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.model = self.bundle.build_model().to(self.device)

    @property
    def num_classes(self) -> int:
        return self.bundle.metadata.num_classes

    @torch.inference_mode()
    def _probabilities(self, slices: np.ndarray) -> torch.Tensor:
        """``(n, y, x)`` normalised slices → ``(n, C, y, x)`` float32 probabilities on the slices' grid."""
        preprocessing = self.bundle.metadata.preprocessing
        batch = torch.from_numpy(np.ascontiguousarray(slices)).to(self.device).unsqueeze(1)
        logits = self.model(resize_slices(batch, preprocessing.target_size))
        logits = resize_slices(logits.float(), slices.shape[1:])
        logits = apply_temperature(logits, self.bundle.metadata.temperature)
        return torch.softmax(logits, dim=1)

    def predict(
        self,
        image: np.ndarray,
        spacing: Sequence[float],
        progress: Callable[[float], None] | None = None,
        cancel: threading.Event | None = None,
        keep_probabilities: bool = False,
        probability_sink: ProbabilitySink | None = None,
    ) -> Prediction:
        """Segment a ``(z, y, x)`` volume with voxel ``spacing`` (z, y, x) mm.

        Args:
            progress: called with the fraction done after every batch; the last call is 1.0.
            cancel: when set, the prediction stops before the next batch with
                :class:`InferenceCancelled`.
            keep_probabilities: also return the ``(C, z, y, x)`` probabilities (memory!).
            probability_sink: called once per batch with the slice range along the slice axis
                and that batch's ``(C, n, *in-plane)`` float32 probabilities on the input grid,
                to stream metrics without keeping the probability volume.

        Raises:
            ValueError: the image is not 3D, empty, constant, too small, or has NaN/inf values.
            InferenceCancelled: ``cancel`` was set.
        """
        check_volume(image, spacing)
        preprocessing = self.bundle.metadata.preprocessing
        volume = np.moveaxis(image, preprocessing.slice_axis, 0)
        normalized = normalize_intensity(volume, preprocessing.normalization, preprocessing.upper_percentile)
        count = normalized.shape[0]
        labels = np.empty(normalized.shape, np.uint8)
        confidence = np.empty(normalized.shape, np.float32)
        entropy = np.empty(normalized.shape, np.float32)
        probabilities = np.empty((self.num_classes,) + normalized.shape, np.float32) if keep_probabilities else None
        log_classes = math.log(self.num_classes)
        for start in range(0, count, self.batch_size):
            if cancel is not None and cancel.is_set():
                raise InferenceCancelled("Inference was cancelled.")
            stop = min(start + self.batch_size, count)
            probs = self._probabilities(normalized[start:stop])
            top, winner = probs.max(dim=1)
            uncertainty = -(probs * probs.clamp_min(1e-12).log()).sum(dim=1) / log_classes
            labels[start:stop] = winner.to(torch.uint8).cpu().numpy()
            confidence[start:stop] = top.cpu().numpy()
            entropy[start:stop] = uncertainty.clamp(0.0, 1.0).cpu().numpy()
            if probabilities is not None or probability_sink is not None:
                class_first = probs.permute(1, 0, 2, 3).cpu().numpy()
                if probabilities is not None:
                    probabilities[:, start:stop] = class_first
                if probability_sink is not None:
                    probability_sink(slice(start, stop), class_first)
            if progress is not None:
                progress(stop / count)
        axis = preprocessing.slice_axis
        restore = lambda array: np.moveaxis(array, 0, axis)  # noqa: E731
        return Prediction(
            labels=restore(labels),
            confidence=restore(confidence),
            entropy=restore(entropy),
            probabilities=None if probabilities is None else np.moveaxis(probabilities, 1, axis + 1),
        )
