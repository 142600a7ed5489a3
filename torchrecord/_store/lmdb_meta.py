"""The file under the structure check: its reads, its errors, and LMDB's two meta pages.

liblmdb reads the meta page of the larger transaction id (page 0 on a tie) and
trusts its page size, its last page in use and its two database records; each is
checked here against the file before the walk (``_store/lmdb_check.py``) reads a tree.
"""

from __future__ import annotations

import os
from typing import NoReturn

from torchrecord._store.lmdb_format import (
    DB,
    ENV_FLAGS,
    HEADER,
    MAX_PAGE_SIZE,
    MDB_DATA_VERSION,
    MDB_INTEGERKEY,
    MDB_MAGIC,
    META_DBS,
    META_END,
    META_HEAD,
    META_TAIL,
    META_TAIL_AT,
    MIN_PAGE_SIZE,
    P_META,
    PAGEHDRSZ,
    DbRecord,
)
from torchrecord.errors import NotARecordSetError, StructureError

__all__ = ["FileCheck"]


class FileCheck:
    """One open file under check: ``pread`` reads, errors naming the page, and the meta pages."""

    def __init__(self, path: str, fd: int, size: int) -> None:
        self.path = path
        self.fd = fd
        self.size = size
        self.psize = 0  # the page size, once the meta pages passed
        self.last = 0  # the last page in use, once the meta pages passed

    # -- errors ------------------------------------------------------------

    def fail(self, problem: str, pgno: int | None = None, where: str = "") -> NoReturn:
        at = "" if pgno is None else f" page {pgno}" + (f" ({where})" if where else "")
        raise StructureError(
            f"{self.path}: damaged LMDB structure at{at or ' the meta pages'}: {problem}; {StructureError.HINT}"
        )

    # -- meta pages ----------------------------------------------------------

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset``; StructureError if the file ends before."""
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            self.fail(f"the file ends at byte {self.size}, before byte {offset + length} (was it truncated?)")
        return data

    def _meta(self, number: int, offset: int) -> tuple[int, int, DbRecord, DbRecord, int, int]:
        """Meta page ``number``: (page size, free-page database flags, free and main records, last page, txnid)."""
        data = self.read(offset, META_END)
        pgno, _pad, flags, _lower, _upper = HEADER.unpack_from(data)
        magic, version = META_HEAD.unpack_from(data, PAGEHDRSZ)
        if magic != MDB_MAGIC:
            if number == 0:
                raise NotARecordSetError(f"{self.path}: not an LMDB file (no LMDB magic number), so not a record set")
            self.fail(f"meta page 1 has magic 0x{magic:08x}, not LMDB's 0x{MDB_MAGIC:08x}", 1, "meta page")
        if flags != P_META or pgno != number:
            self.fail(f"the header says page {pgno} with flags 0x{flags:04x}, not meta page {number}", number, "meta")
        if version != MDB_DATA_VERSION:
            self.fail(f"LMDB data format version {version}, this liblmdb reads {MDB_DATA_VERSION}", number, "meta")
        free = DbRecord.parse(data, META_DBS, "free-page database", "free", number)
        main = DbRecord.parse(data, META_DBS + DB.size, "main database", "main", number)
        last, txnid = META_TAIL.unpack_from(data, META_TAIL_AT)
        return free.pad, free.flags, free, main, last, txnid

    def metas(self) -> tuple[int, DbRecord, DbRecord, int]:
        """Check both meta pages and pick liblmdb's: (its page number, free and main database records, txnid).

        Sets :attr:`psize` and :attr:`last` (the last page in use, inside the file).
        """
        if self.size < META_END:
            raise NotARecordSetError(f"{self.path}: {self.size} bytes, too short to be an LMDB file")
        psize, flags, free, main, last, txnid = self._meta(0, 0)
        if not MIN_PAGE_SIZE <= psize <= MAX_PAGE_SIZE or psize & (psize - 1):
            self.fail(f"page size {psize} is not a power of two in {MIN_PAGE_SIZE}..{MAX_PAGE_SIZE}", 0, "meta page")
        if self.size < 2 * psize:
            raise NotARecordSetError(  # as liblmdb sees it (and every reader says it)
                f"{self.path}: {self.size} bytes, less than the two {psize}-byte meta pages of an LMDB file: "
                "not an LMDB file (or truncated to its first page); copy it again from its source"
            )
        psize1, flags1, free1, main1, last1, txnid1 = self._meta(1, psize)
        if psize1 != psize:
            self.fail(f"page size {psize1} differs from meta page 0's {psize}", 1, "meta page")
        self.psize = psize
        number = 1 if txnid < txnid1 else 0  # mdb_env_pick_meta
        if number:
            flags, free, main, last, txnid = flags1, free1, main1, last1, txnid1
        where = f"meta page of transaction {txnid}, the one LMDB reads"
        if not flags & MDB_INTEGERKEY or flags & ~(MDB_INTEGERKEY | ENV_FLAGS):
            self.fail(
                f"free-page database flags 0x{flags:04x} are not LMDB's (0x0008 plus 0x4001 at most)", number, where
            )
        if main.flags:
            self.fail(
                f"main database flags 0x{main.flags:04x}: torchrecord's main database has none "
                "(with them, liblmdb cannot hold named databases)",
                number,
                where,
            )
        pages = self.size // psize
        if not 1 <= last < pages:
            self.fail(
                f"the last page in use is {last}, but the file holds pages 0..{pages - 1} "
                f"({self.size} bytes of {psize}-byte pages; truncated?)",
                number,
                where,
            )
        self.last = last
        return number, free, main, txnid
