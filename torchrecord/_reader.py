"""Walk runs of consecutive records with one LMDB cursor, and mix them in a buffer."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, TypeVar

import lmdb

from torchrecord._format import decode_key, encode_key
from torchrecord.errors import CorruptRecordError

__all__ = ["iter_runs", "shuffle_buffer"]

T = TypeVar("T")


def iter_runs(
    env: lmdb.Environment, db: Any, runs: Sequence[tuple[int, int]], path: str
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(index, value)`` for every record of every run, in run order.

    One read transaction and one cursor serve the whole walk: each run is one
    ``set_range`` seek followed by sequential ``next`` steps. The first and last
    keys of each run are checked, which (keys being dense) proves none is missing.
    """
    with env.begin(db=db, buffers=False) as txn:
        cursor = txn.cursor()
        for start, stop in runs:
            if not cursor.set_range(encode_key(start)) or decode_key(cursor.key()) != start:
                raise CorruptRecordError(f"{path}: record {start} is missing")
            index = start
            for value in islice(cursor.iternext(keys=False, values=True), stop - start):
                yield index, value
                index += 1
            # the cursor rests on the last record yielded; keys are dense, so checking
            # the first and the last key of a run proves none in between is missing
            last = cursor.key()
            if index != stop or not last or decode_key(last) != stop - 1:
                raise CorruptRecordError(f"{path}: records {start} to {stop - 1} are not all present")


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
