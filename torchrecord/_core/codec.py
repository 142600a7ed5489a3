"""Encode a sample's leaves as one TensorProtos message, and decode it back.

This is the general, per-record codec: every record is parsed by protobuf and
every field checked against the schema before a single byte is trusted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from google.protobuf.message import DecodeError

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.compress import codec_of_storage, decompress
from torchrecord._core.schema import MAX_RANK, Field, LeafSignature
from torchrecord._core.structure import number_list_dtype
from torchrecord._proto import torchrecord_pb2 as pb
from torchrecord.errors import CorruptRecordError, SampleTypeError, SampleValueError

__all__ = ["decode_leaves", "encode_payloads", "leaf_payload", "number_list_array"]

_RAW = pb.TensorProto.StorageType.RAW
_STRING = pb.TensorProto.DataType.STRING

Payload = np.ndarray | bytes
#: The largest payload a compressed field may expand to (a damaged shape must not allocate terabytes).
_MAX_EXPANDED = 1 << 33


def leaf_payload(leaf: Any) -> tuple[LeafSignature, Payload]:
    """Normalize one leaf to its signature and its bytes-to-store.

    Numeric leaves become little-endian, C-contiguous arrays; strings become bytes;
    a list of Python numbers (see ``_structure.number_list_dtype``) becomes a 1-d
    array. Raises TypeError for a leaf type torchrecord cannot store, ValueError
    for values every reader would refuse (bool bytes other than 0 and 1, rank
    above 32, ints beyond int64).
    """
    if isinstance(leaf, torch.Tensor):
        info = _dtypes.from_torch(leaf.dtype)
        t = leaf.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        arr = t.view(torch.uint16).numpy() if info.name == "bfloat16" else t.numpy()
        arr = np.asarray(arr, dtype=info.numpy, order="C")  # keeps 0-d (ascontiguousarray makes it 1-d)
        return LeafSignature("tensor", info.name, _checked(arr, info.name)), arr
    if isinstance(leaf, (np.ndarray, np.generic)):
        info = _dtypes.from_numpy(leaf.dtype)
        arr = np.asarray(leaf, dtype=info.numpy, order="C")
        return LeafSignature("ndarray", info.name, _checked(arr, info.name)), arr
    if isinstance(leaf, bool):
        return LeafSignature("bool", "bool", ()), np.array(leaf, dtype="?")
    if isinstance(leaf, int):
        try:
            arr = np.array(leaf, dtype="<i8")
        except OverflowError:
            raise SampleValueError(f"int {leaf} does not fit in int64; store it as a str or a float") from None
        return LeafSignature("int", "int64", ()), arr
    if isinstance(leaf, float):
        return LeafSignature("float", "float64", ()), np.array(leaf, dtype="<f8")
    if isinstance(leaf, (bytes, bytearray, memoryview)):
        return LeafSignature("bytes", "bytes", ()), bytes(leaf)
    if isinstance(leaf, str):
        return LeafSignature("str", "str", ()), leaf.encode("utf-8")
    if isinstance(leaf, list):  # only lists of numbers of one kind are leaves
        arr = number_list_array(leaf)
        return LeafSignature("tensor", str(arr.dtype.name), arr.shape, from_list=True), arr
    raise SampleTypeError(
        f"cannot store a leaf of type {type(leaf).__name__}; use a tensor, NumPy array, "
        "Python scalar, bytes or str (inside tuples, lists or dicts)"
    )


_LIST_DTYPES = {"bool": np.dtype("?"), "int64": np.dtype("<i8"), "float64": np.dtype("<f8")}


def number_list_array(items: list[Any]) -> np.ndarray:
    """The 1-d array of a list of Python numbers (ValueError for ints beyond int64)."""
    name = number_list_dtype(items)
    assert name is not None, "not a list of numbers"
    try:
        return np.array(items, dtype=_LIST_DTYPES[name])
    except OverflowError:
        raise SampleValueError("a list item does not fit in int64; store such numbers as floats or strs") from None


def _checked(arr: np.ndarray, dtype: str) -> tuple[int, ...]:
    """The shape of an array readers will accept: rank at most 32, bools only 0 or 1."""
    if arr.ndim > MAX_RANK:
        raise SampleValueError(
            f"rank {arr.ndim} (shape {list(arr.shape)}) is above the {MAX_RANK} dimensions readers accept; reshape it"
        )
    if dtype == "bool" and arr.size and arr.view(np.uint8).max() > 1:
        raise SampleValueError(
            "bool data holds bytes other than 0 and 1 (made by viewing other data as bool); "
            "convert it with x != 0 (or x.astype(bool) on the original data)"
        )
    return tuple(arr.shape)


def encode_payloads(payloads: Sequence[Payload | list[bytes]], signatures: Sequence[LeafSignature]) -> bytes:
    """Serialize leaves (from :func:`leaf_payload`) as one TensorProtos message.

    A chunk of several samples passes each numeric field stacked along a new
    first axis, and each string field as a list of bytes (stored with dims [k]).
    """
    msg = pb.TensorProtos()
    for payload, sig in zip(payloads, signatures):
        proto = msg.protos.add()
        if isinstance(payload, bytes):
            proto.data_type = _STRING
            proto.string_data.append(payload)
        elif isinstance(payload, list):
            proto.dims.append(len(payload))
            proto.data_type = _STRING
            proto.string_data.extend(payload)
        else:
            proto.dims.extend(payload.shape)
            proto.data_type = _dtypes.by_name(sig.dtype).code  # type: ignore[assignment]
            proto.storage_type = _RAW
            proto.raw_data = payload.tobytes()
    return msg.SerializeToString()


def decode_leaves(value: bytes | memoryview, fields: Sequence[Field], where: str, rows: int | None = None) -> list[Any]:
    """Parse and check one record; returns one array (or bytes) per field.

    With ``rows`` the record is a chunk of that many samples: numeric fields come
    back with a leading axis of ``rows``, string fields as a list of ``rows`` bytes.
    ``where`` names the record in errors (``"/data/train.tr: record 12"``).
    Raises CorruptRecordError for anything that does not match the schema.
    """
    try:
        msg = pb.TensorProtos.FromString(bytes(value) if isinstance(value, memoryview) else value)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise CorruptRecordError(f"{where}: not a valid TensorProtos message ({exc})") from None
    protos = msg.protos
    if len(protos) != len(fields):
        raise CorruptRecordError(f"{where}: {len(protos)} fields stored, the schema has {len(fields)}")
    return [_decode_one(p, f, where, rows) for p, f in zip(protos, fields)]


def _decode_one(proto: pb.TensorProto, fld: Field, where: str, rows: int | None) -> Any:
    lead: tuple[int | None, ...] = () if rows is None else (rows,)
    if not fld.is_numeric:
        expected = 1 if rows is None else rows
        dims_ok = list(proto.dims) == ([] if rows is None else [rows])
        if proto.data_type != _STRING or len(proto.string_data) != expected or not dims_ok:
            raise CorruptRecordError(f"{where}, field {fld.name!r}: expected {expected} string element(s)")
        return proto.string_data[0] if rows is None else list(proto.string_data)
    info = _dtypes.by_code(proto.data_type)
    if info is None or info.name != fld.dtype:
        got = info.name if info else f"code {proto.data_type}"
        raise CorruptRecordError(f"{where}, field {fld.name!r}: dtype {got}, schema says {fld.dtype}")
    dims = list(proto.dims)
    shape = lead + tuple(fld.shape)
    if len(dims) != len(shape) or any(d < 0 or (s is not None and d != s) for d, s in zip(dims, shape)):
        raise CorruptRecordError(f"{where}, field {fld.name!r}: shape {dims}, schema says {list(shape)}")
    count = 1
    for d in dims:
        count *= d
    raw = proto.raw_data
    if proto.storage_type != _RAW and codec_of_storage(proto.storage_type) is not None:
        if count * info.itemsize > _MAX_EXPANDED:
            raise CorruptRecordError(f"{where}, field {fld.name!r}: shape {dims} is too big to decompress")
        raw = decompress(proto.storage_type, raw, count * info.itemsize, f"{where}, field {fld.name!r}")
    if count * info.itemsize != len(raw):
        raise CorruptRecordError(
            f"{where}, field {fld.name!r}: shape {dims} needs {count * info.itemsize} bytes, "
            f"the record holds {len(raw)}"
        )
    try:
        arr = np.frombuffer(raw, dtype=info.numpy).reshape(dims)
    except ValueError:  # an empty array whose other dims overflow NumPy's size limit
        raise CorruptRecordError(f"{where}, field {fld.name!r}: shape {dims} is too big for NumPy") from None
    if info.name == "bool" and count and arr.view(np.uint8).max() > 1:
        raise CorruptRecordError(f"{where}, field {fld.name!r}: bool data holds values other than 0 and 1")
    return arr
