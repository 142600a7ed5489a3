"""verify: walk a whole record set, checking every checksum and every decode."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any

import lmdb

from torchrecord._check.isolate import run_each_isolated, run_isolated
from torchrecord._core.crc import crc32_joined
from torchrecord._shards.manifest import file_digest
from torchrecord._shards.open import SetLike, open_set
from torchrecord._shards.sharded import ShardedSet
from torchrecord._store import format as _format
from torchrecord._store import opening as _opening
from torchrecord._store.crc_blocks import BlockChecksums, read_block_checksums
from torchrecord._store.lmdb_check import StructureInfo, check_structure
from torchrecord._store.record_file import RecordFile
from torchrecord._store.record_set import is_url
from torchrecord._store.walk import PIECE, Walk, check_crc
from torchrecord.errors import ChecksumError, CorruptRecordError, FormatError, NotARecordSetError, TorchRecordError

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


#: Records each call in the checking process verifies (its progress step and timeout unit).
CHUNK = 16 * PIECE
#: Seconds one chunk may take in the checking process before the file is reported as damaged.
CHUNK_TIMEOUT = 600.0


def verify(
    path: SetLike,
    *,
    progress: bool | None = None,
    max_errors: int = 20,
    cache_dir: str | None = None,
    timeout: float = CHUNK_TIMEOUT,
) -> VerifyReport:
    """Check every record of a record set: present, checksum matches, reads back per the schema.

    Safe on any file, whatever its provenance: LMDB's page structure is checked in
    pure Python first (:func:`~torchrecord._store.lmdb_check.check_structure`: page
    numbers, node pointers and sizes, overflow runs, branch children, key order, no
    page reached twice), before anything maps the file; then the records are read
    with liblmdb in a forked child process, so that a damage the structural check
    did not foresee kills that child, not the caller. Either way the damage is a
    :class:`~torchrecord.errors.StructureError`. Nothing the metadata claims is
    trusted beyond what the file holds (see ``torchrecord._store.claims``).

    Args:
        path: the record set: a file, a sharded set's folder, manifest or URL, or a
            :class:`~torchrecord.RecordSet` (only its path is used: nothing is
            read through it).
        progress: show a tqdm bar (None: only on a terminal).
        max_errors: how many (index, message) pairs the report keeps.
        cache_dir: where a remote sharded set's shards are fetched to.
        timeout: seconds the checking process may spend on one chunk of
            4,096 records before the file is reported as damaged (liblmdb
            looping on it).

    A sharded set is verified shard by shard (record indices run on over the
    shards, messages name the shard's file), and each shard file's SHA-256 is
    checked against the manifest.

    Returns:
        A :class:`VerifyReport`: ``ok``, the records checked and bad, the first
        bad record and its message.

    Raises:
        RecordNotFoundError, NotARecordSetError, VersionError, CorruptRecordError:
            the set cannot be opened at all (see below).
        StructureError: LMDB's page structure is damaged (found by the check, or
            the checking process died on the file).

    Opening problems (missing file, not a record set, newer version, truncated file,
    damaged page structure, a count the file cannot hold) raise; per-record problems
    are counted in the report, which names the first bad index. Records are read
    with the same cursor walk as every reader, a piece at a time; a piece the walk
    refuses (a missing key, a page LMDB cannot read) is checked again record by
    record with keyed gets in fresh transactions, so one bad record does not hide
    the rest.
    """
    rs = open_set(path, cache_dir=cache_dir)  # nothing mapped: a file opens on first use, which verify never makes
    if isinstance(rs, ShardedSet):
        return _verify_shards(rs, progress, max_errors, timeout)
    return _verify_file(rs.path, progress, max_errors, timeout)[0]


def _verify_file(
    path: str, progress: bool | None, max_errors: int, timeout: float
) -> tuple[VerifyReport, dict[str, Any]]:
    """Verify one file; the report, and the file's count and set_id as the checking process read them."""
    info = _checked_structure(path)
    described: dict[str, Any] = run_isolated(_open_in_child, path, timeout=timeout, name=path)
    count = int(described["records"])
    report = VerifyReport(path)
    present = [0]  # records found (or unreadable) under their keys, to tell stray keys from missing ones
    bars: list[Any] = []  # made after the fork: no progress-bar thread in the checking process

    def merge(result: dict[str, Any]) -> None:
        for index, message in result["errors"]:
            report._fail(int(index), str(message), max_errors)
        report.bad += int(result["bad"]) - len(result["errors"])
        present[0] += int(result["present"])
        report.records += int(result["records"])
        if not bars:
            bars.append(_bar(count, progress))
        bars[0].update(int(result["records"]))

    chunks = [(first, min(count, first + CHUNK)) for first in range(0, count, CHUNK)]
    try:
        run_each_isolated(
            functools.partial(_verify_chunk, path, max_errors), chunks, timeout=timeout, each=merge, name=path
        )
    finally:
        for bar in bars:
            bar.close()
    records_db = info.databases.get(_format.RECORDS_DB)
    entries = records_db.entries if records_db is not None else 0
    _check_extra(entries, count, present[0], report, max_errors)
    return report, described


def _checked_structure(path: str) -> StructureInfo:
    """check_structure, with the messages of a reader for what is not a record set at all."""
    _opening.check_path(path)
    try:
        return check_structure(path)
    except NotARecordSetError:
        _opening.check_kind(path)
        raise


#: the checking process's RecordFile, opened by its first call
_CHILD: dict[str, RecordFile] = {}


def _child_file(path: str) -> RecordFile:
    rf = _CHILD.get(path)
    if rf is None:
        rf = RecordFile(path)
        rf._lenient_count = True  # a count claiming missing records: each is reported
        rf.environment()
        _CHILD[path] = rf
    return rf


def _open_in_child(path: str) -> dict[str, Any]:
    """Open the file, read and check its metadata (runs in the checking process): its records, samples, set_id."""
    rf = _child_file(path)
    return {"records": rf.num_records, "count": len(rf), "set_id": rf.set_id}


def _verify_chunk(path: str, max_errors: int, chunk: tuple[int, int]) -> dict[str, Any]:
    """Verify records [first, stop) (runs in the checking process): a msgpack-able partial report."""
    first, stop = chunk
    rf = _child_file(path)
    env, records_db = rf.environment()
    crc_db = rf.crc_db
    part = VerifyReport(path)
    blocks = _block_checksums(rf, first, part, max_errors) if crc_db is not None else None
    present = 0
    for lo in range(first, stop, PIECE):
        hi = min(stop, lo + PIECE)
        try:
            with Walk(env, records_db, path, keyed=True) as walk:
                values = walk.records(lo, hi)
                if crc_db is not None:
                    with Walk(env, crc_db, f"{path} (checksums)", keyed=True) as crc_walk:
                        crcs: list[Any] = crc_walk.records(lo, hi)
                else:
                    crcs = [None] * len(values)
        except TorchRecordError:
            present += _one_by_one(rf, env, records_db, crc_db, lo, hi, part, max_errors)
        else:
            present += len(values)
            bad = part.bad
            for index, (value, stored) in enumerate(zip(values, crcs), lo):
                _check_record(rf, index, value, stored, crc_db is not None, part, max_errors)
            if blocks is not None and part.bad == bad:
                _check_blocks(blocks, values, lo, path, part, max_errors)
    return {"records": stop - first, "present": present, "bad": part.bad, "errors": [[i, m] for i, m in part.errors]}


def _block_checksums(rf: RecordFile, first: int, report: VerifyReport, max_errors: int) -> BlockChecksums | None:
    """The block checksums of the records the file holds (a count claiming more is reported record by record);
    damaged ones are reported (by the chunk from record 0) and not checked."""
    env, records_db = rf.environment()
    try:
        with env.begin() as txn:
            held = int(txn.stat(records_db)["entries"])
    except lmdb.Error:  # the records themselves are reported
        held = rf.num_records
    try:
        return read_block_checksums(env, rf.path, rf.metadata, records=min(held, rf.num_records))
    except ChecksumError as exc:
        if first == 0:
            report._fail(0, str(exc), max_errors)
        return None


def _check_blocks(
    blocks: BlockChecksums, values: list[Any], lo: int, path: str, report: VerifyReport, max_errors: int
) -> None:
    """The block checksums of the whole blocks among records [lo, lo + len(values)), each of them good."""
    for at in range(-(-lo // blocks.block) * blocks.block, lo + len(values), blocks.block):
        block = values[at - lo : at - lo + blocks.block]
        if len(block) == min(blocks.block, blocks.records - at) and crc32_joined(block) != blocks.stored(at):
            report._fail(
                at,
                f"{path}: records {at} to {at + len(block) - 1}: the checksum of their block does not match while "
                "every record's own does: the block checksums are damaged",
                max_errors,
            )


def _verify_shards(sharded: ShardedSet, progress: bool | None, max_errors: int, timeout: float) -> VerifyReport:
    """verify each shard; record indices run on over the shards, and each file must match its SHA-256.

    A shard is never opened in this process: its path (a remote shard is fetched first)
    goes to the same isolated check as a single file.
    """
    report = VerifyReport(sharded.path)
    base = 0
    for s, entry in enumerate(sharded.manifest["shards"]):
        remote = is_url(sharded.path)
        local = sharded._remote().fetch(s) if remote else os.path.join(sharded._base(), entry["name"])
        try:
            sub, described = _verify_file(local, progress, max_errors, timeout)
        finally:
            if remote:
                sharded.release(s)
        if described["set_id"] != entry["set_id"] or described["count"] != entry["count"]:
            raise FormatError(
                f"{local}: shard {s} is not the file the manifest lists (set_id {described['set_id']}, "
                f"{described['count']} samples; the manifest says {entry['set_id']}, {entry['count']}): it was "
                "rewritten after the set was finalized; run torchrecord.finalize_shards again"
            )
        report.records += sub.records
        for index, message in sub.errors:
            report._fail(base + index, message, max_errors)
        report.bad += sub.bad - len(sub.errors)
        if sub.ok and file_digest(local) != (entry["sha256"], entry["bytes"]):
            message = f"{local}: the file's SHA-256 or size differs from the manifest's; copy it again"
            report._fail(base, message, max_errors)
        base += sub.records
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


def _check_extra(entries: int, count: int, present: int, report: VerifyReport, max_errors: int) -> None:
    """Count keys that are not records 0..count-1 (e.g. records added in place beyond the count)."""
    extra = entries - present
    if extra > 0:
        report._fail(
            count,
            f"{report.path}: {extra} records beyond the count in the metadata ({count}); the file was "
            "changed after write_record finished: write it again",
            max_errors,
        )


def _bar(total: int, progress: bool | None):  # type: ignore[no-untyped-def]
    from torchrecord._core.progress import progress_bar as _progress_bar

    return _progress_bar(total, progress, "verifying")
