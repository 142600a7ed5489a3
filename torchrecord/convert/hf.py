"""Hugging Face ``datasets`` sources: a ``Dataset``, ``DatasetDict``, streaming ``IterableDataset``, or one on disk.

The rows are read from the dataset's Arrow record batches, never through
``datasets``' Python row formatting (which would decode every image); which
column becomes what field, and the one rule for nulls, are in
:mod:`torchrecord.convert.arrow`. Any other column (structs, nested variable
lists, timestamps...) is a SourceError naming it: leave it out with ``keys=``.

A ``Dataset`` is read at random (memory-mapped Arrow), so it is shuffled
without a spool, read in ``num_workers`` processes, and sharded by positions
like any map-style source. A streaming ``IterableDataset`` is read once, in
order, as one stream (shuffled through the write spool); with ``shard`` and
``num_shards`` it is written whole as that one shard (give each shard its own
part, e.g. ``dataset.shard(num_shards=n, index=i)``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from typing_extensions import Unpack

from torchrecord._core.extras import HF_HINT
from torchrecord._core.schema import Schema
from torchrecord._store.record_file import RecordFile
from torchrecord._store.record_set import is_url
from torchrecord._write.fastwrite import BytesColumn
from torchrecord._write.settings import spell_out
from torchrecord.convert._common import KEYS, Converter, ConvertOptions, Option, Target, write
from torchrecord.convert.arrow import PER_BATCH, Batch, Spec, chunked_column, column_specs, joined_parts
from torchrecord.errors import ArgumentError, ArgumentTypeError, MissingDependencyError, SourceError

__all__ = ["HF", "HFRows", "from_hf", "is_hf_folder", "load_hf"]

_BATCH_ROWS = 1024  # rows per Arrow batch read from a streaming dataset
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


class HFRows:
    """Map-style dataset over a ``datasets.Dataset``'s Arrow table: row ``i`` as a dict of fields.

    Reads the memory-mapped record batches in each process (pickles as the
    dataset itself does: by file, for a dataset on disk), follows the
    dataset's indices mapping (after ``select``, ``shuffle``, ``filter``), and
    builds each batch's column views once.
    """

    def __init__(self, dataset: Any, specs: list[Spec], where: str) -> None:
        self.dataset = dataset
        self.specs = specs
        self.where = where
        self.length = len(dataset)
        self._state: tuple[list[Any], np.ndarray, np.ndarray | None] | None = None
        self._batches: dict[int, Batch] = {}
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
        try:
            return self._batch(b).row(row - int(starts[b]))
        except SourceError as exc:
            if row == index:
                raise
            # the dataset's index, as the writer numbers the sample (not the Arrow table's row behind a select)
            raise SourceError(str(exc).replace(f": row {row},", f": row {index},", 1)) from None

    def _batch(self, b: int) -> Batch:
        batch = self._batches.get(b)
        if batch is None:
            batches, starts, _ = self._open()
            batch = self._batches[b] = Batch(batches[b], self.specs, self.where, int(starts[b]))
        return batch

    def _whole_columns(self) -> list[Any]:
        """Per field, the column of every row of the table (None where only rows work), built once.

        Bytes and str columns join the Arrow chunks' buffers without a copy
        (one Arrow call per column, not per record batch); small numbers are
        concatenated; arrays of more than 1 KiB per row stay
        per batch (a list of their columns).
        """
        if self._columns is None:
            batches, _, _ = self._open()
            table = self.dataset.data.table
            per_batch: list[list[Any]] | None = None
            out: list[Any] = []
            for i, spec in enumerate(self.specs):
                whole = chunked_column(table.column(spec.name), spec)
                if whole is PER_BATCH:
                    if per_batch is None:
                        per_batch = [self._batch(b).columns for b in range(len(batches))]
                    whole = joined_parts([columns[i] for columns in per_batch])
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


class _HFStream:
    """An iterable over a streaming dataset's rows, read as Arrow batches (each iteration starts afresh).

    Every batch is cast to the dataset's features where they are known (older
    ``datasets`` give generator rows uncast), and an exception the dataset
    raises while producing rows (a ``.map`` on it decodes images, and a broken
    image fails there) is a SourceError naming the row and the image columns.
    """

    def __init__(self, dataset: Any, keys: Sequence[str] | None, where: str) -> None:
        self.dataset = dataset
        self.where = where
        features = dataset.features
        self.encoded = [n for n, f in (features or {}).items() if type(f).__name__ in ("Image", "Audio")]
        if features is not None:
            schema = features.arrow_schema
        else:  # known from the first rows only
            first = next(self._tables(), None)
            if first is None:
                raise SourceError(f"{where}: has 0 rows; there is nothing to convert")
            schema = first.schema
        self.specs = column_specs(schema, features, keys, where)
        self.schema = features.arrow_schema if features is not None else None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        first = 0
        names = [s.name for s in self.specs]
        for table in self._tables():
            table = table.select(names)
            if self.schema is not None:
                table = _cast(table, self.schema, self.where, first)
            for record_batch in table.to_batches():
                batch = Batch(record_batch, self.specs, self.where, first)
                for i in range(record_batch.num_rows):
                    yield batch.row(i)
                first += record_batch.num_rows

    def _tables(self) -> Iterator[Any]:
        rows = 0
        tables = iter(self.dataset.with_format("arrow").iter(batch_size=_BATCH_ROWS))
        while True:
            try:
                table = next(tables)
            except StopIteration:
                return
            except Exception as exc:  # the dataset's own pipeline (datasets, PIL, the user's .map) failed
                raise SourceError(self._failed(exc, rows)) from exc
            rows += table.num_rows
            yield table

    def _failed(self, exc: Exception, rows: int) -> str:
        """What failed where: the row found again one at a time (a stream starts afresh), and the image columns."""
        found = rows
        try:
            for _ in self.dataset.skip(rows).with_format("arrow").iter(batch_size=1):
                found += 1
                if found - rows >= _BATCH_ROWS:
                    break
        except Exception:  # the same failure, now one row at a time (unless the pipeline works in batches)
            pass
        row = f"row {found}" if found > rows else f"one of rows {rows}..{rows + _BATCH_ROWS - 1}"
        columns = f" ({', '.join(repr(c) for c in self.encoded)})" if self.encoded else ""
        hint = ""
        if type(exc).__module__.split(".")[0] == "PIL":
            hint = (
                f"; the dataset decodes its Image columns{columns} for a .map or .filter on it, and the image's "
                "bytes are broken: convert the dataset before mapping it (from_hf keeps images as their bytes), "
                "or leave the bad image out"
            )
        return f"{self.where}: {row}: the dataset raised {type(exc).__name__} ({exc}) while producing it{hint}"


def _cast(table: Any, schema: Any, where: str, first: int) -> Any:
    """``table`` cast to the dataset's features (the same columns)."""
    import pyarrow as pa

    target = pa.schema([schema.field(name) for name in table.column_names])
    if table.schema == target:
        return table
    try:
        return table.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SourceError(f"{where}: rows from {first} do not fit the dataset's features ({exc})") from None


def _metadata(specs: list[Spec], split: str | None, info: Any) -> dict[str, Any]:
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


@spell_out(ConvertOptions)
def from_hf(
    dataset: Any,
    path: str | os.PathLike[str],
    *,
    split: str | None = None,
    keys: Sequence[str] | None = None,
    **options: Unpack[ConvertOptions],
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
        **options: the write options and ``shard``/``num_shards``
            (:class:`~torchrecord.convert.ConvertOptions`; a streaming dataset
            is written whole as that one shard); ``metadata`` is stored beside the converter's keys (``source_format``,
            ``split``, and the ``ClassLabel`` names: ``classes`` for the one
            ClassLabel column, ``class_names`` by column).

    Returns:
        The :class:`~torchrecord.RecordFile` written, or for a dataset dict
        without ``split`` a dict of split name -> RecordFile.

    Raises:
        SourceError: a column cannot be stored (naming it), a value is null, or
            the split does not exist.
        MissingDependencyError: ``datasets`` is not installed (``hf`` extra).
    """
    target = Target.of(path, options, "from_hf")
    datasets = _datasets()
    if isinstance(dataset, (str, os.PathLike)):
        dataset = load_hf(dataset)
    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if split is not None:
            if split not in dataset:
                raise SourceError(f"the dataset has no split {split!r}; it has {sorted(dataset)}")
            return _convert_one(dataset[split], target, split, keys)
        if not dataset:
            raise SourceError("the dataset dict holds no splits")
        if not is_url(os.fspath(path)):  # an object store has no folders to make
            os.makedirs(path, exist_ok=True)
        return {
            name: _convert_one(part, target.at(os.path.join(path, name)), name, keys) for name, part in dataset.items()
        }
    if not isinstance(dataset, (datasets.Dataset, datasets.IterableDataset)):
        raise ArgumentTypeError(
            f"from_hf takes a datasets.Dataset, DatasetDict, IterableDataset or a folder, not {type(dataset).__name__}"
        )
    if split is not None:
        given = getattr(dataset, "split", None)
        if given is not None and str(given) != split:
            raise ArgumentError(f"split={split!r}, but the dataset is its {str(given)!r} split")
    return _convert_one(dataset, target, split, keys)


def _convert_one(dataset: Any, target: Target, split: str | None, keys: Sequence[str] | None) -> RecordFile:
    datasets = _datasets()
    name = split or (str(dataset.split) if getattr(dataset, "split", None) is not None else None)
    where = f"the Hugging Face dataset{f' ({name} split)' if name else ''}"
    features = dataset.features
    if isinstance(dataset, datasets.Dataset):
        specs = column_specs(dataset.data.table.schema, features, keys, where)
        if len(dataset) == 0:
            raise SourceError(f"{where}: has 0 rows; there is nothing to convert")
        meta = _metadata(specs, name, dataset.info)
        return write(HFRows(dataset, specs, where), _lists_vary(target, specs), meta)
    stream = _HFStream(dataset, keys, where)  # refuses bad columns before reading when the features are known
    meta = _metadata(stream.specs, name, getattr(dataset, "info", None))
    return write(stream, _lists_vary(target, stream.specs), meta)


def _lists_vary(target: Target, specs: list[Spec]) -> Target:
    """The target with every list column stated as 1-d of varying length (so no VariableShapeWarning).

    What the caller states in a ``schema=`` dict about a field wins; a whole
    :class:`~torchrecord.Schema` is left as it is.
    """
    stated = target.settings.schema
    lists = {s.name: (None,) for s in specs if s.kind == "list"}
    if not lists or isinstance(stated, Schema):
        return target
    settings = dataclasses.replace(target.settings, schema={**lists, **(stated or {})})
    return dataclasses.replace(target, settings=settings)


HF = Converter(
    "hf",
    from_hf,
    "a Hugging Face dataset saved with save_to_disk, or a folder of its parquet files: {column: value} "
    "per row (images stay encoded bytes); a dataset dict gives PATH/<split> per split unless --split",
    lambda probe: probe.is_dir and is_hf_folder(probe.path),
    rank=20,  # before the image folder: a folder of parquet files is a dataset
    options=(
        KEYS,
        Option(
            "split",
            None,
            "str | None",
            "--split",
            "hf: convert only this split of a dataset dict, to PATH",
            {"metavar": "NAME"},
        ),
    ),
)
