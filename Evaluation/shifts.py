"""Shifted copies of a volume that keep its anatomy and change its image: what the input check must catch.

Each shift maps a ``(z, y, x)`` float32 volume (any intensity units) and a random generator to a volume
of the same shape and intensity range (its ``[min, p99]``), so the reference labels still mark the same
structures and a measured Dice says how far the model was thrown. The severity is drawn per volume from
the generator, so a set of copies spans mild to strong. The new shifts work slice by slice (an MRI
acquires the slices one by one):

- ``intensity remap (tent)``: the intensities folded around a level between the myocardium's and the
  blood's (:func:`_tent`), so mid-greys are brightest: another contrast ordering of blood, myocardium
  and background;
- ``intensity remap (random curve)``: a random piecewise-linear, mostly non-monotonic curve through six
  knots;
- ``bias field``: a smooth multiplicative coil-sensitivity field (MONAI's ``RandBiasField``, degree 3)
  over the slice, the same on every slice;
- ``blur and noise``: in-plane Gaussian blur (SciPy), then Gaussian noise;
- ``k-space ringing``: k-space truncated to a disc (MONAI's ``GibbsNoise``): Gibbs ringing at every edge;
- ``k-space undersampling``: phase-encoding lines dropped as an accelerated scan drops them (MONAI's
  ``RandomKspaceMask``: the central 8 % kept, the rest at random), zero-filled, its magnitude;

beside the existing ones of :data:`Evaluation.quality_report.DEGRADATIONS` (contrast inversion, gamma 3,
noise). :func:`at_pixel_spacing` is the other change an input brings without changing the anatomy:
another in-plane pixel size (SimpleITK's resampling: the image linear and anti-aliased, the labels
nearest-neighbour). ``studies/input_check_table.py`` runs them all through a bundle, with uniform-noise
volumes and CT-like abdomens.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import SimpleITK as sitk
import torch
from monai.apps.reconstruction.transforms.array import RandomKspaceMask
from monai.networks.blocks.fft_utils_t import fftn_centered_t
from monai.transforms import GibbsNoise, RandBiasField
from scipy.ndimage import gaussian_filter

from Evaluation.quality_report import DEGRADATIONS

__all__ = ["SHIFTS", "at_pixel_spacing"]

Shift = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def _unit(image: np.ndarray) -> tuple[np.ndarray, float, float]:
    """``image`` clipped to ``[min, p99]`` and scaled to [0, 1], with those two bounds (float64)."""
    low, high = float(image.min()), float(np.percentile(image, 99))
    scale = max(high - low, 1e-12)
    return np.clip((image.astype(np.float64) - low) / scale, 0.0, 1.0), low, high


def _back(unit: np.ndarray, low: float, high: float) -> np.ndarray:
    """[0, 1] values mapped back onto the ``[low, high]`` range, float32."""
    return (low + np.clip(unit, 0.0, 1.0) * (high - low)).astype(np.float32)


def _seed(rng: np.random.Generator) -> int:
    """A seed for a MONAI transform's own generator, drawn from ``rng`` (the copies follow from one seed)."""
    return int(rng.integers(0, 2**31 - 1))


def _tent(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    # Cine MRI: background and lung near 0, myocardium 0.1-0.5, blood 0.3-0.9 of the [min, p99] range.
    # Folding at a level between the two makes the myocardium's edge brightest, the blood darker than it.
    unit, low, high = _unit(image)
    level = rng.uniform(0.25, 0.5)
    return _back(1.0 - np.abs(unit - level) / max(level, 1.0 - level), low, high)


def _random_curve(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    unit, low, high = _unit(image)
    knots = np.linspace(0.0, 1.0, 6)
    return _back(np.interp(unit, knots, rng.uniform(0.0, 1.0, knots.size)), low, high)


def _bias_field(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    # The slices are MONAI's channels: one 2D field (the same coefficients) multiplies every slice.
    field = RandBiasField(degree=3, coeff_range=(-0.6, 0.6), prob=1.0).set_random_state(_seed(rng))
    return np.asarray(field(image.astype(np.float32)), dtype=np.float32)


def _blur_and_noise(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    _, low, high = _unit(image)
    sigma = rng.uniform(1.0, 3.0)  # voxels, in-plane
    blurred = gaussian_filter(image.astype(np.float64), sigma=(0.0, sigma, sigma))
    noise = rng.normal(0.0, rng.uniform(0.03, 0.10) * (high - low), image.shape)
    return (blurred + noise).astype(np.float32)


def _ringing(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    # The slices are MONAI's channels: each slice's 2D k-space keeps a disc, (1 - alpha) of its half-diagonal.
    ringing = GibbsNoise(alpha=rng.uniform(0.55, 0.85))
    return np.asarray(ringing(image.astype(np.float32)), dtype=np.float32)


def _undersampling(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    acceleration = float(rng.choice([3.0, 4.0, 6.0, 8.0]))
    mask = RandomKspaceMask(center_fractions=[0.08], accelerations=[acceleration], spatial_dims=2,
                            is_complex=True)
    mask.set_random_state(_seed(rng))
    # (slices, coils = 1, y, x) real images; their k-space comes as (..., y, x, 2) real and imaginary parts,
    # whose lines along x are sampled; the mask gives back the zero-filled magnitude image (slices, y, x).
    slices = torch.from_numpy(image.astype(np.float32))[:, None]
    kspace = fftn_centered_t(slices, spatial_dims=2, is_complex=False)
    _, magnitude = mask(kspace)
    return magnitude.numpy().astype(np.float32)


# name -> f(image (z, y, x) float32, rng) -> shifted image of the same shape; the severity drawn from rng.
SHIFTS: dict[str, Shift] = {
    **DEGRADATIONS,
    "intensity remap (tent)": _tent,
    "intensity remap (random curve)": _random_curve,
    "bias field": _bias_field,
    "blur and noise": _blur_and_noise,
    "k-space ringing": _ringing,
    "k-space undersampling": _undersampling,
}


def at_pixel_spacing(volume: np.ndarray, spacing: tuple[float, float, float], pixel_mm: float,
                     labels: bool = False) -> tuple[np.ndarray, tuple[float, float, float]]:
    """A ``(z, y, x)`` volume with ``spacing`` (z, y, x) mm resampled in-plane to ``pixel_mm`` square pixels
    over the same field of view, and its new spacing. The image is interpolated linearly, smoothed first
    where it shrinks (a Gaussian of σ = √(new² − old²) / 2.355 mm in-plane: a coarser acquisition, not a
    sub-sampled one); ``labels`` are taken nearest-neighbour."""
    image = sitk.GetImageFromArray(volume if labels else volume.astype(np.float32))
    image.SetSpacing(tuple(float(value) for value in spacing[::-1]))
    new_spacing = (float(spacing[0]), float(pixel_mm), float(pixel_mm))
    if not labels and pixel_mm > min(spacing[1:]):
        sigma = math.sqrt(pixel_mm ** 2 - min(spacing[1:]) ** 2) / 2.355
        image = sitk.SmoothingRecursiveGaussian(image, [sigma, sigma, 1e-3])  # (x, y, z): not along z
    size = [max(1, round(count * old / new)) for count, old, new in
            zip(image.GetSize(), image.GetSpacing(), new_spacing[::-1])]
    interpolator = sitk.sitkNearestNeighbor if labels else sitk.sitkLinear
    resampled = sitk.Resample(image, size, sitk.Transform(), interpolator, image.GetOrigin(),
                              new_spacing[::-1], image.GetDirection(), 0.0, image.GetPixelID())
    return sitk.GetArrayFromImage(resampled), new_spacing
