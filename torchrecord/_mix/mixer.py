"""One reader's mix: its units taken into windows, each window permuted, handed out in chunks.

The reader's units (``torchrecord._order.mix_plan``) are read ahead
(``torchrecord._mix.readahead``) and *placed* into windows, whole units at a time:
window ``j`` holds at least :func:`window_target` ``(j)`` samples, which starts
at one chunk (a batch) and grows by about half per window up to ``window``
(the ramp-up: the first batch waits for one batch of draws, not for a whole
shuffle buffer). Window ``j`` is permuted by
``torchrecord._order.windows.window_order(n, seed, epoch, rank, worker, j)`` and handed
out in consecutive chunks that may cross windows. The window holds what the
sources returned: typed columns of stored bytes, or stored record values, so
nothing is decoded before the mix; each chunk is gathered (columns) or decoded
(values) only when it is handed out.

The next window is filled *while* the current one is handed out: before each
chunk, the mixer takes units into it in proportion to the part of the current
window already handed out, copying their columns into a reused buffer, and
completes it when the current window ends. Each chunk so waits for about one
chunk of reading, never for a whole window, and no window is joined at once.

Two policies decide which unit is placed next:

* ``"exact"``: the next planned unit, waiting for it if it is not read yet;
  the order is a pure function of the plan (bit-for-bit reproducible);
* ``"ready"``: the first unit that is read among the next ``horizon``
  unplaced ones, so a slow source never stalls the others. The units, and so
  the samples, are exactly the planned ones; a unit moves at most ``horizon``
  units away from its planned place, after which the mixer waits for it.

:class:`Placement` is the whole position (plain ints): which units are placed,
the units of the current window (in planned order: a window's contents are a
set), and how many of its samples were handed out. Units taken into the next
window are not in it until that window begins (a resumed reader takes them
again). Resuming rebuilds the current window from its units and continues; with
``"exact"`` the continuation is identical to an uninterrupted run, with
``"ready"`` every planned sample is still handed out exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrecord._mix.placement import Placement
from torchrecord._mix.readahead import ReadAhead
from torchrecord._mix.source import Chunk, Source
from torchrecord._order.mix_parts import window_target

__all__ = ["Mixer", "Picked"]

Run = tuple[int, int]


@dataclass
class Picked:
    """A chunk handed out: typed columns (fixed layout) or decoded samples, and each sample's source."""

    source: np.ndarray
    columns: list[np.ndarray] | None = None
    samples: list[Any] | None = None

    def __len__(self) -> int:
        return len(self.source)


def _put(dst: np.ndarray, at: int, part: np.ndarray) -> None:
    """``dst[at : at + len(part)] = part`` as one memcpy that keeps the GIL.

    numpy lets the GIL go for a copy of this size, and getting it back from busy
    read-ahead threads costs the mixer a switch interval (5 ms) or more.
    """
    n = len(part)
    if (
        n
        and dst.flags.c_contiguous
        and part.flags.c_contiguous
        and part.dtype == dst.dtype
        and part.shape[1:] == dst.shape[1:]
    ):
        row = dst.itemsize * int(np.prod(dst.shape[1:], dtype=np.int64))
        dst.reshape(-1).view(np.uint8).data[at * row : (at + n) * row] = part.reshape(-1).view(np.uint8).data
    elif n:
        dst[at : at + n] = part


class _Window:
    """A window filled unit by unit (columns copied into reused buffers), then sealed with its permutation."""

    def __init__(self, sources: Sequence[Source], capacity: int, spare: list[np.ndarray] | None) -> None:
        self.sources = sources
        self.capacity = max(1, capacity)
        self.spare = spare  # column buffers of a window handed out (its batches were copies)
        self.n = 0
        self.units: list[tuple[int, int, int]] = []  # (unit, first row, rows), in the order taken
        self.source_parts: list[np.ndarray] = []
        self.columns: list[np.ndarray] | None = None
        self.items: list[tuple[int, Chunk, int]] | None = None
        self.sel = np.zeros(0, np.int64)  # the row of each position handed out (after seal)
        self.source = np.zeros(0, np.int64)

    def add(self, unit: int, s: int, chunk: Chunk) -> None:
        n = chunk.n
        if chunk.columns is not None:
            self._fit(chunk.columns, self.n + n)
            assert self.columns is not None
            for col, part in zip(self.columns, chunk.columns):
                _put(col, self.n, part)
        else:
            if self.items is None:
                self.items = []
            self.items.extend((s, chunk, i) for i in range(n))
        self.units.append((unit, self.n, n))
        self.source_parts.append(np.full(n, s, np.int64))
        self.n += n

    def _fit(self, like: list[np.ndarray], rows: int) -> None:
        """Column buffers with room for ``rows`` rows (the spare ones when they fit)."""
        if self.columns is None:
            spare = self.spare
            if (
                spare is not None
                and len(spare) == len(like)
                and all(
                    len(b) >= self.capacity and b.dtype == c.dtype and b.shape[1:] == c.shape[1:]
                    for b, c in zip(spare, like)
                )
            ):
                self.columns = spare
            else:
                self.columns = [np.empty((self.capacity, *c.shape[1:]), c.dtype) for c in like]
            self.spare = None
        if rows > len(self.columns[0]):  # a unit longer than planned for: grow (copies what is in)
            size = max(rows, 2 * len(self.columns[0]))
            grown = [np.empty((size, *c.shape[1:]), c.dtype) for c in self.columns]
            for g, c in zip(grown, self.columns):
                g[: self.n] = c[: self.n]
            self.columns = grown

    def seal(self, order: np.ndarray | None) -> list[int]:
        """Fix the permutation (over the units in planned order); returns the units in planned order."""
        by_plan = sorted(self.units)
        if by_plan == self.units:
            rows = np.arange(self.n, dtype=np.int64)
        else:  # "ready": taken out of plan order; the permutation is over the planned order all the same
            rows = np.concatenate([np.arange(a, a + n, dtype=np.int64) for _, a, n in by_plan])
        self.sel = rows[order] if order is not None else rows
        self.source = np.concatenate(self.source_parts) if self.source_parts else np.zeros(0, np.int64)
        return [u for u, _, _ in by_plan]

    def pick(self, a: int, b: int) -> Picked:
        sel = self.sel[a:b]
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
        window: samples per window at least, once ramped up (whole units).
        step: the chunk the ramp-up starts from (the batch size).
        order: ``order(j, n)``, the permutation of window ``j`` of ``n`` samples (None: keep).
        horizon: 1 for ``"exact"``, more for ``"ready"``.
        placement: where to start (a fresh epoch: ``Placement()``); updated as chunks are handed out.
        readahead: keyword arguments of :class:`~torchrecord._mix.readahead.ReadAhead`
            (``columns``, ``estimate``, ``max_bytes``, ``threads``).
    """

    def __init__(
        self,
        sources: Sequence[Source],
        unit_source: np.ndarray,
        unit_length: np.ndarray,
        runs_of: Callable[[int], list[Run]],
        *,
        window: int,
        step: int,
        order: Callable[[int, int], np.ndarray | None],
        horizon: int,
        placement: Placement,
        readahead: dict[str, Any],
    ) -> None:
        self.sources = sources
        self.unit_source, self.unit_length = unit_source, unit_length
        self.window, self.order, self.horizon = max(1, window), order, max(1, horizon)
        self.step = max(1, step)
        self.placement = placement
        self.deferrals = 0
        self.taken = 0  # samples taken from the read-ahead into windows
        self.handed = np.zeros(len(sources), np.int64)  # samples handed out per source
        p = placement
        members_left = p.offset < self._samples(p.members)
        self._rebuild = list(p.members) if members_left else []
        # units placed or taken into the next window (placement holds only windows begun)
        self._ahead = Placement(prefix=p.prefix, extra=set(p.extra))
        self._longest = int(unit_length.max()) if len(unit_length) else 1
        self._spare: list[np.ndarray] | None = None
        self._next: _Window | None = None
        sequence = self._rebuild + p.unplaced(len(unit_source))
        self.reader = ReadAhead(sources, unit_source, unit_length, sequence, runs_of, **readahead)

    def _samples(self, units: Sequence[int]) -> int:
        return int(self.unit_length[list(units)].sum()) if len(units) else 0

    def _target(self, j: int) -> int:
        return window_target(j, self.window, self.step)

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
        current = self._restore() if self._rebuild else None
        pending: list[Picked] = []
        held = 0
        while True:
            if current is None or p.offset >= current.n:
                if pending and not cross:
                    yield _join(pending)
                    pending, held = [], 0
                if current is not None and current.columns is not None:
                    self._spare = current.columns  # its batches were gathered copies
                current = self._begin_next()
                if current is None:
                    break
            n = min(size - held, current.n - p.offset)
            # fill the next window in step with this one: each chunk waits for about a chunk of reading
            self._fill(-(-self._target(p.window + 1) * p.offset // current.n))
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

    def _restore(self) -> _Window:
        """The current window of a resume point, rebuilt from its units (read first)."""
        p = self.placement
        window = _Window(self.sources, self._samples(self._rebuild), None)
        for i in self._rebuild:
            self.reader.pick(i, 1)
            chunk = self.reader.take(i)
            window.add(i, int(self.unit_source[i]), chunk)
            self.taken += chunk.n
        window.seal(self.order(p.window, window.n))
        return window

    def _fill(self, want: int) -> None:
        """Take units into the next window until it holds ``want`` samples (or the units run out)."""
        nxt = self._next
        if nxt is None:
            nxt = self._next = _Window(
                self.sources, self._target(self.placement.window + 1) + self._longest, self._spare
            )
            self._spare = None
        ahead = self._ahead
        count = len(self.unit_source)
        while nxt.n < want and ahead.prefix < count:
            i = self.reader.pick(ahead.prefix, self.horizon)
            if i != ahead.prefix:
                self.deferrals += 1
            chunk = self.reader.take(i)
            ahead.place(i)
            nxt.add(i, int(self.unit_source[i]), chunk)
            self.taken += chunk.n

    def _begin_next(self) -> _Window | None:
        """Complete the next window, make it the current one (placing its units), or None at the end."""
        p = self.placement
        self._fill(self._target(p.window + 1))
        window, self._next = self._next, None
        if window is None or not window.units:
            return None
        members = window.seal(self.order(p.window + 1, window.n))
        for i in members:
            p.place(i)
        p.window += 1
        p.members, p.offset = members, 0
        return window
