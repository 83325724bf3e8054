"""One training run per run folder: an advisory lock that a second ``calibseg-train`` on the same
``--out`` finds taken, so two runs never overwrite each other's checkpoint and history.

The lock is ``fcntl.flock`` on a hidden file in the run folder: the kernel releases it when the
process ends in any way (``kill -9`` included), so a killed run can be resumed at once and no stale
lock is ever left to clean up by hand. Where ``fcntl`` does not exist (Windows) runs are not locked.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows: no advisory locks of this kind
    fcntl = None

__all__ = ["LOCK_NAME", "RunFolderBusy", "run_folder_lock"]

LOCK_NAME = ".calibseg-train.lock"


class RunFolderBusy(ValueError):
    """Another process holds the run folder's lock; the message names the folder and that process."""


@contextmanager
def run_folder_lock(run_dir: str | Path) -> Iterator[Path]:
    """Hold ``run_dir``'s lock (``run_dir`` must exist) for the block; yields the lock file's path.

    The lock file records the holder's process id, which the refusal names; it is removed when the
    block ends.

    Raises:
        RunFolderBusy: another process holds the lock (its run is still going).
    """
    path = Path(run_dir) / LOCK_NAME
    if fcntl is None:
        yield path
        return
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(descriptor, 32).decode(errors="replace").strip() or "another process"
            os.close(descriptor)
            raise RunFolderBusy(
                f"{run_dir} is in use by another calibseg-train (process {holder}); wait for it to end or choose "
                "another --out."
            ) from None
        # The holder before us may have removed the file between our open and our lock: then the lock
        # is on a file nobody else can find, so start again on the current one.
        try:
            if os.path.samestat(os.fstat(descriptor), os.stat(path)):
                break
        except FileNotFoundError:
            pass
        os.close(descriptor)
    try:
        os.ftruncate(descriptor, 0)
        os.write(descriptor, str(os.getpid()).encode())
        yield path
    finally:
        path.unlink(missing_ok=True)  # before the lock goes: a newcomer then finds no file or a new one
        os.close(descriptor)
