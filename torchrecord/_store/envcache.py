"""One read-only LMDB environment per record-set file per process, reference-counted and bounded.

LMDB (and py-lmdb, which refuses it) forbids opening one file twice in a
process, and an environment must not be used across ``fork()``. This registry
hands every RecordFile of a file the same environment (a :class:`Handle`),
closes environments a forked child inherited (it never uses them), and opens
the new file when the path was replaced on disk (``write_record(...,
overwrite=True)`` renames a new file over it).

Every RecordFile using a handle holds one reference to it (:func:`acquire`,
:func:`release`). When the last one lets go:

* by ``RecordFile.close()`` (``hard``), the registry drops the environment at
  once, so its descriptor and mapping are released (py-lmdb closes an
  environment when nothing refers to it any more);
* by being dropped, or by a reader that finished its pass, the handle stays
  *idle* in a small least-recently-used cache (:data:`IDLE_LIMIT`
  environments), so reading the same file again does not reopen it; the
  least recently used idle environment is dropped when the cache is full, and
  every idle one when the process runs out of descriptors.

A handle some RecordFile still holds is never dropped, and a transaction
(an iteration, a walk) keeps its environment open until it ends. A replaced
file's environment is therefore *not* closed while it is in use: RecordFiles
and transactions that already use it keep reading that complete, unchanged
snapshot (the old file lives on, unlinked, while it is mapped), so no reader
ever mixes records of two record sets.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import lmdb

from torchrecord._store.opening import open_identified
from torchrecord.errors import RecordNotFoundError, TooManyOpenFilesError

__all__ = ["Handle", "IDLE_LIMIT", "acquire", "drop_idle", "read_closed", "release"]

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")

#: Idle environments (no RecordFile holds them) a process keeps open for reuse.
IDLE_LIMIT = 32


@dataclass(eq=False)
class Handle:
    """An open environment, the process that opened it, the file it maps and its users."""

    env: lmdb.Environment
    pid: int
    inode: tuple[int, int]
    refs: int = 0
    closed: bool = False

    def usable(self) -> bool:
        return not self.closed and self.pid == os.getpid()


#: (st_dev, st_ino) -> the handle of that file: held by a RecordFile, or idle
_HANDLES: dict[tuple[int, int], Handle] = {}
#: the idle handles (no reference), least recently used first
_IDLE: OrderedDict[tuple[int, int], Handle] = OrderedDict()
#: (st_dev, st_ino) -> every environment still open in this process, held alive
#: by a Handle or a transaction; a file must never be opened a second time
_LIVE: weakref.WeakValueDictionary[tuple[int, int], lmdb.Environment] = weakref.WeakValueDictionary()
_OWNER = os.getpid()
#: guards the registry: readers open files from several threads (MixedDataset's read-ahead)
_LOCK = threading.RLock()


def _reset_lock() -> None:
    global _LOCK
    _LOCK = threading.RLock()  # a forked child: another thread may have held the parent's


os.register_at_fork(after_in_child=_reset_lock)


def _locked(fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with _LOCK:
            return fn(*args, **kwargs)

    return run


@_locked
def acquire(path: str, prefer: tuple[int, int] | None = None) -> Handle:
    """A reference to the open handle of the file at ``path`` in this process, opening it if needed.

    ``prefer``: the (st_dev, st_ino) of the file the caller read before; while
    this process still has it open, that file is returned even if ``path`` was
    replaced meanwhile (the caller keeps its snapshot).
    """
    _forget_inherited()
    if prefer is not None:
        handle = _known(prefer)
        if handle is not None:
            return _take(handle)
    inode = _identity(path)
    handle = _known(inode)
    if handle is None:
        try:
            env, inode = open_identified(path)  # the file now at the path, if it was just replaced
        except TooManyOpenFilesError:
            drop_idle()  # give back what no reader uses, then try once more
            env, inode = open_identified(path)
        handle = _known(inode)  # replaced meanwhile by a file this process has open
        if handle is None:
            _LIVE[inode] = env
            handle = _HANDLES[inode] = Handle(env, os.getpid(), inode)
        else:
            env.close()
    return _take(handle)


@_locked
def release(handle: Handle, hard: bool) -> None:
    """Give back one reference to ``handle``; the last one drops it (``hard``) or leaves it idle."""
    if not handle.usable() or handle.refs <= 0:
        return  # inherited from the parent process, or released already
    handle.refs -= 1
    if handle.refs:
        return
    if hard:
        _drop(handle)
        return
    _IDLE[handle.inode] = handle
    while len(_IDLE) > IDLE_LIMIT:
        _drop(_IDLE.popitem(last=False)[1])


@_locked
def drop_idle() -> None:
    """Drop every idle environment (no RecordFile holds it) of this process."""
    while _IDLE:
        _drop(_IDLE.popitem(last=False)[1])


@_locked
def read_closed(path: str, read: Callable[[lmdb.Environment], T]) -> T:
    """``read(env)`` on the file at ``path``, leaving nothing open that was not open before.

    The environment this process already has for the file is used as is;
    otherwise the file is opened for the call and closed after it (no
    descriptor, no mapping left), e.g. to check a path where the reading
    happens later in other processes.
    """
    _forget_inherited()
    env = _LIVE.get(_identity(path))
    if env is not None:
        return read(env)
    try:
        env, _ = open_identified(path)
    except TooManyOpenFilesError:
        drop_idle()
        env, _ = open_identified(path)
    try:
        return read(env)
    finally:
        env.close()


def _known(inode: tuple[int, int]) -> Handle | None:
    """The usable handle of file ``inode``, if this process has it open."""
    handle = _HANDLES.get(inode)
    if handle is not None:
        return handle
    env = _LIVE.get(inode)  # dropped by the registry, still open for a transaction
    if env is None:
        return None
    handle = _HANDLES[inode] = Handle(env, os.getpid(), inode)
    return handle


def _take(handle: Handle) -> Handle:
    handle.refs += 1
    _IDLE.pop(handle.inode, None)
    return handle


def _drop(handle: Handle) -> None:
    """Forget ``handle``: its environment closes as soon as no transaction uses it."""
    handle.closed = True
    _IDLE.pop(handle.inode, None)
    if _HANDLES.get(handle.inode) is handle:
        del _HANDLES[handle.inode]


def _identity(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise RecordNotFoundError(f"{path}: no record set here (write one with torchrecord.write_record)") from None
    return (st.st_dev, st.st_ino)


def _forget_inherited() -> None:
    """In a forked child, close every environment inherited from the parent (once)."""
    global _OWNER
    pid = os.getpid()
    if pid == _OWNER:
        return
    _OWNER = pid
    for handle in _HANDLES.values():
        handle.closed = True
    _HANDLES.clear()
    _IDLE.clear()
    for env in list(_LIVE.values()):
        with contextlib.suppress(lmdb.Error):
            env.close()
    _LIVE.clear()
