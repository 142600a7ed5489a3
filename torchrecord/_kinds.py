"""Decoded bytes -> the kinds the user wrote: the one place that builds tensors, arrays and scalars.

A leaf comes back as the kind it was written as (``tensor``, ``ndarray``,
``int``/``float``/``bool`` scalars, ``bytes``, ``str``). Two shapes of input
arrive here:

* one payload of one sample (:func:`materialize`), from the protobuf decoder;
* typed columns of many samples (:func:`column_leaves`, :func:`stack_columns`),
  from the fixed-layout gather, where each field is one array of shape [B, ...].
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from torchrecord._structure import Tree, flatten, unflatten
from torchrecord.errors import CorruptRecordError
from torchrecord.schema import Field, Schema

__all__ = [
    "as_tensor",
    "check_bools",
    "collate_samples",
    "column_leaves",
    "materialize",
    "sample_builder",
    "split_columns",
    "stack_columns",
]


def as_tensor(a: np.ndarray, dtype: str) -> torch.Tensor:
    """A tensor sharing ``a``'s memory (bfloat16 is stored as its uint16 bit pattern)."""
    tensor = torch.from_numpy(a)
    return tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor


def materialize(payload: np.ndarray | bytes, fld: Field, where: str) -> Any:
    """One decoded payload as the kind the user wrote (tensor, array, scalar, str, bytes)."""
    kind = fld.kind
    if kind == "bytes":
        return bytes(payload)
    if kind == "str":
        try:
            return bytes(payload).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"{where}, field {fld.name!r}: not valid UTF-8 ({exc})") from None
    if isinstance(payload, np.generic):  # one row of a chunk's scalar column
        payload = np.array(payload)
    assert isinstance(payload, np.ndarray)
    if kind == "tensor":
        return as_tensor(payload if payload.flags.writeable else payload.copy(), fld.dtype)
    if kind == "ndarray":
        return payload if payload.flags.writeable else payload.copy()
    return payload.item()


def check_bools(typed: Sequence[np.ndarray], fields: Sequence[Field], path: str) -> None:
    """Raise CorruptRecordError when a bool column holds bytes other than 0 and 1."""
    for a, f in zip(typed, fields):
        if f.dtype == "bool" and a.size and a.view(np.uint8).max() > 1:
            raise CorruptRecordError(f"{path}: field {f.name!r} holds bool bytes other than 0 and 1")


def column_leaves(a: np.ndarray, fld: Field) -> list[Any]:
    """The per-sample leaves of one typed column [B, ...], each of the kind it was written as."""
    if fld.kind == "tensor":
        return list(as_tensor(a, fld.dtype).unbind(0))
    if fld.kind == "ndarray":
        # a[i, ...] keeps a 0-d field a 0-d array (iterating a 1-d array gives NumPy scalars)
        return [a[i, ...] for i in range(len(a))]
    leaves: list[Any] = a.tolist()
    return leaves


def split_columns(typed: Sequence[np.ndarray], schema: Schema) -> Iterator[Any]:
    """The samples of a batch of typed columns, one by one, in the written structure."""
    columns = [column_leaves(a, f) for a, f in zip(typed, schema.fields)]
    build = sample_builder(schema.tree)
    for leaves in zip(*columns):
        yield build(list(leaves))


def stack_columns(typed: Sequence[np.ndarray], schema: Schema) -> Any:
    """A batch of typed columns as the sample's structure with one stacked tensor per leaf."""
    leaves = [as_tensor(a, f.dtype) for a, f in zip(typed, schema.fields)]
    return unflatten(schema.tree, leaves)


def sample_builder(tree: Tree) -> Callable[[list[Any]], Any]:
    """A fast constructor for the common flat structures, else the general unflatten."""
    if tree["t"] == "leaf":
        return lambda leaves: leaves[0]
    flat = all(c["t"] == "leaf" for c in tree["c"])
    if flat and tree["t"] == "tuple":
        return tuple
    if flat and tree["t"] == "list":
        return list
    if flat and tree["t"] == "dict":
        keys = tree["k"]
        return lambda leaves: dict(zip(keys, leaves))
    return lambda leaves: unflatten(tree, leaves)


def collate_samples(batch: list[Any], schema: Schema) -> Any:
    """Collate samples by the schema: fixed numeric fields stack into tensors, the rest become lists."""
    flat = [flatten(sample)[1] for sample in batch]
    leaves: list[Any] = []
    for i, fld in enumerate(schema.fields):
        column = [leaves_of[i] for leaves_of in flat]
        if fld.is_fixed:
            if fld.kind == "tensor":
                leaves.append(torch.stack(column))
            else:
                arr = np.stack([np.asarray(x) for x in column])
                leaves.append(as_tensor(arr, fld.dtype))
        else:
            leaves.append(column)
    return unflatten(schema.tree, leaves)
