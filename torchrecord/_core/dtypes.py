"""The registry of numeric dtypes: torch, NumPy and TensorProto codes in one table.

bfloat16 has no NumPy dtype; it travels through NumPy as uint16 bits and is
viewed as ``torch.bfloat16`` when it becomes a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from torchrecord._proto import torchrecord_pb2 as pb
from torchrecord.errors import SampleTypeError

__all__ = ["DTypeInfo", "STRING_CODE", "by_code", "by_name", "from_numpy", "from_torch"]

_DT = pb.TensorProto.DataType

STRING_CODE = _DT.STRING


@dataclass(frozen=True)
class DTypeInfo:
    """One numeric dtype as each layer spells it."""

    name: str
    code: int
    numpy: np.dtype  # little-endian storage dtype (uint16 for bfloat16)
    torch: torch.dtype

    @property
    def itemsize(self) -> int:
        return int(self.numpy.itemsize)


_TABLE = [
    DTypeInfo("bool", _DT.BOOL, np.dtype("?"), torch.bool),
    DTypeInfo("uint8", _DT.UINT8, np.dtype("u1"), torch.uint8),
    DTypeInfo("int8", _DT.INT8, np.dtype("i1"), torch.int8),
    DTypeInfo("uint16", _DT.UINT16, np.dtype("<u2"), torch.uint16),
    DTypeInfo("int16", _DT.INT16, np.dtype("<i2"), torch.int16),
    DTypeInfo("int32", _DT.INT32, np.dtype("<i4"), torch.int32),
    DTypeInfo("uint32", _DT.UINT32, np.dtype("<u4"), torch.uint32),
    DTypeInfo("int64", _DT.INT64, np.dtype("<i8"), torch.int64),
    DTypeInfo("uint64", _DT.UINT64, np.dtype("<u8"), torch.uint64),
    DTypeInfo("float16", _DT.FLOAT16, np.dtype("<f2"), torch.float16),
    DTypeInfo("bfloat16", _DT.BFLOAT16, np.dtype("<u2"), torch.bfloat16),
    DTypeInfo("float32", _DT.FLOAT, np.dtype("<f4"), torch.float32),
    DTypeInfo("float64", _DT.DOUBLE, np.dtype("<f8"), torch.float64),
]

_BY_NAME = {info.name: info for info in _TABLE}
_BY_CODE = {info.code: info for info in _TABLE}
_BY_TORCH = {info.torch: info for info in _TABLE}
_BY_NUMPY = {info.numpy.newbyteorder("="): info for info in _TABLE if info.name != "bfloat16"}


def by_name(name: str) -> DTypeInfo:
    """The dtype called ``name`` (``"float32"``, ...); KeyError if unsupported."""
    return _BY_NAME[name]


def by_code(code: int) -> DTypeInfo | None:
    """The dtype with TensorProto code ``code``, or None if it is not numeric/known."""
    return _BY_CODE.get(code)


def from_torch(dtype: torch.dtype) -> DTypeInfo:
    """The entry of a torch dtype; TypeError names the supported ones otherwise."""
    try:
        return _BY_TORCH[dtype]
    except KeyError:
        raise SampleTypeError(f"unsupported tensor dtype {dtype}; supported: {sorted(_BY_NAME)}") from None


def from_numpy(dtype: np.dtype) -> DTypeInfo:
    """The entry of a NumPy dtype of either byte order; TypeError otherwise."""
    try:
        return _BY_NUMPY[dtype.newbyteorder("=")]
    except (KeyError, ValueError):
        raise SampleTypeError(f"unsupported array dtype {dtype}; supported: {sorted(_BY_NAME)}") from None
