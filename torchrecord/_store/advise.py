"""Tell the kernel which bytes of a record file the next window will read.

A reader knows its windows in advance: runs of consecutive records (blocks),
visited in a seeded order. The environment is opened without kernel
read-ahead (the access is not sequential across blocks), so a cold read would
fault pages in one at a time. :class:`Advisor` instead finds, for each record
run of an upcoming window, the byte range of the file that holds it and asks
the kernel to start reading it (``posix_fadvise(WILLNEED)``), on a background
thread, one window ahead of the reader. The reads are then in flight together,
instead of one page fault after another.

A record set is written by appending in key order, so a run's records (leaf
pages and the overflow pages of long values) lie in one stretch of the file:
two cursor seeks (first and last record) give it. A stretch much longer than
the run's records (a file written some other way) is not advised. Hints are
only hints: a failure is ignored, and nothing here can change what is read.
A file already in the page cache (:func:`resident`) gets no advisor at all.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import queue
import threading
from collections.abc import Sequence
from typing import Any

import lmdb
import numpy as np

from torchrecord._store.forkgate import lmdb_calls
from torchrecord._store.format import encode_key

__all__ = ["Advisor", "available", "cached_pages", "hint_span", "map_base", "resident"]

_PAGE = 4096
#: a stretch longer than this many times its records' bytes (plus slack) is not advised
_MAX_SPREAD = 2
_SLACK = 1 << 20
#: bytes per posix_fadvise call (a single call for a much larger range reads only part of it)
_PIECE = 2 << 20

#: pages of a file whose residency :func:`resident` samples, and the share of them that must be cached
_SAMPLED_PAGES = 64
_RESIDENT_SHARE = 0.9

Run = tuple[int, int]


def available() -> bool:
    """True where read-ahead hints can be given (``posix_fadvise`` and ``/proc/self/maps``: Linux)."""
    return (
        hasattr(os, "posix_fadvise")
        and os.path.exists("/proc/self/maps")
        and (os.environ.get("TORCHRECORD_READAHEAD", "1") != "0")
    )


@functools.cache
def _mincore() -> Any:
    mincore = ctypes.CDLL(None, use_errno=True).mincore
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return mincore


def cached_pages(path: str, sample: int | None = None) -> tuple[int, int] | None:
    """(pages of ``path`` in the page cache, pages examined), asked with ``mincore`` (Linux).

    Every page, or ``sample`` pages spread evenly over the file. None where it
    cannot be asked (no ``mincore``, an unreadable file); ``(0, 0)`` for an empty one.
    """
    try:
        mincore = _mincore()
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return 0, 0
            pages = -(-size // mmap.PAGESIZE)
            with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
                view = np.frombuffer(mapped, np.uint8)
                try:
                    base = view.ctypes.data
                    if sample is None:
                        state = np.zeros(pages, np.uint8)
                        if mincore(ctypes.c_void_p(base), size, state.ctypes.data) != 0:
                            return None
                        return int((state & 1).sum()), pages
                    spread = np.linspace(0, pages - 1, sample).astype(np.int64)  # sorted; np.unique would
                    chosen = spread[np.r_[True, spread[1:] != spread[:-1]]].tolist()  # import numpy.ma: 22 ms
                    state = np.zeros(len(chosen), np.uint8)
                    at = state.ctypes.data  # page i's state goes to state[i] (asked once: a ctypes object)
                    for i, page in enumerate(chosen):
                        if mincore(base + page * mmap.PAGESIZE, mmap.PAGESIZE, at + i) != 0:
                            return None
                    return int((state & 1).sum()), len(chosen)
                finally:
                    del view  # the map cannot close while an array still exports it
        finally:
            os.close(fd)
    except (OSError, AttributeError, ValueError, TypeError):
        return None


def resident(path: str) -> bool:
    """True when ``path`` is in the page cache: at least 90% of 64 pages spread over it.

    A warm file needs no read-ahead, and advising it costs the reader (a thread
    taking turns with it, the kernel walking its cache): a read over the
    large-image set of ``benchmarks.profiles`` spent 27-40 ms of a 170 ms epoch
    walking records with the advisor running, 15 ms without it. False where
    unknown (not Linux, an empty file, an error): the reader then advises.
    """
    counts = cached_pages(path, _SAMPLED_PAGES)
    return counts is not None and counts[1] > 0 and counts[0] >= _RESIDENT_SHARE * counts[1]


def hint_span(lo: int, hi: int, expected: int, size: int) -> tuple[int, int] | None:
    """The page-aligned ``(offset, length)`` to advise for bytes [lo, hi) of a file of ``size`` bytes.

    None when the range is empty, outside the file, or spread over much more
    than the ``expected`` bytes of its records.
    """
    if not 0 <= lo < hi <= size or hi - lo > _MAX_SPREAD * expected + _SLACK:
        return None
    start = lo // _PAGE * _PAGE - _PAGE  # the leaf page of the first record may sit just before its value
    start = max(0, start)
    stop = min(size, -(-hi // _PAGE) * _PAGE)
    return start, stop - start


def _address(value: Any) -> int:
    """The address of a zero-copy value (a buffer of the LMDB map)."""
    return int(np.frombuffer(value, np.uint8).__array_interface__["data"][0])


def map_base(address: int, path: str) -> int | None:
    """The address where byte 0 of ``path`` is mapped, from the mapping holding ``address`` (Linux).

    LMDB does not say where it mapped the file (its ``map_addr`` is 0 unless the
    map is fixed), so the process's own map list tells. None when unknown.
    """
    try:
        real = os.path.realpath(path)
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) < 6 or parts[5].strip() != real:
                    continue
                start, end = (int(x, 16) for x in parts[0].split("-"))
                if start <= address < end:
                    return start - int(parts[2], 16)
    except (OSError, ValueError):
        return None
    return None


class Advisor:
    """Advises the record runs of upcoming windows of one file, on one background thread.

    Args:
        env: the file's open environment (read-only).
        db: its records database.
        path: the file (opened once more, read-only, for ``posix_fadvise``).
        record_bytes: the length of a record, or an estimate (to reject odd stretches).
    """

    def __init__(self, env: lmdb.Environment, db: Any, path: str, record_bytes: int) -> None:
        self.env, self.db, self.record_bytes = env, db, max(1, record_bytes)
        self.advised = 0  # bytes advised so far (for tests and benchmarks)
        self._pid = os.getpid()
        self._fd = os.open(path, os.O_RDONLY)
        self._size = os.fstat(self._fd).st_size
        self._path = path
        self._base: int | None = None
        self._jobs: queue.Queue[list[Run] | None] = queue.Queue(maxsize=2)
        self._thread = threading.Thread(target=self._work, name="torchrecord-advise", daemon=True)
        self._thread.start()

    def advise(self, runs: Sequence[Run]) -> None:
        """Ask for the record runs ``[first, stop)`` to be read ahead (dropped if two requests wait)."""
        if runs:
            with contextlib.suppress(queue.Full):
                self._jobs.put_nowait(list(runs))

    def close(self) -> None:
        """Stop the thread (after the request it is working on) and close the file.

        In a forked child the thread does not exist and the queue's lock may be held
        by it forever: only the file is closed.
        """
        if os.getpid() != self._pid:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            return
        with contextlib.suppress(queue.Full):
            self._jobs.put_nowait(None)
        while self._thread.is_alive():
            try:  # make room for the stop signal if requests are queued
                self._jobs.get_nowait()
                self._jobs.put_nowait(None)
            except (queue.Empty, queue.Full):
                pass
            self._thread.join(timeout=0.05)
        os.close(self._fd)

    def _work(self) -> None:
        while True:
            runs = self._jobs.get()
            if runs is None:
                return
            with contextlib.suppress(lmdb.Error, OSError, ValueError), lmdb_calls():
                self._advise(runs)

    def _advise(self, runs: list[Run]) -> None:
        with self.env.begin(db=self.db, buffers=True) as txn:
            cursor = txn.cursor(db=self.db)
            for first, stop in runs:
                if not self._jobs.empty() and self._jobs.queue[0] is None:
                    return  # asked to stop
                if not cursor.set_range(encode_key(first)):
                    continue
                lo = _address(cursor.value())
                if self._base is None:
                    self._base = map_base(lo, self._path)
                    if self._base is None:
                        return
                lo -= self._base
                if stop - 1 > first and not cursor.set_range(encode_key(stop - 1)):
                    continue
                last = cursor.value()
                hi = _address(last) - self._base + len(last)
                span = hint_span(lo, hi, (stop - first) * self.record_bytes, self._size)
                if span is not None:
                    start, length = span
                    # Linux reads only part of one large WILLNEED range: ask in pieces of a few MB
                    for off in range(start, start + length, _PIECE):
                        os.posix_fadvise(self._fd, off, min(_PIECE, start + length - off), os.POSIX_FADV_WILLNEED)
                    self.advised += length
