"""Encoding and packing: admitted samples become record values appended in order.

With ``samples_per_record = 1`` each sample is one record (bytes from the fast
encoder pass straight through); with K > 1 every K consecutive samples are
stacked into one chunked record (the last may hold fewer). See docs/FORMAT.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from torchrecord import _autopack
from torchrecord._autopack import ChunkJoiner
from torchrecord._codec import decode_leaves, encode_payloads
from torchrecord._compress import FieldCompressor
from torchrecord._lmdb_writer import LmdbAppender
from torchrecord._sources import Normalized
from torchrecord.schema import LeafSignature, Schema

__all__ = ["Packer", "encode_sample", "restore"]


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


class Packer:
    """Appends admitted samples to an :class:`LmdbAppender` as records; counts samples.

    Call :meth:`flush` after the last sample to write a last, partial chunk.

    Args:
        appender: the file being written.
        samples_per_record: K, or None to choose it from the schema when the
            first sample comes (``_autopack.choose``; 1 unless every field has a
            fixed shape). An automatic K > 1 goes back to 1 when a later sample
            changes a field's shape (records written so far are rewritten).
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
        schema_of: Callable[[], Schema | None] | None = None,
        compression: Any = None,
        compression_level: int | None = None,
        checksums: bool = True,
        packable: Callable[[], bool] | None = None,
    ) -> None:
        self.appender = appender
        self._packable = packable or (lambda: True)
        self.auto = samples_per_record is None
        #: samples per record (None until an automatic choice is made)
        self.chunk: int | None = samples_per_record
        self.count = 0
        self._schema_of = schema_of or (lambda: None)
        self._rows: list[Normalized | bytes] = []
        self._joiner: ChunkJoiner | None = None
        self._checksums = checksums
        self._option, self._level = compression, compression_level
        self.compressor: FieldCompressor | None = None
        self._append: Callable[[bytes], None] = appender.append

    # -- the choices made at the first sample --------------------------------------------
    def _start(self) -> int:
        """Decide K (automatic) and set up compression, once the first sample's schema is known."""
        schema = self._schema_of()
        if self.chunk is None:
            compressed = self._option is not None
            packable = schema if self._packable() else None
            self.chunk = _autopack.choose(packable, self.appender.page_size, self._checksums, compressed)
        if self._option is not None and schema is not None and self.compressor is None:
            self.compressor = FieldCompressor.build(schema.fields, self._option, self._level)
            compress, append = self.compressor.apply, self.appender.append
            self._append = lambda value: append(compress(value))
        if self.chunk > 1 and schema is not None and schema.is_fixed and self._joiner is None:
            self._joiner = ChunkJoiner(schema, self.chunk)
        return self.chunk

    def add(self, sample: bytes | Normalized) -> None:
        """Encode one sample (or, in chunked mode, a full chunk of them) and append it."""
        chunk = self.chunk if self.chunk is not None else self._start()
        if self.compressor is None and self._option is not None:
            self._start()
        if chunk > 1 and self.auto and isinstance(sample, Normalized) and not self._fits(sample):
            self._demote()
            chunk = 1
        self.count += 1
        if chunk == 1:
            self._append(sample if isinstance(sample, bytes) else encode_payloads(sample.payloads, sample.signatures))
            return
        self._rows.append(sample)
        if len(self._rows) == chunk:
            self.flush()

    def add_encoded(self, values: list[bytes]) -> None:
        """Append finished single-sample records (a fast-encoded batch)."""
        if self.chunk is None or (self.compressor is None and self._option is not None):
            self._start()
        if self.chunk != 1:
            for value in values:
                self.add(value)
            return
        append = self._append
        for value in values:
            append(value)
        self.count += len(values)

    def add_stored(self, value: bytes, schema: Schema, where: str) -> None:
        """Append a sample kept as a single-sample record (from the spool)."""
        self.add(value)

    def flush(self) -> None:
        """Write the pending rows as one chunked record (nothing if none are pending)."""
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        schema = self._schema_of()
        joined = None
        if self._joiner is not None and all(isinstance(r, bytes) for r in rows):
            joined = self._joiner.join(rows)  # type: ignore[arg-type]
        if joined is None:
            assert schema is not None
            samples = [r if isinstance(r, Normalized) else restore(r, schema, "a pending sample") for r in rows]
            columns: list[Any] = []
            for column in zip(*(s.payloads for s in samples)):
                columns.append(list(column) if isinstance(column[0], bytes) else np.stack(column))
            joined = encode_payloads(columns, samples[0].signatures)
        self._append(joined)

    # -- going back to one sample per record ------------------------------------------------
    def _fits(self, sample: Normalized) -> bool:
        """True when the sample has the chunk's fixed shapes (else the schema was just widened)."""
        schema = self._schema_of()
        return schema is not None and schema.is_fixed

    def _demote(self) -> None:
        """Rewrite the chunks written so far as single-sample records and go on with K = 1."""
        k = self.chunk
        assert k is not None and k > 1
        joiner = self._joiner
        assert joiner is not None, "an automatic chunk size > 1 comes only with a fixed layout"
        fields = list(joiner.single.fields)
        signatures = joiner.single.signatures()
        compress = self.compressor.apply if self.compressor is not None else None
        path = self.appender.name

        def split(record: int, value: bytes) -> list[bytes]:
            columns = decode_leaves(value, fields, f"{path}: record {record}", k)
            out = [encode_payloads([c[j] for c in columns], signatures) for j in range(k)]
            return [compress(v) for v in out] if compress is not None else out

        self.appender.regroup(split)
        rows, self._rows = self._rows, []
        self.chunk, self._joiner = 1, None
        for row in rows:
            self._append(row if isinstance(row, bytes) else encode_payloads(row.payloads, row.signatures))
