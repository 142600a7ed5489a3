"""The structure check's leaf pages checked in batches with NumPy: the scalar checks, vectorized.

A named database of a record set has one leaf page per few records, so its leaf
checks dominate the check's cost. :func:`leaf_batch_passes` runs every check the
scalar walk (``_store/lmdb_check.py``, the reference) runs on a leaf page, on up
to :data:`BATCH_PAGES` pages at once: page headers, node pointers tiling the node
area, node flags and sizes, keys strictly increasing and inside their parent's
bounds, overflow runs inside the file and overlapping nothing. It only answers
whether they all pass; where one does not, the walk checks the batch again page
by page, which raises the precise error. Nothing a page claims sizes an
allocation before it is checked against the file.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from torchrecord._store.lmdb_format import (
    F_BIGDATA,
    NODESIZE,
    P_LEAF,
    P_OVERFLOW,
    PAGEHDRSZ,
    PGNO,
    DbRecord,
    Key,
    Visit,
)

__all__ = ["BATCH_PAGES", "Pages", "WalkState", "leaf_batch_passes", "read_pages"]

#: leaf pages checked together by the vectorized path
BATCH_PAGES = 256

_Ints = np.ndarray[Any, np.dtype[np.int64]]


@dataclass
class WalkState:
    """The state of one database's walk."""

    db: DbRecord
    counts: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # branch, leaf, overflow pages, entries
    previous: list[Key | None] = field(default_factory=lambda: [None])  # the last leaf key seen
    batch: list[Visit] = field(default_factory=list)  # leaf pages waiting for the vectorized check


class Pages(NamedTuple):
    """The file as the walk sees it: descriptor, page size, last page in use, one byte per page (reached yet?)."""

    fd: int
    psize: int
    last: int
    visited: np.ndarray[Any, np.dtype[np.uint8]]


class _Nodes(NamedTuple):
    """Every node of a batch of leaf pages, in (page, index) order."""

    u8: np.ndarray[Any, np.dtype[np.uint8]]  # the pages' bytes
    view: memoryview  # the same bytes
    key_at: _Ints  # where each node's key starts in the buffer
    ksize: _Ints
    size: _Ints  # data size
    big: np.ndarray[Any, np.dtype[np.bool_]]  # F_BIGDATA: the data is an overflow run
    starts: _Ints  # per page, its first node
    lasts: _Ints  # per page, its last node


def leaf_batch_passes(pages: Pages, walk: WalkState, batch: list[Visit]) -> bool:
    """The scalar leaf checks, vectorized over ``batch``; ``pages.visited`` and ``walk`` change only if all pass."""
    count, last = len(batch), pages.last
    if not all(2 <= visit[0] <= last for visit in batch):
        return False
    pgnos = np.fromiter((visit[0] for visit in batch), dtype=np.int64, count=count)
    if pages.visited[pgnos].any() or np.unique(pgnos).size != count:
        return False
    buffer = bytearray(count * pages.psize)
    if not read_pages(pages, pgnos, buffer):
        return False
    nodes = _node_table(buffer, pgnos, pages.psize)
    if nodes is None:
        return False
    last_key = _keys_pass(walk, batch, nodes)
    if last_key is None:
        return False
    covered = _overflow_runs(pages, pgnos, nodes)
    if covered is None:
        return False
    # all passed: commit
    pages.visited[covered] = 1
    walk.previous[0] = last_key
    pages.visited[pgnos] = 1
    walk.counts[1] += count
    walk.counts[2] += covered.size
    walk.counts[3] += nodes.key_at.size
    return True


def _node_table(buffer: bytearray, pgnos: _Ints, psize: int) -> _Nodes | None:
    """The nodes of the leaf pages in ``buffer`` when their headers, pointers and sizes pass, else None."""
    count, half_page = len(pgnos), psize // 2
    u8 = np.frombuffer(buffer, dtype=np.uint8)
    u16 = u8.view(np.uint16)
    rows = u16.reshape(count, half_page)
    head = u8.reshape(count, psize)[:, :8].copy().view(np.uint64)[:, 0]
    lower = rows[:, 6].astype(np.int64)
    upper = rows[:, 7].astype(np.int64)
    good = (head == pgnos.astype(np.uint64)) & (rows[:, 5] == P_LEAF) & (lower >= PAGEHDRSZ + 2)
    if not (good & (lower & 1 == 0) & (lower <= upper) & (upper <= psize)).all():
        return None
    # every node of the batch, in (page, index) order; u16 offsets into the whole buffer
    nodes = (lower - PAGEHDRSZ) >> 1
    total = int(nodes.sum())
    page = np.repeat(np.arange(count), nodes)
    starts = np.cumsum(nodes) - nodes
    lasts = starts + nodes - 1
    base = page * half_page
    pointer = u16[base + PAGEHDRSZ // 2 + np.arange(total) - starts[page]].astype(np.int64)
    if not ((pointer >= upper[page]) & (pointer <= psize - NODESIZE) & (pointer & 1 == 0)).all():
        return None
    header = u16[(base + (pointer >> 1))[:, None] + np.arange(4)].astype(np.int64)  # lo, hi, flags, ksize
    flags = header[:, 2]
    if (flags > F_BIGDATA).any():
        return None
    big = flags == F_BIGDATA
    size = header[:, 0] | header[:, 1] << 16
    ksize = header[:, 3]
    end = pointer + NODESIZE + ksize + np.where(big, PGNO.size, size)
    if (end > psize).any():
        return None
    if not _nodes_tile(pointer, end + (end & 1), page, upper, psize, starts, lasts):
        return None
    key_at = page * psize + pointer + NODESIZE
    return _Nodes(u8, memoryview(buffer), key_at, ksize, size, big, starts, lasts)


def _nodes_tile(
    pointer: _Ints, even_end: _Ints, page: _Ints, upper: _Ints, psize: int, starts: _Ints, lasts: _Ints
) -> bool:
    """Whether each page's nodes tile [upper, page end): sorted by offset, each starts where the previous ends."""
    inner = np.ones(pointer.size, dtype=bool)  # inner[j]: node j + 1 is on node j's page
    inner[lasts] = False
    pairs = inner[:-1]
    if (pointer[1:][pairs] < pointer[:-1][pairs]).all():
        # the usual layout (appended keys): node 0 at the page end, each next node right below it
        if not ((pointer[lasts] == upper).all() and (even_end[starts] == psize).all()):
            return False
        return bool((even_end[1:][pairs] == pointer[:-1][pairs]).all())
    order = np.lexsort((pointer, page))
    begins, ends = pointer[order], even_end[order]
    if not ((begins[starts] == upper).all() and (ends[lasts] == psize).all()):
        return False
    return bool((begins[1:][pairs] == ends[:-1][pairs]).all())


def _keys_pass(walk: WalkState, batch: list[Visit], nodes: _Nodes) -> bytes | None:
    """Keys strictly above the previous one and inside their page's bounds: the batch's last key, or None."""
    key_at, ksize, view = nodes.key_at, nodes.ksize, nodes.view
    total = key_at.size
    width = int(ksize[0])
    bounds = [walk.previous[0]] + [b for visit in batch for b in (visit[2], visit[3])]
    if (
        1 <= width <= 8
        and (ksize == width).all()
        and all(b is None or (isinstance(b, bytes) and len(b) == width) for b in bounds)
    ):
        # fixed-width keys (torchrecord's 8-byte big-endian indices): compare them as integers
        padded = np.zeros((total, 8), dtype=np.uint8)
        padded[:, 8 - width :] = nodes.u8[key_at[:, None] + np.arange(width)]
        values = padded.view(">u8")[:, 0].astype(np.uint64)
        if not (values[1:] > values[:-1]).all():
            return None
        as_int = [None if b is None else int.from_bytes(b, "big") for b in bounds]  # type: ignore[arg-type]
        if as_int[0] is not None and as_int[0] >= int(values[0]):
            return None
        firsts, lasts = values[nodes.starts].tolist(), values[nodes.lasts].tolist()
        for i in range(len(batch)):
            low, high = as_int[1 + 2 * i], as_int[2 + 2 * i]
            if (low is not None and firsts[i] < low) or (high is not None and lasts[i] >= high):
                return None
        at = int(key_at[total - 1])
        return bytes(view[at : at + int(ksize[total - 1])])
    keys = [bytes(view[a : a + k]) for a, k in zip(key_at.tolist(), ksize.tolist())]
    if not all(map(operator.lt, keys, keys[1:])):
        return None
    previous = walk.previous[0]
    if previous is not None and not previous < keys[0]:  # type: ignore[operator]
        return None
    for (_pgno, _level, low_key, high_key, _via), first, last in zip(
        batch, nodes.starts.tolist(), nodes.lasts.tolist()
    ):
        if low_key is not None and keys[first] < low_key:
            return None
        if high_key is not None and keys[last] >= high_key:
            return None
    return keys[-1]


def _overflow_runs(pages: Pages, pgnos: _Ints, nodes: _Nodes) -> _Ints | None:
    """The pages of the batch's overflow runs when they are inside the file, of overflow pages, long enough
    for their node's data and overlapping nothing (pages reached before, the batch's leaves, each other)."""
    runs = np.flatnonzero(nodes.big)
    if not runs.size:
        return np.zeros(0, dtype=np.int64)
    psize, last = pages.psize, pages.last
    firsts_u = nodes.u8[(nodes.key_at[runs] + nodes.ksize[runs])[:, None] + np.arange(8)].copy().view(np.uint64)[:, 0]
    if (firsts_u < 2).any() or (firsts_u > last).any():
        return None
    firsts = firsts_u.astype(np.int64)
    heads = bytearray(PAGEHDRSZ * runs.size)
    if not read_pages(pages, firsts, heads, PAGEHDRSZ):
        return None
    heads8 = np.frombuffer(heads, dtype=np.uint8).reshape(runs.size, PAGEHDRSZ)
    heads16 = heads8.view(np.uint16)
    lengths = heads8[:, 12:16].copy().view(np.uint32)[:, 0].astype(np.int64)
    if int(lengths.sum()) > last + 1:  # they would overlap; and this bounds the array below
        return None
    need = (PAGEHDRSZ - 1 + nodes.size[runs]) // psize + 1  # OVPAGES
    ok = (heads8[:, :8].copy().view(np.uint64)[:, 0] == firsts_u) & (heads16[:, 5] == P_OVERFLOW)
    if not (ok & (lengths >= need) & (firsts + lengths <= last + 1)).all():
        return None
    covered = np.repeat(firsts - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
    if pages.visited[covered].any() or np.isin(covered, pgnos).any() or np.unique(covered).size != covered.size:
        return None
    return np.asarray(covered, dtype=np.int64)


def read_pages(pages: Pages, pgnos: _Ints, buffer: bytearray, length: int = 0) -> bool:
    """Read ``length`` bytes (a whole page if 0) of each page into ``buffer``, one read per run
    of consecutive pages when whole pages are read; False if the file is shorter."""
    fd, psize = pages.fd, pages.psize
    view = memoryview(buffer)
    numbers = pgnos.tolist()
    if length:
        for i, pgno in enumerate(numbers):
            if os.preadv(fd, [view[i * length : (i + 1) * length]], pgno * psize) != length:
                return False
        return True
    i = 0
    while i < len(numbers):
        j = i + 1
        while j < len(numbers) and numbers[j] == numbers[j - 1] + 1:
            j += 1
        want = (j - i) * psize
        if os.preadv(fd, [view[i * psize : j * psize]], numbers[i] * psize) != want:
            return False
        i = j
    return True
