"""The options of one write, defined once and checked before any file is touched or any sample is read.

:class:`WriteSettings` is the one definition of the write options and their
defaults. ``write_record``, ``RecordWriter``, ``write_shard`` and the converters
spell the options out in their signatures (so ``help()`` shows them) and build
their settings with :meth:`WriteSettings.of` from their arguments, which checks
them: an option that cannot work (a seed or metadata that the metadata cannot
hold, a ``max_skipped`` out of range, a malformed ``schema=``) fails at once
with a ValueError or TypeError saying what to pass instead, not after the whole
source was read. ``tests/write/test_settings.py`` checks that every signature's
defaults agree with the ones here.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from torchrecord._core import compress as _compress
from torchrecord._core.compression import Codec, Compression  # defined with the codecs' registry
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
    "StartMethod",
    "WriteSettings",
    "check_packs",
    "check_storable",
]

#: ``on_error=``: abort at the first bad sample, or leave bad samples out.
OnError = Literal["raise", "skip"]
#: ``multiprocessing_context=``: the start method of the reader workers.
StartMethod = Literal["fork", "spawn", "forkserver"]
START_METHODS: tuple[str, ...] = get_args(StartMethod)
#: ``group_by=``: a field name or a function of the sample giving a hashable key.
GroupBy = str | Callable[[Any], Any] | None
#: The largest seed: NumPy takes any non-negative int, the metadata holds 64 bits.
MAX_SEED = 2**64 - 1

_INT_RANGE = (-(2**63), 2**64 - 1)  # what msgpack stores
_MAX_NESTING = 64


@dataclass(frozen=True)
class WriteSettings:
    """Every option of a write with its default: the one definition (see ``write_record`` for each).

    ``num_workers`` and ``multiprocessing_context`` concern reading a source
    (``RecordWriter`` has none); ``overwrite`` is the target's.
    """

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
    schema: Any = None
    initial_map_size: int = 1 << 28
    commit_bytes: int = 64 << 20
    multiprocessing_context: StartMethod | None = None
    compression: Compression = None
    compression_level: int | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> WriteSettings:
        """The checked settings from ``options`` (e.g. a public function's ``locals()``).

        Takes the keys that name an option and leaves the others (a converter's
        ``source``, ``keys``...); an option ``options`` lacks keeps its default.
        """
        settings = cls(**{f.name: options[f.name] for f in fields(cls) if f.name in options})
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
