"""One reader's mix: its units taken into windows, each window permuted, handed out in chunks.

The reader's units (``torchrecord._mix_plan``) are read ahead
(``torchrecord._readahead``) and *placed* into windows of at least ``window``
samples, whole units at a time. Window ``j`` is permuted by
``torchrecord._order.window_order(n, seed, epoch, rank, worker, j)`` and handed
out in consecutive chunks that may cross windows. The window holds what the
sources returned: typed columns of stored bytes, or stored record values, so
nothing is decoded before the mix; each chunk is gathered (columns) or decoded
(values) only when it is handed out.

Two policies decide which unit is placed next:

* ``"exact"``: the next planned unit, waiting for it if it is not read yet;
  the order is a pure function of the plan (bit-for-bit reproducible);
* ``"ready"``: the first unit that is read among the next ``horizon``
  unplaced ones, so a slow source never stalls the others. The units, and so
  the samples, are exactly the planned ones; a unit moves at most ``horizon``
  units away from its planned place, after which the mixer waits for it.

:class:`Placement` is the whole position (plain ints): which units are placed,
the units of the current window (in planned order: a window's contents are a
set), and how many of its samples were handed out. Resuming rebuilds that window from those units
and continues; with ``"exact"`` the continuation is identical to an
uninterrupted run, with ``"ready"`` every planned sample is still handed out
exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchrecord._mix_source import Chunk, Source
from torchrecord._readahead import ReadAhead

__all__ = ["Mixer", "Picked", "Placement", "compress", "expand"]

Run = tuple[int, int]


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


@dataclass
class Placement:
    """Where a reader's mix stands (see the module docstring).

    Attributes:
        window: index of the current window (-1 before the first).
        members: its units, in planned order.
        offset: its samples handed out.
        prefix: units [0, prefix) are all placed.
        extra: units past ``prefix`` that are placed.
    """

    window: int = -1
    members: list[int] = field(default_factory=list)
    offset: int = 0
    prefix: int = 0
    extra: set[int] = field(default_factory=set)

    def to_state(self) -> dict[str, Any]:
        """Plain, JSON-serialisable values."""
        return {
            "window": self.window,
            "members": compress(self.members),
            "offset": self.offset,
            "prefix": self.prefix,
            "extra": compress(sorted(self.extra)),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Placement:
        return cls(
            int(state["window"]),
            expand(state["members"]),
            int(state["offset"]),
            int(state["prefix"]),
            set(expand(state["extra"])),
        )

    def place(self, i: int) -> None:
        if i == self.prefix:
            self.prefix += 1
            while self.prefix in self.extra:
                self.extra.discard(self.prefix)
                self.prefix += 1
        else:
            self.extra.add(i)

    def unplaced(self, count: int) -> list[int]:
        """The units not placed yet, in planned order."""
        return [i for i in range(self.prefix, count) if i not in self.extra]


@dataclass
class Picked:
    """A chunk handed out: typed columns (fixed layout) or decoded samples, and each sample's source."""

    source: np.ndarray
    columns: list[np.ndarray] | None = None
    samples: list[Any] | None = None

    def __len__(self) -> int:
        return len(self.source)


class _Window:
    """A built window: its units' contents joined, and its permutation."""

    def __init__(
        self,
        parts: list[tuple[int, Chunk]],
        order: np.ndarray | None,
        sources: Sequence[Source],
        buffers: list[np.ndarray] | None = None,
    ) -> None:
        self.sources = sources
        self.n = sum(c.n for _, c in parts)
        self.order = order if order is not None else np.arange(self.n)
        self.source = np.repeat([s for s, _ in parts], [c.n for _, c in parts]).astype(np.int64)
        chunks = [c for _, c in parts]
        self.columns: list[np.ndarray] | None = None
        self.items: list[tuple[int, Chunk, int]] | None = None
        if chunks and chunks[0].columns is not None:
            self.columns = []
            for f, cols in enumerate(zip(*(c.columns for c in chunks))):
                buffer = buffers[f] if buffers is not None and f < len(buffers) else None
                if buffer is None or len(buffer) < self.n or buffer.dtype != cols[0].dtype \
                        or buffer.shape[1:] != cols[0].shape[1:]:
                    buffer = np.empty((max(self.n, len(buffer) if buffer is not None else 0), *cols[0].shape[1:]),
                                      cols[0].dtype)
                self.columns.append(np.concatenate(cols, out=buffer[: self.n]))
            self.buffers = [c.base if c.base is not None else c for c in self.columns]
        else:
            self.items = [(s, c, i) for s, c in parts for i in range(c.n)]

    def pick(self, a: int, b: int) -> Picked:
        sel = self.order[a:b]
        source = self.source[sel]
        if self.columns is not None:
            return Picked(source, columns=[col[sel] for col in self.columns])
        assert self.items is not None
        samples = []
        for k in sel.tolist():
            s, chunk, i = self.items[k]
            if chunk.values is not None:
                assert chunk.records is not None
                samples.append(self.sources[s].decode(chunk.values[i], chunk.records[i]))
            else:
                assert chunk.samples is not None
                samples.append(chunk.samples[i])
        return Picked(source, samples=samples)


def _join(parts: list[Picked]) -> Picked:
    if len(parts) == 1:
        return parts[0]
    source = np.concatenate([p.source for p in parts])
    if parts[0].columns is not None:
        return Picked(source, columns=[np.concatenate(c) for c in zip(*(p.columns for p in parts))])
    return Picked(source, samples=[s for p in parts for s in p.samples])  # type: ignore[union-attr]


class Mixer:
    """Places a reader's units into permuted windows and hands out chunks (see the module docstring).

    Args:
        sources: the sources, by index.
        unit_source, unit_length: the source and samples of each unit, in planned order.
        runs_of: a unit's sample runs in its source.
        window: samples per window at least (whole units).
        order: ``order(j, n)``, the permutation of window ``j`` of ``n`` samples (None: keep).
        horizon: 1 for ``"exact"``, more for ``"ready"``.
        placement: where to start (a fresh epoch: ``Placement()``); updated as chunks are handed out.
        readahead: keyword arguments of :class:`~torchrecord._readahead.ReadAhead`
            (``columns``, ``estimate``, ``max_bytes``, ``first_bytes``, ``threads``).
    """

    def __init__(
        self,
        sources: Sequence[Source],
        unit_source: np.ndarray,
        unit_length: np.ndarray,
        runs_of: Callable[[int], list[Run]],
        *,
        window: int,
        order: Callable[[int, int], np.ndarray | None],
        horizon: int,
        placement: Placement,
        readahead: dict[str, Any],
    ) -> None:
        self.sources = sources
        self.unit_source, self.unit_length = unit_source, unit_length
        self.window, self.order, self.horizon = max(1, window), order, max(1, horizon)
        self.placement = placement
        self.deferrals = 0
        self.handed = np.zeros(len(sources), np.int64)  # samples handed out per source
        self._buffers: list[np.ndarray] | None = None  # window storage, reused: batches are gathered copies
        members_left = placement.offset < self._samples(placement.members)
        self._rebuild = list(placement.members) if members_left else []
        sequence = self._rebuild + placement.unplaced(len(unit_source))
        self.reader = ReadAhead(sources, unit_source, unit_length, sequence, runs_of, **readahead)

    def _samples(self, units: Sequence[int]) -> int:
        return int(self.unit_length[list(units)].sum()) if len(units) else 0

    def chunks(self, size: int, *, cross: bool = True) -> Iterator[Picked]:
        """Consecutive chunks of ``size`` samples until the reader's units run out.

        ``cross``: chunks run on across windows (only the last may be short);
        otherwise a chunk ends where its window ends.
        """
        self.reader.start()
        try:
            yield from self._chunks(size, cross)
        finally:
            self.reader.close()

    def _chunks(self, size: int, cross: bool) -> Iterator[Picked]:
        p = self.placement
        current: _Window | None = None
        if self._rebuild:
            parts = []
            for i in self._rebuild:
                self.reader.pick(i, 1)
                parts.append((int(self.unit_source[i]), self.reader.take(i)))
            current = _Window(parts, self.order(p.window, sum(c.n for _, c in parts)), self.sources)
        pending: list[Picked] = []
        held = 0
        widened = False
        while True:
            if current is None or p.offset >= current.n:
                if pending and not cross:
                    yield _join(pending)
                    pending, held = [], 0
                current = self._next_window()
                if current is None:
                    break
                if not widened:  # the first window is built: read ahead the full budget from now on
                    self.reader.widen()
                    widened = True
            n = min(size - held, current.n - p.offset)
            piece = current.pick(p.offset, p.offset + n)
            p.offset += n
            self.handed += np.bincount(piece.source, minlength=len(self.sources))
            pending.append(piece)
            held += n
            if held == size:
                yield _join(pending)
                pending, held = [], 0
        if pending:
            yield _join(pending)

    def _next_window(self) -> _Window | None:
        p = self.placement
        count = len(self.unit_source)
        parts: list[tuple[int, Chunk]] = []
        members: list[int] = []
        samples = 0
        while samples < self.window and p.prefix < count:
            i = self.reader.pick(p.prefix, self.horizon)
            if i != p.prefix:
                self.deferrals += 1
            chunk = self.reader.take(i)
            p.place(i)
            members.append(i)
            parts.append((int(self.unit_source[i]), chunk))
            samples += chunk.n
        if not parts:
            return None
        # a window holds its units in planned order (whatever order they were read in): its contents
        # are then a set, which the state keeps as a few runs
        by_plan = sorted(range(len(members)), key=members.__getitem__)
        members, parts = [members[k] for k in by_plan], [parts[k] for k in by_plan]
        p.window += 1
        p.members, p.offset = members, 0
        window = _Window(parts, self.order(p.window, samples), self.sources, self._buffers)
        if window.columns is not None:
            self._buffers = window.buffers
        return window

