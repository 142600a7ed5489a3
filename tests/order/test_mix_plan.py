"""The mix plan (pure): exact counts for every stop rule, draws, per-source streams, the split over readers."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from tests.helpers import assert_exactly_once
from torchrecord._order.mix_plan import (
    draw_rates,
    epoch_counts,
    normalize_weights,
    order_block,
    plan_epoch,
    reader_units,
    source_seed,
    stream_runs,
    units_of_positions,
)

SIZES = [37, 100, 64, 250, 1]


def _w(weights: object, sizes: list[int] = SIZES) -> list[Fraction]:
    return normalize_weights(weights, sizes, [f"s{i}" for i in range(len(sizes))])


def _cases() -> list[tuple[list[int], list[float]]]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(60):
        n = int(rng.integers(1, 8))
        sizes = [int(x) for x in rng.integers(1, 500, size=n)]
        weights = [float(x) for x in rng.choice([0, 0.5, 1, 2.5, 3, 7], size=n)]
        if not any(weights):
            weights[0] = 1.0
        out.append((sizes, weights))
    return out


def _check_largest_remainder(counts: list[int], weights: list[Fraction], length: int) -> None:
    total = sum(weights)
    assert sum(counts) == length
    for c, w in zip(counts, weights):
        quota = Fraction(length) * w / total
        assert math.floor(quota) <= c <= math.ceil(quota)


# -- counts ---------------------------------------------------------------------------------


def test_all_once_with_size_weights_is_every_sample_once() -> None:
    assert epoch_counts(SIZES, _w("size"), "all_once") == SIZES


def test_all_once_reads_every_sample_once_for_any_weights() -> None:
    """issue 27 item 6: uniform weights over 300/600/900 gave 600/600/600."""
    assert epoch_counts([300, 600, 900], _w("uniform", [300, 600, 900]), "all_once") == [300, 600, 900]
    assert epoch_counts(SIZES, _w([1, 0, 2, 5, 1]), "all_once") == [37, 0, 64, 250, 1]  # weight 0: left out


def test_all_once_with_other_weights_draws_at_the_weights_rates_while_sources_last() -> None:
    sizes = [300, 600, 900]
    weights = _w("uniform", sizes)
    counts = epoch_counts(sizes, weights, "all_once")
    rates = draw_rates(counts, weights)
    assert rates == ["1/3", "1/3", "1/3"]
    plan = plan_epoch(counts, block=10, seed=4, epoch=2, rates=rates)
    by_position = np.repeat(plan.source, plan.length)
    assert plan.total == 1800 and Counter(by_position.tolist()) == {0: 300, 1: 600, 2: 900}
    # thirds until the 300 run out (after 900 samples), then halves until 600 more, then the last source alone
    for lo, hi, want in ((0, 900, [300, 300, 300]), (900, 1500, [0, 300, 300]), (1500, 1800, [0, 0, 300])):
        got = np.bincount(by_position[lo:hi], minlength=3)
        assert np.abs(got - want).max() <= 10, (lo, hi, got)  # one draw of jitter at each end
    for s in range(3):  # each source's draws still come in stream order
        mine = plan.stream[plan.source == s]
        assert mine.tolist() == sorted(mine.tolist())


def test_size_weights_and_other_stops_keep_the_even_plan() -> None:
    assert draw_rates(SIZES, _w("size")) is None
    assert draw_rates([0, 10, 20], _w([0, 1, 2], [5, 10, 20])) is None  # proportional to the counts
    even = plan_epoch(SIZES, block=4, seed=1, epoch=0)
    assert plan_epoch(SIZES, block=4, seed=1, epoch=0, rates=None).source.tolist() == even.source.tolist()


@pytest.mark.parametrize("case", range(60))
def test_until_all_reads_every_source_whole_in_the_shortest_epoch(case: int) -> None:
    sizes, raw = _cases()[case]
    weights = _w(raw, sizes)
    counts = epoch_counts(sizes, weights, "until_all")
    used = [s for s, w in enumerate(weights) if w > 0]
    assert all(counts[s] >= sizes[s] for s in used)
    assert all(counts[s] == 0 for s, w in enumerate(weights) if w == 0)
    length = sum(counts)
    _check_largest_remainder(counts, weights, length)
    # one sample shorter and some source would not be read whole any more
    total = sum(weights)
    assert any(Fraction(length - 1) * weights[s] / total < sizes[s] for s in used)


@pytest.mark.parametrize("case", range(60))
def test_first_exhausted_reads_no_source_past_its_end_in_the_longest_epoch(case: int) -> None:
    sizes, raw = _cases()[case]
    weights = _w(raw, sizes)
    counts = epoch_counts(sizes, weights, "first_exhausted")
    assert all(c <= n for c, n in zip(counts, sizes))
    length = sum(counts)
    _check_largest_remainder(counts, weights, length)
    total = sum(weights)
    used = [s for s, w in enumerate(weights) if w > 0]
    assert any(Fraction(length + 1) * weights[s] / total > sizes[s] for s in used)


@pytest.mark.parametrize("epoch_size", [0, 1, 7, 452, 10_001])
def test_explicit_epoch_size_is_split_by_largest_remainder(epoch_size: int) -> None:
    weights = _w([3, 1, 0, 2.5, 0.5])
    counts = epoch_counts(SIZES, weights, "all_once", epoch_size)
    _check_largest_remainder(counts, weights, epoch_size)
    assert counts[2] == 0


def test_largest_remainder_breaks_ties_to_the_lower_index() -> None:
    assert epoch_counts([10, 10, 10], _w([1, 1, 1], [10, 10, 10]), epoch_size=4) == [2, 1, 1]


def test_weights_are_checked() -> None:
    with pytest.raises(ValueError, match="s2: the source is empty"):
        _w([1, 1, 1], [3, 4, 0])
    assert _w("size", [3, 4, 0])[2] == 0  # an empty source simply gets no share
    with pytest.raises(ValueError, match=">= 0"):
        _w([1, -1, 1, 1, 1])
    with pytest.raises(ValueError, match="every weight is 0"):
        _w([0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="5 sources"):
        _w([1, 2])
    with pytest.raises(ValueError, match="unknown sources"):
        _w({"nope": 1})
    with pytest.raises(ValueError, match="no weight for sources"):
        _w({"s0": 1})
    with pytest.raises(ValueError, match="'size', 'uniform'"):
        _w("sizes")
    assert _w({"s0": 1, "s1": 0, "s2": 0, "s3": 2, "s4": 0}) == [1, 0, 0, 2, 0]
    with pytest.raises(ValueError, match="stop must be"):
        epoch_counts(SIZES, _w("size"), "never")


# -- draws ----------------------------------------------------------------------------------


@pytest.mark.parametrize("epoch", [0, 1, 5])
def test_draws_cover_each_source_stream_in_order(epoch: int) -> None:
    counts = [37, 100, 0, 250, 1]
    plan = plan_epoch(counts, block=16, seed=3, epoch=epoch)
    assert plan.total == sum(counts)
    assert plan.start.tolist() == np.concatenate(([0], np.cumsum(plan.length)[:-1])).tolist()
    assert (plan.length <= 16).all() and (plan.length >= 1).all()
    for s, n in enumerate(counts):
        mine = plan.source == s
        stream, length = plan.stream[mine], plan.length[mine]
        assert int(length.sum()) == n
        if n:  # the draws of a source take consecutive stream positions, in order
            assert stream[0] == epoch * n
            assert (stream[1:] == stream[:-1] + length[:-1]).all()


def test_draws_spread_every_source_evenly() -> None:
    counts = [37 * 16, 100 * 16, 64 * 16, 250 * 16, 16]
    plan = plan_epoch(counts, block=16, seed=1, epoch=0)
    m = np.array([c // 16 for c in counts])
    total, sources = m.sum(), len(m)
    for s in range(sources):
        seen = np.cumsum(plan.source == s)
        k = np.arange(1, len(plan.source) + 1)
        # stratified keys: within one draw of the source's share, plus one per other source
        assert np.abs(seen - k * m[s] / total).max() <= 1 + sources * m[s] / total


def test_plan_is_pure_and_changes_with_the_epoch_and_seed() -> None:
    a = plan_epoch(SIZES, block=4, seed=0, epoch=0)
    assert a.source.tolist() == plan_epoch(SIZES, block=4, seed=0, epoch=0).source.tolist()
    assert a.source.tolist() != plan_epoch(SIZES, block=4, seed=0, epoch=1).source.tolist()
    assert a.source.tolist() != plan_epoch(SIZES, block=4, seed=1, epoch=0).source.tolist()


# -- streams ------------------------------------------------------------------------------


def _stream(size: int, lo: int, hi: int, seed: int = 7) -> list[int]:
    block = order_block(size, 16, 1)
    return [i for a, b in stream_runs(size, block, source_seed(seed, 0), lo, hi) for i in range(a, b)]


@pytest.mark.parametrize("size", [1, 15, 100, 5000])
def test_each_source_epoch_of_a_stream_is_every_sample_once_in_a_new_order(size: int) -> None:
    epochs = [_stream(size, q * size, (q + 1) * size) for q in range(3)]
    for e in epochs:
        assert sorted(e) == list(range(size))
    if size >= 100:
        assert epochs[0] != epochs[1] != epochs[2]


def test_stream_runs_cut_anywhere_give_the_same_stream() -> None:
    whole = _stream(300, 0, 900)
    cuts = [0, 5, 16, 17, 299, 300, 301, 640, 900]
    pieces = [x for a, b in itertools.pairwise(cuts) for x in _stream(300, a, b)]
    assert pieces == whole


def test_a_source_read_less_than_once_continues_where_it_stopped() -> None:
    sizes, counts = [100, 500], [30, 500]  # source 0 gives 30 samples per mix epoch
    seen: list[int] = []
    for epoch in range(4):
        plan = plan_epoch(counts, block=8, seed=2, epoch=epoch)
        for s, v, n in zip(plan.source, plan.stream, plan.length):
            if s == 0:
                seen += _stream(sizes[0], int(v), int(v + n), seed=2)
    assert len(seen) == 120
    assert len(set(seen[:90])) == 90  # epochs 0-2: 90 different samples, nothing repeated
    assert set(seen[:100]) == set(range(100))  # epoch 3 finishes the source's first epoch...
    assert len(set(seen[100:])) == 20  # ...and goes on into its second


def test_a_source_read_more_than_once_wraps_into_its_next_epochs() -> None:
    plan = plan_epoch([250], block=16, seed=0, epoch=0)
    seen = [x for v, n in zip(plan.stream, plan.length) for x in _stream(100, int(v), int(v + n))]
    counts = Counter(seen)
    assert set(counts) == set(range(100)) and set(counts.values()) == {2, 3}
    assert seen[:100] != seen[100:200]


# -- the split --------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [1, 2, 5])
@pytest.mark.parametrize("drop_last", [False, True])
def test_readers_split_the_epoch_with_equal_counts_per_rank(world: int, workers: int, drop_last: bool) -> None:
    plan = plan_epoch(SIZES, block=16, seed=0, epoch=2)
    positions: list[int] = []
    per_rank = []
    for rank in range(world):
        got = 0
        for worker in range(workers):
            units = reader_units(
                plan, rank=rank, world_size=world, worker=worker, num_workers=workers, drop_last=drop_last, batch_size=8
            )
            assert (units.length <= 16).all()
            for p, n in zip(units.position, units.length):
                positions += [x % plan.total for x in range(int(p), int(p + n))]
            got += units.samples
        per_rank.append(got)
    assert len(set(per_rank)) == 1
    total = plan.total
    if drop_last:
        assert_exactly_once(positions, total, drop=total % world)
    else:
        assert_exactly_once(positions, total, pad=-total % world)


def test_units_follow_the_draws_they_cut() -> None:
    plan = plan_epoch(SIZES, block=16, seed=0, epoch=0)
    units = units_of_positions(plan, [(10, 40), (100, 101)])
    assert units.samples == 31
    for s, v, p, n in zip(units.source, units.stream, units.position, units.length):
        d = int(np.searchsorted(plan.start, p, side="right")) - 1
        assert plan.source[d] == s and v == plan.stream[d] + (p - plan.start[d])
        assert p + n <= plan.start[d] + plan.length[d]
