"""Encoding and packing: admitted samples become record values appended in order.

With ``samples_per_record = 1`` each sample is one record (bytes from the fast
encoder pass straight through); with K > 1 every K consecutive samples are
stacked into one chunked record (the last may hold fewer). See docs/FORMAT.md.

Samples that come as columns (:class:`~torchrecord._write.sources.Encoded`, a batch
of a map-style source) become whole records in a few array operations
(:func:`~torchrecord._write.fastwrite.fill_records`), for any K: the template of a
K-sample record is derived once per write and checked once against the
protobuf encoder on the first real records.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchrecord._core.codec import decode_leaves, encode_payloads
from torchrecord._core.layout import FixedLayout
from torchrecord._core.schema import LeafSignature, Schema
from torchrecord._core.structure import Tree
from torchrecord._write.fastwrite import BytesColumn, concat_columns, fill_records, fill_var_records, prefixes_of
from torchrecord._write.lmdb_writer import LmdbAppender
from torchrecord._write.sources import Encoded, Normalized

__all__ = ["Packer", "encode_sample", "restore", "single_records"]


def encode_sample(sample: bytes | Normalized) -> bytes:
    """The single-sample record of an admitted sample (fast-encoded bytes pass as they are)."""
    if isinstance(sample, bytes):
        return sample
    return encode_payloads(sample.payloads, sample.signatures)


def restore(value: bytes, schema: Schema, where: str) -> Normalized:
    """A single-sample record decoded back into payloads (to regroup it into chunks)."""
    payloads = decode_leaves(value, schema.fields, where)
    signatures = [LeafSignature(f.kind, f.dtype, tuple(f.shape)) for f in schema.fields]  # type: ignore[arg-type]
    return Normalized(schema.tree, signatures, payloads)


#: records at least this long are handed to LMDB as views of the filled array
_VIEW_BYTES = 16 << 10


class _Layouts:
    """The checked record layout of columns of one structure, per samples-per-record; None if unusable."""

    def __init__(self) -> None:
        self._key: tuple[Tree, list[LeafSignature]] | None = None
        self._by_rows: dict[int, FixedLayout | None] = {}

    def records(self, encoded: Encoded, rows: int, start: int, stop: int) -> list[bytes | memoryview] | None:
        """Records of ``rows`` samples each from samples [start, stop) of ``encoded`` (stop - start a multiple)."""
        key = (encoded.tree, encoded.signatures)
        if self._key != key:
            self._key, self._by_rows = key, {}
        columns = [c[start:stop] for c in encoded.columns]
        if any(isinstance(c, BytesColumn) for c in columns):
            return self._var_records(encoded, columns, rows)
        if rows not in self._by_rows:
            self._by_rows[rows] = _checked_layout(encoded, columns, rows)
        layout = self._by_rows[rows]
        if layout is None:
            return None
        filled = fill_records(layout, columns).reshape(-1)
        n = layout.length
        # long records: zero-copy views (LMDB copies each into the map once); short ones: bytes, which
        # are cheaper to make and, unlike views, not tracked by the garbage collector
        flat: bytes | memoryview = filled.data if n >= _VIEW_BYTES else filled.tobytes()
        return [flat[i : i + n] for i in range(0, len(flat), n)]

    def _var_records(self, encoded: Encoded, columns: list[Any], rows: int) -> list[bytes | memoryview] | None:
        """Single-sample records of samples with bytes or str fields (chunks of them take the general path)."""
        prefixes = prefixes_of(tuple(encoded.signatures)) if rows == 1 else None
        if prefixes is None or not columns or not len(columns[0]):
            return None
        flat, bounds = fill_var_records(prefixes, encoded.signatures, columns)
        edges = bounds.tolist()
        if rows not in self._by_rows:  # checked once against protobuf, on the first record
            expected = encode_payloads([c[0] for c in columns], encoded.signatures)
            self._by_rows[rows] = None if flat[: edges[1]].tobytes() != expected else _VAR
        if self._by_rows[rows] is None:
            return None
        view: bytes | memoryview
        if edges[-1] >= _VIEW_BYTES * len(columns[0]):
            view = flat.data
        else:  # short records as bytes (measured: 3 KB records as views make the write ~40% slower)
            # slices of the join's own bytes where the records were joined (no copy of the whole first)
            view = flat.base if isinstance(flat.base, bytes) else flat.tobytes()
        return list(map(view.__getitem__, map(slice, edges[:-1], edges[1:])))


#: the marker of a checked variable-length record layout
_VAR: Any = object()


def _checked_layout(encoded: Encoded, columns: list[np.ndarray], rows: int) -> FixedLayout | None:
    """The layout of ``rows``-sample records of this structure, if its first record matches protobuf's."""
    layout = FixedLayout.build(Schema.from_first(encoded.tree, encoded.signatures), rows)
    if layout is None or len(layout.fields) != len(columns):
        return None
    first = [c[:rows] if rows > 1 else c[0] for c in columns]
    expected = encode_payloads(first, encoded.signatures)
    return layout if fill_records(layout, [c[:rows] for c in columns]).tobytes() == expected else None


_SINGLE = _Layouts()


def single_records(encoded: Encoded) -> list[bytes | memoryview]:
    """One single-sample record per sample of ``encoded``."""
    values = _SINGLE.records(encoded, 1, 0, len(encoded))
    if values is None:
        return [encode_payloads([c[i] for c in encoded.columns], encoded.signatures) for i in range(len(encoded))]
    return values


def _row(encoded: Encoded, i: int) -> Normalized:
    """Sample ``i`` of ``encoded`` as a normalized sample (0-d arrays for scalars)."""
    return Normalized(
        encoded.tree, encoded.signatures, [c[i] if isinstance(c, BytesColumn) else c[i, ...] for c in encoded.columns]
    )


class Packer:
    """Appends admitted samples to an :class:`LmdbAppender` as records; counts samples.

    Call :meth:`flush` after the last sample to write a last, partial chunk.
    """

    def __init__(self, appender: LmdbAppender, samples_per_record: int) -> None:
        self.appender = appender
        self.chunk = samples_per_record
        self.count = 0
        self._rows: list[Normalized] = []
        self._layouts = _Layouts()
        self._tail: Encoded | None = None  # samples of columns waiting to fill a chunk

    def add(self, sample: bytes | Normalized) -> None:
        """Encode one sample (or, in chunked mode, a full chunk of them) and append it."""
        self._untail()
        self.count += 1
        if isinstance(sample, bytes):
            assert self.chunk == 1, "fast-encoded samples are single-sample records"
            self.appender.append(sample)
            return
        if self.chunk == 1:
            self.appender.append(encode_payloads(sample.payloads, sample.signatures))
            return
        self._rows.append(sample)
        if len(self._rows) == self.chunk:
            self.flush()

    def add_encoded(self, encoded: Encoded) -> None:
        """Append consecutive samples given as columns, whole records at a time where possible.

        A chunk left open by single samples is completed first; the samples that
        do not fill a last whole chunk wait (as columns) for the next ones, so
        records always hold K consecutive samples of the write order.
        """
        if self._tail is not None:
            tail, self._tail = self._tail, None
            encoded = Encoded(
                [concat_columns(pair) for pair in zip(tail.columns, encoded.columns)], encoded.tree, encoded.signatures
            )
        n, k = len(encoded), self.chunk
        start = 0
        while self._rows and start < n:  # complete the chunk single samples opened
            self.add(_row(encoded, start))
            start += 1
        stop = start + (n - start) // k * k
        values = self._layouts.records(encoded, k, start, stop) if stop > start else []
        if values is None:  # no usable layout: sample by sample
            for i in range(start, n):
                self.add(_row(encoded, i))
            return
        self.appender.append_many(values)
        self.count += stop - start
        if stop < n:
            self._tail = Encoded([c[stop:] for c in encoded.columns], encoded.tree, encoded.signatures)

    def _untail(self) -> None:
        """Turn samples waiting as columns into single pending rows (before a single sample, or the end)."""
        if self._tail is not None:
            tail, self._tail = self._tail, None
            for i in range(len(tail)):
                self.add(_row(tail, i))

    def add_stored(self, value: bytes, schema: Schema, where: str) -> None:
        """Append a sample kept as a single-sample record (from the spool)."""
        if self.chunk == 1:
            self.count += 1
            self.appender.append(value)
        else:
            self.add(restore(value, schema, where))

    def flush(self) -> None:
        """Write the pending rows as one chunked record (nothing if none are pending)."""
        self._untail()
        if not self._rows:
            return
        columns: list[Any] = []
        for column in zip(*(s.payloads for s in self._rows)):
            columns.append(list(column) if isinstance(column[0], bytes) else np.stack(column))
        self.appender.append(encode_payloads(columns, self._rows[0].signatures))
        self._rows = []
