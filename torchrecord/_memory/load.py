"""How :func:`torchrecord.load` reads a record set into preallocated [N, ...] columns.

One sequential pass over the set (:func:`_read_chunks` is the only place that
reads), chunk by chunk, copying the chosen fields and rows into tensors
allocated once from the schema; strings and fields of varying shape go into
:class:`SampleList` columns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.schema import Field, Schema
from torchrecord._core.structure import Tree, unflatten
from torchrecord._memory.columns import SampleList
from torchrecord._read.dataset import RecordDataset
from torchrecord._read.reader import ShareReader
from torchrecord._shards.open import SetLike, open_set
from torchrecord._store.record_set import RecordSet
from torchrecord.errors import ArgumentError, CorruptRecordError

__all__ = ["Subset", "host_empty", "load_columns"]

#: load() reads about this many bytes of samples per chunk...
_CHUNK_BYTES = 8 << 20
#: ... unless each sample takes at least this many bytes: then the whole set is one chunk.
_WHOLE_SET_SAMPLE_BYTES = 16 << 10

Subset = slice | range | Sequence[int] | np.ndarray | torch.Tensor


def load_columns(
    path: SetLike,
    *,
    fields: str | Sequence[str] | None,
    subset: Subset | None,
    device: str | torch.device,
) -> Any:
    """The chosen fields and rows of the set at ``path`` as columns (see :func:`torchrecord.load`)."""
    record_file = open_set(path)
    schema = record_file.schema
    count = len(record_file)
    if not schema.fields:
        raise ArgumentError(f"{record_file.path}: the record set holds no samples (and so no schema): nothing to load")
    keep = _chosen_fields(schema, fields, record_file.path)
    rows = _subset_rows(subset, count)
    size = count if rows is None else len(rows)
    target = torch.device(device)
    columns = [_allocate(schema.fields[i], size, target) for i in keep]
    if size:
        columns = _fill(columns, keep, rows, record_file, schema, count, target)
    tree = _prune(schema.tree, set(keep), iter(range(len(schema.fields))))
    assert tree is not None
    return unflatten(tree, columns)


def _read_chunks(path: RecordSet, schema: Schema, chunk: int) -> Iterator[list[Any]]:
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
    record_file: RecordSet,
    schema: Schema,
    count: int,
    device: torch.device,
) -> list[Any]:
    """Copy each chunk's chosen fields (and rows) into the preallocated columns; returns the columns.

    When one chunk holds the whole set and every row is wanted, the chunk's own
    fresh columns are the result (no second copy).
    """
    if rows is None:
        direct = _fill_direct(columns, keep, record_file, schema, count, device)
        if direct is not None:
            return direct
    if rows is not None:
        order = np.argsort(rows, kind="stable")
        wanted = rows[order]
        last = int(wanted[-1])
    start = 0
    path = record_file.path
    for chunk in _read_chunks(record_file, schema, _chunk_size(schema, count)):
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


def _fill_direct(
    columns: list[Any], keep: list[int], record_file: RecordSet, schema: Schema, count: int, device: torch.device
) -> list[Any] | None:
    """Read every sample straight into the result columns: each sample copied once, window to result.

    For a set with a fixed layout when every row is wanted (the common case): the
    reader gathers each window's samples into their rows of the preallocated
    columns (``ShareReader.indexed_chunks(out=...)``), with no chunk arrays in
    between. Returns None (nothing read) when the set has no fixed layout or a
    column is not a tensor; for another device the samples are read into CPU
    columns first, then copied into the device's.
    """
    dataset = RecordDataset(record_file, shuffle=False, batch_size=1, rank=0, world_size=1)
    layout = dataset._fixed_layout()
    if layout is None or not all(isinstance(c, torch.Tensor) for c in columns):
        return None
    cpu = torch.device("cpu")
    host = columns if device == cpu else [_allocate(schema.fields[i], count, cpu) for i in keep]
    dest: list[np.ndarray | None] = [None] * len(schema.fields)
    for column, i in zip(host, keep):
        if column.numel() * column.element_size() != count * layout.sample_bytes[i]:
            return None  # cannot happen: the layout and the schema describe the same bytes
        dest[i] = column.view(torch.uint8).reshape(count, layout.sample_bytes[i]).numpy()
    reader = ShareReader(dataset.file, dataset.share(0, 1), layout=layout, verify=False)
    filled = 0
    try:
        for _, indices in reader.indexed_chunks(_chunk_size(schema, count), 0, out=dest):
            filled += len(indices)
    finally:
        dataset.file._let_go(hard=False)
    if filled != count:
        raise CorruptRecordError(f"{record_file.path}: read {filled} samples, the metadata says {count}")
    if device != cpu:  # into the columns already allocated there: no second device copy
        for column, staged in zip(columns, host):
            column.copy_(staged)
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
        shape = (size, *(int(d) for d in fld.shape if d is not None))
        dtype = _dtypes.by_name(fld.dtype).torch
        if device.type == "cpu":
            return host_empty(shape, dtype)
        return torch.empty(shape, dtype=dtype, device=device)
    return SampleList([None] * size)


def host_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor whose memory comes from NumPy's allocator.

    The result of :func:`torchrecord.load` is new memory the size of the set, and
    on Linux touching it first is what costs: NumPy asks for transparent huge
    pages for large arrays (``madvise``), torch's allocator does not, and writing
    1.2 GB of fresh memory took 0.121 s against 0.683 s with ``torch.empty`` in
    ``python -m benchmarks.memory`` (2 MiB pages instead of 4 KiB page faults).
    Same tensor otherwise (it keeps its NumPy buffer alive; any dtype, bfloat16
    included, through a byte view).
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.from_numpy(np.empty(count * itemsize, np.uint8))
    return raw.view(dtype).view(shape)


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
        raise ArgumentError("fields=[] chooses no field; name at least one, or pass fields=None for all")
    unknown = [f for f in wanted if f not in names]
    if unknown:
        raise ArgumentError(f"{path} has no field {unknown[0]!r}; its fields are {names}")
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
        raise ArgumentError(f"subset must be 1-D (a range, slice, index array or mask), got shape {list(rows.shape)}")
    if rows.dtype == np.bool_:
        if len(rows) != count:
            raise ArgumentError(f"a boolean subset must have one entry per sample ({count}), got {len(rows)}")
        return np.flatnonzero(rows)
    if rows.size == 0:
        return np.zeros(0, np.int64)
    if rows.dtype.kind not in "iu":
        raise ArgumentError(f"subset must hold integer indices or booleans, got dtype {rows.dtype}")
    rows = rows.astype(np.int64)
    bad = np.flatnonzero((rows < -count) | (rows >= count))
    if len(bad):
        raise ArgumentError(
            f"subset index {rows[bad[0]]} (position {bad[0]}) is out of range for {count} samples; "
            f"indices must be in [{-count}, {count})"
        )
    return np.where(rows < 0, rows + count, rows)
