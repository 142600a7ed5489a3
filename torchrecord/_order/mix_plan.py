"""Which source fills each stretch of a weighted mix epoch: pure functions of (sizes, weights, seed, epoch).

A mix epoch is one sequence of ``total`` global positions. It is built in four
steps, each a pure function:

1. **counts** (:func:`epoch_counts`): how many samples each source contributes,
   exactly, from the weights and the stop rule (largest remainder, in exact
   rational arithmetic);
2. **draws** (:func:`plan_epoch`): each source's count is cut into draws of
   ``block`` consecutive samples of its own stream, and the draws of all sources
   are interleaved by jittered stratified keys (draw ``i`` of a source with ``m``
   draws gets key ``(i + u) / m``, ``u`` uniform from a generator seeded by
   ``(seed, epoch)``), so every source is spread evenly over the epoch and its
   draws come in stream order;
3. **streams** (:func:`stream_runs`): source ``s`` reads its samples as an
   endless stream. Mix epoch ``e`` takes stream positions
   ``[e * count_s, (e + 1) * count_s)``: a source read less than once per mix
   epoch continues where it stopped, one read more than once wraps into its own
   next epoch. Stream position ``p`` is position ``p % size`` of the source's
   epoch ``p // size``, whose order is a seeded block order
   (``torchrecord._order.partition.block_order``) new in every source epoch;
4. **split** (:func:`reader_units`): the global sequence is split over ranks
   (equal counts per rank, padded by wrapping or cut with ``drop_last``) and each
   rank's span over its workers exactly like ``RecordDataset``
   (``torchrecord._order.partition``); a reader's *units* are its pieces of draws.

Nothing here depends on the world size but the split, so a saved position can
be re-split over any world (``torchrecord._mix.resume``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from torchrecord._order import partition as _partition
from torchrecord.errors import ArgumentError

__all__ = [
    "MixPlan",
    "STOPS",
    "Units",
    "draw_rates",
    "epoch_counts",
    "normalize_weights",
    "order_block",
    "plan_epoch",
    "reader_units",
    "source_seed",
    "stream_runs",
    "units_of_positions",
]

#: The stop rules: how long a mix epoch is when no ``epoch_size`` is given.
STOPS = ("all_once", "until_all", "first_exhausted")

_TAG_DRAWS = 0x6D697864  # "mixd"
_TAG_SOURCE = 0x6D697873  # "mixs"

Run = tuple[int, int]


def normalize_weights(weights: Any, sizes: Sequence[int], names: Sequence[str]) -> list[Fraction]:
    """``"size"``, ``"uniform"`` or one number >= 0 per source (a sequence, or a mapping by name), as fractions.

    Raises ValueError naming the source for a negative or non-finite weight, a
    weight for an empty source, a missing or unknown name, or all weights zero.
    """
    if isinstance(weights, str):
        if weights == "size":
            values: list[Any] = list(sizes)
        elif weights == "uniform":
            values = [1 if n > 0 else 0 for n in sizes]
        else:
            raise ArgumentError(f"weights must be 'size', 'uniform' or numbers, got {weights!r}")
    elif isinstance(weights, Mapping):
        unknown = sorted(set(map(str, weights)) - set(names))
        if unknown:
            raise ArgumentError(f"weights name unknown sources {unknown}; the sources are {list(names)}")
        missing = [n for n in names if n not in weights]
        if missing:
            raise ArgumentError(f"weights give no weight for sources {missing}; give 0 to leave one out")
        values = [weights[n] for n in names]
    else:
        values = list(weights)
        if len(values) != len(sizes):
            raise ArgumentError(f"{len(values)} weights for {len(sizes)} sources: give one weight per source")
    out: list[Fraction] = []
    for name, size, w in zip(names, sizes, values):
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise ArgumentError(f"{name}: the weight {w!r} is not a number")
        if not math.isfinite(float(w)) or w < 0:
            raise ArgumentError(f"{name}: the weight must be a finite number >= 0, got {w!r}")
        if w > 0 and size == 0:
            raise ArgumentError(f"{name}: the source is empty but has weight {w}; give it weight 0 or leave it out")
        out.append(Fraction(int(w)) if isinstance(w, (int, np.integer)) else Fraction(float(w)))
    if not any(out):
        raise ArgumentError("every weight is 0: give at least one non-empty source a weight > 0")
    return out


def epoch_counts(
    sizes: Sequence[int], weights: Sequence[Fraction], stop: str = "all_once", epoch_size: int | None = None
) -> list[int]:
    """Samples each source contributes to one mix epoch (exact; they sum to the epoch's length).

    The epoch's length is ``epoch_size`` when given, else set by ``stop``:

    * ``"all_once"``: every sample of every source with a weight > 0 exactly once,
      for any weights: each such source's count is its size (the weights then set
      the rates at which the sources are drawn while they last: see :func:`draw_rates`);
    * ``"until_all"``: the shortest epoch in which every source is read at least
      once whole: ``ceil(max over s of size_s / share_s)``;
    * ``"first_exhausted"``: the longest epoch in which no source is read past its
      end: ``floor(min over s of size_s / share_s)``.

    Each source then gets its share of the length by the largest remainder
    method (ties to the lower index), so the counts are exact and sum to it.
    """
    total_w = sum(weights, Fraction(0))
    if total_w <= 0:
        raise ArgumentError("every weight is 0")
    used = [s for s, w in enumerate(weights) if w > 0]
    if epoch_size is not None:
        if epoch_size < 0:
            raise ArgumentError(f"epoch_size must be >= 0, got {epoch_size}")
        length = int(epoch_size)
    elif stop == "all_once":
        return [int(sizes[s]) if weights[s] > 0 else 0 for s in range(len(sizes))]
    elif stop == "until_all":
        length = max(math.ceil(Fraction(int(sizes[s])) * total_w / weights[s]) for s in used)
    elif stop == "first_exhausted":
        length = min(math.floor(Fraction(int(sizes[s])) * total_w / weights[s]) for s in used)
    else:
        raise ArgumentError(f"stop must be one of {', '.join(STOPS)}, got {stop!r}")
    quotas = [Fraction(length) * w / total_w for w in weights]
    counts = [math.floor(q) for q in quotas]
    left = length - sum(counts)
    by_remainder = sorted(range(len(quotas)), key=lambda s: (-(quotas[s] - counts[s]), s))
    for s in by_remainder[:left]:
        counts[s] += 1
    return counts


def source_seed(seed: int, source: int) -> int:
    """The seed of source ``source``'s own block order (a pure function)."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, source, _TAG_SOURCE]).generate_state(2)
    return int(state[0]) << 32 | int(state[1])


def draw_rates(counts: Sequence[int], weights: Sequence[Fraction]) -> list[str] | None:
    """The rates of a mix whose counts are not the weights' shares (``stop="all_once"``), or None.

    ``None`` when the counts are proportional to the weights (size weights, or
    any stop rule but ``"all_once"``): every source is then spread evenly over the
    whole epoch. Otherwise the weights (as exact fractions, ``"p/q"`` strings so
    that a resume state keeps them) are the rates at which the sources are drawn
    while they last: see :func:`plan_epoch`.
    """
    used = [s for s, n in enumerate(counts) if n > 0]
    if not used:
        return None
    ratio = Fraction(int(counts[used[0]])) / weights[used[0]] if weights[used[0]] > 0 else None
    if ratio is not None and all(weights[s] > 0 and Fraction(int(counts[s])) / weights[s] == ratio for s in used):
        return None
    total = sum(weights, Fraction(0))
    return [str(Fraction(w) / total) for w in weights]


def _rate_times(counts: Sequence[int], rates: Sequence[Fraction]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per source with samples: (samples drawn, time) at the ends of the phases of a mix drawn at ``rates``.

    The mix draws one sample per unit of time; while a set of sources lasts, each
    takes the share ``rate / (sum of their rates)``. A phase ends when a source
    runs out; the next phase shares the time among the sources left (exact).
    """
    left = {s: Fraction(int(n)) for s, n in enumerate(counts) if n > 0}
    for s in left:
        if rates[s] <= 0:
            raise ArgumentError(f"source {s} has {counts[s]} samples to draw but rate {rates[s]}")
    drawn = {s: [Fraction(0)] for s in left}
    times = {s: [Fraction(0)] for s in left}
    t = Fraction(0)
    active = sorted(left)
    while active:
        total = sum((rates[s] for s in active), Fraction(0))
        dt = min(left[s] * total / rates[s] for s in active)
        t += dt
        for s in active:
            left[s] -= rates[s] / total * dt
            drawn[s].append(Fraction(int(counts[s])) - left[s])
            times[s].append(t)
        active = [s for s in active if left[s] > 0]
    return {s: (np.array([float(x) for x in drawn[s]]), np.array([float(x) for x in times[s]])) for s in drawn}


@dataclass(frozen=True)
class MixPlan:
    """One mix epoch: its draws in order, each a run of one source's stream.

    Attributes:
        counts: samples per source this epoch.
        source: per draw, the source index.
        stream: per draw, the first stream position it takes from its source.
        length: per draw, its samples (``block``, or fewer for a source's last).
        start: per draw, the global position where it begins.
        total: the epoch's length (sum of ``counts``).
    """

    counts: tuple[int, ...]
    source: np.ndarray
    stream: np.ndarray
    length: np.ndarray
    start: np.ndarray
    total: int


def plan_epoch(
    counts: Sequence[int], *, block: int, seed: int, epoch: int, rates: Sequence[str] | None = None
) -> MixPlan:
    """The draws of mix epoch ``epoch`` (see the module docstring, step 2).

    Without ``rates`` every source's draws are spread evenly over the whole epoch
    (draw ``i`` of ``m`` at key ``(i + u) / m``). With ``rates`` (from
    :func:`draw_rates`: ``stop="all_once"`` with weights other than the sizes)
    the sources are drawn at those rates while they last: a draw's key is the time
    at which the mix, drawing each remaining source at its share of the rates,
    reaches that draw's samples (``_rate_times``), so a source that runs out early
    leaves the rest of the epoch to the others.
    """
    if block < 1:
        raise ArgumentError(f"block must be >= 1, got {block}")
    timeline = _rate_times(counts, [Fraction(r) for r in rates]) if rates is not None else None
    sources, streams, lengths, keys = [], [], [], []
    rng = np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, epoch, _TAG_DRAWS]))
    for s, n in enumerate(counts):
        m = -(-int(n) // block)
        jitter = rng.random(m)
        if not m:
            continue
        i = np.arange(m, dtype=np.int64)
        sources.append(np.full(m, s, np.int64))
        streams.append(int(epoch) * int(n) + i * block)
        lengths.append(np.minimum(block, int(n) - i * block))
        if timeline is None:
            keys.append((i + jitter) / m)
        else:
            drawn, times = timeline[s]
            keys.append(np.interp((i + jitter) / m * int(n), drawn, times))
    if not sources:
        empty = np.zeros(0, np.int64)
        return MixPlan(tuple(int(c) for c in counts), empty, empty, empty, empty, 0)
    source = np.concatenate(sources)
    order = np.lexsort((source, np.concatenate(keys)))
    source = source[order]
    stream = np.concatenate(streams)[order]
    length = np.concatenate(lengths)[order]
    start = np.concatenate(([0], np.cumsum(length)[:-1])).astype(np.int64)
    return MixPlan(tuple(int(c) for c in counts), source, stream, length, start, int(length.sum()))


@dataclass(frozen=True)
class Units:
    """A reader's pieces of draws, in planned order (int64 arrays of one length).

    Attributes:
        source: the source of each unit.
        stream: its first stream position in that source.
        length: its samples.
        position: the global position of its first sample (virtual: past the
            epoch's length on padding, which wraps around to its start).
    """

    source: np.ndarray
    stream: np.ndarray
    length: np.ndarray
    position: np.ndarray

    def __len__(self) -> int:
        return len(self.source)

    @property
    def samples(self) -> int:
        """Samples in all units."""
        return int(self.length.sum())


def _cut(plan: MixPlan, lo: int, hi: int, base: int) -> tuple[np.ndarray, ...]:
    """The pieces of draws covering global positions [lo, hi) (within [0, total)), positions offset by base."""
    first = int(np.searchsorted(plan.start, lo, side="right")) - 1
    last = int(np.searchsorted(plan.start, hi, side="left"))
    source = plan.source[first:last]
    a = np.maximum(plan.start[first:last], lo)
    b = np.minimum(plan.start[first:last] + plan.length[first:last], hi)
    stream = plan.stream[first:last] + (a - plan.start[first:last])
    return source, stream, b - a, a + base


def units_of_positions(plan: MixPlan, runs: Sequence[Run]) -> Units:
    """The units covering runs [lo, hi) of virtual global positions (past ``total``: wrapped around)."""
    parts: list[tuple[np.ndarray, ...]] = []
    total = plan.total
    for lo, hi in runs:
        while lo < hi and total:
            base = (lo // total) * total
            a, b = lo - base, min(hi - base, total)
            parts.append(_cut(plan, a, b, base))
            lo = base + b
    if not parts:
        empty = np.zeros(0, np.int64)
        return Units(empty, empty, empty, empty)
    source, stream, length, position = (np.concatenate(x).astype(np.int64) for x in zip(*parts))
    return Units(source, stream, length, position)


def reader_units(
    plan: MixPlan,
    *,
    rank: int = 0,
    world_size: int = 1,
    worker: int = 0,
    num_workers: int = 1,
    drop_last: bool = False,
    batch_size: int | None = None,
) -> Units:
    """One reader's units: its rank's span of the epoch (like ``RecordDataset``), then its worker's part."""
    if plan.total == 0:
        return units_of_positions(plan, [])
    span = _partition.worker_span(
        _partition.rank_span(plan.total, rank, world_size, drop_last), worker, num_workers, batch_size
    )
    return units_of_positions(plan, [span])


def order_block(size: int, block: int, samples_per_record: int) -> int:
    """The block of a source's own order: at least ``block`` and about size/256, in whole records."""
    k = samples_per_record
    return -(-max(block, _partition.auto_block_size(size)) // k) * k


@functools.lru_cache(maxsize=1024)
def _source_order(
    size: int, block: int, seed: int, q: int, shuffle: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    starts = _partition.block_order(size, block, seed, q, shuffle)
    lengths = np.minimum(starts + block, size) - starts
    return starts, lengths, np.cumsum(lengths)


def stream_runs(size: int, block: int, seed: int, lo: int, hi: int, shuffle: bool = True) -> list[Run]:
    """The sample runs of stream positions [lo, hi) of a source of ``size`` samples (see step 3).

    ``block`` is the source's :func:`order_block`, ``seed`` its :func:`source_seed`; without
    ``shuffle`` every pass over the source reads it in stored order.
    """
    runs: list[Run] = []
    while lo < hi:
        q, a = divmod(lo, size)
        b = min(a + hi - lo, size)
        starts, lengths, ends = _source_order(size, block, seed, q, shuffle)
        i = int(np.searchsorted(ends, a, side="right"))
        pos = a
        while pos < b:
            block_lo = int(ends[i] - lengths[i])
            start = int(starts[i]) + pos - block_lo
            stop = int(starts[i]) + min(b - block_lo, int(lengths[i]))
            if runs and runs[-1][1] == start:
                runs[-1] = (runs[-1][0], stop)
            else:
                runs.append((start, stop))
            pos += stop - start
            i += 1
        lo += b - a
    return runs
