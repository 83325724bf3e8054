"""Prediction of a 3D volume with a bundle: labels, per-voxel confidence and normalised entropy.

Data flow per batch of slices along the bundle's slice axis (every step from the bundle):

1. scale each channel's intensities with the whole volume's range, or the bundle's per-channel normalisation
   (:mod:`CalibSegLib.preprocessing`);
2. resample the slices in-plane from the image's real spacing to the model's
   ``target_spacing``, so the network sees every image at the physical scale it was trained at;
3. run the network in overlapping windows of its training crop size, blended with a Gaussian
   weight, optionally mirrored (:mod:`CalibSegLib.sliding_window`; how far the mirrored passes agree is
   counted on the way);
4. divide the logits by the bundle's temperature, softmax, and resample the *probabilities*
   back onto the input's exact grid; labels = argmax there, confidence = max probability,
   entropy normalised by log C; an ensemble bundle (several networks, e.g. the folds of a cross-validation) runs its
   members side by side through the same windows, averages their probabilities (each at the bundle's temperature)
   and adds the members' disagreement: the mutual information between the prediction and the member, i.e. the
   entropy of the average minus the members' mean entropy (the epistemic part of the entropy), normalised by log C;
   it can also keep each member's own maps, what that member alone would give (its quality model was fitted on
   such single networks: :mod:`CalibSegLib.quality.members`);
5. once the whole volume is labelled, the bundle's post-processing (largest connected
   component of the classes validation chose, :mod:`CalibSegLib.postprocessing`).

Memory is bounded by the batch: the ``(C, z, y, x)`` probability volume exists only when asked for. An ensemble
whose quality model reads its members keeps their M maps by default (9 bytes per voxel and member: 25 MB for a
10 × 256 × 256 cine volume of five members).

A 3D bundle (``spatial_dims`` 3) runs the same steps on the whole volume: it is scaled and resampled to the
model's ``(z, y, x)`` target spacing, the network runs in 3D windows over it (its logits stay on the model's
grid), and steps 4–5 go back to the input's grid one chunk of ``batch_size`` input slices at a time (in-plane
as above, then linearly along z), so neither the probabilities nor the maps on the input grid exist as a
float ``(C, z, y, x)`` volume unless asked for.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from torch import nn

from CalibSegLib.bundle import Bundle, BundleMetadata, load_bundle
from CalibSegLib.channels import input_names
from CalibSegLib.device import resolve_device
from CalibSegLib.prediction import Prediction
from CalibSegLib.preprocessing import (as_channels, channel_intensities, check_volume, in_plane_spacing,
                                       network_grid_shape, normalize_channels, resample_slices, resample_volume,
                                       scale_intensity, volume_grid_shape)
from CalibSegLib.sliding_window import MirrorAgreement, window_logits
from CalibSegLib.temperature import apply_temperature

__all__ = [
    "InferenceCancelled",
    "Predictor",
    "ProbabilitySink",
    "confidence_maps",
    "ensemble_average",
    "member_logits",
    "normalised_entropy",
    "volume_chunk_probabilities",
]

ProbabilitySink = Callable[[slice, np.ndarray], None]
"""``sink(slices, probabilities)``: ``slices`` indexes the slice axis, ``probabilities`` is
``(C, n, *in-plane)`` float32 on the input grid."""


class InferenceCancelled(Exception):
    """Raised by :meth:`Predictor.predict` when its ``cancel`` event was set."""


def member_logits(logits: torch.Tensor, members: int, dim: int = 1) -> tuple[torch.Tensor, ...]:
    """The ``members`` networks' own logits (views) of their side-by-side ``M × C`` channels along ``dim``."""
    return logits.chunk(members, dim=dim)


def normalised_entropy(probabilities: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``-Σ p log p / log C`` over ``dim`` (C classes), in [0, 1] up to rounding."""
    return -torch.special.xlogy(probabilities, probabilities).sum(dim=dim) / math.log(probabilities.shape[dim])


def ensemble_average(member_probabilities: Iterable[torch.Tensor], members: int
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each of ``members`` networks' ``(n, C, *spatial)`` probabilities, one after the other (so only a running sum
    is held, whatever M) → their average ``(n, C, *spatial)`` and the members' disagreement ``(n, *spatial)``:
    entropy of the average minus the members' mean entropy (the mutual information between the prediction and the
    member), normalised by log C and clamped to [0, 1]; one member is its own average, with no disagreement."""
    total = entropies = None
    for probabilities in member_probabilities:
        total = probabilities if total is None else total + probabilities
        if members > 1:
            entropy = normalised_entropy(probabilities)
            entropies = entropy if entropies is None else entropies + entropy
    if members == 1:
        return total, None
    average = total / members
    return average, (normalised_entropy(average) - entropies / members).clamp(0.0, 1.0)


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
    entropy = normalised_entropy(probabilities)
    return labels.to(torch.uint8), confidence.clamp(1.0 / num_classes, 1.0), entropy.clamp(0.0, 1.0)


class Predictor:
    """Runs a bundle's network over 3D volumes of its ``in_channels`` channels: a 2D network slice by slice, a 3D
    one (``spatial_dims`` 3) over the whole volume on its grid.

    Args:
        bundle: a :class:`Bundle` or the path of a ``.calibseg`` file.
        device: ``"auto"`` (CUDA when present), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        batch_size: slices per step (for a 3D network: input slices per chunk brought back to the input grid);
            memory grows with it (and the slice size), not with the volume.
    """

    def __init__(
        self, bundle: Bundle | str | Path, device: str | torch.device = "auto", batch_size: int = 16
    ) -> None:
        if isinstance(bundle, Bundle):
            bundle.metadata.validate()  # built or changed in memory; a file is validated once, by load_bundle
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
        self._setup(self.bundle.metadata, None, device, batch_size)

    @classmethod
    def from_network(cls, network: nn.Module, metadata: BundleMetadata, device: str | torch.device = "auto",
                     batch_size: int = 16) -> "Predictor":
        """A predictor around a live ``network`` described by ``metadata`` (e.g. validation while training:
        no copy of the weights, no bundle file). The network is used as it is, in eval mode."""
        metadata.validate()
        predictor = cls.__new__(cls)
        predictor.bundle = None
        predictor._setup(metadata, network, device, batch_size)
        return predictor

    def _setup(self, metadata: BundleMetadata, network: nn.Module | None, device: str | torch.device,
               batch_size: int) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        self.metadata = metadata
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.model = (network if network is not None else self.bundle.build_model()).to(self.device)
        self.members = metadata.ensemble_size

    @property
    def num_classes(self) -> int:
        return self.metadata.num_classes

    @torch.inference_mode()
    def network_logits(self, images: torch.Tensor, agreement: MirrorAgreement | None = None) -> torch.Tensor:
        """Blended ``(n, C, *spatial)`` float32 logits (before temperature) of normalised ``images (n, K, *spatial)``
        already on the model's grid (any size; ``(y, x)`` slices for a 2D network, ``(z, y, x)`` volumes for a 3D
        one), on ``device``; ``agreement`` counts the mirrored passes."""
        was_training = self.model.training
        self.model.eval()
        try:
            return window_logits(self.model, images.to(self.device), self.metadata.sliding_window, agreement)
        finally:
            self.model.train(was_training)

    def slice_logits(self, slices: np.ndarray, spacing: Sequence[float],
                     agreement: MirrorAgreement | None = None) -> torch.Tensor:
        """Normalised ``(n, y, x)`` one-channel or ``(n, K, y, x)`` slices with in-plane ``spacing (y, x)`` mm →
        ``(n, C, y', x')`` float32 logits (before temperature) on the model's grid, on ``device``; ``agreement``
        counts the mirrored passes."""
        batch = torch.from_numpy(np.ascontiguousarray(slices, dtype=np.float32))
        batch = batch.unsqueeze(1) if batch.ndim == 3 else batch
        grid = network_grid_shape(slices.shape[-2:], spacing, self.metadata.preprocessing.target_spacing)
        return self.network_logits(resample_slices(batch, grid), agreement)

    def input_grid_probabilities(self, logits: torch.Tensor, temperature: float | Sequence[float],
                                 shape: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(n, M × C, y', x')`` model-grid logits of the bundle's M networks (M = 1: one network) → their mean
        ``(n, C, *shape)`` probabilities at ``temperature`` on the input's in-plane grid and, for an ensemble, their
        disagreement ``(n, *shape)`` (:func:`ensemble_average`). Probabilities (not logits) are resampled, each
        member's: bilinear weights keep them summing to 1."""
        return ensemble_average((resample_slices(torch.softmax(apply_temperature(member, temperature), dim=1), shape)
                                 for member in member_logits(logits, self.members)), self.members)

    def _kept_members(self, keep_members: bool | None) -> int:
        """How many members' own predictions to keep: M or 0 (a single network keeps none)."""
        model = self.metadata.quality
        keep = model is not None and model.per_member if keep_members is None else keep_members
        return self.members if keep and self.members > 1 else 0

    def _agreement(self, members: int) -> "MirrorAgreement | _MemberAgreements | None":
        """The mirrored passes' agreement to count (None without mirroring); per member too when ``members``."""
        window = self.metadata.sliding_window
        if not window.mirror_axes:
            return None
        if members:
            return _MemberAgreements(self.num_classes, window.passes, members)
        return MirrorAgreement(self.num_classes, window.passes)

    def predict(
        self,
        image: np.ndarray,
        spacing: Sequence[float],
        progress: Callable[[float], None] | None = None,
        cancel: threading.Event | None = None,
        keep_probabilities: bool = False,
        probability_sink: ProbabilitySink | None = None,
        keep_members: bool | None = None,
    ) -> Prediction:
        """Segment a ``(z, y, x)`` volume (or ``(K, z, y, x)`` for a bundle of K channels, in the order of its
        ``channel_names``) with voxel ``spacing`` ``(z, y, x)`` in mm; the outputs are ``(z, y, x)``.

        Args:
            image: the volume, any real dtype; never modified.
            spacing: voxel size; the in-plane pair decides how slices are resampled to the
                model's ``target_spacing``.
            progress: called with the fraction done after every batch; the last call is 1.0,
                made exactly once.
            cancel: checked before every batch; once set, :class:`InferenceCancelled` is raised.
            keep_probabilities: also return the ``(C, z, y, x)`` probabilities (C × 4 bytes per voxel).
            probability_sink: called once per batch with the slice range along the slice axis
                and that batch's ``(C, n, *in-plane)`` float32 probabilities on the input grid,
                to stream metrics without keeping the probability volume.
            keep_members: an ensemble's members' own predictions in :attr:`Prediction.members`
                (None: when the bundle's quality model reads them, ``per_member``).

        Raises:
            ValueError: the image is not 3D (or not K channels of 3D for a K-channel bundle), empty, constant,
                too small, has NaN/inf values, its in-plane spacing is missing, zero or implausible for the model.
            InferenceCancelled: ``cancel`` was set.
        """
        return self.predict_variants(image, spacing, [self.metadata.temperature], progress, cancel,
                                     keep_probabilities, [probability_sink], keep_members)[0]

    def channels_of(self, image: np.ndarray, spacing: Sequence[float], slice_axis: int = 0) -> np.ndarray:
        """``image`` as the bundle's ``(K, z, y, x)`` channels (a view), each checked as a volume of ``spacing`` with
        ``slice_axis`` (:func:`~CalibSegLib.preprocessing.check_volume`); a ``(z, y, x)`` volume is one channel.

        Raises:
            ValueError: the image has another number of channels than the bundle (one sentence naming them), or a
                channel :func:`~CalibSegLib.preprocessing.check_volume` refuses.
        """
        if not isinstance(image, np.ndarray) or image.ndim not in (3, 4):
            check_volume(image)  # its sentence for a non-array or a wrong dimension
        channels = as_channels(image)
        expected = self.metadata.in_channels
        if len(channels) != expected:
            names = ", ".join(input_names(self.metadata))
            raise ValueError(f"The bundle takes {expected} channel(s) ({names}) but the image has {len(channels)}; "
                             f"give one {'(z, y, x) volume' if expected == 1 else f'({expected}, z, y, x) array'}.")
        for name, channel in zip(input_names(self.metadata), channels):  # of several, name the one at fault
            what = f"{name} channel" if expected > 1 else "image"
            check_volume(channel, spacing, slice_axis=slice_axis, what=what)
        return channels

    def predict_variants(
        self,
        image: np.ndarray,
        spacing: Sequence[float],
        temperatures: Sequence[float | Sequence[float]],
        progress: Callable[[float], None] | None = None,
        cancel: threading.Event | None = None,
        keep_probabilities: bool = False,
        probability_sinks: Sequence[ProbabilitySink | None] | None = None,
        keep_members: bool | None = None,
    ) -> list[Prediction]:
        """:meth:`predict` at several ``temperatures`` from one pass of the network (e.g. the bundle's fitted
        temperature and T = 1 for an evaluation): one :class:`Prediction` per temperature, and
        ``probability_sinks[i]`` (or None) receives variant i's probabilities; ``keep_members`` as in
        :meth:`predict`."""
        members = self._kept_members(keep_members)
        if self.metadata.spatial_dims == 3:
            return self._volume_variants(image, spacing, temperatures, progress, cancel, keep_probabilities,
                                         probability_sinks, members)
        preprocessing = self.metadata.preprocessing
        axis = preprocessing.slice_axis
        channels = self.channels_of(image, spacing, axis)
        image = channels[0]  # the outputs' grid
        plane_spacing = in_plane_spacing(spacing, axis)
        in_plane_shape = tuple(size for index, size in enumerate(image.shape) if index != axis)
        # Fails here, before any work, when the spacing is implausible for the model.
        network_grid_shape(in_plane_shape, plane_spacing, preprocessing.target_spacing)
        sinks = _sinks(probability_sinks, temperatures)
        intensities = channel_intensities(channels, preprocessing)
        predictions = self._empty_predictions(image.shape, len(temperatures), keep_probabilities, members)
        agreement = self._agreement(members)
        # Slice-first views: writing into them fills the outputs in the input's own layout.
        sources = [np.moveaxis(channel, axis, 0) for channel in channels]
        count = sources[0].shape[0]
        for start in range(0, count, self.batch_size):
            if cancel is not None and cancel.is_set():
                raise InferenceCancelled(f"Inference was cancelled after {start} of {count} slices.")
            batch = slice(start, min(start + self.batch_size, count))
            slices = np.stack([scale_intensity(source[batch], intensity)
                               for source, intensity in zip(sources, intensities)], axis=1)
            logits = self.slice_logits(slices, plane_spacing, agreement)
            for prediction, temperature, sink in zip(predictions, temperatures, sinks):
                member_probabilities = (
                    resample_slices(torch.softmax(apply_temperature(member, temperature), dim=1), in_plane_shape)
                    for member in member_logits(logits, self.members))
                _write_members(prediction, axis, batch, member_probabilities, self.members, sink)
            if progress is not None and batch.stop < count:
                progress(batch.stop / count)
        return self._finish(predictions, agreement, progress)

    def _empty_predictions(self, shape: Sequence[int], count: int, keep_probabilities: bool,
                           members: int = 0) -> list[Prediction]:
        """``count`` predictions of a ``shape`` input to be filled batch by batch (:func:`_write_members`), each
        with ``members`` members' own (maps only: a member is one network)."""

        def empty(whole: bool, own: int) -> Prediction:
            return Prediction(
                labels=np.empty(shape, np.uint8),
                confidence=np.empty(shape, np.float32),
                entropy=np.empty(shape, np.float32),
                probabilities=np.empty((self.num_classes, *shape), np.float32) if keep_probabilities and whole
                else None,
                probability_sums=np.zeros(self.num_classes),
                disagreement=np.empty(shape, np.float32) if whole and self.members > 1 else None,
                members=[empty(False, 0) for _ in range(own)] or None,
            )

        return [empty(True, members) for _ in range(count)]

    def _finish(self, predictions: list[Prediction], agreement: "MirrorAgreement | _MemberAgreements | None",
                progress: Callable[[float], None] | None) -> list[Prediction]:
        """Post-process the whole labelled volumes (each member's too), record the mirror agreement, report 1.0."""
        for prediction in predictions:
            self.metadata.postprocessing.apply(prediction.labels)
            prediction.mirror_agreement = None if agreement is None else agreement.dice()
            for index, member in enumerate(prediction.members or ()):
                self.metadata.postprocessing.apply(member.labels)
                member.mirror_agreement = agreement.member_dice(index) if agreement is not None else None
        if progress is not None:
            progress(1.0)
        return predictions

    def _volume_variants(
        self,
        image: np.ndarray,
        spacing: Sequence[float],
        temperatures: Sequence[float | Sequence[float]],
        progress: Callable[[float], None] | None,
        cancel: threading.Event | None,
        keep_probabilities: bool,
        probability_sinks: Sequence[ProbabilitySink | None] | None,
        members: int = 0,
    ) -> list[Prediction]:
        """:meth:`predict_variants` of a 3D network: the whole volume on the model's grid through 3D windows, then
        back to the input grid ``batch_size`` slices at a time (progress: 0.5 once the network has run)."""
        preprocessing = self.metadata.preprocessing
        channels = self.channels_of(image, spacing)
        image = channels[0]  # the outputs' grid
        grid = volume_grid_shape(image.shape, [float(value) for value in spacing], preprocessing.target_spacing)
        sinks = _sinks(probability_sinks, temperatures)
        normalized = normalize_channels(channels, preprocessing)  # (K, z, y, x)
        if cancel is not None and cancel.is_set():
            raise InferenceCancelled("Inference was cancelled before the network ran.")
        agreement = self._agreement(members)
        volume = torch.from_numpy(normalized)[None]  # (1, K, z, y, x)
        logits = self.network_logits(resample_volume(volume, grid), agreement)[0]  # (C, z', y', x') model grid
        del volume, normalized
        if progress is not None:
            progress(0.5)
        predictions = self._empty_predictions(image.shape, len(temperatures), keep_probabilities, members)
        count = image.shape[0]
        for start in range(0, count, self.batch_size):
            if cancel is not None and cancel.is_set():
                raise InferenceCancelled(f"Inference was cancelled after {start} of {count} slices.")
            batch = slice(start, min(start + self.batch_size, count))
            for prediction, temperature, sink in zip(predictions, temperatures, sinks):
                member_probabilities = (volume_chunk_probabilities(member, temperature, image.shape, batch)
                                        for member in member_logits(logits, self.members, dim=0))
                _write_members(prediction, 0, batch, member_probabilities, self.members, sink)
            if progress is not None and batch.stop < count:
                progress(0.5 + 0.5 * batch.stop / count)
        return self._finish(predictions, agreement, progress)


def volume_chunk_probabilities(logits: torch.Tensor, temperature: float | Sequence[float], shape: Sequence[int],
                               slices: slice) -> torch.Tensor:
    """Probabilities at ``temperature`` of the input slices ``slices`` of a ``shape`` (z, y, x) input, from a 3D
    network's ``(C, z', y', x')`` logits on the model's grid: ``(n, C, y, x)``.

    The model slices the chunk needs are softmaxed, resampled in-plane (:func:`resample_slices`) and interpolated
    linearly along z with ``align_corners=False`` edges (the trilinear resampling of the whole volume, one chunk
    at a time): probabilities (not logits), so the weights keep them summing to 1.
    """
    depth = logits.shape[1]
    positions = (torch.arange(slices.start, slices.stop, dtype=torch.float64) + 0.5) * depth / shape[0] - 0.5
    positions = positions.clamp(0, depth - 1)
    below = positions.floor().long()
    above = (below + 1).clamp(max=depth - 1)
    first, last = int(below.min()), int(above.max()) + 1
    needed = apply_temperature(logits[:, first:last].movedim(1, 0), temperature)
    planes = resample_slices(torch.softmax(needed, dim=1), shape[1:])  # (m, C, y, x)
    weight = (positions - below).to(planes.dtype).view(-1, 1, 1, 1).to(planes.device)
    return planes[below - first] * (1 - weight) + planes[above - first] * weight


def _sinks(probability_sinks: Sequence[ProbabilitySink | None] | None,
           temperatures: Sequence[float | Sequence[float]]) -> list[ProbabilitySink | None]:
    """One sink (or None) per temperature."""
    sinks = list(probability_sinks or [None] * len(temperatures))
    if len(sinks) != len(temperatures):
        raise ValueError(f"Got {len(sinks)} probability sinks for {len(temperatures)} temperatures.")
    return sinks


class _MemberAgreements:
    """The mirrored passes' agreement of an ensemble counted as one (:class:`MirrorAgreement`, every member's
    voxels alike) and per member, each member's exactly as that member alone would count it."""

    def __init__(self, num_classes: int, passes: int, members: int) -> None:
        self.num_classes = num_classes
        self.pooled = MirrorAgreement(num_classes, passes)
        self.members = [MirrorAgreement(num_classes, passes) for _ in range(members)]

    def add(self, pass_labels: Sequence[torch.Tensor], average_labels: torch.Tensor) -> None:
        """Count one batch of ``(n, M, *spatial)`` labels (:meth:`MirrorAgreement.add`)."""
        self.pooled.add(pass_labels, average_labels)
        for index, member in enumerate(self.members):
            member.add([labels[:, index:index + 1] for labels in pass_labels], average_labels[:, index:index + 1])

    def dice(self) -> np.ndarray:
        """The ensemble's ``(C,)`` agreement (:meth:`MirrorAgreement.dice`)."""
        return self.pooled.dice()

    def member_dice(self, index: int) -> np.ndarray:
        """Member ``index``'s own ``(C,)`` agreement."""
        return self.members[index].dice()


def _write_members(prediction: Prediction, axis: int, batch: slice, member_probabilities: Iterable[torch.Tensor],
                   members: int, sink: ProbabilitySink | None) -> None:
    """Write one batch of the ``members`` networks' ``(n, C, *in-plane)`` probabilities on the input grid, one
    after the other: their average (:func:`ensemble_average`) into ``prediction`` (and the sink), each member's
    into its own when kept (only then are all M held at once)."""
    if prediction.members:
        member_probabilities = list(member_probabilities)
        for member, own in zip(prediction.members, member_probabilities, strict=True):
            _write_batch(member, axis, batch, own, None, None)
    probabilities, disagreement = ensemble_average(member_probabilities, members)
    _write_batch(prediction, axis, batch, probabilities, disagreement, sink)


def _write_batch(prediction: Prediction, axis: int, batch: slice, probabilities: torch.Tensor,
                 disagreement: torch.Tensor | None, sink: ProbabilitySink | None) -> None:
    """Write one batch's ``(n, C, *in-plane)`` probabilities (and an ensemble's ``(n, *in-plane)`` disagreement)
    into ``prediction``'s maps (and the sink)."""
    maps = (prediction.labels, prediction.confidence, prediction.entropy)
    for target, values in zip(maps, confidence_maps(probabilities), strict=True):
        np.moveaxis(target, axis, 0)[batch] = values.cpu().numpy()
    if disagreement is not None:
        np.moveaxis(prediction.disagreement, axis, 0)[batch] = disagreement.cpu().numpy()
    prediction.probability_sums += probabilities.sum(dim=(0, *range(2, probabilities.ndim)),
                                                     dtype=torch.float64).cpu().numpy()
    if prediction.probabilities is not None or sink is not None:
        class_first = probabilities.transpose(0, 1).cpu().numpy()
        if prediction.probabilities is not None:
            np.moveaxis(prediction.probabilities, axis + 1, 1)[:, batch] = class_first
        if sink is not None:
            sink(batch, class_first)
