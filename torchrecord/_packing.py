"""Encoding and packing: admitted samples become record values appended in order.

With ``samples_per_record = 1`` each sample is one record (bytes from the fast
encoder pass straight through); with K > 1 every K consecutive samples are
stacked into one chunked record (the last may hold fewer). See docs/FORMAT.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchrecord._codec import decode_leaves, encode_payloads
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
    """

    def __init__(self, appender: LmdbAppender, samples_per_record: int) -> None:
        self.appender = appender
        self.chunk = samples_per_record
        self.count = 0
        self._rows: list[Normalized] = []

    def add(self, sample: bytes | Normalized) -> None:
        """Encode one sample (or, in chunked mode, a full chunk of them) and append it."""
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

    def add_encoded(self, values: list[bytes]) -> None:
        """Append finished single-sample records (a fast-encoded batch)."""
        assert self.chunk == 1, "fast-encoded samples are single-sample records"
        append = self.appender.append
        for value in values:
            append(value)
        self.count += len(values)

    def add_stored(self, value: bytes, schema: Schema, where: str) -> None:
        """Append a sample kept as a single-sample record (from the spool)."""
        if self.chunk == 1:
            self.count += 1
            self.appender.append(value)
        else:
            self.add(restore(value, schema, where))

    def flush(self) -> None:
        """Write the pending rows as one chunked record (nothing if none are pending)."""
        if not self._rows:
            return
        columns: list[Any] = []
        for column in zip(*(s.payloads for s in self._rows)):
            columns.append(list(column) if isinstance(column[0], bytes) else np.stack(column))
        self.appender.append(encode_payloads(columns, self._rows[0].signatures))
        self._rows = []
