"""The batch fast path: records of a fixed layout read in windows and gathered in bulk.

A reader walks its runs with one cursor (``buffers=True``: values are zero-copy
views of the LMDB map, valid while the read transaction lives), collects a
window of about ``window`` samples, checks every record against the layout's
template at once, and then emits batches by gathering each field's bytes for the
(shuffled) samples straight into fresh, contiguous batch arrays. Records that do
not match the template are re-encoded through the checked slow decoder first.
"""

from __future__ import annotations

import weakref
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from torchrecord._format import decode_key, encode_key
from torchrecord._layout import FixedLayout
from torchrecord.errors import ChecksumError, CorruptRecordError

__all__ = ["fixed_batches", "read_records"]

#: Records at least this long are gathered from their views one sample at a time
#: (one copy); shorter ones are first joined into one buffer (vectorized gather).
JOIN_LIMIT = 16 << 10


def read_records(cursor: Any, first: int, stop: int, path: str) -> list[Any]:
    """Values of records [first, stop) from a positioned-anywhere cursor, checked for gaps."""
    if not cursor.set_range(encode_key(first)) or decode_key(cursor.key()) != first:
        raise CorruptRecordError(f"{path}: record {first} is missing")
    values = list(islice(cursor.iternext(keys=False, values=True), stop - first))
    last = cursor.key()
    if len(values) != stop - first or not len(last) or decode_key(last) != stop - 1:
        raise CorruptRecordError(f"{path}: records {first} to {stop - 1} are not all present")
    return values


def check_crcs(values: Sequence[Any], crcs: Sequence[Any], first: int, path: str) -> None:
    """Raise ChecksumError for the first value whose CRC-32 differs from the stored one."""
    for i, (value, stored) in enumerate(zip(values, crcs)):
        if zlib.crc32(value) != int.from_bytes(stored, "little"):
            raise ChecksumError(f"{path}: record {first + i}: CRC-32 mismatch (the record is corrupt)")


class _Window:
    """Whole records in one fixed layout, ready for gathering samples (record, row)."""

    def __init__(
        self, layout: FixedLayout, joined: np.ndarray | None, views: list[np.ndarray] | None, buffer: np.ndarray
    ) -> None:
        self.layout = layout
        self.buffer = buffer  # the builder's storage, recycled once this window is gone
        n, length, k = 0, layout.length, layout.rows
        if joined is not None:
            n = len(joined)
            self.fields = [
                as_strided(joined[:, off:], shape=(n, k, size), strides=(length, size, 1), writeable=False)
                for off, size in zip(layout.offsets, layout.sample_bytes)
            ]
        self.views = views

    def gather(self, rec: np.ndarray, row: np.ndarray) -> list[np.ndarray]:
        """Per field, a fresh (len(rec), sample_bytes) uint8 array of the chosen samples."""
        if self.views is None:
            return [field[rec, row] for field in self.fields]
        out = []
        views = self.views
        for off, size in zip(self.layout.offsets, self.layout.sample_bytes):
            dst = np.empty((len(rec), size), np.uint8)
            for i, (r, j) in enumerate(zip(rec.tolist(), row.tolist())):
                start = off + j * size
                dst[i] = views[r][start : start + size]
            out.append(dst)
        return out


class _WindowBuilder:
    """Collects whole records for one window and checks them against the layout.

    Short records are copied one by one into a preallocated buffer (one copy out
    of the map, no per-record objects kept alive); long ones are kept as views.
    A record of the wrong length, the short final chunk, or one whose header
    bytes differ from the template is replaced by its checked canonical encoding.
    """

    def __init__(self, layout: FixedLayout, buffer: np.ndarray, count: int, path: str) -> None:
        self.layout, self.count, self.path = layout, count, path
        self.joined = layout.length < JOIN_LIMIT
        self.buffer = buffer
        self.views: list[Any] = []
        self.records: list[int] = []  # first record index of each piece
        self.pieces: list[int] = []  # record count of each piece
        self.held = 0  # records held
        self.odd: dict[int, Any] = {}  # row -> original value of a record of the wrong length

    def add(self, cursor: Any, crc_cursor: Any, first: int, stop: int) -> int:
        """Append records [first, stop); returns the row of the first one."""
        row0 = self.held
        n = stop - first
        if not cursor.set_range(encode_key(first)) or decode_key(cursor.key()) != first:
            raise CorruptRecordError(f"{self.path}: record {first} is missing")
        values = islice(cursor.iternext(keys=False, values=True), n)
        if self.joined:
            self._copy_in(values, row0, n)
        else:
            self.views.extend(values)
        last = cursor.key()
        if self.held + n != (row0 + n) or not len(last) or decode_key(last) != stop - 1 or self._short(row0, n):
            raise CorruptRecordError(f"{self.path}: records {first} to {stop - 1} are not all present")
        if crc_cursor is not None:
            self._check_crcs(crc_cursor, first, stop, row0)
        self.records.append(first)
        self.pieces.append(n)
        self.held += n
        return row0

    def _copy_in(self, values: Iterator[Any], row0: int, n: int) -> None:
        length = self.layout.length
        if (row0 + n) * length > len(self.buffer):
            grown = np.empty((row0 + n) * length, np.uint8)
            grown[: row0 * length] = self.buffer[: row0 * length]
            self.buffer = grown
        out = self.buffer.data
        pos = row0 * length
        i = -1
        for i, value in enumerate(values):
            try:
                out[pos : pos + length] = value
            except ValueError:  # wrong length: keep it aside for the checked decoder
                self.odd[row0 + i] = bytes(value)
            pos += length
        self._copied = i + 1

    def _short(self, row0: int, n: int) -> bool:
        got = self._copied if self.joined else len(self.views) - row0
        return got != n

    def _check_crcs(self, crc_cursor: Any, first: int, stop: int, row0: int) -> None:
        stored = read_records(crc_cursor, first, stop, self.path)
        length = self.layout.length
        for i, crc in enumerate(stored):
            row = row0 + i
            if self.joined:
                value = self.odd.get(row) or self.buffer.data[row * length : (row + 1) * length]
            else:
                value = self.views[row]
            if zlib.crc32(value) != int.from_bytes(crc, "little"):
                raise ChecksumError(f"{self.path}: record {first + i}: CRC-32 mismatch (the record is corrupt)")

    def record_index(self, row: int) -> int:
        for first, n in zip(self.records, self.pieces):
            if row < n:
                return first + row
            row -= n
        raise IndexError(row)

    def finish(self) -> _Window:
        layout, k = self.layout, self.layout.rows
        partial = self.count // k if self.count % k else -1  # the short final chunk, if any
        suspects = set(self.odd)
        if partial >= 0:
            suspects.update(r for r in range(self.held) if self.record_index(r) == partial)
        if self.joined:
            joined = np.frombuffer(self.buffer, np.uint8, count=self.held * layout.length)
            joined = joined.reshape(self.held, layout.length)
            bad = np.flatnonzero((joined[:, layout.header_cols] != layout.header).any(axis=1))
            suspects.update(int(r) for r in bad)
            if suspects:
                joined = joined.copy()
                for row in suspects:
                    joined[row] = np.frombuffer(self._canonical(row, self.odd.get(row, joined[row])), np.uint8)
            return _Window(layout, joined, None, self.buffer)
        views = [np.frombuffer(v, np.uint8) for v in self.views]
        for row, view in enumerate(views):
            if len(view) != layout.length or (view[layout.header_cols] != layout.header).any():
                suspects.add(row)
        for row in suspects:
            views[row] = np.frombuffer(self._canonical(row, self.views[row]), np.uint8)
        return _Window(layout, None, views, self.buffer)

    def _canonical(self, row: int, value: Any) -> bytes:
        record = self.record_index(row)
        rows = min(self.layout.rows, self.count - record * self.layout.rows)
        data = value.tobytes() if isinstance(value, np.ndarray) else value
        return self.layout.canonical(data, record, rows, f"{self.path}: record {record}")


def _windows(
    txn: Any,
    db: Any,
    crc_db: Any,
    runs: Sequence[tuple[int, int]],
    layout: FixedLayout,
    count: int,
    target: int,
    path: str,
) -> Iterator[tuple[_Window, np.ndarray, np.ndarray]]:
    """Windows of whole records covering the runs, with their sample coordinates."""
    k = layout.rows
    cursor = txn.cursor(db=db)
    crc_cursor = txn.cursor(db=crc_db) if crc_db is not None else None

    capacity = (-(-target // k) + 2) * layout.length if layout.length < JOIN_LIMIT else 0
    recycled: list[tuple[np.ndarray, weakref.ref[_Window]]] = []

    def builder() -> _WindowBuilder:
        # reuse the storage of a window nobody holds any more: no fresh pages to fault in
        for i, (buffer, window) in enumerate(recycled):
            if window() is None:
                del recycled[i]
                return _WindowBuilder(layout, buffer, count, path)
        return _WindowBuilder(layout, np.empty(capacity, np.uint8), count, path)

    def finish(build: _WindowBuilder) -> _Window:
        window = build.finish()
        recycled.append((window.buffer, weakref.ref(window)))
        return window

    build = builder()
    recs: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    held = 0
    for start, stop in runs:
        pos = start
        while pos < stop:
            end = min(stop, pos + max(target - held, 1))
            first, last = pos // k, (end - 1) // k + 1
            end = min(stop, last * k)
            row0 = build.add(cursor, crc_cursor, first, last)
            samples = np.arange(pos, end, dtype=np.int64)
            recs.append(samples // k - first + row0)
            rows.append(samples % k)
            held += end - pos
            pos = end
            if held >= target:
                yield finish(build), *_cat(recs, rows)
                build, recs, rows, held = builder(), [], [], 0
    if held:
        yield finish(build), *_cat(recs, rows)


def _cat(recs: list[np.ndarray], rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate(recs), np.concatenate(rows)


def fixed_batches(
    txn: Any,
    db: Any,
    runs: Sequence[tuple[int, int]],
    layout: FixedLayout,
    count: int,
    *,
    path: str,
    batch_size: int,
    window: int,
    rng: np.random.Generator | None,
    drop_last: bool,
    crc_db: Any = None,
) -> Iterator[list[np.ndarray]]:
    """Yield batches as per-field uint8 arrays of shape (B, sample_bytes), in visiting order.

    Samples are mixed within each window by ``rng`` (None keeps run order). The
    transaction ``txn`` must be a read transaction opened with ``buffers=True``
    and stay open while batches are produced.
    """
    pending: deque[tuple[_Window, np.ndarray, np.ndarray]] = deque()
    held = 0
    for win, rec, row in _windows(txn, db, crc_db, runs, layout, count, max(window, batch_size), path):
        if rng is not None:
            order = rng.permutation(len(rec))
            rec, row = rec[order], row[order]
        pending.append((win, rec, row))
        held += len(rec)
        while held >= batch_size:
            yield _take(pending, batch_size)
            held -= batch_size
    if held and not drop_last:
        yield _take(pending, held)


def _take(pending: deque[tuple[_Window, np.ndarray, np.ndarray]], size: int) -> list[np.ndarray]:
    parts: list[list[np.ndarray]] = []
    while size:
        win, rec, row = pending[0]
        n = min(size, len(rec))
        parts.append(win.gather(rec[:n], row[:n]))
        if n == len(rec):
            pending.popleft()
        else:
            pending[0] = (win, rec[n:], row[n:])
        size -= n
    if len(parts) == 1:
        return parts[0]
    return [np.concatenate(column) for column in zip(*parts)]
