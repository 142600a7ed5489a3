"""Append records to a fresh LMDB file: growing map, bounded commits, no guessing.

Owned by exactly one process. Keys must be appended in increasing order.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lmdb
import numpy as np

from torchrecord._core.crc import crc32, crc32_joined
from torchrecord._store.format import (
    CRC_BLOCK,
    CRC_BLOCK_BYTES,
    CRC_BLOCKS_KEY,
    CRC_DB,
    MAX_DBS,
    META_DB,
    META_KEY,
    RECORDS_DB,
    encode_key,
    encode_keys,
)
from torchrecord.errors import WriteError

__all__ = ["CrcBlocks", "LmdbAppender", "space_hint"]

_CRC_BYTES = 4
_CRC = struct.Struct("<I")  # a record's CRC-32, as crc32(value).to_bytes(4, "little")


#: How a fresh file is opened for writing: one file, private to this process until it is published (no lock
#: file, no syncs: a failed write leaves nothing to recover), no read-ahead and no zeroing of new pages.
_PRIVATE_FILE: dict[str, Any] = {
    "subdir": False,
    "max_dbs": MAX_DBS,
    "lock": False,
    "sync": False,
    "metasync": False,
    "readahead": False,
    "meminit": False,
    "map_async": False,
}


class LmdbAppender:
    """Appends (index, value) records and their CRCs; grows the map on MapFullError.

    Args:
        path: the LMDB data file to create (its lock file is ``path + "-lock"``).
        initial_map_size: starting map size in bytes; it doubles whenever it is full.
        commit_bytes: commit after this many value bytes, which bounds both the
            memory held for a retry and the work lost to a crash.
        checksums: also write the CRC-32 of every value to the ``crc32`` database, and that of every block
            of records (:class:`CrcBlocks`) to the ``meta`` entry ``crc32-blocks`` (at :meth:`finish`).
        name: the path to name in error messages (the target a temporary file
            will be renamed to); default ``path``.
    """

    def __init__(
        self,
        path: str,
        *,
        initial_map_size: int = 1 << 28,
        commit_bytes: int = 64 << 20,
        checksums: bool = True,
        name: str | None = None,
    ) -> None:
        self.path = path
        self.name = name or path
        self._commit_bytes = commit_bytes
        self._checksums = checksums
        # lock=False: the file is private to this process until it is renamed into
        # place, so LMDB's lock file is not needed; and on a full tmpfs, touching
        # that mmap'ed lock file kills the process with SIGBUS instead of ENOSPC.
        env = None
        existed = os.path.lexists(path)
        try:
            env = lmdb.open(path, map_size=max(initial_map_size, 1 << 16), **_PRIVATE_FILE)
            self._records = env.open_db(RECORDS_DB)
            self._crcs = env.open_db(CRC_DB)
            self._meta = env.open_db(META_DB)
        except lmdb.Error as exc:
            if env is not None:
                env.close()
            if not existed:  # do not leave a half-initialized file behind
                _remove(path)
            raise WriteError(f"{self.name}: cannot create the LMDB file: {exc}{space_hint(path)}") from exc
        self._env = env
        self._pending: list[bytes | memoryview] = []
        self._pending_bytes = 0
        self._blocks = CrcBlocks()
        self.records_written = 0
        self.bytes_written = 0
        self.map_growths = 0

    def append(self, value: bytes) -> None:
        """Queue the next record; commits when the pending chunk is large enough."""
        self._pending.append(value)
        self._pending_bytes += len(value)
        if self._pending_bytes >= self._commit_bytes:
            self.flush()

    def append_many(self, values: Sequence[bytes | memoryview]) -> None:
        """Queue several next records at once (see :meth:`append`)."""
        self._pending.extend(values)
        self._pending_bytes += sum(map(len, values))
        if self._pending_bytes >= self._commit_bytes:
            self.flush()

    @property
    def checksum_block(self) -> int:
        """Records per checksum block (the metadata's ``checksum_block``): chosen from the first records, the
        pending ones if none is committed yet."""
        return self._blocks.choose(self._pending)

    @property
    def page_size(self) -> int:
        """LMDB's page size in this file (the OS page size: 4096 on most machines)."""
        return int(self._env.stat()["psize"])

    def regroup(self, split: Callable[[int, bytes], list[bytes]]) -> None:
        """Replace every record written so far by the records ``split(index, value)`` gives, keys kept dense.

        Used once, when a write with automatic chunking meets a sample of another
        shape: each chunk becomes its samples' single records. Records still
        pending are split in memory; committed ones are rewritten in place, last
        first (record r's samples go to keys >= r, so no record is overwritten
        before it is read), in one transaction.
        """
        if not self.records_written:
            pending: list[bytes | memoryview] = [
                piece for i, value in enumerate(self._pending) for piece in split(i, bytes(value))
            ]
            self._pending = pending
            self._pending_bytes = sum(len(v) for v in pending)
            return
        self.flush()
        total = 0

        def rewrite(txn: lmdb.Transaction) -> None:
            nonlocal total
            total = 0
            for record in reversed(range(self.records_written)):
                key = encode_key(record)
                value = txn.get(key, db=self._records)
                if value is None:
                    raise WriteError(f"{self.name}: record {record} vanished while regrouping")
                pieces = split(record, bytes(value))
                first = record * len(pieces)  # every committed record is a full chunk
                for j, piece in enumerate(pieces):
                    txn.put(encode_key(first + j), piece, db=self._records)
                    if self._checksums:
                        txn.put(encode_key(first + j), crc32(piece).to_bytes(_CRC_BYTES, "little"), db=self._crcs)
                total += len(pieces)

        self._commit(rewrite)
        self.records_written = total
        if self._checksums:  # every record changed: the block checksums again, from the records as stored
            self._blocks = CrcBlocks()
            with self._env.begin(db=self._records) as txn:
                values = txn.cursor().iternext(keys=False, values=True)
                while piece := list(itertools.islice(values, 4096)):
                    self._blocks.add(piece)

    def flush(self) -> None:
        """Commit the pending records, growing the map and retrying if it is full."""
        if not self._pending:
            return
        self._commit(self._put_pending)
        if self._checksums:
            self._blocks.add(self._pending)
        self.records_written += len(self._pending)
        self.bytes_written += self._pending_bytes
        self._pending.clear()
        self._pending_bytes = 0

    def put_entries(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        """Store ``entries`` (key, value) in the ``meta`` database now, in commits of about ``commit_bytes``.

        The caller keeps the format's own keys (the metadata, the group offsets) out of them.
        """
        batch: list[tuple[bytes, bytes]] = []
        held = 0

        def put(txn: lmdb.Transaction) -> None:
            for key, value in batch:
                txn.put(key, value, db=self._meta)

        for key, value in entries:
            batch.append((key, value))
            held += len(key) + len(value)
            if held >= self._commit_bytes:
                self._commit(put)
                batch, held = [], 0
        if batch:
            self._commit(put)

    def finish(self, metadata: bytes, extra: dict[bytes, bytes] | None = None) -> None:
        """Commit what is pending, then ``extra`` meta entries and the metadata in one
        transaction (so they appear together with the completeness marker), then flush
        everything to disk."""
        self.flush()
        entries = [*(extra or {}).items(), (META_KEY, metadata)]
        if self._checksums:
            entries.insert(0, (CRC_BLOCKS_KEY, self._blocks.finished()))

        def put_meta(txn: lmdb.Transaction) -> None:
            for key, value in entries:
                txn.put(key, value, db=self._meta)

        self._commit(put_meta)
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise WriteError(f"{self.name}: flushing to disk failed: {exc}{space_hint(self.path)}") from exc

    def close(self) -> None:
        self._env.close()

    def _put_pending(self, txn: lmdb.Transaction) -> None:
        keys = encode_keys(self.records_written, len(self._pending))
        # putmulti runs the put loop in C; append=True: keys arrive in increasing order
        added = txn.cursor(db=self._records).putmulti(zip(keys, self._pending), append=True)[1]
        if added != len(keys):
            raise WriteError(f"{self.name}: LMDB stored {added} of {len(keys)} records")
        if self._checksums:
            crcs = list(map(_CRC.pack, map(zlib.crc32, self._pending)))  # C-level loops
            txn.cursor(db=self._crcs).putmulti(zip(keys, crcs), append=True)

    def _commit(self, work: object) -> None:
        while True:
            txn = self._env.begin(write=True)
            try:
                work(txn)  # type: ignore[operator]
                txn.commit()
                return
            except lmdb.MapFullError:
                txn.abort()
                self._grow()
            except lmdb.Error as exc:
                txn.abort()
                raise WriteError(f"{self.name}: LMDB write failed: {exc}{space_hint(self.path)}") from exc
            except BaseException:
                txn.abort()
                raise

    def _grow(self) -> None:
        new_size = self._env.info()["map_size"] * 2
        try:
            self._env.set_mapsize(new_size)
        except lmdb.Error as exc:
            raise WriteError(f"{self.name}: cannot grow the LMDB map to {new_size} bytes: {exc}") from exc
        self.map_growths += 1


class CrcBlocks:
    """The CRC-32 of each block of consecutive records (the values joined), fed the records in order.

    The block size is chosen from the first records: about :data:`CRC_BLOCK_BYTES` of them, at most
    :data:`CRC_BLOCK` records (so a reader's runs, which start and end anywhere, cover many blocks whole).
    """

    def __init__(self) -> None:
        self.block: int | None = None
        self.crcs: list[int] = []
        self._crc = 0
        self._filled = 0  # records in the block being summed

    def choose(self, values: Sequence[bytes | memoryview]) -> int:
        """The block size: fixed by the first call, from the mean size of up to 1,024 of ``values``."""
        if self.block is None:
            first = values[:1024]
            mean = sum(map(len, first)) / len(first) if len(first) else 1
            self.block = int(max(1, min(CRC_BLOCK, CRC_BLOCK_BYTES // max(1, mean))))
        return self.block

    def add(self, values: Sequence[bytes | memoryview]) -> None:
        """The next records' values."""
        block = self.choose(values)
        at = 0
        while at < len(values):
            take = min(block - self._filled, len(values) - at)
            self._crc = crc32_joined(values[at : at + take], self._crc)
            self._filled += take
            at += take
            if self._filled == block:
                self.crcs.append(self._crc)
                self._crc, self._filled = 0, 0

    def finished(self) -> bytes:
        """Every block's CRC-32 (the last block possibly short), uint32 little-endian."""
        crcs = self.crcs + ([self._crc] if self._filled else [])
        return np.asarray(crcs, dtype="<u4").tobytes()


def space_hint(path: str) -> str:
    """A note on the free space where ``path`` lives, for write errors.

    LMDB reports a short write (disk full, file size limit) as a bare EIO, so
    the free space is what tells the user the likely cause.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        st = os.statvfs(directory)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free < 1 << 20:
        return f" (the disk of {directory} is full: {free} bytes free; free some space or write elsewhere)"
    return f" ({free} bytes free in {directory}; check the disk space and the file size limit, ulimit -f)"


def _remove(path: str) -> None:
    """Best-effort removal: on a read-only file system even a missing file gives EROFS."""
    with contextlib.suppress(OSError):
        os.remove(path)
