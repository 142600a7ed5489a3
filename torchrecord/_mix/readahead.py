"""Read a reader's planned units ahead of the mixer, on a few threads, bounded in bytes.

The mixer knows every unit it will need and in which order (its *sequence*).
A :class:`ReadAhead` admits units in that order while the estimated bytes of
admitted, not yet taken units stay under a budget, and keeps one read in flight
per source: a free thread takes the source whose next admitted unit comes first
in the sequence (so the first planned draws are read first, and a deep budget
does not delay them), joins up to ``per_read`` of its units into one read (its
first reads join fewer, so the first window comes soon), and files the pieces
as done. Sources are opened in their first read, each in its
own task, so cold starts overlap instead of adding up.

Reading a fast source is Python work under the GIL: threads that read at once
gain nothing, and each busy one makes the mixer wait longer to get the GIL back
after it waited (CPython hands the GIL to one waiting thread per switch
interval, 5 ms). So at most ``slots`` reads run at once, except that a read
still running after ``lease`` seconds (a source that is stalled, sleeping or
waiting on I/O, so not holding the GIL) stops counting: a slow source never
holds up the others, and idle threads wait for work without the GIL.

The mixer then :meth:`ReadAhead.pick`\\ s a unit: a given one (waiting for it),
or the first done one within a horizon of units (never waiting while one is
done), and :meth:`ReadAhead.take`\\ s it, which frees its budget for the next
admissions. It is woken only when a unit it waits for is done. Waits are
counted and timed.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from torchrecord._mix.source import Chunk, Source
from torchrecord.errors import InternalError

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
        threads: reading threads (at most one per source in use).
        per_read: units of one source joined into one read at most (a source's reads join 1, 2, 4, ...
            units; reads of about 8 draws of 16 samples cost least per sample, longer ones more).
        slots: reads that run at once, not counting those past their lease.
        lease: seconds after which a running read stops counting against ``slots``.
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
        threads: int,
        per_read: int = 8,
        slots: int = 2,
        lease: float = 0.01,
    ) -> None:
        self.sources, self.columns, self.runs_of = sources, columns, runs_of
        self.unit_source, self.unit_length = unit_source, unit_length
        self.sequence = list(sequence)
        self.cost = unit_length * np.asarray(estimate, np.int64)[unit_source] if len(unit_source) else unit_length
        self.per_read, self.slots, self.lease = max(1, per_read), max(1, slots), lease
        self.budget = max(1, int(max_bytes))
        self._rank = np.zeros(len(unit_source), np.int64)  # each unit's place in the sequence
        self._rank[np.asarray(self.sequence, np.int64)] = np.arange(len(self.sequence))
        self._pid = os.getpid()  # the threads and the lock's holders live in this process only
        lock = threading.Lock()
        self._cv = threading.Condition(lock)  # the readers wait on it for work or a slot
        self._got = threading.Condition(lock)  # the mixer waits on it for its units
        self._want = (0, 0)  # the units [a, b) the mixer waits for (one of them)
        self._queue: list[deque[int]] = [deque() for _ in sources]
        self._take = [1] * len(sources)  # units the next read of a source joins: 1, 2, 4, ... per_read
        self._opened = [False] * len(sources)
        self._waiting: list[tuple[int, int]] = []  # heap (place of its next unit, source): admitted, not in flight
        self._running: dict[int, float] = {}  # source -> when its read began
        self._standby = False  # one idle thread watches the leases (the others wait without a timeout)
        self._done: dict[int, Chunk | BaseException] = {}
        self._ready: list[int] = []  # heap of done, not taken unit indices
        self._scan = 0
        self._held = 0
        self._stop = False
        self._threads: list[threading.Thread] = []
        used = np.bincount(unit_source[np.asarray(self.sequence, np.int64)], minlength=len(sources))
        wanted = int(np.count_nonzero(used))  # (np.unique would import numpy.ma: 90 ms in the first batch)
        self._thread_count = max(1, min(threads, wanted))
        self.units_read = [0] * len(sources)
        self.reads = [0] * len(sources)
        self.waits = 0
        self.wait_seconds = 0.0

    # -- the threads ------------------------------------------------------------
    def start(self) -> ReadAhead:
        """Start the threads, then admit the first units.

        The first thread starts the others (each start waits for the new thread to
        run: milliseconds the first batch need not wait for).
        """
        self._spawn(self._spawn_then_run)
        with self._cv:
            self._admit()
        return self

    def _spawn(self, target: Callable[[], None]) -> None:
        t = threading.Thread(target=target, name="torchrecord-readahead", daemon=True)
        t.start()
        self._threads.append(t)

    def _spawn_then_run(self) -> None:
        for _ in range(self._thread_count - 1):  # idle threads wait for work without the GIL
            if self._stop:
                break
            self._spawn(self._run)
        self._run()

    def close(self) -> None:
        """Stop the threads (a read in progress finishes in the background) and drop what was read.

        In a forked child (a DataLoader worker that inherited a read-ahead of the
        parent, closed when the child collects it) there are no threads to stop,
        and the lock may be held forever by a parent thread that does not exist
        here: nothing is touched.
        """
        if os.getpid() != self._pid:
            return
        with self._cv:
            self._stop = True
            self._done.clear()
            self._ready.clear()
            self._cv.notify_all()
            self._got.notify_all()

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
            if s not in self._running and len(self._queue[s]) == 1:
                heapq.heappush(self._waiting, (int(self._rank[i]), s))
                self._cv.notify()

    def _slot_wait(self) -> float | None:
        """None when a read may start now, else how long until a running read's lease ends (lock held)."""
        now = time.perf_counter()
        fresh = [now - t for t in self._running.values() if now - t < self.lease]
        if len(fresh) < self.slots:
            return None
        return self.lease - max(fresh)

    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._stop:
                        return
                    if self._waiting:
                        wait = self._slot_wait()
                        if wait is None:
                            break
                        if not self._standby:  # watch the leases: a stalled read frees its slot
                            self._standby = True
                            self._cv.wait(max(wait, 0.0005))
                            self._standby = False
                            continue
                    self._cv.wait()
                _, s = heapq.heappop(self._waiting)
                if self._waiting and not self._standby:
                    self._cv.notify()  # more work: an idle thread starts it, or watches the leases
                queue = self._queue[s]
                batch = [queue.popleft() for _ in range(min(self._take[s], len(queue)))]
                self._take[s] = min(self.per_read, 2 * self._take[s])  # small first reads: the first window comes soon
                self._running[s] = time.perf_counter()
            results = self._read(s, batch)
            with self._cv:
                del self._running[s]
                if self._stop:
                    return
                for i, result in zip(batch, results):
                    self._done[i] = result
                    heapq.heappush(self._ready, i)
                self.units_read[s] += len(batch)
                self.reads[s] += 1
                if self._queue[s]:
                    heapq.heappush(self._waiting, (int(self._rank[self._queue[s][0]]), s))
                a, b = self._want
                if any(a <= i < b for i in batch):  # wake the mixer only for what it waits for:
                    self._got.notify()  # each wake-up costs it the GIL back from busy readers

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
                raise InternalError(f"source {s} returned {chunk.n} samples for {sum(lengths)} asked for")
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
                if self._stop:
                    raise InternalError("the read-ahead was closed while the mixer waited for a unit")
                if waited is None:
                    waited = time.perf_counter()
                self._want = (first, first + horizon)
                self._got.wait()
            self._want = (0, 0)
            if waited is not None:
                self.waits += 1
                self.wait_seconds += time.perf_counter() - waited
            return found

    def take(self, i: int) -> Chunk:
        """The read unit ``i`` (picked before); frees its budget. Raises what reading it raised."""
        with self._cv:
            result = self._done.pop(i)
            self._held -= int(self.cost[i])
            self._admit()
        if isinstance(result, BaseException):
            raise result
        return result
