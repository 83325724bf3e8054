"""A compact, lossless cache of an ACDC HDF5 folder, to carry the full dataset to a training machine.

    python -m Datasets.build_cache /work/shared/data/acdc .device/acdc_cache     # write the cache
    calibseg-train --gpu --data .device/acdc_cache ...                   # train from it as from the folder

The ACDC volumes are float32 images in [0, 1] that were integer intensities divided by their 99th
percentile: a volume holds a few hundred to about 1,200 distinct values. The cache stores, per volume,
those values (``levels``, float32, sorted) and the image as the index of each voxel's value in them,
an integer image, coded losslessly: the difference to the voxel above it in the slice (an integer
image's neighbours predict it; decoded by a cumulative sum along ``y``), zig-zag mapped to unsigned,
split into low and high bytes and LZMA-compressed; the uint8 label is LZMA-compressed as it is.
Decoding gives back the HDF5 file's arrays bit for bit (``levels[index]`` *is* the stored float32).

On the 160 volumes of the 80 ACDC patients: 399 MB of arrays, 95 MB as HDF5 files, 47.3 MB as this
cache (docs/training.md, "Carrying the data"); ``numpy.savez_compressed`` of the float32 images alone
made 85 MB. A cache folder holds one ``<case>.npz`` per volume (an uncompressed NumPy archive of the
compressed byte streams, read without pickle) and ``calibseg_cache.json`` naming its format
(:mod:`Datasets.build_cache` writes them); :func:`Datasets.layouts.find_cases` recognises the folder by that file
and :func:`read_cached` reads a volume.
"""

from __future__ import annotations

import lzma
from pathlib import Path

import numpy as np

__all__ = ["CACHE_MARKER", "CACHE_FORMAT", "encode_volume", "decode_volume", "write_volume", "write_marker",
           "read_cached", "is_cache"]

CACHE_MARKER = "calibseg_cache.json"
CACHE_FORMAT = "calibseg-acdc-cache-1"
# LZMA2 with literal context on the previous byte's high bits: the residual bytes repeat in runs.
_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9, "lc": 4, "lp": 0, "pb": 0}]


def _compress(data: np.ndarray) -> np.ndarray:
    return np.frombuffer(lzma.compress(np.ascontiguousarray(data).tobytes(), format=lzma.FORMAT_RAW,
                                       filters=_FILTERS), dtype=np.uint8)


def _decompress(data: np.ndarray, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    raw = lzma.decompress(data.tobytes(), format=lzma.FORMAT_RAW, filters=_FILTERS)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def encode_volume(image: np.ndarray, label: np.ndarray) -> dict[str, np.ndarray]:
    """The cache's arrays of one volume: ``image (z, y, x)`` float32 (any values: the levels are the distinct
    ones, at most 65,536) and ``label (z, y, x)`` uint8; raises ValueError past 65,536 levels."""
    levels, index = np.unique(image, return_inverse=True)
    if len(levels) > 1 << 16:
        raise ValueError(f"the image has {len(levels)} distinct values; the cache codes at most 65,536.")
    index = index.reshape(image.shape).astype(np.int32)
    residual = np.diff(index, axis=-2, prepend=0)  # the voxel above predicts each voxel
    unsigned = (residual << 1) ^ (residual >> 31)  # zig-zag: small magnitudes to small codes
    return {"shape": np.asarray(image.shape, dtype=np.int64), "levels": levels.astype(image.dtype),
            "low": _compress((unsigned & 0xFF).astype(np.uint8)), "high": _compress((unsigned >> 8).astype(np.uint8)),
            "label": _compress(label.astype(np.uint8))}


def decode_volume(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``image (z, y, x)`` float32 and ``label (z, y, x)`` uint8 of :func:`encode_volume`'s arrays, exactly."""
    shape = tuple(int(size) for size in arrays["shape"])
    unsigned = (_decompress(arrays["low"], np.uint8, shape).astype(np.int32)
                | (_decompress(arrays["high"], np.uint8, shape).astype(np.int32) << 8))
    residual = (unsigned >> 1) ^ -(unsigned & 1)
    index = np.cumsum(residual, axis=-2)
    return arrays["levels"][index], _decompress(arrays["label"], np.uint8, shape).copy()


def is_cache(folder: Path) -> bool:
    """Whether ``folder`` is a complete cache (:func:`write_marker` marked it)."""
    return (Path(folder) / CACHE_MARKER).is_file()


def read_cached(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Image and label of one cached volume ``<case>.npz``; ValueError (one sentence) when it is not one."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            return decode_volume({key: archive[key] for key in archive.files})
    except (OSError, KeyError, ValueError, lzma.LZMAError) as error:
        raise ValueError(f"Cannot read {Path(path).name} as a cached volume ({error}); rebuild the cache "
                         "with python -m Datasets.build_cache.") from None


def write_volume(path: Path, image: np.ndarray, label: np.ndarray) -> int:
    """Write one volume's cache file ``path`` (``<case>.npz``) under a temporary name, then rename; its bytes."""
    from CalibSegLib.io import atomic_output

    with atomic_output(path) as temporary, open(temporary, "wb") as handle:
        np.savez(handle, **encode_volume(image, label))
    return Path(path).stat().st_size


def write_marker(folder: Path, volumes: int, size: int, source: str) -> None:
    """Mark ``folder`` as a complete cache of ``volumes`` volumes (``size`` bytes, from the folder named
    ``source``): written last, so a cache cut short is never taken for one."""
    from CalibSegLib.io import write_json_atomic

    write_json_atomic(Path(folder) / CACHE_MARKER, {"format": CACHE_FORMAT, "volumes": volumes, "bytes": size,
                                                    "source": source})
