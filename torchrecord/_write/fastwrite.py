"""Encode samples of a fixed structure without protobuf, byte for byte as protobuf would.

Two forms: :meth:`FastEncoder.encode` makes one sample's record;
:meth:`FastEncoder.columns` turns many samples into one typed column per field
(or takes columns a source gave already stacked, :meth:`FastEncoder.stacked`),
and :func:`fill_records` writes whole records of K samples from such columns in
a few NumPy operations, with no per-sample Python work beyond the type checks.

Built from the first sample: when it is a flat tuple, list or dict (or a single
leaf) of fixed-shape tensors, arrays and Python scalars, every following sample
with the same leaf types, dtypes and shapes encodes to the same bytes as the
first one's except inside the payloads (see ``torchrecord._core.layout``). The
encoder checks each sample against that signature and splices its payloads
between the template's header bytes; any sample that does not match returns
None and takes the general path (which widens the schema or raises).

``bytes`` and ``str`` fields (encoded images, captions) have a variable length:
only their two length varints change from sample to sample, so each such field
is its length prefix (:func:`string_prefix`) and its bytes. A column of them is
a :class:`BytesColumn` (offsets into one buffer, e.g. an Arrow ``BinaryArray``'s
own buffers), and :func:`fill_var_records` lays many samples out as single-sample
records with the headers written in NumPy and one slice copy per value.
"""

from __future__ import annotations

import functools
import itertools
import operator
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.codec import encode_payloads, number_list_array
from torchrecord._core.layout import FixedLayout
from torchrecord._core.schema import LeafSignature, Schema
from torchrecord._core.structure import Tree, number_list_dtype

__all__ = ["BytesColumn", "Column", "FastEncoder", "fill_records", "fill_var_records", "string_prefix"]

_Leaf = Callable[[Any], "bytes | np.ndarray"]
#: buffer[slice], mapped over several buffers
_GET: Any = operator.getitem


class BytesColumn:
    """The values of a ``bytes`` or ``str`` field of n samples: value i is ``data[starts[i] : starts[i] + lengths[i]]``.

    ``data`` may be a whole source buffer (an Arrow array's data buffer, read
    without a copy) and the values in any order (a shuffled batch); or several
    buffers, value i then being in ``data[which[i]]`` (rows of several Arrow
    record batches, joined without a copy). ``text``: the producer checked every
    value is UTF-8 (a ``str`` field takes no other). Pickled compacted: only the
    values' own bytes travel to another process.
    """

    __slots__ = ("_sources", "data", "lengths", "starts", "text", "which")

    def __init__(
        self,
        data: np.ndarray | tuple[np.ndarray, ...],
        starts: np.ndarray,
        lengths: np.ndarray,
        text: bool = False,
        which: np.ndarray | None = None,
        sources: tuple[memoryview, ...] | None = None,
    ) -> None:
        self.data = data
        self.starts = starts
        self.lengths = lengths
        self.text = text
        self.which = which
        #: memoryviews of several buffers, made once and shared by the columns taken from this one
        self._sources = sources

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


def _varint_len(values: np.ndarray) -> np.ndarray:
    """Bytes of each value's base-128 varint (values >= 0)."""
    n = np.ones(values.shape, np.int64)
    for bits in range(7, 64, 7):
        n += values >= (1 << bits)
    return n


def _put_varints(out: np.ndarray, at: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Write each value's varint at its position in ``out``; returns the positions after them."""
    size = _varint_len(values)
    top = int(size.max()) if len(size) else 0
    same = bool(len(size)) and int(size.min()) == top
    for j in range(top):
        byte = (values >> (7 * j)) & 0x7F
        byte |= np.where(size > j + 1, 0x80, 0)
        if same:
            out[at + j] = byte
        else:
            keep = size > j
            out[at[keep] + j] = byte[keep]
    return np.asarray(at + size)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def string_prefix(length: int) -> bytes:
    """The bytes before a ``length``-byte bytes/str value in its field of a single-sample record.

    The field is a TensorProto holding ``data_type = STRING`` and one
    ``string_data`` element: ``0a <size> 10 04 32 <length>``, then the value.
    """
    inner = 3 + len(_varint(length)) + length
    return b"\x0a" + _varint(inner) + b"\x10\x04\x32" + _varint(length)


class FastEncoder:
    """Encodes samples shaped like the first one; None for any other sample."""

    def __init__(
        self,
        tree: Tree,
        signatures: list[LeafSignature],
        layout: FixedLayout | None,
        leaf_encoders: list[_Leaf],
        prefixes: list[bytes | None],
    ) -> None:
        self.tree = tree
        self.signatures = signatures
        #: the layout of whole records (all fields fixed), else None (bytes or str fields)
        self.layout = layout
        #: per field, the record bytes before its payload (fixed fields), None for bytes and str
        self.prefixes = prefixes
        #: the bytes a record takes besides its bytes and str values
        self.length = sum(len(p) + _payload_bytes(sig) if p is not None else 6 for p, sig in zip(prefixes, signatures))
        self._leaves = leaf_encoders
        self._columns = [_column_encoder(sig) for sig in signatures]
        self._stacked = [_stacked_check(sig) for sig in signatures]
        self._parts: list[Any] = []
        if layout is not None:
            header = layout.header.tobytes()
            # the template's header bytes between consecutive payloads
            cuts, pieces, start = [], [], 0
            for off, n in zip(layout.offsets, (layout.rows * s for s in layout.sample_bytes)):
                cuts.append((off, off + n))
            position = 0
            for off, end in cuts:
                size = off - position
                pieces.append(header[start : start + size])
                start += size
                position = end
            pieces.append(header[start:])
            for piece in pieces:
                self._parts += [piece, None]
            self._parts.pop()
        kind = tree["t"]
        self._split: Callable[[Any], Sequence[Any] | None]
        if kind == "leaf":
            self._split = lambda sample: [sample]
        elif kind in ("tuple", "list"):
            n, typ = len(tree["c"]), tuple if kind == "tuple" else list
            self._split = lambda s: s if type(s) is typ and len(s) == n else None
        else:
            keys = tree["k"]
            self._split = lambda s: [s[k] for k in keys] if type(s) is dict and list(s) == keys else None

    @classmethod
    def build(cls, tree: Tree, signatures: list[LeafSignature]) -> FastEncoder | None:
        """An encoder for samples like the first (tree, signatures), or None if not eligible."""
        if sys.byteorder != "little" or not signatures:
            return None
        if tree["t"] != "leaf" and any(c["t"] != "leaf" for c in tree["c"]):
            return None  # nested structures take the general path
        if any(sig.from_list and 0 in sig.shape for sig in signatures):
            return None  # an empty list takes its field's dtype later: only the general path knows it
        schema = Schema.from_first(tree, signatures)
        layout = FixedLayout.build(schema, 1)
        if layout is None and not all(f.is_fixed or f.kind in _STRING_KINDS for f in schema.fields):
            return None
        encoders = [_leaf_encoder(sig) for sig in signatures]
        if any(e is None for e in encoders):
            return None
        prefixes = _prefixes(signatures)
        if prefixes is None:
            return None
        return cls(tree, signatures, layout, encoders, prefixes)  # type: ignore[arg-type]

    def __reduce__(self) -> tuple[Any, ...]:
        # the checks are closures: pickle the recipe (spawn workers rebuild the encoder)
        return (FastEncoder.build, (self.tree, self.signatures))

    def encode(self, sample: Any) -> bytes | None:
        """The record bytes of ``sample``, or None if it does not fit this encoder."""
        leaves = self._split(sample)
        if leaves is None:
            return None
        try:
            payloads = [encode(leaf) for encode, leaf in zip(self._leaves, leaves)]
        except _Mismatch:
            return None
        if self.layout is None:  # bytes or str fields: each field is its prefix and its payload
            parts: list[Any] = []
            for prefix, payload in zip(self.prefixes, payloads):
                parts.append(prefix if prefix is not None else string_prefix(len(payload)))
                parts.append(payload)
            return b"".join(parts)
        parts = self._parts.copy()  # [header, payload, header, payload, ..., header]
        parts[1::2] = payloads
        return b"".join(parts)

    def columns(self, samples: Sequence[Any]) -> list[Column] | None:
        """Per field, the typed column [n, ...] of ``samples``; None unless every sample fits this encoder.

        The columns hold exactly the bytes :meth:`encode` would splice in, sample
        after sample (see :func:`fill_records`); bytes and str fields come as a
        :class:`BytesColumn`.
        """
        split = self._split
        try:
            leaves = [split(s) for s in samples]
        except Exception:  # a dict without one of the keys, ...: the per-sample path says which
            return None
        if not leaves or any(x is None for x in leaves):
            return None
        try:
            return [convert(list(col)) for convert, col in zip(self._columns, zip(*leaves))]
        except _Mismatch:
            return None

    def stacked(self, leaves: Sequence[Any], n: int) -> list[Column] | None:
        """Per field, the typed column of ``n`` samples a source gave already stacked (leaf order); or None.

        A bytes or str field comes as a :class:`BytesColumn` (a str field's with ``text`` set).
        """
        if len(leaves) != len(self._stacked):
            return None
        try:
            return [check(leaf, n) for check, leaf in zip(self._stacked, leaves)]
        except _Mismatch:
            return None

    def records(self, columns: Sequence[Column]) -> tuple[np.ndarray, np.ndarray]:
        """Single-sample records of the samples in ``columns``: the joined bytes and the n + 1 record bounds."""
        if self.layout is not None:
            filled = fill_records(self.layout, columns)  # type: ignore[arg-type]
            return filled.reshape(-1), np.arange(len(filled) + 1, dtype=np.int64) * self.layout.length
        return fill_var_records(self.prefixes, self.signatures, columns)


_STRING_KINDS = ("bytes", "str")


def _payload_bytes(sig: LeafSignature) -> int:
    if sig.kind in _STRING_KINDS:
        return 0
    count = 1
    for d in sig.shape:
        count *= int(d)
    return count * _dtypes.by_name(sig.dtype).itemsize


def _prefixes(signatures: list[LeafSignature]) -> list[bytes | None] | None:
    """Per field, the bytes protobuf writes before its payload (None for bytes and str); None if not so simple.

    Derived from the real encoder: a fixed field's encoding must end with its
    payload and the whole record be the fields' encodings one after another.
    The bytes and str prefix (:func:`string_prefix`) is checked for lengths whose
    varints take one, two and three bytes.
    """
    prefixes: list[bytes | None] = []
    probes: list[Any] = []
    for sig in signatures:
        if sig.kind in _STRING_KINDS:
            for length in (0, 200, 20000):
                value = b"\x01" * length
                if encode_payloads([value], [sig]) != string_prefix(length) + value:
                    return None
            prefixes.append(None)
            probes.append(b"\x02" * 130)
            continue
        info = _dtypes.by_name(sig.dtype)
        size = _payload_bytes(sig)
        encoded = [
            encode_payloads([np.frombuffer(bytes([fill]) * size, info.numpy).reshape(sig.shape)], [sig])
            for fill in (0x00, 0xFF)
        ]
        head = encoded[0][: len(encoded[0]) - size]
        if len(encoded[0]) != len(encoded[1]) or encoded[1][: len(head)] != head:
            return None
        if encoded[0][len(head) :] != bytes(size) or encoded[1][len(head) :] != b"\xff" * size:
            return None
        prefixes.append(head)
        probes.append(np.frombuffer(b"\x03" * size, info.numpy).reshape(sig.shape))
    joined = b"".join(
        (p if p is not None else string_prefix(len(v))) + (v if isinstance(v, bytes) else v.tobytes())
        for p, v in zip(prefixes, probes)
    )
    return prefixes if encode_payloads(probes, signatures) == joined else None


@functools.lru_cache(maxsize=32)
def prefixes_of(signatures: tuple[LeafSignature, ...]) -> list[bytes | None] | None:
    """:func:`_prefixes` of these signatures (for columns given without their encoder), cached."""
    if sys.byteorder != "little" or any(
        s.kind not in _STRING_KINDS and s.kind not in _NUMBER_KINDS for s in signatures
    ):
        return None
    return _prefixes(list(signatures))


_NUMBER_KINDS = ("tensor", "ndarray", "int", "float", "bool")


#: fixed fields up to this many bytes are copied into variable-length records with one fancy index
_SMALL_FIELD = 256


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
    glue_sizes: list[np.ndarray | int] = []
    pieces: list[BytesColumn | None] = []  # per field, the values joined after its glue (None: all in the glue)
    blocks: list[np.ndarray | None] = []
    for prefix, sig, col in zip(prefixes, signatures, columns):
        if prefix is None:
            assert isinstance(col, BytesColumn)
            inner = 3 + _varint_len(col.lengths) + col.lengths
            glue_sizes.append(1 + _varint_len(inner) + 3 + _varint_len(col.lengths))
            pieces.append(col)
            blocks.append(None)
            continue
        size = _payload_bytes(sig)
        width = len(prefix) + size
        block = np.empty((n, width), np.uint8)
        block[:, : len(prefix)] = np.frombuffer(prefix, np.uint8)
        if size:
            block[:, len(prefix) :] = np.ascontiguousarray(col).reshape(n, -1).view(np.uint8).reshape(n, size)
        if width <= _SMALL_FIELD:
            glue_sizes.append(width)
            pieces.append(None)
        else:  # a large fixed field: its rows are joined like values
            glue_sizes.append(0)
            pieces.append(BytesColumn(block.reshape(-1), np.arange(n, dtype=np.int64) * width, np.full(n, width)))
        blocks.append(block)
    glue_lengths = np.zeros(n, np.int64)
    for glue_size in glue_sizes:
        glue_lengths += glue_size
    glue_bounds = np.zeros(n + 1, np.int64)
    np.cumsum(glue_lengths, out=glue_bounds[1:])
    glue = np.empty(int(glue_bounds[-1]), np.uint8)
    at = glue_bounds[:-1].copy()
    cuts: list[np.ndarray] = []  # where each joined field's values go into the glue of each sample
    for fixed, piece in zip(blocks, pieces):
        if fixed is None:
            assert piece is not None
            glue[at] = 0x0A
            inner = 3 + _varint_len(piece.lengths) + piece.lengths
            at = _put_varints(glue, at + 1, inner)
            glue[at] = 0x10
            glue[at + 1] = 0x04
            glue[at + 2] = 0x32
            at = _put_varints(glue, at + 3, piece.lengths)
        elif piece is None:
            width = fixed.shape[1]
            glue[at[:, None] + np.arange(width)] = fixed
            at = at + width
        if piece is not None:
            cuts.append(at)
    joined = [p for p in pieces if p is not None]
    if not joined:
        return glue, glue_bounds
    lengths = glue_lengths.copy()
    for piece in joined:
        lengths += piece.lengths
    bounds = np.zeros(n + 1, np.int64)
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


class _Mismatch(Exception):
    """A leaf differs from the first sample's (the sample takes the general path)."""


_INT = struct.Struct("<q")
_FLOAT = struct.Struct("<d")


def _leaf_encoder(sig: LeafSignature) -> _Leaf | None:
    kind = sig.kind
    if kind == "int":
        return _encode_int
    if kind == "float":
        return _encode_float
    if kind == "bool":
        return _encode_bool
    if kind == "bytes":
        return _encode_bytes
    if kind == "str":
        return _encode_str
    info = _dtypes.by_name(sig.dtype)
    shape = tuple(sig.shape)
    if sig.from_list:
        return _list_encoder(info.name, shape)
    checks_bools = info.name == "bool"
    if kind == "tensor":
        if info.name == "bfloat16":
            return None
        torch_dtype = info.torch

        def tensor(x: Any) -> np.ndarray:
            if type(x) is not torch.Tensor or x.dtype is not torch_dtype:
                raise _Mismatch
            try:
                arr = x.numpy()  # raises for tensors on other devices or needing grad
            except (RuntimeError, TypeError):
                raise _Mismatch from None
            if arr.shape != shape or not arr.flags.c_contiguous or (checks_bools and _not_01(arr)):
                raise _Mismatch
            return arr  # joined through the buffer protocol: no intermediate copy

        return tensor
    if kind == "ndarray":
        np_dtype = info.numpy

        def array(x: Any) -> np.ndarray:
            if type(x) is not np.ndarray or x.dtype != np_dtype or x.shape != shape or not x.flags.c_contiguous:
                if isinstance(x, np.generic) and x.dtype == np_dtype and shape == () and not checks_bools:
                    return x  # type: ignore[return-value]  # a NumPy scalar: a 0-d leaf
                raise _Mismatch
            if checks_bools and _not_01(x):
                raise _Mismatch  # the general path names the field
            return x

        return array
    return None


def _column_encoder(sig: LeafSignature) -> Callable[[list[Any]], Column]:
    """Many samples' leaves of one field -> their typed column; raises _Mismatch where encode() would refuse."""
    kind = sig.kind
    if kind == "bytes":

        def blobs(col: list[Any]) -> Column:
            if not all(type(x) is bytes for x in col):
                raise _Mismatch
            return BytesColumn.of(col)

        return blobs
    if kind == "str":

        def texts(col: list[Any]) -> Column:
            if not all(type(x) is str for x in col):
                raise _Mismatch
            try:
                return BytesColumn.of([x.encode("utf-8") for x in col], text=True)
            except UnicodeEncodeError:  # a lone surrogate: the general path names the field
                raise _Mismatch from None

        return texts
    if kind in ("int", "float", "bool"):
        typ, dtype = {"int": (int, "<i8"), "float": (float, "<f8"), "bool": (bool, "?")}[kind]

        def scalars(col: list[Any]) -> np.ndarray:
            if not all(type(x) is typ for x in col):
                raise _Mismatch
            try:
                return np.array(col, dtype=dtype)
            except OverflowError:
                raise _Mismatch from None

        return scalars
    if sig.from_list or kind not in ("tensor", "ndarray"):
        one = _leaf_encoder(sig)

        def each(col: list[Any]) -> np.ndarray:
            if one is None:
                raise _Mismatch
            return np.stack([np.asarray(one(x)) for x in col])

        return each
    info = _dtypes.by_name(sig.dtype)
    check = _stacked_check(sig, "ndarray")
    np_dtype = info.numpy

    def stack(arrays: list[np.ndarray]) -> np.ndarray:
        # NumPy, not torch.stack: torch's parallel kernels hang in a process forked after its parent used them
        try:
            stacked = np.array(arrays)  # one C loop; arrays of different shapes raise (checked below too)
        except ValueError:
            raise _Mismatch from None
        return check(stacked, len(arrays))  # type: ignore[return-value]  # a numeric field: an array

    if kind == "tensor":
        torch_dtype = info.torch

        def tensors(col: list[Any]) -> np.ndarray:
            if not all(type(x) is torch.Tensor and x.dtype is torch_dtype for x in col):
                raise _Mismatch
            try:
                return stack([x.numpy() for x in col])  # raises for tensors on other devices or needing grad
            except (RuntimeError, TypeError):
                raise _Mismatch from None

        return tensors

    def arrays(col: list[Any]) -> np.ndarray:
        if not all(type(x) is np.ndarray and x.dtype == np_dtype for x in col):
            raise _Mismatch
        return stack(col)

    return arrays


def _stacked_check(sig: LeafSignature, given: str | None = None) -> Callable[[Any, int], Column]:
    """A column of n samples given stacked (tensor or array [n, ...]) -> its contiguous array, checked.

    Python scalar fields (int, float, bool) come as an array [n] of int64, float64 or bool.
    ``given``: the kind the column comes as, when not the field's (tensors stacked as an array).
    A bytes or str field comes as a :class:`BytesColumn` (for str, one whose producer checked UTF-8).
    """
    if sig.kind in _STRING_KINDS:
        text = sig.kind == "str"

        def strings(x: Any, n: int) -> Column:
            if type(x) is not BytesColumn or len(x) != n or (text and not x.text):
                raise _Mismatch
            return x

        return strings
    try:
        info: _dtypes.DTypeInfo | None = _dtypes.by_name(sig.dtype)
    except KeyError:
        info = None
    shape = tuple(sig.shape)
    checks_bools = sig.dtype == "bool"
    kind = given or sig.kind
    np_dtype = info.numpy if info is not None else None

    def check(x: Any, n: int) -> np.ndarray:
        # Python scalars (int, float, bool) come as a 1-d array of their dtype (int64, float64, bool)
        if info is None or sig.from_list or sig.kind not in _NUMBER_KINDS or info.name == "bfloat16":
            raise _Mismatch
        if kind == "tensor":
            if type(x) is not torch.Tensor or x.dtype is not info.torch:
                raise _Mismatch
            try:
                x = x.numpy()  # raises for tensors on other devices or needing grad
            except (RuntimeError, TypeError):
                raise _Mismatch from None
        elif type(x) is not np.ndarray or x.dtype != np_dtype:
            raise _Mismatch
        if x.shape != (n, *shape):
            raise _Mismatch
        arr = np.ascontiguousarray(x)
        if checks_bools and _not_01(arr):
            raise _Mismatch
        return arr

    return check


def _not_01(arr: np.ndarray) -> bool:
    """True when a bool array holds bytes other than 0 and 1 (readers refuse them)."""
    return bool(arr.size) and int(arr.view(np.uint8).max()) > 1


def _list_encoder(dtype: str, shape: tuple[int, ...]) -> _Leaf:
    """A list of Python numbers of the first sample's length and dtype (see ``_structure``)."""

    def encode(x: Any) -> np.ndarray:
        if type(x) is not list or len(x) != shape[0] or number_list_dtype(x) != dtype:
            raise _Mismatch
        try:
            return number_list_array(x)
        except ValueError:
            raise _Mismatch from None

    return encode


def _encode_int(x: Any) -> bytes:
    if type(x) is not int:
        raise _Mismatch
    try:
        return _INT.pack(x)
    except struct.error:
        raise _Mismatch from None


def _encode_float(x: Any) -> bytes:
    if type(x) is not float:
        raise _Mismatch
    return _FLOAT.pack(x)


def _encode_bytes(x: Any) -> bytes:
    if type(x) is not bytes:
        raise _Mismatch
    return x


def _encode_str(x: Any) -> bytes:
    if type(x) is not str:
        raise _Mismatch
    try:
        return x.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: the general path names the field
        raise _Mismatch from None


def _encode_bool(x: Any) -> bytes:
    if type(x) is not bool:
        raise _Mismatch
    return b"\x01" if x else b"\x00"
