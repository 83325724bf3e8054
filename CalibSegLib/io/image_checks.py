"""What an image file's header claims, checked against its data before ITK is trusted with it.

ITK's bundled nifticlib (``nifti_read_buffer``) silently turns every non-finite float voxel into 0 while
reading, and non-finite ``scl_slope``/``scl_inter`` into "no scaling", so the array SimpleITK returns looks
clean; :func:`nifti_problem` therefore checks a NIfTI file's stored values itself.

A header that disagrees with its data is refused before any voxel is allocated: nifticlib reads an
uncompressed ``.nii`` cut short with zeros in the missing part, a dimension of 0 as 1 and a spacing of 0 or
NaN as 1 mm (so volumes in mL would silently be wrong); and a header may claim far more voxels than its file
holds (memory is allocated from the header). So the claimed voxel bytes must fit in the file (exactly when
uncompressed, within deflate's largest ratio when compressed) and in memory, and every spacing must be positive,
finite and plausible (:func:`header_problem` for any format, 3D volumes and 4D cines alike).

What was written is checked too (:func:`written_problem`): ITK's NIfTI writer only prints a warning when the
disk fills, leaving a truncated file behind.
"""

from __future__ import annotations

import gzip
import math
import os
import re
import struct
import zlib
from pathlib import Path
from typing import IO, Any

import numpy as np
import SimpleITK as sitk

__all__ = ["PLAUSIBLE_SPACING_MM", "MAX_VOXEL_BYTES", "header_problem", "nifti_problem", "written_problem",
           "itk_reason"]

_CHUNK_BYTES = 1 << 24  # 16 MiB: stored NIfTI voxels are checked in pieces of this size, never whole
# Deflate (gzip, zlib) expands at most about 1032-fold (zlib's "technical details"): a compressed file
# whose header claims more voxel bytes than this times its size cannot hold them.
_MAX_DEFLATE_RATIO = 1032
_GZIP_SIGNATURE = b"\x1f\x8b"
# The voxel sizes of any medical image, from a micro-CT's micrometre to a 10 cm slab; a header beyond them has a
# unit or a field wrong (a spacing of 1e-20 mm makes every volume vanish). DICOM's Pixel Spacing is held to it too.
PLAUSIBLE_SPACING_MM = (1e-3, 100.0)
# The most voxel bytes one file may declare: a volume is converted to float32 and predicted after reading, so a
# header claiming more would exhaust the memory of the workstations CalibSeg runs on before any check could speak.
MAX_VOXEL_BYTES = 4 << 30
# NIfTI header fields read here: (byte offset, struct format) for NIfTI-1 (348-byte header, also
# Analyze 7.5) and NIfTI-2 (540 bytes), from nifti1.h / nifti2.h.
_NIFTI_FIELDS: dict[int, dict[str, tuple[int, str]]] = {
    348: {"dim": (40, "8h"), "datatype": (70, "h"), "bitpix": (72, "h"), "pixdim": (76, "8f"),
          "vox_offset": (108, "f"), "scaling": (112, "2f"), "magic": (344, "4s")},
    540: {"magic": (4, "8s"), "datatype": (12, "h"), "bitpix": (14, "h"), "dim": (16, "8q"),
          "pixdim": (104, "8d"), "vox_offset": (168, "q"), "scaling": (176, "2d")},
}
# Detached headers name their data file on a line like these (MetaImage .mhd, NRRD .nhdr).
_DATA_FILE_KEYS = {".mhd": re.compile(rb"^ElementDataFile\s*=\s*(.+?)\s*$", re.MULTILINE),
                   ".nhdr": re.compile(rb"^data ?file:\s*(.+?)\s*$", re.MULTILINE)}
_NIFTI_SINGLE_FILE_MAGIC = (b"n+1\0", b"n+2\0")
_NIFTI_PAIR_MAGIC = (b"ni1\0", b"ni2\0")  # .hdr + .img; without any magic the header is plain Analyze 7.5
_NIFTI_FLOAT_TYPES = {16: "f4", 64: "f8"}  # DT_FLOAT32, DT_FLOAT64: the codes whose voxels can be NaN or inf


def header_problem(path: Path, reader: sitk.ImageFileReader) -> str | None:
    """What any format's header (read into ``reader``) claims that cannot be true, or None.

    The spatial spacing (the first three axes; a cine's fourth is time) must be positive, finite and within
    :data:`PLAUSIBLE_SPACING_MM`, and the voxel bytes the header declares must fit in the file that holds them
    (at most :data:`_MAX_DEFLATE_RATIO` times its size, since even compressed data cannot expand more; exact
    sizes are checked for NIfTI by :func:`nifti_problem`) and within :data:`MAX_VOXEL_BYTES`.
    """
    spacing = reader.GetSpacing()[:3]  # a cine's fourth axis is time, not measured in mm
    spacing_text = " × ".join(f"{value:g}" for value in reversed(spacing))
    if not all(math.isfinite(value) and value > 0 for value in spacing):
        return (f"declares a voxel spacing of {spacing_text} mm, which is not positive and finite (volumes in mL "
                "are measured with it)")
    lowest, highest = PLAUSIBLE_SPACING_MM
    if not all(lowest <= value <= highest for value in spacing):
        return (f"declares a voxel spacing of {spacing_text} mm, outside the {lowest:g} to {highest:g} mm of any "
                "medical image (volumes in mL are measured with it)")
    voxel_size = sitk.Image([1] * 3, reader.GetPixelID()).GetSizeOfPixelComponent()
    voxel_bytes = math.prod(reader.GetSize()) * voxel_size
    sizes_text = " × ".join(map(str, reversed(reader.GetSize())))
    data_file = _data_file(path)
    held = data_file.stat().st_size if data_file is not None else None
    if held is not None and voxel_bytes > _MAX_DEFLATE_RATIO * held:
        return (f"declares {sizes_text} voxels ({_bytes_text(voxel_bytes)}), more than its {_bytes_text(held)} of "
                "data can hold even compressed")
    if voxel_bytes > MAX_VOXEL_BYTES:
        return (f"declares {sizes_text} voxels ({_bytes_text(voxel_bytes)}), more than the "
                f"{_bytes_text(MAX_VOXEL_BYTES)} CalibSeg reads into memory at once; crop or resample it")
    return None


def _data_file(path: Path) -> Path | None:
    """The file holding ``path``'s voxels: ``path`` itself, the one a detached header (.mhd, .nhdr) names
    or the ``.img`` beside a NIfTI/Analyze ``.hdr``; None where it names none or several (a list or
    pattern of files)."""
    header = _nifti_header(path)
    if header is not None:
        return _nifti_data_file(path, header)
    key = next((pattern for suffix, pattern in _DATA_FILE_KEYS.items() if path.name.lower().endswith(suffix)),
               None)
    if key is None:
        return path
    with open(path, "rb") as handle:
        found = key.search(handle.read(1 << 16))
    name = found.group(1) if found else b"LIST"
    if name == b"LOCAL":
        return path
    if name == b"LIST" or b"%" in name:
        return None
    named = path.parent / name.decode(errors="replace")
    return named if named.is_file() else None


def _bytes_text(count: int) -> str:
    """``count`` bytes for a sentence: ``2.5 GiB``, ``3.1 MiB``, ``512 bytes``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"


def itk_reason(error: RuntimeError, path: Path) -> str:
    """The cause in an ITK error: its last line, without the ``sitk::ERROR:`` prefix and the quoted path."""
    reason = (str(error).strip().splitlines() or ["unknown error"])[-1]
    return reason.replace("sitk::ERROR:", "").replace(f' for "{path}"', "").strip()


def _is_gzipped(path: Path) -> bool:
    """True when ``path`` starts with the gzip signature."""
    with open(path, "rb") as handle:
        return handle.read(2) == _GZIP_SIGNATURE


def _gzip_recorded_size(path: Path) -> int:
    """The uncompressed size modulo 2³² that a gzip file's trailer records (ISIZE, RFC 1952), for its
    last member; any number for a file cut short (-1 when it has no 4 bytes to read)."""
    with open(path, "rb") as handle:
        handle.seek(max(os.fstat(handle.fileno()).st_size - 4, 0))
        trailer = handle.read(4)
    return struct.unpack("<I", trailer)[0] if len(trailer) == 4 else -1


def _open_maybe_gzipped(path: Path) -> IO[bytes]:
    """``path`` opened for binary reading, decompressed when it starts with the gzip signature."""
    return gzip.open(path, "rb") if _is_gzipped(path) else open(path, "rb")


def _nifti_header(path: Path) -> dict[str, Any] | None:
    """The NIfTI-1/-2 header fields of :data:`_NIFTI_FIELDS` plus ``endian``, or None for other formats."""
    try:
        with _open_maybe_gzipped(path) as handle:
            head = handle.read(540)
    except (OSError, EOFError, zlib.error):
        return None
    if len(head) < 4:
        return None
    for endian in "<>":
        size = struct.unpack(f"{endian}i", head[:4])[0]
        if size in _NIFTI_FIELDS and len(head) >= size:
            header: dict[str, Any] = {"endian": endian}
            for name, (offset, form) in _NIFTI_FIELDS[size].items():
                values = struct.unpack_from(endian + form, head, offset)
                header[name] = values if len(values) > 1 else values[0]
            return header
    return None


def _nifti_data_file(path: Path, header: dict[str, Any]) -> Path | None:
    """Where the voxels are: ``path`` itself for ``.nii(.gz)``, else the ``.img(.gz)`` beside the ``.hdr``."""
    if header["magic"].startswith(_NIFTI_SINGLE_FILE_MAGIC):
        return path
    stem = path.name.removesuffix(".gz").removesuffix(".hdr")
    return next((path.with_name(stem + suffix) for suffix in (".img", ".img.gz")
                 if path.with_name(stem + suffix).is_file()), None)


def nifti_problem(path: Path) -> str | None:
    """What nifticlib would hide while reading a NIfTI (or Analyze) file, or None.

    The header's dimensions must all be at least 1 and its spacing (``pixdim``) positive and
    finite; the data file must hold every voxel the header declares (an uncompressed file by its
    size, a compressed one by streaming it); stored float voxels and the scaling must be finite.
    Voxels are streamed in :data:`_CHUNK_BYTES` pieces, so no second copy of the volume is made.
    None for files that are not NIfTI.
    """
    header = _nifti_header(path)
    if header is None:
        return None
    is_nifti = header["magic"].startswith(_NIFTI_SINGLE_FILE_MAGIC + _NIFTI_PAIR_MAGIC)
    if is_nifti and not all(math.isfinite(value) for value in header["scaling"]):
        return "has a NaN or infinite intensity scaling (scl_slope/scl_inter) in its NIfTI header"
    rank = header["dim"][0]
    if not 1 <= rank <= 7:
        return None  # not a header ITK reads either: its own error says so
    sizes = [int(size) for size in header["dim"][1 : rank + 1]]
    if min(sizes) < 1:
        return (f"declares {' × '.join(map(str, reversed(sizes)))} voxels in its NIfTI header (an axis "
                "without voxels)")
    spacing = header["pixdim"][1 : min(rank, 3) + 1]
    if not all(math.isfinite(value) and value > 0 for value in spacing):
        spacing_text = " × ".join(f"{value:g}" for value in reversed(spacing))
        return (f"declares a voxel spacing (pixdim) of {spacing_text} mm in its NIfTI header, which is not "
                "positive and finite (volumes in mL are measured with it)")
    data_file = _nifti_data_file(path, header)
    if data_file is None:
        return None
    voxel_bytes = math.prod(sizes) * max(int(header["bitpix"]), 0) // 8
    offset = max(int(header["vox_offset"]), 0)
    held = data_file.stat().st_size
    gzipped = _is_gzipped(data_file)
    if not gzipped and held - offset < voxel_bytes:
        return (f"is cut short: its NIfTI header declares {_bytes_text(voxel_bytes)} of voxels, "
                f"the file holds {_bytes_text(max(held - offset, 0))}")
    if gzipped and voxel_bytes > _MAX_DEFLATE_RATIO * held:
        return (f"declares {' × '.join(map(str, reversed(sizes)))} voxels ({_bytes_text(voxel_bytes)}) "
                f"in its NIfTI header, more than its {_bytes_text(held)} of compressed data can hold")
    code = _NIFTI_FLOAT_TYPES.get(header["datatype"])
    # Integers cannot hold NaN; their size is checked above, or (gzipped) by the size the gzip trailer
    # records (streamed only when it differs: a stream of several gzip members records its last one's).
    if code is None and (not gzipped or _gzip_recorded_size(data_file) == (offset + voxel_bytes) % (1 << 32)):
        return None
    float_dtype = np.dtype(header["endian"] + code) if code else None
    return _stored_voxel_problem(data_file, offset, voxel_bytes, float_dtype)


def _stored_voxel_problem(data_file: Path, offset: int, voxel_bytes: int, float_dtype: np.dtype | None
                          ) -> str | None:
    """Stream ``voxel_bytes`` of voxels from ``offset`` of ``data_file`` (decompressed): a sentence
    when it ends early or, for a ``float_dtype``, holds a NaN or infinite value; else None."""
    remaining = voxel_bytes
    try:
        with _open_maybe_gzipped(data_file) as handle:
            handle.seek(offset)
            while remaining > 0:
                wanted = min(remaining, _CHUNK_BYTES)
                chunk = handle.read(wanted)
                if float_dtype is not None:
                    usable = len(chunk) - len(chunk) % float_dtype.itemsize
                    if not np.isfinite(np.frombuffer(chunk[:usable], dtype=float_dtype)).all():
                        return ("stores NaN or infinite voxel values (the NIfTI reader would silently make "
                                "them 0)")
                if len(chunk) < wanted:
                    return (f"is cut short: its NIfTI header declares {_bytes_text(voxel_bytes)} of voxels, "
                            f"the file holds {_bytes_text(voxel_bytes - remaining + len(chunk))}")
                remaining -= len(chunk)
    except EOFError:  # a compressed stream cut short
        return (f"is cut short: its NIfTI header declares {_bytes_text(voxel_bytes)} of voxels, the file "
                "holds fewer")
    except (OSError, zlib.error) as error:
        return f"cannot be read back to check its voxel values ({error})"
    return None


def written_problem(path: Path, image: sitk.Image) -> str | None:
    """Why the file ITK just wrote at ``path`` does not hold ``image`` whole, or None.

    Its header is read back (size and pixel type must be ``image``'s); a NIfTI file must then hold
    every voxel byte (an uncompressed one by its size, a gzipped one by the uncompressed size its
    gzip trailer records, modulo 2³²), and any other format is read back whole, its reader
    failing on a short file.
    """
    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    reader.ReadImageInformation()
    if (reader.GetSize(), reader.GetPixelID()) != (image.GetSize(), image.GetPixelID()):
        return "(the header written does not describe the image: the file is incomplete)"
    header = _nifti_header(path)
    if header is None:
        reader.Execute()
        return None
    expected = max(int(header["vox_offset"]), 0) + image.GetNumberOfPixels() * image.GetSizeOfPixelComponent()
    if _is_gzipped(path):
        complete = _gzip_recorded_size(path) == expected % (1 << 32)
    else:
        complete = path.stat().st_size >= expected
    return None if complete else f"(only part of its {_bytes_text(expected)} reached the disk)"
