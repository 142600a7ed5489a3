"""Sources read row by row from arrays (NumPy, HDF5): the rows' shared length, storable leaves, streams."""

from __future__ import annotations

import dataclasses
import itertools
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._store.record_file import RecordFile
from torchrecord.convert._common import Target, write
from torchrecord.errors import IgnoredOptionWarning, SourceError

__all__ = ["RowStream", "common_length", "row_converter", "write_stream"]


def write_stream(stream: RowStream, target: Target, source_meta: dict[str, Any]) -> RecordFile:
    """:func:`write` for a :class:`RowStream`: any read error is fatal, whatever ``on_error`` says.

    A stream cannot skip past a read error, so it is written with
    ``on_error="raise"`` (and no ``max_skipped``); ``num_workers`` gives the
    ``IgnoredOptionWarning`` of an iterable source.
    """
    settings = target.settings
    if settings.num_workers > 0:
        warnings.warn(
            f"{os.fsdecode(target.path)}: num_workers={settings.num_workers} is ignored: the source is read as one "
            "stream in file order (members of a compressed .npz, or chunked HDF5 datasets, cannot be read at "
            "random); save it uncompressed (np.savez) or contiguous to read it in parallel",
            IgnoredOptionWarning,
            stacklevel=3,
        )
    settings = dataclasses.replace(settings, on_error="raise", max_skipped=None, num_workers=0)
    shard, num_shards = target.shard, target.num_shards
    if num_shards is not None and shard is not None:  # a shard writes its own rows: an iterable is one writer's part
        n, i = int(num_shards), int(shard)
        if 0 <= i < n:
            lo, hi = i * stream.length // n, (i + 1) * stream.length // n
            whole = stream
            stream = RowStream(hi - lo, lambda: itertools.islice(whole.open_rows(), lo, hi))
    return write(stream, dataclasses.replace(target, settings=settings), source_meta)


class RowStream:
    """An iterable over the rows of a source read in order (no ``__getitem__``).

    write_record treats it as an iterable: with ``shuffle=True`` it spools the
    encoded samples to a temporary file beside the output and copies them out in
    shuffled order, so memory stays bounded. ``open_rows`` is called afresh by
    each iteration. Write it with :func:`write_stream`: a stream cannot skip past a
    read error, so such an error always stops the conversion.
    """

    def __init__(self, length: int, open_rows: Callable[[], Iterator[Any]]) -> None:
        self.length = length
        self.open_rows = open_rows

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Any]:
        return self.open_rows()


def common_length(source: str, shapes: dict[str, tuple[int, ...]]) -> int:
    """The shared first (sample) dimension of the named arrays, or a SourceError saying why not."""
    if not shapes:
        raise SourceError(f"{source}: holds no arrays to convert")
    for name, shape in shapes.items():
        if len(shape) == 0:
            raise SourceError(
                f"{source}: array {name!r} is 0-d and has no sample axis; leave it out with keys=[...] (--keys)"
            )
    lengths = {name: int(shape[0]) for name, shape in shapes.items()}
    if len(set(lengths.values())) > 1:
        raise SourceError(
            f"{source}: the arrays disagree in their first (sample) dimension: {_by_length(lengths)}; every array "
            "needs one row per sample (choose arrays with keys=[...] / --keys)"
        )
    n = next(iter(lengths.values()))
    if n == 0:
        raise SourceError(f"{source}: the arrays have 0 rows; there is nothing to convert")
    return n


def _by_length(lengths: dict[str, int], shown: int = 3) -> str:
    """``'a' has 9 rows (and 4 more arrays), 'b' has 5 rows, ...``: a few arrays per length, a few lengths."""
    names: dict[int, list[str]] = {}
    for name, n in lengths.items():
        names.setdefault(n, []).append(name)
    parts = []
    for n, listed in list(names.items())[:shown]:
        more = f" (and {len(listed) - 1} more arrays)" if len(listed) > 1 else ""
        parts.append(f"{listed[0]!r} has {n} rows{more}")
    if len(names) > shown:
        parts.append(f"{len(names) - shown} more lengths")
    return ", ".join(parts)


def row_converter(source: str, name: str, dtype: np.dtype, ndim: int) -> Callable[[Any], Any]:
    """How to turn row ``i`` of a column into a storable leaf (numeric rows pass as they are).

    Numeric dtypes torchrecord stores pass unchanged; 1-d byte strings become ``bytes``
    and 1-d unicode strings ``str``; anything else is a SourceError naming the array.
    """
    if dtype.kind in "SU" and ndim == 1:
        return bytes if dtype.kind == "S" else str
    try:
        _dtypes.from_numpy(dtype)
    except TypeError:
        strings = " (strings are supported in 1-d arrays only)" if dtype.kind in "SU" else ""
        raise SourceError(
            f"{source}: array {name!r} has dtype {dtype}, which torchrecord cannot store{strings}; "
            "convert it or leave it out with keys=[...] (--keys)"
        ) from None
    return _identity


def _identity(value: Any) -> Any:
    return value
