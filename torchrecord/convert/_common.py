"""What the converters share: their registry entry's shape, source checks, optional imports, writing."""

from __future__ import annotations

import dataclasses
import itertools
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.extras import install_hint
from torchrecord._store.record_file import RecordFile
from torchrecord._write.settings import WriteSettings
from torchrecord._write.shards import write_shard_source
from torchrecord._write.writer import write_source
from torchrecord.errors import IgnoredOptionWarning, MissingDependencyError, SourceError

__all__ = [
    "Converter",
    "KEYS",
    "Option",
    "Probe",
    "RowStream",
    "common_length",
    "existing",
    "is_hdf5",
    "names",
    "require",
    "row_converter",
    "write",
    "write_stream",
]


@dataclass(frozen=True)
class Probe:
    """What format detection looks at: the source path, whether it is a folder, a file's first 64 KiB."""

    path: str
    is_dir: bool
    head: bytes


@dataclass(frozen=True)
class Option:
    """An option that some converters take besides the write options, with its command-line flag.

    ``default`` means "not given": :func:`~torchrecord.convert.convert` passes
    the option on only when it has another value (so each converter keeps its
    own default), and refuses it for a format whose converter does not take it.
    ``cli`` holds the flag's argparse keywords besides ``help`` and ``dest``.
    """

    name: str
    default: Any
    annotation: str
    flag: str
    help: str
    cli: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Converter:
    """One source format: its converter and what ``convert()`` and ``torchrecord convert`` need to know.

    Attributes:
        name: the format's name (``--format NAME``, ``convert(format=NAME)``).
        function: the converter, ``function(source, path, *, <options>,
            shard=None, num_shards=None, **write_options)``.
        summary: what a source of this format is and what a sample holds, for
            ``torchrecord convert --help``.
        detect: True when a source is of this format (None: only by ``--format``).
        rank: detection asks the converters by rank, lowest first; the first
            that says yes names the format.
        options: its options besides the write options and the sharding.
        parameters: an option's name in ``function``'s signature, where it differs.
        refused: the write options and sharding options that do not apply, with why.
        defaults: a refused option's default where this format has another one
            (robomimic keeps its order: ``shuffle=False`` is what it does).
    """

    name: str
    function: Callable[..., Any]
    summary: str
    detect: Callable[[Probe], bool] | None = None
    rank: int = 50
    options: tuple[Option, ...] = ()
    parameters: Mapping[str, str] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)


_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")


def is_hdf5(probe: Probe) -> bool:
    """An HDF5 file (plain or robomimic): its signature where HDF5 may put it, or an HDF5 suffix."""
    if probe.is_dir:
        return False
    signed = any(probe.head[at : at + 8] == _HDF5_MAGIC for at in (0, 512, 1024, 2048))
    return signed or probe.path.endswith(_HDF5_SUFFIXES)


#: ``keys``: which arrays, columns or obs keys to convert (the formats that take it say which).
KEYS = Option(
    "keys",
    None,
    "Sequence[str] | None",
    "--keys",
    "comma-separated names to convert (npz/hdf5: arrays; hf: columns; robomimic: obs keys); default: every one",
    {"type": lambda text: names(text), "metavar": "NAMES"},
)


def names(text: str) -> list[str]:
    """The names of a comma-separated command-line list (empty items left out)."""
    return [name for name in text.split(",") if name]


def existing(source: str | os.PathLike[str], *, directory: bool = False) -> str:
    """``source`` as a str, after checking it exists and is a directory (or a file)."""
    path = os.fspath(source)
    if not os.path.exists(path):
        raise SourceError(f"{path}: no such file or directory; check the source path")
    if directory and not os.path.isdir(path):
        raise SourceError(f"{path}: not a directory; an image folder is root/<class>/<image>")
    if not directory and os.path.isdir(path):
        raise SourceError(f"{path}: is a directory; expected a file (an image folder needs format 'folder')")
    return path


def require(module: str, extra: str, purpose: str) -> Any:
    """Import an optional dependency, or raise ImportError naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = {"PIL": "Pillow"}.get(module.split(".")[0], module)
        raise MissingDependencyError(f"{purpose} needs {package}: {install_hint(extra)}") from exc


def write(
    dataset: Any,
    path: str | os.PathLike[str],
    source_meta: dict[str, Any],
    settings: WriteSettings,
    shard: int | None = None,
    num_shards: int | None = None,
) -> RecordFile:
    """Write ``dataset`` as write_record does, the converter's description merged under the caller's ``metadata``.

    With ``num_shards``, write shard ``shard`` of a sharded set in the folder
    ``path`` instead, as :func:`torchrecord.write_shard` does.
    """
    settings = dataclasses.replace(settings, metadata={**source_meta, **(settings.metadata or {})})
    settings.check()  # the merged metadata too
    if num_shards is not None or shard is not None:
        return write_shard_source(dataset, path, settings, shard, num_shards)
    return write_source(dataset, os.fsdecode(path), settings)


def write_stream(
    stream: RowStream,
    path: str | os.PathLike[str],
    source_meta: dict[str, Any],
    settings: WriteSettings,
    shard: int | None = None,
    num_shards: int | None = None,
) -> RecordFile:
    """:func:`write` for a :class:`RowStream`: any read error is fatal, whatever ``on_error`` says.

    A stream cannot skip past a read error, so it is written with
    ``on_error="raise"`` (and no ``max_skipped``); ``num_workers`` gives the
    ``IgnoredOptionWarning`` of an iterable source.
    """
    if settings.num_workers > 0:
        warnings.warn(
            f"{os.fsdecode(path)}: num_workers={settings.num_workers} is ignored: the source is read as one "
            "stream in file order (members of a compressed .npz, or chunked HDF5 datasets, cannot be read at "
            "random); save it uncompressed (np.savez) or contiguous to read it in parallel",
            IgnoredOptionWarning,
            stacklevel=3,
        )
    settings = dataclasses.replace(settings, on_error="raise", max_skipped=None, num_workers=0)
    if num_shards is not None and shard is not None:  # a shard writes its own rows: an iterable is one writer's part
        n, i = int(num_shards), int(shard)
        if 0 <= i < n:
            lo, hi = i * stream.length // n, (i + 1) * stream.length // n
            whole = stream
            stream = RowStream(hi - lo, lambda: itertools.islice(whole.open_rows(), lo, hi))
    return write(stream, path, source_meta, settings, shard, num_shards)


class RowStream:
    """An iterable over the rows of a source read in order (no ``__getitem__``).

    write_record treats it as an iterable: with ``shuffle=True`` it spools the
    encoded samples to a temporary file beside the output and copies them out in
    shuffled order, so memory stays bounded. ``open_rows`` is called afresh by
    each iteration. Write it with :func:`write_stream`: a stream cannot skip past a
    read error, so such an error always stops the conversion.
    """

    def __init__(self, length: int, open_rows: Callable[[], Iterator[Any]]) -> None:
        self.length = length
        self.open_rows = open_rows

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Any]:
        return self.open_rows()


def common_length(source: str, shapes: dict[str, tuple[int, ...]]) -> int:
    """The shared first (sample) dimension of the named arrays, or a SourceError saying why not."""
    if not shapes:
        raise SourceError(f"{source}: holds no arrays to convert")
    for name, shape in shapes.items():
        if len(shape) == 0:
            raise SourceError(
                f"{source}: array {name!r} is 0-d and has no sample axis; leave it out with keys=[...] (--keys)"
            )
    lengths = {name: int(shape[0]) for name, shape in shapes.items()}
    if len(set(lengths.values())) > 1:
        raise SourceError(
            f"{source}: the arrays disagree in their first (sample) dimension: {_by_length(lengths)}; every array "
            "needs one row per sample (choose arrays with keys=[...] / --keys)"
        )
    n = next(iter(lengths.values()))
    if n == 0:
        raise SourceError(f"{source}: the arrays have 0 rows; there is nothing to convert")
    return n


def _by_length(lengths: dict[str, int], shown: int = 3) -> str:
    """``'a' has 9 rows (and 4 more arrays), 'b' has 5 rows, ...``: a few arrays per length, a few lengths."""
    names: dict[int, list[str]] = {}
    for name, n in lengths.items():
        names.setdefault(n, []).append(name)
    parts = []
    for n, listed in list(names.items())[:shown]:
        more = f" (and {len(listed) - 1} more arrays)" if len(listed) > 1 else ""
        parts.append(f"{listed[0]!r} has {n} rows{more}")
    if len(names) > shown:
        parts.append(f"{len(names) - shown} more lengths")
    return ", ".join(parts)


def row_converter(source: str, name: str, dtype: np.dtype, ndim: int) -> Callable[[Any], Any]:
    """How to turn row ``i`` of a column into a storable leaf (numeric rows pass as they are).

    Numeric dtypes torchrecord stores pass unchanged; 1-d byte strings become ``bytes``
    and 1-d unicode strings ``str``; anything else is a SourceError naming the array.
    """
    if dtype.kind in "SU" and ndim == 1:
        return bytes if dtype.kind == "S" else str
    try:
        _dtypes.from_numpy(dtype)
    except TypeError:
        strings = " (strings are supported in 1-d arrays only)" if dtype.kind in "SU" else ""
        raise SourceError(
            f"{source}: array {name!r} has dtype {dtype}, which torchrecord cannot store{strings}; "
            "convert it or leave it out with keys=[...] (--keys)"
        ) from None
    return _identity


def _identity(value: Any) -> Any:
    return value
