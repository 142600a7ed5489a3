"""No py-lmdb call of a background thread is in flight when the process forks.

py-lmdb (3.x) waits, when an environment is closed or freed, for the calls in
flight on it. A call that a background thread (MixedDataset's read-ahead, the
cold-read advisor) was inside when the process forked never ends in the child,
where that thread does not exist: the child's closing of the environments it
inherited (``torchrecord._store.envcache``) then waited forever (a DataLoader worker
forked while the parent's read-ahead threads were reading hung; so did the test
suite). Background threads make their py-lmdb calls inside :func:`lmdb_calls`;
a fork first waits until no other thread is inside one, and none enters until
the fork is done. The regions hold no waits on anything but LMDB and the disk,
so a fork waits at most for one read to finish. A region must never wait for
another thread that may itself enter a region (it would wait for the fork,
which waits for the region): MixedDataset's source reads start no cold-read
advisor thread for that reason.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

__all__ = ["lmdb_calls"]

_cv = threading.Condition()
_inside: dict[int, int] = {}  # thread ident -> depth inside lmdb_calls
_forking = False


@contextlib.contextmanager
def lmdb_calls() -> Iterator[None]:
    """A region of py-lmdb calls that a fork of this process must not cut in two."""
    me = threading.get_ident()
    with _cv:
        while _forking and me not in _inside:
            _cv.wait()
        _inside[me] = _inside.get(me, 0) + 1
    try:
        yield
    finally:
        with _cv:
            depth = _inside.pop(me) - 1
            if depth:
                _inside[me] = depth
            else:
                _cv.notify_all()


def _before_fork() -> None:
    global _forking
    _cv.acquire()  # held across the fork: no thread enters or leaves a region meanwhile
    _forking = True
    me = threading.get_ident()
    while any(ident != me for ident in _inside):  # the forking thread's own region cannot be in flight
        _cv.wait()


def _after_fork_in_parent() -> None:
    global _forking
    _forking = False
    _cv.notify_all()
    _cv.release()


def _after_fork_in_child() -> None:
    global _cv, _forking, _inside
    me = threading.get_ident()
    _cv = threading.Condition()  # the parent's is held, by the thread that forked, in the parent
    _inside = {me: _inside[me]} if me in _inside else {}
    _forking = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
