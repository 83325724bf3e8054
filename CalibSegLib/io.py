"""Image IO with geometry through SimpleITK (NIfTI, NRRD, MHA), and atomic file writes.

Arrays are ``(z, y, x)``; :class:`ImageGeometry` keeps spacing in the same ``(z, y, x)``
order (mm) and origin/direction in SimpleITK's physical ``(x, y, z)`` LPS convention, so an
output written with the input's geometry lands on exactly the input's grid.

Every write goes to a temporary file beside the destination and is renamed over it, so a
crash or an error never leaves a half-written file under the final name; :class:`OutputSet`
does the same for several files that belong together (all of them are replaced, or none).
New files get the mode any program would give them (``0666 & ~umask``), not ``mkstemp``'s
``0600``, so colleagues sharing a workstation can read outputs, bundles and checkpoints.

Reading refuses NaN and infinite voxels whatever the format. NIfTI needs care: ITK's bundled
nifticlib (``nifti_read_buffer``) silently turns every non-finite float voxel into 0 while
reading, and non-finite ``scl_slope``/``scl_inter`` into "no scaling", so the array SimpleITK
returns looks clean; :func:`read_image` therefore checks a NIfTI file's stored values itself.

Reading also refuses a header that disagrees with its data before any voxel is allocated: nifticlib
reads an uncompressed ``.nii`` cut short with zeros in the missing part, a dimension of 0 as 1 and
a spacing of 0 or NaN as 1 mm (so volumes in mL would silently be wrong); and a header may claim far
more voxels than its file holds (memory is allocated from the header). So the claimed voxel bytes
must fit in the file (exactly when uncompressed, within deflate's largest ratio when compressed)
and every spacing must be positive and finite.

Writing checks what was written before the file may replace anything: ITK's NIfTI writer only
prints a warning when the disk fills, leaving a truncated file behind, so :func:`write_image`
re-reads the written header and checks the file holds all the voxels it declares.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import secrets
import shutil
import struct
import zlib
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np
import SimpleITK as sitk

__all__ = [
    "IMAGE_SUFFIXES",
    "WRITE_SUFFIXES",
    "ImageGeometry",
    "read_image",
    "case_and_channel",
    "group_channels",
    "read_channels",
    "write_image",
    "image_from_array",
    "image_stem",
    "check_output_folder",
    "check_output_file",
    "OutputSet",
    "atomic_output",
    "write_json_atomic",
    "os_error_sentence",
]

IMAGE_SUFFIXES: tuple[str, ...] = (".nii.gz", ".nii", ".nrrd", ".nhdr", ".mha", ".mhd")
# Single-file formats only: a detached header (.mhd, .nhdr) names its data file, which a rename would break.
# Training data folders hold image/label pairs in these formats too (Datasets/cases.py).
WRITE_SUFFIXES: tuple[str, ...] = (".nii.gz", ".nii", ".nrrd", ".mha")

# SimpleITK has no bool or float16 pixel types; these are written as the nearest type it has.
_WRITABLE_DTYPES = {np.dtype(bool): np.uint8, np.dtype(np.float16): np.float32}

_CHUNK_BYTES = 1 << 24  # 16 MiB: stored NIfTI voxels are checked in pieces of this size, never whole
# Deflate (gzip, zlib) expands at most about 1032-fold (zlib's "technical details"): a compressed file
# whose header claims more voxel bytes than this times its size cannot hold them.
_MAX_DEFLATE_RATIO = 1032
_GZIP_SIGNATURE = b"\x1f\x8b"
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


@dataclass(frozen=True)
class ImageGeometry:
    """Voxel grid of a 3D image.

    ``spacing``: ``(z, y, x)`` mm, the order of the array axes; ``origin``: ``(x, y, z)`` mm;
    ``direction``: row-major 3×3 direction cosines as SimpleITK gives them (9 numbers).
    """

    spacing: tuple[float, float, float]
    origin: tuple[float, float, float] = (0.0, 0.0, 0.0)
    direction: tuple[float, ...] = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)

    @classmethod
    def from_sitk(cls, image: sitk.Image) -> "ImageGeometry":
        """Geometry of a 3D SimpleITK image."""
        return cls(tuple(reversed(image.GetSpacing())), tuple(image.GetOrigin()), tuple(image.GetDirection()))

    def apply(self, image: sitk.Image) -> sitk.Image:
        """Place ``image`` on this grid (in place) and return it."""
        image.SetSpacing(tuple(float(value) for value in reversed(self.spacing)))
        image.SetOrigin(tuple(float(value) for value in self.origin))
        image.SetDirection(tuple(float(value) for value in self.direction))
        return image

    def matches(self, other: "ImageGeometry", tolerance: float = 1e-4) -> bool:
        """True when both grids have the same spacing, origin and direction (within ``tolerance`` mm)."""
        return all(
            np.allclose(mine, theirs, atol=tolerance, rtol=0.0)
            for mine, theirs in (
                (self.spacing, other.spacing),
                (self.origin, other.origin),
                (self.direction, other.direction),
            )
        )


def read_image(path: str | Path) -> tuple[np.ndarray, ImageGeometry]:
    """Read a scalar 3D image.

    Returns:
        The ``(z, y, x)`` voxel array and its :class:`ImageGeometry`.

    Raises:
        ValueError: the file is missing, unreadable, not a single-component 3D image, or stores
            NaN/infinite voxels (also where the format's reader would have hidden them).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"No image file at {path}; check the path.")
    # The NIfTI check reads the stored header and voxels, which nifticlib changes while reading
    # (0 → 1, NaN → 0, ...), before ITK sees them (and prints its own warnings about them); the
    # header check bounds what any format's header may claim.
    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    try:
        problem = _nifti_problem(path)
        if not problem:
            reader.ReadImageInformation()  # the header only: nothing is allocated before it is checked
            if reader.GetDimension() != 3:
                raise ValueError(f"{path.name} is a {reader.GetDimension()}D image; CalibSeg needs a 3D volume.")
            if reader.GetNumberOfComponents() != 1:
                raise ValueError(
                    f"{path.name} has {reader.GetNumberOfComponents()} components per voxel; give a scalar volume."
                )
            problem = _header_problem(path, reader)
        if problem:
            raise ValueError(f"{path.name} {problem}; fix or re-export the file before segmenting.")
        image = reader.Execute()
    except (RuntimeError, OSError) as error:  # OSError: a data file the checks could not open
        reason = os_error_sentence(error).rstrip(".") if isinstance(error, OSError) else _itk_reason(error, path)
        raise ValueError(
            f"Cannot read {path.name} as an image ({reason}); give a NIfTI, NRRD or MHA file."
        ) from None
    array = sitk.GetArrayFromImage(image)
    # Catches NaN/inf in NRRD/MHA and NIfTI scaling that overflows float32.
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ValueError(
            f"{path.name} holds NaN or infinite voxel values; fix the file (or mask those voxels) before segmenting."
        )
    return array, ImageGeometry.from_sitk(image)


def _header_problem(path: Path, reader: sitk.ImageFileReader) -> str | None:
    """What any format's header (read into ``reader``) claims that cannot be true, or None.

    The spacing must be positive and finite, and the voxel bytes the header declares must fit in
    the file that holds them: at most :data:`_MAX_DEFLATE_RATIO` times its size, since even
    compressed data cannot expand more (exact sizes are checked for NIfTI by :func:`_nifti_problem`).
    """
    spacing = reader.GetSpacing()
    if not all(math.isfinite(value) and value > 0 for value in spacing):
        return (f"declares a voxel spacing of {' × '.join(f'{value:g}' for value in reversed(spacing))} mm, "
                "which is not positive and finite (volumes in mL are measured with it)")
    data_file = _data_file(path)
    if data_file is None:
        return None
    voxel_bytes = math.prod(reader.GetSize()) * sitk.Image([1] * 3, reader.GetPixelID()).GetSizeOfPixelComponent()
    held = data_file.stat().st_size
    if voxel_bytes > _MAX_DEFLATE_RATIO * held:
        return (f"declares {' × '.join(map(str, reversed(reader.GetSize())))} voxels "
                f"({_bytes_text(voxel_bytes)}), more than its {_bytes_text(held)} of data can hold even compressed")
    return None


def _data_file(path: Path) -> Path | None:
    """The file holding ``path``'s voxels: ``path`` itself, the one a detached header (.mhd, .nhdr) names
    or the ``.img`` beside a NIfTI/Analyze ``.hdr``; None where it names none or several (a list or
    pattern of files)."""
    header = _nifti_header(path)
    if header is not None:
        return _nifti_data_file(path, header)
    key = next((pattern for suffix, pattern in _DATA_FILE_KEYS.items() if path.name.lower().endswith(suffix)), None)
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


def _itk_reason(error: RuntimeError, path: Path) -> str:
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


def _nifti_problem(path: Path) -> str | None:
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
        return f"declares {' × '.join(map(str, reversed(sizes)))} voxels in its NIfTI header (an axis without voxels)"
    spacing = header["pixdim"][1 : min(rank, 3) + 1]
    if not all(math.isfinite(value) and value > 0 for value in spacing):
        return (f"declares a voxel spacing (pixdim) of {' × '.join(f'{value:g}' for value in reversed(spacing))} mm "
                "in its NIfTI header, which is not positive and finite (volumes in mL are measured with it)")
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
        return (f"declares {' × '.join(map(str, reversed(sizes)))} voxels ({_bytes_text(voxel_bytes)}) in its "
                f"NIfTI header, more than its {_bytes_text(held)} of compressed data can hold")
    code = _NIFTI_FLOAT_TYPES.get(header["datatype"])
    # Integers cannot hold NaN; their size is checked above, or (gzipped) by the size the gzip trailer
    # records (streamed only when it differs: a stream of several gzip members records its last one's).
    if code is None and (not gzipped or _gzip_recorded_size(data_file) == (offset + voxel_bytes) % (1 << 32)):
        return None
    return _stored_voxel_problem(data_file, offset, voxel_bytes, np.dtype(header["endian"] + code) if code else None)


def _stored_voxel_problem(data_file: Path, offset: int, voxel_bytes: int, float_dtype: np.dtype | None) -> str | None:
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
                        return "stores NaN or infinite voxel values (the NIfTI reader would silently make them 0)"
                if len(chunk) < wanted:
                    return (f"is cut short: its NIfTI header declares {_bytes_text(voxel_bytes)} of voxels, "
                            f"the file holds {_bytes_text(voxel_bytes - remaining + len(chunk))}")
                remaining -= len(chunk)
    except EOFError:  # a compressed stream cut short
        return f"is cut short: its NIfTI header declares {_bytes_text(voxel_bytes)} of voxels, the file holds fewer"
    except (OSError, zlib.error) as error:
        return f"cannot be read back to check its voxel values ({error})"
    return None


def image_from_array(array: np.ndarray, geometry: ImageGeometry) -> sitk.Image:
    """A SimpleITK image of a ``(z, y, x)`` array placed on ``geometry`` (bool → uint8, float16 → float32)."""
    array = np.asarray(array)
    if array.ndim != 3:
        raise ValueError(f"Only (z, y, x) arrays can be written as images, got shape {array.shape}.")
    writable = _WRITABLE_DTYPES.get(array.dtype, array.dtype)
    return geometry.apply(sitk.GetImageFromArray(np.ascontiguousarray(array, dtype=writable)))


def image_stem(path: str | Path) -> str:
    """File name without its image extension (``case.nii.gz`` → ``case``)."""
    name = Path(path).name
    for suffix in IMAGE_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return Path(name).stem


def check_output_folder(folder: str | Path) -> Path:
    """Raise ``ValueError`` (one sentence) unless files can be written into ``folder``; create nothing.

    ``folder`` may not exist yet: then its nearest existing ancestor must be a writable folder
    (it will be created there). Call this before long work whose results go into ``folder``.
    """
    folder = Path(folder)
    existing = folder
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(
            f"Cannot write into {folder}: {existing} is a file, not a folder; choose another output folder."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"Cannot write into {folder}: {existing} is not writable; choose another output folder "
            "or change its permissions."
        )
    return folder


def check_output_file(path: str | Path) -> Path:
    """Raise ``ValueError`` (one sentence) unless a file can be written at ``path``; create nothing."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(
            f"Cannot write {path}: a folder of that name is in the way; "
            "move it or choose another output folder."
        )
    check_output_folder(path.parent)
    return path


_HIDDEN_TOKEN_BYTES = 6
# What _hidden_name makes, the destination's name as group 1.
_HIDDEN_NAME = re.compile(rf"\.(.+)\.[0-9a-f]{{{2 * _HIDDEN_TOKEN_BYTES}}}(?:\.[^.]*)*")


def _hidden_name(path: Path) -> Path:
    """A random hidden name beside ``path`` keeping its extensions (``.case.nii.gz.1a2b3c4d5e6f.nii.gz``)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(_HIDDEN_TOKEN_BYTES)}{''.join(path.suffixes)}")


def _destination_name(path: Path) -> str:
    """The name a user knows for ``path``: the destination's when ``path`` is a :func:`_hidden_name`
    temporary (an :class:`OutputSet` hands those to writers), else its own."""
    hidden = _HIDDEN_NAME.fullmatch(path.name)
    return hidden.group(1) if hidden else path.name


def _new_temporary(path: Path) -> Path:
    """Create an empty hidden file beside ``path`` (see :func:`_hidden_name`), mode ``0666 & ~umask``.

    ``tempfile.mkstemp`` always creates 0600; ``os.open`` with 0666 lets the kernel apply the
    umask (no umask read-and-restore, which would race with other threads).
    """
    while True:
        candidate = _hidden_name(path)
        try:
            os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return candidate
        except FileExistsError:
            continue


class OutputSet:
    """Files written as one set: when the block ends without error all replace their destinations,
    after any error (Ctrl-C included) none does and the previous files stay as they were.

    Usage::

        with OutputSet() as outputs:
            write_image(outputs.stage(out_dir / "case_labels.nii.gz"), labels, geometry)
            write_json_atomic(outputs.stage(out_dir / "case_metrics.json"), row)

    :meth:`stage` returns a hidden temporary beside the destination, keeping its extension (so
    writers that pick the format by extension write the right one). On commit, every existing
    destination is first hard-linked (or copied) to a backup, then each temporary is renamed over
    its destination; if a rename fails, the destinations already replaced get their backups back.
    Folders created for the set are removed again after a failure.
    """

    def __init__(self) -> None:
        self._staged: dict[Path, Path] = {}  # destination -> temporary
        self._created_folders: list[Path] = []

    def stage(self, path: str | Path) -> Path:
        """Reserve ``path`` in the set; returns the temporary file to write instead (it exists, empty).

        Raises:
            ValueError: ``path`` is staged twice, is an existing folder, or its folder cannot be written.
        """
        path = Path(path)
        if path in self._staged:
            raise ValueError(f"{path} is staged twice in one output set; give each output its own name.")
        check_output_file(path)
        missing = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]
        for folder in reversed(missing):
            with suppress(FileExistsError):  # made meanwhile by someone else: theirs, not removed later
                folder.mkdir()
                self._created_folders.append(folder)
        self._staged[path] = _new_temporary(path)
        return self._staged[path]

    def __enter__(self) -> "OutputSet":
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        if kind is None:
            self.commit()
        else:
            self.discard()
        return False

    def discard(self) -> None:
        """Remove every staged temporary and the folders created for the set; destinations are untouched."""
        for temporary in self._staged.values():
            temporary.unlink(missing_ok=True)
        self._staged.clear()
        for folder in reversed(self._created_folders):
            with suppress(OSError):  # not empty: someone else wrote there meanwhile, so it stays
                folder.rmdir()
        self._created_folders.clear()

    def commit(self) -> None:
        """Rename every staged file onto its destination, all or none (see the class docstring)."""
        backups: dict[Path, Path] = {}
        replaced: list[Path] = []
        try:
            for destination in self._staged:
                if os.path.lexists(destination):
                    backups[destination] = _backup(destination)
            for destination, temporary in self._staged.items():
                os.replace(temporary, destination)
                replaced.append(destination)
        except BaseException:
            for destination in replaced:
                with suppress(OSError):  # best effort: one failed restore must not stop the others
                    if destination in backups:
                        os.replace(backups.pop(destination), destination)
                    else:
                        destination.unlink()
            for backup in backups.values():
                backup.unlink(missing_ok=True)
            self.discard()
            raise
        for backup in backups.values():
            backup.unlink(missing_ok=True)
        self._staged.clear()
        self._created_folders.clear()


def _backup(path: Path) -> Path:
    """A second, hidden name for ``path``'s current content: a hard link, or a copy where the file
    system has none; ``path`` itself stays in place, so readers never find it missing."""
    while True:
        backup = _hidden_name(path)
        try:
            os.link(path, backup, follow_symlinks=False)
            return backup
        except FileExistsError:
            continue
        except OSError:
            shutil.copy2(path, backup, follow_symlinks=False)
            return backup


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed over ``path``, on error removed.

    An :class:`OutputSet` of one file: the temporary keeps ``path``'s full extension
    (``.nii.gz``) and gets the umask's usual mode; missing folders are created (and removed
    again on error).

    Raises:
        ValueError: ``path`` is a folder or its folder cannot be written (before anything is created).
    """
    with OutputSet() as outputs:
        yield outputs.stage(path)


# nnU-Net / Medical Segmentation Decathlon image files: <case>_<four-digit channel index>.<ext>
_CHANNEL_FILE = re.compile(r"^(.+)_(\d{4})$")


def case_and_channel(stem: str) -> tuple[str, int | None]:
    """The case and channel of an image file's stem: ``("brain", 1)`` for ``brain_0001``, ``(stem, None)`` without
    a four-digit channel suffix."""
    match = _CHANNEL_FILE.match(stem)
    return (match.group(1), int(match.group(2))) if match else (stem, None)


def group_channels(stems: "list[str] | tuple[str, ...]") -> list[tuple[str, dict[int, int]]]:
    """The cases of images named by their stems, in the order each case first appears: its name and
    ``{channel: position in stems}``. The ``<case>_0000`` ... ``_000K`` images of a case are one case; an image
    without a channel suffix is a case of its own, ``{0: position}``, even beside a ``<stem>_0000`` image."""
    cases: dict[tuple[str, bool], dict[int, int]] = {}
    for position, stem in enumerate(stems):
        case, channel = case_and_channel(stem)
        cases.setdefault((case, channel is None), {})[channel or 0] = position
    return [(case, channels) for (case, _), channels in cases.items()]


def read_channels(paths: "list[Path] | tuple[Path, ...]") -> tuple[np.ndarray, ImageGeometry]:
    """Read one file per channel (channel 0 first): ``(z, y, x)`` for one, ``(K, z, y, x)`` for several, and the
    grid they share.

    Raises:
        ValueError: a file :func:`read_image` refuses, or a channel on another grid than the first (one sentence
            naming both files).
    """
    channels = [read_image(path) for path in paths]
    image, geometry = channels[0]
    for path, (other, other_geometry) in zip(paths[1:], channels[1:]):
        if other.shape != image.shape or not other_geometry.matches(geometry):
            raise ValueError(f"{Path(path).name} is not on {Path(paths[0]).name}'s grid (shape {other.shape} vs "
                             f"{image.shape}, or another spacing, origin or direction); every channel of a case "
                             "must share one grid.")
    if len(channels) == 1:
        return image, geometry
    return np.stack([values for values, _ in channels]), geometry


def write_image(path: str | Path, array: np.ndarray, geometry: ImageGeometry) -> Path:
    """Write a ``(z, y, x)`` array on ``geometry`` to ``path`` (format from the extension), atomically.

    Raises:
        ValueError: the extension is not one of :data:`WRITE_SUFFIXES`, the array is not 3D, or
            the folder cannot be written.
        OSError: writing failed (e.g. the disk is full), with ITK's reason in one sentence; the
            previous file at ``path`` is kept.
    """
    path = Path(path)
    if not path.name.lower().endswith(WRITE_SUFFIXES):
        raise ValueError(
            f"Cannot write {path.name}: give it one of the extensions {', '.join(WRITE_SUFFIXES)}."
        )
    image = image_from_array(array, geometry)
    with atomic_output(path) as temporary:
        try:
            sitk.WriteImage(image, str(temporary), useCompression=True)
            problem = _written_problem(temporary, image)
        except RuntimeError as error:
            problem = f"({_itk_reason(error, temporary)})"
        if problem:
            raise OSError(f"Cannot write {_destination_name(path)} {problem}; check the free space and "
                          f"permissions of {path.parent}.")
    return path


def _written_problem(path: Path, image: sitk.Image) -> str | None:
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


def write_json_atomic(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` as indented JSON to ``path``, atomically (NaN is written as ``NaN``)."""
    path = Path(path)
    text = json.dumps(payload, indent=2, allow_nan=True)
    with atomic_output(path) as temporary:
        temporary.write_text(text)
    return path


def os_error_sentence(error: OSError) -> str:
    """One sentence for an OS error: its reason and file (``"[Errno 28] ...: 'path'"`` is none)."""
    reason = error.strerror or str(error) or type(error).__name__
    text = f"{reason} ({error.filename})" if error.filename else reason
    return text if text.endswith(".") else f"{text}."
