"""The schema a user states up front (``schema=`` of ``write_record`` and ``RecordWriter``).

Two forms:

* a :class:`~torchrecord.Schema` (e.g. ``RecordFile("a.tr").schema``): every
  sample must have its structure, kinds and dtypes, and fit its shapes; the set
  is written with exactly that schema (shards agree);
* a dict of field name -> what is stated about that field: a shape
  (``(3, 32, None)``: ``None`` where the size may vary), a dtype name
  (``"float32"``), or ``{"shape": ..., "dtype": ...}``. Fields not named are
  found from the samples as usual.

A sample breaking a stated fixed size or dtype is a SchemaError naming it; a
stated ``None`` is kept in the schema even when every sample has the same size.
A stated dtype is checked, never converted to: samples must already have it
(only an empty list of numbers, which has no dtype of its own, takes it).
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchrecord._core.dtypes import by_name
from torchrecord._core.schema import MAX_RANK, Field, LeafSignature, Schema, structure_message
from torchrecord._core.structure import Tree, field_names
from torchrecord.errors import ArgumentError, ArgumentTypeError, SchemaError

__all__ = ["Declared", "Stated"]

Shape = tuple[int | None, ...]
_FORM = (
    "schema must be a torchrecord.Schema or a dict {field name: shape, dtype name, or "
    "{'shape': shape, 'dtype': dtype name}}, e.g. schema={'image': (3, None, None), 'ids': 'int64'}"
)


@dataclass(frozen=True)
class Stated:
    """What is stated about one field: its kind (full schemas only), dtype and shape, or None."""

    kind: str | None = None
    dtype: str | None = None
    shape: Shape | None = None


class Declared:
    """The parsed ``schema=`` argument; checks samples against it.

    Args:
        full: a complete schema, or None.
        fields: stated fields by name (for a complete schema: all of them).
    """

    def __init__(self, full: Schema | None, fields: dict[str, Stated]) -> None:
        self.full = full
        self.fields = fields
        self._positions: dict[int, tuple[str, Stated]] = {}

    @classmethod
    def parse(cls, schema: Any) -> Declared | None:
        """The parsed argument (None for None); ValueError / TypeError naming what is wrong."""
        if schema is None:
            return None
        if isinstance(schema, Schema):
            stated = {f.name: Stated(f.kind, f.dtype, tuple(f.shape)) for f in schema.fields}
            return cls(Schema(schema.tree, list(schema.fields)), stated)
        if not isinstance(schema, Mapping):
            raise ArgumentTypeError(f"{_FORM}; got a {type(schema).__name__}")
        fields = {}
        for name, spec in schema.items():
            if not isinstance(name, str):
                raise ArgumentTypeError(f"schema keys are field names (str), got {name!r}; {_FORM}")
            fields[name] = _parse_field(name, spec)
        return cls(None, fields)

    @property
    def names(self) -> set[str]:
        return set(self.fields)

    def first(self, tree: Tree, leaves: Sequence[LeafSignature], where: str) -> Schema:
        """The schema of the write, given its first sample (checked against what is stated)."""
        if self.full is not None:
            if tree != self.full.tree or len(leaves) != len(self.full.fields):
                raise SchemaError(structure_message(self.full, tree, leaves, where, "the stated schema"))
            names = [f.name for f in self.full.fields]
            schema = Schema(self.full.tree, list(self.full.fields))
        else:
            names = field_names(tree)
            unknown = [n for n in self.fields if n not in names]
            if unknown:
                close = difflib.get_close_matches(unknown[0], names, n=1)
                guess = f"; did you mean {close[0]!r}?" if close else f"; its fields are {_listed(names)}"
                raise SchemaError(f"{where}: schema= names the field {unknown[0]!r}, which the sample has not{guess}")
            schema = Schema.from_first(tree, leaves)
        self._positions = {i: (n, self.fields[n]) for i, n in enumerate(names) if n in self.fields}
        self.check(leaves, where)
        for i, (_, stated) in self._positions.items():
            fld = schema.fields[i]
            shape = stated.shape if stated.shape is not None else fld.shape
            schema.fields[i] = Field(fld.name, fld.kind, stated.dtype or fld.dtype, shape)
        return schema

    def dtype_at(self, position: int) -> str | None:
        """The stated dtype of the field at ``position`` (after :meth:`first`), or None."""
        entry = self._positions.get(position)
        return entry[1].dtype if entry is not None else None

    def stated(self, position: int) -> bool:
        """True when the field at ``position`` is stated (its shape changes are no surprise)."""
        entry = self._positions.get(position)
        return entry is not None and (entry[1].shape is not None or self.full is not None)

    def check(self, leaves: Sequence[LeafSignature], where: str) -> None:
        """SchemaError when a sample's leaf breaks a stated kind, dtype or fixed size."""
        for i, (name, stated) in self._positions.items():
            sig = leaves[i]
            if stated.kind is not None and sig.kind != stated.kind and not (sig.from_list and stated.kind == "tensor"):
                raise SchemaError(
                    f"{where}, field {name!r}: {sig.kind} of {sig.dtype} differs from the stated "
                    f"{stated.kind} of {stated.dtype}; convert it before writing"
                )
            if stated.dtype is not None and sig.dtype != stated.dtype:
                raise SchemaError(
                    f"{where}, field {name!r}: {sig.kind} of {sig.dtype} differs from the stated "
                    f"{stated.dtype}: schema= checks a dtype, it does not convert to it. Convert the field "
                    f"in the source (e.g. numpy.asarray(value, dtype={stated.dtype!r})), or state "
                    f"{sig.dtype!r}"
                )
            shape = stated.shape
            if shape is None:
                continue
            if len(sig.shape) != len(shape):
                raise SchemaError(
                    f"{where}, field {name!r}: rank {len(sig.shape)} (shape {list(sig.shape)}) differs from "
                    f"the stated rank {len(shape)} (shape {_dims(shape)})"
                )
            if any(d is not None and d != s for d, s in zip(shape, sig.shape)):
                raise SchemaError(
                    f"{where}, field {name!r}: shape {list(sig.shape)} differs from the stated {_dims(shape)} "
                    "(schema=); fix the sample, or state None for a dimension that may vary"
                )


def _parse_field(name: str, spec: Any) -> Stated:
    where = f"schema[{name!r}]"
    if isinstance(spec, str):
        return Stated(dtype=_dtype(spec, where))
    if isinstance(spec, Mapping):
        extra = [k for k in spec if k not in ("shape", "dtype")]
        if extra:
            raise ArgumentError(f"{where}: unknown key {extra[0]!r}; state 'shape' and/or 'dtype'")
        dtype = spec.get("dtype")
        shape = spec.get("shape")
        return Stated(
            dtype=_dtype(dtype, where) if dtype is not None else None,
            shape=_shape(shape, where) if shape is not None else None,
        )
    if isinstance(spec, Sequence):
        return Stated(shape=_shape(spec, where))
    raise ArgumentTypeError(f"{where}: got a {type(spec).__name__}; {_FORM}")


def _dtype(name: Any, where: str) -> str:
    if name in ("bytes", "str"):
        return str(name)
    try:
        return by_name(name).name
    except (KeyError, TypeError):
        raise ArgumentError(
            f"{where}: unknown dtype {name!r}; use bool, uint8, int8, uint16, int16, int32, uint32, int64, "
            "uint64, float16, bfloat16, float32, float64, bytes or str"
        ) from None


def _shape(spec: Any, where: str) -> Shape:
    if isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence):
        raise ArgumentTypeError(f"{where}: a shape is a sequence of sizes (int or None), got {spec!r}")
    dims: list[int | None] = []
    for d in spec:
        if d is None:
            dims.append(None)
        elif isinstance(d, numbers.Integral) and not isinstance(d, bool) and int(d) >= 0:
            dims.append(int(d))
        else:
            raise ArgumentError(f"{where}: shape {list(spec)} has size {d!r}; sizes are ints >= 0, or None to vary")
    if len(dims) > MAX_RANK:
        raise ArgumentError(f"{where}: rank {len(dims)} is above the {MAX_RANK} dimensions readers accept")
    return tuple(dims)


def _dims(shape: Shape) -> str:
    return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"


def _listed(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names[:10]) + (", ..." if len(names) > 10 else "")
