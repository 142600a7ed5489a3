"""Shared-memory batch slots: how a large batch leaves a DataLoader worker without a copy in the main process.

torch hands a batch's tensors from a worker to the main process one shared
segment per tensor, made afresh for every batch: a new segment, its pages
zero-filled in the worker and faulted in again in the main process, and a file
descriptor passed over a socket for each. For a batch that costs more than
building it.

Here each worker owns a few segments (``memfd`` files, Linux), created once.
The worker copies a batch into a free segment and yields a :class:`SlotBatch`;
pickled on its way to the main process it is only the segment's key, the
leaves' offsets, dtypes and shapes, and, the first time a segment is sent, its
file descriptor. The main process maps each segment once and builds the batch's
tensors as views of it, without a copy.

The rule that keeps batches valid: a segment is reused only once the main
process has let go of the batch in it, that is once every tensor of that batch
(and every view of one) is gone; the last one to go marks the segment free in
its shared header. A batch the user keeps stays valid for as long as it is
kept: the worker takes another segment meanwhile (so keeping every batch costs
the memory of every batch, as with torch's own handover). A batch that is never
sent (used inside the worker) frees its segment when the worker lets go of it.

Only the owner frees, once: the header is shared by every process forked from
the main process (a fork child, a fork DataLoader worker of another loader), and
each of them holds a copy of the batch's views. Each handover of a segment has a
number (its generation), written in the header while the batch is out; the
free is written only by the process that received the batch (its pid, kept by
an ``os.register_at_fork`` hook) and only while the header still holds that
handover's number. A copy dropped in another process, or a stale free of an
earlier handover, changes nothing. Each handover is one pickle: a batch
pickled a second time crosses as a plain batch.

Arenas: in a ``RecordLoader`` worker, the large batches of one bundle are gathered side by
side in one segment (:class:`_Arena`, field by field) and cross together as one stacked batch.
An arena's segment crosses only whole (:func:`arena_stacked`, then ``into_slot(...,
whole_arena=True)``): a batch of it that would cross alone is copied out first, so the rule
above (one receiver a handover, who frees all of it) holds. The arena shares the pool, the
segments and that rule with the slots, which is why it lives here and this module is long.

Descriptors: a segment is mapped without holding one
(``torchrecord._read.slot_maps``); the worker keeps its segment's descriptor
only until the main process took it with the first batch, so kept batches
hold none, in either process.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import reduction, resource_sharer  # noqa: F401  (DupFd's own lazy import needs a descriptor)
from typing import Any

import numpy as np
import torch

from torchrecord._core.structure import flatten, unflatten
from torchrecord._read import slot_maps
from torchrecord._read.slot_maps import mapped_keys, mapped_segments

__all__ = [
    "SlotBatch",
    "allocate",
    "allocate_batches",
    "arena_batches",
    "arena_stacked",
    "available",
    "bundle_arenas",
    "dtype_name",
    "dtype_of",
    "end_arena",
    "in_arena",
    "into_slot",
    "keep_spare",
    "mapped_keys",
    "mapped_segments",
    "room",
    "worker_segments",
]

#: the segment's header: its state (one int64), padded so the data starts 64-byte aligned
_HEADER = 64
_ALIGN = 64
#: segments are sized in steps of this many bytes (a batch a little larger than the last fits)
_GRANULE = 64 << 10
#: free segments a worker keeps beyond the ones in use; more are closed (smallest first)
_SPARE = 4


def available() -> bool:
    """Can this platform hand batches over in slots (it has ``memfd_create``)?"""
    return hasattr(os, "memfd_create")


# -- the worker's side --------------------------------------------------------------------------
class _Segment:
    """One shared-memory segment a worker owns: a header (its state) and room for one batch."""

    _ids = itertools.count()

    def __init__(self, capacity: int, nonce: int) -> None:
        self.capacity = capacity
        self.key = (slot_maps.pid(), nonce, next(self._ids))
        try:
            self.fd = os.memfd_create("torchrecord-batch", getattr(os, "MFD_CLOEXEC", 0))
        except OSError as exc:
            if slot_maps.out_of_descriptors(exc):
                raise slot_maps.descriptor_error("a DataLoader worker making a batch slot", exc) from None
            raise
        try:
            os.ftruncate(self.fd, _HEADER + capacity)
            self.block = slot_maps.map_shared(self.fd, _HEADER + capacity)
        except BaseException:
            os.close(self.fd)
            raise
        self.state = np.frombuffer(self.block, dtype=np.int64, count=1)
        self.address = ctypes.addressof(self.block) + _HEADER
        self.local_views = False  # a batch built in this segment is still held in the worker
        #: it holds a bundle's arena: it crosses only whole, as that bundle's stacked batches (arena_stacked),
        #: never one batch of it at a time (each handover of a segment has one receiver, who frees all of it)
        self.arena = False
        self.generation = 0  # handovers so far (the header holds the last one's while its batch is out)
        self.handoff: Any = None  # the descriptor waiting for the main process (sent with the first batch)

    def is_free(self) -> bool:
        return not self.local_views and int(self.state[0]) == slot_maps.FREE

    def ready_to_send(self) -> None:
        """Register the descriptor for the main process to take with this segment's first batch, and close it
        here. Done in the worker's own thread (not while the batch is pickled, in a queue's feeder thread), so
        that running out of descriptors is an error the DataLoader reports."""
        if self.fd < 0:
            return
        try:
            self.handoff = reduction.DupFd(self.fd)
        except OSError as exc:
            if slot_maps.out_of_descriptors(exc):
                raise slot_maps.descriptor_error("a DataLoader worker handing a batch slot over", exc) from None
            raise
        os.close(self.fd)
        self.fd = -1

    def close(self) -> None:
        """Let the segment go: it is unmapped once no view of it is left in this process."""
        self.state = np.empty(1, np.int64)
        self.block = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Arena:
    """One segment holding the batches of one bundle, field by field: field ``f`` of batch ``j`` at
    ``offsets[f] + j * rows * row_bytes[f]``, so that the bundle's batches stacked are views of it.

    A bundle of large batches then crosses as one :class:`~torchrecord._read.ipc.Stacked` batch in one
    segment, without a copy: one segment taken, one handover and one rebuild a bundle instead of a batch.
    """

    def __init__(self, pool: _Pool, rows: int, row_bytes: list[int], count: int) -> None:
        self.rows, self.row_bytes, self.count = rows, row_bytes, count
        self.offsets: list[int] = []
        end = 0
        for b in row_bytes:
            self.offsets.append(end)
            end += -(-(count * rows * b) // _ALIGN) * _ALIGN
        self.segment = pool.take(end)
        self.segment.arena = True
        owner = (ctypes.c_uint8 * max(end, 1)).from_buffer(self.segment.block, _HEADER)
        weakref.finalize(owner, _let_go_locally, self.segment)
        self.base = np.frombuffer(owner, dtype=np.uint8)  # type: ignore[call-overload]
        self.tensor = torch.from_numpy(self.base)
        self.end = end
        self.used = 0  # batches placed

    def next_batch(self) -> list[np.ndarray]:
        """The uint8 arrays [rows, b] of the next batch's fields."""
        return self.next_batches(1)

    def next_batches(self, count: int) -> list[np.ndarray]:
        """The uint8 arrays [count * rows, b] of the next ``count`` batches' fields (a field's batches lie one
        after another)."""
        j, rows = self.used, self.rows
        self.used += count
        return [
            self.base[o + j * rows * b : o + (j + count) * rows * b].reshape(count * rows, b)
            for o, b in zip(self.offsets, self.row_bytes)
        ]

    def stacked(self, columns: list[list[torch.Tensor]]) -> list[torch.Tensor] | None:
        """Each column (one leaf of every batch, in order) as one tensor [count, ...] over this arena, when the
        batches are this arena's, in place and in order; else None."""
        address = self.segment.address
        views = []
        for column in columns:
            head = column[0]
            size = head.nbytes
            start = head.data_ptr() - address
            if not size or start < 0 or start + len(column) * size > self.end:
                return None
            for j, leaf in enumerate(column):
                if leaf.data_ptr() != head.data_ptr() + j * size or not leaf.is_contiguous():
                    return None
            region = self.tensor[start : start + len(column) * size]
            typed = region if head.dtype is torch.uint8 else region.view(head.dtype)
            views.append(typed.view(len(column), *head.shape))
        return views


class _Pool:
    """The segments of one worker process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.nonce = int.from_bytes(os.urandom(8), "little")
        self.segments: list[_Segment] = []
        self.retired: list[tuple[int, int, int]] = []  # keys the main process may forget
        self.lock = threading.Lock()
        self.allocated: _Segment | None = None  # the segment of the last allocate(), until a batch takes it
        self.spare = _SPARE  # free segments kept beyond the ones in use
        self.arena_batches = 0  # batches a bundle holds, when bundles of large batches are gathered in arenas
        self.arena: _Arena | None = None  # the arena of the bundle being built

    def take(self, size: int) -> _Segment:
        """A free segment with room for ``size`` bytes (a new one when none is free)."""
        with self.lock:
            free = [s for s in self.segments if s.is_free()]
            fitting = [s for s in free if s.capacity >= size]
            if fitting:
                segment = min(fitting, key=lambda s: s.capacity)
            else:
                segment = _Segment(-(-max(size, 1) // _GRANULE) * _GRANULE, self.nonce)
                self.segments.append(segment)
            segment.local_views = True
            segment.arena = False
            # a segment whose descriptor waits for the main process stays (closing it would leak that one)
            spare = sorted((s for s in free if s is not segment and s.handoff is None), key=lambda s: s.capacity)
            for old in spare[: max(0, len(spare) - self.spare)]:
                self.segments.remove(old)
                self.retired.append(old.key)
                old.close()
            return segment


_pool: _Pool | None = None


def _worker_pool() -> _Pool:
    global _pool
    if _pool is None or _pool.pid != slot_maps.pid():  # a forked child never uses its parent's segments
        _pool = _Pool()
    return _pool


def keep_spare(count: int) -> None:
    """Keep at least ``count`` free segments in this worker rather than closing them: a worker that hands
    batches over in bundles gets a bundle's segments back at once and needs them again soon."""
    pool = _worker_pool()
    pool.spare = max(pool.spare, count)


def bundle_arenas(count: int) -> None:
    """Gather the batches of each bundle of ``count`` into one arena (:func:`allocate`); :func:`end_arena` after
    each bundle."""
    _worker_pool().arena_batches = count


def end_arena() -> None:
    """The bundle being built is complete: the next batch :func:`allocate` places starts a new arena."""
    _worker_pool().arena = None


def in_arena(leaves: list[Any]) -> bool:
    """Does the first tensor of ``leaves`` lie in the arena of the bundle being built?"""
    arena = _pool.arena if _pool is not None and _pool.pid == slot_maps.pid() else None
    if arena is None:
        return False
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            return 0 <= leaf.data_ptr() - arena.segment.address < arena.end
    return False


def arena_stacked(columns: list[list[torch.Tensor]]) -> list[torch.Tensor] | None:
    """The columns of a bundle's batches as stacked views of the arena they were gathered in (ready for
    :func:`into_slot` without a copy), or None when they are not exactly that arena's batches, in order."""
    pool = _worker_pool()
    arena = pool.arena
    if arena is None or not columns or len(columns[0]) != arena.used:
        return None
    views = arena.stacked(columns)
    if views is not None:
        pool.allocated = arena.segment
    return views


def worker_segments() -> int:
    """How many segments this process owns (for tests and diagnostics)."""
    return len(_pool.segments) if _pool is not None and _pool.pid == slot_maps.pid() else 0


def _is_slot_leaf(leaf: Any) -> bool:
    return isinstance(leaf, torch.Tensor) and leaf.is_cpu and not leaf.requires_grad


# -- dtypes cross as their names: a str pickles in a tenth of a torch.dtype's time (both handovers use them)
@functools.cache
def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).rpartition(".")[2]


class _DtypeNames(dict[str, torch.dtype]):
    """name -> torch dtype, filled on first use of each name."""

    def __missing__(self, name: str) -> torch.dtype:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            from torchrecord.errors import InternalError

            raise InternalError(f"a batch arrived from a worker with an unknown dtype {name!r}")
        self[name] = dtype
        return dtype


_DTYPES = _DtypeNames()


def dtype_of(name: str | torch.dtype) -> torch.dtype:
    """The dtype :func:`dtype_name` named (a dtype is returned as it is)."""
    return _DTYPES[name] if type(name) is str else name  # type: ignore[return-value]


def allocate(rows: int, row_bytes: list[int]) -> list[np.ndarray]:
    """uint8 arrays [rows, b] for each ``b`` of ``row_bytes``, in one free segment of this worker.

    A reader gathers a batch's fields straight into them; :func:`into_slot` then
    hands that batch over without copying it again. While bundles are gathered in arenas
    (:func:`bundle_arenas`), the arrays are the next batch's place in the bundle's arena.
    """
    pool = _worker_pool()
    if pool.arena_batches > 1:
        arena = pool.arena
        if arena is None or arena.used >= arena.count:
            arena = pool.arena = _Arena(pool, rows, row_bytes, pool.arena_batches)
        if (arena.rows, arena.row_bytes) == (rows, list(row_bytes)):
            pool.allocated = arena.segment
            return arena.next_batch()
    sizes = [rows * b for b in row_bytes]
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // _ALIGN) * _ALIGN
    segment = pool.take(end)
    owner = (ctypes.c_uint8 * max(end, 1)).from_buffer(segment.block, _HEADER)
    weakref.finalize(owner, _let_go_locally, segment)
    base = np.frombuffer(owner, dtype=np.uint8)  # type: ignore[call-overload]
    pool.allocated = segment
    return [base[o : o + size].reshape(rows, b) for o, size, b in zip(offsets, sizes, row_bytes)]


def arena_batches() -> int:
    """Batches a bundle's arena holds (:func:`bundle_arenas`; 0 where bundles are not gathered in arenas)."""
    pool = _pool if _pool is not None and _pool.pid == slot_maps.pid() else None
    return pool.arena_batches if pool is not None else 0


def allocate_batches(rows: int, row_bytes: list[int], count: int) -> tuple[list[np.ndarray], int] | None:
    """Room for up to ``count`` whole batches of ``rows`` rows in the arena of the bundle being built, gathered
    together: uint8 arrays [n * rows, b] for each ``b`` of ``row_bytes``, and n (at most what the arena has
    left). None where bundles are not gathered in arenas, or the arena being filled holds batches of another
    shape. Their bundle then crosses stacked without a copy (:func:`arena_stacked`).
    """
    pool = _worker_pool()
    if pool.arena_batches <= 1:
        return None
    arena = pool.arena
    if arena is None or arena.used >= arena.count:
        arena = pool.arena = _Arena(pool, rows, row_bytes, pool.arena_batches)
    elif (arena.rows, arena.row_bytes) != (rows, list(row_bytes)):
        return None
    n = min(count, arena.count - arena.used)
    pool.allocated = arena.segment
    return arena.next_batches(n), n


def room(sizes: list[int]) -> Callable[[tuple[int, ...], torch.dtype], torch.Tensor]:
    """Room in one free segment of this worker for tensors of ``sizes`` bytes: a function ``place(shape, dtype)``
    that hands out an empty tensor there, one after another (each 64-byte aligned).

    The collation of a batch stacks its leaves straight into them (``torch.stack(..., out=place(...))``);
    :func:`into_slot` then hands that batch over without copying it again. A request beyond the room, or
    of no bytes, gets a fresh tensor (the batch is then copied into a slot as usual).
    """
    end = sum(-(-size // _ALIGN) * _ALIGN for size in sizes)
    pool = _worker_pool()
    segment = pool.take(end)
    owner = (ctypes.c_uint8 * max(end, 1)).from_buffer(segment.block, _HEADER)
    weakref.finalize(owner, _let_go_locally, segment)
    base = torch.from_numpy(np.frombuffer(owner, dtype=np.uint8))  # type: ignore[call-overload]
    pool.allocated = segment
    cursor = 0

    def place(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nonlocal cursor
        size = _itemsize(dtype)
        for d in shape:
            size *= d
        at = cursor
        if not size or at + size > end:
            return torch.empty(shape, dtype=dtype)
        cursor = at + -(-size // _ALIGN) * _ALIGN
        raw = base[at : at + size]
        return (raw if dtype is torch.uint8 else raw.view(dtype)).view(shape)

    return place


@functools.cache
def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _in_place(pool: _Pool, leaves: list[Any], whole_arena: bool) -> tuple[_Segment, list[tuple[Any, ...]]] | None:
    """The last allocated segment and the leaves' specs in it, when every tensor leaf already lies there (an
    arena's segment only when ``whole_arena``: the batch is that arena's bundle, stacked)."""
    segment, pool.allocated = pool.allocated, None
    if segment is None or (segment.arena and not whole_arena):  # one batch of an arena: copied out of it
        return None
    specs: list[tuple[Any, ...]] = []
    for leaf in leaves:
        if not _is_slot_leaf(leaf):
            specs.append((leaf,))
            continue
        size = leaf.nbytes
        offset = leaf.data_ptr() - segment.address
        if size and (not leaf.is_contiguous() or offset < 0 or offset + size > segment.capacity):
            return None
        specs.append((max(offset, 0), size, dtype_name(leaf.dtype), tuple(leaf.shape)))
    return segment, specs


def into_slot(batch: Any, whole_arena: bool = False) -> Any:
    """``batch`` in one of this worker's segments, as a :class:`SlotBatch` (a dict stays a dict): copied there,
    or as it is when its tensors were gathered there (:func:`allocate`). ``whole_arena``: ``batch`` is what
    :func:`arena_stacked` gave (a bundle's arena, handed over whole)."""
    tree, leaves = flatten(batch)
    pool = _worker_pool()
    placed = _in_place(pool, leaves, whole_arena)
    if placed is not None:
        segment, specs = placed
        ref = _SlotRef.ready(segment, pool)
        if type(batch) is dict:
            return _SlotDict(batch, ref, tree, specs, leaves)
        return SlotBatch(batch, ref, tree, specs)
    specs = []
    end = 0
    for leaf in leaves:
        if _is_slot_leaf(leaf):
            size = leaf.nbytes
            specs.append((end, size, dtype_name(leaf.dtype), tuple(leaf.shape)))
            end += -(-size // _ALIGN) * _ALIGN
        else:
            specs.append((leaf,))
    segment = pool.take(end)
    owner = (ctypes.c_uint8 * max(end, 1)).from_buffer(segment.block, _HEADER)
    weakref.finalize(owner, _let_go_locally, segment)
    local = _views(owner, specs)
    for leaf, spec, view in zip(leaves, specs, local):
        if len(spec) > 1 and spec[1]:
            view.copy_(leaf)
    out = unflatten(tree, local)
    ref = _SlotRef.ready(segment, pool)
    if type(out) is dict:
        return _SlotDict(out, ref, tree, specs, local)
    return SlotBatch(out, ref, tree, specs)


def _let_go_locally(segment: _Segment) -> None:
    segment.local_views = False


@dataclass
class _SlotRef:
    """What the main process needs to find a batch's segment."""

    segment: _Segment
    pool: _Pool
    sent: bool = field(default=False)

    @classmethod
    def ready(cls, segment: _Segment, pool: _Pool) -> _SlotRef:
        """The reference of the batch just placed in ``segment``, its descriptor ready to go with it."""
        segment.ready_to_send()
        return cls(segment, pool)

    def for_pickle(self) -> tuple[Any, ...] | None:
        """What the main process rebuilds the batch from; None when this batch was handed over already (each
        handover has one receiver, who alone frees it: a second pickle crosses as a plain batch)."""
        segment, pool = self.segment, self.pool
        with pool.lock:
            if self.sent:
                return None
            self.sent = True
            fd, segment.handoff = segment.handoff, None
            segment.generation += 1
            generation = segment.generation
            segment.state[0] = generation  # out: only this handover's receiver frees it, when its last view goes
            retired, pool.retired = pool.retired, []
        return (segment.key, fd, segment.capacity, retired, generation)


def _plain(batch: Any) -> Any:
    return batch


class SlotBatch:
    """A batch (not a dict) whose tensors live in a worker's segment; unpickled, it is the plain batch."""

    def __init__(self, batch: Any, ref: _SlotRef, tree: Any, specs: list[tuple[Any, ...]]) -> None:
        self.batch, self._ref, self._tree, self._specs = batch, ref, tree, specs

    def __reduce__(self) -> tuple[Any, ...]:
        sent = self._ref.for_pickle()
        if sent is None:
            return (_plain, (self.batch,))
        return (_rebuild, (sent, self._tree, self._specs))


class _SlotDict(dict[str, Any]):
    """A dict batch in a segment: a dict for code in the worker, and pickled as a slot reference."""

    def __init__(
        self, batch: dict[str, Any], ref: _SlotRef, tree: Any, specs: list[tuple[Any, ...]], leaves: list[Any]
    ) -> None:
        super().__init__(batch)
        self._slot = (ref, tree, specs, leaves)

    def __reduce__(self) -> tuple[Any, ...]:
        ref, tree, specs, leaves = self._slot
        sent = ref.for_pickle() if _unchanged(self, tree, leaves) else None
        if sent is None:  # code in the worker changed the dict, or it crossed already: pickle it as a plain one
            return (dict, (dict(self),))
        return (_rebuild, (sent, tree, specs))

    def __copy__(self) -> _SlotDict:  # DataLoader's default_convert copies the dict: keep the mark
        return _SlotDict(dict(self), *self._slot)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        import copy

        return copy.deepcopy(dict(self), memo)


def _unchanged(batch: dict[str, Any], tree: Any, leaves: list[Any]) -> bool:
    """Does ``batch`` still hold exactly the leaves the slot was filled with (the same objects)?"""
    try:
        tree_now, leaves_now = flatten(dict(batch))
    except Exception:
        return False
    return tree_now == tree and len(leaves_now) == len(leaves) and all(a is b for a, b in zip(leaves_now, leaves))


# -- the main process's side --------------------------------------------------------------------
def _rebuild(ref: tuple[Any, ...], tree: Any, specs: list[tuple[Any, ...]]) -> Any:
    """The plain batch of a slot reference: tensors that are views of the mapped segment."""
    key, fd, capacity, retired, generation = ref
    mapping = slot_maps.receive(tuple(key), fd, _HEADER + capacity, retired)
    end = max((spec[0] + spec[1] for spec in specs if len(spec) > 1), default=0)
    owner = (ctypes.c_uint8 * max(end, 1)).from_buffer(mapping.block, _HEADER)
    slot_maps.watch(owner, mapping.state, generation)
    return unflatten(tree, _views(owner, specs))


def _views(owner: Any, specs: list[tuple[Any, ...]]) -> list[Any]:
    """The leaves of ``specs``: tensors as views of ``owner`` (a ctypes array over a segment), others as they are.

    Each tensor is one ``as_strided`` of a typed tensor over the whole segment (one per dtype): a third of
    the time of ``from_numpy`` and two ``view`` calls, which for batches of small tensors was most of the
    main process's time a batch.
    """
    typed: dict[str, torch.Tensor] = {}
    leaves: list[Any] = []
    for spec in specs:
        if len(spec) == 1:
            leaves.append(spec[0])
            continue
        offset, size, name, shape = spec
        dtype = dtype_of(name)
        if not size:
            leaves.append(torch.empty(shape, dtype=dtype))
            continue
        itemsize = _itemsize(dtype)
        numel = size // itemsize
        if offset % itemsize or numel * itemsize != size or math.prod(shape) != numel:
            leaves.append(_view_of_bytes(owner, offset, size, dtype, shape))
            continue
        whole = typed.get(name)
        if whole is None:
            whole = typed[name] = torch.frombuffer(owner, dtype=dtype, count=len(owner) // itemsize)
        leaves.append(whole.as_strided(shape, _contiguous_strides(shape), offset // itemsize))
    return leaves


def _view_of_bytes(owner: Any, offset: int, size: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor over ``size`` bytes of ``owner`` at ``offset``, through a uint8 view (any offset; checks the size)."""
    raw = torch.from_numpy(np.frombuffer(owner, dtype=np.uint8, count=size, offset=offset))
    return (raw if dtype is torch.uint8 else raw.view(dtype)).view(shape)


@functools.cache
def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (in elements) of a C-contiguous tensor of ``shape``."""
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))
