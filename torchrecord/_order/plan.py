"""An epoch's plan: which reader reads which positions, in what order, and what a position leaves (pure).

Every streaming dataset decides its order with an :class:`EpochPlan`: a pure
function of its settings, the epoch and the world (ranks x DataLoader workers).
A plan numbers what an epoch visits by *positions* (sample indices of a record
set, global positions of a mix, steps of a stream) and gives each
:class:`Reader` its :class:`Part`: the positions it visits, in the order it
hands them out.

The resume model is the same for every dataset: a reader's progress is the
number of items it yielded, so the positions it handed out are the first ones of
its part (:meth:`Part.first`). A *position* of a whole run (rows ``[rank,
worker, yielded]`` for every reader, see ``torchrecord._read.state``) therefore
says, with nothing read, which positions are done (:meth:`EpochPlan.rest`), and
the rest of the epoch can be split over any other world (:meth:`EpochPlan.part`
with ``rest``). A position resumed that way becomes the ``base`` of the next
one, so a run can change its world again within the same epoch.
"""

from __future__ import annotations

import dataclasses
import itertools
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from torchrecord._order import partition as _partition

__all__ = ["EpochPlan", "Part", "Reader", "WindowedPlan", "items_of", "runs_of"]

Run = tuple[int, int]


@dataclass(frozen=True)
class Reader:
    """One reader of an epoch: a (rank, DataLoader worker) pair, and how many of each there are."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1


class Part(Protocol):
    """What one reader visits in an epoch: positions, in the order it hands them out."""

    @property
    def size(self) -> int:
        """Positions in the part (samples, or steps of a stream)."""
        ...

    def positions(self) -> np.ndarray:
        """Every position of the part (int64, any order)."""
        ...

    def first(self, n: int, progress: Any = None) -> np.ndarray:
        """The positions of the first ``n`` samples the reader hands out (``progress``: a reader's own record of
        them, where its order is not a function of ``n`` alone)."""
        ...


def runs_of(indices: np.ndarray) -> list[Run]:
    """Runs ``[a, b)`` of consecutive values of ``indices``, in their order (one run per ascending stretch)."""
    if not len(indices):
        return []
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    bounds = np.concatenate(([0], breaks, [len(indices)]))
    return [(int(indices[a]), int(indices[b - 1]) + 1) for a, b in itertools.pairwise(bounds)]


def items_of(samples: int, per_item: int, drop_last: bool) -> int:
    """Items a reader of ``samples`` samples yields: samples, or batches of ``per_item`` (the short one unless
    ``drop_last``)."""
    if per_item <= 1:
        return samples
    return samples // per_item if drop_last else -(-samples // per_item)


class EpochPlan(ABC):
    """One epoch's order over every reader (a subclass per kind of dataset, a frozen dataclass).

    Attributes:
        batch_size: samples per item in batch mode (None: items are single samples).
        loader_batch_size: per-sample mode, the DataLoader's batch size (worker shares are cut on it).
        drop_last: ranks cut the remainder (else pad by wrapping); a reader drops its short batch.
    """

    batch_size: int | None = None
    loader_batch_size: int | None = None
    drop_last: bool = False

    @property
    @abstractmethod
    def total(self) -> int:
        """Positions in the epoch over all ranks (before padding or cutting for them)."""

    @property
    def per_item(self) -> int:
        """Samples per item the readers yield (the batch size, or 1)."""
        return self.batch_size or 1

    @property
    def key(self) -> tuple[Any, ...]:
        """The plan's settings, hashable: two plans with one key give the same parts."""
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        return (type(self).__name__, *(getattr(self, f.name) for f in fields))

    def unit(self, world_size: int, num_workers: int) -> int:
        """What a rank's span is cut on among ``num_workers`` workers (``torchrecord._order.partition``)."""
        per_rank = _partition.samples_per_rank(self.total, world_size, self.drop_last)
        return _partition.worker_unit(per_rank, num_workers, self.batch_size, self.loader_batch_size)

    @abstractmethod
    def part(self, reader: Reader, rest: np.ndarray | None = None) -> Part:
        """Reader ``reader``'s part of the epoch, or with ``rest`` (sorted positions) its part of that rest."""

    def items(self, part: Part) -> int:
        """Items a reader of ``part`` yields."""
        return items_of(part.size, self.per_item, self.drop_last)

    def samples(self, items: int, part: Part) -> int:
        """Samples handed out once ``items`` items of ``part`` were yielded."""
        return min(part.size, items * self.per_item)

    def reader_part(self, reader: Reader, base: Mapping[str, Any] | None) -> Part:
        """``reader``'s part: of the epoch, or of what position ``base`` left."""
        return self.part(reader, None if base is None else self.rest(base))

    def rest(self, position: Mapping[str, Any]) -> np.ndarray:
        """The positions a position's readers did not hand out (sorted), from the plan alone.

        Pure: every reader's part is rebuilt (from the position's own base, recursively) and its
        first ``yielded`` items' positions are taken out. A reader's ``progress`` (the optional
        fourth value of its row) is passed to :meth:`Part.first`.
        """
        key = (self.key, _freeze(position))
        cached = _REST_CACHE.get(key)
        if cached is not None:
            return cached
        base = position.get("base")
        world, workers = int(position["world_size"]), int(position["num_workers"])
        rows = {(int(row[0]), int(row[1])): row[2:] for row in position["readers"]}
        planned: list[np.ndarray] = []
        done: list[np.ndarray] = []
        rest_of_base = None if base is None else self.rest(base)
        for rank in range(world):
            for worker in range(workers):
                part = self.part(Reader(rank, world, worker, workers), rest_of_base)
                planned.append(part.positions())
                row = rows.get((rank, worker))
                if row:
                    progress = row[1] if len(row) > 1 else None
                    done.append(part.first(self.samples(int(row[0]), part), progress))
        out = np.setdiff1d(_unique(planned), _unique(done), assume_unique=True)
        if len(_REST_CACHE) > 8:
            _REST_CACHE.clear()
        _REST_CACHE[key] = out
        return out


@dataclass(frozen=True, kw_only=True)
class WindowedPlan(EpochPlan):
    """The settings of a plan whose readers hand their part out in permuted windows (records, windows, a mix).

    Attributes:
        seed, epoch, shuffle: the order (``shuffle=False``: no permutation).
        window: positions per permuted window (a mix's once ramped up).
    """

    seed: int
    epoch: int
    shuffle: bool
    window: int
    drop_last: bool = False
    batch_size: int | None = None
    loader_batch_size: int | None = None


#: rest() of the latest positions: a worker resuming elastically asks for it once per reader it rebuilds
_REST_CACHE: dict[Any, np.ndarray] = {}


def _unique(parts: Sequence[np.ndarray]) -> np.ndarray:
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def _freeze(value: Any) -> Any:
    """A hashable copy of a position's plain values (dicts and lists), for the cache of :meth:`EpochPlan.rest`."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value
