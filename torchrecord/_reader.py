"""The general read path: walk runs of records with one cursor, mix them in a buffer."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import lmdb

from torchrecord._fastread import check_crcs, read_records
from torchrecord._format import lmdb_errors

__all__ = ["iter_records", "shuffle_buffer"]

T = TypeVar("T")

_PIECE = 256  # records fetched per cursor step: bounds memory, amortizes the calls


def iter_records(
    env: lmdb.Environment,
    db: Any,
    runs: Sequence[tuple[int, int]],
    path: str,
    *,
    samples_per_record: int = 1,
    crc_db: Any = None,
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(record index, value)`` for the records covering each run of sample indices.

    One read transaction and one cursor serve the whole walk: a ``set_range``
    seek per piece, then sequential steps. With ``crc_db`` every value's CRC-32
    is checked against the stored one.
    """
    k = samples_per_record
    with lmdb_errors(path), env.begin(db=db, buffers=False) as txn:
        cursor = txn.cursor(db=db)
        crc_cursor = txn.cursor(db=crc_db) if crc_db is not None else None
        for start, stop in runs:
            first, last = start // k, (stop - 1) // k + 1
            for piece_start in range(first, last, _PIECE):
                piece_stop = min(last, piece_start + _PIECE)
                values = read_records(cursor, piece_start, piece_stop, path)
                if crc_cursor is not None:
                    check_crcs(values, read_records(crc_cursor, piece_start, piece_stop, path), piece_start, path)
                yield from zip(range(piece_start, piece_stop), values)


def shuffle_buffer(items: Iterable[T], size: int, seed: int) -> Iterator[T]:
    """Mix a stream through a buffer of ``size`` items (reservoir-style), deterministically.

    Each incoming item replaces a uniformly chosen buffered one, which is yielded;
    at the end the rest of the buffer is shuffled and drained.
    """
    rng = random.Random(seed)
    if size <= 1:
        yield from items
        return
    buffer: list[T] = []
    randrange = rng.randrange
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = randrange(size)
        out = buffer[j]
        buffer[j] = item
        yield out
    rng.shuffle(buffer)
    yield from buffer
