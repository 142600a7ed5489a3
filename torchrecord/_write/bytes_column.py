"""Columns of many samples' values, as the fast writer takes them: typed arrays, and BytesColumn for strings.

A ``bytes`` or ``str`` field's values have variable lengths; a :class:`BytesColumn`
holds them as offsets into one or several buffers (an Arrow ``BinaryArray``'s own
buffers, read without a copy), in any order (a shuffled batch), and is copied
once, into the records, by ``record_fill.fill_var_records``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["BytesColumn", "Column", "concat_columns"]

#: buffer[slice], mapped over several buffers
_GET: Any = operator.getitem


@dataclass(slots=True, eq=False)
class BytesColumn:
    """The values of a ``bytes`` or ``str`` field of n samples: value i is ``data[starts[i] : starts[i] + lengths[i]]``.

    ``data`` may be a whole source buffer (an Arrow array's data buffer, read
    without a copy) and the values in any order (a shuffled batch); or several
    buffers, value i then being in ``data[which[i]]`` (rows of several Arrow
    record batches, joined without a copy). ``text``: the producer checked every
    value is UTF-8 (a ``str`` field takes no other). Pickled compacted: only the
    values' own bytes travel to another process.
    """

    data: np.ndarray | tuple[np.ndarray, ...]
    starts: np.ndarray
    lengths: np.ndarray
    text: bool = False
    which: np.ndarray | None = None
    #: memoryviews of several buffers, made once and shared by the columns taken from this one
    _sources: tuple[memoryview, ...] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, values: Sequence[bytes], text: bool = False) -> BytesColumn:
        """The column of Python bytes values (one join)."""
        lengths = np.fromiter(map(len, values), np.int64, len(values))
        return cls(np.frombuffer(b"".join(values), np.uint8), _starts(lengths), lengths, text)

    @classmethod
    def from_offsets(
        cls, data: np.ndarray, offsets: np.ndarray, rows: np.ndarray | None = None, text: bool = False
    ) -> BytesColumn:
        """Rows ``rows`` (default: all) of a column given as Arrow-style ``offsets`` [m + 1] into ``data``."""
        lo, hi = (offsets[:-1], offsets[1:]) if rows is None else (offsets[rows], offsets[rows + 1])
        return cls(data, lo.astype(np.int64), (hi - lo).astype(np.int64), text)

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def nbytes(self) -> int:
        return int(self.lengths.sum())

    def _buffer(self, i: int) -> np.ndarray:
        if isinstance(self.data, np.ndarray):
            return self.data
        assert self.which is not None, "several buffers come with which"
        return self.data[int(self.which[i])]

    def take(self, index: Any) -> BytesColumn:
        """The values at ``index`` (a slice or an integer array), sharing the buffers."""
        which = self.which[index] if self.which is not None else None
        return BytesColumn(self.data, self.starts[index], self.lengths[index], self.text, which, self._sources)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.take(index)
        if isinstance(index, tuple):  # column[i, ...], as for the arrays
            index = index[0]
        start = int(self.starts[index])
        return self._buffer(index)[start : start + int(self.lengths[index])].tobytes()

    def values(self) -> list[bytes]:
        """Every value as Python bytes."""
        return [self[i] for i in range(len(self))]

    def views(self) -> list[memoryview]:
        """Every value as a memoryview of its buffer (no copy), made in C-level loops."""
        ends = (self.starts + self.lengths).tolist()
        cuts = map(slice, self.starts.tolist(), ends)
        if isinstance(self.data, np.ndarray):
            return list(map(self.data.data.__getitem__, cuts))
        assert self.which is not None, "several buffers come with which"
        if self._sources is None:
            self._sources = tuple(d.data for d in self.data)
        return list(map(_GET, map(self._sources.__getitem__, self.which.tolist()), cuts))

    def copy_into(self, out: np.ndarray, at: np.ndarray) -> None:
        """``out[at[i] : at[i] + lengths[i]] = value i`` for every i: one slice copy each."""
        dst = out.data
        for a, view in zip(at.tolist(), self.views()):
            dst[a : a + len(view)] = view

    def compact(self) -> BytesColumn:
        """The same values, held contiguously in their order in a buffer of their own (one join)."""
        data = np.frombuffer(b"".join(self.views()), np.uint8)
        return BytesColumn(data, _starts(self.lengths), self.lengths.copy(), self.text)

    @staticmethod
    def concat(parts: Sequence[BytesColumn]) -> BytesColumn:
        """The values of ``parts``, one after another (sharing their buffers: no copy)."""
        buffers: list[np.ndarray] = []
        sources: list[memoryview] = []
        which = []
        for part in parts:
            held = part.data if isinstance(part.data, tuple) else (part.data,)
            own = part.which if part.which is not None else np.zeros(len(part), np.int64)
            which.append(own + len(buffers))
            buffers += held
            sources += part._sources if part._sources is not None else [h.data for h in held]
        return BytesColumn(
            tuple(buffers),
            np.concatenate([p.starts for p in parts]),
            np.concatenate([p.lengths for p in parts]),
            all(p.text for p in parts),
            np.concatenate(which),
            tuple(sources),
        )

    def __reduce__(self) -> tuple[Any, ...]:
        c = self.compact()
        return (BytesColumn, (c.data, c.starts, c.lengths, c.text))


def _starts(lengths: np.ndarray) -> np.ndarray:
    """Where each of values of these lengths starts when they are laid end to end."""
    starts = np.zeros(len(lengths), np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], out=starts[1:])
    return starts


#: A field's column: a typed array [n, ...] for numbers, a BytesColumn for bytes and str.
Column = np.ndarray | BytesColumn


def concat_columns(parts: Sequence[Column]) -> Column:
    """Columns of consecutive samples, joined."""
    if isinstance(parts[0], BytesColumn):
        return BytesColumn.concat(parts)  # type: ignore[arg-type]
    return np.concatenate(parts)  # type: ignore[arg-type]
