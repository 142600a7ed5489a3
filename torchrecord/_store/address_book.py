"""Where a file's checked records lie in LMDB's map, kept across a process's passes over the file.

The fixed-layout path (``fastread``) finds a window's long records with a cursor walk, a step a record with
its key checked, and checks every record against the layout's template where it lies. A record's place in
the map does not change while its environment is open and every walk reads the same snapshot: the file is
mapped once, read-only, and LMDB never changes a page of a committed snapshot (a writer's commit makes a
new snapshot, with another transaction id). So a record found and checked once is remembered here by its
address, and a later pass in the same process (the next epoch at 0 workers, or in a persistent worker)
takes the addresses of a piece's records from here: one array lookup a piece instead of a cursor step and
a key check a record, and no second template check.

A book is kept per environment (a weak key: it goes with the environment, whose map the addresses point
into) for its records database, in the process that made it, for the snapshot it was made under: a walk of
another snapshot starts a new book. Only where a record lies is kept: a walk that checks checksums still
reads each record's stored CRC-32 and checks the record against it on every pass (``Walk.found``).

A book costs 8 bytes a record, in the pages its records touch. A database of more than :data:`BOOK_LIMIT`
records (at least 64 GiB of records of 4 KiB or more: a set larger than memory, whose reads wait on the disk
rather than on the walk) gets an empty book: every pass walks it.
"""

from __future__ import annotations

import os
import weakref

import lmdb
import numpy as np

from torchrecord._store.walk import Walk

__all__ = ["AddressBook", "BOOK_LIMIT", "book_of"]

#: Records a book is kept for at most (128 MiB of addresses).
BOOK_LIMIT = 1 << 24


class AddressBook:
    """The map address of each record of one snapshot of a records database that was found and checked."""

    def __init__(self, records: int, snapshot: int) -> None:
        self.snapshot = snapshot
        self.pid = os.getpid()
        self.addresses = np.zeros(records, np.int64)  # 0: not found and checked yet

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
