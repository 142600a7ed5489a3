"""The cursor walk: the one place that reads records out of LMDB.

Every reader (``RecordDataset``'s two decoding paths, ``RecordFile``, ``verify``)
reads through a :class:`Walk`: one read transaction, one cursor on the records
database (and one on the checksums), a ``set_range`` seek to the first record of
a run, then sequential steps. Each step is checked before a byte is used:

* every key read must be the next expected index (compared in bulk, one join
  per piece), so a damaged tree can never duplicate or skip records silently;
* with checksums on, every value's CRC-32 must match the stored 4-byte one; where
  the set has block checksums (``_store/crc_blocks.py``), each block a run covers
  whole is checked by one CRC-32, and a record's own only at the ends of a run or
  when its block does not match (to name it). A run's check (:class:`RunCheck`) may
  be deferred to the caller, who computes it on a helper thread
  (``_store/checks_ahead.py``) and settles it before a value is used;
* LMDB's own errors become :class:`~torchrecord.errors.CorruptRecordError`
  naming the file.
"""

from __future__ import annotations

import array
import contextlib
import sys
from collections.abc import Iterator, Sequence
from itertools import islice
from types import TracebackType
from typing import Any, Protocol

import lmdb
import numpy as np

from torchrecord._core.crc import crc32
from torchrecord._store.crc_blocks import BlockChecksums
from torchrecord._store.format import encode_key, lmdb_error, lmdb_errors
from torchrecord.errors import ChecksumError, CorruptRecordError

__all__ = [
    "DeferredCheck",
    "PIECE",
    "RunCheck",
    "Walk",
    "block_damaged",
    "check_crc",
    "check_crcs",
    "crcs_match",
    "record_runs",
]

#: Records fetched per cursor step by :meth:`Walk.pieces`: bounds memory, amortizes the calls.
PIECE = 256

_CRC_BYTES = 4
#: the array typecode of 4-byte unsigned integers (a C unsigned int, or long where int is not 4 bytes)
_U32 = next(code for code in "IL" if array.array(code).itemsize == _CRC_BYTES)


def check_crc(value: bytes | memoryview, stored: bytes | memoryview | None, where: str) -> None:
    """Raise ChecksumError unless ``stored`` is the 4-byte little-endian CRC-32 of ``value``."""
    if stored is None:
        raise CorruptRecordError(f"{where}: no checksum stored")
    actual = crc32(value)
    if len(stored) != _CRC_BYTES:
        raise ChecksumError(f"{where}: the stored checksum has {len(stored)} bytes, not {_CRC_BYTES}")
    expected = int.from_bytes(stored, "little")
    if actual != expected:
        raise ChecksumError(f"{where}: CRC-32 is {actual:08x}, the stored checksum is {expected:08x}")


def crcs_match(values: Sequence[Any], stored: Sequence[Any]) -> bool:
    """True when each of ``stored`` is the 4-byte CRC-32 of the value at the same place, all compared at once
    (as the bytes of the CRC-32s computed, little-endian, against the stored ones joined)."""
    n = len(values)
    joined = b"".join(stored) if all(s is not None for s in stored) else b""
    if len(stored) != n or len(joined) != _CRC_BYTES * n:
        return False
    actual = array.array(_U32, map(crc32, values))
    if sys.byteorder == "big":
        actual.byteswap()
    return actual.tobytes() == joined


def check_crcs(values: Sequence[Any], stored: Sequence[Any], path: str, records: Sequence[int]) -> None:
    """Raise ChecksumError unless each of ``stored`` is the CRC-32 of the value at the same place (the values of
    ``records``): all compared at once, the record at fault found one by one only on a mismatch.
    """
    if crcs_match(values, stored):
        return
    n = len(values)
    for record, value, crc in zip(records, values, stored):
        check_crc(value, crc, f"{path}: record {record}")
    raise ChecksumError(f"{path}: {len(stored)} checksums for {n} records from record {records[0]}")


def record_runs(sample_runs: Sequence[tuple[int, int]], samples_per_record: int) -> list[tuple[int, int]]:
    """The record runs [first, stop) holding each run of sample indices, in the same order."""
    k = samples_per_record
    return [(start // k, (stop - 1) // k + 1) for start, stop in sample_runs if stop > start]


def _expected_keys(first: int, stop: int) -> bytes:
    return np.arange(first, stop, dtype=">u8").tobytes()


class Walk:
    """One read transaction over a record set's records, used as a context manager.

    Args:
        env: the open environment.
        db: its records database.
        path: the file, for error messages.
        crc_db: the checksums database, to check every value read (None: no check).
        crc_blocks: the set's block checksums, checked instead of each record's when
            ``crc_db`` is given (None: each record's).
        buffers: values are zero-copy views of the map (valid while the walk is
            open) instead of bytes.
        keyed: look every record up by its key (a tree descent each) instead of
            stepping the cursor from leaf to leaf. Slower; ``verify`` uses it
            because liblmdb's leaf-to-leaf step aborts the process on some damaged
            pages where a keyed lookup reports an error.
        defer_checks: a list where :meth:`records` appends the check of each run
            read (the stored checksums read, not yet compared) instead of settling
            it: the caller settles them before using a value, possibly after
            computing them on another thread (``torchrecord._store.checks_ahead``).
            Several walks may share one list (a window's runs, in read order).
    """

    def __init__(
        self,
        env: lmdb.Environment,
        db: Any,
        path: str,
        *,
        crc_db: Any = None,
        crc_blocks: BlockChecksums | None = None,
        buffers: bool = False,
        keyed: bool = False,
        defer_checks: list[DeferredCheck] | None = None,
    ) -> None:
        self.env, self.db, self.path, self.crc_db, self.buffers = env, db, path, crc_db, buffers
        self.crc_blocks = crc_blocks if crc_db is not None else None
        self.deferred = defer_checks
        self._read = _read_keyed if keyed else _read_checked
        self.txn: Any = None
        self.records_read = 0

    def __enter__(self) -> Walk:
        with lmdb_errors(self.path):
            begin: Any = self.env.begin
            self.txn = begin(db=self.db, buffers=self.buffers)
            self._cursor = self.txn.cursor(db=self.db)
            self._crc_cursor = self.txn.cursor(db=self.crc_db) if self.crc_db is not None else None
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """End the transaction (views handed out before become invalid)."""
        if self.txn is not None:
            txn, self.txn = self.txn, None
            txn.abort()

    def records(self, first: int, stop: int) -> list[Any]:
        """The values of records [first, stop), every key and (optionally) checksum checked.

        With ``defer_checks``, the checksums are not compared yet: the run's
        :class:`RunCheck` is appended to that list.
        """
        n = stop - first
        if n <= 0:
            return []
        try:  # what _reading does, without its two context managers (this runs once a piece of a window)
            values = self._read(self._cursor, first, stop, self.path)
            check = self._run_check(values, first) if self._crc_cursor is not None else None
        except lmdb.Error as exc:
            raise lmdb_error(self.path, exc) from exc
        except MemoryError:
            raise self._too_large(f"records {first} to {stop - 1}") from None
        self._count(n, check)
        return values

    @property
    def checks(self) -> bool:
        """True when this walk checks every record against its stored CRC-32."""
        return self._crc_cursor is not None

    def record_crcs(self) -> np.ndarray | None:
        """The stored CRC-32 of every record (uint32, indexed by record) where this walk checks checksums and
        holds them in memory: block checksums of one record a block (records of 4 KiB or more). None otherwise:
        its checks need the stored CRC-32s read record by record or a block's records joined (:meth:`records`
        does both)."""
        blocks = self.crc_blocks
        if self._crc_cursor is None or blocks is None or blocks.block != 1:
            return None
        return blocks.crcs

    def found(self, first: int, count: int, values: Sequence[Any] | None = None, *, checked: bool = False) -> None:
        """Records [first, first + count) were found without a step of the cursor (``address_book``: where an
        earlier walk of this snapshot found them, keys checked). With checksums, ``values`` are theirs, checked
        (or deferred) as :meth:`records` checks them, unless the caller has ``checked`` them already against
        :meth:`record_crcs`. They count as read."""
        check = None
        if self._crc_cursor is not None and not checked:
            if values is None or len(values) != count:
                raise AssertionError(
                    "a walk with checksums needs the values of the records found"
                )  # an internal invariant
            with self._reading(f"the checksums of records {first} to {first + count - 1}"):
                check = self._run_check(list(values), first)
        self._count(count, check)

    def _count(self, n: int, check: RunCheck | None) -> None:
        if check is not None:
            if self.deferred is not None:
                self.deferred.append(check)
            else:
                check.settle()
        self.records_read += n

    def _run_check(self, values: list[Any], first: int) -> RunCheck:
        """The check of records [first, first + len(values)): with block checksums, each whole block among
        them by its CRC-32 and the records of a block only partly among them (at the ends of the run) each by
        its own; without, each record by its own. The stored CRCs it needs are read here (LMDB calls)."""
        stop = first + len(values)
        check = RunCheck(self, values, first)
        blocks = self.crc_blocks
        if blocks is None:
            check.each(first, self._stored(first, stop))
            return check
        size = blocks.block
        whole_from = -(-first // size) * size
        whole_to = stop if stop == blocks.records else stop // size * size  # the last block may be short
        if whole_from >= whole_to:
            check.each(first, self._stored(first, stop))
            return check
        if first < whole_from:
            check.each(first, self._stored(first, whole_from))
        check.whole_blocks(whole_from, whole_to, blocks)
        if whole_to < stop:
            check.each(whole_to, self._stored(whole_to, stop))
        return check

    def _stored(self, first: int, stop: int) -> list[Any]:
        """The stored CRC-32 of records [first, stop)."""
        return self._read(self._crc_cursor, first, stop, f"{self.path} (checksums)")

    def check_each(self, values: Sequence[Any], first: int) -> None:
        """Each of ``values`` (records ``first``, ...) against its own stored CRC-32 (in the checksums database,
        not the block checksums): raises the ChecksumError naming the first record at fault."""
        stop = first + len(values)
        check_crcs(values, self._stored(first, stop), self.path, range(first, stop))

    def records_at(self, records: np.ndarray) -> list[Any]:
        """The values of ``records`` (int64, any order), each looked up by its key; checksums checked.

        For records scattered over the file (``StreamDataset``'s frames): one
        tree descent each in C, instead of a Python-level seek and step per run.
        A lookup finds its exact key or nothing, so no key can be misplaced.
        """
        n = len(records)
        if not n:
            return []
        packed = np.asarray(records, dtype=">u8").tobytes()
        keys = [packed[i : i + 8] for i in range(0, 8 * n, 8)]
        with self._reading(f"{n} records from {int(records[0])}"):
            get = self._cursor.get
            values = [get(key) for key in keys]
            crcs = None
            if self._crc_cursor is not None:
                get_crc = self._crc_cursor.get
                crcs = [get_crc(key) for key in keys]
        if None in values:
            missing = int(records[values.index(None)])
            raise CorruptRecordError(f"{self.path}: record {missing} is missing; the file is damaged")
        if crcs is not None:
            check_crcs(values, crcs, self.path, records.tolist())
        self.records_read += n
        return values

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """LMDB's errors, and a value too large to copy, as CorruptRecordError naming the file and ``what``."""
        try:
            with lmdb_errors(self.path):
                yield
        except MemoryError:  # a damaged node can claim a value of gigabytes: py-lmdb cannot copy it
            raise self._too_large(what) from None

    def _too_large(self, what: str) -> CorruptRecordError:
        return CorruptRecordError(
            f"{self.path}: {what}: LMDB returned a value larger than the memory available; the file is "
            "probably damaged: run torchrecord.verify on it"
        )

    def pieces(self, runs: Sequence[tuple[int, int]], piece: int = PIECE) -> Iterator[tuple[int, list[Any]]]:
        """``(first record, values)`` for pieces of at most ``piece`` records covering each record run (with block
        checksums: pieces end on block boundaries, so that every block a run covers whole is checked whole)."""
        step = piece
        if self.crc_blocks is not None:  # pieces end on block boundaries: whole blocks, about ``piece`` records
            size = self.crc_blocks.block
            step = max(1, piece // size) * size
        for first, stop in runs:
            lo = first
            while lo < stop:
                hi = min(stop, (lo // step + 1) * step) if self.crc_blocks is not None else min(stop, lo + piece)
                yield lo, self.records(lo, hi)
                lo = hi


class DeferredCheck(Protocol):
    """A check a walk defers (``defer_checks``): :class:`RunCheck`, or ``checks_ahead.KnownChecks`` (a window's
    records found through the address books). Its values joined are records in a window's row order."""

    values: list[Any]

    @property
    def nbytes(self) -> int: ...

    def record_crcs(self) -> np.ndarray | None: ...

    def compute(self) -> None: ...

    def settle(self) -> None: ...

    def name(self, at: int) -> str: ...


class RunCheck:
    """The checksum check of one run of records a walk read: its parts, in record order, checked record by
    record (:meth:`each`) or block by block (:meth:`whole_blocks`).

    :meth:`compute` only computes CRC-32s and compares them (no LMDB call, no
    error raised): it may run on another thread while the walk stays open, and for
    long values the CRC releases the GIL. :meth:`settle`, in the walk's thread,
    raises the ChecksumError naming the record at fault, computing first if no
    one did.
    """

    def __init__(self, walk: Walk, values: list[Any], first: int) -> None:
        self.walk, self.values, self.first = walk, values, first
        #: (first record, stored CRCs) of a part checked record by record, or (first, stop, blocks) of whole blocks
        self._parts: list[tuple[int, list[Any]] | tuple[int, int, BlockChecksums]] = []
        self._matched: list[bool] | None = None
        self._error: BaseException | None = None

    @property
    def nbytes(self) -> int:
        """The bytes of the values this check reads."""
        return sum(map(len, self.values))

    def record_crcs(self) -> np.ndarray | None:
        """The stored CRC-32 of each record of the run (uint32), when every part has one a record (record by
        record, or blocks of one record: long records); None otherwise (blocks of several, or a stored checksum
        not 4 bytes long, left to :meth:`settle` to report)."""
        pieces: list[np.ndarray] = []
        for part in self._parts:
            if len(part) == 2:
                stored = part[1]
                if not all(s is not None and len(s) == _CRC_BYTES for s in stored):
                    return None
                pieces.append(np.frombuffer(b"".join(stored), "<u4"))
            elif part[2].block == 1:
                pieces.append(part[2].crcs[part[0] : part[1]])
            else:
                return None
        return np.concatenate(pieces).astype(np.uint32) if pieces else np.zeros(0, np.uint32)

    def each(self, first: int, stored: list[Any]) -> None:
        """Records [first, first + len(stored)) are checked each against its own stored CRC-32."""
        self._parts.append((first, stored))

    def whole_blocks(self, first: int, stop: int, blocks: BlockChecksums) -> None:
        """Records [first, stop) (whole blocks) are checked one CRC-32 a block."""
        self._parts.append((first, stop, blocks))

    def name(self, at: int) -> str:
        """``"<file>: record <index>"`` of the run's record ``at`` (from its first)."""
        return f"{self.walk.path}: record {self.first + at}"

    def compute(self) -> None:
        """Compute and compare every CRC-32 of the run (thread-safe while the walk is open; never raises)."""
        try:
            self._matched = [self._part_matches(part) for part in self._parts]
        except BaseException as error:  # kept for settle, in the walk's thread
            self._error = error

    def _part_matches(self, part: tuple[int, list[Any]] | tuple[int, int, BlockChecksums]) -> bool:
        at = part[0] - self.first
        if len(part) == 2:
            return crcs_match(self.values[at : at + len(part[1])], part[1])
        _, stop, blocks = part
        count = -(-(stop - part[0]) // blocks.block)
        actual = _block_crcs(self.values[at : at + stop - part[0]], blocks.block, count)
        start = part[0] // blocks.block
        return bool(np.array_equal(actual, blocks.crcs[start : start + count]))

    def settle(self) -> None:
        """Raise ChecksumError (naming the record at fault) unless every CRC-32 of the run matched."""
        if self._matched is None and self._error is None:
            self.compute()
        if self._error is not None:
            raise self._error
        assert self._matched is not None
        walk, path = self.walk, self.walk.path
        for part, matched in zip(self._parts, self._matched):
            if matched:
                continue
            at = part[0] - self.first
            if len(part) == 2:
                stored = part[1]
                check_crcs(self.values[at : at + len(stored)], stored, path, range(part[0], part[0] + len(stored)))
                continue
            _, stop, blocks = part
            with walk._reading(f"records {part[0]} to {stop - 1}"):
                self._name_block(part[0], stop, blocks)

    def _name_block(self, first: int, stop: int, blocks: BlockChecksums) -> None:
        """Records [first, stop) hold a block that does not match: name the record at fault, else say the block
        checksums are damaged."""
        size = blocks.block
        starts = range(first, stop, size)
        values = self.values[first - self.first : stop - self.first]
        actual = _block_crcs(values, size, len(starts))
        wrong = np.flatnonzero(actual != blocks.crcs[first // size : first // size + len(starts)])
        at = starts[int(wrong[0])]
        block = values[at - first : at - first + size]
        self.walk.check_each(block, at)  # names the record at fault
        raise block_damaged(self.walk.path, at, at + len(block))


def block_damaged(path: str, first: int, stop: int) -> ChecksumError:
    """The error for a block of records [first, stop) whose block checksum does not match while each record's own
    does."""
    return ChecksumError(
        f"{path}: records {first} to {stop - 1}: the checksum of their block does not match while every record's "
        "own does: the block checksums are damaged; run torchrecord.verify on it"
    )


def _block_crcs(values: list[Any], size: int, blocks: int) -> np.ndarray:
    """The CRC-32 of each block of ``size`` of ``values`` joined (the last block may be shorter), uint32.

    A block of several records holds about 4 KiB (the writer sizes it so): each is joined and summed in one
    call. That is a quarter of the time of one join of the run sliced at block bounds, whose bounds needed
    every value's length (``len`` a value cost more than the CRC-32 of its 72 bytes).
    """
    if size == 1:
        return np.fromiter(map(crc32, values), np.uint32, blocks)
    join = b"".join
    return np.fromiter((crc32(join(values[at : at + size])) for at in range(0, len(values), size)), np.uint32, blocks)


def _read_checked(cursor: Any, first: int, stop: int, path: str) -> list[Any]:
    """Values of keys [first, stop) read sequentially; the keys must be exactly those indices."""
    n = stop - first
    if not cursor.set_range(encode_key(first)):
        raise CorruptRecordError(f"{path}: record {first} is missing")
    pairs = list(islice(cursor.iternext(keys=True, values=True), n))
    keys = b"".join([k for k, _ in pairs])
    if len(pairs) != n or keys != _expected_keys(first, stop):
        raise CorruptRecordError(f"{path}: {_describe_gap(keys, first, stop)}; the file is damaged")
    return [v for _, v in pairs]


def _read_keyed(cursor: Any, first: int, stop: int, path: str) -> list[Any]:
    """Values of keys [first, stop), each looked up by its key."""
    keys = [encode_key(i) for i in range(first, stop)]
    pairs = cursor.getmulti(keys)
    found = b"".join([k for k, _ in pairs])
    if len(pairs) != len(keys) or found != b"".join(keys):
        raise CorruptRecordError(f"{path}: {_describe_gap(found, first, stop)}; the file is damaged")
    return [v for _, v in pairs]


def _describe_gap(keys: bytes, first: int, stop: int) -> str:
    """Say which record is missing or out of place in a run whose keys did not match."""
    if len(keys) % 8 == 0:
        got = np.frombuffer(keys, ">u8")
        want = np.arange(first, first + len(got), dtype=np.uint64)
        bad = np.flatnonzero(got != want)
        if len(bad):
            i = int(bad[0])
            return f"record {first + i} is missing or out of place (found key {int(got[i])})"
        if len(got) < stop - first:
            return f"records {first + len(got)} to {stop - 1} are missing"
    return f"records {first} to {stop - 1} do not have well-formed keys"
