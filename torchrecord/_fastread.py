"""The batch fast path: records of a fixed layout read in windows and gathered in bulk.

A reader walks its runs with one cursor (``buffers=True``: values are zero-copy
views of the LMDB map, valid while the read transaction lives), collects a
window of about ``window`` samples, checks every record against the layout's
template at once, and then emits batches by gathering each field's bytes for the
(shuffled) samples straight into fresh, contiguous batch arrays. Records that do
not match the template are re-encoded through the checked slow decoder first.
"""

from __future__ import annotations

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
    """A set of whole records and the samples (record, row) chosen from them."""

    def __init__(self, layout: FixedLayout, values: list[Any], records: np.ndarray, count: int, path: str):
        self.layout = layout
        self.records = records  # global record index of each value
        k, length = layout.rows, layout.length
        for i, value in enumerate(values):
            record = int(records[i])
            rows = min(k, count - record * k)
            if len(value) != length or rows != k:
                values[i] = layout.canonical(value, record, rows, f"{path}: record {record}")
        self.joined = length < JOIN_LIMIT
        if self.joined:
            buf = np.frombuffer(b"".join(values), np.uint8).reshape(len(values), length)
            bad = np.flatnonzero((buf[:, layout.header_cols] != layout.header).any(axis=1))
            if len(bad):
                buf = buf.copy()
                for bad_row in bad:
                    i = int(bad_row)
                    record = int(records[i])
                    buf[i] = np.frombuffer(
                        layout.canonical(bytes(buf[i]), record, k, f"{path}: record {record}"), np.uint8
                    )
            self.views = [
                as_strided(buf[:, off:], shape=(len(values), k, n), strides=(length, n, 1), writeable=False)
                for off, n in zip(layout.offsets, layout.sample_bytes)
            ]
        else:
            rows_arrays = []
            for i, value in enumerate(values):
                row = np.frombuffer(value, np.uint8)
                if (row[layout.header_cols] != layout.header).any():
                    record = int(records[i])
                    row = np.frombuffer(layout.canonical(value, record, k, f"{path}: record {record}"), np.uint8)
                rows_arrays.append(row)
            self.rows_arrays = rows_arrays

    def gather(self, rec: np.ndarray, row: np.ndarray) -> list[np.ndarray]:
        """Per field, a fresh (len(rec), sample_bytes) uint8 array of the chosen samples."""
        if self.joined:
            return [view[rec, row] for view in self.views]
        out = []
        arrays = self.rows_arrays
        for off, n in zip(self.layout.offsets, self.layout.sample_bytes):
            dst = np.empty((len(rec), n), np.uint8)
            for i, (r, j) in enumerate(zip(rec.tolist(), row.tolist())):
                start = off + j * n
                dst[i] = arrays[r][start : start + n]
            out.append(dst)
        return out


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
    values: list[Any] = []
    records: list[np.ndarray] = []
    recs: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    held = 0
    for start, stop in runs:
        pos = start
        while pos < stop:
            end = min(stop, pos + max(target - held, 1))
            first, last = pos // k, (end - 1) // k + 1
            end = min(stop, last * k)
            piece = read_records(cursor, first, last, path)
            if crc_cursor is not None:
                check_crcs(piece, read_records(crc_cursor, first, last, path), first, path)
            samples = np.arange(pos, end, dtype=np.int64)
            recs.append(samples // k - first + len(values))
            rows.append(samples % k)
            records.append(np.arange(first, last, dtype=np.int64))
            values.extend(piece)
            held += end - pos
            pos = end
            if held >= target:
                yield _Window(layout, values, np.concatenate(records), count, path), *_cat(recs, rows)
                values, records, recs, rows, held = [], [], [], [], 0
    if held:
        yield _Window(layout, values, np.concatenate(records), count, path), *_cat(recs, rows)


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
