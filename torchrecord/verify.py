"""verify: walk a whole record set, checking every checksum and every decode."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import lmdb

from torchrecord import _format
from torchrecord._manifest import file_digest
from torchrecord._sharded import ShardedSet
from torchrecord._walk import PIECE, Walk, check_crc
from torchrecord.errors import CorruptRecordError, TorchRecordError
from torchrecord.record_file import RecordFile

__all__ = ["VerifyReport", "check_crc", "verify"]



@dataclass
class VerifyReport:
    """What :func:`verify` found.

    Attributes:
        path: the record set.
        records: records checked.
        bad: how many failed (checksum, decode or a missing key).
        first_bad: index of the first bad record, or None.
        first_error: the message for the first bad record, or None.
        errors: up to ``max_errors`` (index, message) pairs.
    """

    path: str
    records: int = 0
    bad: int = 0
    first_bad: int | None = None
    first_error: str | None = None
    errors: list[tuple[int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no record was bad."""
        return self.bad == 0

    def _fail(self, index: int, message: str, max_errors: int) -> None:
        self.bad += 1
        if self.first_bad is None:
            self.first_bad, self.first_error = index, message
        if len(self.errors) < max_errors:
            self.errors.append((index, message))


def verify(
    path: str | os.PathLike[str],
    *,
    progress: bool | None = None,
    max_errors: int = 20,
    cache_dir: str | None = None,
) -> VerifyReport:
    """Check every record of a record set: present, checksum matches, reads back per the schema.

    Args:
        path: the record set.
        progress: show a tqdm bar (None: only on a terminal).
        max_errors: how many (index, message) pairs the report keeps.
        cache_dir: where a remote sharded set's shards are fetched to.

    A sharded set is verified shard by shard (record indices run on over the
    shards, messages name the shard's file), and each shard file's SHA-256 is
    checked against the manifest.

    Returns:
        A :class:`VerifyReport`: ``ok``, the records checked and bad, the first
        bad record and its message.

    Raises:
        RecordNotFoundError, NotARecordSetError, VersionError, CorruptRecordError:
            the set cannot be opened at all (see below).

    Opening problems (missing file, not a record set, newer version, truncated file)
    raise; per-record problems are counted in the report, which names the first bad
    index. Records are read with the same cursor walk as every reader, a piece at a
    time; a piece the walk refuses (a missing key, a page LMDB cannot read) is
    checked again record by record with keyed gets in fresh transactions, so one
    bad page does not hide the rest.
    """
    rf = RecordFile(path, cache_dir=cache_dir)
    if isinstance(rf, ShardedSet):
        return _verify_shards(rf, progress, max_errors)
    env, records_db = rf.environment()
    count = rf.num_records
    crc_db = rf.crc_db
    report = VerifyReport(rf.path)
    bar = _bar(count, progress)
    present = 0  # records found (or unreadable) under their keys, to tell stray keys from missing ones
    try:
        for first in range(0, count, PIECE):
            stop = min(count, first + PIECE)
            try:
                with Walk(env, records_db, rf.path, keyed=True) as walk:
                    values = walk.records(first, stop)
                    if crc_db is not None:
                        with Walk(env, crc_db, f"{rf.path} (checksums)", keyed=True) as crc_walk:
                            crcs: list[Any] = crc_walk.records(first, stop)
                    else:
                        crcs = [None] * len(values)
            except TorchRecordError:
                present += _one_by_one(rf, env, records_db, crc_db, first, stop, report, max_errors)
            else:
                present += len(values)
                for index, (value, stored) in enumerate(zip(values, crcs), first):
                    _check_record(rf, index, value, stored, crc_db is not None, report, max_errors)
            report.records += stop - first
            bar.update(stop - first)
        _check_extra(env, records_db, count, present, report, max_errors)
    finally:
        bar.close()
    return report


def _verify_shards(sharded: ShardedSet, progress: bool | None, max_errors: int) -> VerifyReport:
    """verify each shard; record indices run on over the shards, and each file must match its SHA-256."""
    report = VerifyReport(sharded.path)
    base = 0
    for s, entry in enumerate(sharded.manifest["shards"]):
        shard = sharded.shard(s)
        sub = verify(shard.path, progress=progress, max_errors=max_errors)
        report.records += sub.records
        for index, message in sub.errors:
            report._fail(base + index, message, max_errors)
        report.bad += sub.bad - len(sub.errors)
        if sub.ok and file_digest(shard.path) != (entry["sha256"], entry["bytes"]):
            message = f"{shard.path}: the file's SHA-256 or size differs from the manifest's; copy it again"
            report._fail(base, message, max_errors)
        base += sub.records
        sharded.release(s)
    return report


def _check_record(
    rf: RecordFile, index: int, value: Any, stored: Any, checked: bool, report: VerifyReport, max_errors: int
) -> None:
    where = f"{rf.path}: record {index}"
    try:
        if value is None:
            raise CorruptRecordError(f"{where}: missing")
        if checked:
            check_crc(value, stored, where)
        rf.decode_record(value, index)
    except TorchRecordError as exc:
        report._fail(index, str(exc), max_errors)


def _one_by_one(
    rf: RecordFile,
    env: lmdb.Environment,
    records_db: Any,
    crc_db: Any,
    first: int,
    stop: int,
    report: VerifyReport,
    max_errors: int,
) -> int:
    """Check records [first, stop) with keyed gets; returns how many keys were present."""
    present = 0
    txn: lmdb.Transaction | None = None
    try:
        for index in range(first, stop):
            key = _format.encode_key(index)
            try:
                if txn is None:
                    txn = env.begin(buffers=False)
                value = txn.get(key, db=records_db)
                stored = txn.get(key, db=crc_db) if crc_db is not None else None
            except lmdb.Error as exc:
                where = f"{rf.path}: record {index}"
                report._fail(index, f"{where}: LMDB cannot read it ({exc}); the file is damaged", max_errors)
                present += 1
                if txn is not None:
                    txn.abort()  # an LMDB error can leave the transaction unusable
                txn = None
                continue
            present += value is not None
            _check_record(rf, index, value, stored, crc_db is not None, report, max_errors)
    finally:
        if txn is not None:
            txn.abort()
    return present


def _check_extra(
    env: lmdb.Environment, db: Any, count: int, present: int, report: VerifyReport, max_errors: int
) -> None:
    """Count keys that are not records 0..count-1 (e.g. records added in place beyond the count)."""
    try:
        with env.begin() as txn:
            extra = int(txn.stat(db)["entries"]) - present
    except lmdb.Error as exc:
        report._fail(count, f"{report.path}: LMDB cannot count the records ({exc})", max_errors)
        return
    if extra > 0:
        report._fail(
            count,
            f"{report.path}: {extra} records beyond the count in the metadata ({count}); the file was "
            "changed after write_record finished: write it again",
            max_errors,
        )


def _bar(total: int, progress: bool | None):  # type: ignore[no-untyped-def]
    from torchrecord.writer import _progress_bar

    return _progress_bar(total, progress, "verifying")
