"""A reader's share of a set's samples and the plan that deals them out (pure).

:class:`SharePlan` is the :class:`~torchrecord._order.plan.EpochPlan` of the
datasets that read a set's positions in shuffled windows (``RecordDataset``
over its samples, ``WindowDataset`` over robomimic's windows): blocks of
positions in a seeded order per epoch, cut over ranks and workers
(``torchrecord._order.partition``), each reader's share permuted window by
window (``torchrecord._order.windows``). A :class:`Share` is one reader's part.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrecord._order import partition as _partition
from torchrecord._order import windows as _windows
from torchrecord._order.plan import Reader, WindowedPlan, runs_of

__all__ = ["Share", "SharePlan"]

Run = tuple[int, int]


@dataclass(frozen=True)
class Share:
    """What one reader reads in one epoch, and the identity its order is seeded from.

    Attributes:
        runs: runs [start, stop) of positions, in visiting order.
        seed, epoch, rank, worker: seed the per-window permutations.
        shuffle: permute each window (False: visit the runs in order).
        window: positions per window.
    """

    runs: tuple[Run, ...]
    seed: int
    epoch: int
    rank: int
    worker: int
    shuffle: bool
    window: int

    @classmethod
    def in_order(cls, runs: tuple[Run, ...]) -> Share:
        """Runs read as they are, in one window (a one-off read of known records)."""
        return cls(runs, 0, 0, 0, 0, shuffle=False, window=max(1, sum(b - a for a, b in runs)))

    @property
    def total(self) -> int:
        """Positions in the share."""
        return sum(stop - start for start, stop in self.runs)

    size = total

    def order(self, j: int, n: int) -> np.ndarray | None:
        """The permutation of window ``j`` (``n`` positions), or None to keep run order."""
        if not self.shuffle:
            return None
        return _windows.window_order(n, seed=self.seed, epoch=self.epoch, rank=self.rank, worker=self.worker, window=j)

    def positions(self) -> np.ndarray:
        """The share's positions in run order."""
        if not self.runs:
            return np.zeros(0, np.int64)
        return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in self.runs])

    def windows(self, start: int = 0) -> Iterator[np.ndarray]:
        """The positions of each window from window ``start`` on, in the order they are handed out."""
        total = self.total
        for j in range(start, -(-total // self.window)):
            runs = _windows.slice_runs(self.runs, j * self.window, min(total, (j + 1) * self.window))
            index = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs])
            order = self.order(j, len(index))
            yield index if order is None else index[order]

    def first(self, n: int, progress: Any = None) -> np.ndarray:
        """The positions of the first ``n`` samples handed out: whole windows, then the first of the next one."""
        sequence = self.positions()
        n = min(n, len(sequence))
        full = n // self.window * self.window
        if n == full:
            return sequence[:full]
        tail = next(self.windows(full // self.window))
        return np.concatenate([sequence[:full], tail[: n - full]])


@dataclass(frozen=True, kw_only=True)
class SharePlan(WindowedPlan):
    """Blocks of ``count`` positions in a seeded order, split over the world, read in permuted windows.

    Attributes:
        count: positions in the epoch (samples, or a subset's).
        block_size: positions per block of the coarse order.
        window: positions per permuted window.
        seed, epoch, shuffle: the order.
        drop_last: ranks cut the remainder (else pad by wrapping); a reader drops its short batch.
        batch_size: positions per item in batch mode (None: one).
        loader_batch_size: per-sample mode, the DataLoader's batch size (worker shares are cut on it).
        bounds: shard offsets (blocks restart at each shard), None for one file.
    """

    count: int
    block_size: int
    bounds: tuple[int, ...] | None = None

    @property
    def total(self) -> int:
        return self.count

    def part(self, reader: Reader, rest: np.ndarray | None = None) -> Share:
        unit = self.unit(reader.world_size, reader.num_workers)
        if rest is None:
            runs = _partition.reader_runs(
                self.count,
                block_size=self.block_size,
                seed=self.seed,
                epoch=self.epoch,
                shuffle=self.shuffle,
                rank=reader.rank,
                world_size=reader.world_size,
                worker=reader.worker,
                num_workers=reader.num_workers,
                drop_last=self.drop_last,
                unit=unit,
                bounds=self._bounds(),
            )
        else:
            runs = self._rest_runs(reader, rest, unit)
        return Share(tuple(runs), self.seed, self.epoch, reader.rank, reader.worker, self.shuffle, self.window)

    def _bounds(self) -> np.ndarray | None:
        return None if self.bounds is None else np.asarray(self.bounds, dtype=np.int64)

    def _rest_runs(self, reader: Reader, rest: np.ndarray, unit: int) -> list[Run]:
        """One reader's runs of ``rest``: laid out in the epoch's block order, split like a fresh epoch."""
        if not len(rest):
            return []
        starts = _partition.block_order(
            self.count, self.block_size, self.seed, self.epoch, self.shuffle, self._bounds()
        )
        by_start = np.argsort(starts)  # the k-th block in index order is visited at position by_start[k]
        block_of = np.searchsorted(starts[by_start], rest, side="right") - 1
        ordered = rest[np.lexsort((rest, by_start[block_of]))]
        span = _partition.rank_span(len(ordered), reader.rank, reader.world_size, self.drop_last)
        lo, hi = _partition.worker_span(span, reader.worker, reader.num_workers, unit)
        return runs_of(ordered[np.arange(lo, hi) % len(ordered)])
