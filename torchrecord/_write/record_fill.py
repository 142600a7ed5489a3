"""Whole records laid out from columns in NumPy, byte for byte as the protobuf encoder makes them.

:func:`fill_records` fills records of a fixed layout (every field of fixed shape):
the template's header bytes broadcast, each field's column copied in at its
offset. :func:`fill_var_records` lays out single-sample records with ``bytes``
or ``str`` fields, whose length prefixes (:func:`string_prefix`) change from
sample to sample: the headers are written in NumPy for all samples at once, and
each value is copied once. Neither does per-sample Python work.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.layout import FixedLayout
from torchrecord._core.schema import LeafSignature
from torchrecord._core.varint import encode_varint, put_varints, varint_sizes
from torchrecord._write.bytes_column import BytesColumn, Column

__all__ = ["STRING_KINDS", "fill_records", "fill_var_records", "payload_bytes", "string_prefix"]

#: the kinds of variable-length fields, each a prefix and its bytes
STRING_KINDS = ("bytes", "str")
#: fixed fields up to this many bytes are copied into variable-length records with one fancy index
_SMALL_FIELD = 256


def string_prefix(length: int) -> bytes:
    """The bytes before a ``length``-byte bytes/str value in its field of a single-sample record.

    The field is a TensorProto holding ``data_type = STRING`` and one
    ``string_data`` element: ``0a <size> 10 04 32 <length>``, then the value.
    """
    inner = 3 + len(encode_varint(length)) + length
    return b"\x0a" + encode_varint(inner) + b"\x10\x04\x32" + encode_varint(length)


def payload_bytes(sig: LeafSignature) -> int:
    """The bytes of a fixed leaf's payload (0 for bytes and str, whose length varies)."""
    if sig.kind in STRING_KINDS:
        return 0
    count = 1
    for d in sig.shape:
        count *= int(d)
    return count * _dtypes.by_name(sig.dtype).itemsize


def fill_records(layout: FixedLayout, columns: Sequence[np.ndarray]) -> np.ndarray:
    """Whole records of ``layout.rows`` consecutive samples each, as a (records, length) uint8 array.

    ``columns`` hold one typed, C-contiguous column [n, ...] per field, n a
    multiple of the rows per record. The template's header bytes are broadcast
    and each field's bytes copied in at its offset, so every record is byte for
    byte what the protobuf encoder makes of the same samples.
    """
    k = layout.rows
    n = len(columns[0]) if columns else 0
    m = n // k
    out = np.empty((m, layout.length), np.uint8)
    for start, stop, piece in layout.header_segments():
        out[:, start:stop] = np.frombuffer(piece, np.uint8)
    for off, size, col in zip(layout.offsets, layout.sample_bytes, columns):
        if size:
            out[:, off : off + k * size] = col.reshape(-1).view(np.uint8).reshape(m, k * size)
    return out


class _Part(NamedTuple):
    """How one field of every sample goes into the records."""

    glue: np.ndarray | int  # per sample, the bytes it puts in the glue buffer (headers, small fixed fields)
    values: BytesColumn | None  # the values joined after its glue (None: the field is all glue)
    block: np.ndarray | None  # a fixed field: its prefix and payload per sample [n, width] (None: bytes or str)


def fill_var_records(
    prefixes: Sequence[bytes | None], signatures: Sequence[LeafSignature], columns: Sequence[Column]
) -> tuple[np.ndarray, np.ndarray]:
    """Single-sample records of n samples with bytes or str fields: the joined bytes, and the n + 1 bounds.

    Record i is ``out[bounds[i] : bounds[i + 1]]``, byte for byte what the
    protobuf encoder makes of sample i: every field is its prefix (the fixed
    template, or :func:`string_prefix` with its varints written in NumPy for all
    samples at once) and its payload. The prefixes and the small fixed fields
    of every sample are laid out in NumPy in one "glue" buffer; the records are
    then one ``bytes.join`` of the glue's pieces and the values (views of their
    source buffers, in any order: the shuffle's gather is this one copy), with
    no per-sample Python bytecode. The result is read-only.
    """
    n = len(columns[0])
    parts = [_part(prefix, sig, col, n) for prefix, sig, col in zip(prefixes, signatures, columns)]
    glue_lengths = np.zeros(n, np.int64)
    for part in parts:
        glue_lengths += part.glue
    glue_bounds = np.zeros(n + 1, np.int64)
    np.cumsum(glue_lengths, out=glue_bounds[1:])
    glue, cuts = _glue(parts, glue_bounds)
    joined = [part.values for part in parts if part.values is not None]
    if not joined:
        return glue, glue_bounds
    return _interleave(glue, glue_lengths, joined, cuts)


def _part(prefix: bytes | None, sig: LeafSignature, col: Column, n: int) -> _Part:
    """Field ``sig`` of the n samples in ``col``: a string field's headers, or its fixed block."""
    if prefix is None:
        assert isinstance(col, BytesColumn)
        inner = 3 + varint_sizes(col.lengths) + col.lengths
        return _Part(1 + varint_sizes(inner) + 3 + varint_sizes(col.lengths), col, None)
    size = payload_bytes(sig)
    width = len(prefix) + size
    block = np.empty((n, width), np.uint8)
    block[:, : len(prefix)] = np.frombuffer(prefix, np.uint8)
    if size:
        block[:, len(prefix) :] = np.ascontiguousarray(col).reshape(n, -1).view(np.uint8).reshape(n, size)
    if width <= _SMALL_FIELD:
        return _Part(width, None, block)
    # a large fixed field: its rows are joined like values
    return _Part(0, BytesColumn(block.reshape(-1), np.arange(n, dtype=np.int64) * width, np.full(n, width)), block)


def _glue(parts: Sequence[_Part], glue_bounds: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The glue buffer of every sample's headers and small fixed fields (sample i's at ``glue_bounds[i]``),
    and per joined field where its values go into each sample's glue."""
    glue = np.empty(int(glue_bounds[-1]), np.uint8)
    at = glue_bounds[:-1].copy()
    cuts: list[np.ndarray] = []
    for part in parts:
        if part.block is None:
            assert part.values is not None
            at = _put_string_header(glue, at, part.values.lengths)
        elif part.values is None:
            width = part.block.shape[1]
            glue[at[:, None] + np.arange(width)] = part.block
            at = at + width
        if part.values is not None:
            cuts.append(at)
    return glue, cuts


def _put_string_header(glue: np.ndarray, at: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Write :func:`string_prefix` of each length at its position in ``glue``; returns the positions after."""
    glue[at] = 0x0A
    inner = 3 + varint_sizes(lengths) + lengths
    at = put_varints(glue, at + 1, inner)
    glue[at] = 0x10
    glue[at + 1] = 0x04
    glue[at + 2] = 0x32
    return put_varints(glue, at + 3, lengths)


def _interleave(
    glue: np.ndarray, glue_lengths: np.ndarray, joined: Sequence[BytesColumn], cuts: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The records: the glue cut at every value's place, and the values in between, in one join."""
    lengths = glue_lengths.copy()
    for piece in joined:
        lengths += piece.lengths
    bounds = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=bounds[1:])
    # sample i's glue lies between sample i - 1's and sample i + 1's, so the glue between two values
    # (the end of one sample, the start of the next) is one piece: the glue is cut at every value's place
    places = np.stack(cuts, axis=1).reshape(-1) if len(cuts) > 1 else cuts[0]
    edges = np.concatenate([[0], places, [len(glue)]]).tolist()
    glue_pieces = list(map(glue.data.__getitem__, map(slice, edges[:-1], edges[1:])))
    if len(joined) == 1:
        values: Any = joined[0].views()
    else:  # the values in record order: sample 0's fields, sample 1's...
        values = itertools.chain.from_iterable(zip(*(piece.views() for piece in joined)))
    tail = glue_pieces.pop()
    stream = itertools.chain(itertools.chain.from_iterable(zip(glue_pieces, values)), (tail,))
    out = np.frombuffer(b"".join(stream), np.uint8)
    return out, bounds
