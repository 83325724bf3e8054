"""Assertions shared by the fault catalogue (``Testing/test_faults_*.py``).

Every fault case checks two things: the error is one sentence that names what is wrong, and
nothing was changed or left behind (files byte-identical, no temporaries, no new folders).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import re
import stat
import struct
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["assert_one_sentence", "tree_snapshot", "normal_file_mode", "NIFTI_DIM_OFFSET", "NIFTI_PIXDIM_OFFSET",
           "edit_stored_bytes", "RawMember", "write_raw_zip",
           "deflated_zeros", "bundle_parts", "write_bundle", "edited_weights", "rewrite_bundle",
           "bundle_declaring_four_gib", "BROKEN_BUNDLES", "FOUR_GIB"]

FOUR_GIB = 4 << 30


def assert_one_sentence(text: str, *patterns: str) -> None:
    """``text`` is one line, no traceback, ends like a sentence and matches every regex in ``patterns``."""
    text = text.strip()
    assert text, "the error message is empty"
    assert "\n" not in text, f"more than one line: {text!r}"
    assert "Traceback" not in text, text
    assert text.endswith((".", ".)")), f"not a sentence: {text!r}"
    for pattern in patterns:
        assert re.search(pattern, text), f"{pattern!r} not in {text!r}"


def tree_snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Everything under ``folder``: relative path → (mode, content); folders have empty content.

    Two equal snapshots mean no file changed, appeared (temporaries included) or vanished.
    """
    folder = Path(folder)
    snapshot: dict[str, tuple[int, bytes]] = {}
    for root, folders, files in os.walk(folder):
        for name in folders + files:
            path = Path(root) / name
            mode = path.lstat().st_mode
            content = path.read_bytes() if stat.S_ISREG(mode) else b""
            snapshot[str(path.relative_to(folder))] = (mode, content)
    return snapshot


def normal_file_mode() -> int:
    """The permission bits a new file gets from ``open()``: 0666 minus the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


# NIfTI-1 header fields the fault tests patch (nifti1.h): dim (8 int16) at byte 40, pixdim (8 float32) at byte 76.
NIFTI_DIM_OFFSET, NIFTI_PIXDIM_OFFSET = 40, 76


def edit_stored_bytes(path: Path, patch=None, keep: float = 1.0) -> Path:
    """Rewrite the image file at ``path``: ``patch(bytearray)`` edits its uncompressed bytes (a ``.gz`` file is
    decompressed first and compressed again), then only the first ``keep`` fraction is kept (cut short as a full
    disk or an interrupted copy leaves it)."""
    compressed = path.name.endswith(".gz")
    raw = bytearray(gzip.decompress(path.read_bytes()) if compressed else path.read_bytes())
    if patch is not None:
        patch(raw)
    stored = gzip.compress(bytes(raw)) if compressed else bytes(raw)
    path.write_bytes(stored[: int(len(stored) * keep)])
    return path


@dataclass
class RawMember:
    """A zip member written byte by byte: any declared size, compression method or flag."""

    name: str
    data: bytes
    file_size: int
    crc: int = 0
    method: int = zipfile.ZIP_STORED
    flags: int = 0


def write_raw_zip(path: Path, members: list[RawMember]) -> Path:
    """A zip whose directory says exactly what ``members`` declare (``zipfile`` cannot write lies).

    Sizes of 4 GiB and more go into a zip64 extra field, as real archivers write them.
    """
    body, directory = bytearray(), bytearray()
    for member in members:
        name = member.name.encode()
        large = member.file_size >= 0xFFFFFFFF
        extra = struct.pack("<HHQQ", 1, 16, member.file_size, len(member.data)) if large else b""
        sizes = (0xFFFFFFFF, 0xFFFFFFFF) if large else (len(member.data), member.file_size)
        common = (member.flags, member.method, 0, 0x21, member.crc, *sizes, len(name), len(extra))
        directory += struct.pack("<4s4B4H3I5H2I", b"PK\x01\x02", 45, 3, 45, 0, *common, 0, 0, 0, 0, len(body))
        directory += name + extra
        body += struct.pack("<4s5H3I2H", b"PK\x03\x04", 45, *common) + name + extra + member.data
    count = len(members)
    end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, count, count, len(directory), len(body), 0)
    path.write_bytes(bytes(body + directory + end))
    return path


@lru_cache(maxsize=1)  # 4 MB, built once per test session
def deflated_zeros(size: int) -> bytes:
    """A raw deflate stream of ``size`` zero bytes (a multiple of 64 MiB) in ~size/1000 bytes.

    One 64 MiB block is compressed after a full flush, so copies of it are independent and can
    simply be repeated: 4 GiB of zeros become a 4 MB member in half a second.
    """
    block = 64 << 20
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = compressor.compress(bytes(block)) + compressor.flush(zlib.Z_FULL_FLUSH)
    return piece * (size // block) + compressor.flush()


def bundle_parts(bundle: Path) -> tuple[dict, bytes]:
    """A bundle's parsed ``bundle.json`` and its weights bytes."""
    with zipfile.ZipFile(bundle) as archive:
        return json.loads(archive.read("bundle.json")), archive.read("weights.safetensors")


def write_bundle(out: Path, metadata: dict, weights: bytes, checksum: bool = True,
                 members: list[tuple[str, bytes]] | None = None) -> Path:
    """A bundle zip at ``out`` of ``metadata`` and ``weights``; ``checksum`` sets ``weights_sha256`` to
    match the weights (so only their content is wrong); ``members`` replaces the member list."""
    metadata = dict(metadata, weights_sha256=hashlib.sha256(weights).hexdigest()) if checksum else metadata
    if members is None:
        members = [("bundle.json", json.dumps(metadata).encode()), ("weights.safetensors", weights)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns when writing a duplicate name
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, data in members:
                archive.writestr(name, data)
    return out


def edited_weights(weights: bytes, change) -> bytes:
    """Safetensors ``weights`` after ``change(state_dict)`` edited the tensors in place."""
    import torch
    from safetensors.torch import load as load_safetensors
    from safetensors.torch import save as save_safetensors

    tensors = load_safetensors(weights)
    with torch.no_grad():
        change(tensors)
    return save_safetensors(tensors)


def rewrite_bundle(good: Path, out: Path, change_metadata=None, change_weights=None,
                   duplicate: str | None = None) -> Path:
    """A copy of the bundle ``good`` at ``out``: ``change_metadata(dict)`` edits ``bundle.json``,
    ``change_weights(state_dict)`` the tensors (checksum updated), ``duplicate`` names a member
    written twice."""
    metadata, weights = bundle_parts(good)
    if change_weights is not None:
        weights = edited_weights(weights, change_weights)
        metadata["weights_sha256"] = hashlib.sha256(weights).hexdigest()
    if change_metadata is not None:
        change_metadata(metadata)
    members = [("bundle.json", json.dumps(metadata).encode()), ("weights.safetensors", weights)]
    return write_bundle(out, metadata, weights, checksum=False,
                        members=members + [member for member in members if member[0] == duplicate])


def bundle_declaring_four_gib(good: Path, out: Path) -> Path:
    """The issue's case: ``good``'s ``bundle.json`` and a ~4 MB weights member that inflates to (and
    declares) 4 GiB of zeros. Its CRC is left 0: a loader reading the member would only find out
    after inflating all of it."""
    metadata = zipfile.ZipFile(good).read("bundle.json")
    return write_raw_zip(out, [
        RawMember("bundle.json", metadata, len(metadata), zlib.crc32(metadata)),
        RawMember("weights.safetensors", deflated_zeros(FOUR_GIB), FOUR_GIB, method=zipfile.ZIP_DEFLATED),
    ])


def _filled(value: float):
    """A ``change_weights`` that fills the last convolution's weight tensor with ``value``."""
    def change(tensors) -> None:
        tensors[[name for name in tensors if name.endswith("weight")][-1]].fill_(value)

    return change


# Bundles broken in the ways a user meets through the CLI or the Slicer module:
# name → (make(good, out) -> path, regex of the one-sentence error). "exploding weights" loads
# (finite weights) but its logits overflow, so prediction must refuse it.
BROKEN_BUNDLES = {
    "NaN weights": (
        lambda good, out: rewrite_bundle(good, out, change_weights=_filled(math.nan)),
        "holds NaN or infinite values"),
    "channels [-4, 8]": (
        lambda good, out: rewrite_bundle(good, out, lambda m: m["network_kwargs"].update(channels=[-4, 8])),
        "cannot be built from its network_kwargs"),
    "channels [4, 8e9]": (
        lambda good, out: rewrite_bundle(good, out, lambda m: m["network_kwargs"].update(channels=[4, 8e9])),
        "cannot be built from its network_kwargs"),
    "two bundle.json members": (
        lambda good, out: rewrite_bundle(good, out, duplicate="bundle.json"), "bundle.json more than once"),
    "4 GiB weights member": (bundle_declaring_four_gib, "declares 4.0 GiB"),
    "exploding weights": (
        lambda good, out: rewrite_bundle(good, out, change_weights=_filled(3e38)),
        "NaN or infinite probabilities"),
    "a window its network cannot take": (  # odd: the network halves it once
        lambda good, out: rewrite_bundle(good, out,
                                         lambda m: m["sliding_window"].update(patch_size=[33, 33])),
        r"sliding-window patch 33×33 does not fit its network 'unet' \(.*the nearest sizes it takes are 32 "
        r"and 34\)"),
}
