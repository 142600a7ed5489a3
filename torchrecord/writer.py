"""write_record: read any dataset, pre-shuffle it, and publish it as one LMDB file.

Nothing appears at the target path until the write is complete: records go to a
hidden temporary file beside it, which is renamed over the path at the end.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
from collections.abc import Iterator
from typing import Any

import lmdb
import numpy as np

from torchrecord import _format
from torchrecord._codec import decode_leaves, encode_payloads
from torchrecord._lmdb_writer import LmdbAppender
from torchrecord._sources import Encoded, Failed, Normalized, Outcome, is_map_style, iterate_source, read_in_order
from torchrecord._version import __version__
from torchrecord.errors import RecordExistsError, SchemaError, SourceError, TorchRecordError, WriteError
from torchrecord.record_file import RecordFile
from torchrecord.schema import LeafSignature, Schema

__all__ = ["write_record"]

_ON_ERROR = ("raise", "skip")


def write_record(
    dataset: Any,
    path: str | os.PathLike[str],
    *,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    overwrite: bool = False,
    progress: bool | None = None,
    metadata: dict[str, Any] | None = None,
    on_error: str = "raise",
    checksums: bool = True,
    samples_per_record: int = 1,
    initial_map_size: int = 1 << 28,
    commit_bytes: int = 64 << 20,
    multiprocessing_context: str | None = None,
) -> RecordFile:
    """Write every sample of ``dataset`` to a record set at ``path``.

    Args:
        dataset: a map-style dataset (``__len__`` and ``__getitem__``) or any
            iterable. Samples are tensors, NumPy arrays, Python scalars, bytes or
            str, or tuples/lists/dicts (str keys) of these, nested.
        path: the record set to create: a single file.
        shuffle: pre-shuffle with a permutation seeded by ``seed``; ``False``
            keeps the source order.
        seed: the shuffle seed, recorded in the metadata.
        num_workers: read a map-style source with this many DataLoader worker
            processes (useful when reading a sample is slow, e.g. image decoding).
        overwrite: replace an existing record set at ``path`` (atomically).
        progress: show a tqdm bar (if tqdm is installed); ``None`` shows it only
            on a terminal.
        metadata: user metadata stored with the record set (msgpack-able values).
        on_error: ``"raise"`` aborts on the first sample the source fails to give,
            naming its index; ``"skip"`` leaves such samples out and counts them in
            the metadata (``skipped``).
        checksums: store a CRC-32 per record (checked by ``verify``).
        samples_per_record: store this many consecutive samples per LMDB value
            (chunked records, stacked along a new first axis) to cut per-record
            overhead for tiny samples; needs fixed shapes. Readers mix samples
            across chunks as usual.
        initial_map_size: starting LMDB map size; it grows on its own.
        commit_bytes: bytes per LMDB transaction (bounded memory for retries).
        multiprocessing_context: start method of the reader workers.

    Returns:
        A :class:`RecordFile` for the new record set.

    Raises:
        RecordExistsError: ``path`` exists and ``overwrite`` is false.
        SourceError: the source raised at a sample (``on_error="raise"``).
        SchemaError: a sample's structure or dtype differs from the first one's.
        WriteError: the write failed (disk full, ...); nothing is left at ``path``.
    """
    target = os.fspath(path)
    if on_error not in _ON_ERROR:
        raise ValueError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
    if samples_per_record < 1:
        raise ValueError(f"samples_per_record must be >= 1, got {samples_per_record}")
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError("metadata must be a dict of msgpack-able values")
    if os.path.lexists(target) and (not overwrite or os.path.isdir(target)):
        what = "a directory" if os.path.isdir(target) else "a file"
        hint = "remove it first" if overwrite else "pass overwrite=True to replace it"
        raise RecordExistsError(f"{target}: {what} exists already; {hint}")
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise WriteError(f"{target}: parent directory {parent} does not exist")
    _remove_stale_temporaries(target)
    temp = _temporary_path(target)
    job = _WriteJob(target, temp, on_error, checksums, initial_map_size, commit_bytes, samples_per_record)
    try:
        job.run(dataset, shuffle, seed, num_workers, progress, multiprocessing_context)
        meta = job.metadata(shuffle, seed, metadata or {})
        job.appender.finish(_format.pack_metadata(meta))
        job.appender.close()
        _remove(temp + "-lock")
        os.replace(temp, target)
        _fsync_dir(parent)
    except BaseException as exc:
        job.abort()
        if isinstance(exc, lmdb.Error):
            raise WriteError(f"{target}: LMDB error while writing: {exc}") from exc
        if isinstance(exc, OSError) and not isinstance(exc, TorchRecordError):
            raise WriteError(f"{target}: write failed: {exc}") from exc
        raise
    return RecordFile(target)


class _WriteJob:
    """The state of one write: temp files, appender, schema and counters."""

    def __init__(
        self,
        target: str,
        temp: str,
        on_error: str,
        checksums: bool,
        initial_map_size: int,
        commit_bytes: int,
        samples_per_record: int,
    ) -> None:
        self.target = target
        self.temp = temp
        self.spool = temp + ".spool"
        self.on_error = on_error
        self.schema: Schema | None = None
        self.skipped = 0
        self.count = 0
        self._map_size = initial_map_size
        self._commit_bytes = commit_bytes
        self.appender = LmdbAppender(
            temp,
            initial_map_size=initial_map_size,
            commit_bytes=commit_bytes,
            checksums=checksums,
            name=target,
        )
        self.chunk = samples_per_record
        self._group: list[Normalized] = []

    def run(
        self, dataset: Any, shuffle: bool, seed: int, num_workers: int, progress: bool | None, ctx: str | None
    ) -> None:
        if is_map_style(dataset):
            n = len(dataset)
            order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
            stream = read_in_order(dataset, order, num_workers, ctx, fast=self.chunk == 1)
            self._append_all(stream, n, progress)
        elif not shuffle:
            self._append_all(iterate_source(dataset, fast=self.chunk == 1), None, progress)
        else:
            self._spool_then_shuffle(dataset, seed, progress)

    def _checked(self, stream: Iterator[tuple[int, Outcome] | Encoded]) -> Iterator[bytes | Normalized | Encoded]:
        """Merge every sample into the schema; raise or skip the failed ones.

        Finished record bytes come from the fast encoder, which only accepts
        samples identical in structure, dtypes and shapes to the first one, so
        they leave the schema as it is.
        """
        for item in stream:
            if isinstance(item, Encoded):
                yield item
                continue
            index, outcome = item
            if isinstance(outcome, bytes):
                yield outcome
                continue
            if isinstance(outcome, Failed):
                if outcome.fatal:
                    raise SourceError(
                        f"{self.target}: the source generator raised at sample {index}: {outcome.message}\n"
                        "(a generator cannot go on after raising, so the sample cannot be skipped)\n"
                        f"{outcome.detail}"
                    )
                if self.on_error == "skip":
                    self.skipped += 1
                    continue
                raise SourceError(
                    f"{self.target}: the source failed at sample {index}: {outcome.message}\n"
                    f"(pass on_error='skip' to leave bad samples out)\n{outcome.detail}"
                )
            if self.schema is None:
                self.schema = Schema.from_first(outcome.tree, outcome.signatures)
            else:
                self.schema.merge(outcome.tree, outcome.signatures, f"{self.target}: sample {index}")
                if self.chunk > 1:
                    self._require_fixed(index)
            yield outcome

    def _require_fixed(self, index: int) -> None:
        assert self.schema is not None
        for fld in self.schema.fields:
            if fld.is_numeric and not fld.is_fixed:
                raise SchemaError(
                    f"{self.target}: sample {index}, field {fld.name!r}: its shape differs from earlier "
                    f"samples'; chunked records (samples_per_record={self.chunk}) need fixed shapes, "
                    "use samples_per_record=1 for variable shapes"
                )

    def _add(self, sample: bytes | Normalized) -> None:
        """Encode one sample (or, in chunked mode, a full group of them) and append it."""
        self.count += 1
        if isinstance(sample, bytes):
            self.appender.append(sample)
            return
        if self.chunk == 1:
            self.appender.append(encode_payloads(sample.payloads, sample.signatures))
            return
        self._group.append(sample)
        if len(self._group) == self.chunk:
            self._flush_group()

    def _flush_group(self) -> None:
        if not self._group:
            return
        columns: list[Any] = []
        for column in zip(*(s.payloads for s in self._group)):
            columns.append(list(column) if isinstance(column[0], bytes) else np.stack(column))
        self.appender.append(encode_payloads(columns, self._group[0].signatures))
        self._group = []

    def _append_all(
        self, stream: Iterator[tuple[int, Outcome] | Encoded], total: int | None, progress: bool | None
    ) -> None:
        bar = _progress_bar(total, progress, "writing")
        try:
            append = self.appender.append
            for sample in self._checked(stream):
                if isinstance(sample, Encoded):
                    for value in sample.values:
                        append(value)
                    self.count += len(sample.values)
                    bar.update(len(sample.values))
                    continue
                self._add(sample)
                bar.update(1)
            self._flush_group()
        finally:
            # on an error, stop the reader (and its DataLoader workers) now rather than when the
            # garbage collector finds it through the traceback: shutting down late hangs 5 s per worker
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        bar.close()

    def _spool_then_shuffle(self, dataset: Any, seed: int, progress: bool | None) -> None:
        """Unknown length: spool encoded samples to disk, then copy them out in shuffled order."""
        spool = LmdbAppender(
            self.spool,
            initial_map_size=self._map_size,
            commit_bytes=self._commit_bytes,
            checksums=False,
            name=self.target,
        )
        bar = _progress_bar(None, progress, "spooling")
        try:
            for sample in self._checked(iterate_source(dataset)):
                assert not isinstance(sample, Encoded), "streams yield one sample at a time"
                if isinstance(sample, bytes):
                    spool.append(sample)
                else:
                    spool.append(encode_payloads(sample.payloads, sample.signatures))
                bar.update(1)
            spool.flush()
        finally:
            bar.close()
            spool.close()
        n = spool.records_written
        order = np.random.default_rng(seed).permutation(n)
        env = lmdb.open(self.spool, subdir=False, readonly=True, lock=False, max_dbs=_format.MAX_DBS)
        try:
            db = env.open_db(_format.RECORDS_DB, create=False)
            bar = _progress_bar(n, progress, "shuffling")
            with env.begin(db=db) as txn:
                for index in order:
                    value = txn.get(_format.encode_key(int(index)))
                    assert value is not None, "spooled record missing"
                    if self.chunk == 1:
                        self.count += 1
                        self.appender.append(value)
                    else:
                        self._add(self._respool(value, int(index)))
                    bar.update(1)
            self._flush_group()
            bar.close()
        finally:
            env.close()
        _remove(self.spool)
        _remove(self.spool + "-lock")

    def _respool(self, value: bytes, index: int) -> Normalized:
        """Decode a spooled sample back into payloads (chunked mode regroups samples)."""
        assert self.schema is not None
        payloads = decode_leaves(value, self.schema.fields, f"{self.spool}: sample {index}")
        signatures = [LeafSignature(f.kind, f.dtype, tuple(f.shape)) for f in self.schema.fields]  # type: ignore[arg-type]
        return Normalized(self.schema.tree, signatures, payloads)

    def metadata(self, shuffle: bool, seed: int, user: dict[str, Any]) -> dict[str, Any]:
        schema = self.schema.to_dict() if self.schema is not None else None
        return {
            "format": _format.FORMAT_NAME,
            "format_version": _format.FORMAT_VERSION,
            "library_version": __version__,
            "count": self.count,
            "records": -(-self.count // self.chunk),
            "samples_per_record": self.chunk,
            "schema": schema,
            "shuffled": bool(shuffle),
            "seed": int(seed),
            "skipped": self.skipped,
            "checksum": "crc32" if self.appender._checksums else None,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "user": user,
            "complete": True,
        }

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.appender.close()
        for p in (self.temp, self.temp + "-lock", self.spool, self.spool + "-lock"):
            _remove(p)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int | None, progress: bool | None, desc: str) -> Any:
    if progress is False:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="sample", disable=None if progress is None else False)


_TEMP_PATTERN = ".{name}.tmp-{pid}-{token}"


def _temporary_path(target: str) -> str:
    directory, name = os.path.split(os.path.abspath(target))
    token = os.urandom(4).hex()
    return os.path.join(directory, _TEMP_PATTERN.format(name=name, pid=os.getpid(), token=token))


def _remove_stale_temporaries(target: str) -> None:
    """Delete temp files left beside ``target`` by writers that no longer run (e.g. killed)."""
    directory, name = os.path.split(os.path.abspath(target))
    pattern = re.compile(r"^\." + re.escape(name) + r"\.tmp-(\d+)-[0-9a-f]+")
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        match = pattern.match(entry)
        if match and not _pid_alive(int(match.group(1))):
            _remove(os.path.join(directory, entry))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: str) -> None:
    """Best-effort removal: on a read-only file system even a missing file gives EROFS."""
    with contextlib.suppress(OSError):
        os.remove(path)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
