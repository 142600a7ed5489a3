"""Read a reader's planned units ahead of the mixer, on a few threads, bounded in bytes.

The mixer knows every unit it will need and in which order (its *sequence*).
A :class:`ReadAhead` admits units in that order while the estimated bytes of
admitted, not yet taken units stay under a budget, and keeps one read in flight
per source: a thread takes a source with admitted units, joins up to
``per_read`` of them into one read (its first reads join fewer, so the first
window comes soon), and files the pieces as done. Every source
with units is opened (its first, possibly slow, read included) at once, each in
its own task, so cold starts overlap instead of adding up.

The mixer then :meth:`ReadAhead.pick`\\ s a unit: a given one (waiting for it),
or the first done one within a horizon of units (never waiting while one is
done), and :meth:`ReadAhead.take`\\ s it, which frees its budget for the next
admissions. Waits are counted and timed.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from torchrecord._mix_source import Chunk, Source

__all__ = ["ReadAhead"]

Run = tuple[int, int]


class ReadAhead:
    """Reads units of a reader ahead of use (see the module docstring); start it, then pick and take.

    Args:
        sources: the sources, by index.
        unit_source: the source of each unit (by unit index).
        unit_length: the samples of each unit.
        sequence: unit indices in the order they will be taken (the order of admission).
        runs_of: a unit's sample runs in its source.
        columns: read typed columns (fixed layout) rather than values.
        estimate: estimated bytes per sample of each source.
        max_bytes: budget of admitted, not yet taken units (one unit is always admitted).
        first_bytes: the budget until :meth:`widen` is called (the first window: readers
            that run far ahead would only slow down the mixer building it).
        threads: reading threads.
        per_read: units of one source joined into one read at most (a source's reads join 1, 2, 4, ... units).
    """

    def __init__(
        self,
        sources: Sequence[Source],
        unit_source: np.ndarray,
        unit_length: np.ndarray,
        sequence: Sequence[int],
        runs_of: Callable[[int], list[Run]],
        *,
        columns: bool,
        estimate: Sequence[int],
        max_bytes: int,
        first_bytes: int | None = None,
        threads: int,
        per_read: int = 32,
    ) -> None:
        self.sources, self.columns, self.runs_of = sources, columns, runs_of
        self.unit_source, self.unit_length = unit_source, unit_length
        self.sequence = list(sequence)
        self.cost = unit_length * np.asarray(estimate, np.int64)[unit_source] if len(unit_source) else unit_length
        self.max_bytes, self.per_read = max_bytes, per_read
        self.budget = min(max_bytes, first_bytes) if first_bytes else max_bytes
        self._cv = threading.Condition()
        self._queue: list[deque[int]] = [deque() for _ in sources]
        self._busy = [False] * len(sources)
        self._take = [1] * len(sources)  # units the next read of a source joins: 1, 2, 4, ... per_read
        self._opened = [False] * len(sources)
        self._waiting: deque[int] = deque()  # sources with admitted units and no read in flight
        self._done: dict[int, Chunk | BaseException] = {}
        self._ready: list[int] = []  # heap of done, not taken unit indices
        self._scan = 0
        self._held = 0
        self._stop = False
        self._threads: list[threading.Thread] = []
        wanted = {int(unit_source[i]) for i in self.sequence}
        self._thread_count = max(1, min(threads, len(wanted)))
        self.units_read = [0] * len(sources)
        self.reads = [0] * len(sources)
        self.waits = 0
        self.wait_seconds = 0.0

    # -- the threads ------------------------------------------------------------
    def start(self) -> ReadAhead:
        """Start the threads, then admit the first units (the threads open every source in use)."""
        for _ in range(self._thread_count):  # idle threads start fast: they wait for work without the GIL
            t = threading.Thread(target=self._run, name="torchrecord-readahead", daemon=True)
            t.start()
            self._threads.append(t)
        with self._cv:
            self._admit()
        return self

    def close(self) -> None:
        """Stop the threads (a read in progress finishes in the background) and drop what was read."""
        with self._cv:
            self._stop = True
            self._done.clear()
            self._ready.clear()
            self._cv.notify_all()

    def _admit(self) -> None:
        """Admit units in sequence order up to the budget, once a quarter of it is free (lock held).

        Admitting in bursts queues several units per source, so reads join them.
        """
        seq = self.sequence
        budget = self.budget
        if self._held > budget - budget // 4 and self._held > 0:
            return
        while self._scan < len(seq) and (self._held < budget or self._held == 0):
            i = seq[self._scan]
            self._scan += 1
            s = int(self.unit_source[i])
            self._queue[s].append(i)
            self._held += int(self.cost[i])
            if not self._busy[s] and len(self._queue[s]) == 1:
                self._waiting.append(s)
                self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting:
                    self._cv.wait()
                if self._stop:
                    return
                s = self._waiting.popleft()
                queue = self._queue[s]
                batch = [queue.popleft() for _ in range(min(self._take[s], len(queue)))]
                self._take[s] = min(self.per_read, 2 * self._take[s])  # small first reads: the first window comes soon
                self._busy[s] = True
            results = self._read(s, batch)
            with self._cv:
                self._busy[s] = False
                if self._stop:
                    return
                for i, result in zip(batch, results):
                    self._done[i] = result
                    heapq.heappush(self._ready, i)
                self.units_read[s] += len(batch)
                self.reads[s] += 1
                if self._queue[s]:
                    self._waiting.append(s)
                self._cv.notify_all()

    def _read(self, s: int, batch: list[int]) -> list[Chunk | BaseException]:
        try:
            if not self._opened[s]:
                self.sources[s].open()
                self._opened[s] = True
            runs: list[Run] = []
            for i in batch:
                for a, b in self.runs_of(i):
                    if runs and runs[-1][1] == a:
                        runs[-1] = (runs[-1][0], b)
                    else:
                        runs.append((a, b))
            chunk = self.sources[s].read(runs, self.columns)
            lengths = [int(self.unit_length[i]) for i in batch]
            if chunk.n != sum(lengths):
                raise RuntimeError(f"source {s} returned {chunk.n} samples for {sum(lengths)} asked for")
            return list(chunk.split(lengths))
        except BaseException as exc:  # handed to the mixer, raised where the unit is taken
            return [exc] * len(batch)

    # -- the mixer's side ---------------------------------------------------------
    def pick(self, first: int, horizon: int = 1) -> int:
        """Wait until unit ``first`` is read (``horizon`` 1), or any unit in [first, first + horizon) is; the smallest.

        Units below ``first`` must all be taken already.
        """
        with self._cv:
            waited: float | None = None
            while True:
                if first in self._done:
                    found = first
                    break
                if horizon > 1:
                    ready = self._ready
                    while ready and ready[0] not in self._done:
                        heapq.heappop(ready)
                    if ready and ready[0] < first + horizon:
                        found = ready[0]
                        break
                if waited is None:
                    waited = time.perf_counter()
                self._cv.wait()
            if waited is not None:
                self.waits += 1
                self.wait_seconds += time.perf_counter() - waited
            return found

    def widen(self) -> None:
        """Raise the budget to ``max_bytes``."""
        with self._cv:
            self.budget = self.max_bytes
            self._admit()

    def take(self, i: int) -> Chunk:
        """The read unit ``i`` (picked before); frees its budget. Raises what reading it raised."""
        with self._cv:
            result = self._done.pop(i)
            self._held -= int(self.cost[i])
            self._admit()
        if isinstance(result, BaseException):
            raise result
        return result
