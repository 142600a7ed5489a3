"""The fast encoder's checks of the user's leaves: one sample's leaf into its payload, many samples' leaves
into a typed column, a column given stacked checked.

Each function is built once per field from the first sample's signature, and
raises :class:`Mismatch` for a leaf the general path must take (another type,
dtype or shape, a tensor on another device or needing grad, bool bytes other
than 0 and 1, a lone surrogate): that path widens the schema or names the field.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.codec import number_list_array
from torchrecord._core.schema import LeafSignature
from torchrecord._core.structure import number_list_dtype
from torchrecord._write.bytes_column import BytesColumn, Column
from torchrecord._write.record_fill import STRING_KINDS

__all__ = ["Leaf", "Mismatch", "NUMBER_KINDS", "column_encoder", "leaf_encoder", "stacked_check"]

#: one sample's leaf -> its payload (bytes, or an array joined through the buffer protocol)
Leaf = Callable[[Any], "bytes | np.ndarray"]
#: the kinds of numeric fields
NUMBER_KINDS = ("tensor", "ndarray", "int", "float", "bool")


class Mismatch(Exception):
    """A leaf differs from the first sample's (the sample takes the general path)."""


_INT = struct.Struct("<q")
_FLOAT = struct.Struct("<d")


def leaf_encoder(sig: LeafSignature) -> Leaf | None:
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
                raise Mismatch
            try:
                arr = x.numpy()  # raises for tensors on other devices or needing grad
            except (RuntimeError, TypeError):
                raise Mismatch from None
            if arr.shape != shape or not arr.flags.c_contiguous or (checks_bools and _not_01(arr)):
                raise Mismatch
            return arr  # joined through the buffer protocol: no intermediate copy

        return tensor
    if kind == "ndarray":
        np_dtype = info.numpy

        def array(x: Any) -> np.ndarray:
            if type(x) is not np.ndarray or x.dtype != np_dtype or x.shape != shape or not x.flags.c_contiguous:
                if isinstance(x, np.generic) and x.dtype == np_dtype and shape == () and not checks_bools:
                    return x  # type: ignore[return-value]  # a NumPy scalar: a 0-d leaf
                raise Mismatch
            if checks_bools and _not_01(x):
                raise Mismatch  # the general path names the field
            return x

        return array
    return None


def column_encoder(sig: LeafSignature) -> Callable[[list[Any]], Column]:
    """Many samples' leaves of one field -> their typed column; raises Mismatch where encode() would refuse."""
    kind = sig.kind
    if kind == "bytes":

        def blobs(col: list[Any]) -> Column:
            if not all(type(x) is bytes for x in col):
                raise Mismatch
            return BytesColumn.of(col)

        return blobs
    if kind == "str":

        def texts(col: list[Any]) -> Column:
            if not all(type(x) is str for x in col):
                raise Mismatch
            try:
                return BytesColumn.of([x.encode("utf-8") for x in col], text=True)
            except UnicodeEncodeError:  # a lone surrogate: the general path names the field
                raise Mismatch from None

        return texts
    if kind in ("int", "float", "bool"):
        typ, dtype = {"int": (int, "<i8"), "float": (float, "<f8"), "bool": (bool, "?")}[kind]

        def scalars(col: list[Any]) -> np.ndarray:
            if not all(type(x) is typ for x in col):
                raise Mismatch
            try:
                return np.array(col, dtype=dtype)
            except OverflowError:
                raise Mismatch from None

        return scalars
    if sig.from_list or kind not in ("tensor", "ndarray"):
        one = leaf_encoder(sig)

        def each(col: list[Any]) -> np.ndarray:
            if one is None:
                raise Mismatch
            return np.stack([np.asarray(one(x)) for x in col])

        return each
    info = _dtypes.by_name(sig.dtype)
    check = stacked_check(sig, "ndarray")
    np_dtype = info.numpy

    def stack(arrays: list[np.ndarray]) -> np.ndarray:
        # NumPy, not torch.stack: torch's parallel kernels hang in a process forked after its parent used them
        try:
            stacked = np.array(arrays)  # one C loop; arrays of different shapes raise (checked below too)
        except ValueError:
            raise Mismatch from None
        return check(stacked, len(arrays))  # type: ignore[return-value]  # a numeric field: an array

    if kind == "tensor":
        torch_dtype = info.torch

        def tensors(col: list[Any]) -> np.ndarray:
            if not all(type(x) is torch.Tensor and x.dtype is torch_dtype for x in col):
                raise Mismatch
            try:
                return stack([x.numpy() for x in col])  # raises for tensors on other devices or needing grad
            except (RuntimeError, TypeError):
                raise Mismatch from None

        return tensors

    def arrays(col: list[Any]) -> np.ndarray:
        if not all(type(x) is np.ndarray and x.dtype == np_dtype for x in col):
            raise Mismatch
        return stack(col)

    return arrays


def stacked_check(sig: LeafSignature, given: str | None = None) -> Callable[[Any, int], Column]:
    """A column of n samples given stacked (tensor or array [n, ...]) -> its contiguous array, checked.

    Python scalar fields (int, float, bool) come as an array [n] of int64, float64 or bool.
    ``given``: the kind the column comes as, when not the field's (tensors stacked as an array).
    A bytes or str field comes as a :class:`BytesColumn` (for str, one whose producer checked UTF-8).
    """
    if sig.kind in STRING_KINDS:
        text = sig.kind == "str"

        def strings(x: Any, n: int) -> Column:
            if type(x) is not BytesColumn or len(x) != n or (text and not x.text):
                raise Mismatch
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
        if info is None or sig.from_list or sig.kind not in NUMBER_KINDS or info.name == "bfloat16":
            raise Mismatch
        if kind == "tensor":
            if type(x) is not torch.Tensor or x.dtype is not info.torch:
                raise Mismatch
            try:
                x = x.numpy()  # raises for tensors on other devices or needing grad
            except (RuntimeError, TypeError):
                raise Mismatch from None
        elif type(x) is not np.ndarray or x.dtype != np_dtype:
            raise Mismatch
        if x.shape != (n, *shape):
            raise Mismatch
        arr = np.ascontiguousarray(x)
        if checks_bools and _not_01(arr):
            raise Mismatch
        return arr

    return check


def _not_01(arr: np.ndarray) -> bool:
    """True when a bool array holds bytes other than 0 and 1 (readers refuse them)."""
    return bool(arr.size) and int(arr.view(np.uint8).max()) > 1


def _list_encoder(dtype: str, shape: tuple[int, ...]) -> Leaf:
    """A list of Python numbers of the first sample's length and dtype (see ``_structure``)."""

    def encode(x: Any) -> np.ndarray:
        if type(x) is not list or len(x) != shape[0] or number_list_dtype(x) != dtype:
            raise Mismatch
        try:
            return number_list_array(x)
        except ValueError:
            raise Mismatch from None

    return encode


def _encode_int(x: Any) -> bytes:
    if type(x) is not int:
        raise Mismatch
    try:
        return _INT.pack(x)
    except struct.error:
        raise Mismatch from None


def _encode_float(x: Any) -> bytes:
    if type(x) is not float:
        raise Mismatch
    return _FLOAT.pack(x)


def _encode_bytes(x: Any) -> bytes:
    if type(x) is not bytes:
        raise Mismatch
    return x


def _encode_str(x: Any) -> bytes:
    if type(x) is not str:
        raise Mismatch
    try:
        return x.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: the general path names the field
        raise Mismatch from None


def _encode_bool(x: Any) -> bytes:
    if type(x) is not bool:
        raise Mismatch
    return b"\x01" if x else b"\x00"
