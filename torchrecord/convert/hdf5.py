"""HDF5 sources: datasets sharing their first (sample) dimension, read with h5py (the ``hdf5`` extra).

Sample ``i`` is ``{name: dataset[i]}`` over the chosen datasets; datasets inside
groups become nested dicts (``grp/x`` gives ``sample["grp"]["x"]``). How rows
are read depends on the storage layout:

* contiguous datasets are read row by row at random, in the shuffled write order
  (in ``num_workers`` processes if asked; each opens the file itself);
* chunked (for example compressed) datasets would decompress a whole chunk for
  every row read at random, so they are read in order in chunk-sized blocks and
  write_record spools the encoded samples to a temporary file beside the output
  before shuffling. A read error in such a stream stops the conversion whatever
  ``on_error`` says: a stream cannot skip past it.

Variable- and fixed-length string datasets (1-d) become ``str`` fields when
their encoding is UTF-8 and ``bytes`` fields otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from typing_extensions import Unpack

from torchrecord._store.record_file import RecordFile
from torchrecord._write.settings import spell_out
from torchrecord.convert._common import (
    KEYS,
    Converter,
    ConvertOptions,
    Names,
    PathArg,
    Target,
    existing,
    is_hdf5,
    require,
    write,
)
from torchrecord.convert._rows import RowStream, common_length, row_converter, write_stream
from torchrecord.convert.robomimic import is_robomimic
from torchrecord.errors import SourceError

__all__ = ["H5Rows", "HDF5", "from_hdf5"]

_BLOCK_BYTES = 8 << 20  # rows read per step from chunked datasets: about this many bytes


def _h5py() -> Any:
    return require("h5py", "hdf5", "reading HDF5 files")


@dataclass(frozen=True)
class _Column:
    """One dataset to convert: its path in the file, shape and layout."""

    name: str
    shape: tuple[int, ...]
    chunk_rows: int  # 0 when contiguous
    row_bytes: int


def _to_bytes(value: Any) -> bytes:
    return bytes(value)


def _to_str(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _describe(f: Any, src: str, keys: Sequence[str] | None) -> tuple[list[_Column], list[Callable[[Any], Any]]]:
    h5py = _h5py()
    if keys is None:
        names: list[str] = []

        def collect(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                names.append(name)

        f.visititems(collect)
    else:
        names = [k.strip("/") for k in keys]
    columns, converts = [], []
    for name in names:
        obj = f.get(name)
        if not isinstance(obj, h5py.Dataset):
            what = "a group" if obj is not None else "missing"
            raise SourceError(f"{src}: {name!r} is {what}, not a dataset; name datasets with keys=[...] (--keys)")
        string = h5py.check_string_dtype(obj.dtype)
        if string is not None:
            if obj.ndim != 1:
                raise SourceError(f"{src}: string dataset {name!r} must be 1-d (one string per sample)")
            convert: Callable[[Any], Any] = _to_str if string.encoding == "utf-8" else _to_bytes
            row_bytes = 64
        else:
            convert = row_converter(src, name, obj.dtype, obj.ndim)
            row_bytes = obj.dtype.itemsize * int(np.prod(obj.shape[1:]))
        chunk_rows = int(obj.chunks[0]) if obj.chunks is not None and obj.ndim > 0 else 0
        columns.append(_Column(name, tuple(obj.shape), chunk_rows, row_bytes))
        converts.append(convert)
    return columns, converts


def _nest(columns: list[_Column], values: list[Any]) -> dict[str, Any]:
    sample: dict[str, Any] = {}
    for column, value in zip(columns, values):
        *groups, leaf = column.name.split("/")
        node = sample
        for group in groups:
            node = node.setdefault(group, {})
        node[leaf] = value
    return sample


class H5Rows:
    """Map-style dataset over rows of contiguous HDF5 datasets; each process opens the file itself."""

    def __init__(self, path: str, columns: list[_Column], length: int, converts: list[Callable[[Any], Any]]) -> None:
        self.path = path
        self.columns = columns
        self.length = length
        self.converts = converts
        self._file: Any = None
        self._datasets: list[Any] = []

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self._file is None:
            self._file = _h5py().File(self.path, "r")
            self._datasets = [self._file[c.name] for c in self.columns]
        i = int(index)
        return _nest(self.columns, [c(d[i]) for c, d in zip(self.converts, self._datasets)])

    def close(self) -> None:
        """Close the file if this process opened it."""
        if self._file is not None:
            self._file.close()
        self._file, self._datasets = None, []

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_file": None, "_datasets": []}


def _stream(
    path: str, columns: list[_Column], length: int, converts: list[Callable[[Any], Any]]
) -> Iterator[dict[str, Any]]:
    """Rows in file order, read in blocks of whole chunks."""
    chunk = max([c.chunk_rows for c in columns] + [1])
    step = max(1, _BLOCK_BYTES // max(1, sum(c.row_bytes for c in columns)))
    step = max(chunk, step // chunk * chunk)
    with _h5py().File(path, "r") as f:
        datasets = [f[c.name] for c in columns]
        for start in range(0, length, step):
            stop = min(length, start + step)
            try:
                blocks = [d[start:stop] for d in datasets]
            except OSError as exc:
                raise SourceError(f"{path}: cannot read rows {start}..{stop - 1} ({exc})") from None
            for j in range(stop - start):
                yield _nest(columns, [c(b[j]) for c, b in zip(converts, blocks)])


@spell_out(ConvertOptions)
def from_hdf5(source: PathArg, path: PathArg, *, keys: Names = None, **options: Unpack[ConvertOptions]) -> RecordFile:
    """Convert the datasets of an HDF5 file into a record set, one sample per row.

    Args:
        source: the HDF5 file.
        path: the record set to write.
        keys: dataset paths to convert (``"images"``, ``"meta/ids"``), in this order;
            default: every dataset in the file, which must then all share their
            first dimension.
        **options: the write options and ``shard``/``num_shards``
            (:class:`~torchrecord.convert.ConvertOptions`).

    Raises:
        ImportError: h5py is not installed (``pip install h5py``, or the ``hdf5`` extra).
        SourceError: the file is missing or not HDF5, a dataset is missing, scalar,
            of an unsupported dtype, or the datasets disagree in length.
    """
    target = Target.of(path, options, "from_hdf5")
    src = existing(source)
    h5py = _h5py()
    try:
        f = h5py.File(src, "r")
    except OSError as exc:
        raise SourceError(f"{src}: cannot open as HDF5 ({exc})") from None
    with f:
        columns, converts = _describe(f, src, keys)
    try:
        length = common_length(src, {c.name: c.shape for c in columns})
    except SourceError:
        if keys is None and is_robomimic(src):
            raise SourceError(
                f"{src}: a robomimic file (demos under data/), whose demos differ in length: convert it with "
                "format='robomimic' (--format robomimic, or leave --format out)"
            ) from None
        raise
    meta = {"source_format": "hdf5"}
    if any(c.chunk_rows for c in columns):
        stream = RowStream(length, functools.partial(_stream, src, columns, length, converts))
        return write_stream(stream, target, meta)
    rows = H5Rows(src, columns, length, converts)
    try:
        return write(rows, target, meta)
    finally:
        rows.close()


HDF5 = Converter(
    "hdf5",
    from_hdf5,
    "{name: row} over its datasets, which share their first dimension",
    is_hdf5,
    rank=50,  # after robomimic, whose files are HDF5 too
    options=(KEYS,),
)
