"""The field schema of a record set: names, kinds, dtypes and shapes of every leaf.

The first sample written fixes the structure, each field's kind and dtype and
its rank; later samples may differ only in the size of a dimension, which the
schema then records as variable (``None``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torchrecord._structure import Tree, field_names
from torchrecord.errors import SchemaError

__all__ = ["Field", "KINDS", "LeafSignature", "NUMERIC_KINDS", "Schema"]

#: Leaf kinds and what the reader gives back for each.
KINDS = ("tensor", "ndarray", "int", "float", "bool", "bytes", "str")
#: Kinds whose value is a numeric array (the rest are strings).
NUMERIC_KINDS = frozenset({"tensor", "ndarray", "int", "float", "bool"})

Shape = tuple[int | None, ...]


@dataclass(frozen=True)
class LeafSignature:
    """What one leaf of one sample is: kind, dtype name and concrete shape."""

    kind: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Field:
    """One leaf of the schema.

    Attributes:
        name: dotted path of the leaf in the sample (``"image"``, ``"0"``, ``"meta.id"``).
        kind: one of :data:`KINDS`; the reader returns this kind.
        dtype: numeric dtype name (``"uint8"``, ``"bfloat16"``...), or ``"bytes"``/``"str"``.
        shape: per-dimension size, ``None`` where samples differ.
    """

    name: str
    kind: str
    dtype: str
    shape: Shape

    @property
    def is_numeric(self) -> bool:
        """True for numbers (tensor, ndarray, int, float, bool); False for bytes and str."""
        return self.kind in NUMERIC_KINDS

    @property
    def is_fixed(self) -> bool:
        """True when every sample has this exact shape (and so a fixed byte size)."""
        return self.is_numeric and all(d is not None for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        """The field as stored in the metadata (a msgpack-able map)."""
        return {"name": self.name, "kind": self.kind, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Field:
        """The field from its metadata map ``d`` (the inverse of :meth:`to_dict`)."""
        return cls(str(d["name"]), str(d["kind"]), str(d["dtype"]), tuple(d["shape"]))


@dataclass
class Schema:
    """The structure tree of a sample and its fields in leaf order."""

    tree: Tree
    fields: list[Field] = field(default_factory=list)

    @classmethod
    def from_first(cls, tree: Tree, leaves: Sequence[LeafSignature]) -> Schema:
        """The schema defined by the first sample: its structure ``tree`` and its ``leaves``' signatures."""
        names = field_names(tree)
        fields = [Field(n, s.kind, s.dtype, tuple(s.shape)) for n, s in zip(names, leaves)]
        return cls(tree, fields)

    def merge(self, tree: Tree, leaves: Sequence[LeafSignature], where: str) -> None:
        """Check one more sample (its ``tree`` and ``leaves``) against the schema, widening shapes that vary.

        ``where`` names the sample in error messages (``"sample 17"``).
        """
        if tree != self.tree or len(leaves) != len(self.fields):
            raise SchemaError(
                f"{where}: structure {_describe(tree)} differs from the first sample's "
                f"{_describe(self.tree)}; every sample must have the same fields"
            )
        for i, (fld, sig) in enumerate(zip(self.fields, leaves)):
            if sig.kind != fld.kind or sig.dtype != fld.dtype:
                raise SchemaError(
                    f"{where}, field {fld.name!r}: {sig.kind} of {sig.dtype} differs from the "
                    f"first sample's {fld.kind} of {fld.dtype}; convert it before writing"
                )
            if len(sig.shape) != len(fld.shape):
                raise SchemaError(
                    f"{where}, field {fld.name!r}: rank {len(sig.shape)} (shape {list(sig.shape)}) "
                    f"differs from the first sample's rank {len(fld.shape)}"
                )
            if any(a is not None and a != b for a, b in zip(fld.shape, sig.shape)):
                widened = tuple(a if a == b else None for a, b in zip(fld.shape, sig.shape))
                self.fields[i] = Field(fld.name, fld.kind, fld.dtype, widened)

    @property
    def names(self) -> list[str]:
        """The dotted field names, in leaf order (``["0", "1"]``, ``["image", "meta.id"]``)."""
        return [f.name for f in self.fields]

    @property
    def is_fixed(self) -> bool:
        """True when every field is numeric with a fixed shape."""
        return all(f.is_fixed for f in self.fields)

    def to_dict(self) -> dict[str, Any]:
        """The schema as stored in the metadata: ``{"tree": ..., "fields": [...]}``."""
        return {"tree": self.tree, "fields": [f.to_dict() for f in self.fields]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Schema:
        """The schema from its metadata map ``d`` (the inverse of :meth:`to_dict`)."""
        return cls(d["tree"], [Field.from_dict(f) for f in d["fields"]])

    def __str__(self) -> str:
        parts = []
        for f in self.fields:
            dims = ", ".join("?" if d is None else str(d) for d in f.shape)
            parts.append(f"{f.name}: {f.kind} {f.dtype}[{dims}]")
        return "; ".join(parts)


def _describe(tree: Tree) -> str:
    return "(" + ", ".join(field_names(tree)) + ")"
