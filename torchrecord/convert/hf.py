"""Hugging Face ``datasets`` sources: a ``Dataset``, ``DatasetDict``, streaming ``IterableDataset``, or one on disk.

The rows are read from the dataset's Arrow record batches, never through
``datasets``' Python row formatting (which would decode every image):

==========================================  ============================================
column (feature / Arrow type)               field of the sample
==========================================  ============================================
``Value`` int, uint, float, bool            0-d NumPy array of that dtype
``ClassLabel``                              ``int``; the names go into the metadata
fixed-size list (``Sequence(length=n)``,     NumPy array of the fixed shape
``Array2D``..., nested)
variable-length list of numbers              ``list`` of numbers (a 1-d field whose length
                                            varies, e.g. token ids)
``Value("string")``                          ``str``
``Value("binary")``                          ``bytes``
``Image``, ``Audio``                          the encoded file's ``bytes`` (decode after
                                            shuffling: :func:`torchrecord.transforms.decode_image`)
==========================================  ============================================

Any other column (structs, nested variable lists, timestamps...) is a
SourceError naming it: leave it out with ``keys=``. Null values are a
SourceError naming the column and row.

A ``Dataset`` is read at random (memory-mapped Arrow), so it is shuffled
without a spool, read in ``num_workers`` processes, and sharded by positions
like any map-style source. A streaming ``IterableDataset`` is read once, in
order, as one stream (shuffled through the write spool); with ``shard`` and
``num_shards`` it is written whole as that one shard (give each shard its own
part, e.g. ``dataset.shard(num_shards=n, index=i)``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.extras import HF_HINT
from torchrecord._store.record_file import RecordFile
from torchrecord._store.record_set import is_url
from torchrecord._write.fastwrite import BytesColumn
from torchrecord._write.settings import WriteSettings
from torchrecord._write.writer import SchemaArg
from torchrecord.convert._common import write
from torchrecord.errors import ArgumentError, ArgumentTypeError, MissingDependencyError, SourceError

__all__ = ["HFRows", "from_hf", "is_hf_folder", "load_hf"]

_BATCH_ROWS = 1024  # rows per Arrow batch read from a streaming dataset
#: numeric columns up to this many bytes per row are joined across record batches for the writer's column path
_JOINED_ROW_BYTES = 1024
_SAVED_MARKERS = ("dataset_dict.json", "state.json")


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise MissingDependencyError(f"converting a Hugging Face dataset needs datasets: {HF_HINT}") from exc
    return datasets


def _parquet_files(folder: str) -> list[str]:
    found = []
    for directory, subdirs, names in os.walk(folder):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        found += [os.path.join(directory, n) for n in sorted(names) if n.endswith(".parquet")]
    return found


def is_hf_folder(folder: str) -> bool:
    """True for a folder written by ``save_to_disk`` or holding parquet files (and nothing that looks like images)."""
    if any(os.path.exists(os.path.join(folder, m)) for m in _SAVED_MARKERS):
        return True
    from torchrecord.convert.images import IMG_EXTENSIONS

    parquet = False
    for _directory, subdirs, names in os.walk(folder):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        if any(n.lower().endswith(IMG_EXTENSIONS) for n in names):
            return False  # an image folder (perhaps with parquet beside it): ambiguous, stays "folder"
        parquet = parquet or any(n.endswith(".parquet") for n in names)
    return parquet


def load_hf(folder: str | os.PathLike[str]) -> Any:
    """The dataset in a folder: ``load_from_disk`` for a ``save_to_disk`` folder, else its parquet files (streamed).

    Parquet files are read with ``load_dataset("parquet", data_dir=..., streaming=True)``,
    which names the splits from the file names (``train-00000-of-00002.parquet``)
    and takes the features from the files' own metadata; nothing is cached.
    """
    path = os.fspath(folder)
    if not os.path.isdir(path):
        raise SourceError(f"{path}: not a folder; a Hugging Face dataset on disk is a save_to_disk or parquet folder")
    datasets = _datasets()
    if any(os.path.exists(os.path.join(path, m)) for m in _SAVED_MARKERS):
        return datasets.load_from_disk(path)
    if not _parquet_files(path):
        raise SourceError(f"{path}: holds neither a save_to_disk dataset (state.json...) nor parquet files")
    return datasets.load_dataset("parquet", data_dir=path, streaming=True)


# -- columns ------------------------------------------------------------------------


class _Spec:
    """How one column becomes a field: its kind and, for arrays, the fixed shape or the list's dtype."""

    def __init__(self, name: str, kind: str, shape: tuple[int, ...] = (), class_names: list[str] | None = None):
        self.name = name
        self.kind = kind  # number, classlabel, array, list, str, bytes, encoded
        self.shape = shape
        self.class_names = class_names


def _feature_type(feature: Any) -> str:
    return type(feature).__name__ if feature is not None else ""


def _specs(schema: Any, features: Mapping[str, Any] | None, keys: Sequence[str] | None, where: str) -> list[_Spec]:
    """The field of each chosen column, from the Arrow schema and the ``datasets`` features."""
    import pyarrow as pa

    names = list(schema.names)
    if keys is not None:
        if isinstance(keys, str):
            keys = [keys]
        missing = [k for k in keys if k not in names]
        if missing:
            raise SourceError(f"{where}: no column named {missing[0]!r}; it has {names}")
        names = list(keys)
    if not names:
        raise SourceError(f"{where}: has no columns to convert")
    specs = []
    for name in names:
        typ = schema.field(name).type
        feature = features.get(name) if features is not None else None
        kind = _feature_type(feature)
        fix = "leave it out with keys=[...] (--keys)"
        if kind in ("Image", "Audio") or (pa.types.is_struct(typ) and {f.name for f in typ} == {"bytes", "path"}):
            specs.append(_Spec(name, "encoded"))
        elif kind == "ClassLabel":
            specs.append(_Spec(name, "classlabel", class_names=list(feature.names)))  # type: ignore[union-attr]
        elif pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
            _storable(typ, name, where, fix)
            specs.append(_Spec(name, "number"))
        elif pa.types.is_string(typ) or pa.types.is_large_string(typ):
            specs.append(_Spec(name, "str"))
        elif pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
            specs.append(_Spec(name, "bytes"))
        elif pa.types.is_fixed_size_list(typ):
            shape: list[int] = []
            while pa.types.is_fixed_size_list(typ):
                shape.append(typ.list_size)
                typ = typ.value_type
            if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ)):
                raise SourceError(f"{where}: column {name!r} is a fixed-size list of {typ}, not of numbers; {fix}")
            _storable(typ, name, where, fix)
            specs.append(_Spec(name, "array", tuple(shape)))
        elif (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and (
            pa.types.is_integer(typ.value_type) or pa.types.is_floating(typ.value_type)
        ):
            specs.append(_Spec(name, "list"))
        else:
            raise SourceError(f"{where}: column {name!r} has Arrow type {typ}, which torchrecord cannot store; {fix}")
    return specs


def _storable(typ: Any, name: str, where: str, fix: str) -> None:
    try:
        _dtypes.from_numpy(np.dtype(typ.to_pandas_dtype()))
    except TypeError:
        raise SourceError(f"{where}: column {name!r} has dtype {typ}, which torchrecord cannot store; {fix}") from None


class _Batch:
    """One Arrow record batch, read row by row without per-row Arrow calls."""

    def __init__(self, batch: Any, specs: list[_Spec], where: str, first: int) -> None:
        import pyarrow.compute as pc

        self.where = where
        self.first = first  # the dataset row of this batch's row 0 (for errors)
        #: (column, validity per row) of the columns with nulls: a null is refused when its row is read,
        #: so the error names the sample being written (a batch holds many samples)
        self.nulls: list[tuple[str, np.ndarray]] = []
        self.getters: list[tuple[str, Callable[[int], Any]]] = []
        #: per column, every row of the batch as a column for the writer (an array or a BytesColumn over
        #: the Arrow buffers); None where only rows work (images read from files, lists, bad UTF-8)
        self.columns: list[Any] = []
        for spec in specs:
            column = batch.column(spec.name)
            getter: Callable[[int], Any]
            whole: Any = None
            if spec.kind == "encoded":
                data, paths = pc.struct_field(column, "bytes"), pc.struct_field(column, "path")
                data_of = self._binary(data, spec.name, nullable=True)
                getter = self._encoded(spec.name, data_of, self._binary(paths, spec.name, nullable=True))
                if not data.null_count:  # every image held as bytes (else the rows read the files)
                    whole = _whole(data)
            elif spec.kind == "str":
                raw = self._binary(column, spec.name)
                getter = _decoded(raw)
                if _valid_utf8(column):  # else the rows' decoding names the bad row
                    whole = _whole(column, text=True)
            elif spec.kind == "bytes":
                getter = self._binary(column, spec.name)
                whole = _whole(column)
            elif spec.kind in ("number", "classlabel"):
                column = self._nulls_by_row(column, spec.name, fill=True)
                values = column.to_numpy(zero_copy_only=False)
                getter = values.item if spec.kind == "classlabel" else _zero_d(values)
                # a ClassLabel is a Python int, stored as int64
                whole = values.astype(np.int64, copy=False) if spec.kind == "classlabel" else values
            elif spec.kind == "array":
                self._no_nulls(column, spec.name)
                flat = column.flatten()
                for _ in spec.shape[1:]:
                    flat = flat.flatten()
                self._no_nulls(flat, spec.name)
                values = flat.to_numpy(zero_copy_only=False).reshape(len(column), *spec.shape)
                getter, whole = values.__getitem__, values
            else:  # a variable-length list of numbers
                self._nulls_by_row(column, spec.name)  # a null row has an empty range of offsets
                offsets = column.offsets.to_numpy()
                values = column.values.to_numpy(zero_copy_only=False)
                getter = _list_rows(offsets, values)
            self.getters.append((spec.name, getter))
            self.columns.append(None if batch.column(spec.name).null_count else whole)

    def _nulls_by_row(self, column: Any, name: str, fill: bool = False) -> Any:
        """``column``, its nulls noted to be refused when their row is read (``fill``: numbers keep their dtype)."""
        if not column.null_count:
            return column
        self.nulls.append((name, np.asarray(column.is_valid())))
        if not fill:
            return column
        import pyarrow as pa

        return column.fill_null(pa.scalar(False if pa.types.is_boolean(column.type) else 0, column.type))

    def _no_nulls(self, column: Any, name: str) -> None:
        if column.null_count:
            row = int(np.flatnonzero(~np.asarray(column.is_valid()))[0])
            raise SourceError(f"{self.where}: row {self.first + row}, column {name!r} is null; nulls cannot be stored")

    def _binary(self, column: Any, name: str, nullable: bool = False) -> Callable[[int], bytes | None]:
        """Row -> the bytes of a binary/string column (zero-copy until the row is asked for)."""
        if not nullable:
            self._nulls_by_row(column, name)
        offsets, data = _buffers(column)
        valid = np.asarray(column.is_valid()) if column.null_count else None

        def get(i: int) -> bytes | None:
            if valid is not None and not valid[i]:
                return None
            return data[offsets[i] : offsets[i + 1]].tobytes()

        return get

    def _encoded(
        self, name: str, data: Callable[[int], bytes | None], paths: Callable[[int], bytes | None]
    ) -> Callable[[int], bytes]:
        def get(i: int) -> bytes:
            value = data(i)
            if value is not None:
                return value
            path = paths(i)
            if path is None:
                raise SourceError(f"{self.where}: row {self.first + i}, column {name!r} holds neither bytes nor a path")
            file = path.decode()
            try:
                with open(file, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise SourceError(
                    f"{self.where}: row {self.first + i}, column {name!r}: cannot read {file} ({exc.strerror or exc})"
                ) from None

        return get

    def row(self, i: int, index: int | None = None) -> dict[str, Any]:
        """Row ``i`` of the batch; ``index``: the sample's index in the dataset, named in errors."""
        for name, valid in self.nulls:
            if not valid[i]:
                at = self.first + i if index is None else index
                raise SourceError(f"{self.where}: row {at}, column {name!r} is null; nulls cannot be stored")
        return {name: get(i) for name, get in self.getters}


def _buffers(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """A binary or string Arrow array's offsets [len + 1] and data, as NumPy views of its buffers (no copy)."""
    offsets_buf, data_buf = column.buffers()[1:3]
    large = "large" in str(column.type)
    start = column.offset
    offsets = np.frombuffer(offsets_buf, np.int64 if large else np.int32)[start : start + len(column) + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, data


def _whole(column: Any, text: bool = False) -> BytesColumn:
    """Every value of a binary or string column, over its own buffers (nulls were refused)."""
    offsets, data = _buffers(column)
    return BytesColumn.from_offsets(data, offsets, text=text)


def _valid_utf8(column: Any) -> bool:
    """True when every value of a string column is valid UTF-8 (Arrow checks it in C)."""
    try:
        column.validate(full=True)
    except Exception:  # pyarrow.ArrowInvalid, naming nothing a user could act on: the rows say which
        return False
    return True


def _decoded(raw: Callable[[int], bytes | None]) -> Callable[[int], str]:
    return lambda i: (raw(i) or b"").decode("utf-8")  # nulls were refused


def _zero_d(values: np.ndarray) -> Callable[[int], np.ndarray]:
    return lambda i: values[i : i + 1].reshape(())


def _list_rows(offsets: np.ndarray, values: np.ndarray) -> Callable[[int], list[Any]]:
    return lambda i: values[offsets[i] : offsets[i + 1]].tolist()


class HFRows:
    """Map-style dataset over a ``datasets.Dataset``'s Arrow table: row ``i`` as a dict of fields.

    Reads the memory-mapped record batches in each process (pickles as the
    dataset itself does: by file, for a dataset on disk), follows the
    dataset's indices mapping (after ``select``, ``shuffle``, ``filter``), and
    builds each batch's column views once.
    """

    def __init__(self, dataset: Any, specs: list[_Spec], where: str) -> None:
        self.dataset = dataset
        self.specs = specs
        self.where = where
        self.length = len(dataset)
        self._state: tuple[list[Any], np.ndarray, np.ndarray | None] | None = None
        self._batches: dict[int, _Batch] = {}
        self._columns: list[Any] | None = None

    def __len__(self) -> int:
        return self.length

    def _open(self) -> tuple[list[Any], np.ndarray, np.ndarray | None]:
        if self._state is None:
            table = self.dataset.data.table.select([s.name for s in self.specs])
            batches = table.to_batches()
            starts = np.cumsum([0] + [b.num_rows for b in batches])
            mapping = getattr(self.dataset, "_indices", None)  # set by select / shuffle / filter
            rows = mapping.column(0).to_numpy().astype(np.int64) if mapping is not None else None
            self._state = (batches, starts, rows)
        return self._state

    def __getitem__(self, index: int) -> dict[str, Any]:
        _, starts, rows = self._open()
        row = int(rows[index]) if rows is not None else int(index)
        b = int(np.searchsorted(starts, row, side="right")) - 1
        return self._batch(b).row(row - int(starts[b]), index)

    def _batch(self, b: int) -> _Batch:
        batch = self._batches.get(b)
        if batch is None:
            batches, starts, _ = self._open()
            batch = self._batches[b] = _Batch(batches[b], self.specs, self.where, int(starts[b]))
        return batch

    def _whole_columns(self) -> list[Any]:
        """Per field, the column of every row of the table (None where only rows work), built once.

        Bytes and str columns join the Arrow chunks' buffers without a copy
        (one Arrow call per column, not per record batch); small numbers are
        concatenated; arrays of more than :data:`_JOINED_ROW_BYTES` per row stay
        per batch (a list of their columns).
        """
        if self._columns is None:
            batches, _, _ = self._open()
            table = self.dataset.data.table
            per_batch: list[list[Any]] | None = None
            out: list[Any] = []
            for i, spec in enumerate(self.specs):
                whole = _chunked_column(table.column(spec.name), spec)
                if whole is _PER_BATCH:
                    if per_batch is None:
                        per_batch = [self._batch(b).columns for b in range(len(batches))]
                    whole = _joined_parts([columns[i] for columns in per_batch])
                out.append(whole)
            self._columns = out
        return self._columns

    def _torchrecord_columns(self, positions: np.ndarray) -> list[Any] | None:
        """Rows at ``positions`` as one column per field, for the writer's column path (None: read rows)."""
        columns = self._whole_columns()
        if any(c is None for c in columns):
            return None
        _, starts, rows = self._open()
        wanted = rows[positions] if rows is not None else np.asarray(positions, np.int64)
        out: list[Any] = []
        for column in columns:
            if isinstance(column, list):  # large arrays, per record batch
                which = np.searchsorted(starts, wanted, side="right") - 1
                local = wanted - starts[which]
                taken = np.empty((len(wanted), *column[0].shape[1:]), column[0].dtype)
                for b in np.unique(which).tolist():
                    chosen = which == b
                    taken[chosen] = column[b][local[chosen]]
                out.append(taken)
            else:
                out.append(column.take(wanted) if isinstance(column, BytesColumn) else column[wanted])
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_state": None, "_batches": {}, "_columns": None}


#: the marker of a column joined from the record batches' own columns
_PER_BATCH: Any = object()


def _chunked_column(chunked: Any, spec: _Spec) -> Any:
    """The whole column of a table's ChunkedArray for the writer (None: only rows work; _PER_BATCH: join batches)."""
    import pyarrow.compute as pc

    if spec.kind in ("encoded", "str", "bytes"):
        text = spec.kind == "str"
        data = pc.struct_field(chunked, "bytes") if spec.kind == "encoded" else chunked
        if data.null_count or (text and not _valid_utf8(data)):
            return None  # rows read the files, or name the null or the bad value
        if not data.num_chunks:
            return BytesColumn(np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64), text)
        return BytesColumn.concat([_whole(chunk, text=text) for chunk in data.chunks])
    if spec.kind in ("number", "classlabel"):
        if chunked.null_count:
            return None  # the rows name the null
        values = chunked.to_numpy()
        # a ClassLabel is a Python int, stored as int64
        return values.astype(np.int64, copy=False) if spec.kind == "classlabel" else values
    return _PER_BATCH


def _joined_parts(parts: list[Any]) -> Any:
    """One column from the record batches' columns of a field (None if any batch has none)."""
    if any(p is None for p in parts):
        return None
    if isinstance(parts[0], BytesColumn):
        return BytesColumn.concat(parts)
    if parts[0][:1].nbytes <= _JOINED_ROW_BYTES:
        return np.concatenate(parts)
    return list(parts)


class _HFStream:
    """An iterable over a streaming dataset's rows, read as Arrow batches (each iteration starts afresh)."""

    def __init__(self, dataset: Any, keys: Sequence[str] | None, where: str) -> None:
        self.dataset = dataset
        self.keys = keys
        self.where = where

    def __iter__(self) -> Iterator[dict[str, Any]]:
        features = self.dataset.features
        first = 0
        specs: list[_Spec] | None = None
        for table in self.dataset.with_format("arrow").iter(batch_size=_BATCH_ROWS):
            if specs is None:
                specs = _specs(table.schema, features, self.keys, self.where)
            for record_batch in table.select([s.name for s in specs]).to_batches():
                batch = _Batch(record_batch, specs, self.where, first)
                for i in range(record_batch.num_rows):
                    yield batch.row(i)
                first += record_batch.num_rows


def _metadata(specs: list[_Spec], split: str | None, info: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"source_format": "hf"}
    labels = {s.name: s.class_names for s in specs if s.class_names is not None}
    if len(labels) == 1:
        meta["classes"] = next(iter(labels.values()))  # as from_image_folder stores them
    if labels:
        meta["class_names"] = labels
    if split is not None:
        meta["split"] = split
    name = getattr(info, "dataset_name", None) if info is not None else None
    if isinstance(name, str):
        meta["dataset_name"] = name
    return meta


def from_hf(
    dataset: Any,
    path: str | os.PathLike[str],
    *,
    split: str | None = None,
    keys: Sequence[str] | None = None,
    shard: int | None = None,
    num_shards: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    overwrite: bool = False,
    progress: bool | None = None,
    metadata: dict[str, Any] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    max_skipped: int | float | None = None,
    checksums: bool = True,
    samples_per_record: int | None = None,
    group_by: str | Callable[[Any], Any] | None = None,
    schema: SchemaArg = None,
    initial_map_size: int = 1 << 28,
    commit_bytes: int = 64 << 20,
    multiprocessing_context: Literal["fork", "spawn", "forkserver"] | None = None,
    compression: Literal["zstd", "lz4"] | Mapping[str, Literal["zstd", "lz4"] | None] | None = None,
    compression_level: int | None = None,
) -> Any:
    """Convert a Hugging Face dataset into a record set, one sample per row (see this module's table).

    Args:
        dataset: a ``datasets.Dataset``, a ``DatasetDict``, a streaming
            ``IterableDataset`` / ``IterableDatasetDict``, or the path of a folder
            written by ``save_to_disk`` or holding the dataset's parquet files.
        path: the record set to write; for a dataset dict without ``split``, a
            folder that gets one set per split, ``path/<split>`` (a file, or a
            sharded set's folder with ``num_shards``).
        split: convert only this split of a dataset dict, to ``path`` itself.
        keys: the columns to convert, in this order (default: all).
        shard, num_shards: write shard ``shard`` of ``num_shards`` of a sharded
            set in the folder ``path`` (see :func:`torchrecord.write_shard`); a
            streaming dataset is written whole as that one shard.
        shuffle, seed, num_workers, overwrite, progress, metadata, on_error,
        max_skipped, checksums, samples_per_record, group_by, schema,
        initial_map_size, commit_bytes, multiprocessing_context, compression,
        compression_level: as for :func:`torchrecord.write_record`, with the
            same defaults; ``metadata`` is stored beside the converter's keys
            (``source_format``, ``split``, and the ``ClassLabel`` names: ``classes``
            for the one ClassLabel column, ``class_names`` by column).

    Returns:
        The :class:`~torchrecord.RecordFile` written, or for a dataset dict
        without ``split`` a dict of split name -> RecordFile.

    Raises:
        SourceError: a column cannot be stored (naming it), a value is null, or
            the split does not exist.
        MissingDependencyError: ``datasets`` is not installed (``hf`` extra).
    """
    settings = WriteSettings.of(locals())
    datasets = _datasets()
    if isinstance(dataset, (str, os.PathLike)):
        dataset = load_hf(dataset)
    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if split is not None:
            if split not in dataset:
                raise SourceError(f"the dataset has no split {split!r}; it has {sorted(dataset)}")
            return _convert_one(dataset[split], path, split, keys, settings, shard, num_shards)
        if not dataset:
            raise SourceError("the dataset dict holds no splits")
        if not is_url(os.fspath(path)):  # an object store has no folders to make
            os.makedirs(path, exist_ok=True)
        return {
            name: _convert_one(part, os.path.join(path, name), name, keys, settings, shard, num_shards)
            for name, part in dataset.items()
        }
    if not isinstance(dataset, (datasets.Dataset, datasets.IterableDataset)):
        raise ArgumentTypeError(
            f"from_hf takes a datasets.Dataset, DatasetDict, IterableDataset or a folder, not {type(dataset).__name__}"
        )
    if split is not None:
        given = getattr(dataset, "split", None)
        if given is not None and str(given) != split:
            raise ArgumentError(f"split={split!r}, but the dataset is its {str(given)!r} split")
    return _convert_one(dataset, path, split, keys, settings, shard, num_shards)


def _convert_one(
    dataset: Any,
    path: str | os.PathLike[str],
    split: str | None,
    keys: Sequence[str] | None,
    settings: WriteSettings,
    shard: int | None,
    num_shards: int | None,
) -> RecordFile:
    datasets = _datasets()
    name = split or (str(dataset.split) if getattr(dataset, "split", None) is not None else None)
    where = f"the Hugging Face dataset{f' ({name} split)' if name else ''}"
    features = dataset.features
    if isinstance(dataset, datasets.Dataset):
        specs = _specs(dataset.data.table.schema, features, keys, where)
        if len(dataset) == 0:
            raise SourceError(f"{where}: has 0 rows; there is nothing to convert")
        meta = _metadata(specs, name, dataset.info)
        return write(HFRows(dataset, specs, where), path, meta, settings, shard, num_shards)
    if features is not None:  # the schema is known up front: refuse bad columns before reading
        specs = _specs(features.arrow_schema, features, keys, where)
    else:
        specs = _specs(next(iter(dataset.with_format("arrow").iter(batch_size=1))).schema, None, keys, where)
    meta = _metadata(specs, name, getattr(dataset, "info", None))
    return write(_HFStream(dataset, keys, where), path, meta, settings, shard, num_shards)
