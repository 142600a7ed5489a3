"""The write options: defined, documented and checked once, before any file is touched or any sample is read.

:class:`WriteOptions` (with its parts :class:`StoreOptions` and
:class:`WriterOptions`) is the one typed, documented list of the options;
:class:`WriteSettings` holds their defaults and checks them. ``write_record``,
``RecordWriter``, ``write_shard`` and the converters take them as
``**options: Unpack[WriteOptions]`` (so a type checker checks every keyword) and
build their settings with :meth:`WriteSettings.of`, which refuses an unknown
keyword as Python would (naming the function, with the nearest option) and an
option that cannot work (a seed or metadata that the metadata cannot hold, a
``max_skipped`` out of range, a malformed ``schema=``) with a ValueError or
TypeError saying what to pass instead, not after the whole source was read.
:func:`spell_out` gives each of them the signature that ``help()`` and
``inspect.signature`` show: every option by name, with its default.
``tests/write/test_settings.py`` checks that the three agree.
"""

from __future__ import annotations

import difflib
import inspect
import numbers
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, TypedDict, TypeVar, get_args

from torchrecord._core import compress as _compress
from torchrecord._core.compression import Codec, Compression  # defined with the codecs' registry
from torchrecord._core.schema import Schema
from torchrecord._store import format as _format
from torchrecord._write.admission import ON_ERROR
from torchrecord._write.declared import Declared
from torchrecord._write.grouping import key_function
from torchrecord.errors import ArgumentError, ArgumentTypeError

__all__ = [
    "Codec",
    "Compression",
    "GroupBy",
    "MAX_SEED",
    "OnError",
    "START_METHODS",
    "SchemaArg",
    "StartMethod",
    "StoreOptions",
    "WriteOptions",
    "WriteSettings",
    "WriterOptions",
    "check_packs",
    "check_storable",
    "spell_out",
    "unexpected",
]

#: ``on_error=``: abort at the first bad sample, or leave bad samples out.
OnError = Literal["raise", "skip"]
#: ``multiprocessing_context=``: the start method of the reader workers.
StartMethod = Literal["fork", "spawn", "forkserver"]
START_METHODS: tuple[str, ...] = get_args(StartMethod)
#: ``group_by=``: a field name or a function of the sample giving a hashable key.
GroupBy = str | Callable[[Any], Any] | None
#: ``schema=``: a Schema, or {field name: shape, dtype name or {"shape": ..., "dtype": ...}}.
SchemaArg = Schema | Mapping[str, Any] | None
#: The largest seed: NumPy takes any non-negative int, the metadata holds 64 bits.
MAX_SEED = 2**64 - 1


class StoreOptions(TypedDict, total=False):
    """How a set is stored: the write options every writer takes (``from_robomimic`` these only).

    Attributes:
        overwrite: replace an existing record set at ``path`` (atomically).
            Without it the write never replaces anything: if another writer
            publishes at ``path`` first, this one raises ``RecordExistsError``.
            Default False.
        progress: show a tqdm bar (if tqdm is installed); None (the default)
            shows it only on a terminal.
        metadata: user metadata stored with the record set (None, bool, int,
            float, str, bytes, lists and dicts with str keys; checked at once);
            a converter stores it beside its own keys. Default None.
        checksums: store a CRC-32 per record (checked by ``verify``). Default True.
        samples_per_record: store this many consecutive samples per LMDB value
            (chunked records, stacked along a new first axis) to cut per-record
            overhead for small samples; needs fixed shapes. None (the default)
            chooses it from the first sample: when every field has a fixed shape,
            as many samples as make a record fill its LMDB pages (the file comes
            within about 1.1x of the payload bytes; ``RecordFile.samples_per_record``
            says what was chosen), else 1. If a later sample then changes a
            field's shape, the write goes back to one sample per record.
        initial_map_size: starting LMDB map size; it grows on its own. Default 256 MiB.
        commit_bytes: bytes per LMDB transaction (bounded memory for retries).
            Default 64 MiB.
        compression: compress numeric fields: ``"zstd"`` or ``"lz4"`` (every
            numeric field), or a dict of field name -> codec or None. A field
            whose first records do not shrink below 0.9 of their size is left
            alone (``metadata["compression"]`` says what was applied, with the
            ratio). Needs cramjam (the ``compress`` extra); a set with compressed
            fields has format version 2, which older torchrecord refuses with a
            VersionError. Strings are never compressed. Default None.
        compression_level: the codec's level: zstd -7..22 (default 3), LZ4
            1..12 (high-compression mode; default: LZ4's fast mode).
    """

    overwrite: bool
    progress: bool | None
    metadata: dict[str, Any] | None
    checksums: bool
    samples_per_record: int | None
    initial_map_size: int
    commit_bytes: int
    compression: Compression
    compression_level: int | None


class WriterOptions(StoreOptions, total=False):
    """The write options of :class:`~torchrecord.RecordWriter`: how a set is stored, ordered and admitted.

    Attributes:
        shuffle: pre-shuffle with a permutation seeded by ``seed`` (of whole
            groups with ``group_by``); False keeps the source order. Default True.
        seed: the shuffle seed (an int from 0 to 2**64-1), recorded in the
            metadata. Default 0.
        on_error: ``"raise"`` (the default) aborts on the first sample the
            source fails to give (or that cannot be stored, or does not fit the
            schema), naming its index; ``"skip"`` leaves such samples out and
            records them (``RecordFile.write_summary``, and the metadata:
            ``skipped`` and the first 1,000 ``skipped_samples``). A write that
            keeps no sample at all is a ``SourceError``.
        max_skipped: with ``on_error="skip"``, the most samples that may be left
            out: a count (int) or a fraction of the source (float in (0, 1)).
            More is a ``SourceError`` naming the first failures, and nothing is
            written. None (the default): no bound.
        group_by: write a grouped set: a field name (as in the schema, e.g.
            ``"episode"`` for a dict key) or a function of the sample giving a
            hashable key. The samples of one group must come one after another
            (a key that comes back later is a ``SourceError``); the pre-shuffle
            permutes whole groups and keeps the order inside each. The source is
            then read in its own order (map-style ones too, still with
            ``num_workers``; a function must pickle for spawn workers) and, when
            shuffling, spooled to a temporary file. ``RecordFile.groups`` gives
            the group offsets. Default None.
        schema: state fields up front: a :class:`~torchrecord.Schema` (e.g.
            another set's ``RecordFile.schema``: the set gets exactly that
            schema), or a dict of field name -> shape (``(3, None, None)``:
            ``None`` where the size may vary), dtype name, or ``{"shape": ...,
            "dtype": ...}``. A sample that breaks it is a ``SchemaError``. A
            dtype is checked, not converted to: ``{"ids": "int32"}`` refuses a
            list of Python ints (stored as int64); convert in the source
            (``numpy.asarray(ids, dtype="int32")``). Without it (the default), a
            field whose shape changes gives a ``VariableShapeWarning`` and is
            listed in ``write_summary.variable_fields``.
    """

    shuffle: bool
    seed: int
    on_error: OnError
    max_skipped: int | float | None
    group_by: GroupBy
    schema: SchemaArg


class WriteOptions(WriterOptions, total=False):
    """Every write option of ``write_record``, ``write_shard`` and the converters (the reference).

    Besides those of :class:`WriterOptions` and :class:`StoreOptions`, the
    options of reading a source:

    Attributes:
        num_workers: read a map-style source with this many DataLoader worker
            processes (useful when reading a sample is slow, e.g. image
            decoding). An iterable is read in this process: ``num_workers`` then
            gives an ``IgnoredOptionWarning`` (pass a ``DataLoader`` over it as
            the source to read it in parallel). Default 0.
        multiprocessing_context: start method of the reader workers:
            ``"fork"``, ``"spawn"`` or ``"forkserver"``; None (the default): the
            platform's default.
    """

    num_workers: int
    multiprocessing_context: StartMethod | None


_INT_RANGE = (-(2**63), 2**64 - 1)  # what msgpack stores
_MAX_NESTING = 64


@dataclass(frozen=True)
class WriteSettings:
    """Every write option with its default, checked (each is described in :class:`WriteOptions`)."""

    shuffle: bool = True
    seed: int = 0
    num_workers: int = 0
    overwrite: bool = False
    progress: bool | None = None
    metadata: dict[str, Any] | None = None
    on_error: OnError = "raise"
    max_skipped: int | float | None = None
    checksums: bool = True
    samples_per_record: int | None = None
    group_by: GroupBy = None
    schema: SchemaArg = None
    initial_map_size: int = 1 << 28
    commit_bytes: int = 64 << 20
    multiprocessing_context: StartMethod | None = None
    compression: Compression = None
    compression_level: int | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any], caller: str, taken: type = WriteOptions) -> WriteSettings:
        """The checked settings from the keyword ``options`` that ``caller`` was given.

        ``taken`` is the options' TypedDict that ``caller`` takes; any other
        keyword is an ``ArgumentTypeError`` (a TypeError) naming ``caller`` and
        the nearest option, as Python names an unexpected keyword. An option
        ``options`` lacks keeps its default.
        """
        names = [f.name for f in fields(cls) if f.name in taken.__annotations__]
        for name in options:
            if name not in names:
                raise ArgumentTypeError(unexpected(caller, name, taken.__annotations__))
        settings = cls(**options)
        settings.check()
        return settings

    def check(self) -> Declared | None:
        """ValueError / TypeError for an option that cannot work; returns the parsed ``schema``."""
        if self.on_error not in ON_ERROR:
            raise ArgumentError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        workers = self.num_workers
        if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or workers < 0:
            raise ArgumentError(f"num_workers must be an int >= 0, got {workers!r}")
        context = self.multiprocessing_context
        if context is not None and context not in START_METHODS:
            raise ArgumentError(
                f"multiprocessing_context must be one of {START_METHODS} or None (the default start method), "
                f"got {context!r}"
            )
        k = self.samples_per_record
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral)):
            raise ArgumentTypeError(f"samples_per_record must be an int >= 1 or None (automatic), got {k!r}")
        if k is not None and k < 1:
            raise ArgumentError(f"samples_per_record must be >= 1 (or None: automatic), got {k}")
        _compress.parse_option(self.compression, self.compression_level)
        if k is not None and k > _format.MAX_SAMPLES_PER_RECORD:
            raise ArgumentError(f"samples_per_record must be from 1 to {_format.MAX_SAMPLES_PER_RECORD}, got {k}")
        _check_seed(self.seed)
        if self.metadata is not None and not isinstance(self.metadata, dict):
            raise ArgumentTypeError("metadata must be a dict of msgpack-able values")
        if self.metadata is not None:
            check_storable(self.metadata, "metadata")
            check_packs({"user": self.metadata, "seed": int(self.seed)}, "metadata")
        _check_max_skipped(self.max_skipped, self.on_error)
        if self.group_by is not None:
            key_function(self.group_by)  # raises for anything but a field name or a function
        return Declared.parse(self.schema)


def unexpected(caller: str, name: str, names: Iterable[str]) -> str:
    """Python's message for an unexpected keyword, with the nearest of ``names`` when one is near."""
    if name in WriteOptions.__annotations__:
        return f"{caller}() got an unexpected keyword argument {name!r} (a write option it does not take)"
    near = difflib.get_close_matches(name, list(names), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return f"{caller}() got an unexpected keyword argument {name!r}{hint}"


def _option_names(taken: type) -> list[str]:
    """The keys of ``taken``, a TypedDict of write options (perhaps with more keys, first), in a fixed order."""
    keys = taken.__annotations__
    settings = [f.name for f in fields(WriteSettings)]
    return [k for k in keys if k not in settings] + [name for name in settings if name in keys]


_Function = TypeVar("_Function", bound=Callable[..., Any])


def spell_out(taken: type) -> Callable[[_Function], _Function]:
    """Publish ``function``'s ``**options`` as the keywords of ``taken``, each with its default.

    A key of ``taken`` that is no write option (a converter's ``shard``) has the
    default None. The function keeps its ``**options: Unpack[taken]`` (what a type checker
    reads); ``help()``, ``inspect.signature`` and editors that ask the running
    interpreter see every option by name, type and default instead.
    """
    hints = typing.get_type_hints(taken)
    defaults = WriteSettings()
    spelled = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=getattr(defaults, name, None), annotation=hints[name]
        )
        for name in _option_names(taken)
    ]

    def publish(function: _Function) -> _Function:
        signature = inspect.signature(function)
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        function.__signature__ = signature.replace(parameters=own + spelled)  # type: ignore[attr-defined]
        return function

    return publish


def _check_seed(seed: Any) -> None:
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise ArgumentTypeError(f"seed must be an int from 0 to 2**64-1, got {type(seed).__name__} {seed!r}")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ArgumentError(f"seed must be an int from 0 to 2**64-1 (the metadata stores 64 bits), got {seed}")


def _check_max_skipped(value: Any, on_error: str) -> None:
    if value is None:
        return
    if on_error != "skip":
        raise ArgumentError(f"max_skipped={value!r} bounds on_error='skip'; pass on_error='skip' with it")
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, float)):
        raise ArgumentTypeError(
            f"max_skipped must be a count (int >= 0) or a fraction (float between 0 and 1), got {value!r}"
        )
    if isinstance(value, numbers.Integral) and value < 0:
        raise ArgumentError(f"max_skipped must be a count >= 0 or a fraction between 0 and 1, got {value}")
    if isinstance(value, float) and not 0.0 < value < 1.0:
        raise ArgumentError(
            f"max_skipped as a fraction must be between 0 and 1 (exclusive), got {value}; pass an int for a count"
        )


def check_storable(value: Any, where: str, depth: int = 0) -> None:
    """Raise ValueError / TypeError naming the first part of ``value`` the metadata cannot hold.

    The metadata is msgpack: None, bool, int (-2**63 .. 2**64-1), float, str,
    bytes, lists/tuples and dicts with str keys (``where``: ``"metadata"``).
    """
    if depth > _MAX_NESTING:
        raise ArgumentError(f"{where}: nested deeper than {_MAX_NESTING} levels; flatten the metadata")
    if value is None or isinstance(value, (bool, float, bytes, bytearray)):
        return
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ArgumentError(f"{where}: the str cannot be encoded as UTF-8 ({exc})") from None
        return
    if isinstance(value, int):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise ArgumentError(
                f"{where}: the int {value} does not fit the metadata's 64 bits (-2**63 .. 2**64-1); "
                "store it as a str (str(n))"
            )
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_storable(item, f"{where}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, bytes)):
                raise ArgumentTypeError(
                    f"{where}: key {key!r} ({type(key).__name__}) is not a str; metadata keys must be str"
                )
            check_storable(item, f"{where}[{key!r}]", depth + 1)
        return
    raise ArgumentTypeError(
        f"{where}: a {type(value).__name__} cannot be stored in the metadata; use None, bool, int, float, "
        "str, bytes, and lists and dicts (str keys) of these (NumPy scalars: .item())"
    )


def check_packs(meta: dict[str, Any], where: str) -> None:
    """The last word: msgpack itself packs ``meta`` within the size readers accept (ValueError otherwise)."""
    try:
        packed = _format.pack_metadata(meta)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ArgumentError(f"{where} cannot be stored: {type(exc).__name__}: {exc}") from None
    try:
        _format.check_metadata_size(packed, _containers(meta))
    except ValueError as exc:
        raise ArgumentError(f"{where}: {exc}") from None


def _containers(value: Any) -> int:
    """Maps and lists in ``value`` (nesting is bounded by :func:`check_storable`)."""
    if isinstance(value, dict):
        return 1 + sum(_containers(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return 1 + sum(_containers(v) for v in value)
    return 0
