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
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.codec import number_list_array
from torchrecord._core.layout import FixedLayout
from torchrecord._core.schema import LeafSignature, Schema
from torchrecord._core.structure import Tree, number_list_dtype

__all__ = ["FastEncoder", "fill_records"]

_Leaf = Callable[[Any], "bytes | np.ndarray"]


class FastEncoder:
    """Encodes samples shaped like the first one; None for any other sample."""

    def __init__(
        self, tree: Tree, signatures: list[LeafSignature], layout: FixedLayout, leaf_encoders: list[_Leaf]
    ) -> None:
        self.tree = tree
        self.signatures = signatures
        self.layout = layout
        self._leaves = leaf_encoders
        self._columns = [_column_encoder(sig) for sig in signatures]
        self._stacked = [_stacked_check(sig) for sig in signatures]
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
        self._parts: list[Any] = []
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
        if layout is None:
            return None
        encoders = [_leaf_encoder(sig) for sig in signatures]
        if any(e is None for e in encoders):
            return None
        return cls(tree, signatures, layout, encoders)  # type: ignore[arg-type]

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
        parts = self._parts.copy()  # [header, payload, header, payload, ..., header]
        parts[1::2] = payloads
        return b"".join(parts)

    def columns(self, samples: Sequence[Any]) -> list[np.ndarray] | None:
        """Per field, the typed column [n, ...] of ``samples``; None unless every sample fits this encoder.

        The columns hold exactly the bytes :meth:`encode` would splice in, sample
        after sample (see :func:`fill_records`).
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

    def stacked(self, leaves: Sequence[Any], n: int) -> list[np.ndarray] | None:
        """Per field, the typed column of ``n`` samples a source gave already stacked (leaf order); or None."""
        if len(leaves) != len(self._stacked):
            return None
        try:
            return [check(leaf, n) for check, leaf in zip(self._stacked, leaves)]
        except _Mismatch:
            return None


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


def _column_encoder(sig: LeafSignature) -> Callable[[list[Any]], np.ndarray]:
    """Many samples' leaves of one field -> their typed column; raises _Mismatch where encode() would refuse."""
    kind = sig.kind
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
        return check(stacked, len(arrays))

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


def _stacked_check(sig: LeafSignature, given: str | None = None) -> Callable[[Any, int], np.ndarray]:
    """A column of n samples given stacked (tensor or array [n, ...]) -> its contiguous array, checked.

    ``given``: the kind the column comes as, when not the field's (tensors stacked as an array).
    """
    try:
        info: _dtypes.DTypeInfo | None = _dtypes.by_name(sig.dtype)
    except KeyError:
        info = None
    shape = tuple(sig.shape)
    checks_bools = sig.dtype == "bool"
    kind = given or sig.kind
    np_dtype = info.numpy if info is not None else None

    def check(x: Any, n: int) -> np.ndarray:
        if info is None or sig.from_list or sig.kind not in ("tensor", "ndarray") or info.name == "bfloat16":
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


def _encode_bool(x: Any) -> bytes:
    if type(x) is not bool:
        raise _Mismatch
    return b"\x01" if x else b"\x00"
