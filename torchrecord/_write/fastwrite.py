"""Encode samples of a fixed structure without protobuf, byte for byte as protobuf would.

Two forms: :meth:`FastEncoder.encode` makes one sample's record;
:meth:`FastEncoder.columns` turns many samples into one typed column per field
(or takes columns a source gave already stacked, :meth:`FastEncoder.stacked`),
and :meth:`FastEncoder.records` writes whole records from such columns in a few
NumPy operations (``record_fill``), with no per-sample Python work beyond the
type checks (``fast_leaves``).

Built from the first sample: when it is a flat tuple, list or dict (or a single
leaf) of fixed-shape tensors, arrays and Python scalars, every following sample
with the same leaf types, dtypes and shapes encodes to the same bytes as the
first one's except inside the payloads (see ``torchrecord._core.layout``). The
encoder checks each sample against that signature and splices its payloads
between the template's header bytes; any sample that does not match returns
None and takes the general path (which widens the schema or raises).

``bytes`` and ``str`` fields (encoded images, captions) have a variable length:
only their two length varints change from sample to sample, so each such field
is its length prefix (:func:`~torchrecord._write.record_fill.string_prefix`) and
its bytes; a column of them is a :class:`~torchrecord._write.bytes_column.BytesColumn`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.codec import encode_payloads
from torchrecord._core.layout import FixedLayout
from torchrecord._core.schema import LeafSignature, Schema
from torchrecord._core.structure import Tree
from torchrecord._write.bytes_column import BytesColumn, Column, concat_columns
from torchrecord._write.fast_leaves import NUMBER_KINDS, Leaf, Mismatch, column_encoder, leaf_encoder, stacked_check
from torchrecord._write.record_fill import STRING_KINDS, fill_records, fill_var_records, payload_bytes, string_prefix

__all__ = [
    "BytesColumn",
    "Column",
    "FastEncoder",
    "concat_columns",
    "fill_records",
    "fill_var_records",
    "prefixes_of",
    "string_prefix",
]


class FastEncoder:
    """Encodes samples shaped like the first one; None for any other sample."""

    def __init__(
        self,
        tree: Tree,
        signatures: list[LeafSignature],
        layout: FixedLayout | None,
        leaf_encoders: list[Leaf],
        prefixes: list[bytes | None],
    ) -> None:
        self.tree = tree
        self.signatures = signatures
        #: the layout of whole records (all fields fixed), else None (bytes or str fields)
        self.layout = layout
        #: per field, the record bytes before its payload (fixed fields), None for bytes and str
        self.prefixes = prefixes
        #: the bytes a record takes besides its bytes and str values
        self.length = sum(len(p) + payload_bytes(sig) if p is not None else 6 for p, sig in zip(prefixes, signatures))
        self._leaves = leaf_encoders
        self._columns = [column_encoder(sig) for sig in signatures]
        self._stacked = [stacked_check(sig) for sig in signatures]
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
        if layout is None and not all(f.is_fixed or f.kind in STRING_KINDS for f in schema.fields):
            return None
        encoders = [leaf_encoder(sig) for sig in signatures]
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
        except Mismatch:
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
        except Mismatch:
            return None

    def stacked(self, leaves: Sequence[Any], n: int) -> list[Column] | None:
        """Per field, the typed column of ``n`` samples a source gave already stacked (leaf order); or None.

        A bytes or str field comes as a :class:`BytesColumn` (a str field's with ``text`` set).
        """
        if len(leaves) != len(self._stacked):
            return None
        try:
            return [check(leaf, n) for check, leaf in zip(self._stacked, leaves)]
        except Mismatch:
            return None

    def records(self, columns: Sequence[Column]) -> tuple[np.ndarray, np.ndarray]:
        """Single-sample records of the samples in ``columns``: the joined bytes and the n + 1 record bounds."""
        if self.layout is not None:
            filled = fill_records(self.layout, columns)  # type: ignore[arg-type]
            return filled.reshape(-1), np.arange(len(filled) + 1, dtype=np.int64) * self.layout.length
        return fill_var_records(self.prefixes, self.signatures, columns)


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
        if sig.kind in STRING_KINDS:
            for length in (0, 200, 20000):
                value = b"\x01" * length
                if encode_payloads([value], [sig]) != string_prefix(length) + value:
                    return None
            prefixes.append(None)
            probes.append(b"\x02" * 130)
            continue
        info = _dtypes.by_name(sig.dtype)
        size = payload_bytes(sig)
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
    if sys.byteorder != "little" or any(s.kind not in STRING_KINDS and s.kind not in NUMBER_KINDS for s in signatures):
        return None
    return _prefixes(list(signatures))
