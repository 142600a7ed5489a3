"""One read-only LMDB environment per record-set file per process.

LMDB (and py-lmdb, which refuses it) forbids opening one file twice in a
process, and an environment must not be used across ``fork()``. This registry
hands every RecordFile of a path the same environment, drops environments a
forked child inherited (it never uses them), and re-opens a path whose file was
replaced on disk (for new RecordFiles; open ones keep reading their snapshot
until the registry closes it, after which they re-open too).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import lmdb

from torchrecord._format import open_readonly
from torchrecord.errors import RecordNotFoundError

__all__ = ["Handle", "acquire"]


@dataclass
class Handle:
    """An open environment, the process that opened it and the file it maps."""

    env: lmdb.Environment
    pid: int
    inode: tuple[int, int]
    closed: bool = False

    def usable(self) -> bool:
        return not self.closed and self.pid == os.getpid()


_OPEN: dict[str, Handle] = {}


def acquire(path: str) -> Handle:
    """The open handle of ``path`` in this process, opening it if needed."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise RecordNotFoundError(f"{path}: no record set here (write one with torchrecord.write_record)") from None
    inode = (st.st_dev, st.st_ino)
    handle = _OPEN.get(real)
    if handle is not None:
        if handle.usable() and handle.inode == inode:
            return handle
        _discard(real, handle)
    env = open_readonly(path)
    handle = Handle(env, os.getpid(), inode)
    _OPEN[real] = handle
    return handle


def _discard(real: str, handle: Handle) -> None:
    """Close an inherited or stale environment so its path can be opened afresh."""
    del _OPEN[real]
    handle.closed = True
    try:
        handle.env.close()
    except lmdb.Error:
        pass
