"""Arrow columns of a Hugging Face dataset as fields: which column becomes what, row by row or whole.

==========================================  ============================================
column (feature / Arrow type)               field of the sample
==========================================  ============================================
``Value`` int, uint; ``ClassLabel``         ``int`` (stored as int64; ClassLabel names
                                            go into the metadata)
``Value("bool")``                           ``bool``
``Value`` float                              0-d NumPy array of its dtype (float32 stays
                                            float32)
fixed-size list (``Sequence(length=n)``,     NumPy array of the fixed shape and dtype
``Array2D``..., nested)
variable-length list of numbers              1-d tensor of the list's dtype, whose length
(``List(Value("int32"))``: token ids)       varies (int32 stays int32)
``Value("string")``                          ``str``
``Value("binary")``                          ``bytes``
``Image``, ``Audio``                          the encoded file's ``bytes``, as they are
==========================================  ============================================

Nulls are refused by one rule: a row holding a null anywhere (a null value, a
null list, a null inside a list or a fixed-size array) is a SourceError naming
the row and the column, raised when that row is read (so ``on_error="skip"``
leaves exactly those rows out); the row's other values never change kind or
dtype because of it (no NaN in an integer column). An ``Image`` or ``Audio``
value is its bytes as stored (never decoded, so the bytes of a broken image are
kept verbatim), or the file its ``path`` names when it holds no bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from torchrecord._core import dtypes as _dtypes
from torchrecord._write.fastwrite import BytesColumn
from torchrecord.errors import SourceError

__all__ = ["Batch", "PER_BATCH", "Spec", "chunked_column", "column_specs", "joined_parts"]

#: numeric columns up to this many bytes per row are joined across record batches for the writer's column path
_JOINED_ROW_BYTES = 1024
_NULLS = "nulls cannot be stored: fill them (Dataset.map) or filter the rows out first"


@dataclass(frozen=True)
class Spec:
    """How one column becomes a field: its kind and, for fixed-size arrays, the shape."""

    name: str
    kind: str  # int, bool, float, classlabel, array, list, str, bytes, encoded
    shape: tuple[int, ...] = ()
    class_names: list[str] | None = None


def column_specs(schema: Any, features: Mapping[str, Any] | None, keys: Sequence[str] | None, where: str) -> list[Spec]:
    """The field of each chosen column, from the Arrow schema and the ``datasets`` features."""
    names = list(schema.names)
    if keys is not None:
        keys = [keys] if isinstance(keys, str) else keys
        missing = [k for k in keys if k not in names]
        if missing:
            raise SourceError(f"{where}: no column named {missing[0]!r}; it has {names}")
        names = list(keys)
    if not names:
        raise SourceError(f"{where}: has no columns to convert")
    return [_spec(name, schema.field(name).type, features.get(name) if features else None, where) for name in names]


def _spec(name: str, typ: Any, feature: Any, where: str) -> Spec:
    import pyarrow as pa

    kind = type(feature).__name__ if feature is not None else ""
    fix = "leave it out with keys=[...] (--keys)"
    if kind in ("Image", "Audio") or (pa.types.is_struct(typ) and {f.name for f in typ} == {"bytes", "path"}):
        return Spec(name, "encoded")
    if kind == "ClassLabel":
        return Spec(name, "classlabel", class_names=list(feature.names))
    if _numeric(typ):
        _storable(typ, name, where, fix)
        return Spec(name, "bool" if pa.types.is_boolean(typ) else "int" if pa.types.is_integer(typ) else "float")
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return Spec(name, "str")
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return Spec(name, "bytes")
    if pa.types.is_fixed_size_list(typ):
        shape: list[int] = []
        while pa.types.is_fixed_size_list(typ):
            shape.append(typ.list_size)
            typ = typ.value_type
        if not _numeric(typ):
            raise SourceError(f"{where}: column {name!r} is a fixed-size list of {typ}, not of numbers; {fix}")
        _storable(typ, name, where, fix)
        return Spec(name, "array", tuple(shape))
    if (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and _numeric(typ.value_type):
        _storable(typ.value_type, name, where, fix)
        return Spec(name, "list")
    raise SourceError(f"{where}: column {name!r} has Arrow type {typ}, which torchrecord cannot store; {fix}")


def _numeric(typ: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ))


def _storable(typ: Any, name: str, where: str, fix: str) -> None:
    try:
        _dtypes.from_numpy(np.dtype(typ.to_pandas_dtype()))
    except TypeError:
        raise SourceError(f"{where}: column {name!r} has dtype {typ}, which torchrecord cannot store; {fix}") from None


# -- one record batch, row by row -------------------------------------------------------------------


class Batch:
    """One Arrow record batch, read row by row without per-row Arrow calls.

    ``columns`` holds, per field, every row of the batch as one column for the
    writer (an array or a BytesColumn over the Arrow buffers), or None where only
    rows work (images read from files, lists, nulls, bad UTF-8).
    """

    def __init__(self, batch: Any, specs: list[Spec], where: str, first: int) -> None:
        self.getters: list[tuple[str, Callable[[int], Any]]] = []
        self.columns: list[Any] = []
        for spec in specs:
            read, whole, bad = _READERS[spec.kind](batch.column(spec.name), spec)
            if bad is not None and bad.any():
                read, whole = _refusing(read, bad, where, first, spec.name), None
            if spec.kind == "encoded":
                read = _from_files(read, where, first, spec.name)
            self.getters.append((spec.name, read))
            self.columns.append(whole)

    def row(self, i: int) -> dict[str, Any]:
        return {name: get(i) for name, get in self.getters}


_Read = tuple[Callable[[int], Any], Any, "np.ndarray | None"]


def _refusing(read: Callable[[int], Any], bad: np.ndarray, where: str, first: int, name: str) -> Callable[[int], Any]:
    def get(i: int) -> Any:
        if bad[i]:
            raise SourceError(f"{where}: row {first + i}, column {name!r} holds a null; {_NULLS}")
        return read(i)

    return get


def _null_rows(column: Any) -> np.ndarray | None:
    return ~np.asarray(column.is_valid(), dtype=bool) if column.null_count else None


def _or(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    return b if a is None else a if b is None else a | b


def _filled(array: Any) -> Any:
    """``array`` with its nulls set to zero (their rows are refused), so the others keep their dtype."""
    if not array.null_count:
        return array
    import pyarrow as pa

    return array.fill_null(pa.scalar(False if pa.types.is_boolean(array.type) else 0, array.type))


def _numbers(column: Any, spec: Spec) -> _Read:
    values = _filled(column).to_numpy(zero_copy_only=False)
    if spec.kind in ("int", "classlabel"):
        # one kind for every integer column: a Python int, stored as int64 (a uint64 beyond it stays a row:
        # the writer refuses it, naming the field)
        fits = values.dtype != np.uint64 or not len(values) or int(values.max()) < 2**63
        return values.item, values.astype(np.int64, copy=False) if fits else None, _null_rows(column)
    if spec.kind == "bool":
        return values.item, values, _null_rows(column)
    return (lambda i: values[i : i + 1].reshape(())), values, _null_rows(column)


def _array(column: Any, spec: Spec) -> _Read:
    rows, flat, bad = len(column), column, _null_rows(column)
    for size in spec.shape:  # .values of each level, from its slice offset (nulls keep their slots)
        flat = flat.values.slice(flat.offset * size, len(flat) * size)
        nested = _null_rows(flat)
        bad = _or(bad, np.asarray(nested.reshape(rows, -1).any(axis=1)) if nested is not None else None)
    values = _filled(flat).to_numpy(zero_copy_only=False).reshape(rows, *spec.shape)
    return values.__getitem__, values, bad


def _list(column: Any, spec: Spec) -> _Read:
    offsets = column.offsets.to_numpy()
    nested = _null_rows(column.values)
    bad = _null_rows(column)
    if nested is not None:
        counted = np.concatenate([[0], np.cumsum(nested)])
        bad = _or(bad, np.asarray(counted[offsets[1:]] > counted[offsets[:-1]]))
    values = _filled(column.values).to_numpy(zero_copy_only=False)
    return (lambda i: torch.from_numpy(values[offsets[i] : offsets[i + 1]].copy())), None, bad


def _binary(column: Any, spec: Spec) -> _Read:
    get = _binary_rows(column)
    return get, _whole(column) if not column.null_count else None, _null_rows(column)


def _text(column: Any, spec: Spec) -> _Read:
    raw = _binary_rows(column)
    whole = _whole(column, text=True) if not column.null_count and _valid_utf8(column) else None
    return (lambda i: (raw(i) or b"").decode("utf-8")), whole, _null_rows(column)


def _encoded(column: Any, spec: Spec) -> _Read:
    import pyarrow.compute as pc

    data, paths = pc.struct_field(column, "bytes"), pc.struct_field(column, "path")
    of_data, of_paths = _binary_rows(data), _binary_rows(paths)
    whole = _whole(data) if not data.null_count else None  # every value held as bytes (else rows read the files)
    return (lambda i: (of_data(i), of_paths(i))), whole, None


_READERS: dict[str, Callable[[Any, Spec], _Read]] = {
    "int": _numbers,
    "bool": _numbers,
    "float": _numbers,
    "classlabel": _numbers,
    "array": _array,
    "list": _list,
    "bytes": _binary,
    "str": _text,
    "encoded": _encoded,
}


def _from_files(read: Callable[[int], Any], where: str, first: int, name: str) -> Callable[[int], bytes]:
    """An encoded value: its bytes, else the file its path names (a SourceError naming the row if neither)."""

    def get(i: int) -> bytes:
        data, path = read(i)
        if data is not None:
            return bytes(data)
        if path is None:
            raise SourceError(f"{where}: row {first + i}, column {name!r} holds neither bytes nor a path")
        file = path.decode()
        try:
            with open(file, "rb") as f:
                return f.read()
        except OSError as exc:
            raise SourceError(
                f"{where}: row {first + i}, column {name!r}: cannot read {file} ({exc.strerror or exc})"
            ) from None

    return get


def _binary_rows(column: Any) -> Callable[[int], bytes | None]:
    """Row -> the bytes of a binary/string column (zero-copy until the row is asked for); None for a null."""
    offsets, data = _buffers(column)
    valid = np.asarray(column.is_valid()) if column.null_count else None

    def get(i: int) -> bytes | None:
        if valid is not None and not valid[i]:
            return None
        return data[offsets[i] : offsets[i + 1]].tobytes()

    return get


def _buffers(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """A binary or string Arrow array's offsets [len + 1] and data, as NumPy views of its buffers (no copy)."""
    offsets_buf, data_buf = column.buffers()[1:3]
    large = "large" in str(column.type)
    start = column.offset
    offsets = np.frombuffer(offsets_buf, np.int64 if large else np.int32)[start : start + len(column) + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, data


def _whole(column: Any, text: bool = False) -> BytesColumn:
    """Every value of a binary or string column, over its own buffers (no nulls)."""
    offsets, data = _buffers(column)
    return BytesColumn.from_offsets(data, offsets, text=text)


def _valid_utf8(column: Any) -> bool:
    """True when every value of a string column is valid UTF-8 (Arrow checks it in C)."""
    try:
        column.validate(full=True)
    except Exception:  # pyarrow.ArrowInvalid, naming nothing a user could act on: the rows say which
        return False
    return True


# -- a whole table, column by column ------------------------------------------------------------------

#: the marker of a column joined from the record batches' own columns
PER_BATCH: Any = object()


def chunked_column(chunked: Any, spec: Spec) -> Any:
    """The whole column of a table's ChunkedArray for the writer (None: only rows work; PER_BATCH: join batches)."""
    import pyarrow.compute as pc

    if spec.kind in ("encoded", "str", "bytes"):
        text = spec.kind == "str"
        data = pc.struct_field(chunked, "bytes") if spec.kind == "encoded" else chunked
        if data.null_count or (text and not _valid_utf8(data)):
            return None  # rows read the files, or name the null or the bad value
        if not data.num_chunks:
            return BytesColumn(np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64), text)
        return BytesColumn.concat([_whole(chunk, text=text) for chunk in data.chunks])
    if spec.kind in ("int", "classlabel", "bool", "float"):
        if chunked.null_count:
            return None  # the rows name the null
        return _numbers(chunked.combine_chunks(), spec)[1]
    return PER_BATCH


def joined_parts(parts: list[Any]) -> Any:
    """One column from the record batches' columns of a field (None if any batch has none)."""
    if any(p is None for p in parts):
        return None
    if isinstance(parts[0], BytesColumn):
        return BytesColumn.concat(parts)
    if parts[0][:1].nbytes <= _JOINED_ROW_BYTES:
        return np.concatenate(parts)
    return list(parts)
