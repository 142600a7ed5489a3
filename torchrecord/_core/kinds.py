"""Decoded bytes -> the kinds the user wrote: the one place that builds tensors, arrays and scalars.

A leaf comes back as the kind it was written as (``tensor``, ``ndarray``,
``int``/``float``/``bool`` scalars, ``bytes``, ``str``). Two shapes of input
arrive here:

* one payload of one sample (:func:`materialize`), from the protobuf decoder;
* typed columns of many samples (:func:`column_leaves`, :func:`stack_columns`),
  from the fixed-layout gather, where each field is one array of shape [B, ...].
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from torchrecord._core.schema import Field, Schema
from torchrecord._core.structure import Tree, flatten, unflatten
from torchrecord.errors import CorruptRecordError, SchemaError

__all__ = [
    "Place",
    "Room",
    "as_tensor",
    "check_bools",
    "collate_any",
    "collate_samples",
    "collate_transformed",
    "column_leaves",
    "forget_split",
    "materialize",
    "sample_builder",
    "split_columns",
    "stack_columns",
    "take_split_column",
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


#: per scalar kind, the dtype ``default_collate`` gives a batch of its Python values
_COLLATED_SCALARS = {"int": np.dtype(np.int64), "float": np.dtype(np.float64), "bool": np.dtype(np.bool_)}

#: The columns split last in this process, by ``id`` of their first leaf: (the per-sample leaves, the column
#: as the tensor collating them gives). :func:`take_split_column` hands a column out once, when a batch
#: holds exactly its leaves; the next split replaces them all.
_last_split: dict[int, tuple[list[Any], torch.Tensor]] = {}


def split_columns(typed: Sequence[np.ndarray], schema: Schema) -> Iterator[Any]:
    """The samples of a batch of typed columns, one by one, in the written structure.

    The columns of tensor and number fields are remembered (:func:`take_split_column`): a per-sample
    DataLoader whose batches are these chunks then collates each field without copying it again.
    """
    global _last_split
    columns = []
    split: dict[int, tuple[list[Any], torch.Tensor]] = {}
    for a, f in zip(typed, schema.fields):
        whole = None
        if f.kind == "tensor":
            whole = as_tensor(a, f.dtype)
            leaves: list[Any] = list(whole.unbind(0))
        else:
            leaves = column_leaves(a, f)
            if _COLLATED_SCALARS.get(f.kind) == a.dtype and a.ndim == 1 and a.flags.writeable:
                whole = torch.from_numpy(a)
        columns.append(leaves)
        if whole is not None and leaves:
            split[id(leaves[0])] = (leaves, whole)
    _last_split = split
    tree = schema.tree
    if tree["t"] == "tuple" and all(c["t"] == "leaf" for c in tree["c"]):
        return zip(*columns)  # the usual sample, a flat tuple: built by zip itself
    if tree["t"] == "leaf":
        return iter(columns[0])
    build = sample_builder(tree)
    return (build(list(leaves)) for leaves in zip(*columns))


def forget_split() -> None:
    """Drop the columns :func:`split_columns` remembers (a reader's pass ended)."""
    global _last_split
    _last_split = {}


def take_split_column(column: Sequence[Any]) -> torch.Tensor | None:
    """The tensor of the column last split (:func:`split_columns`) whose leaves ``column`` is, all and in order;
    None otherwise, or when that column was handed out already.

    It holds what ``torch.stack`` (tensors) or ``torch.tensor`` (numbers) of ``column`` would, without a copy:
    the samples' tensors are its rows. A per-sample DataLoader whose batch is one chunk of the reader gets it.
    """
    if not len(column):
        return None
    split = _last_split
    key = id(column[0])
    entry = split.get(key)
    if entry is None:
        return None
    leaves, whole = entry
    if len(leaves) != len(column) or not all(map(operator.is_, leaves, column)):
        return None
    return whole if split.pop(key, None) is entry else None  # once: a second collation stacks a copy


def stack_columns(typed: Sequence[np.ndarray | torch.Tensor], schema: Schema) -> Any:
    """A batch of typed columns (or columns made tensors already, as ``as_tensor`` makes them) as the sample's
    structure with one stacked tensor per leaf."""
    leaves = [a if isinstance(a, torch.Tensor) else as_tensor(a, f.dtype) for a, f in zip(typed, schema.fields)]
    return _builder(schema.tree)(leaves)


#: trees :func:`_builder` remembers at most (then it starts again: a process that opens many sets keeps few)
_HELD = 64
#: per structure tree (by id, the tree kept to tell a new tree at a reused id): its :func:`sample_builder`
_BUILDERS: dict[int, tuple[Tree, Callable[[list[Any]], Any]]] = {}


def _builder(tree: Tree) -> Callable[[list[Any]], Any]:
    """:func:`sample_builder` of ``tree``, made once per tree (a batch is built per call of ``stack_columns``)."""
    held = _BUILDERS.get(id(tree))
    if held is None or held[0] is not tree:
        if len(_BUILDERS) >= _HELD:
            _BUILDERS.clear()
        held = _BUILDERS[id(tree)] = (tree, sample_builder(tree))
    return held[1]


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


#: where a batch is stacked: ``place(shape, dtype)`` gives an empty tensor to stack a leaf into, one call per leaf
Place = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]
#: a collation's ``room``: given the bytes of each tensor of the batch about to be built, where to build them
#: (a :data:`Place`), or None for fresh memory. A DataLoader worker passes
#: ``torchrecord._read.ipc.slot_room``, so that a batch is stacked straight into the shared-memory slot it
#: leaves the worker in, instead of being copied there.
Room = Callable[[list[int]], Place | None]


def collate_samples(batch: list[Any], schema: Schema, room: Room | None = None) -> Any:
    """Collate samples by the schema: fixed numeric fields stack into tensors, the rest become lists.

    ``room``: where to build the batch's tensors (see :data:`Room`); None: fresh memory.
    """
    flat = [flatten(sample)[1] for sample in batch]
    defer = room is not None
    leaves = [_collate_field([leaves_of[i] for leaves_of in flat], fld, defer) for i, fld in enumerate(schema.fields)]
    return _built(schema.tree, leaves, room)


def _collate_field(column: list[Any], fld: Field, defer: bool = False) -> Any:
    """One field's leaves by the schema: stacked when the field is fixed, else a list.

    ``defer``: a column that stacks as it is comes back as a :class:`_Stack`, stacked later where :func:`_built`
    says (the same tensor as stacking it now).
    """
    if not fld.is_fixed:
        return column
    whole = None if defer else take_split_column(column)
    if whole is not None:  # the leaves a transform passed through, all of one chunk's column in order
        return whole
    if fld.kind == "tensor":
        if defer and _stackable_tensors(column):
            return _Stack(column, torch.Size((len(column), *column[0].shape)), column[0].dtype)
        return torch.stack(column)
    scalar = _SCALAR_TYPES.get(fld.kind) if not fld.shape else None
    if scalar is not None and column and all(type(x) is scalar[0] for x in column):
        # Python scalars of the field's kind: one conversion, the same array as stacking them one by one
        return as_tensor(np.array(column, dtype=scalar[1]), fld.dtype)
    arrays = [np.asarray(x) for x in column]
    if defer:
        stack = _numpy_stack(arrays, fld.dtype)
        if stack is not None:
            return stack
    return as_tensor(np.stack(arrays), fld.dtype)


class _Stack:
    """A column of tensors (or NumPy arrays) of one shape and dtype, to be stacked once it is known where.

    ``build(out)`` gives what stacking the column gives (``torch.stack``, or ``as_tensor(np.stack(...))``
    for arrays), stacked into ``out`` (an empty tensor of ``shape`` and ``dtype``) or, for None, fresh memory.
    """

    __slots__ = ("as_dtype", "column", "dtype", "numpy", "shape")

    def __init__(
        self, column: list[Any], shape: torch.Size, dtype: torch.dtype, numpy: bool = False, as_dtype: str = ""
    ) -> None:
        self.column, self.shape, self.dtype, self.numpy, self.as_dtype = column, shape, dtype, numpy, as_dtype

    def nbytes(self) -> int:
        return self.shape.numel() * _itemsize(self.dtype)

    def build(self, out: torch.Tensor | None) -> torch.Tensor:
        if self.numpy:
            if out is None:
                return as_tensor(np.stack(self.column), self.as_dtype)
            target = out.numpy()
            np.stack(self.column, out=target)
            return as_tensor(target, self.as_dtype)
        if out is None:
            return torch.stack(self.column)
        return torch.stack(self.column, out=out)


def _stackable_tensors(column: list[Any]) -> bool:
    """Do ``column``'s tensors stack into an ``out=`` tensor exactly as ``torch.stack`` stacks them: one shape
    and dtype, contiguous, on the CPU, no autograd?"""
    if not column:
        return False
    first = column[0]
    if not isinstance(first, torch.Tensor):
        return False
    shape, dtype = first.shape, first.dtype
    return all(
        isinstance(x, torch.Tensor)
        and x.shape == shape
        and x.dtype == dtype
        and x.is_cpu
        and not x.requires_grad
        and x.is_contiguous()
        for x in column
    )


def _numpy_stack(arrays: list[Any], as_dtype: str) -> _Stack | None:
    """A deferred ``as_tensor(np.stack(arrays), as_dtype)``, for arrays of one shape and one native numeric dtype."""
    if not arrays:
        return None
    first = arrays[0]
    shape, dtype = first.shape, first.dtype
    held = _torch_dtype(dtype)
    if held is None or not all(a.shape == shape and a.dtype == dtype for a in arrays):
        return None
    return _Stack(arrays, torch.Size((len(arrays), *shape)), held, numpy=True, as_dtype=as_dtype)


@functools.cache
def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype | None:
    """The torch dtype of ``torch.from_numpy`` of an array of ``dtype``; None where it takes none."""
    if dtype.kind not in "biufc" or not dtype.isnative:
        return None
    try:
        return torch.from_numpy(np.empty(0, dtype)).dtype
    except (TypeError, ValueError):
        return None


@functools.cache
def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _placeable(leaf: Any) -> bool:
    """A tensor that leaves a worker in a slot (torchrecord._read.slots takes CPU tensors without autograd)."""
    return isinstance(leaf, torch.Tensor) and leaf.is_cpu and not leaf.requires_grad


def _built(tree: Tree, leaves: list[Any], room: Room | None) -> Any:
    """The batch of ``tree`` with ``leaves``, each :class:`_Stack` stacked: all the batch's tensors in the
    ``room`` when one is given and says where (the ones not stacked here, such as scalar columns or the
    tensors of a list, are copied there), else in fresh memory."""
    if room is not None:
        sizes: list[int] = []
        for leaf in leaves:
            if type(leaf) is _Stack:
                sizes.append(leaf.nbytes())
            elif _placeable(leaf):
                sizes.append(leaf.nbytes)
            elif type(leaf) is list:
                sizes.extend(x.nbytes for x in leaf if _placeable(x))
        place = room(sizes) if sizes else None
        if place is not None:
            return unflatten(tree, [_placed(leaf, place) for leaf in leaves])
    return unflatten(tree, [leaf.build(None) if type(leaf) is _Stack else leaf for leaf in leaves])


def _placed(leaf: Any, place: Place) -> Any:
    """``leaf`` built by ``place``: a :class:`_Stack` stacked there, a tensor (or a list's) copied there."""
    if type(leaf) is _Stack:
        return leaf.build(place(tuple(leaf.shape), leaf.dtype))
    if _placeable(leaf):
        return _copied(leaf, place)
    if type(leaf) is list and any(_placeable(x) for x in leaf):
        return [_copied(x, place) if _placeable(x) else x for x in leaf]
    return leaf


def _copied(tensor: torch.Tensor, place: Place) -> torch.Tensor:
    out = place(tuple(tensor.shape), tensor.dtype)
    out.copy_(tensor)
    return out


#: scalar kinds: the Python type the reader gives, and the dtype ``np.asarray`` gives it
_SCALAR_TYPES: dict[str, tuple[type, Any]] = {
    "int": (int, np.int64),
    "float": (float, np.float64),
    "bool": (bool, np.bool_),
}


def collate_transformed(
    batch: list[Any], sources: list[Any], schema: Schema, where: str, room: Room | None = None
) -> Any:
    """Collate what a transform returned, the same way as untransformed samples wherever it can.

    ``sources[i]`` is the decoded sample the transform turned into ``batch[i]``.
    A leaf the transform passed through unchanged (the very object it was given)
    is collated by its field, exactly as without a transform: fixed numeric
    fields stacked, variable-shape and string fields as lists. A leaf the
    transform made is collated by what it holds: tensors or arrays of one shape
    and dtype are stacked into a tensor, Python numbers become a tensor (int64,
    float64 or bool), anything else (strings, bytes, tensors of different
    shapes, other objects) stays a list. The samples must share one structure.
    ``room``: where to build the batch's tensors (see :data:`Room`); None: fresh memory.

    Raises:
        SchemaError: the transformed samples have different structures.
    """
    if not batch:
        return []
    tree, first = flatten(batch[0])
    rows: list[Sequence[Any]] = [first]
    width = len(first)
    flat_tuple = tree["t"] == "tuple" and all(c["t"] == "leaf" for c in tree["c"])
    for i in range(1, len(batch)):
        sample = batch[i]
        if flat_tuple and type(sample) is tuple and len(sample) == width and _PLAIN.issuperset(map(type, sample)):
            rows.append(sample)  # what flatten gives, without building and comparing its tree
            continue
        other, leaves_of = flatten(sample)
        if other != tree:
            raise SchemaError(
                f"{where}: the transform returned samples of different structures in one batch (sample 0 and "
                f"sample {i} of the batch differ); return one structure, or pass collate_fn= to collate them"
            )
        rows.append(leaves_of)
    plain_sources = schema.tree["t"] == "tuple" and all(c["t"] == "leaf" for c in schema.tree["c"])
    origins: list[Sequence[Any]] = [src if plain_sources and type(src) is tuple else flatten(src)[1] for src in sources]
    fields = schema.fields
    defer = room is not None
    leaves: list[Any] = []
    for j in range(width):
        column = [row[j] for row in rows]
        # a leaf passed through unchanged is the very object of its field in the source: collated by the field
        f = _origin(origins[0], column[0])
        if f is not None and _all_from(origins, column, f):
            leaves.append(_collate_field(column, fields[f], defer))
        else:
            leaves.append(_collate_any(column, defer))
    return _built(tree, leaves, room)


def _all_from(origins: list[Sequence[Any]], column: list[Any], f: int) -> bool:
    """Is every leaf of ``column`` its source's field ``f`` itself, and no later field's object (C-level loops)?"""
    if not all(map(operator.is_, [origin[f] for origin in origins], column)):
        return False
    for g in range(f + 1, len(origins[0])):  # sources of one schema: the same fields
        if any(map(operator.is_, [origin[g] for origin in origins], column)):
            return False
    return True


#: leaf types that are never structures (as torchrecord._core.structure's flat-tuple test)
_PLAIN = frozenset({bool, int, float, bytes, str, type(None), np.ndarray, torch.Tensor})


def _origin(source_leaves: Sequence[Any], leaf: Any) -> int | None:
    """The field whose leaf in the source is ``leaf`` itself (the last one, when several hold that object)."""
    for f in range(len(source_leaves) - 1, -1, -1):
        if source_leaves[f] is leaf:
            return f
    return None


def collate_any(batch: list[Any], where: str, room: Room | None = None) -> Any:
    """Collate samples of no schema by what they hold (see :func:`collate_transformed`'s made leaves).

    ``room``: where to build the batch's tensors (see :data:`Room`); None: fresh memory.

    Raises:
        SchemaError: the samples have different structures.
    """
    if not batch:
        return []
    flat = [flatten(sample) for sample in batch]
    tree = flat[0][0]
    for i, (other, _) in enumerate(flat):
        if other != tree:
            raise SchemaError(
                f"{where}: samples of different structures in one batch (sample 0 and sample {i} of the batch "
                "differ); return one structure from the transform, or pass collate_fn= to collate them"
            )
    columns = zip(*(leaves for _, leaves in flat))
    defer = room is not None
    return _built(tree, [_collate_any(list(column), defer) for column in columns], room)


def _collate_any(column: list[Any], defer: bool = False) -> Any:
    """Leaves of no known field: stack what has one shape and dtype, keep the rest a list (``defer``: see
    :func:`_collate_field`)."""
    first = column[0]
    if isinstance(first, torch.Tensor):
        if all(isinstance(x, torch.Tensor) and x.shape == first.shape and x.dtype == first.dtype for x in column):
            if defer and _stackable_tensors(column):
                return _Stack(column, torch.Size((len(column), *first.shape)), first.dtype)
            return torch.stack(column)
        return column
    if isinstance(first, (np.ndarray, np.generic)) and first.dtype.kind in "biufc":
        if all(
            isinstance(x, (np.ndarray, np.generic)) and x.shape == first.shape and x.dtype == first.dtype
            for x in column
        ):
            if defer:
                stack = _numpy_stack(column, "")
                if stack is not None:
                    return stack
            return torch.from_numpy(np.stack(column))
        return column
    if all(type(x) is bool for x in column):
        return torch.tensor(column, dtype=torch.bool)
    if all(type(x) is int for x in column):
        return torch.tensor(column, dtype=torch.int64)
    if all(type(x) in (int, float) for x in column):
        return torch.tensor(column, dtype=torch.float64)
    return column
