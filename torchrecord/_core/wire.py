"""The wire fast path for records with strings: read a record's fields by hand, straight from its bytes.

A record set whose fields are ``bytes``/``str`` or numeric with a fixed shape
(e.g. ``(jpeg_bytes, label)``) has no fixed byte layout (``_core.layout``), but
every record still has one of a few exact forms, because one encoder
(``codec.encode_payloads``) wrote it: per field, the ``TensorProtos.protos``
tag and length, then

* a string field: ``data_type = STRING`` and one ``string_data`` element (a chunk
  of ``rows`` samples: ``dims = [rows]`` first, then ``rows`` elements);
* a numeric field: the same header bytes before its ``raw_data`` in every record
  (dims, data type, ``storage_type = RAW``, the payload's length), then the payload.

:class:`WireDecoder` checks a record against exactly these forms (every tag,
every length, the whole value consumed, bool bytes 0 or 1, UTF-8) while it reads
the fields, without building protobuf objects. The numeric headers come from the
real encoder (probe records, as for the fixed layout), so they cannot disagree
with what the writer produces. Any record that differs in any byte (a compressed
payload, another encoder's field order, unknown fields, damage) makes the decoder
return None, and the caller decodes it the checked slow way (``codec.decode_leaves``),
which accepts it or raises the error naming the file, record and field. So a record
the fast path reads is one the slow path reads the same: same kinds, dtypes, values.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.codec import encode_payloads
from torchrecord._core.kinds import materialize, sample_builder
from torchrecord._core.schema import Field, LeafSignature, Schema
from torchrecord._core.varint import encode_varint, read_varint

__all__ = ["WireDecoder"]

# how each field is read (the leaf the slow path's ``materialize`` would give)
_BYTES, _STR, _INT, _FLOAT, _BOOL, _ARRAY = range(6)
#: a string element of one sample: data_type = STRING (field 2, value 4), then string_data's tag (field 6)
_ONE_STRING = b"\x10\x04\x32"
_STRING_TAG = 0x32
_PROTOS_TAG = 0x0A
_DOUBLE = struct.Struct("<d")
#: scalar kinds read without NumPy, with the only dtype the writer gives them
_SCALARS = {("int", "int64"): _INT, ("float", "float64"): _FLOAT, ("bool", "bool"): _BOOL}


class _Spec:
    """How one field is read: its reading mode, numeric header bytes and payload size (per rows)."""

    __slots__ = ("field", "heads", "mode", "nbytes", "numpy", "shape")

    def __init__(self, fld: Field) -> None:
        self.field = fld
        if not fld.is_numeric:
            self.mode = _BYTES if fld.kind == "bytes" else _STR
            self.shape: tuple[int, ...] = ()
            self.numpy: Any = None
            self.nbytes = 0
        else:
            self.shape = tuple(int(d or 0) for d in fld.shape)
            info = _dtypes.by_name(fld.dtype)
            self.numpy = info.numpy
            self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * info.itemsize
            self.mode = _SCALARS.get((fld.kind, fld.dtype), _ARRAY) if not self.shape else _ARRAY
        self.heads: dict[int | None, bytes | None] = {}  # rows (None: one sample) -> the bytes before the payload

    def head(self, rows: int | None) -> bytes | None:
        """The bytes of a numeric element before its payload (``0A len dims... raw_data-tag len``), or None."""
        if rows in self.heads:
            return self.heads[rows]
        shape = self.shape if rows is None else (rows, *self.shape)
        size = self.nbytes * (1 if rows is None else rows)
        sig = LeafSignature(self.field.kind, self.field.dtype, self.shape)
        encoded = [
            encode_payloads([np.frombuffer(bytes([fill]) * size, self.numpy).reshape(shape)], [sig])
            for fill in (0x00, 0xFF)
        ]
        head: bytes | None = encoded[0][: len(encoded[0]) - size]
        # the payload must be the element's last bytes, and everything before it the same in both probes
        if (
            len(encoded[0]) != len(encoded[1])
            or encoded[1][: len(encoded[1]) - size] != head
            or encoded[0][len(encoded[0]) - size :] != bytes(size)
        ):
            head = None  # cannot happen with the encoder as it is; be safe rather than fast
        self.heads[rows] = head
        return head


class WireDecoder:
    """Reads the records of a schema of strings and fixed-shape numeric fields by hand (see the module).

    Build it with :meth:`of` (None when the schema has a variable-shape numeric field).
    """

    def __init__(self, schema: Schema) -> None:
        fields = schema.fields
        self.fields = tuple(fields)
        #: the sample of its leaves, in the written structure (``structure.unflatten``, quicker for flat ones)
        self.build = sample_builder(schema.tree)
        self.specs = [_Spec(f) for f in fields]
        for spec in self.specs:
            if spec.mode not in (_BYTES, _STR):
                spec.head(None)

    @classmethod
    def of(cls, schema: Schema) -> WireDecoder | None:
        """The decoder of ``schema``'s records, or None when the fast path does not apply to them."""
        fields = schema.fields
        if not fields or any(f.is_numeric and not f.is_fixed for f in fields):
            return None
        return cls(schema)

    def leaves(self, value: bytes | memoryview) -> list[Any] | None:
        """The leaves of a record of one sample, each of the kind it was written as; None: not the usual form."""
        v = value  # bytes, or a view of the LMDB map: only the payloads are copied out
        p = 0
        out: list[Any] = []
        try:
            for spec in self.specs:
                mode = spec.mode
                if v[p] != _PROTOS_TAG:
                    return None
                if mode <= _STR:
                    size = v[p + 1]  # the element's length: one byte up to 127, two up to 16 KiB
                    q = p + 2
                    if size >= 0x80:
                        b = v[q]
                        if b < 0x80:
                            size, q = (size & 0x7F) | b << 7, q + 1
                        else:
                            size, q = read_varint(v, p + 1)
                    if v[q : q + 3] != _ONE_STRING:
                        return None
                    n = v[q + 3]
                    r = q + 4
                    if n >= 0x80:  # two bytes up to 16 KiB, inline; longer ones by the loop
                        b = v[r]
                        if b < 0x80:
                            n, r = (n & 0x7F) | b << 7, r + 1
                        else:
                            n, r = read_varint(v, q + 3)
                    p = r + n
                    if p != q + size:
                        return None
                    out.append(bytes(v[r:p]) if mode == _BYTES else str(v[r:p], "utf-8"))
                    continue
                head = spec.heads[None]
                if head is None or v[p : p + len(head)] != head:
                    return None
                a = p + len(head)
                p = a + spec.nbytes
                if mode == _INT:
                    out.append(int.from_bytes(v[a:p], "little", signed=True))
                elif mode == _FLOAT:
                    out.append(_DOUBLE.unpack_from(v, a)[0])
                elif mode == _BOOL:
                    b = v[a]
                    if b > 1:
                        return None
                    out.append(b == 1)
                else:
                    out.append(self._array(spec, v, a, None))
        except (IndexError, ValueError, struct.error, UnicodeDecodeError):
            return None
        return out if p == len(v) else None

    def columns(self, value: bytes | memoryview, rows: int) -> list[Any] | None:
        """The fields of a chunk of ``rows`` samples: per field a list of leaves, or an array to
        :func:`~torchrecord._core.kinds.materialize` row by row; None: not the usual form."""
        v = value  # bytes, or a view of the LMDB map: only the payloads are copied out
        p = 0
        out: list[Any] = []
        try:
            for spec in self.specs:
                if v[p] != _PROTOS_TAG:
                    return None
                size, q = read_varint(v, p + 1)
                end = q + size
                if spec.mode <= _STR:
                    lead = b"\x08" + encode_varint(rows) + b"\x10\x04"  # dims = [rows], data_type = STRING
                    if v[q : q + len(lead)] != lead:
                        return None
                    r = q + len(lead)
                    items: list[Any] = []
                    for _ in range(rows):
                        if v[r] != _STRING_TAG:
                            return None
                        n, r = read_varint(v, r + 1)
                        items.append(bytes(v[r : r + n]))
                        r += n
                    if r != end or r > len(v):
                        return None
                    if spec.mode == _STR:
                        items = [b.decode("utf-8") for b in items]
                    out.append(items)
                    p = end
                    continue
                head = spec.head(rows)
                if head is None or v[p : p + len(head)] != head:
                    return None
                a = p + len(head)
                p = a + spec.nbytes * rows
                if p != end:
                    return None
                column = self._array(spec, v, a, rows)
                out.append(column if spec.mode == _ARRAY else column.tolist())
        except (IndexError, ValueError, struct.error, UnicodeDecodeError):
            return None
        return out if p == len(v) else None

    @staticmethod
    def _array(spec: _Spec, v: bytes | memoryview, at: int, rows: int | None) -> Any:
        """A numeric payload: a materialized leaf (one sample), or the read-only column (``rows``)."""
        shape = spec.shape if rows is None else (rows, *spec.shape)
        count = int(np.prod(shape, dtype=np.int64))
        arr = np.frombuffer(v, spec.numpy, count=count, offset=at).reshape(shape)
        arr.flags.writeable = False  # a view of the record (or of the map): materialize copies it
        if spec.field.dtype == "bool" and count and arr.view(np.uint8).max() > 1:
            raise ValueError("bool bytes other than 0 and 1")  # the slow path names the field
        if rows is not None:
            return arr
        return materialize(arr, spec.field, "")
