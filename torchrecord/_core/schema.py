"""The field schema of a record set: names, kinds, dtypes and shapes of every leaf.

The first sample written fixes the structure, each field's kind and dtype and
its rank; later samples may differ only in the size of a dimension, which the
schema then records as variable (``None``). A Python list whose items are all
numbers of one kind is one leaf (a 1-d tensor field, see ``_structure``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torchrecord._core.structure import Tree, field_names, first_difference
from torchrecord.errors import SchemaError

__all__ = ["Field", "KINDS", "LeafSignature", "MAX_RANK", "NUMERIC_KINDS", "Schema"]

#: The highest rank of a field readers accept (below NumPy's limit on dimensions).
MAX_RANK = 32

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
    #: written as a Python list of numbers (its length may vary by nature)
    from_list: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Field:
    """One leaf of the schema.

    Attributes:
        name: dotted path of the leaf in the sample (``"image"``, ``"0"``, ``"meta.id"``).
        kind: one of :data:`KINDS`; the reader returns this kind.
        dtype: numeric dtype name (``"uint8"``, ``"bfloat16"``...), or ``"bytes"``/``"str"``.
        shape: per-dimension size, ``None`` where samples differ.
        compression: ``"zstd"`` or ``"lz4"`` when records may hold this field
            compressed (see ``write_record(compression=)``), else None.
    """

    name: str
    kind: str
    dtype: str
    shape: Shape
    compression: str | None = field(default=None, compare=False)

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
        out = {"name": self.name, "kind": self.kind, "dtype": self.dtype, "shape": list(self.shape)}
        if self.compression is not None:
            out["compression"] = self.compression
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Field:
        """The field from its metadata map ``d`` (the inverse of :meth:`to_dict`)."""
        codec = d.get("compression")
        return cls(str(d["name"]), str(d["kind"]), str(d["dtype"]), tuple(d["shape"]), str(codec) if codec else None)


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

    def merge(
        self, tree: Tree, leaves: Sequence[LeafSignature], where: str, first: str = "the first sample"
    ) -> list[int]:
        """Check one more sample against the schema, widening shapes that vary.

        ``tree`` and ``leaves`` are the sample's structure and leaf signatures,
        ``where`` names the sample in error messages (``"path: sample 17"``),
        ``first`` the sample that fixed the schema. Returns the positions of the
        fields whose shape was widened by this sample.
        """
        if tree != self.tree or len(leaves) != len(self.fields):
            raise SchemaError(structure_message(self, tree, leaves, where, first))
        widened = []
        for i, (fld, sig) in enumerate(zip(self.fields, leaves)):
            if sig.kind != fld.kind or sig.dtype != fld.dtype:
                raise SchemaError(
                    f"{where}, field {fld.name!r}: {sig.kind} of {sig.dtype} differs from "
                    f"{first}'s {fld.kind} of {fld.dtype}; convert it before writing"
                    + (_list_dtypes(fld.name, sig.dtype) if sig.from_list else "")
                )
            if len(sig.shape) != len(fld.shape):
                raise SchemaError(
                    f"{where}, field {fld.name!r}: rank {len(sig.shape)} (shape {list(sig.shape)}) "
                    f"differs from {first}'s rank {len(fld.shape)}"
                )
            if any(a is not None and a != b for a, b in zip(fld.shape, sig.shape)):
                widened_shape = tuple(a if a == b else None for a, b in zip(fld.shape, sig.shape))
                self.fields[i] = Field(fld.name, fld.kind, fld.dtype, widened_shape, fld.compression)
                widened.append(i)
        return widened

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


def _list_dtypes(name: str, dtype: str) -> str:
    return (
        " (a list of Python numbers is stored as bool when all items are bool, int64 when all are int, "
        "else float64: write every sample's list with the same kind of items, e.g. [float(v) for v in x]; "
        f"if the first sample's list was empty, state the dtype: schema={{{name!r}: {dtype!r}}})"
    )


_LIST_RULE = (
    "A list whose items are all Python numbers of one kind (all bool, all int, or ints and floats) "
    "is one field, a 1-d tensor whose length may vary; tuples and other lists are structures "
    "whose length must not vary"
)


def structure_message(schema: Schema, tree: Tree, leaves: Sequence[LeafSignature], where: str, first: str) -> str:
    """Why a sample's structure differs from the schema's: the first differing field and what to do."""
    difference = first_difference(schema.tree, tree)
    if difference is None:  # the same tree with another leaf count cannot happen; be safe
        return f"{where}: its structure differs from {first}'s; every sample must have the same fields"
    name, expected, got, at_expected, at_got = difference
    subject = f"field {name!r} is" if name else "the sample is"
    had = _node(expected, [LeafSignature(f.kind, f.dtype, ()) for f in schema.fields], at_expected)
    message = f"{where}: the structure differs: {subject} {_node(got, leaves, at_got)} where {first} has {had}"
    return f"{message}; {_hint(expected, got, leaves, at_got)}"


def _node(node: Tree, leaves: Sequence[LeafSignature], at: int) -> str:
    kind = node["t"]
    if kind == "leaf":
        sig = leaves[at] if at < len(leaves) else None
        if sig is None:
            return "a leaf"
        if sig.kind in ("tensor", "ndarray"):
            return f"a {'list of numbers' if sig.from_list else sig.kind} of {sig.dtype}"
        return f"a {sig.kind}"
    if kind == "dict":
        keys = node["k"]
        shown = ", ".join(repr(k) for k in keys[:8]) + (", ..." if len(keys) > 8 else "")
        return f"a dict with keys [{shown}]"
    return f"a {kind} of {len(node['c'])} items"


def _hint(expected: Tree, got: Tree, leaves: Sequence[LeafSignature], at: int) -> str:
    if expected["t"] == "dict" and got["t"] == "dict":
        missing = [k for k in expected["k"] if k not in got["k"]]
        extra = [k for k in got["k"] if k not in expected["k"]]
        if not missing and not extra:
            return "the same keys in another order: every sample needs its keys in the same order"
        parts = [f"missing {missing[:5]}" if missing else "", f"extra {extra[:5]}" if extra else ""]
        return (
            f"({', '.join(p for p in parts if p)}): every sample needs the same keys in the same order; "
            "give missing ones a value (e.g. an empty list or '') or leave extra ones out"
        )
    if got["t"] in ("list", "tuple"):
        children = got["c"]
        lists = [leaves[at + i] for i in range(len(children)) if at + i < len(leaves)]
        if any(c["t"] != "leaf" for c in children):
            fix = "convert the nested list to a NumPy array or tensor (np.asarray(...)), or flatten it"
        elif lists and all(sig.from_list for sig in lists):
            fix = (
                "its items are lists of numbers, each stored as a field of its own, so their count cannot vary; "
                "lists of one length make one 2-d field with np.asarray(...); lists of varying lengths, one padded "
                "tensor with their lengths (torch.nn.utils.rnn.pad_sequence) or one flat list of numbers with the "
                "offsets where each starts"
            )
        else:
            kinds = sorted({leaves[at + i].kind for i in range(len(children)) if at + i < len(leaves)})
            if kinds and set(kinds) <= {"str", "bytes"}:
                fix = (
                    f"its items are {' and '.join(kinds)}: join them into one str (e.g. ' '.join(...)) or "
                    "store them as one bytes value (e.g. json.dumps(...).encode())"
                )
            else:
                fix = (
                    f"its items are {', '.join(kinds) or 'mixed'}: make them numbers of one kind, "
                    "or convert the list with np.asarray(...) or torch.tensor(...)"
                )
        return f"{_LIST_RULE}. This one is a structure: {fix}"
    return "every sample must have the same structure (the same fields, nested the same way)"
