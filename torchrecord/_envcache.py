"""One read-only LMDB environment per record-set file per process.

LMDB (and py-lmdb, which refuses it) forbids opening one file twice in a
process, and an environment must not be used across ``fork()``. This registry
hands every RecordFile of a path the same environment, closes environments a
forked child inherited (it never uses them), and opens the new file when the
path was replaced on disk (``write_record(..., overwrite=True)`` renames a new
file over it).

A replaced file's environment is *not* closed: RecordFiles and transactions
that already use it keep reading that complete, unchanged snapshot (the old
file lives on, unlinked, while it is mapped), so no reader ever mixes records
of two record sets. It is closed when the last of them lets go of it.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import lmdb

from torchrecord._format import open_identified
from torchrecord.errors import RecordNotFoundError

__all__ = ["Handle", "acquire", "read_closed"]

T = TypeVar("T")


@dataclass
class Handle:
    """An open environment, the process that opened it and the file it maps."""

    env: lmdb.Environment
    pid: int
    inode: tuple[int, int]
    closed: bool = False

    def usable(self) -> bool:
        return not self.closed and self.pid == os.getpid()


#: path -> handle of the file currently at that path
_OPEN: dict[str, Handle] = {}
#: (st_dev, st_ino) -> every environment still open in this process, held alive
#: by a Handle or a transaction; a file must never be opened a second time
_LIVE: weakref.WeakValueDictionary[tuple[int, int], lmdb.Environment] = weakref.WeakValueDictionary()
_OWNER = os.getpid()


def acquire(path: str) -> Handle:
    """The open handle of ``path`` in this process, opening it if needed."""
    _forget_inherited()
    real = os.path.realpath(path)
    inode = _identity(path, real)
    handle = _OPEN.get(real)
    if handle is not None and handle.usable() and handle.inode == inode:
        return handle
    env = _LIVE.get(inode)  # still open for an old reader, or under another name (hard link)
    if env is None:
        env, inode = open_identified(path)  # the file now at the path, if it was just replaced
        _LIVE[inode] = env
    handle = Handle(env, os.getpid(), inode)
    _OPEN[real] = handle
    return handle


def read_closed(path: str, read: Callable[[lmdb.Environment], T]) -> T:
    """``read(env)`` on the file at ``path``, leaving nothing open that was not open before.

    The environment this process already has for the file is used as is;
    otherwise the file is opened for the call and closed after it (no
    descriptor, no mapping left), e.g. to check a path where the reading
    happens later in other processes.
    """
    _forget_inherited()
    real = os.path.realpath(path)
    env = _LIVE.get(_identity(path, real))
    if env is not None:
        return read(env)
    env, _ = open_identified(path)
    try:
        return read(env)
    finally:
        env.close()


def _identity(path: str, real: str) -> tuple[int, int]:
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise RecordNotFoundError(
            f"{path}: no record set here (write one with torchrecord.write_record)"
        ) from None
    return (st.st_dev, st.st_ino)


def _forget_inherited() -> None:
    """In a forked child, close every environment inherited from the parent (once)."""
    global _OWNER
    pid = os.getpid()
    if pid == _OWNER:
        return
    _OWNER = pid
    for handle in _OPEN.values():
        handle.closed = True
    _OPEN.clear()
    for env in list(_LIVE.values()):
        with contextlib.suppress(lmdb.Error):
            env.close()
    _LIVE.clear()
