"""Atomic, all-or-nothing outputs: no error ever leaves a half-written file under its final name.

Every write goes to a temporary file beside the destination and is renamed over it, so a
crash or an error never leaves a half-written file under the final name; :class:`OutputSet`
does the same for several files that belong together (all of them are replaced, or none).
New files get the mode any program would give them (``0666 & ~umask``), not ``mkstemp``'s
``0600``, so colleagues sharing a workstation can read outputs, bundles and checkpoints.
:func:`check_output_folder` and :func:`check_output_file` go before long work, so a folder that cannot be
written is one sentence before anything is computed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Iterator

__all__ = ["check_output_folder", "check_output_file", "OutputSet", "atomic_output", "write_json_atomic",
           "recorded_path", "os_error_sentence", "destination_name"]

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


def destination_name(path: Path) -> str:
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



def write_json_atomic(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` as indented JSON to ``path``, atomically (NaN is written as ``NaN``)."""
    path = Path(path)
    text = json.dumps(payload, indent=2, allow_nan=True)
    with atomic_output(path) as temporary:
        temporary.write_text(text)
    return path


def recorded_path(path: str | Path) -> str:
    """How a record names ``path``: relative to the current folder (the repository root, where every documented
    command runs), with ``/`` separators, so that a record holds no absolute path of the machine it was made on
    and reads the same on another; ``""`` stays ``""``. A path outside that folder keeps its ``..`` steps; one
    on another Windows drive, which has no relative form, is named by its last part."""
    if str(path) == "":
        return ""
    try:
        return Path(os.path.relpath(path)).as_posix()
    except ValueError:  # another drive: no relative path leads there
        return Path(path).name


def os_error_sentence(error: OSError) -> str:
    """One sentence for an OS error: its reason and file (``"[Errno 28] ...: 'path'"`` is none)."""
    reason = error.strerror or str(error) or type(error).__name__
    text = f"{reason} ({error.filename})" if error.filename else reason
    return text if text.endswith(".") else f"{text}."
