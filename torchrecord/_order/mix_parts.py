"""A mix epoch dealt out to its readers: each reader's units and the windows it mixes them in (pure).

:class:`MixEpochPlan` is the :class:`~torchrecord._order.plan.EpochPlan` of
``MixedDataset``. Its positions are the mix epoch's global positions
``[0, total)`` (``torchrecord._order.mix_plan``); a reader's part
(:class:`MixPart`) is its units (pieces of draws), placed in plan order into
windows that ramp up from one batch (:func:`window_target`) and are permuted
on their own. With ``policy="exact"`` that placement is a function of the
samples handed out (:meth:`MixPart.placement_at`); with ``policy="ready"`` a
reader records its placement, and :meth:`MixPart.first` reads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from torchrecord._order import partition as _partition
from torchrecord._order import windows as _windows
from torchrecord._order.mix_plan import (
    MixPlan,
    Units,
    plan_epoch,
    reader_units,
    source_seed,
    stream_runs,
    units_of_positions,
)
from torchrecord._order.plan import Reader, WindowedPlan, runs_of
from torchrecord.errors import ArgumentError

__all__ = ["MixEpochPlan", "MixPart", "compress", "expand", "window_target"]

Run = tuple[int, int]


def window_target(j: int, window: int, step: int) -> int:
    """Samples window ``j`` holds at least: ``step`` at first, about half more per window, then ``window``.

    The ramp-up is a pure function (a resume point stores no sizes): multiples
    ``m * step`` with ``m`` = 1, 2, 3, 4, 6, 9, 13, ... (each ``m + m // 2``,
    at least ``m + 1``), capped at ``window``. ``step`` is the chunk the mixer
    hands out (the batch size); a step at or above ``window`` means no ramp.
    """
    if j < 0:
        raise ArgumentError(f"window index must be >= 0, got {j}")
    window = max(1, int(window))
    step = max(1, min(int(step), window))
    m = 1
    for _ in range(j):
        if m * step >= window:
            break
        m += max(1, m // 2)
    return min(window, m * step)


def compress(indices: Sequence[int]) -> list[list[int]]:
    """Indices as runs [a, b) of consecutive ascending values, in their order."""
    out: list[list[int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([int(i), int(i) + 1])
    return out


def expand(runs: Sequence[Sequence[int]]) -> list[int]:
    """The indices of :func:`compress`'s runs, in order."""
    return [i for a, b in runs for i in range(int(a), int(b))]


@dataclass(frozen=True)
class MixPart:
    """One mix reader's units and how it mixes them (see the module docstring)."""

    units: Units
    total: int
    seed: int
    epoch: int
    rank: int
    worker: int
    shuffle: bool
    window: int
    step: int

    @property
    def size(self) -> int:
        return self.units.samples

    def positions(self) -> np.ndarray:
        return self._positions(range(len(self.units)))

    def _positions(self, units: Sequence[int]) -> np.ndarray:
        u = self.units
        parts = [np.arange(int(u.position[i]), int(u.position[i] + u.length[i]), dtype=np.int64) for i in units]
        if not parts or self.total == 0:
            return np.zeros(0, np.int64)
        return np.concatenate(parts) % self.total

    def order(self, j: int, n: int) -> np.ndarray:
        """The permutation of window ``j`` of ``n`` samples."""
        if not self.shuffle:
            return np.arange(n)
        return _windows.window_order(n, seed=self.seed, epoch=self.epoch, rank=self.rank, worker=self.worker, window=j)

    @cached_property
    def _bounds(self) -> list[int]:
        """Where each window of plan-order placement starts, in units (and the end)."""
        lengths = self.units.length
        bounds, end, j = [0], 0, 0
        while end < len(lengths):
            target, acc = window_target(j, self.window, self.step), 0
            while acc < target and end < len(lengths):
                acc += int(lengths[end])
                end += 1
            bounds.append(end)
            j += 1
        return bounds

    def placement_at(self, n: int) -> dict[str, Any]:
        """The placement (a ``Placement`` state) of a reader that placed its units in plan order and handed out
        ``n`` samples."""
        if n <= 0 or not len(self.units):
            return {"window": -1, "members": [], "offset": 0, "prefix": 0, "extra": []}
        lengths = self.units.length
        bounds, before = self._bounds, 0
        for j in range(len(bounds) - 1):
            held = int(lengths[bounds[j] : bounds[j + 1]].sum())
            if n < before + held or j == len(bounds) - 2:
                members = list(range(bounds[j], bounds[j + 1]))
                offset = min(n - before, held)
                return {
                    "window": j,
                    "members": compress(members),
                    "offset": offset,
                    "prefix": bounds[j + 1],
                    "extra": [],
                }
            before += held
        raise AssertionError("unreachable: the last window holds the rest")

    def first(self, n: int, progress: Any = None) -> np.ndarray:
        """The positions of the first ``n`` samples handed out (``progress``: the reader's saved placement)."""
        placement = progress if isinstance(progress, Mapping) else self.placement_at(n)
        window, offset = int(placement["window"]), int(placement["offset"])
        members, extra = expand(placement["members"]), expand(placement["extra"])
        member_set = set(members)
        prefix = min(int(placement["prefix"]), len(self.units))
        placed = [i for i in range(prefix) if i not in member_set]
        placed += [i for i in extra if i not in member_set and i < len(self.units)]
        out = [self._positions(placed)]
        if members and offset:
            current = self._positions(members)
            out.append(current[self.order(window, len(current))[:offset]])
        return np.concatenate(out)


@dataclass(frozen=True, kw_only=True)
class MixEpochPlan(WindowedPlan):
    """A mix epoch over every reader: its draws (:func:`plan_epoch`), split like a record set's samples.

    Attributes:
        sizes: samples per source; blocks: each source's own block (:func:`order_block`).
        counts: samples per source this epoch; ``rates``: draw rates (``stop="all_once"`` with weights).
        draw_size: samples per draw; seed, epoch, shuffle: the order.
        window, step: samples per mixing window once ramped up, and the chunk the ramp starts from.
        drop_last, batch_size, loader_batch_size: as for a record set's plan.
    """

    sizes: tuple[int, ...]
    blocks: tuple[int, ...]
    counts: tuple[int, ...]
    rates: tuple[str, ...] | None
    draw_size: int
    step: int

    @cached_property
    def draws(self) -> MixPlan:
        """The epoch's draws over all ranks (without ``shuffle``: epoch 0's, the same every epoch)."""
        epoch = self.epoch if self.shuffle else 0
        return plan_epoch(self.counts, block=self.draw_size, seed=self.seed, epoch=epoch, rates=self.rates)

    def source_runs(self, source: int, stream: int, length: int) -> list[Run]:
        """The sample runs of ``length`` positions of source ``source``'s stream from ``stream`` on."""
        seed = source_seed(self.seed, source)
        return stream_runs(self.sizes[source], self.blocks[source], seed, stream, stream + length, self.shuffle)

    @property
    def total(self) -> int:
        return self.draws.total

    def part(self, reader: Reader, rest: np.ndarray | None = None) -> MixPart:
        unit = self.unit(reader.world_size, reader.num_workers)
        draws = self.draws
        if rest is None:
            units = reader_units(
                draws,
                rank=reader.rank,
                world_size=reader.world_size,
                worker=reader.worker,
                num_workers=reader.num_workers,
                drop_last=self.drop_last,
                batch_size=unit,
            )
        elif not len(rest):
            units = units_of_positions(draws, [])
        else:
            span = _partition.rank_span(len(rest), reader.rank, reader.world_size, self.drop_last)
            lo, hi = _partition.worker_span(span, reader.worker, reader.num_workers, unit)
            units = units_of_positions(draws, runs_of(rest[np.arange(lo, hi) % len(rest)]))
        return MixPart(
            units, draws.total, self.seed, self.epoch, reader.rank, reader.worker, self.shuffle, self.window, self.step
        )
