"""Where a file's checked records lie in LMDB's map, kept across a process's passes over the file.

The fixed-layout path (``fastread``) finds a window's long records with a cursor walk, a step a record with
its key checked, and checks every record against the layout's template where it lies. A record's place in
the map does not change while its environment is open and every walk reads the same snapshot: the file is
mapped once, read-only, and LMDB never changes a page of a committed snapshot (a writer's commit makes a
new snapshot, with another transaction id). So a record found and checked once is remembered here by its
address, and a later pass in the same process (the next epoch at 0 workers, or in a persistent worker)
takes the addresses of a piece's records from here: one array lookup a piece instead of a cursor step and
a key check a record, and no second template check. A window the book knows in part walks only the pieces
holding a record it does not know (:func:`booked`). A persistent worker reads another share each epoch, so
its book would fill over many: in its second pass over a cached file it walks, once, every record the book
does not know yet (``FixedWindowReader.learn_all``; :attr:`AddressBook.first_pass` tells a second pass from
the first, so a process that reads once never walks records it will not read).

A book is kept per environment (a weak key: it goes with the environment, whose map the addresses point
into) for its records database, in the process that made it, for the snapshot it was made under: a walk of
another snapshot starts a new book. Only where a record lies is kept: with checksums, every record is still
checked against its stored CRC-32 on every pass (a window known whole all at once:
``fastread.matches_stored_crcs``, ``checks_ahead.KnownChecks``; else by its walk, ``Walk.found``).

A book costs 8 bytes a record, in the pages its records touch. A database of more than :data:`BOOK_LIMIT`
records (at least 64 GiB of records of 4 KiB or more: a set larger than memory, whose reads wait on the disk
rather than on the walk) gets an empty book: every pass walks it.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import lmdb
import numpy as np

from torchrecord._store.walk import Walk

__all__ = ["AddressBook", "BOOK_LIMIT", "Booked", "book_of", "booked"]

#: Records a book is kept for at most (128 MiB of addresses).
BOOK_LIMIT = 1 << 24


class AddressBook:
    """The map address of each record of one snapshot of a records database that was found and checked."""

    def __init__(self, records: int, snapshot: int) -> None:
        self.snapshot = snapshot
        self.pid = os.getpid()
        self.addresses = np.zeros(records, np.int64)  # 0: not found and checked yet
        self.learned_all = False  # every record was walked once (``FixedWindowReader.learn_all``)
        self.first_pass: object = None  # the pass that made it (set by its reader: ``FixedWindowReader.learns_all``)

    def learn(self, first: int, addresses: np.ndarray) -> None:
        """Remember records first, first + 1, ... at ``addresses`` (a 0 leaves that record unknown); records
        past the book's end (an empty book, or a file holding more records than its database counted) are not
        kept."""
        if first + len(addresses) <= len(self.addresses):
            self.addresses[first : first + len(addresses)] = addresses


#: environment -> the book of its records database (dropped with the environment). No lock: threads reading
#: one file (MixedDataset's read-ahead) that both start its book keep one of the two, and a lock held by
#: another thread at a fork would stay held in the child.
_BOOKS: weakref.WeakKeyDictionary[lmdb.Environment, AddressBook] = weakref.WeakKeyDictionary()


def book_of(walk: Walk) -> AddressBook | None:
    """The address book of the records ``walk`` reads (an open walk of a records database with zero-copy
    values), or None where a book cannot serve it (values copied out of the map)."""
    txn = walk.txn
    if txn is None or not walk.buffers:
        return None
    snapshot = int(txn.id())
    book = _BOOKS.get(walk.env)
    if book is None or book.snapshot != snapshot or book.pid != os.getpid():
        records = int(txn.stat(walk.db)["entries"])
        book = _BOOKS[walk.env] = AddressBook(records if records <= BOOK_LIMIT else 0, snapshot)
    return book


class Booked(NamedTuple):
    """What the books know of a window's pieces (sample runs of shards), record after record, piece after piece.

    ``addresses`` holds each record's address (0 where its book does not know it yet); piece ``i``'s records
    are ``firsts[i]``, ``firsts[i] + 1``, ..., ``counts[i]`` of them, from ``row0s[i]`` on in ``addresses``.
    Row ``r`` is record ``records[r]`` of walk ``walks[owner[r]]`` (of ``walks[0]`` where ``owner`` is None).
    """

    firsts: np.ndarray
    counts: np.ndarray
    row0s: np.ndarray
    addresses: np.ndarray
    records: np.ndarray
    walks: list[Walk]
    owner: np.ndarray | None

    def stored_crcs(self) -> np.ndarray | None:
        """Each row's stored CRC-32 (uint32), from its walk's checksums held in memory (``Walk.record_crcs``);
        None where a walk holds none (no checksums, or blocks of several records)."""
        expected = np.empty(len(self.records), np.uint32)
        for i, walk in enumerate(self.walks):
            crcs = walk.record_crcs()
            rows = slice(None) if self.owner is None else self.owner == i
            wanted = self.records[rows]
            if crcs is None or (len(wanted) and int(wanted.max()) >= len(crcs)):
                return None
            expected[rows] = crcs[wanted]
        return expected

    def known_pieces(self) -> list[bool]:
        """For each piece: True when its book knows every one of its records."""
        if not len(self.firsts):
            return []
        known: list[bool] = np.logical_and.reduceat(self.addresses != 0, self.row0s).tolist()
        return known


def booked(pieces: Sequence[tuple[Walk, int, int, int]], k: int) -> Booked | None:
    """The books' addresses of the records holding ``pieces`` ((walk, samples in its shard, start, stop) in
    shard samples; ``k`` samples a record), in a few NumPy calls however many pieces; None where a walk has no
    book (values copied out of the map)."""
    firsts = np.array([start // k for _, _, start, _ in pieces], np.int64)
    counts = np.array([(stop - 1) // k + 1 for _, _, _, stop in pieces], np.int64) - firsts
    row0s = np.cumsum(counts) - counts
    records = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(firsts - row0s, counts)
    walks = list(dict.fromkeys(walk for walk, _, _, _ in pieces))
    owner = None if len(walks) == 1 else np.repeat([walks.index(walk) for walk, _, _, _ in pieces], counts)
    addresses = np.zeros(len(records), np.int64)
    for i, walk in enumerate(walks):
        book = book_of(walk)
        if book is None:
            return None
        rows = slice(None) if owner is None else owner == i
        wanted = records[rows]
        if len(wanted) and int(wanted.max()) >= len(book.addresses):  # none past a book's end (an empty book)
            inside = wanted < len(book.addresses)
            part = np.zeros(len(wanted), np.int64)
            part[inside] = book.addresses[wanted[inside]]
            addresses[rows] = part
        else:
            addresses[rows] = book.addresses[wanted]
    return Booked(firsts, counts, row0s, addresses, records, walks, owner)
