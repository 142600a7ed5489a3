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

The parts: LMDB's structs in ``_store/lmdb_format.py``, the file's reads and meta
pages in ``_store/lmdb_meta.py``, the vectorized leaf batches in
``_store/lmdb_batch.py``; this module walks the trees with the scalar checks (the
reference), one page at a time.
"""

from __future__ import annotations

import operator
import os
import stat
import struct
import sys
from typing import NamedTuple

import numpy as np

from torchrecord._store.lmdb_batch import BATCH_PAGES, Pages, WalkState, leaf_batch_passes
from torchrecord._store.lmdb_format import (
    CURSOR_STACK,
    DB,
    F_BIGDATA,
    F_SUBDATA,
    HEADER,
    NODE,
    NODESIZE,
    OVERFLOW_PAGES,
    P_BRANCH,
    P_INVALID,
    P_LEAF,
    P_OVERFLOW,
    PAGE_KIND,
    PAGEHDRSZ,
    PGNO,
    DatabaseInfo,
    DbRecord,
    Key,
    NodeInfo,
    PageInfo,
    StructureInfo,
    Visit,
    show,
)
from torchrecord._store.lmdb_meta import FileCheck
from torchrecord.errors import NotARecordSetError, RecordNotFoundError

__all__ = ["DatabaseInfo", "NodeInfo", "PageInfo", "StructureInfo", "check_structure", "describe"]


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


class _Page(NamedTuple):
    """A tree page being checked: its database, bytes, number, name in messages, depth, nodes and key range."""

    db: DbRecord
    data: bytes
    pgno: int
    here: str
    level: int
    nodes: list[tuple[int, int, int, int, int]]  # (offset, data size, flags, key size, lo | hi << 16 | flags << 32)
    low: Key | None  # the parent's bounds: keys at or above low, below high
    high: Key | None


class _Walker(FileCheck):
    """One check of one open file: its meta pages, then every tree; raises StructureError at the first damage."""

    def __init__(self, path: str, fd: int, size: int, pages: list[PageInfo] | None, vector: bool = True) -> None:
        super().__init__(path, fd, size)
        self.vector = vector
        self.collect = pages
        self.visited = np.zeros(0, dtype=np.uint8)

    # -- trees -----------------------------------------------------------------

    def run(self) -> StructureInfo:
        number, free, main, txnid = self.metas()
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
        return self.read(pgno * self.psize, self.psize)

    def _walk(self, db: DbRecord) -> None:
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
        walk = WalkState(db)
        # leaf pages of a named database go through the vectorized check in batches, in walk order
        batched = self.vector and db.kind == "named" and self.collect is None
        # (page, level, lower bound, upper bound, how we got here): a depth-first walk, left to right
        stack: list[Visit] = [(db.root, 1, None, None, None)]
        while stack:
            visit = stack.pop()
            if batched and visit[1] == db.depth:
                walk.batch.append(visit)
                if len(walk.batch) >= BATCH_PAGES:
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

    def _leaf_batch(self, walk: WalkState) -> None:
        """Check a batch of leaf pages with NumPy (``lmdb_batch``); if anything looks wrong, re-check them
        with the scalar path, which is the reference and raises the precise error."""
        batch, walk.batch = walk.batch, []
        if not leaf_batch_passes(Pages(self.fd, self.psize, self.last, self.visited), walk, batch):
            for visit in batch:
                self._visit(walk, visit, [])

    def _visit(self, walk: WalkState, visit: Visit, stack: list[Visit]) -> None:
        """Check one tree page (the reference, scalar path)."""
        db = walk.db
        pgno, level, low, high, via = visit
        kind = "leaf" if level == db.depth else "branch"
        here = _where(db, level, via)
        page = self._take(pgno, here)
        head_pgno, _pad, flags, _lower, _upper = HEADER.unpack_from(page)
        if head_pgno != pgno:
            self.fail(f"its header says page {head_pgno} (a page copied or moved here)", pgno, here)
        want = P_LEAF if kind == "leaf" else P_BRANCH
        if flags != want:
            self.fail(
                f"page flags 0x{flags:04x} where a {kind} page (0x{want:04x}) must be "
                f"({PAGE_KIND.get(flags, 'unknown kind')})",
                pgno,
                here,
            )
        nodes = self._nodes(page, pgno, here, kind == "leaf")
        checked = _Page(db, page, pgno, here, level, nodes, low, high)
        if kind == "branch":
            self._branch(checked, stack)
            walk.counts[0] += 1
        else:
            self._leaf(checked, walk)
            walk.counts[1] += 1
            walk.counts[3] += len(nodes)

    def _nodes(self, page: bytes, pgno: int, here: str, leaf: bool) -> list[tuple[int, int, int, int, int]]:
        """The page's nodes (offset, lo|hi<<16, flags, key size, size): they must tile [upper, page end)."""
        psize = self.psize
        _pgno, _pad, _flags, lower, upper = HEADER.unpack_from(page)
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
            lo, hi, flags, ksize = NODE.unpack_from(page, offset)
            size = lo | hi << 16
            body = (PGNO.size if flags & F_BIGDATA else size) if leaf else 0
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

    def _key(self, db: DbRecord, page: bytes, offset: int, ksize: int, pgno: int, here: str, index: int) -> Key:
        key = page[offset + NODESIZE : offset + NODESIZE + ksize]
        if db.kind != "free":
            return key
        if ksize != 8:
            self.fail(f"node {index} has a {ksize}-byte key; free-page database keys are 8-byte ids", pgno, here)
        return int.from_bytes(key, sys.byteorder)

    def _bounds(self, key: Key, low: Key | None, high: Key | None, pgno: int, here: str, index: int) -> None:
        if low is not None and key < low:  # type: ignore[operator]
            self.fail(
                f"node {index}'s key {show(key)} is below {show(low)}, the parent's separator key for this "
                "page (keys out of order across pages)",
                pgno,
                here,
            )
        if high is not None and key >= high:  # type: ignore[operator]
            self.fail(
                f"node {index}'s key {show(key)} is not below {show(high)}, the next page's separator key "
                "(keys out of order across pages)",
                pgno,
                here,
            )

    def _branch(self, checked: _Page, stack: list[Visit]) -> None:
        """A branch page's separator keys and children; pushes its children onto ``stack``."""
        db, page, pgno, here, level, nodes, low, high = checked
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
                        f"separator key {index} ({show(key)}) is not above key {index - 1} "
                        f"({show(separators[index - 2])})",
                        pgno,
                        here,
                    )
        keys: list[Key | None] = [low, *separators, high]
        children = [node[4] for node in nodes]
        if min(children) < 2 or max(children) > self.last:
            index, child = next((i, c) for i, c in enumerate(children) if not 2 <= c <= self.last)
            self.fail(f"child {index} is page {child}, outside the data pages 2..{self.last}", pgno, here)
        # pushed right to left, so child 0 is visited first
        stack.extend((children[i], level + 1, keys[i], keys[i + 1], (pgno, i)) for i in range(count - 1, -1, -1))
        if self.collect is not None:
            infos = tuple(NodeInfo(i, node[0], node[2], node[3], 0, node[4]) for i, node in enumerate(nodes))
            self.collect.append(PageInfo(pgno, "branch", db.label, level, infos))

    def _leaf(self, checked: _Page, walk: WalkState) -> None:
        """A leaf page's keys (above the last leaf's) and data: named databases, overflow runs."""
        db, page, pgno, here, level, nodes, low, high = checked
        previous, counts = walk.previous, walk.counts
        if not nodes:
            self.fail("an empty leaf page (liblmdb never leaves one in a tree)", pgno, here)
        infos = []
        for index, (offset, size, flags, ksize, _raw) in enumerate(nodes):
            key = self._key(db, page, offset, ksize, pgno, here, index)
            self._bounds(key, low, high, pgno, here, index)
            if previous[0] is not None and key <= previous[0]:  # type: ignore[operator]
                what = "the previous key" if index else "the last key of the previous leaf page"
                self.fail(
                    f"node {index}'s key {show(key)} is not above {what} {show(previous[0])} "
                    "(keys out of order, or a record repeated)",
                    pgno,
                    here,
                )
            previous[0] = key
            data = offset + NODESIZE + ksize
            child = None
            if flags & F_SUBDATA and db.kind == "main":
                if flags != F_SUBDATA or size != DB.size:
                    self.fail(
                        f"node {index} (named database {show(key)}) has flags 0x{flags:x} and {size} data "
                        f"bytes, not a {DB.size}-byte F_SUBDATA record",
                        pgno,
                        here,
                    )
                sub = DbRecord.parse(page, data, f"database {show(key)}", "named", pgno)
                if sub.flags:
                    self.fail(
                        f"database {show(key)} has flags 0x{sub.flags:04x} (dupsort, integer keys, ...); "
                        "torchrecord's databases have none",
                        pgno,
                        here,
                    )
                db.named.append((page[data - ksize : data], sub))
            elif flags == F_BIGDATA:
                (child,) = PGNO.unpack_from(page, data)
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

    def _overflow(self, first: int, size: int, pgno: int, where: str) -> int:
        """Check the overflow run at ``first`` holding ``size`` bytes; returns its length in pages."""
        if not 2 <= first <= self.last:
            self.fail(f"its overflow data is at page {first}, outside the data pages 2..{self.last}", pgno, where)
        head = self.read(first * self.psize, PAGEHDRSZ)
        head_pgno, _pad, flags, _lower, _upper = HEADER.unpack_from(head)
        pages: int = OVERFLOW_PAGES.unpack_from(head, 12)[0]
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


def _where(db: DbRecord, level: int, via: tuple[int, int] | None) -> str:
    kind = "leaf" if level == db.depth else "branch"
    origin = "the database record" if via is None else f"page {via[0]} child {via[1]}"
    return f"{kind} page of the {db.label} at depth {level}, reached from {origin}"
