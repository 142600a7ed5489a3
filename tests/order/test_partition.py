"""The pure partition functions: which records each reader visits, in which coarse order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.helpers import assert_exactly_once
from torchrecord._order import partition as P

COUNTS = [0, 1, 7, 1000, 1001]


def _expand(runs: list[tuple[int, int]], count: int) -> list[int]:
    out: list[int] = []
    for start, stop in runs:
        assert 0 <= start < stop <= count, f"bad run {(start, stop)} for count {count}"
        out.extend(range(start, stop))
    return out


def _virtual(count: int, block_size: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's visiting sequence: every block, in this epoch's block order."""
    starts = P.block_order(count, block_size, seed, epoch, shuffle)
    return [i for s in starts for i in range(int(s), min(int(s) + block_size, count))]


def _reader(count: int, block_size: int, **kw: object) -> list[int]:
    runs = P.reader_runs(count, block_size=block_size, **kw)  # type: ignore[arg-type]
    return _expand(runs, count)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("drop_last", [False, True])
def test_runs_cover_every_index_once(count: int, drop_last: bool) -> None:
    for world, workers, batch_size, fixed_block in itertools.product(range(1, 5), range(1, 4), [None, 8], [None, 3]):
        block_size = fixed_block or P.auto_block_size(count)
        virtual = _virtual(count, block_size, seed=11, epoch=2, shuffle=True)
        assert sorted(virtual) == list(range(count))
        per_rank = P.samples_per_rank(count, world, drop_last)
        total = per_rank * world
        everything: list[int] = []
        for rank in range(world):
            rank_seen: list[int] = []
            batches = 0
            for worker in range(workers):
                seen = _reader(
                    count,
                    block_size,
                    seed=11,
                    epoch=2,
                    shuffle=True,
                    rank=rank,
                    world_size=world,
                    worker=worker,
                    num_workers=workers,
                    drop_last=drop_last,
                    unit=batch_size,
                )
                if batch_size is not None:
                    if worker < workers - 1:
                        assert len(seen) % batch_size == 0, "only the last worker may hold a short batch"
                    batches += -(-len(seen) // batch_size)
                rank_seen.extend(seen)
            what = f"count={count} world={world} workers={workers} batch={batch_size} block={block_size}"
            assert len(rank_seen) == per_rank, what
            if batch_size is not None:
                assert batches == -(-per_rank // batch_size), f"batch count depends on workers: {what}"
            everything.extend(rank_seen)
        # ranks then workers, in order, walk the virtual sequence; padding wraps to its start
        assert everything == [virtual[p % count] for p in range(total)], what
        if drop_last:
            assert total <= count and count - total < world
            assert_exactly_once(everything, count, drop=count - total)
        else:
            assert total >= count and total - count < world
            assert_exactly_once(everything, count, pad=total - count)


def test_pad_repeats_from_the_start_and_drop_cuts_the_tail() -> None:
    count, block_size = 10, 2
    virtual = _virtual(count, block_size, seed=0, epoch=0, shuffle=True)
    kw = {"block_size": block_size, "seed": 0, "epoch": 0, "shuffle": True, "world_size": 4}
    padded = [_reader(count, rank=r, drop_last=False, **kw) for r in range(4)]  # type: ignore[arg-type]
    assert [len(x) for x in padded] == [3, 3, 3, 3]
    assert padded[3] == [virtual[9], virtual[0], virtual[1]]
    dropped = [_reader(count, rank=r, drop_last=True, **kw) for r in range(4)]  # type: ignore[arg-type]
    assert [len(x) for x in dropped] == [2, 2, 2, 2]
    assert [i for part in dropped for i in part] == virtual[:8]


def test_unshuffled_runs_are_in_stored_order() -> None:
    for count, world in [(1000, 1), (1001, 3)]:
        seen = []
        for rank in range(world):
            for worker in range(2):
                seen += _reader(
                    count,
                    16,
                    seed=5,
                    epoch=3,
                    shuffle=False,
                    rank=rank,
                    world_size=world,
                    worker=worker,
                    num_workers=2,
                    drop_last=True,
                )
        assert seen == list(range(len(seen)))
    assert P.block_order(100, 16, 1, 2, False).tolist() == list(range(0, 100, 16))


def test_runs_are_coarse() -> None:
    """A reader's runs are whole blocks (except at its span's two ends): few seeks per epoch."""
    runs = P.reader_runs(10_000, block_size=40, seed=0, epoch=0, shuffle=True, world_size=2, rank=1)
    lengths = [b - a for a, b in runs]
    assert sum(lengths) == 5000
    assert all(n == 40 for n in lengths[1:-1])
    assert len(runs) <= 5000 // 40 + 2


def test_determinism() -> None:
    kw = {"block_size": 16, "seed": 3, "epoch": 4, "shuffle": True, "world_size": 3, "num_workers": 2}
    for rank, worker in itertools.product(range(3), range(2)):
        a = P.reader_runs(1001, rank=rank, worker=worker, **kw)  # type: ignore[arg-type]
        b = P.reader_runs(1001, rank=rank, worker=worker, **kw)  # type: ignore[arg-type]
        assert a == b
    assert P.block_order(1000, 16, 3, 4, True).tolist() == P.block_order(1000, 16, 3, 4, True).tolist()
    assert P.reader_seed(1, 2, 3, 4) == P.reader_seed(1, 2, 3, 4)


def test_epoch_and_seed_change_the_block_order() -> None:
    base = P.block_order(1000, 16, 0, 0, True).tolist()
    assert sorted(base) == list(range(0, 1000, 16))
    assert base != sorted(base)
    orders = {tuple(P.block_order(1000, 16, 0, epoch, True).tolist()) for epoch in range(5)}
    assert len(orders) == 5, "every epoch must visit the blocks in a new order"
    assert P.block_order(1000, 16, 1, 0, True).tolist() != base
    runs = [P.reader_runs(1000, block_size=16, seed=0, epoch=e, shuffle=True, world_size=2, rank=0) for e in (0, 1)]
    assert runs[0] != runs[1]
    # a rank reads different records in different epochs, not just in another order
    assert set(_expand(runs[0], 1000)) != set(_expand(runs[1], 1000))


def test_reader_seeds_differ_per_reader_and_epoch() -> None:
    seeds = {
        P.reader_seed(seed, epoch, rank, worker)
        for seed, epoch, rank, worker in itertools.product(range(2), range(3), range(3), range(3))
    }
    assert len(seeds) == 2 * 3 * 3 * 3


def test_samples_per_rank() -> None:
    assert P.samples_per_rank(10, 4, False) == 3
    assert P.samples_per_rank(10, 4, True) == 2
    assert P.samples_per_rank(12, 4, False) == P.samples_per_rank(12, 4, True) == 3
    assert P.samples_per_rank(0, 3, False) == 0
    assert P.samples_per_rank(2, 3, True) == 0


def test_rank_span_rejects_bad_rank() -> None:
    with pytest.raises(ValueError, match="rank"):
        P.rank_span(10, 2, 2, False)
    with pytest.raises(ValueError, match="rank"):
        P.rank_span(10, -1, 2, False)


def test_worker_span_batch_aligned() -> None:
    span = (100, 150)  # 50 samples: 7 batches of 8 (the last has 2)
    parts = [P.worker_span(span, w, 3, 8) for w in range(3)]
    assert parts[0][0] == 100 and parts[-1][1] == 150
    assert all(parts[i][1] == parts[i + 1][0] for i in range(2))
    assert all((b - a) % 8 == 0 for a, b in parts[:-1])
    plain = [P.worker_span(span, w, 3) for w in range(3)]
    assert [b - a for a, b in plain] == [16, 17, 17]


def test_auto_block_size() -> None:
    assert P.auto_block_size(0) == 16
    assert P.auto_block_size(1000) == 16
    assert P.auto_block_size(256 * 100) == 100
    assert P.auto_block_size(10**9) == 4096


def test_empty() -> None:
    assert P.reader_runs(0, block_size=16, seed=0, epoch=0, shuffle=True) == []
    assert len(P.block_order(0, 16, 0, 0, True)) == 0
    assert np.array_equal(P.block_order(5, 16, 0, 0, True), [0])
