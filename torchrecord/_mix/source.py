"""What a weighted mix reads from: a small source interface, and the one for a record set on disk.

A :class:`Source` answers three calls:

* :meth:`Source.describe` (cheap, any process): how many samples, the schema,
  the set's identity, samples per record, and an estimate of stored bytes per
  sample (for the read-ahead budget);
* :meth:`Source.open` (in a read-ahead thread): whatever makes the first read
  fast (open a file, connect, fetch an index). It may be slow; the mixer opens
  every source at once;
* :meth:`Source.read`: the samples of some runs of sample indices, in that
  order, as a :class:`Chunk`: typed columns (fixed-layout sets: the stored bytes
  at fixed offsets, nothing decoded), stored record values (decoded only after
  the mix by :meth:`Source.decode`), or decoded samples (chunked generic sets,
  whose records hold several samples).

A source is used by one read-ahead thread at a time, pickles into DataLoader
workers, and never holds an LMDB handle across ``fork()``. :class:`FileSource`
wraps a :class:`~torchrecord.RecordSet` (one file or a sharded set, opened with
:func:`~torchrecord.open_set`) and reads through the cursor walk
(``torchrecord._store.walk``) and the share reader; a test or a
benchmark wraps one to throttle or gate its reads, and a remote store could
implement the same four methods.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrecord._core.layout import FixedLayout
from torchrecord._core.schema import Field, Schema
from torchrecord._order.share import Share
from torchrecord._read.reader import ShareReader, split_runs
from torchrecord._shards.open import SetLike, open_set
from torchrecord._store.checked import Check, checks_crc, parse_check
from torchrecord._store.forkgate import lmdb_calls
from torchrecord._store.record_file import shard_file
from torchrecord._store.record_set import RecordSet
from torchrecord._store.walk import Walk, record_runs
from torchrecord.errors import ArgumentError, SchemaError, VariableShapeWarning

__all__ = ["Chunk", "FileSource", "Source", "SourceInfo", "shared_schema"]

Run = tuple[int, int]

#: LMDB refuses to open one file twice in a process: threads open environments one at a time.
_OPEN_LOCK = threading.Lock()


def _new_lock_after_fork() -> None:
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()  # a thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_new_lock_after_fork)


@dataclass(frozen=True)
class SourceInfo:
    """A source as the plan sees it.

    Attributes:
        name: how errors and statistics name it (a path).
        count: samples.
        schema: the field schema.
        set_id: the identity of the data (a record set's ``set_id``).
        samples_per_record: samples stored per record (reads are whole records).
        bytes_per_sample: estimated stored bytes per sample (for the read-ahead budget).
    """

    name: str
    count: int
    schema: Schema
    set_id: str
    samples_per_record: int
    bytes_per_sample: int


@dataclass
class Chunk:
    """Samples read from one source, in the order asked for: exactly one of three forms.

    Attributes:
        n: samples.
        columns: typed column arrays [n, ...], one per schema field (fixed layout).
        values: one stored record value per sample, decoded after the mix.
        records: the record index of each value (for error messages).
        samples: decoded samples (chunked generic sets).
        nbytes: bytes held.
    """

    n: int
    columns: list[np.ndarray] | None = None
    values: list[Any] | None = None
    records: list[int] | None = None
    samples: list[Any] | None = None
    nbytes: int = 0

    def split(self, lengths: Sequence[int]) -> list[Chunk]:
        """Consecutive pieces of ``lengths`` samples (views, no copies)."""
        out: list[Chunk] = []
        a = 0
        for n in lengths:
            b = a + int(n)
            share = self.nbytes * (b - a) // max(1, self.n)
            if self.columns is not None:
                out.append(Chunk(b - a, columns=[c[a:b] for c in self.columns], nbytes=share))
            elif self.values is not None:
                assert self.records is not None
                out.append(Chunk(b - a, values=self.values[a:b], records=self.records[a:b], nbytes=share))
            else:
                assert self.samples is not None
                out.append(Chunk(b - a, samples=self.samples[a:b], nbytes=share))
            a = b
        return out


class Source:
    """The interface the mixer reads through (see the module docstring). Subclass to wrap or implement one."""

    def describe(self) -> SourceInfo:
        """Count, schema, identity and sizes (cheap; called in the main process)."""
        raise NotImplementedError  # the interface: a subclass implements it

    def open(self) -> None:
        """Prepare for reading (called once per iteration in a read-ahead thread; may be slow)."""

    def read(self, runs: Sequence[Run], columns: bool) -> Chunk:
        """The samples of ``runs`` (sample indices [start, stop)), in order.

        ``columns``: the mix has a fixed layout; return typed columns. Otherwise
        return stored values (one sample per record) or decoded samples.
        """
        raise NotImplementedError  # the interface: a subclass implements it

    def decode(self, value: Any, record: int) -> Any:
        """One stored value (from a ``values`` chunk) as the sample it holds."""
        raise NotImplementedError  # the interface: a subclass implements it

    def close(self) -> None:
        """Let go of open handles (reading may open them again)."""


class FileSource(Source):
    """A record set on disk (one file or a sharded set), read through the cursor walk.

    Args:
        file: a path (a file, or a sharded set's folder, manifest or URL) or a
            :class:`~torchrecord.RecordSet`.
        check: integrity on read (see :class:`~torchrecord.RecordFile`): ``"checksums"`` checks every
            record's CRC-32 as it is read, ``"structure"`` the file's LMDB page structure
            first, ``"full"`` both.
    """

    def __init__(self, file: SetLike, *, check: Check | None = None) -> None:
        check = parse_check(check)
        self.file: RecordSet = open_set(file, check=check)
        self.verify = checks_crc(check)
        self._info: SourceInfo | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"file": self.file, "verify": self.verify}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["file"], check="checksums" if state["verify"] else None)  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"FileSource({self.file.path!r})"

    def describe(self) -> SourceInfo:
        if self._info is None:
            f = self.file
            layout = self.layout()
            if layout is not None:
                per_sample = max(1, layout.length // layout.rows)
            else:
                per_sample = max(1, f.size_bytes // max(1, len(f)))
            self._info = SourceInfo(f.path, len(f), f.schema, f.set_id, f.samples_per_record, per_sample)
        return self._info

    def layout(self) -> FixedLayout | None:
        """The set's fixed layout, or None when its schema is not fixed."""
        return self.file.fixed_layout()

    def open(self) -> None:
        with _OPEN_LOCK, lmdb_calls():
            if self.file.num_shards == 1:  # one file: open it now; a sharded set opens each shard as it reads it
                shard_file(self.file, 0).environment()
            else:
                self.file.read_header()

    def read(self, runs: Sequence[Run], columns: bool) -> Chunk:
        with lmdb_calls():  # read-ahead threads call this: a fork waits for the read to end
            return self._read(runs, columns)

    def _read(self, runs: Sequence[Run], columns: bool) -> Chunk:
        runs = [(a, b) for a, b in runs if b > a]
        n = sum(b - a for a, b in runs)
        file = self.file
        if columns:
            layout = self.layout()
            if layout is None:
                raise ArgumentError(f"{file.path}: the set's schema is not fixed; it cannot be read as columns")
            share = Share.in_order(tuple(runs))
            # no read-ahead hints: their thread would be joined inside this read, which a fork waits for
            reader = ShareReader(file, share, layout=layout, verify=self.verify, advise=False)
            typed = next(reader.chunks(max(1, n)), None)
            if typed is None:
                return Chunk(0, columns=[np.zeros((0, *(d or 0 for d in f.shape))) for f in layout.fields])
            return Chunk(n, columns=typed, nbytes=sum(int(c.nbytes) for c in typed))
        if file.samples_per_record > 1:
            share = Share.in_order(tuple(runs))
            reader = ShareReader(file, share, layout=None, verify=self.verify, advise=False)
            samples = list(next(reader.chunks(max(1, n)), []))
            return Chunk(n, samples=samples, nbytes=n * self.describe().bytes_per_sample)
        values: list[Any] = []
        records: list[int] = []  # over all shards: decode() finds each one's shard
        offsets = file.shard_offsets
        for s, start, stop in split_runs(runs, offsets):
            shard = shard_file(file, s)
            env, db = shard.environment()
            base = int(offsets[s])
            crc_db = shard.crc_db if self.verify else None
            blocks = shard.crc_blocks() if crc_db is not None else None
            with Walk(env, db, shard.path, crc_db=crc_db, crc_blocks=blocks) as walk:
                for first, got in walk.pieces(record_runs([(start, stop)], 1)):
                    values.extend(got)
                    records.extend(range(base + first, base + first + len(got)))
        return Chunk(n, values=values, records=records, nbytes=sum(len(v) for v in values))

    def decode(self, value: Any, record: int) -> Any:
        return self.file.decode(value, record)

    def close(self) -> None:
        self.file.close()


def shared_schema(infos: Sequence[SourceInfo], names: Sequence[str] | None = None) -> tuple[Schema, bool]:
    """The schema every source shares (sizes that differ become variable), and whether it is fixed.

    A field whose shape differs between sources gives a :class:`VariableShapeWarning`
    naming the field and each source's shape (``names``: how to call the sources,
    default their paths). Raises SchemaError naming both files and the field where
    two sources differ in kind, dtype or rank.
    """
    names = list(names) if names is not None else [info.name for info in infos]
    first = infos[0]
    fields = list(first.schema.fields)
    for info in infos[1:]:
        if info.schema.tree != first.schema.tree or len(info.schema.fields) != len(fields):
            raise SchemaError(
                f"{info.name}: fields ({', '.join(info.schema.names)}) differ from {first.name}'s "
                f"({', '.join(first.schema.names)}); every source of a mix must have the same fields"
            )
        for i, (a, b) in enumerate(zip(fields, info.schema.fields)):
            if (a.kind, a.dtype, len(a.shape)) != (b.kind, b.dtype, len(b.shape)):
                raise SchemaError(
                    f"{info.name}, field {b.name!r}: {b.kind} of {b.dtype} with shape {list(b.shape)} differs from "
                    f"{first.name}'s {a.kind} of {a.dtype} with shape {list(a.shape)}; convert one of them"
                )
            if a.shape != b.shape:
                shape = tuple(x if x == y else None for x, y in zip(a.shape, b.shape))
                fields[i] = Field(a.name, a.kind, a.dtype, shape)
    for i, field in enumerate(fields):
        shapes = [info.schema.fields[i].shape for info in infos]
        if len(set(shapes)) > 1:
            _warn_mixed_shapes(field, names, shapes)
    schema = Schema(first.schema.tree, fields)
    return schema, bool(fields) and schema.is_fixed and all(i.schema.is_fixed for i in infos)


def _warn_mixed_shapes(field: Field, names: Sequence[str], shapes: Sequence[tuple[int | None, ...]]) -> None:
    def dims(shape: tuple[int | None, ...]) -> str:
        return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"

    each = ", ".join(f"{name} {dims(shape)}" for name, shape in zip(names, shapes))
    warnings.warn(
        f"MixedDataset, field {field.name!r}: the sources' shapes differ ({each}); the mix reads it with the "
        f"variable shape {dims(field.shape)}, so batch mode gives a list for it instead of one tensor, and a "
        "DataLoader batching single samples (per-sample mode) fails in torch.stack at the first batch that mixes "
        "two shapes. Make the shapes agree (rewrite a source, or pad or crop the field in transform=), or give "
        "a collate_fn that accepts them",
        VariableShapeWarning,
        stacklevel=5,
    )
