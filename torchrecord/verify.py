"""verify: walk a whole record set, checking every checksum and every decode."""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from typing import Any

import lmdb

from torchrecord import _format
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
        return self.bad == 0

    def _fail(self, index: int, message: str, max_errors: int) -> None:
        self.bad += 1
        if self.first_bad is None:
            self.first_bad, self.first_error = index, message
        if len(self.errors) < max_errors:
            self.errors.append((index, message))


def check_crc(value: bytes | memoryview, stored: bytes | memoryview | None, where: str) -> None:
    """Raise ChecksumError unless ``stored`` is the CRC-32 of ``value``."""
    if stored is None:
        raise CorruptRecordError(f"{where}: no checksum stored")
    actual = zlib.crc32(value)
    expected = int.from_bytes(stored, "little")
    if len(stored) != 4 or actual != expected:
        from torchrecord.errors import ChecksumError

        raise ChecksumError(f"{where}: CRC-32 is {actual:08x}, the stored checksum is {expected:08x}")


def verify(
    path: str | os.PathLike[str], *, progress: bool | None = None, max_errors: int = 20
) -> VerifyReport:
    """Check every record of a record set: present, checksum matches, reads back per the schema.

    Opening problems (missing file, not a record set, newer version, truncated file)
    raise; per-record problems are counted in the report, which names the first bad
    index. A record LMDB itself cannot read (a damaged page) counts as bad and the
    walk goes on with a fresh transaction, so one bad page does not hide the rest.
    """
    rf = RecordFile(path)
    env, records_db = rf.environment()
    count = rf.metadata["records"] if "records" in rf.metadata else len(rf)
    crc_db = env.open_db(_format.CRC_DB, create=False) if rf.metadata.get("checksum") else None
    report = VerifyReport(rf.path)
    bar = _bar(count, progress)
    txn: lmdb.Transaction | None = None
    present = 0  # records found (or unreadable) under their keys, to tell stray keys from missing ones
    try:
        for index in range(count):
            where = f"{rf.path}: record {index}"
            key = _format.encode_key(index)
            try:
                if txn is None:
                    txn = env.begin(buffers=False)
                value = txn.get(key, db=records_db)
                stored = txn.get(key, db=crc_db) if crc_db is not None else None
            except lmdb.Error as exc:
                report._fail(index, f"{where}: LMDB cannot read it ({exc}); the file is damaged", max_errors)
                present += 1
                if txn is not None:
                    txn.abort()  # an LMDB error can leave the transaction unusable
                txn = None
            else:
                present += value is not None
                try:
                    if value is None:
                        raise CorruptRecordError(f"{where}: missing")
                    if crc_db is not None:
                        check_crc(value, stored, where)
                    rf.decode_record(value, index)
                except TorchRecordError as exc:
                    report._fail(index, str(exc), max_errors)
            report.records += 1
            bar.update(1)
        _check_extra(env, records_db, count, present, report, max_errors)
    finally:
        if txn is not None:
            txn.abort()
        bar.close()
    return report


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
