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

import numpy as np

__all__ = ["Cells", "StreamPlan", "plan_streams"]

_TAG = 0x73747265  # "stre"


@dataclass(frozen=True)
class Cells:
    """The cells of one batch of one rank: [B, steps] arrays.

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
            ``tail="pad"``, the shortest with ``"drop"``).
        dropped: frames past ``steps_per_epoch`` that no batch holds.
    """

    offsets: np.ndarray
    order: tuple[np.ndarray, ...]
    lengths: np.ndarray
    steps_per_epoch: int
    dropped: int

    def cells(self, streams: range, t0: int, t1: int) -> Cells:
        """The cells of ``streams`` at time steps [t0, t1)."""
        width = t1 - t0
        sample = np.full((len(streams), width), -1, np.int64)
        sequence = np.full((len(streams), width), -1, np.int64)
        start = np.zeros((len(streams), width), bool)
        offsets = self.offsets
        for row, s in enumerate(streams):
            groups = self.order[s]
            if not len(groups):
                continue
            sizes = offsets[groups + 1] - offsets[groups]
            ends = np.cumsum(sizes)  # stream time where each of its sequences ends
            t = np.arange(t0, min(t1, int(ends[-1])), dtype=np.int64)
            if not len(t):
                continue
            which = np.searchsorted(ends, t, side="right")
            within = t - (ends[which] - sizes[which])
            g = groups[which]
            sample[row, : len(t)] = offsets[g] + within
            sequence[row, : len(t)] = g
            start[row, : len(t)] = within == 0
        return Cells(sample, sequence, start)


def plan_streams(
    offsets: np.ndarray, *, streams: int, seed: int, epoch: int, shuffle: bool = True, tail: str = "pad"
) -> StreamPlan:
    """Deal the sequences of ``offsets`` to ``streams`` streams for one epoch (see the module docstring)."""
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
        steps = int(lengths.max()) if streams else 0
    elif tail == "drop":
        steps = int(lengths.min()) if streams else 0
    else:
        raise ValueError(f"tail must be 'pad' or 'drop', got {tail!r}")
    dropped = int(np.maximum(lengths - steps, 0).sum())
    return StreamPlan(offsets, order, lengths, steps, dropped)
