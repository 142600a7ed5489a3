"""Which frame fills each cell of each sequence-stream batch: pure functions of (offsets, seed, epoch, world).

A grouped record set stores sequences (groups) contiguously; ``offsets`` is
int64[G+1]. An epoch's plan puts the sequences in a seeded order and deals them,
one after the other, to ``streams = world_size x batch_size`` streams, each next
sequence going to the stream with the fewest frames so far (ties to the lowest
stream). Stream ``s`` then plays its sequences back to back: cell ``(s, t)`` is
frame ``t`` of that concatenation, or padding past its end. Rank ``r`` owns
streams ``[r * B, (r + 1) * B)``, so position ``b`` of every batch of a rank
continues one stream.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrecord._order.plan import EpochPlan, Reader
from torchrecord.errors import ArgumentError

__all__ = ["Cells", "Steps", "StreamEpochPlan", "StreamPlan", "plan_streams"]

_TAG = 0x73747265  # "stre"


@dataclass(frozen=True)
class Cells:
    """The cells of one batch of one rank: [B, steps] arrays (or [batches, B, steps] for several).

    Attributes:
        sample: the stored sample index of each cell (-1 on padding).
        sequence: the group index of each cell (-1 on padding).
        start: True where a sequence begins (reset hidden state there).
    """

    sample: np.ndarray
    sequence: np.ndarray
    start: np.ndarray

    @property
    def mask(self) -> np.ndarray:
        return self.sample >= 0


@dataclass(frozen=True)
class StreamPlan:
    """One epoch's streams.

    Attributes:
        order: per stream, the group indices it plays, in order.
        lengths: frames per stream.
        steps_per_epoch: time steps every rank runs (the longest stream with
            ``tail="pad"``; with ``"drop"`` the shortest, cut to a whole number of
            ``steps``).
        dropped: frames past ``steps_per_epoch``, on every stream of every rank,
            that no batch holds: the cells played plus ``dropped`` are every frame.
    """

    offsets: np.ndarray
    order: tuple[np.ndarray, ...]
    lengths: np.ndarray
    steps_per_epoch: int
    dropped: int

    def cells(self, streams: range, t0: int, t1: int) -> Cells:
        """The cells of ``streams`` at time steps [t0, t1), found for all streams at once."""
        return self.cells_at(streams, np.arange(t0, t1, dtype=np.int64))

    def batch_cells(self, streams: range, starts: list[int], steps: int) -> Cells:
        """The cells of several batches of ``steps`` time steps from each of ``starts``: arrays [batches, B, steps].

        Found with one lookup for them all. Cells past a stream's end (or past the
        epoch's last step) are padding. Each batch's arrays are contiguous.
        """
        rows, n = len(streams), len(starts)
        t = (np.asarray(starts, np.int64)[:, None] + np.arange(steps, dtype=np.int64)).reshape(-1)
        past = int(self.lengths.max()) if len(self.lengths) else 0  # a time step no stream reaches
        t = np.where(t < self.steps_per_epoch, t, past)  # the epoch ends there (tail="drop": before some streams)
        every = self.cells_at(streams, t)

        def by_batch(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a.reshape(rows, n, steps).transpose(1, 0, 2))

        return Cells(by_batch(every.sample), by_batch(every.sequence), by_batch(every.start))

    def cells_at(self, streams: range, t: np.ndarray) -> Cells:
        """The cells of ``streams`` at the time steps ``t`` (int64, any order), found for all at once."""
        table = self._table(streams)
        rows = len(streams)
        valid = t[None, :] < table.lengths[:, None]
        if not len(table.ends):
            valid[:] = False
        sample = np.full((rows, len(t)), -1, np.int64)
        sequence = np.full((rows, len(t)), -1, np.int64)
        start = np.zeros((rows, len(t)), bool)
        if valid.any():
            r, c = np.nonzero(valid)
            times = t[c]
            # one sorted key per (stream row, end of one of its sequences): a single searchsorted finds every cell
            which = np.searchsorted(table.keys, r * table.span + times, side="right")
            within = times - (table.ends[which] - table.sizes[which])
            g = table.groups[which]
            sample[r, c] = self.offsets[g] + within
            sequence[r, c] = g
            start[r, c] = within == 0
        return Cells(sample, sequence, start)

    def _table(self, streams: range) -> _StreamTable:
        cache: dict[tuple[int, int, int], _StreamTable] = self.__dict__.setdefault("_tables", {})
        key = (streams.start, streams.stop, streams.step)
        table = cache.get(key)
        if table is None:
            table = cache[key] = _StreamTable.build(self, streams)
        return table


@dataclass(frozen=True)
class _StreamTable:
    """The sequences of some streams, concatenated, for vectorised cell lookups (built once per plan)."""

    groups: np.ndarray  # group index of each entry, streams one after the other
    sizes: np.ndarray  # frames of each entry
    ends: np.ndarray  # stream time where each entry ends
    keys: np.ndarray  # row * span + ends: sorted
    lengths: np.ndarray  # frames per stream row
    span: int

    @classmethod
    def build(cls, plan: StreamPlan, streams: range) -> _StreamTable:
        offsets = plan.offsets
        parts = [plan.order[s] for s in streams]
        groups = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        sizes = offsets[groups + 1] - offsets[groups]
        counts = np.array([len(g) for g in parts], np.int64)
        row = np.repeat(np.arange(len(parts), dtype=np.int64), counts)
        firsts = np.concatenate(([0], np.cumsum(counts)[:-1])) if len(parts) else np.zeros(0, np.int64)
        total = np.cumsum(sizes)
        before = np.concatenate(([0], total))[firsts] if len(groups) else np.zeros(len(parts), np.int64)
        ends = total - np.repeat(before, counts)  # cumulative within each stream
        lengths = np.array([int(plan.lengths[s]) for s in streams], np.int64)
        span = int(lengths.max()) + 1 if len(lengths) else 1
        return cls(groups.astype(np.int64), sizes, ends, row * span + ends, lengths, span)


def plan_streams(
    offsets: np.ndarray,
    *,
    streams: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    tail: str = "pad",
    steps: int = 1,
) -> StreamPlan:
    """Deal the sequences of ``offsets`` to ``streams`` streams for one epoch (see the module docstring).

    ``steps`` is the time steps of one batch: ``tail="drop"`` ends the epoch at the
    shortest stream's last whole batch, so every batch is whole and every frame
    past it is counted in ``dropped``.
    """
    if steps < 1:
        raise ArgumentError(f"steps must be an integer >= 1, got {steps!r}")
    offsets = np.asarray(offsets, dtype=np.int64)
    count = len(offsets) - 1
    if shuffle:
        rng = np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, epoch, _TAG]))
        visit = rng.permutation(count)
    else:
        visit = np.arange(count)
    sizes = np.diff(offsets)
    owner = np.empty(count, np.int64)
    heap = [(0, s) for s in range(streams)]
    for g in visit.tolist():
        frames, s = heap[0]
        owner[g] = s
        heapq.heapreplace(heap, (frames + int(sizes[g]), s))
    # each stream's groups in visiting order: a stable sort of the visit order by owner
    owners = owner[visit]
    by_stream = visit[np.argsort(owners, kind="stable")]
    counts = np.bincount(owners, minlength=streams)
    order = tuple(np.split(by_stream, np.cumsum(counts)[:-1]))
    lengths = np.bincount(owners, weights=sizes[visit], minlength=streams).astype(np.int64)
    if tail == "pad":
        total = int(lengths.max()) if streams else 0
    elif tail == "drop":
        total = int(lengths.min()) if streams else 0
    else:
        raise ArgumentError(f"tail must be 'pad' or 'drop', got {tail!r}")
    if tail == "drop":
        total -= total % steps  # whole batches only: the frames of a partial last batch are dropped too
    dropped = int(np.maximum(lengths - total, 0).sum())
    return StreamPlan(offsets, order, lengths, total, dropped)


@dataclass(frozen=True)
class Steps:
    """One stream reader's part: the positions ``rank * steps + t`` of the batches ``t`` it builds, in order."""

    steps: np.ndarray
    offset: int

    @property
    def size(self) -> int:
        return len(self.steps)

    def positions(self) -> np.ndarray:
        return self.steps + self.offset

    def first(self, n: int, progress: Any = None) -> np.ndarray:
        return self.steps[:n] + self.offset

    def batches(self, start: int = 0) -> list[int]:
        """The batch indices this reader builds from its ``start``-th on."""
        out: list[int] = self.steps[start:].tolist()
        return out


@dataclass(frozen=True)
class StreamEpochPlan(EpochPlan):
    """A stream epoch's batches over every reader: worker w of n builds batches t with ``t % n == w``.

    Positions are ``rank * steps + t``: each rank plays its own streams. The rest of a
    position is dealt out the same way, batch by batch in order, so a DataLoader (which
    takes one batch from each worker in turn) yields the rest in order, on any number of
    workers.
    """

    steps: int

    @property
    def total(self) -> int:
        return self.steps

    def part(self, reader: Reader, rest: np.ndarray | None = None) -> Steps:
        offset = reader.rank * self.steps
        if rest is None:
            mine = np.arange(self.steps, dtype=np.int64)
        else:
            mine = rest[(rest >= offset) & (rest < offset + self.steps)] - offset
        return Steps(mine[reader.worker :: reader.num_workers], offset)
