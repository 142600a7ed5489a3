"""Choosing ``samples_per_record`` when the user does not, and packing single-sample records into chunks.

LMDB stores a value of up to about half a page inline in a leaf page (with an
8-byte node header, the 8-byte key and a 2-byte slot), and a larger one in
whole overflow pages of its own (a 16-byte page header, then the value). A
3 KB sample thus takes a 4 KB page, and a 72-byte sample about twice its size
once keys, node headers and its CRC entry are added. :func:`disk_bytes` models
this (``tests/write/test_autopack.py`` checks the model against ``env.stat()`` of
real files), and :func:`choose` picks the number of samples per record that
brings a fixed-size sample closest to its payload size, never splitting a sample.

Sets whose samples may vary in size stay at one sample per record: chunked
records need fixed shapes. When the first sample has fixed shapes and a later
one does not, the writer goes back to one sample per record (see
``_packing.Packer``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.codec import decode_leaves, encode_payloads
from torchrecord._core.compress import FieldCompressor
from torchrecord._core.layout import FixedLayout
from torchrecord._core.schema import Field, Schema
from torchrecord._core.varint import varint_size
from torchrecord._write.lmdb_writer import LmdbAppender
from torchrecord._write.packing import Packer, restore
from torchrecord._write.sources import Encoded, Normalized

__all__ = ["AutoPacker", "ChunkJoiner", "choose", "disk_bytes", "record_length"]

_PAGE_HEADER = 16
_NODE_HEADER = 8
_KEY = 8
_SLOT = 2  # a leaf's index entry per node
_CRC_VALUE = 4
_PGNO = 8  # an overflow node's value: the page number
#: Records are kept at most this long when that already packs well (the window reader joins them).
SMALL_RECORD = 16 << 10
#: ... and at most this long otherwise.
LARGE_RECORD = 256 << 10
#: Raw bytes of a record at least, with compression.
COMPRESSED_RECORD = 256 << 10
#: Samples per record at most: the block shuffle reads whole records, so blocks are at least K samples
#: (8-byte samples still come within 1.07x of their payload).
MAX_SAMPLES = 128
#: Good enough: within this factor of the best packing, the smaller record wins.
_SLACK = 1.01
#: Below this overhead over the payload the small records are kept.
_SMALL_ENOUGH = 1.06


def _sample_bytes(f: Field) -> int:
    return math.prod(int(d or 0) for d in f.shape) * _dtypes.by_name(f.dtype).itemsize


def record_length(fields: Sequence[Field], rows: int) -> int:
    """The byte length of a canonical record of ``rows`` samples (1: a single-sample record)."""
    total = 0
    for f in fields:
        dims = ([rows] if rows > 1 else []) + [int(d or 0) for d in f.shape]
        size = rows * _sample_bytes(f)
        sub = sum(1 + varint_size(d) for d in dims) + 2 + 2 + 1 + varint_size(size) + size
        total += 1 + varint_size(sub) + sub
    return total


def _node_max(psize: int) -> int:
    """LMDB's largest inline leaf node (``me_nodemax``)."""
    return (((psize - _PAGE_HEADER) // 2) & ~1) - _SLOT


def _leaf_share(node: int, psize: int) -> float:
    """Bytes of leaf page taken by one node of ``node`` bytes in pages filled in key order."""
    slot = node + (node & 1) + _SLOT
    return psize / max(1, (psize - _PAGE_HEADER) // slot)


def disk_bytes(value: int, psize: int, checksums: bool) -> float:
    """File bytes one record of ``value`` bytes takes in an appended set (records and CRC databases)."""
    node = _NODE_HEADER + _KEY + value
    if node > _node_max(psize):
        taken = math.ceil((value + _PAGE_HEADER) / psize) * psize + _leaf_share(_NODE_HEADER + _KEY + _PGNO, psize)
    else:
        taken = _leaf_share(node, psize)
    if checksums:
        taken += _leaf_share(_NODE_HEADER + _KEY + _CRC_VALUE, psize)
    return taken


def choose(schema: Schema | None, psize: int, checksums: bool = True, compressed: bool = False) -> int:
    """Samples per record for a set of this schema: 1 unless every field has a fixed shape.

    Tries every count up to a record of :data:`SMALL_RECORD` bytes (or
    :data:`LARGE_RECORD` when small records cannot come within 6% of the
    payload) and takes the smallest whose file bytes per sample are within 1%
    of the best. With compression the stored size of a record is not known in
    advance (half a page is lost per record on average), so records hold at
    least :data:`COMPRESSED_RECORD` raw bytes (or one sample).
    """
    if schema is None or not schema.fields or not schema.is_fixed:
        return 1
    per_sample = sum(_sample_bytes(f) for f in schema.fields)
    if compressed:
        return max(1, min(MAX_SAMPLES, -(-COMPRESSED_RECORD // max(1, per_sample))))
    best_k = 1
    for cap in (SMALL_RECORD, LARGE_RECORD):
        top = max(1, min(MAX_SAMPLES, cap // max(1, per_sample)))
        costs = [disk_bytes(record_length(schema.fields, k), psize, checksums) / k for k in range(1, top + 1)]
        best = min(costs)
        best_k = next(k for k, c in enumerate(costs, 1) if c <= best * _SLACK)
        if best <= _SMALL_ENOUGH * max(1, per_sample):
            break
    return best_k


class ChunkJoiner:
    """Joins K canonical single-sample records of a fixed-layout schema into one chunk record, vectorized.

    Returns None when a record does not match the single-sample layout (the
    caller then decodes it the checked way).
    """

    def __init__(self, schema: Schema, rows: int) -> None:
        single = FixedLayout.build(schema, 1)
        assert single is not None, "chunks need a fixed layout"
        self.schema, self.single, self.rows = schema, single, rows
        self._headers: dict[int, tuple[list[bytes], bytes]] = {}

    def _header(self, n: int) -> tuple[list[bytes], bytes]:
        """The header bytes before each field's payload in a chunk of ``n`` rows, and after the last."""
        held = self._headers.get(n)
        if held is None:
            layout = FixedLayout.build(self.schema, n)
            assert layout is not None
            header = layout.header.tobytes()
            parts: list[bytes] = []
            position = taken = 0
            for off, size in zip(layout.offsets, (n * s for s in layout.sample_bytes)):
                parts.append(header[taken : taken + off - position])
                taken += off - position
                position = off + size
            held = self._headers[n] = (parts, header[taken:])
        return held

    def join(self, values: Sequence[bytes]) -> bytes | None:
        """The chunk record of ``values`` (at most K single-sample records; a short last chunk is fine)."""
        single = self.single
        if len(values) < 2 or any(len(v) != single.length for v in values):
            return None  # a chunk of one row has dims [1, ...]: the checked path encodes it
        stacked = np.frombuffer(b"".join(values), np.uint8).reshape(len(values), single.length)
        if (stacked[:, single.header_cols] != single.header).any():
            return None
        parts, tail = self._header(len(values))
        out: list[bytes] = []
        for part, off, size in zip(parts, single.offsets, single.sample_bytes):
            out.append(part)
            out.append(stacked[:, off : off + size].tobytes())
        out.append(tail)
        return b"".join(out)


class _Compressing:
    """An appender that compresses the chosen fields of each record before appending it."""

    def __init__(self, appender: LmdbAppender, compressor: FieldCompressor) -> None:
        self._appender, self._compressor = appender, compressor

    def append(self, value: bytes) -> None:
        self._appender.append(self._compressor.apply(value))

    def append_many(self, values: Sequence[bytes]) -> None:
        for value in values:
            self.append(value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._appender, name)


class AutoPacker(Packer):
    """A :class:`Packer` that chooses K from the first sample's schema and compresses fields.

    Args:
        appender: the file being written.
        samples_per_record: K, or None to choose it when the first sample comes
            (:func:`choose`; 1 unless every field has a fixed shape). An automatic
            K > 1 goes back to 1 when a later sample changes a field's shape (the
            records written so far are rewritten as single-sample records).
        schema_of: the write's schema so far (the admission's).
        compression, compression_level: ``write_record``'s options (checked).
        checksums: whether CRCs are stored (the page model counts them).
        packable: False when the automatic choice must stay at 1 (a field came
            as a list of numbers, whose length varies by nature).
    """

    def __init__(
        self,
        appender: LmdbAppender,
        samples_per_record: int | None,
        *,
        schema_of: Callable[[], Schema | None],
        compression: Any = None,
        compression_level: int | None = None,
        checksums: bool = True,
        packable: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(appender, samples_per_record or 1)
        self.auto = samples_per_record is None
        #: samples per record (None until the automatic choice is made)
        self.chunk: int | None = samples_per_record  # type: ignore[assignment]
        self._schema_of = schema_of
        self._packable = packable or (lambda: True)
        self._checksums = checksums
        self._option, self._level = compression, compression_level
        self.compressor: FieldCompressor | None = None
        self._joiner: ChunkJoiner | None = None
        self._started = False

    def _start(self) -> None:
        """Decide K (automatic) and set up compression, once the first sample's schema is known."""
        self._started = True
        schema = self._schema_of()
        if self.chunk is None:
            packable = schema if self._packable() else None
            self.chunk = choose(packable, self.appender.page_size, self._checksums, self._option is not None)
        if self._option is not None and schema is not None:
            self.compressor = FieldCompressor.build(schema.fields, self._option, self._level)
            self.appender = _Compressing(self.appender, self.compressor)  # type: ignore[assignment]
        if self.chunk > 1 and schema is not None and schema.is_fixed:
            self._joiner = ChunkJoiner(schema, self.chunk)

    def add(self, sample: bytes | Normalized) -> None:
        """One admitted sample: a single-sample record's bytes or a normalized sample."""
        if not self._started:
            self._start()
        self._untail()  # samples waiting as columns come first
        if self.chunk != 1 and self.auto and isinstance(sample, Normalized) and not self._fixed():
            self._demote()
        if isinstance(sample, bytes) and self.chunk != 1:
            self.count += 1
            self._rows.append(sample)  # type: ignore[arg-type]  # joined in flush
            if len(self._rows) == self.chunk:
                self.flush()
            return
        super().add(sample)

    def add_encoded(self, encoded: Encoded) -> None:
        """Consecutive samples given as columns (a fast-encoded batch): laid out as records of K samples."""
        if not self._started:
            self._start()
        super().add_encoded(encoded)

    def add_stored(self, value: bytes, schema: Schema, where: str) -> None:
        """A sample kept as a single-sample record (from the spool)."""
        self.add(value)

    def flush(self) -> None:
        """Write the pending rows as one chunk: joined from record bytes where they fit the layout."""
        self._untail()
        rows: list[Any] = self._rows
        if not rows:
            return
        if self._joiner is not None and all(isinstance(r, bytes) for r in rows):
            joined = self._joiner.join(rows)
            if joined is not None:
                self._rows = []
                self.appender.append(joined)
                return
        schema = self._schema_of()
        assert schema is not None
        self._rows = [r if isinstance(r, Normalized) else restore(r, schema, "a pending sample") for r in rows]
        super().flush()

    def _fixed(self) -> bool:
        """True while every field keeps the first sample's shape (a widened schema is not fixed)."""
        schema = self._schema_of()
        return schema is not None and schema.is_fixed

    def _demote(self) -> None:
        """Rewrite the chunks written so far as single-sample records and go on with K = 1."""
        k = self.chunk
        joiner = self._joiner
        assert k is not None and k > 1 and joiner is not None, "an automatic K > 1 comes with a fixed layout"
        fields = list(joiner.single.fields)
        signatures = joiner.single.signatures()
        compress = self.compressor.apply if self.compressor is not None else None
        appender: Any = self.appender
        path = appender.name

        def split(record: int, value: bytes) -> list[bytes]:
            columns = decode_leaves(value, fields, f"{path}: record {record}", k)
            out = [encode_payloads([c[j] for c in columns], signatures) for j in range(k)]
            return [compress(v) for v in out] if compress is not None else out

        appender.regroup(split)
        rows: list[Any] = self._rows
        self._rows, self.chunk, self._joiner = [], 1, None
        for row in rows:
            value = row if isinstance(row, bytes) else encode_payloads(row.payloads, row.signatures)
            appender.append(value)
