"""Whole record sets in memory, and batches drawn from tensors without a DataLoader.

When the data fits in memory (host or GPU) and the model is small, a
``DataLoader(TensorDataset)`` spends most of its time indexing and collating one
sample at a time. :func:`load` reads a record set once into ``[N, ...]`` tensors;
:class:`BatchIter` then draws shuffled batches with one ``index_select`` per field
per batch, and :class:`GroupBatchIter` draws batches of whole groups (queries and
their candidates, for list-wise ranking losses). Both run in the calling process,
on the tensors' device, with no worker processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from torchrecord import _dtypes
from torchrecord._columns import Columns, SampleList, epoch_rng
from torchrecord._group_batches import GroupPlan, check_offsets, offsets_from_ids, plan_epoch
from torchrecord._structure import Tree, unflatten
from torchrecord.dataset import RecordDataset
from torchrecord.errors import CorruptRecordError
from torchrecord.record_file import RecordFile
from torchrecord.schema import Field, Schema

__all__ = ["BatchIter", "GroupBatchIter", "SampleList", "load"]

#: Streams of :func:`torchrecord._columns.epoch_rng`, one per kind of shuffle.
_SAMPLE_STREAM = 0x73616D70
_GROUP_STREAM = 0x67727570
#: load() reads about this many bytes of samples per chunk.
_CHUNK_BYTES = 8 << 20
#: ... unless each sample takes at least this many bytes: then the whole set is one chunk.
_WHOLE_SET_SAMPLE_BYTES = 16 << 10

Subset = slice | range | Sequence[int] | np.ndarray | torch.Tensor


def load(
    path: str | os.PathLike[str],
    *,
    fields: str | Sequence[str] | None = None,
    subset: Subset | None = None,
    device: str | torch.device = "cpu",
) -> Any:
    """Read a whole record set (or some fields, or some samples) into memory in one sequential pass.

    The result has the structure of one sample, with every field as a column:
    fixed-shape numeric fields (tensors, arrays, ints, floats, bools) as one
    tensor ``[N, *shape]`` of the field's dtype; strings, bytes and fields whose
    shape varies as a :class:`SampleList` of N items of the kind they were written
    as. Hand it to :class:`BatchIter` or :class:`GroupBatchIter`; for a grouped set,
    ``RecordFile(path).groups`` gives the offsets for ``GroupBatchIter``.

    Args:
        path: a record set written by :func:`torchrecord.write_record`.
        fields: names of the fields to keep (``RecordFile(path).schema.names``:
            ``"0"``, ``"image"``, ``"meta.id"``); the others are left out of the
            result (containers left empty disappear). ``None`` keeps all.
        subset: the samples to keep, in this order: a ``range``, a ``slice``
            (clipped as Python slices are), an integer index array (negative
            indices count from the end; repeats allowed) or a boolean mask of
            length N. ``None`` keeps all.
        device: where the tensors are put (``"cuda"`` for data that fits on the GPU).

    Returns:
        The columns, in the structure of a sample.

    Raises:
        ValueError: an unknown field, an empty choice, an index out of range, or
            an empty record set (it has no schema to load).
        torchrecord.errors.FormatError: the file is not a readable record set.

    Example:
        >>> images, labels = load("train.tr", device="cuda")          # doctest: +SKIP
        >>> for x, y in BatchIter((images, labels), batch_size=256):  # doctest: +SKIP
        ...     ...
    """
    record_file = RecordFile(path)
    schema = record_file.schema
    count = len(record_file)
    if not schema.fields:
        raise ValueError(f"{record_file.path}: the record set holds no samples (and so no schema): nothing to load")
    keep = _chosen_fields(schema, fields, record_file.path)
    rows = _subset_rows(subset, count)
    size = count if rows is None else len(rows)
    target = torch.device(device)
    columns = [_allocate(schema.fields[i], size, target) for i in keep]
    if size:
        columns = _fill(columns, keep, rows, record_file.path, schema, count, target)
    tree = _prune(schema.tree, set(keep), iter(range(len(schema.fields))))
    assert tree is not None
    return unflatten(tree, columns)


def _read_chunks(path: str, schema: Schema, chunk: int) -> Iterator[list[Any]]:
    """The record set in stored order, ``chunk`` samples at a time, as columns in schema field order.

    The one place where :func:`load` reads. It uses batch-mode RecordDataset
    (the fixed-layout fast path where the schema allows) in the calling process.
    """
    dataset = RecordDataset(path, shuffle=False, batch_size=chunk, rank=0, world_size=1)
    for batch in dataset:
        yield _leaf_columns(schema.tree, batch)


def _fill(
    columns: list[Any],
    keep: list[int],
    rows: np.ndarray | None,
    path: str,
    schema: Schema,
    count: int,
    device: torch.device,
) -> list[Any]:
    """Copy each chunk's chosen fields (and rows) into the preallocated columns; returns the columns.

    When one chunk holds the whole set and every row is wanted, the chunk's own
    fresh columns are the result (no second copy).
    """
    if rows is not None:
        order = np.argsort(rows, kind="stable")
        wanted = rows[order]
        last = int(wanted[-1])
    start = 0
    for chunk in _read_chunks(path, schema, _chunk_size(schema, count)):
        stop = start + len(chunk[0])
        if rows is None and start == 0 and stop == count:
            return [_adopt(out, chunk[i], device) for out, i in zip(columns, keep)]
        if rows is None:
            for out, i in zip(columns, keep):
                _copy_rows(out, chunk[i], slice(start, stop), None, device)
        else:
            lo, hi = np.searchsorted(wanted, [start, stop])
            if hi > lo:
                dest = torch.from_numpy(order[lo:hi])
                src = torch.from_numpy(wanted[lo:hi] - start)
                for out, i in zip(columns, keep):
                    _copy_rows(out, chunk[i], dest, src, device)
            if stop > last:
                return columns
        start = stop
    if start != count:
        raise CorruptRecordError(f"{path}: read {start} samples, the metadata says {count}")
    return columns


def _adopt(out: Any, column: Any, device: torch.device) -> Any:
    """``column`` (a whole chunk) as the result in place of ``out``, copied only if it must move."""
    if isinstance(out, torch.Tensor):
        assert isinstance(column, torch.Tensor) and column.shape == out.shape and column.dtype == out.dtype
        return column.to(device)
    _copy_rows(out, column, slice(0, len(out)), None, device)
    return out


def _copy_rows(
    out: Any, column: Any, dest: slice | torch.Tensor, src: torch.Tensor | None, device: torch.device
) -> None:
    if isinstance(out, torch.Tensor):
        assert isinstance(column, torch.Tensor)
        if src is None:
            out[dest].copy_(column)
        else:
            assert isinstance(dest, torch.Tensor)
            out.index_copy_(0, dest.to(device), column.index_select(0, src).to(device))
        return
    items = column if src is None else [column[j] for j in src.tolist()]
    if device.type != "cpu":
        items = [x.to(device) if isinstance(x, torch.Tensor) else x for x in items]
    positions = range(dest.start, dest.stop) if isinstance(dest, slice) else dest.tolist()
    for position, item in zip(positions, items):
        out[position] = item


def _allocate(fld: Field, size: int, device: torch.device) -> Any:
    if fld.is_fixed:
        shape = tuple(int(d) for d in fld.shape if d is not None)
        return torch.empty((size, *shape), dtype=_dtypes.by_name(fld.dtype).torch, device=device)
    return SampleList([None] * size)


def _chunk_size(schema: Schema, count: int) -> int:
    """Samples per chunk: about ``_CHUNK_BYTES``, or the whole set when samples are large.

    Today's reader gathers records of 16 KiB or more straight from the LMDB map
    into the batch, so one batch of the whole set costs one copy and no window
    buffer; smaller records go through a window buffer, which chunks keep small.
    """
    sample_bytes = 0
    for fld in schema.fields:
        if fld.is_fixed:
            sample_bytes += int(np.prod([d or 0 for d in fld.shape])) * _dtypes.by_name(fld.dtype).itemsize
        else:
            sample_bytes += 1024  # a guess: strings and varying shapes
    if sample_bytes >= _WHOLE_SET_SAMPLE_BYTES:
        return max(count, 1)
    return int(min(max(count, 1), max(256, _CHUNK_BYTES // max(sample_bytes, 1))))


def _leaf_columns(tree: Tree, batch: Any) -> list[Any]:
    """The leaves of a batch in schema order (a list-valued leaf is one column, not a container)."""
    out: list[Any] = []

    def walk(node: Tree, value: Any) -> None:
        if node["t"] == "leaf":
            out.append(value)
            return
        children = [value[k] for k in node["k"]] if node["t"] == "dict" else list(value)
        for child, item in zip(node["c"], children):
            walk(child, item)

    walk(tree, batch)
    return out


def _chosen_fields(schema: Schema, fields: str | Sequence[str] | None, path: str) -> list[int]:
    names = schema.names
    if fields is None:
        return list(range(len(names)))
    wanted = [fields] if isinstance(fields, str) else list(fields)
    if not wanted:
        raise ValueError("fields=[] chooses no field; name at least one, or pass fields=None for all")
    unknown = [f for f in wanted if f not in names]
    if unknown:
        raise ValueError(f"{path} has no field {unknown[0]!r}; its fields are {names}")
    chosen = set(wanted)
    return [i for i, name in enumerate(names) if name in chosen]


def _prune(tree: Tree, keep: set[int], numbers: Iterator[int]) -> Tree | None:
    """``tree`` with only the leaves numbered in ``keep``; containers left empty are removed."""
    if tree["t"] == "leaf":
        return tree if next(numbers) in keep else None
    kids = [_prune(child, keep, numbers) for child in tree["c"]]
    kept = [i for i, kid in enumerate(kids) if kid is not None]
    if not kept:
        return None
    pruned: Tree = {"t": tree["t"], "c": [kids[i] for i in kept]}
    if tree["t"] == "dict":
        pruned["k"] = [tree["k"][i] for i in kept]
    return pruned


def _subset_rows(subset: Subset | None, count: int) -> np.ndarray | None:
    """``subset`` as int64 row numbers in [0, count), checked; None for all rows."""
    if subset is None:
        return None
    if isinstance(subset, slice):
        return np.arange(*subset.indices(count), dtype=np.int64)
    if isinstance(subset, range):
        rows = np.arange(subset.start, subset.stop, subset.step, dtype=np.int64)
    else:
        rows = np.asarray(subset.cpu() if isinstance(subset, torch.Tensor) else subset)
    if rows.ndim != 1:
        raise ValueError(f"subset must be 1-D (a range, slice, index array or mask), got shape {list(rows.shape)}")
    if rows.dtype == np.bool_:
        if len(rows) != count:
            raise ValueError(f"a boolean subset must have one entry per sample ({count}), got {len(rows)}")
        return np.flatnonzero(rows)
    if rows.size == 0:
        return np.zeros(0, np.int64)
    if rows.dtype.kind not in "iu":
        raise ValueError(f"subset must hold integer indices or booleans, got dtype {rows.dtype}")
    rows = rows.astype(np.int64)
    bad = np.flatnonzero((rows < -count) | (rows >= count))
    if len(bad):
        raise ValueError(
            f"subset index {rows[bad[0]]} (position {bad[0]}) is out of range for {count} samples; "
            f"indices must be in [{-count}, {count})"
        )
    return np.where(rows < 0, rows + count, rows)


def _check_count(name: str, value: int | None, *, minimum: int = 1) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


class BatchIter:
    """Shuffled mini-batches of in-memory tensors, one ``index_select`` per field per batch.

    Each epoch visits the rows in one seeded permutation (a pure function of
    ``seed`` and the epoch: :meth:`set_epoch` picks the epoch, as with
    ``DistributedSampler``; iterating again without it repeats the order) and
    yields batches in the structure of ``data``. Every batch is made of fresh
    tensors, so it stays valid after the next step. Everything runs in the calling
    process on the tensors' device, with no worker processes: use it instead of
    ``DataLoader(TensorDataset(...))`` when the data fits in memory.

    Args:
        data: what :func:`load` returns, or any tensor, tuple (named tuples too),
            list or dict of tensors with the same first dimension, nested. A
            :class:`SampleList` leaf is batched item by item; a plain list is a
            container of fields.
        batch_size: rows per batch (the last one may be smaller).
        shuffle: visit the rows in a new seeded order each epoch; ``False``
            keeps the stored order.
        seed: the base seed (an int >= 0); each (seed, epoch) has its own
            independent permutation.
        drop_last: leave out the last batch when it is smaller than ``batch_size``.

    ``len()`` is the exact number of batches per epoch.

    Example:
        >>> x, y = torch.randn(1000, 16), torch.randint(0, 10, (1000,))
        >>> batches = BatchIter((x, y), batch_size=64, seed=1)
        >>> for epoch in range(2):
        ...     batches.set_epoch(epoch)
        ...     for xb, yb in batches:
        ...         pass
        >>> len(batches), xb.shape
        (16, torch.Size([40, 16]))
    """

    def __init__(
        self, data: Any, batch_size: int, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False
    ) -> None:
        _check_count("batch_size", batch_size)
        _check_count("seed", seed, minimum=0)
        self.columns = Columns(data)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration produces (an int >= 0)."""
        _check_count("epoch", epoch, minimum=0)
        self.epoch = epoch

    def __len__(self) -> int:
        full, rest = divmod(self.columns.rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def order(self) -> np.ndarray:
        """The rows this epoch visits, in order (int64; without the rows ``drop_last`` leaves out)."""
        rows = self.columns.rows
        if self.shuffle:
            order = epoch_rng(self.seed, self.epoch, _SAMPLE_STREAM).permutation(rows)
        else:
            order = np.arange(rows, dtype=np.int64)
        return order[: min(rows, len(self) * self.batch_size)]

    def __iter__(self) -> Iterator[Any]:
        order = self.order()
        if not len(order):
            return
        take = self.columns.take
        for indices in zip(*self.columns.index_splits(order, self.batch_size)):
            yield take(indices)


class GroupBatchIter:
    """Shuffled batches of whole groups of in-memory samples, with the group offsets inside each batch.

    The samples of a group (a query and its candidates, a user and their events)
    are contiguous rows of ``data``. Each epoch visits the groups in one seeded
    permutation (a pure function of ``seed`` and the epoch; :meth:`set_epoch`),
    keeps each group's rows in their stored order, and cuts the sequence into
    batches of whole groups: ``groups_per_batch`` groups each, or as many groups
    as fit in ``max_samples`` rows (a group bigger than that forms a batch alone).
    Every sample is in exactly one batch per epoch (unless ``drop_last``), and the
    whole plan is built with array operations (no Python loop per sample or per
    group). Each item is ``(batch, offsets)``: the batch in the structure of
    ``data`` (fresh tensors), and int64[g+1] offsets of its g groups within it
    (``offsets[0] == 0``, ``offsets[-1] == len(batch)``), on the data's device.

    Args:
        data: as for :class:`BatchIter`.
        groups: group offsets, int64[G+1] (``groups[0] == 0``, ``groups[-1] == N``,
            strictly increasing), as ``RecordFile.groups`` gives them; group g is
            rows ``[groups[g], groups[g+1])``.
        group_ids: instead of ``groups``, one integer id per row; rows with equal
            ids must be contiguous (an id that reappears later raises ValueError
            naming it and both row ranges).
        groups_per_batch: whole groups per batch (the last batch may hold fewer).
        max_samples: instead of ``groups_per_batch``, fill each batch with whole
            groups while it holds at most this many rows.
        shuffle: visit the groups in a new seeded order each epoch.
        seed: the base seed (an int >= 0); each (seed, epoch) has its own
            independent permutation.
        drop_last: leave out the last batch when it holds fewer than
            ``groups_per_batch`` groups (fewer than ``max_samples`` rows).

    ``len()`` is the exact number of batches of the current epoch (with
    ``max_samples`` it depends on the epoch's order).

    Example:
        >>> x = torch.randn(10, 4)
        >>> groups = torch.tensor([0, 3, 5, 9, 10])  # 4 groups: rows 0-2, 3-4, 5-8, 9
        >>> it = GroupBatchIter((x,), groups, groups_per_batch=2, shuffle=False)
        >>> [(len(xb), offsets.tolist()) for (xb,), offsets in it]
        [(5, [0, 3, 5]), (5, [0, 4, 5])]
    """

    def __init__(
        self,
        data: Any,
        groups: Any = None,
        *,
        group_ids: Any = None,
        groups_per_batch: int | None = None,
        max_samples: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if (groups is None) == (group_ids is None):
            raise ValueError("give either groups= (offsets, int64[G+1]) or group_ids= (one id per row), not both")
        if (groups_per_batch is None) == (max_samples is None):
            raise ValueError("give either groups_per_batch= or max_samples=, exactly one of them")
        _check_count("groups_per_batch", groups_per_batch)
        _check_count("max_samples", max_samples)
        _check_count("seed", seed, minimum=0)
        self.columns = Columns(data)
        rows = self.columns.rows
        self.offsets = check_offsets(groups, rows) if groups is not None else offsets_from_ids(group_ids, rows)
        self.groups_per_batch = groups_per_batch
        self.max_samples = max_samples
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._plan: tuple[int, GroupPlan] | None = None

    @property
    def num_groups(self) -> int:
        """G, the number of groups."""
        return len(self.offsets) - 1

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration produces (an int >= 0)."""
        _check_count("epoch", epoch, minimum=0)
        self.epoch = epoch

    def plan(self) -> GroupPlan:
        """The current epoch's rows in visiting order and its batch boundaries (cached per epoch)."""
        if self._plan is None or self._plan[0] != self.epoch:
            permutation = None
            if self.shuffle:
                permutation = epoch_rng(self.seed, self.epoch, _GROUP_STREAM).permutation(self.num_groups)
            plan = plan_epoch(
                self.offsets,
                permutation,
                groups_per_batch=self.groups_per_batch,
                max_samples=self.max_samples,
                drop_last=self.drop_last,
            )
            self._plan = (self.epoch, plan)
        return self._plan[1]

    def __len__(self) -> int:
        return len(self.plan().batch_sizes)

    def __iter__(self) -> Iterator[tuple[Any, torch.Tensor]]:
        plan = self.plan()
        take = self.columns.take
        offsets = torch.split(torch.tensor(plan.offsets, device=self.columns.device), plan.offsets_sizes)
        indices = zip(*self.columns.index_splits(plan.order, plan.batch_sizes))
        for index, inner in zip(indices, offsets):
            yield take(index), inner
