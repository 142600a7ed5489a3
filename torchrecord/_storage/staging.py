"""Local staging folders of uploads: where a shard for object storage is written before it goes up whole.

Each writer makes its own folder under ``$TMPDIR/torchrecord-staging-UID/`` and holds a lock
(``_storage/locks.py``) on ``FOLDER.lock`` beside it for as long as it lives. Every writer, when it
starts, removes the folders whose lock it can take: those of writers that were killed (a
``finally`` never runs under SIGKILL). So a killed writer's local copy lasts until the next writer
on that machine starts, never longer.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from types import TracebackType

from torchrecord._storage.locks import Lock

__all__ = ["Staging", "staging_root", "sweep"]

_PREFIX = "shard-"


def staging_root() -> str:
    """The folder that holds this user's staging folders (created owner-only)."""
    root = os.path.join(tempfile.gettempdir(), f"torchrecord-staging-{os.geteuid()}")
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


def sweep(root: str) -> list[str]:
    """Remove the staging folders under ``root`` whose writer is gone; returns their paths."""
    removed = []
    try:
        entries = os.listdir(root)
    except OSError:
        return []
    for entry in entries:
        folder = os.path.join(root, entry)
        if not entry.startswith(_PREFIX) or entry.endswith(".lock") or not os.path.isdir(folder):
            continue
        lock = folder + ".lock"
        if not os.path.lexists(lock):  # its writer removes the folder before the lock: none left means dead
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            continue
        with Lock(lock, blocking=False) as held:
            if held:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    for entry in entries:  # lock files whose folder is gone (a writer killed while removing it)
        if entry.startswith(_PREFIX) and entry.endswith(".lock") and not os.path.isdir(os.path.join(root, entry[:-5])):
            with Lock(os.path.join(root, entry), blocking=False):
                pass  # taken: removed on release; held by a live writer: left
    return removed


class Staging:
    """A fresh staging folder, held for the life of the ``with`` block (or of the process, if killed)."""

    def __init__(self) -> None:
        root = staging_root()
        sweep(root)
        token = os.urandom(6).hex()
        self.path = os.path.join(root, f"{_PREFIX}{os.getpid()}-{token}")
        self._lock = Lock(self.path + ".lock", note="staging")
        self._lock.__enter__()
        os.mkdir(self.path, 0o700)

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.release()
