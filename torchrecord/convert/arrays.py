"""NumPy sources: a ``.npy`` array or an ``.npz`` archive whose first axis is the sample axis.

Nothing is loaded whole:

* ``.npy``: memory-mapped (``np.load(mmap_mode="r")``); rows are read in the
  shuffled write order, in ``num_workers`` processes if asked.
* ``.npz`` written by ``np.savez`` (members stored uncompressed): each member is
  memory-mapped at its offset inside the zip file, exactly like a ``.npy``.
* ``.npz`` written by ``np.savez_compressed``: a deflated member cannot be
  memory-mapped or read at random, so the members are decompressed as streams,
  row by row in file order, and write_record spools the encoded samples to a
  temporary file beside the output before shuffling (disk, not memory, holds
  them; expect about twice the write time). A read error in such a stream stops
  the conversion whatever ``on_error`` says: a stream cannot skip past it.

Pickled (object) arrays are refused, never unpickled.
"""

from __future__ import annotations

import functools
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
from typing_extensions import Unpack

from torchrecord._store.record_file import RecordFile
from torchrecord._write.settings import spell_out
from torchrecord.convert._common import KEYS, Converter, ConvertOptions, Names, PathArg, Probe, Target, existing, write
from torchrecord.convert._rows import RowStream, common_length, row_converter, write_stream
from torchrecord.errors import SourceError

__all__ = ["NPY", "NPZ", "NpyRows", "NpzRows", "from_numpy", "sniff_numpy"]

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_BLOCK_BYTES = 8 << 20  # rows read per step from a compressed stream: about this many bytes


def sniff_numpy(path: str) -> str:
    """``"npy"`` or ``"npz"`` from the file's first bytes; SourceError for anything else."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(_NPY_MAGIC):
        return "npy"
    if head.startswith(_ZIP_MAGIC):
        return "npz"
    raise SourceError(f"{path}: not a .npy or .npz file (it starts with {head!r})")


def _open_npy(path: str) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise SourceError(f"{path}: cannot memory-map this .npy file ({exc})") from None
    assert isinstance(array, np.ndarray)
    return array


class NpyRows:
    """Map-style dataset over the rows of a memory-mapped ``.npy`` (re-mapped in each process)."""

    def __init__(self, path: str, length: int, convert: Callable[[Any], Any]) -> None:
        self.path = path
        self.length = length
        self.convert = convert
        self._array: np.ndarray | None = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        if self._array is None:
            self._array = _open_npy(self.path)
        return self.convert(self._array[index])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_array": None}  # never pickle the mapped data


@dataclass(frozen=True)
class _Member:
    """One array of an .npz: its key, zip member name, header, and where its data starts."""

    key: str
    member: str
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool
    stored: bool  # uncompressed, so it can be memory-mapped
    offset: int  # file offset of the array data (stored members only)


def _read_header(fp: IO[bytes], where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
    else:
        raise SourceError(f"{where}: .npy format version {version} is not supported; save it with NumPy again")
    if dtype.hasobject:
        raise SourceError(f"{where}: holds Python objects (pickled), which torchrecord never unpickles")
    return tuple(int(d) for d in shape), bool(fortran), dtype


def _describe_members(path: str, keys: Sequence[str] | None) -> list[_Member]:
    members: list[_Member] = []
    try:
        with zipfile.ZipFile(path) as archive, open(path, "rb") as raw:
            infos = {i.filename[: -len(".npy")]: i for i in archive.infolist() if i.filename.endswith(".npy")}
            if keys is not None:
                missing = [k for k in keys if k not in infos]
                if missing:
                    raise SourceError(f"{path}: no array named {missing[0]!r}; it holds {sorted(infos)}")
                infos = {k: infos[k] for k in keys}
            for key, info in infos.items():
                where = f"{path}: array {key!r}"
                stored = info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 1
                if stored:
                    raw.seek(info.header_offset)
                    local = raw.read(30)
                    if len(local) < 30 or local[:4] != b"PK\x03\x04":
                        raise SourceError(f"{where}: damaged zip entry; save the archive again")
                    name_len, extra_len = struct.unpack("<HH", local[26:30])
                    raw.seek(info.header_offset + 30 + name_len + extra_len)
                    shape, fortran, dtype = _read_header(raw, where)
                    offset = raw.tell()
                else:
                    with archive.open(info) as fp:
                        shape, fortran, dtype = _read_header(fp, where)
                    offset = -1
                    if fortran and len(shape) > 1:
                        raise SourceError(
                            f"{where}: a compressed Fortran-order array cannot be read row by row; "
                            "save it in C order or with np.savez (uncompressed)"
                        )
                members.append(_Member(key, info.filename, dtype, shape, fortran, stored, offset))
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as exc:
        if isinstance(exc, SourceError):
            raise
        raise SourceError(f"{path}: not a readable .npz archive ({exc})") from None
    return members


def _map_member(path: str, m: _Member) -> np.ndarray:
    if 0 in m.shape:
        return np.zeros(m.shape, m.dtype)
    return np.memmap(path, dtype=m.dtype, mode="r", offset=m.offset, shape=m.shape, order="F" if m.fortran else "C")


class NpzRows:
    """Map-style dataset over the rows of an uncompressed ``.npz``: ``{key: row}`` per sample."""

    def __init__(self, path: str, members: list[_Member], length: int, converts: list[Callable[[Any], Any]]):
        self.path = path
        self.members = members
        self.length = length
        self.converts = converts
        self._arrays: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self._arrays is None:
            self._arrays = [_map_member(self.path, m) for m in self.members]
        return {m.key: c(a[index]) for m, c, a in zip(self.members, self.converts, self._arrays)}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": None}


def _stream_npz(
    path: str, members: list[_Member], length: int, converts: list[Callable[[Any], Any]]
) -> Iterator[dict[str, Any]]:
    """Rows of every member in file order, decompressing all members side by side."""
    row_bytes = [m.dtype.itemsize * int(np.prod(m.shape[1:])) for m in members]
    step = max(1, _BLOCK_BYTES // max(1, sum(row_bytes)))
    with zipfile.ZipFile(path) as archive:
        streams = [archive.open(m.member) for m in members]
        try:
            for m, fp in zip(members, streams):
                _read_header(fp, f"{path}: array {m.key!r}")
            for start in range(0, length, step):
                rows = min(step, length - start)
                blocks = [_read_rows(fp, m, rows, size, path) for fp, m, size in zip(streams, members, row_bytes)]
                for j in range(rows):
                    yield {m.key: c(b[j]) for m, c, b in zip(members, converts, blocks)}
        finally:
            for fp in streams:
                fp.close()


def _read_rows(fp: IO[bytes], m: _Member, rows: int, row_bytes: int, path: str) -> np.ndarray:
    shape = (rows, *m.shape[1:])
    if row_bytes == 0:
        return np.zeros(shape, m.dtype)
    try:
        data = fp.read(rows * row_bytes)
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise SourceError(f"{path}: array {m.key!r} is damaged ({exc})") from None
    if len(data) != rows * row_bytes:
        raise SourceError(f"{path}: array {m.key!r} ends early; the archive is truncated")
    return np.frombuffer(data, dtype=m.dtype).reshape(shape)


@spell_out(ConvertOptions)
def from_numpy(source: PathArg, path: PathArg, *, keys: Names = None, **options: Unpack[ConvertOptions]) -> RecordFile:
    """Convert a ``.npy`` array or ``.npz`` archive into a record set, one sample per row.

    A ``.npy`` gives samples that are its rows (``array[i]``, as NumPy arrays);
    an ``.npz`` gives ``{name: array[i]}`` over its arrays (or those named in
    ``keys``), which must agree in their first dimension. How each kind is read
    without loading it whole is described in this module's docstring. 1-d arrays
    of byte or unicode strings become ``bytes`` / ``str`` fields.

    Args:
        source: the ``.npy`` or ``.npz`` file (recognized by content, not name).
        path: the record set to write.
        keys: for an ``.npz``, the arrays to convert, in this order (default: all).
        **options: the write options and ``shard``/``num_shards``
            (:class:`~torchrecord.convert.ConvertOptions`).

    Raises:
        SourceError: the file is missing, not NumPy, holds object arrays or
            unsupported dtypes, or its arrays disagree in length (naming them).
    """
    target = Target.of(path, options, "from_numpy")
    src = existing(source)
    meta = {"source_format": sniff_numpy(src)}
    if meta["source_format"] == "npy":
        if keys is not None:
            raise SourceError(f"{src}: keys= selects arrays of an .npz archive; a .npy file holds one array")
        array = _open_npy(src)
        length = common_length(src, {"array": array.shape})
        convert = row_converter(src, "array", array.dtype, array.ndim)
        del array
        return write(NpyRows(src, length, convert), target, meta)
    members = _describe_members(src, keys)
    length = common_length(src, {m.key: m.shape for m in members})
    converts = [row_converter(src, m.key, m.dtype, len(m.shape)) for m in members]
    if all(m.stored for m in members):
        return write(NpzRows(src, members, length, converts), target, meta)
    stream = RowStream(length, functools.partial(_stream_npz, src, members, length, converts))
    return write_stream(stream, target, meta)


def _is_npy(probe: Probe) -> bool:
    return probe.head.startswith(_NPY_MAGIC)


def _is_npz(probe: Probe) -> bool:
    return probe.head.startswith(_ZIP_MAGIC)


NPY = Converter("npy", from_numpy, "one array; a sample is a row (first axis), memory-mapped", _is_npy, rank=30)
NPZ = Converter(
    "npz", from_numpy, "{name: row} over its arrays (compressed archives are streamed)", _is_npz, 30, (KEYS,)
)
