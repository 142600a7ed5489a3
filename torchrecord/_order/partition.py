"""Which records a reader visits in an epoch, in what coarse order: pure functions.

An epoch's visiting order is built in three steps, each a pure function of
(count, seed, epoch, world size, rank, number of workers, worker):

1. the index range is cut into fixed-size blocks (for a sharded set, each
   shard on its own, so no block straddles two shards), and the blocks are put
   in a seeded order (new every epoch): the coarse, global shuffle;
2. that virtual sequence (padded by wrapping around, or cut, so it divides
   evenly) is split into equal contiguous spans, one per rank;
3. a rank's span is split among its DataLoader workers on whole *units*
   (:func:`worker_unit`): the batch in batch mode; in per-sample mode the
   DataLoader's batch size when it is known, else a power of two. So every
   worker but the last holds whole batches, only one worker yields a short
   batch, and ``len(loader)`` is the number of batches the loader yields
   (:func:`loader_batches` counts them).

A reader then walks its runs of consecutive records with one LMDB cursor and
mixes them further in a shuffle buffer.
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np

from torchrecord.errors import ArgumentError

__all__ = [
    "auto_block_size",
    "block_order",
    "block_stops",
    "loader_batches",
    "rank_span",
    "reader_runs",
    "reader_seed",
    "samples_per_rank",
    "worker_span",
    "worker_unit",
]

#: The largest unit per-sample mode cuts worker shares on when the DataLoader's batch size is not known.
MAX_SAMPLE_UNIT = 4096

Run = tuple[int, int]


def auto_block_size(count: int) -> int:
    """A block size giving about 256 blocks, kept within [16, 4096] records."""
    return int(min(4096, max(16, count // 256)))


def block_order(
    count: int, block_size: int, seed: int, epoch: int, shuffle: bool, bounds: np.ndarray | None = None
) -> np.ndarray:
    """The start index of every block, in the order this epoch visits them.

    ``bounds`` are the shard offsets ``[0, c0, c0 + c1, ..., count]`` of a sharded
    set: blocks then restart at each shard, so none straddles two (None: one shard).
    """
    if bounds is None or len(bounds) <= 2:
        starts = np.arange(0, count, block_size, dtype=np.int64)
    else:
        pieces = [np.arange(lo, hi, block_size, dtype=np.int64) for lo, hi in itertools.pairwise(bounds)]
        starts = np.concatenate(pieces)
    if shuffle:
        rng = np.random.default_rng(np.random.SeedSequence([seed, epoch, 0x626C6F63]))
        starts = starts[rng.permutation(len(starts))]
    return starts


def block_stops(starts: np.ndarray, count: int, block_size: int, bounds: np.ndarray | None = None) -> np.ndarray:
    """The end of each block starting at ``starts``: a block ends at ``block_size``, its shard's end or ``count``."""
    if bounds is None or len(bounds) <= 2:
        limit: np.ndarray | int = count
    else:
        ends = np.asarray(bounds[1:], dtype=np.int64)
        limit = ends[np.searchsorted(ends, starts, side="right")]
    stops: np.ndarray = np.minimum(starts + block_size, limit)
    return stops


def samples_per_rank(count: int, world_size: int, drop_last: bool) -> int:
    """How many samples each rank yields per epoch (equal on every rank)."""
    if drop_last:
        return count // world_size
    return -(-count // world_size)


def rank_span(count: int, rank: int, world_size: int, drop_last: bool) -> Run:
    """The span [lo, hi) of virtual positions that ``rank`` reads (hi may pass count: padding)."""
    if not 0 <= rank < world_size:
        raise ArgumentError(f"rank {rank} is not in [0, {world_size})")
    per_rank = samples_per_rank(count, world_size, drop_last)
    return rank * per_rank, (rank + 1) * per_rank


def worker_unit(per_rank: int, num_workers: int, batch_size: int | None, loader_batch_size: int | None = None) -> int:
    """The number of samples a rank's span is cut on when it is split among workers.

    Batch mode: the batch. Per-sample mode: ``loader_batch_size`` (the
    DataLoader's batch size) when given; otherwise the largest power of two
    ``<= min(4096, per_rank // (2 * num_workers))`` (at least 1), so that any
    DataLoader batch size dividing it gives exactly ``len(loader)`` batches,
    while every worker still gets about two units or more.
    """
    if batch_size:
        return batch_size
    if loader_batch_size:
        return loader_batch_size
    cap = min(MAX_SAMPLE_UNIT, per_rank // (2 * max(1, num_workers)))
    return 1 << (cap.bit_length() - 1) if cap >= 1 else 1


def worker_span(span: Run, worker: int, num_workers: int, unit: int | None = None) -> Run:
    """The part of a rank's span that one worker reads.

    The cut falls on multiples of ``unit`` samples (see :func:`worker_unit`),
    so every worker but the last holds whole units.
    """
    lo, hi = span
    unit = unit or 1
    units = -(-(hi - lo) // unit)
    first = worker * units // num_workers
    last = (worker + 1) * units // num_workers
    return min(lo + first * unit, hi), min(lo + last * unit, hi)


def loader_batches(per_rank: int, num_workers: int, unit: int, loader_batch_size: int, drop_last: bool) -> int:
    """Batches a DataLoader yields from one rank's per-sample share.

    Each of the ``num_workers`` readers (1 when the DataLoader has no workers)
    collates its own share into batches of ``loader_batch_size``, ending on its
    own short batch (dropped with ``drop_last``).
    """
    readers = max(1, num_workers)
    total = 0
    for worker in range(readers):
        lo, hi = worker_span((0, per_rank), worker, readers, unit)
        n = hi - lo
        total += n // loader_batch_size if drop_last else -(-n // loader_batch_size)
    return total


def reader_runs(
    count: int,
    *,
    block_size: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    rank: int = 0,
    world_size: int = 1,
    worker: int = 0,
    num_workers: int = 1,
    drop_last: bool = False,
    unit: int | None = None,
    bounds: np.ndarray | None = None,
) -> list[Run]:
    """The runs [start, stop) of sample indices one reader visits, in order.

    ``unit`` is what a rank's span is cut on among workers (:func:`worker_unit`);
    ``bounds``: see :func:`block_bounds` (blocks never straddle a shard).
    """
    if count <= 0:
        return []
    span = worker_span(rank_span(count, rank, world_size, drop_last), worker, num_workers, unit)
    starts = block_order(count, block_size, seed, epoch, shuffle, bounds)
    lengths_array = block_stops(starts, count, block_size, bounds) - starts
    # Python ints from here: a NumPy scalar a block cost 0.5 ms an epoch over 250 blocks
    ends = np.cumsum(lengths_array).tolist()  # virtual position where each visited block ends
    firsts, lengths = starts.tolist(), lengths_array.tolist()
    runs: list[Run] = []
    lo, hi = span
    while lo < hi:
        # positions past count wrap around to the start of the sequence (padding)
        base = (lo // count) * count
        a, b = lo - base, min(hi - base, count)
        for i in range(bisect.bisect_right(ends, a), len(firsts)):
            block_lo = ends[i] - lengths[i]
            if block_lo >= b:
                break
            runs.append((firsts[i] + max(a - block_lo, 0), firsts[i] + min(b - block_lo, lengths[i])))
        lo = base + b
    return runs


def reader_seed(seed: int, epoch: int, rank: int, worker: int) -> int:
    """The seed of one reader's shuffle buffer for one epoch."""
    state = np.random.SeedSequence([seed, epoch, rank, worker, 0x62756666]).generate_state(2)
    return int(state[0]) << 32 | int(state[1])
