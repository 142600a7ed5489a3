"""What the converters share: their registry entry's shape, source checks, optional imports, writing."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchrecord._core.extras import install_hint
from torchrecord._store.record_file import RecordFile
from torchrecord._write.settings import WriteOptions, WriteSettings, unexpected
from torchrecord._write.shards import write_shard_source
from torchrecord._write.writer import write_source
from torchrecord.errors import ArgumentTypeError, MissingDependencyError, SourceError

__all__ = [
    "ConvertOptions",
    "Converter",
    "KEYS",
    "Names",
    "Option",
    "PathArg",
    "Probe",
    "Target",
    "existing",
    "is_hdf5",
    "names",
    "require",
    "write",
]


#: A source or target path as the converters take it.
PathArg = str | os.PathLike[str]
#: ``keys=``: the arrays, columns or obs keys to convert (None: every one).
Names = Sequence[str] | None


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


def names(text: str) -> list[str]:
    """The names of a comma-separated command-line list (empty items left out)."""
    return [name for name in text.split(",") if name]


#: ``keys``: which arrays, columns or obs keys to convert (the formats that take it say which).
KEYS = Option(
    "keys",
    None,
    "Sequence[str] | None",
    "--keys",
    "comma-separated names to convert (npz/hdf5: arrays; hf: columns; robomimic: obs keys); default: every one",
    {"type": names, "metavar": "NAMES"},
)


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


class ConvertOptions(WriteOptions, total=False):
    """The options every converter takes: the write options, and which shard of a sharded set to write.

    Attributes:
        shard: with ``num_shards``: write shard ``shard`` of a sharded set in
            the folder ``path``, as :func:`torchrecord.write_shard` does. Default None.
        num_shards: the number of shards of that set; None (the default): a
            single record set at ``path``.
    """

    shard: int | None
    num_shards: int | None


@dataclass(frozen=True)
class Target:
    """Where and how a converter writes: the path, the checked write settings, and which shard (if any)."""

    path: str | os.PathLike[str]
    settings: WriteSettings
    shard: int | None = None
    num_shards: int | None = None

    @classmethod
    def of(cls, path: str | os.PathLike[str], options: Mapping[str, Any], caller: str) -> Target:
        """The target of ``caller(source, path, **options)``, its options checked before the source is opened."""
        rest = dict(options)
        shard, num_shards = rest.pop("shard", None), rest.pop("num_shards", None)
        for name in rest:
            if name not in WriteOptions.__annotations__:
                raise ArgumentTypeError(unexpected(caller, name, ConvertOptions.__annotations__))
        return cls(path, WriteSettings.of(rest, caller), shard, num_shards)

    def at(self, path: str | os.PathLike[str]) -> Target:
        """The same write to another path (one split of a dataset dict)."""
        return dataclasses.replace(self, path=path)


def write(dataset: Any, target: Target, source_meta: dict[str, Any]) -> RecordFile:
    """Write ``dataset`` as write_record does, the converter's description merged under the caller's ``metadata``.

    With ``num_shards``, write shard ``shard`` of a sharded set in the folder
    ``path`` instead, as :func:`torchrecord.write_shard` does.
    """
    settings = target.settings
    settings = dataclasses.replace(settings, metadata={**source_meta, **(settings.metadata or {})})
    settings.check()  # the merged metadata too
    if target.num_shards is not None or target.shard is not None:
        return write_shard_source(dataset, target.path, settings, target.shard, target.num_shards)
    return write_source(dataset, os.fsdecode(target.path), settings)
