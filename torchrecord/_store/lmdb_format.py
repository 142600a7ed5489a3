"""LMDB's on-disk structs as liblmdb 0.9 lays them out (64-bit build), and what the structure check reports.

The on-disk structs (``libraries/liblmdb/mdb.c``, mdb.RE/0.9), native byte order::

    MDB_page   pgno u64 | pad u16 | flags u16 | lower u16 | upper u16   (16 bytes; an
               overflow page has its page count u32 where lower/upper are), then the
               node pointers u16[(lower - 16) / 2]
    MDB_node   lo u16 | hi u16 | flags u16 | ksize u16 | key | data   (size EVEN'ed):
               leaf: data size = lo | hi << 16, the data (or, F_BIGDATA, its overflow
               page number u64); branch: child = lo | hi << 16 | flags << 32, no data
    MDB_db     pad u32 | flags u16 | depth u16 | branch, leaf, overflow pages,
               entries, root u64                                         (48 bytes)
    MDB_meta   magic u32 | version u32 | address u64 | mapsize u64 |
               MDB_db[free, main] | last_pg u64 | txnid u64   (after the page header)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

__all__ = [
    "CURSOR_STACK",
    "DB",
    "DatabaseInfo",
    "DbRecord",
    "ENV_FLAGS",
    "F_BIGDATA",
    "F_DUPDATA",
    "F_SUBDATA",
    "HEADER",
    "Key",
    "MAX_PAGE_SIZE",
    "MDB_DATA_VERSION",
    "MDB_INTEGERKEY",
    "MDB_MAGIC",
    "META_DBS",
    "META_END",
    "META_HEAD",
    "META_TAIL",
    "META_TAIL_AT",
    "MIN_PAGE_SIZE",
    "NODE",
    "NODESIZE",
    "NodeInfo",
    "OVERFLOW_PAGES",
    "PAGEHDRSZ",
    "PAGE_KIND",
    "PGNO",
    "P_BRANCH",
    "P_INVALID",
    "P_LEAF",
    "P_META",
    "P_OVERFLOW",
    "PageInfo",
    "StructureInfo",
    "Visit",
    "show",
]

PAGEHDRSZ = 16
NODESIZE = 8
P_BRANCH = 0x01
P_LEAF = 0x02
P_OVERFLOW = 0x04
P_META = 0x08
F_BIGDATA = 0x01
F_SUBDATA = 0x02
F_DUPDATA = 0x04
MDB_INTEGERKEY = 0x08
#: the environment flags that fit mm_flags' 16 bits: MDB_FIXEDMAP, MDB_NOSUBDIR
ENV_FLAGS = 0x01 | 0x4000
P_INVALID = (1 << 64) - 1
MDB_MAGIC = 0xBEEFC0DE
MDB_DATA_VERSION = 1
#: liblmdb's cursor stack: a deeper tree fails with MDB_CURSOR_FULL
CURSOR_STACK = 32
MIN_PAGE_SIZE = 512
#: MAX_PAGESIZE of a non-MDB_DEVEL build
MAX_PAGE_SIZE = 0x8000
PAGE_KIND = {P_BRANCH: "branch", P_LEAF: "leaf", P_OVERFLOW: "overflow", P_META: "meta"}

HEADER = struct.Struct("=QHHHH")  # mp_pgno, mp_pad, mp_flags, mp_lower, mp_upper
OVERFLOW_PAGES = struct.Struct("=I")  # mp_pages, where mp_lower/mp_upper are
NODE = struct.Struct("=HHHH")  # mn_lo, mn_hi, mn_flags, mn_ksize
DB = struct.Struct("=IHHQQQQQ")  # md_pad, md_flags, md_depth, branch, leaf, overflow, entries, root
PGNO = struct.Struct("=Q")
META_HEAD = struct.Struct("=II")  # mm_magic, mm_version
META_DBS = PAGEHDRSZ + 24  # offset of mm_dbs in a meta page
META_TAIL = struct.Struct("=QQ")  # mm_last_pg, mm_txnid
META_TAIL_AT = META_DBS + 2 * DB.size
META_END = META_TAIL_AT + META_TAIL.size  # bytes of a meta page liblmdb reads


@dataclass(frozen=True)
class DatabaseInfo:
    """One database as its ``MDB_db`` record describes it (and the walk confirmed)."""

    entries: int
    depth: int
    root: int | None
    branch_pages: int
    leaf_pages: int
    overflow_pages: int


@dataclass(frozen=True)
class StructureInfo:
    """What a successful check saw: page size, pages in use, the snapshot, the databases."""

    path: str
    page_size: int
    last_page: int
    txnid: int
    meta_page: int
    main: DatabaseInfo
    databases: dict[bytes, DatabaseInfo]


@dataclass(frozen=True)
class NodeInfo:
    """A node of a branch or leaf page (offsets within the page)."""

    index: int
    offset: int
    flags: int
    key_size: int
    size: int  # leaf: data size; branch: 0
    child: int | None  # branch: child page; F_BIGDATA leaf: first overflow page


@dataclass(frozen=True)
class PageInfo:
    """A page the walk reached: its number, kind, database, depth and nodes."""

    pgno: int
    kind: str  # "branch", "leaf" or "overflow"
    database: str
    level: int
    nodes: tuple[NodeInfo, ...] = ()
    pages: int = 1  # overflow: the run's length


@dataclass
class DbRecord:
    """An ``MDB_db`` record and where it came from."""

    label: str
    pad: int
    flags: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int
    kind: str  # "free", "main" or "named"
    home: int  # the page holding this record: a meta page, or the main database's leaf page
    named: list[tuple[bytes, DbRecord]] = field(default_factory=list)  # main: the named databases in key order

    @classmethod
    def parse(cls, data: bytes, offset: int, label: str, kind: str, home: int) -> DbRecord:
        pad, flags, depth, branch, leaf, overflow, entries, root = DB.unpack_from(data, offset)
        return cls(label, pad, flags, depth, branch, leaf, overflow, entries, root, kind, home)

    def info(self) -> DatabaseInfo:
        root = None if self.root == P_INVALID else self.root
        return DatabaseInfo(self.entries, self.depth, root, self.branch_pages, self.leaf_pages, self.overflow_pages)


Key = bytes | int
#: a page to visit: (page, level, lower key bound, upper key bound, (parent page, child index) or None)
Visit = tuple[int, int, "Key | None", "Key | None", "tuple[int, int] | None"]


def show(key: Key | None) -> str:
    if isinstance(key, int):
        return str(key)
    if key is None:
        return "(none)"
    text = key[:16].hex()
    return (
        f"0x{text}{'...' if len(key) > 16 else ''} ({len(key)} bytes)"
        if not key.isascii() or not key.isalnum()
        else repr(key.decode())
    )
