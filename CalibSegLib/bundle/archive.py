"""The bundle file: a zip of ``bundle.json`` and ``weights.safetensors``, written atomically and read
within fixed resource limits (see :func:`load_bundle`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np
import torch
from safetensors.torch import save as save_safetensors
from torch import nn

from CalibSegLib import BUNDLE_SUFFIX, __version__
from CalibSegLib.bundle.model import Bundle, build_declared_network, check_weights_fit
from CalibSegLib.bundle.schema import (METADATA_MEMBER, STORED_FLOAT_DTYPES, BundleError, BundleMetadata, is_int,
                                       parse_metadata)
from CalibSegLib.io import atomic_output

__all__ = ["WEIGHTS_MEMBER", "save_bundle", "load_bundle", "read_metadata"]

WEIGHTS_MEMBER = "weights.safetensors"

# Limits on what an untrusted bundle may make the loader spend; all are checked before the
# memory they bound is allocated. Shipped bundles are well under 1 MB.
_MAX_METADATA_BYTES = 1 << 20  # bundle.json: a few KB in practice
# Weights up to 2 GiB, the largest zip member without zip64 extensions (networks: model.MAX_PARAMETERS).
_MAX_WEIGHTS_BYTES = (1 << 31) - 1
_MEMBER_LIMITS = {METADATA_MEMBER: _MAX_METADATA_BYTES, WEIGHTS_MEMBER: _MAX_WEIGHTS_BYTES}
_MEMBER_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip holds
_MAX_ZIP_ENTRIES = 64  # a bundle has 2; a few more still get the "contains ..." sentence
_MAX_ZIP_DIRECTORY_BYTES = 64 << 10
_END_RECORD_SEARCH_BYTES = 22 + 0xFFFF  # the end record plus the longest zip comment
# The safetensors JSON header: a fixed allowance plus one per tensor (name, dtype, shape, offsets).
_HEADER_BASE_BYTES = 64 << 10
_HEADER_BYTES_PER_TENSOR = 1 << 10
_READ_CHUNK_BYTES = 1 << 20  # weights are hashed and checked in pieces of this size
# torch dtype → (safetensors dtype code, little-endian NumPy dtype) for every dtype a bundle may hold.
_SAFETENSORS_CODES: dict[torch.dtype, tuple[str, str]] = {
    torch.float32: ("F32", "<f4"),
    torch.float16: ("F16", "<f2"),
    torch.int64: ("I64", "<i8"),
    torch.int32: ("I32", "<i4"),
    torch.uint8: ("U8", "|u1"),
    torch.bool: ("BOOL", "|b1"),
}
# First bytes of what torch.save / pickle.dump write: a zip archive or a pickle protocol marker.
_PICKLE_SIGNATURES = (b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


def _size_text(size: int) -> str:
    """``size`` bytes in the largest binary unit that keeps it >= 1 (``4.0 GiB``)."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} bytes"


def _first_non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """Name of the first floating-point tensor holding NaN or inf, or None."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            return name
    return None


def save_bundle(
    path: str | Path,
    model_or_state_dict: nn.Module | dict[str, torch.Tensor],
    metadata: BundleMetadata,
    half: bool = False,
) -> Path:
    """Check and write a bundle atomically (temporary file, then rename); return its path.

    Args:
        path: destination, conventionally ending in ``.calibseg``.
        model_or_state_dict: the trained network or its state dict.
        metadata: written with the library version, weights dtype and SHA-256 checksum filled in.
        half: store floating-point weights as float16 (half the size; loading casts back to float32).

    Raises:
        BundleError: the metadata is invalid, the weights do not fit the declared network or hold
            NaN/inf (also after the float16 cast); nothing is written then.
    """
    path = Path(path)
    state = (
        model_or_state_dict.state_dict()
        if isinstance(model_or_state_dict, nn.Module)
        else model_or_state_dict
    )
    stored_dtype = torch.float16 if half else torch.float32
    # clone(): safetensors refuses tensors sharing storage (tied weights, views).
    tensors = {
        name: (
            tensor.detach().to("cpu", stored_dtype) if tensor.is_floating_point() else tensor.detach().cpu()
        )
        .contiguous()
        .clone()
        for name, tensor in state.items()
    }
    non_finite = _first_non_finite(tensors)
    if non_finite is not None:
        raise BundleError(
            f"The weight {non_finite} holds NaN or infinite values{' in float16' if half else ''}, "
            "so the model cannot be saved; training diverged or the weights are too large."
        )
    weights = save_safetensors(tensors)
    metadata = dataclasses.replace(
        metadata,
        schema_version=metadata.minimal_schema_version,
        library_version=__version__,
        weights_dtype=str(stored_dtype).removeprefix("torch."),
        weights_sha256=hashlib.sha256(weights).hexdigest(),
    )
    metadata.validate()
    declared = build_declared_network(metadata, "meta").state_dict()
    check_weights_fit(
        metadata.network,
        {name: tuple(tensor.shape) for name, tensor in declared.items()},
        {name: tuple(tensor.shape) for name, tensor in tensors.items()},
    )
    text = metadata.to_json()
    with atomic_output(path) as temporary:
        with zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(_member_info(METADATA_MEMBER), text)
            archive.writestr(_member_info(WEIGHTS_MEMBER), weights)
    return path


def _member_info(name: str) -> zipfile.ZipInfo:
    """A zip member stamped with a fixed date: the same weights and metadata give the same bytes, so a record keyed
    on a bundle file's SHA-256 (the input check's shift table) still belongs to the file after a rewrite that
    changed nothing."""
    info = zipfile.ZipInfo(name, date_time=_MEMBER_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16  # read-write for its owner, readable by all, when unzipped
    return info


def _check_container(path: Path) -> None:
    """Refuse a file that is no bundle, judged from its zip end record alone.

    ``zipfile`` reads the whole central directory into memory, so a directory listing millions of
    members must be refused before :class:`zipfile.ZipFile` opens the file.
    """
    if not path.is_file():
        raise BundleError(f"No model bundle at {path}; check the path (bundles end in {BUNDLE_SUFFIX}).")
    if not zipfile.is_zipfile(path):
        raise BundleError(
            f"{path.name} is not a CalibSeg bundle (not a zip file); choose a {BUNDLE_SUFFIX} file."
        )
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(handle.tell() - _END_RECORD_SEARCH_BYTES, 0))
        tail = handle.read()
    at = tail.rfind(b"PK\x05\x06")  # end of central directory record: entries at +10, directory size at +12
    if at >= 0 and len(tail) - at >= 22:
        entries, directory_size = struct.unpack_from("<HI", tail, at + 10)
        if entries > _MAX_ZIP_ENTRIES or directory_size > _MAX_ZIP_DIRECTORY_BYTES:
            raise BundleError(
                f"{path.name}'s zip directory lists {entries} members in {_size_text(directory_size)}; "
                f"a bundle holds only {METADATA_MEMBER} and {WEIGHTS_MEMBER}, so it is refused unread."
            )


def _read_members(name: str, archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """``{member name: ZipInfo}`` of a bundle, checked from the zip directory before any byte is read:
    exactly one ``bundle.json`` and one weights member, nothing else, unencrypted, within size limits."""
    names = [info.filename for info in archive.infolist()]
    duplicates = sorted({member for member in names if names.count(member) > 1})
    if duplicates:
        raise BundleError(
            f"{name} holds {', '.join(duplicates)} more than once, so which one counts is ambiguous; "
            "re-export the bundle."
        )
    if METADATA_MEMBER not in names:
        raise BundleError(f"{name} has no {METADATA_MEMBER}, so it is not a CalibSeg bundle.")
    others = [member for member in names if member not in _MEMBER_LIMITS]
    if others:
        raise BundleError(
            f"{name} contains {', '.join(others)}; bundles may hold only {METADATA_MEMBER} and "
            f"{WEIGHTS_MEMBER}, and pickled objects are refused because loading them can run code."
        )
    if WEIGHTS_MEMBER not in names:
        raise BundleError(f"{name} has no {WEIGHTS_MEMBER}; re-export the bundle.")
    members = {info.filename: info for info in archive.infolist()}
    for member, info in members.items():
        if info.flag_bits & 0x1:
            raise BundleError(f"{name}'s {member} is encrypted; bundles never are, re-export the bundle.")
        if info.file_size > _MEMBER_LIMITS[member]:
            raise BundleError(
                f"{name}'s {member} declares {_size_text(info.file_size)}, more than the "
                f"{_size_text(_MEMBER_LIMITS[member])} a bundle's {member} may hold, so it is refused unread."
            )
    return members


@dataclass(frozen=True)
class _StoredTensor:
    """One tensor of the weights member as the declared network needs it: name, shape and stored dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def code(self) -> str:
        return _SAFETENSORS_CODES[self.dtype][0]

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(_SAFETENSORS_CODES[self.dtype][1])

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.numpy_dtype.itemsize


def _declared_tensors(metadata: BundleMetadata) -> dict[str, _StoredTensor]:
    """What the weights member must hold for the declared network (built on the meta device)."""
    stored = STORED_FLOAT_DTYPES[metadata.weights_dtype]
    tensors = {}
    for name, tensor in build_declared_network(metadata, "meta").state_dict().items():
        dtype = stored if tensor.is_floating_point() else tensor.dtype
        if dtype not in _SAFETENSORS_CODES:
            raise BundleError(f"The bundle's network has a {dtype} tensor {name}, which bundles cannot hold.")
        tensors[name] = _StoredTensor(name, tuple(tensor.shape), dtype)
    return tensors


def _header_limit(tensors: dict[str, _StoredTensor]) -> int:
    """Largest safetensors JSON header accepted for these tensors (names, dtypes, shapes, offsets)."""
    return _HEADER_BASE_BYTES + _HEADER_BYTES_PER_TENSOR * len(tensors)


def _parse_weights(name: str, header: bytes, metadata: BundleMetadata,
                   tensors: dict[str, _StoredTensor]) -> list[_StoredTensor]:
    """Check a safetensors JSON header against the declared network; returns its tensors in file order.

    Every name, shape, dtype and byte range must be exactly what the network needs, so the data
    that follows can be read tensor by tensor into buffers of known size.
    """
    try:
        entries = json.loads(header)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise BundleError(
            f"{name}'s weights header is not valid JSON ({error}); re-export the bundle."
        ) from None
    if not isinstance(entries, dict):
        raise BundleError(f"{name}'s weights header is not a JSON object; re-export the bundle.")
    entries.pop("__metadata__", None)
    shapes = {}
    for key, entry in entries.items():
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or not all(is_int(size) and size >= 0 for size in shape):
            raise BundleError(f"{name}'s weight {key} has no valid shape; re-export the bundle.")
        shapes[key] = tuple(shape)
    check_weights_fit(metadata.network, {key: tensor.shape for key, tensor in tensors.items()}, shapes)
    ranges = []
    for key, entry in entries.items():
        expected = tensors[key]
        if entry.get("dtype") != expected.code:
            raise BundleError(
                f"{name}'s weight {key} is stored as {entry.get('dtype')!r}, but the bundle declares "
                f"{expected.code} ({metadata.weights_dtype} weights); re-export the bundle."
            )
        offsets = entry.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(value) for value in offsets)):
            raise BundleError(f"{name}'s weight {key} has no valid data_offsets; re-export the bundle.")
        ranges.append((offsets[0], offsets[1], expected))
    ranges.sort(key=lambda item: item[:2])
    position = 0
    for begin, end, expected in ranges:
        if (begin, end) != (position, position + expected.nbytes):
            raise BundleError(
                f"{name}'s weight {expected.name} lies at bytes [{begin}, {end}], not where its shape "
                f"puts it ([{position}, {position + expected.nbytes}]); the file is corrupt, re-export it."
            )
        position = end
    return [expected for _, _, expected in ranges]


def _read_exactly(stream: BinaryIO, size: int, hasher: Any, name: str) -> bytes:
    """``size`` bytes from ``stream`` (fed to ``hasher``), or a :class:`BundleError` when it ends early."""
    data = stream.read(size)
    if len(data) != size:
        raise BundleError(f"{name}'s weights end early; the file is truncated, re-export or re-download it.")
    hasher.update(data)
    return data


def _stream_weights(
    name: str,
    archive: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    metadata: BundleMetadata,
    tensors: dict[str, _StoredTensor],
    keep: bool,
) -> tuple[str, str | None, dict[str, torch.Tensor]]:
    """Read the weights member front to back in bounded pieces, checking it as it goes.

    The size in the zip directory, the header and every tensor's byte range are checked against
    the declared network before the bytes they describe are read; floating-point values are
    checked for NaN/inf piece by piece.

    Returns:
        The SHA-256 of the member, the name of the first tensor holding NaN/inf (or None), and
        with ``keep`` the float32 state dict (else an empty dict: memory stays at one piece).
    """
    data_bytes = sum(tensor.nbytes for tensor in tensors.values())
    hasher = hashlib.sha256()
    non_finite: str | None = None
    state_dict: dict[str, torch.Tensor] = {}
    with archive.open(info) as stream:
        # Safetensors: a little-endian u64 header length, then that many bytes of JSON ("{...}").
        opening = stream.read(9)
        header_bytes = int.from_bytes(opening[:8], "little")
        if len(opening) < 9 or opening[8:9] != b"{" or header_bytes < 2:
            if opening.startswith(_PICKLE_SIGNATURES):
                raise BundleError(
                    f"{name}'s weights are a pickle (torch.save) file, which is refused because loading "
                    f"it can run code; re-export the bundle with save_bundle."
                )
            raise BundleError(
                f"{name}'s weights are not a safetensors file; re-export the bundle with save_bundle."
            )
        if info.file_size > 8 + _header_limit(tensors) + data_bytes or header_bytes > _header_limit(tensors):
            raise BundleError(
                f"The bundle's weights do not fit the declared network {metadata.network!r} "
                f"({_size_text(info.file_size)} stored where it needs {_size_text(data_bytes)} "
                "plus a header); re-export the bundle."
            )
        hasher.update(opening)
        header = opening[8:] + _read_exactly(stream, header_bytes - 1, hasher, name)
        ordered = _parse_weights(name, header, metadata, tensors)
        if info.file_size != 8 + header_bytes + data_bytes:
            raise BundleError(
                f"{name}'s weights member is {info.file_size} bytes but its header describes "
                f"{8 + header_bytes + data_bytes}; the file is corrupt, re-export it."
            )
        for tensor in ordered:
            buffer = bytearray(tensor.nbytes) if keep else None
            for start in range(0, tensor.nbytes, _READ_CHUNK_BYTES):
                piece = _read_exactly(stream, min(tensor.nbytes - start, _READ_CHUNK_BYTES), hasher, name)
                values = np.frombuffer(piece, dtype=tensor.numpy_dtype)
                if non_finite is None and values.dtype.kind == "f" and not np.isfinite(values).all():
                    non_finite = tensor.name
                if buffer is not None:
                    buffer[start : start + len(piece)] = piece
            if buffer is not None:
                array = np.frombuffer(buffer, dtype=tensor.numpy_dtype).reshape(tensor.shape)
                loaded = torch.from_numpy(array.astype(array.dtype.newbyteorder("="), copy=False))
                state_dict[tensor.name] = loaded.float() if loaded.is_floating_point() else loaded
    return hasher.hexdigest(), non_finite, state_dict


def read_metadata(path: str | Path) -> BundleMetadata:
    """A bundle's checked ``bundle.json`` without its weights: what a process that only shows or prepares a model
    (the Slicer module, a report) needs, at the cost of the zip directory and a few kB.

    The container and members are checked as :func:`load_bundle` checks them and the declared network is sized on
    the meta device, but the weights are neither read nor checked: :func:`load_bundle` does that where the network
    runs.

    Raises:
        BundleError: (one sentence) as :func:`load_bundle` for everything but the weights.
    """
    path = Path(path)
    with _opened(path) as archive:
        metadata = _read_metadata(path, archive)[1]
    _declared_tensors(metadata)  # an unknown, unbuildable or oversized network is refused here too
    return metadata


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[zipfile.ZipFile]:
    """The bundle's zip, checked as a container first; a corrupt zip met while reading it is one BundleError."""
    _check_container(path)
    try:
        with zipfile.ZipFile(path) as archive:
            yield archive
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, OSError, EOFError,
            NotImplementedError) as error:  # NotImplementedError: a compression method zipfile lacks
        raise BundleError(f"{path.name} is corrupt or truncated ({error}); re-export or re-download it.") from None


def _read_metadata(path: Path, archive: zipfile.ZipFile) -> tuple[dict[str, zipfile.ZipInfo], BundleMetadata]:
    """The checked members of an open bundle and its parsed, validated ``bundle.json``."""
    members = _read_members(path.name, archive)
    with archive.open(members[METADATA_MEMBER]) as stream:
        return members, parse_metadata(path.name, stream.read(_MAX_METADATA_BYTES + 1))


def load_bundle(path: str | Path) -> Bundle:
    """Read and check a bundle; weights come back as float32 whatever dtype they were stored in.

    Resources are bounded before they are spent: member sizes come from the zip directory
    (``bundle.json`` at most :data:`_MAX_METADATA_BYTES`, weights at most
    :data:`_MAX_WEIGHTS_BYTES` and no more than the declared network needs plus its header),
    the network is sized on torch's meta device (at most :data:`_MAX_PARAMETERS` parameters),
    and the weights are hashed and checked for NaN/inf in a first streamed pass that keeps
    nothing; only a bundle that passed is read into memory, in a second pass.

    Raises:
        BundleError: (one sentence) the file is missing, not a zip, lacks, repeats or has extra
            members (pickles are refused), declares members larger than allowed, has invalid or
            incomplete ``bundle.json``, a newer schema version, an unknown or oversized network or
            one its kwargs cannot build, weights that do not fit it, a checksum mismatch, or
            weights holding NaN/inf.
    """
    path = Path(path)
    with _opened(path) as archive:
        members, metadata = _read_metadata(path, archive)
        weights, tensors = members[WEIGHTS_MEMBER], _declared_tensors(metadata)
        # First pass keeps nothing, so a bad bundle is refused with one piece in memory.
        digest, non_finite, _ = _stream_weights(
            path.name, archive, weights, metadata, tensors, keep=False
        )
        if digest != metadata.weights_sha256:
            raise BundleError(
                f"{path.name}'s weights do not match their checksum; the file is corrupt, re-export it."
            )
        if non_finite is not None:
            raise BundleError(
                f"{path.name}'s weight {non_finite} holds NaN or infinite values, so the model would "
                "give no valid output; re-train or re-export it."
            )
        digest, _, state_dict = _stream_weights(
            path.name, archive, weights, metadata, tensors, keep=True
        )
        if digest != metadata.weights_sha256:
            raise BundleError(f"{path.name} changed while it was being read; load it again.")
    return Bundle(metadata=metadata, state_dict=state_dict, path=path)
