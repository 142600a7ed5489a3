"""Check an LMDB data file's page structure in pure Python, before liblmdb maps it.

liblmdb trusts its file: one node pointer set to 0xFFFF, one overflow size set to
0xFFFFFFFF or one branch child pointing at the wrong page makes it read outside its
map (SIGSEGV, SIGBUS), fail an assertion (SIGABRT), or walk a page twice and return
duplicated records. :func:`check_structure` reads the file with ``pread``, page by
page, and checks everything a read-only liblmdb 0.9 walk (64-bit build, the one
py-lmdb bundles) relies on, so that a file which passes can be mapped safely:

* both meta pages (flags, magic, version, page size), and the one liblmdb picks
  (the larger transaction id, page 0 on a tie): its last page inside the file;
* every tree reachable from it: the free-page database, the main database, and each
  named database (an ``F_SUBDATA`` node in the main database holding an ``MDB_db``);
* every page number inside ``2 .. last page``; no page reached twice (no cycles, no
  shared pages, no overlapping overflow runs); each page's header naming its own
  number and the right kind (branch above ``md_depth``, leaf at it, overflow);
* free-space bounds, and node pointers that tile the node area exactly (no node
  outside its page, no two overlapping, no gap); node flags of the right kind;
* overflow runs inside the file, of overflow pages, long enough for the node's size;
* keys strictly increasing within and across pages and inside the range their
  parent's separator keys give them; branch pages with at least two children;
* entry, depth and page counts equal to the ``MDB_db`` record's.

Damage is reported by :class:`~torchrecord.errors.StructureError` naming the file,
the page and what is wrong. Time and memory are O(file size): every tree page is
read once (with ``pread``, never mapped), overflow pages only for their header, and
the walk keeps one byte per page, one page per level (at most 32 levels) and a batch
of 256 leaf pages, whose checks run vectorized with NumPy (the scalar code is the
reference: a batch that fails anything is checked again by it, for the message).
Nothing a file claims sizes an allocation before it is checked against the file.

Cost, CPU seconds on the project machine (warm page cache): about 0.7 s per 100 MB
of tiny records (800,000 records of 72 bytes plus their CRCs: 1.6 million entries),
0.1 s per 100 MB of 3 KB records (small images: one overflow run each), 0.01 s per
100 MB of 150 KB records. The cost follows the number of entries, not the bytes.

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

import operator
import os
import stat
import struct
import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from torchrecord.errors import NotARecordSetError, RecordNotFoundError, StructureError

__all__ = ["DatabaseInfo", "NodeInfo", "PageInfo", "StructureInfo", "check_structure", "describe"]

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
_ENV_FLAGS = 0x01 | 0x4000
P_INVALID = (1 << 64) - 1
MDB_MAGIC = 0xBEEFC0DE
MDB_DATA_VERSION = 1
#: liblmdb's cursor stack: a deeper tree fails with MDB_CURSOR_FULL
CURSOR_STACK = 32
MIN_PAGE_SIZE = 512
#: MAX_PAGESIZE of a non-MDB_DEVEL build
MAX_PAGE_SIZE = 0x8000
_PAGE_KIND = {P_BRANCH: "branch", P_LEAF: "leaf", P_OVERFLOW: "overflow", P_META: "meta"}

_HEADER = struct.Struct("=QHHHH")  # mp_pgno, mp_pad, mp_flags, mp_lower, mp_upper
_OVERFLOW_PAGES = struct.Struct("=I")  # mp_pages, where mp_lower/mp_upper are
_NODE = struct.Struct("=HHHH")  # mn_lo, mn_hi, mn_flags, mn_ksize
_DB = struct.Struct("=IHHQQQQQ")  # md_pad, md_flags, md_depth, branch, leaf, overflow, entries, root
_PGNO = struct.Struct("=Q")
_META_HEAD = struct.Struct("=II")  # mm_magic, mm_version
_META_DBS = PAGEHDRSZ + 24  # offset of mm_dbs in a meta page
_META_TAIL = struct.Struct("=QQ")  # mm_last_pg, mm_txnid
_META_TAIL_AT = _META_DBS + 2 * _DB.size
_META_END = _META_TAIL_AT + _META_TAIL.size  # bytes of a meta page liblmdb reads


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


def check_structure(path: str | os.PathLike[str]) -> StructureInfo:
    """Check the LMDB page structure of the file at ``path`` without mapping it.

    Returns what it saw (page size, the snapshot, every named database's entries);
    raises :class:`StructureError` naming the page and the damage, ``NotARecordSetError``
    for a file that is not LMDB at all, ``RecordNotFoundError`` for a missing path.
    Never maps the file, so a file truncated meanwhile gives an error, not SIGBUS.
    """
    return _run(os.fspath(path), None)


def describe(path: str | os.PathLike[str]) -> list[PageInfo]:
    """Every page the check reached, with its nodes, in walk order (for tests and tools).

    Runs the same checks as :func:`check_structure` and raises the same errors.
    """
    pages: list[PageInfo] = []
    _run(os.fspath(path), pages)
    return pages


def _run(path: str, pages: list[PageInfo] | None) -> StructureInfo:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: a FIFO must not block
    except FileNotFoundError:
        raise RecordNotFoundError(f"{path}: no record set here (write one with torchrecord.write_record)") from None
    except OSError as exc:
        raise NotARecordSetError(f"{path}: cannot open it: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARecordSetError(f"{path}: not a regular file, so not a record set")
        return _Walker(path, fd, st.st_size, pages).run()
    finally:
        os.close(fd)


@dataclass
class _Db:
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
    named: list[tuple[bytes, _Db]] = field(default_factory=list)  # main: the named databases in key order

    @classmethod
    def parse(cls, data: bytes, offset: int, label: str, kind: str, home: int) -> _Db:
        pad, flags, depth, branch, leaf, overflow, entries, root = _DB.unpack_from(data, offset)
        return cls(label, pad, flags, depth, branch, leaf, overflow, entries, root, kind, home)

    def info(self) -> DatabaseInfo:
        root = None if self.root == P_INVALID else self.root
        return DatabaseInfo(self.entries, self.depth, root, self.branch_pages, self.leaf_pages, self.overflow_pages)


_Key = bytes | int
#: a page to visit: (page, level, lower key bound, upper key bound, (parent page, child index) or None)
_Visit = tuple[int, int, "_Key | None", "_Key | None", "tuple[int, int] | None"]
#: leaf pages checked together by the vectorized path
_BATCH_PAGES = 256


@dataclass
class _Walk:
    """The state of one database's walk."""

    db: _Db
    counts: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # branch, leaf, overflow pages, entries
    previous: list[_Key | None] = field(default_factory=lambda: [None])  # the last leaf key seen
    batch: list[_Visit] = field(default_factory=list)  # leaf pages waiting for the vectorized check


class _Walker:
    """One check of one open file; raises StructureError at the first damage."""

    def __init__(self, path: str, fd: int, size: int, pages: list[PageInfo] | None, vector: bool = True) -> None:
        self.path = path
        self.vector = vector
        self.fd = fd
        self.size = size
        self.collect = pages
        self.psize = 0
        self.last = 0
        self.visited = np.zeros(0, dtype=np.uint8)

    # -- errors ------------------------------------------------------------

    def fail(self, problem: str, pgno: int | None = None, where: str = "") -> NoReturn:
        at = "" if pgno is None else f" page {pgno}" + (f" ({where})" if where else "")
        raise StructureError(
            f"{self.path}: damaged LMDB structure at{at or ' the meta pages'}: {problem}; {StructureError.HINT}"
        )

    # -- meta pages ----------------------------------------------------------

    def _read(self, offset: int, length: int) -> bytes:
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            self.fail(f"the file ends at byte {self.size}, before byte {offset + length} (was it truncated?)")
        return data

    def _meta(self, number: int, offset: int) -> tuple[int, int, _Db, _Db, int, int]:
        data = self._read(offset, _META_END)
        pgno, _pad, flags, _lower, _upper = _HEADER.unpack_from(data)
        magic, version = _META_HEAD.unpack_from(data, PAGEHDRSZ)
        if magic != MDB_MAGIC:
            if number == 0:
                raise NotARecordSetError(f"{self.path}: not an LMDB file (no LMDB magic number), so not a record set")
            self.fail(f"meta page 1 has magic 0x{magic:08x}, not LMDB's 0x{MDB_MAGIC:08x}", 1, "meta page")
        if flags != P_META or pgno != number:
            self.fail(f"the header says page {pgno} with flags 0x{flags:04x}, not meta page {number}", number, "meta")
        if version != MDB_DATA_VERSION:
            self.fail(f"LMDB data format version {version}, this liblmdb reads {MDB_DATA_VERSION}", number, "meta")
        free = _Db.parse(data, _META_DBS, "free-page database", "free", number)
        main = _Db.parse(data, _META_DBS + _DB.size, "main database", "main", number)
        last, txnid = _META_TAIL.unpack_from(data, _META_TAIL_AT)
        return free.pad, free.flags, free, main, last, txnid

    def _metas(self) -> tuple[int, _Db, _Db, int]:
        if self.size < _META_END:
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
        if not flags & MDB_INTEGERKEY or flags & ~(MDB_INTEGERKEY | _ENV_FLAGS):
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

    # -- trees -----------------------------------------------------------------

    def run(self) -> StructureInfo:
        number, free, main, txnid = self._metas()
        self.visited = np.zeros(self.last + 1, dtype=np.uint8)  # one byte per page: reached yet?
        self.visited[0:2] = 1
        self._walk(free)
        self._walk(main)
        named: dict[bytes, DatabaseInfo] = {}
        for name, db in main.named:
            self._walk(db)
            named[name] = db.info()
        return StructureInfo(self.path, self.psize, self.last, txnid, number, main.info(), named)

    def _take(self, pgno: int, where: str) -> bytes:
        """Claim tree page ``pgno`` (in range, first visit) and read it."""
        if not 2 <= pgno <= self.last:
            self.fail(f"page number {pgno} is outside the data pages 2..{self.last}", pgno, where)
        if self.visited[pgno]:
            self.fail("the page is reached a second time (a cycle, or a page shared by two parents)", pgno, where)
        self.visited[pgno] = 1
        return self._read(pgno * self.psize, self.psize)

    def _walk(self, db: _Db) -> None:
        where = db.label
        record = f"the record of the {where}"
        if db.root == P_INVALID:
            if db.depth or db.entries or db.branch_pages or db.leaf_pages or db.overflow_pages:
                self.fail(
                    f"{where} is empty (no root) but its record says depth {db.depth}, {db.entries} entries, "
                    f"{db.branch_pages + db.leaf_pages + db.overflow_pages} pages",
                    db.home,
                    record,
                )
            return
        if not 1 <= db.depth <= CURSOR_STACK:
            self.fail(f"{where} has depth {db.depth}, outside 1..{CURSOR_STACK}", db.home, record)
        walk = _Walk(db)
        # leaf pages of a named database go through the vectorized check in batches, in walk order
        batched = self.vector and db.kind == "named" and self.collect is None
        # (page, level, lower bound, upper bound, how we got here): a depth-first walk, left to right
        stack: list[_Visit] = [(db.root, 1, None, None, None)]
        while stack:
            visit = stack.pop()
            if batched and visit[1] == db.depth:
                walk.batch.append(visit)
                if len(walk.batch) >= _BATCH_PAGES:
                    self._leaf_batch(walk)
            else:
                self._visit(walk, visit, stack)
        if walk.batch:
            self._leaf_batch(walk)
        expected = [db.branch_pages, db.leaf_pages, db.overflow_pages, db.entries]
        names = ["branch pages", "leaf pages", "overflow pages", "entries"]
        for name, found, claimed in zip(names, walk.counts, expected):
            if found != claimed:
                self.fail(f"{where} holds {found} {name}, its record says {claimed}", db.home, record)

    def _visit(self, walk: _Walk, visit: _Visit, stack: list[_Visit]) -> None:
        """Check one tree page (the reference, scalar path)."""
        db = walk.db
        pgno, level, low, high, via = visit
        kind = "leaf" if level == db.depth else "branch"
        here = _where(db, level, via)
        page = self._take(pgno, here)
        head_pgno, _pad, flags, _lower, _upper = _HEADER.unpack_from(page)
        if head_pgno != pgno:
            self.fail(f"its header says page {head_pgno} (a page copied or moved here)", pgno, here)
        want = P_LEAF if kind == "leaf" else P_BRANCH
        if flags != want:
            self.fail(
                f"page flags 0x{flags:04x} where a {kind} page (0x{want:04x}) must be "
                f"({_PAGE_KIND.get(flags, 'unknown kind')})",
                pgno,
                here,
            )
        nodes = self._nodes(page, pgno, here, kind == "leaf")
        if kind == "branch":
            self._branch(db, page, pgno, here, level, nodes, low, high, stack)
            walk.counts[0] += 1
        else:
            self._leaf(db, page, pgno, here, level, nodes, low, high, walk.previous, walk.counts)
            walk.counts[1] += 1
            walk.counts[3] += len(nodes)

    def _nodes(self, page: bytes, pgno: int, here: str, leaf: bool) -> list[tuple[int, int, int, int, int]]:
        """The page's nodes (offset, lo|hi<<16, flags, key size, size): they must tile [upper, page end)."""
        psize = self.psize
        _pgno, _pad, _flags, lower, upper = _HEADER.unpack_from(page)
        if lower < PAGEHDRSZ or lower & 1 or lower > upper or upper > psize:
            self.fail(
                f"free-space bounds lower={lower} upper={upper} are impossible in a {psize}-byte page", pgno, here
            )
        count = (lower - PAGEHDRSZ) >> 1
        pointers = struct.unpack_from(f"={count}H", page, PAGEHDRSZ)
        if count and (min(pointers) < upper or max(pointers) > psize - NODESIZE):
            index = next(i for i, offset in enumerate(pointers) if not upper <= offset <= psize - NODESIZE)
            self.fail(f"node {index}'s pointer {pointers[index]} is outside the node area {upper}..{psize}", pgno, here)
        nodes: list[tuple[int, int, int, int, int]] = [(0, 0, 0, 0, 0)] * count
        position = upper
        for index in sorted(range(count), key=pointers.__getitem__):
            offset = pointers[index]
            if offset != position:
                problem = "overlaps the node before it" if offset < position else "leaves a gap after the node before"
                self.fail(f"node {index} at offset {offset} {problem} (which ends at {position})", pgno, here)
            lo, hi, flags, ksize = _NODE.unpack_from(page, offset)
            size = lo | hi << 16
            body = (_PGNO.size if flags & F_BIGDATA else size) if leaf else 0
            end = offset + NODESIZE + ksize + body
            if end > psize:
                self.fail(
                    f"node {index} at offset {offset} (key {ksize} bytes, data {body} bytes) ends at byte {end}, "
                    f"past the page's {psize}",
                    pgno,
                    here,
                )
            position = end + (end & 1)
            nodes[index] = (offset, size, flags, ksize, lo | hi << 16 | flags << 32)
        if position != psize:
            self.fail(
                f"the nodes end at offset {position}, leaving {psize - position} bytes before the page end", pgno, here
            )
        return nodes

    def _key(self, db: _Db, page: bytes, offset: int, ksize: int, pgno: int, here: str, index: int) -> _Key:
        key = page[offset + NODESIZE : offset + NODESIZE + ksize]
        if db.kind != "free":
            return key
        if ksize != 8:
            self.fail(f"node {index} has a {ksize}-byte key; free-page database keys are 8-byte ids", pgno, here)
        return int.from_bytes(key, sys.byteorder)

    def _bounds(self, key: _Key, low: _Key | None, high: _Key | None, pgno: int, here: str, index: int) -> None:
        if low is not None and key < low:  # type: ignore[operator]
            self.fail(
                f"node {index}'s key {_show(key)} is below {_show(low)}, the parent's separator key for this "
                "page (keys out of order across pages)",
                pgno,
                here,
            )
        if high is not None and key >= high:  # type: ignore[operator]
            self.fail(
                f"node {index}'s key {_show(key)} is not below {_show(high)}, the next page's separator key "
                "(keys out of order across pages)",
                pgno,
                here,
            )

    def _branch(
        self,
        db: _Db,
        page: bytes,
        pgno: int,
        here: str,
        level: int,
        nodes: list[tuple[int, int, int, int, int]],
        low: _Key | None,
        high: _Key | None,
        stack: list[_Visit],
    ) -> None:
        count = len(nodes)
        if count < (1 if db.kind == "free" else 2):
            self.fail(f"a branch page with {count} children (liblmdb asserts at least 2)", pgno, here)
        # separator keys: node i > 0 starts child i's range; node 0's key is not used
        separators = [
            self._key(db, page, offset, ksize, pgno, here, index)
            for index, (offset, _size, _flags, ksize, _child) in enumerate(nodes)
            if index
        ]
        if not (
            all(map(operator.lt, separators, separators[1:]))
            and (low is None or not separators or separators[0] >= low)  # type: ignore[operator]
            and (high is None or not separators or separators[-1] < high)  # type: ignore[operator]
        ):
            for index, key in enumerate(separators, 1):
                self._bounds(key, low, high, pgno, here, index)
                if index > 1 and key <= separators[index - 2]:  # type: ignore[operator]
                    self.fail(
                        f"separator key {index} ({_show(key)}) is not above key {index - 1} "
                        f"({_show(separators[index - 2])})",
                        pgno,
                        here,
                    )
        keys: list[_Key | None] = [low, *separators, high]
        children = [node[4] for node in nodes]
        if min(children) < 2 or max(children) > self.last:
            index, child = next((i, c) for i, c in enumerate(children) if not 2 <= c <= self.last)
            self.fail(f"child {index} is page {child}, outside the data pages 2..{self.last}", pgno, here)
        # pushed right to left, so child 0 is visited first
        stack.extend((children[i], level + 1, keys[i], keys[i + 1], (pgno, i)) for i in range(count - 1, -1, -1))
        if self.collect is not None:
            infos = tuple(NodeInfo(i, node[0], node[2], node[3], 0, node[4]) for i, node in enumerate(nodes))
            self.collect.append(PageInfo(pgno, "branch", db.label, level, infos))

    def _leaf(
        self,
        db: _Db,
        page: bytes,
        pgno: int,
        here: str,
        level: int,
        nodes: list[tuple[int, int, int, int, int]],
        low: _Key | None,
        high: _Key | None,
        previous: list[_Key | None],
        counts: list[int],
    ) -> None:
        if not nodes:
            self.fail("an empty leaf page (liblmdb never leaves one in a tree)", pgno, here)
        infos = []
        for index, (offset, size, flags, ksize, _raw) in enumerate(nodes):
            key = self._key(db, page, offset, ksize, pgno, here, index)
            self._bounds(key, low, high, pgno, here, index)
            if previous[0] is not None and key <= previous[0]:  # type: ignore[operator]
                what = "the previous key" if index else "the last key of the previous leaf page"
                self.fail(
                    f"node {index}'s key {_show(key)} is not above {what} {_show(previous[0])} "
                    "(keys out of order, or a record repeated)",
                    pgno,
                    here,
                )
            previous[0] = key
            data = offset + NODESIZE + ksize
            child = None
            if flags & F_SUBDATA and db.kind == "main":
                if flags != F_SUBDATA or size != _DB.size:
                    self.fail(
                        f"node {index} (named database {_show(key)}) has flags 0x{flags:x} and {size} data "
                        f"bytes, not a {_DB.size}-byte F_SUBDATA record",
                        pgno,
                        here,
                    )
                sub = _Db.parse(page, data, f"database {_show(key)}", "named", pgno)
                if sub.flags:
                    self.fail(
                        f"database {_show(key)} has flags 0x{sub.flags:04x} (dupsort, integer keys, ...); "
                        "torchrecord's databases have none",
                        pgno,
                        here,
                    )
                db.named.append((page[data - ksize : data], sub))
            elif flags == F_BIGDATA:
                (child,) = _PGNO.unpack_from(page, data)
                counts[2] += self._overflow(child, size, pgno, f"{here}, node {index}")
            elif flags:
                self.fail(
                    f"node {index} has flags 0x{flags:x}; only F_BIGDATA (0x1) can be here "
                    "(F_DUPDATA/F_SUBDATA are not used)",
                    pgno,
                    here,
                )
            infos.append(NodeInfo(index, offset, flags, ksize, size, child))
        if self.collect is not None:
            self.collect.append(PageInfo(pgno, "leaf", db.label, level, tuple(infos)))

    def _leaf_batch(self, walk: _Walk) -> None:
        """Check a batch of leaf pages with NumPy; if anything looks wrong, re-check them with
        the scalar path, which is the reference and raises the precise error."""
        batch, walk.batch = walk.batch, []
        if not self._leaf_batch_passes(walk, batch):
            for visit in batch:
                self._visit(walk, visit, [])

    def _leaf_batch_passes(self, walk: _Walk, batch: list[_Visit]) -> bool:
        """The scalar leaf checks, vectorized over ``batch``; state changes only if they all pass."""
        psize, count, half_page = self.psize, len(batch), self.psize // 2
        if not all(2 <= visit[0] <= self.last for visit in batch):
            return False
        pgnos = np.fromiter((visit[0] for visit in batch), dtype=np.int64, count=count)
        if self.visited[pgnos].any() or np.unique(pgnos).size != count:
            return False
        buffer = bytearray(count * psize)
        if not self._read_pages(pgnos, buffer):
            return False
        u8 = np.frombuffer(buffer, dtype=np.uint8)
        u16 = u8.view(np.uint16)
        rows = u16.reshape(count, half_page)
        head = u8.reshape(count, psize)[:, :8].copy().view(np.uint64)[:, 0]
        lower = rows[:, 6].astype(np.int64)
        upper = rows[:, 7].astype(np.int64)
        good = (head == pgnos.astype(np.uint64)) & (rows[:, 5] == P_LEAF) & (lower >= PAGEHDRSZ + 2)
        if not (good & (lower & 1 == 0) & (lower <= upper) & (upper <= psize)).all():
            return False
        # every node of the batch, in (page, index) order; u16 offsets into the whole buffer
        nodes = (lower - PAGEHDRSZ) >> 1
        total = int(nodes.sum())
        page = np.repeat(np.arange(count), nodes)
        starts = np.cumsum(nodes) - nodes
        lasts = starts + nodes - 1
        base = page * half_page
        pointer = u16[base + PAGEHDRSZ // 2 + np.arange(total) - starts[page]].astype(np.int64)
        if not ((pointer >= upper[page]) & (pointer <= psize - NODESIZE) & (pointer & 1 == 0)).all():
            return False
        header = u16[(base + (pointer >> 1))[:, None] + np.arange(4)].astype(np.int64)  # lo, hi, flags, ksize
        flags = header[:, 2]
        if (flags > F_BIGDATA).any():
            return False
        big = flags == F_BIGDATA
        size = header[:, 0] | header[:, 1] << 16
        ksize = header[:, 3]
        end = pointer + NODESIZE + ksize + np.where(big, _PGNO.size, size)
        if (end > psize).any():
            return False
        # the nodes tile [upper, page end): sorted by offset, each starts where the previous one ends
        even_end = end + (end & 1)
        inner = np.ones(total, dtype=bool)  # inner[j]: node j + 1 is on node j's page
        inner[lasts] = False
        pairs = inner[:-1]
        if (pointer[1:][pairs] < pointer[:-1][pairs]).all():
            # the usual layout (appended keys): node 0 at the page end, each next node right below it
            if not ((pointer[lasts] == upper).all() and (even_end[starts] == psize).all()):
                return False
            if not (even_end[1:][pairs] == pointer[:-1][pairs]).all():
                return False
        else:
            order = np.lexsort((pointer, page))
            begins, ends = pointer[order], even_end[order]
            if not ((begins[starts] == upper).all() and (ends[lasts] == psize).all()):
                return False
            if not (begins[1:][pairs] == ends[:-1][pairs]).all():
                return False
        # keys strictly increasing across the whole batch, and inside each page's bounds
        key_at = page * psize + pointer + NODESIZE
        last_key = self._keys_pass(walk, batch, u8, memoryview(buffer), key_at, ksize, starts, lasts)
        if last_key is None:
            return False
        # overflow runs: inside the file, of overflow pages, long enough, overlapping nothing
        runs = np.flatnonzero(big)
        firsts = np.zeros(0, dtype=np.int64)
        lengths = np.zeros(0, dtype=np.int64)
        if runs.size:
            firsts_u = u8[(key_at[runs] + ksize[runs])[:, None] + np.arange(8)].copy().view(np.uint64)[:, 0]
            if (firsts_u < 2).any() or (firsts_u > self.last).any():
                return False
            firsts = firsts_u.astype(np.int64)
            heads = bytearray(PAGEHDRSZ * runs.size)
            if not self._read_pages(firsts, heads, PAGEHDRSZ):
                return False
            heads8 = np.frombuffer(heads, dtype=np.uint8).reshape(runs.size, PAGEHDRSZ)
            heads16 = heads8.view(np.uint16)
            lengths = heads8[:, 12:16].copy().view(np.uint32)[:, 0].astype(np.int64)
            if int(lengths.sum()) > self.last + 1:  # they would overlap; and this bounds the array below
                return False
            need = (PAGEHDRSZ - 1 + size[runs]) // psize + 1  # OVPAGES
            ok = (heads8[:, :8].copy().view(np.uint64)[:, 0] == firsts_u) & (heads16[:, 5] == P_OVERFLOW)
            if not (ok & (lengths >= need) & (firsts + lengths <= self.last + 1)).all():
                return False
            covered = np.repeat(firsts - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
            if self.visited[covered].any() or np.isin(covered, pgnos).any() or np.unique(covered).size != covered.size:
                return False
            self.visited[covered] = 1
        # all passed: commit
        walk.previous[0] = last_key
        self.visited[pgnos] = 1
        walk.counts[1] += count
        walk.counts[2] += int(lengths.sum())
        walk.counts[3] += total
        return True

    def _keys_pass(
        self,
        walk: _Walk,
        batch: list[_Visit],
        u8: np.ndarray[Any, np.dtype[np.uint8]],
        view: memoryview,
        key_at: np.ndarray[Any, np.dtype[np.int64]],
        ksize: np.ndarray[Any, np.dtype[np.int64]],
        starts: np.ndarray[Any, np.dtype[np.int64]],
        lasts: np.ndarray[Any, np.dtype[np.int64]],
    ) -> bytes | None:
        """Keys strictly above the previous one and inside their page's bounds: the batch's last key, or None."""

        def key(j: int) -> bytes:
            at = int(key_at[j])
            return bytes(view[at : at + int(ksize[j])])

        total = key_at.size
        width = int(ksize[0])
        bounds = [walk.previous[0]] + [b for visit in batch for b in (visit[2], visit[3])]
        if (
            1 <= width <= 8
            and (ksize == width).all()
            and all(b is None or (isinstance(b, bytes) and len(b) == width) for b in bounds)
        ):
            # fixed-width keys (torchrecord's 8-byte big-endian indices): compare them as integers
            padded = np.zeros((total, 8), dtype=np.uint8)
            padded[:, 8 - width :] = u8[key_at[:, None] + np.arange(width)]
            values = padded.view(">u8")[:, 0].astype(np.uint64)
            if not (values[1:] > values[:-1]).all():
                return None
            as_int = [None if b is None else int.from_bytes(b, "big") for b in bounds]  # type: ignore[arg-type]
            if as_int[0] is not None and as_int[0] >= int(values[0]):
                return None
            firsts, lasts_ = values[starts].tolist(), values[lasts].tolist()
            for i in range(len(batch)):
                low, high = as_int[1 + 2 * i], as_int[2 + 2 * i]
                if (low is not None and firsts[i] < low) or (high is not None and lasts_[i] >= high):
                    return None
            return key(total - 1)
        keys = [bytes(view[a : a + k]) for a, k in zip(key_at.tolist(), ksize.tolist())]
        if not all(map(operator.lt, keys, keys[1:])):
            return None
        previous = walk.previous[0]
        if previous is not None and not previous < keys[0]:  # type: ignore[operator]
            return None
        for (_pgno, _level, low_key, high_key, _via), first, last in zip(batch, starts.tolist(), lasts.tolist()):
            if low_key is not None and keys[first] < low_key:
                return None
            if high_key is not None and keys[last] >= high_key:
                return None
        return keys[-1]

    def _read_pages(self, pgnos: np.ndarray[Any, np.dtype[np.int64]], buffer: bytearray, length: int = 0) -> bool:
        """Read ``length`` bytes (a whole page if 0) of each page into ``buffer``, one read per run
        of consecutive pages when whole pages are read; False if the file is shorter."""
        psize = self.psize
        view = memoryview(buffer)
        numbers = pgnos.tolist()
        if length:
            for i, pgno in enumerate(numbers):
                if os.preadv(self.fd, [view[i * length : (i + 1) * length]], pgno * psize) != length:
                    return False
            return True
        i = 0
        while i < len(numbers):
            j = i + 1
            while j < len(numbers) and numbers[j] == numbers[j - 1] + 1:
                j += 1
            want = (j - i) * psize
            if os.preadv(self.fd, [view[i * psize : j * psize]], numbers[i] * psize) != want:
                return False
            i = j
        return True

    def _overflow(self, first: int, size: int, pgno: int, where: str) -> int:
        """Check the overflow run at ``first`` holding ``size`` bytes; returns its length in pages."""
        if not 2 <= first <= self.last:
            self.fail(f"its overflow data is at page {first}, outside the data pages 2..{self.last}", pgno, where)
        head = self._read(first * self.psize, PAGEHDRSZ)
        head_pgno, _pad, flags, _lower, _upper = _HEADER.unpack_from(head)
        pages: int = _OVERFLOW_PAGES.unpack_from(head, 12)[0]
        here = f"overflow page for {where}"
        if head_pgno != first:
            self.fail(f"its header says page {head_pgno} (a page copied or moved here)", first, here)
        if flags != P_OVERFLOW:
            self.fail(f"page flags 0x{flags:04x} where an overflow page (0x0004) must be", first, here)
        need = (PAGEHDRSZ - 1 + size) // self.psize + 1  # OVPAGES
        if pages < need:
            self.fail(f"a run of {pages} pages cannot hold the node's {size} bytes (needs {need})", first, here)
        end = first + pages
        if end > self.last + 1:
            self.fail(f"a run of {pages} pages ends past the last page in use, {self.last}", first, here)
        if self.visited[first:end].any():
            self.fail(f"the run of {pages} pages overlaps a page reached before", first, here)
        self.visited[first:end] = 1
        if self.collect is not None:
            self.collect.append(PageInfo(first, "overflow", where, 0, (), pages))
        return pages


def _where(db: _Db, level: int, via: tuple[int, int] | None) -> str:
    kind = "leaf" if level == db.depth else "branch"
    origin = "the database record" if via is None else f"page {via[0]} child {via[1]}"
    return f"{kind} page of the {db.label} at depth {level}, reached from {origin}"


def _show(key: _Key | None) -> str:
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
