"""How a batch crosses from a DataLoader worker: the one handover every torchrecord dataset uses.

:func:`for_parent` picks, by the batch's bytes of tensors: by value through the
worker's pipe up to :data:`BY_VALUE_LIMIT`, above it a shared-memory slot of the
worker (``torchrecord._read.slots``: the main process maps it once and takes the
batch without a copy; where the platform has no ``memfd_create``, one shared
block per batch instead). The rule a user sees is in docs/reading.md
("Workers: how batches reach the main process").

A worker sends each CPU tensor of a batch through its own shared-memory
segment (and, with torch's default ``file_descriptor`` strategy, its own file
descriptor handed over a socket to a thread of the worker). For batches of a few
kilobytes that per-tensor cost dominates: a batch of five small tensors crossed
at about half the rate of the same tensors packed as views of one storage
(measured on the project machine with two workers). :func:`one_storage` repacks
such a batch.

Below :data:`BY_VALUE_LIMIT` even one segment costs more than the bytes:
:func:`by_value` wraps the batch so that it pickles as one buffer through the
worker's pipe, and unpickles in the main process as the plain batch again
(tensors that are views of one writable buffer). :func:`for_parent` picks.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from torchrecord._core.structure import flatten, unflatten
from torchrecord._read import slots
from torchrecord.errors import ArgumentError

__all__ = [
    "BY_VALUE_LIMIT",
    "Bundle",
    "HANDOVER_ENV",
    "PACK_LIMIT",
    "Stacked",
    "arena_places",
    "bundled",
    "by_value",
    "for_parent",
    "handover_choice",
    "keep_bundles",
    "one_storage",
    "slot_allocator",
    "slot_room",
    "stacked",
    "worker_id",
]

#: batches up to this many bytes of tensors are repacked (above it, the copy costs more than it saves)
PACK_LIMIT = 4 << 20
#: batches up to this many bytes of tensors cross by value, through the pipe; larger ones in a slot
#: (``python -m benchmarks.handover_sizes`` compares the two by size).
BY_VALUE_LIMIT = 64 << 10

_ALIGN = 64


def one_storage(batch: Any) -> Any:
    """``batch`` with its CPU tensors replaced by equal copies that are views of one uint8 storage.

    Batches whose tensors hold more than :data:`PACK_LIMIT` bytes, or hold
    fewer than two tensors, are returned as they are.
    """
    tree, leaves = flatten(batch)
    tensors = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu"]
    if len(tensors) < 2:
        return batch
    sizes = [leaves[i].numel() * leaves[i].element_size() for i in tensors]
    if sum(sizes) > PACK_LIMIT:
        return batch
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // _ALIGN) * _ALIGN
    block = torch.empty(end, dtype=torch.uint8)
    out = list(leaves)
    for i, offset, size in zip(tensors, offsets, sizes):
        leaf = leaves[i]
        view = block[offset : offset + size].view(leaf.dtype).view(leaf.shape)
        view.copy_(leaf)
        out[i] = view
    return unflatten(tree, out)


#: the environment variable that overrides the choice: ``slot``, ``value`` or ``torch`` (torch's own
#: handover, one shared segment per tensor); unset or ``auto``: by size
HANDOVER_ENV = "TORCHRECORD_HANDOVER"
_CHOICES = ("auto", "slot", "value", "torch")


def for_parent(batch: Any) -> Any:
    """``batch`` ready to leave a DataLoader worker: :func:`by_value`, a slot, or :func:`one_storage`, by size
    (or as :data:`HANDOVER_ENV` says)."""
    _, leaves = flatten(batch)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.is_cpu]
    if not tensors:
        return batch
    choice = handover_choice()
    if choice == "torch":
        return batch
    size = sum(t.nbytes for t in tensors)
    if choice == "value" or (choice == "auto" and size <= BY_VALUE_LIMIT):
        return by_value(batch)
    if slots.available():
        return slots.into_slot(batch)
    return one_storage(batch)


class Bundle:
    """Consecutive batches of one worker, handed over as one DataLoader item; ``RecordLoader`` yields them one
    by one. The DataLoader's fixed cost per item (its queues, their threads, pickling) is then paid once for
    all of them, on both sides. ``worker`` is the DataLoader worker that made it: a DataLoader takes one
    item from each worker in turn (worker 0 first), so a round of bundles ends where the worker number
    stops growing.
    """

    __slots__ = ("batches", "worker")

    def __init__(self, batches: Any, worker: int) -> None:
        self.batches: list[Any] = batches
        self.worker = worker

    def __reduce__(self) -> tuple[Any, ...]:
        return (_received, (self.batches, self.worker))

    def pin_memory(self) -> Bundle:
        """The bundle with its batches' tensors in pinned memory (the DataLoader's pin-memory thread calls it)."""
        from torch.utils.data._utils.pin_memory import pin_memory

        return Bundle([pin_memory(batch) for batch in self.batches], self.worker)  # type: ignore[no-untyped-call]


def _received(batches: Any, worker: int) -> Bundle:
    """A bundle as the main process unpickles it: its batches one by one (a :class:`Stacked` one split)."""
    return Bundle(batches.split() if type(batches) is Stacked else batches, worker)


class Stacked:
    """The small batches of one bundle as one batch: each leaf stacked across them (``[count, ...]``).

    They cross as one batch of a few tensors, where a list of ``count`` batches crossed as ``count`` times as
    many, each rebuilt in the main process by its own ``as_strided``; :meth:`split` gives them back with one
    ``unbind`` a leaf. Built by :func:`stacked` in a worker.
    """

    __slots__ = ("count", "leaves", "tree")

    def __init__(self, tree: Any, count: int, leaves: Any) -> None:
        self.tree, self.count, self.leaves = tree, count, leaves

    def __reduce__(self) -> tuple[Any, ...]:
        return (Stacked, (self.tree, self.count, self.leaves))

    def split(self) -> list[Any]:
        """The batches: batch ``j``'s leaves are the ``j``-th rows of the stacked ones (views, not copies)."""
        columns = [leaf.unbind(0) for leaf in self.leaves]
        return [unflatten(self.tree, [column[j] for column in columns]) for j in range(self.count)]


def stacked(batches: list[Any]) -> Stacked | None:
    """``batches`` as one :class:`Stacked` batch ready to leave the worker (stacked straight into the slot it
    leaves in, when it crosses in one); None unless they share one structure, every leaf a CPU tensor with
    the same dtype and shape in each (the last, short batch of an epoch, or variable shapes, cross as a
    list)."""
    tree, first = flatten(batches[0])
    if not first or not all(_stackable(leaf) for leaf in first):
        return None
    flat = _flat_columns(batches, first)
    if flat is not None:  # the usual batch, a flat tuple, list or dict of tensors: a column in one step
        columns = flat
        for column in columns:
            head = column[0]
            spec = (head.dtype, head.shape, True, False)
            for leaf in column:
                if type(leaf) is not torch.Tensor or (leaf.dtype, leaf.shape, leaf.is_cpu, leaf.requires_grad) != spec:
                    return None  # what the loop below decides for such a leaf
    else:
        columns = [[leaf] for leaf in first]
        for batch in batches[1:]:
            other, leaves = flatten(batch)
            if other != tree or len(leaves) != len(first):
                return None
            for column, leaf in zip(columns, leaves):
                head = column[0]
                if not _stackable(leaf) or leaf.dtype != head.dtype or leaf.shape != head.shape:
                    return None
                column.append(leaf)
    count = len(batches)
    in_place = slots.arena_stacked(columns) if slots.available() else None
    if in_place is not None:  # gathered in the bundle's arena: its batches stacked already, handed over whole
        return Stacked(tree, count, slots.into_slot(in_place, whole_arena=True))
    place = slot_room([count * column[0].nbytes for column in columns])
    out = []
    for column in columns:
        head = column[0]
        if place is None:
            out.append(torch.stack(column))
        else:
            out.append(torch.stack(column, out=place((count, *head.shape), head.dtype)))
    return Stacked(tree, count, for_parent(out))


def _flat_columns(batches: list[Any], first: list[Any]) -> list[list[Any]] | None:
    """Each leaf of every batch, by leaf, when every batch is, like the first, a tuple, list or dict (the same
    keys, in the same order) whose items are its leaves (``first``); else None (and the caller flattens each
    batch). An item that is no leaf (a nested structure, a list of numbers) differs from the first batch's
    tensor, so the caller's checks of each leaf refuse it as flattening would."""
    head = batches[0]
    kind = type(head)
    if kind is tuple or kind is list:
        items = list(head)
        if len(items) != len(first) or any(a is not b for a, b in zip(items, first)):
            return None
        if any(type(batch) is not kind or len(batch) != len(items) for batch in batches):
            return None
        return [list(column) for column in zip(*batches)]
    if kind is dict:
        keys = list(head)
        if len(keys) != len(first) or any(head[key] is not leaf for key, leaf in zip(keys, first)):
            return None
        if any(type(batch) is not dict or list(batch) != keys for batch in batches):
            return None
        return [[batch[key] for batch in batches] for key in keys]
    return None


def _stackable(leaf: Any) -> bool:
    """A plain CPU tensor (a subclass would come back as a plain tensor, a tensor needing grad without it)."""
    return type(leaf) is torch.Tensor and leaf.is_cpu and not leaf.requires_grad


def worker_id() -> int:
    """This process's DataLoader worker number (0 outside a worker)."""
    info = get_worker_info()
    return info.id if info is not None else 0


def keep_bundles(size: int) -> None:
    """This worker keeps the slots of its bundles of ``size`` batches: the bundles queued and the one being
    built come back a bundle at a time, and are needed again soon (instead of closed and made anew)."""
    if slots.available():
        slots.keep_spare(4 * size + 4)


def bundled(items: Iterator[Any], size: int) -> Iterator[Bundle]:
    """``items`` (batches) in bundles of ``size``, ready to leave the worker.

    Batches above :data:`BY_VALUE_LIMIT` leave one by one through
    :func:`for_parent` as they are made (a batch gathered straight into a slot
    stays there); smaller ones are collected and cross together, each leaf
    stacked across them where they stack (:func:`stacked`), else as a list.
    Large batches a reader gathers with ``slots.allocate`` lie in one arena a
    bundle (``torchrecord._read.slots.bundle_arenas``), field by field, so they
    cross together too, stacked without a copy: one segment, one handover and
    one rebuild a bundle.
    """
    keep_bundles(size)
    if slots.available():
        slots.bundle_arenas(size)  # large batches a reader gathers with slots.allocate: in one arena a bundle
    _end_arena()  # a bundle left unfinished (an epoch cut short) is not continued
    worker = worker_id()
    handed: list[Any] = []  # batches through for_parent, one by one
    small: list[Any] = []  # batches that cross together at the end of the bundle
    try:
        for item in items:
            if small or (not handed and _together_kind(item)):
                small.append(item)
            else:
                handed.append(for_parent(item))
            if len(handed) + len(small) == size:
                yield Bundle(_together(small) if small else handed, worker)
                handed, small = [], []
                _end_arena()  # the next bundle's batches go to an arena of their own
        if handed or small:
            yield Bundle(_together(small) if small else handed, worker)
    finally:
        _end_arena()


def _end_arena() -> None:
    """The next batch ``slots.allocate`` places starts a new arena (where the platform has slots)."""
    if slots.available():
        slots.end_arena()


def _together_kind(batch: Any) -> bool:
    """Does ``batch`` cross with the rest of its bundle: small enough to cross by value, or gathered in the
    bundle's arena (``torchrecord._read.slots.allocate``)?"""
    leaves = flatten(batch)[1]
    size = sum(leaf.nbytes for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.is_cpu)
    return size <= BY_VALUE_LIMIT or (slots.available() and slots.in_arena(leaves))


def _together(batches: list[Any]) -> Any:
    """Small batches ready to cross together: as one :class:`Stacked` batch where they stack, else as a list."""
    return (stacked(batches) if len(batches) > 1 else None) or for_parent(batches)


def slot_allocator(batch_bytes: int) -> Callable[[int, list[int]], list[np.ndarray]] | None:
    """Where a worker should gather a batch of ``batch_bytes`` so that :func:`for_parent` need not copy it:
    :func:`torchrecord._read.slots.allocate` when the batch will cross in a slot, else None (fresh arrays)."""
    return slots.allocate if _in_a_slot(batch_bytes) else None


def arena_places(rows: int, row_bytes: list[int], count: int) -> tuple[list[np.ndarray], int] | None:
    """Where a worker should gather up to ``count`` small batches at once (``rows`` rows of ``row_bytes``
    bytes a field) so that their bundle crosses stacked without a copy: places in the bundle's arena
    (:func:`torchrecord._read.slots.allocate_batches`) when bundles are gathered in arenas and a bundle of such
    batches crosses in a slot; else None (fresh arrays, stacked into a slot when the bundle is complete)."""
    bundle = slots.arena_batches() if slots.available() else 0
    if bundle <= 1 or not _in_a_slot(bundle * rows * sum(row_bytes)):
        return None
    return slots.allocate_batches(rows, row_bytes, count)


def slot_room(sizes: list[int]) -> Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None:
    """Where a worker should stack a batch whose tensors hold ``sizes`` bytes so that :func:`for_parent` need
    not copy it: room in a slot (:func:`torchrecord._read.slots.room`) when the batch will cross in one, else
    None (fresh memory). The ``room`` a collation takes (``torchrecord._core.kinds.Room``)."""
    return slots.room(sizes) if _in_a_slot(sum(sizes)) else None


def _in_a_slot(batch_bytes: int) -> bool:
    """Will a batch of ``batch_bytes`` of tensors cross in a slot (:func:`for_parent`'s rule)?"""
    if not slots.available():
        return False
    choice = handover_choice()
    return choice == "slot" or (choice == "auto" and batch_bytes > BY_VALUE_LIMIT)


def handover_choice() -> str:
    """The handover :data:`HANDOVER_ENV` asks for (``auto`` when unset); an unknown value is an error."""
    choice = os.environ.get(HANDOVER_ENV, "auto") or "auto"
    if choice not in _CHOICES:
        raise ArgumentError(f"{HANDOVER_ENV}={choice!r}: expected one of {', '.join(_CHOICES)}")
    return choice


def by_value(batch: Any) -> Any:
    """``batch`` marked to pickle as one buffer; unpickling gives back an equal plain batch (see the module doc).

    A dict stays a dict (a subclass holding the same items), so a ``collate_fn``
    the DataLoader applies in the worker sees the batch it expects; whatever it
    returns crosses as usual. Anything else is wrapped.
    """
    if type(batch) is dict:
        return _ByValueDict(batch)
    return _ByValue(*flatten(batch))


class _ByValueDict(dict[str, Any]):
    """A dict batch that pickles as :class:`_ByValue` (and unpickles as a plain dict)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _ByValue(*flatten(dict(self))).__reduce__()

    def __copy__(self) -> _ByValueDict:  # copy.copy (DataLoader's default_convert) keeps the mark, packs nothing
        return _ByValueDict(self)


class _ByValue:
    """A flattened batch whose pickle is its CPU tensors' bytes in one buffer, plus everything else pickled.

    Kept cheap per batch (it runs once per batch in the worker, and its rebuild in the main process):
    dtypes travel as their names, and the buffer is joined from the tensors' bytes in one call.
    """

    def __init__(self, tree: Any, leaves: list[Any]) -> None:
        self.tree, self.leaves = tree, leaves

    def __reduce__(self) -> tuple[Any, ...]:
        specs: list[tuple[Any, ...]] = []
        parts: list[Any] = []
        end = 0
        for leaf in self.leaves:
            if isinstance(leaf, torch.Tensor) and leaf.is_cpu and not leaf.requires_grad:
                size = leaf.nbytes
                specs.append((end, size, slots.dtype_name(leaf.dtype), tuple(leaf.shape)))
                if size:
                    parts.append(_as_bytes(leaf))
                    pad = -size % _ALIGN
                    if pad:
                        parts.append(_PAD[:pad])
                end += -(-size // _ALIGN) * _ALIGN
            else:
                specs.append((leaf,))
        return (_rebuild, (self.tree, specs, bytearray().join(parts)))


#: padding between the tensors of a by-value buffer (each starts _ALIGN-aligned in it)
_PAD = bytes(_ALIGN)


def _rebuild(tree: Any, specs: list[tuple[Any, ...]], buffer: bytearray) -> Any:
    """The plain batch of a :class:`_ByValue` pickle: its tensors are views of ``buffer``."""
    leaves: list[Any] = []
    for spec in specs:
        if len(spec) == 1:
            leaves.append(spec[0])
            continue
        offset, size, name, shape = spec
        dtype = slots.dtype_of(name)
        if size:
            tensor = torch.from_numpy(_view(buffer, offset, dtype, shape))
            leaves.append(tensor if tensor.dtype == dtype else tensor.view(dtype))
        else:
            leaves.append(torch.empty(shape, dtype=dtype))
    return unflatten(tree, leaves)


def _as_bytes(tensor: torch.Tensor) -> Any:
    """``tensor``'s bytes as a buffer ``bytearray.join`` takes (a view of it where it can be)."""
    if tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg():
        try:
            return tensor.numpy().data.cast("B")
        except TypeError:  # a dtype NumPy lacks: its bit pattern
            pass
    return np.ascontiguousarray(_as_numpy(tensor)).data.cast("B")


@functools.cache
def _holder(dtype: torch.dtype) -> tuple[np.dtype[Any], torch.dtype]:
    """The NumPy dtype that carries ``dtype``'s items, and its torch twin: the same type, or for types
    NumPy lacks (bfloat16, float8, ...) unsigned integers of their width (the bit pattern)."""
    probe = torch.empty(0, dtype=dtype)
    try:
        return probe.numpy().dtype, dtype
    except TypeError:
        bits = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}[probe.element_size()]
        return torch.empty(0, dtype=bits).numpy().dtype, bits


def _view(buffer: bytearray, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """``buffer[offset:]`` as a NumPy array of ``dtype``'s items (its bit pattern for types NumPy lacks)."""
    count = 1
    for d in shape:
        count *= d
    return np.frombuffer(buffer, _holder(dtype)[0], count, offset).reshape(shape)


def _as_numpy(tensor: torch.Tensor) -> np.ndarray:
    """``tensor``'s values as a NumPy array (a view where it can be): its bit pattern for types NumPy lacks."""
    tensor = tensor.detach().resolve_conj().resolve_neg()  # a lazily conjugated or negated view: its values
    carrier = _holder(tensor.dtype)[1]
    if carrier != tensor.dtype:
        tensor = tensor.contiguous().view(carrier)
    return tensor.numpy()
