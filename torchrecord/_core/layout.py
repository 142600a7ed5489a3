"""The fixed byte layout shared by every record of a fixed-schema record set.

When every field is numeric with a fixed shape, the writer's encoding of any
record (or full chunk of records) has the same length and the same bytes
everywhere except inside the ``raw_data`` payloads. The layout is derived by
encoding two probe records (all-zero and all-0xFF payloads) with the real
encoder, so it can never disagree with what the writer produces. Readers then
locate each field's data at a fixed offset; a record whose length or non-payload
bytes differ from the template is decoded the slow way (see ``canonical``), so
nothing is ever misread.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.codec import decode_leaves, encode_payloads
from torchrecord._core.compress import Expander, has_compression
from torchrecord._core.schema import Field, LeafSignature, Schema
from torchrecord.errors import CorruptRecordError, FormatError

__all__ = ["FixedLayout"]


@dataclass(frozen=True)
class FixedLayout:
    """Where each field's bytes sit inside a record of ``rows`` samples.

    Attributes:
        fields: the schema fields, in record order.
        rows: samples per record (1, or ``samples_per_record`` for chunked sets).
        length: the byte length of every full record.
        offsets: where field f's payload starts (``rows * sample_bytes[f]`` bytes).
        sample_bytes: bytes of one sample of field f.
        header_cols: positions of every non-payload byte.
        header: the template's bytes at ``header_cols``.
        expander: for a set with compressed fields, fills a record's canonical
            (uncompressed) bytes into a window slot (``torchrecord._core.compress``);
            None otherwise.
    """

    fields: tuple[Field, ...]
    rows: int
    length: int
    offsets: tuple[int, ...]
    sample_bytes: tuple[int, ...]
    header_cols: np.ndarray
    header: np.ndarray
    expander: Any = field(default=None, compare=False)

    @classmethod
    def build(cls, schema: Schema, rows: int) -> FixedLayout | None:
        """The layout of ``schema``'s records, or None if the schema is not fixed."""
        if not schema.fields or not schema.is_fixed:
            return None
        fields = tuple(schema.fields)
        zeros = _probe(fields, rows, 0x00)
        ones = _probe(fields, rows, 0xFF)
        sigs = _signatures(fields)
        a = np.frombuffer(encode_payloads(zeros, sigs), np.uint8)
        b = np.frombuffer(encode_payloads(ones, sigs), np.uint8)
        if len(a) != len(b):  # cannot happen for fixed shapes; be safe rather than fast
            return None
        differs = a != b
        sample_bytes = tuple(
            int(np.prod([d or 0 for d in f.shape], dtype=np.int64)) * _dtypes.by_name(f.dtype).itemsize for f in fields
        )
        offsets = _payload_offsets(differs, [rows * n for n in sample_bytes])
        if offsets is None:
            return None
        header_cols = np.flatnonzero(~differs)
        layout = cls(fields, rows, len(a), tuple(offsets), sample_bytes, header_cols, a[header_cols].copy())
        if has_compression(fields):
            object.__setattr__(layout, "expander", Expander(layout))
        return layout

    @classmethod
    def of_file(cls, file: Any) -> FixedLayout | None:
        """The layout of a record set's records (a RecordFile or sharded set), or None if not fixed.

        Sized by what the set holds, never by a claim alone: a set whose only record
        is a short chunk (fewer samples than ``samples_per_record``) gets the layout
        of that chunk, so ``write_record(samples_per_record=10**5)`` of 2,000 samples
        costs 2,000 samples of probes, not 10**5; and a full record must fit in the
        set's bytes (FormatError otherwise: the shapes claimed are false).
        """
        schema, k = file.schema, int(file.samples_per_record)
        if not schema.fields or not schema.is_fixed:
            return None
        count = int(file.metadata["count"])
        held = min(k, max(1, count))  # samples of the first record
        per_sample = sum(
            _dtypes.by_name(f.dtype).itemsize * math.prod(int(d or 0) for d in f.shape)
            for f in schema.fields
            if f.compression is None  # a compressed field may hold far fewer bytes than its shape
        )
        if held * per_sample > file.size_bytes:
            raise FormatError(
                f"{file.path}: the schema claims {per_sample} bytes per sample, {held * per_sample} in the first "
                f"record, but the set has {file.size_bytes} bytes; it is damaged: copy it again or rewrite it"
            )
        # chunked records keep a leading axis, also a chunk of one sample: at least 2 rows then
        return cls.build(schema, 1 if k == 1 else max(2, held))

    def signatures(self) -> list[LeafSignature]:
        return _signatures(self.fields)

    def header_segments(self) -> tuple[tuple[int, int, bytes], ...]:
        """The non-payload bytes as contiguous ``(start, stop, bytes)`` pieces of a record."""
        return self._header_segments

    @functools.cached_property
    def _header_segments(self) -> tuple[tuple[int, int, bytes], ...]:
        # worked out once a layout: every window of records read from the map is checked against them
        cols = self.header_cols
        if len(cols) == 0:
            return ()
        cuts = np.flatnonzero(np.diff(cols) != 1) + 1
        return tuple(
            (int(part[0]), int(part[-1]) + 1, values.tobytes())
            for part, values in zip(np.split(cols, cuts), np.split(self.header, cuts))
        )

    def canonical(self, value: bytes | memoryview, record: int, rows: int, where: str) -> bytes:
        """Decode a record the slow, checked way and re-encode it in this layout.

        A short final chunk (``rows < self.rows``) is padded with zero rows, which
        readers never select. Raises CorruptRecordError if the record is invalid.
        """
        chunked = self.rows > 1
        payloads = decode_leaves(value, self.fields, where, rows if chunked else None)
        if chunked and rows < self.rows:
            payloads = [_pad_rows(p, self.rows) for p in payloads]
        encoded = encode_payloads(payloads, self.signatures())
        if len(encoded) != self.length:
            raise CorruptRecordError(f"{where}: does not fit the record set's fixed layout")
        return encoded


def _signatures(fields: Sequence[Field]) -> list[LeafSignature]:
    return [LeafSignature(f.kind, f.dtype, tuple(d or 0 for d in f.shape)) for f in fields]


def _probe(fields: Sequence[Field], rows: int, fill: int) -> list[np.ndarray]:
    out = []
    for f in fields:
        info = _dtypes.by_name(f.dtype)
        shape = tuple(int(d or 0) for d in f.shape)
        if rows > 1:
            shape = (rows, *shape)
        out.append(
            np.full(shape, fill, dtype=np.uint8).view(info.numpy)
            if info.itemsize == 1
            else np.frombuffer(
                bytes([fill]) * (int(np.prod(shape, dtype=np.int64)) * info.itemsize), dtype=info.numpy
            ).reshape(shape)
        )
    return out


def _payload_offsets(differs: np.ndarray, sizes: Sequence[int]) -> list[int] | None:
    """Match the runs of differing bytes to the non-empty payloads, in order."""
    padded = np.concatenate(([False], differs, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    starts, stops = edges[0::2], edges[1::2]
    offsets: list[int] = []
    run = 0
    previous_end = 0
    for size in sizes:
        if size == 0:  # an empty payload: any position keeps the offsets in order
            offsets.append(previous_end)
            continue
        if run >= len(starts) or stops[run] - starts[run] != size:
            return None
        offsets.append(int(starts[run]))
        previous_end = int(stops[run])
        run += 1
    return offsets if run == len(starts) else None


def _pad_rows(payload: np.ndarray | list[bytes], rows: int) -> np.ndarray:
    assert isinstance(payload, np.ndarray)
    pad = np.zeros((rows - payload.shape[0], *payload.shape[1:]), dtype=payload.dtype)
    return np.concatenate([payload, pad])
