"""The open walks of one reader over a record set's shards: opened on first use, closed after their last window.

A :class:`~torchrecord._read.reader.ShareReader` (and ``RecordBlock``) reads a set,
file or sharded, through one :class:`~torchrecord._store.walk.Walk` a shard. This
module keeps those walks, the read-ahead hints given for them, and the checksums
they deferred to a helper thread (``torchrecord._store.checks_ahead``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from torchrecord._store import advise as _advise
from torchrecord._store.advise import Advisor
from torchrecord._store.checks_ahead import ChecksAhead
from torchrecord._store.record_file import RecordFile, shard_file
from torchrecord._store.record_set import RecordSet
from torchrecord._store.walk import DeferredCheck, Walk, record_runs

__all__ = ["LocalRun", "ShardWalks"]

#: (shard, start, stop): a run of sample indices inside one shard
LocalRun = tuple[int, int, int]


class ShardWalks:
    """The open walks of one reader, one per shard, opened on first use and closed after their last window.

    Args:
        file: the set (a RecordFile: one shard; a ShardedSet: several).
        plan: the (shard, start, stop) pieces of each window the reader reads, in order.
        verify, buffers, defer_checks: as for :class:`~torchrecord._store.walk.Walk`
            (``verify``: its ``crc_db``).
    """

    def __init__(
        self,
        file: RecordSet,
        plan: Sequence[Sequence[LocalRun]],
        *,
        verify: bool,
        buffers: bool,
        defer_checks: bool = False,
    ) -> None:
        self.set, self.verify, self.buffers = file, verify, buffers
        self._deferred: list[DeferredCheck] | None = [] if defer_checks else None  # every walk's, in read order
        self._ahead: list[ChecksAhead] = []  # checks computing on a helper thread over open walks
        self.counts = np.diff(file.shard_offsets).tolist()
        self._walks: dict[int, tuple[RecordFile, Walk]] = {}
        self._advisors: dict[int, Advisor] = {}
        self._warm: set[int] = set()  # shards found in the page cache: no read-ahead hints
        self._can_advise = _advise.available()  # asked once, not once a window (it looks for a file)
        self.records_read = 0
        self.plan = [{s for s, _, _ in pieces} for pieces in plan]  # the shards of each window
        order: list[int] = []  # the shards in the order they are needed (a remote set fetches ahead)
        for pieces in plan:
            for s, _, _ in pieces:
                if not order or order[-1] != s:
                    order.append(s)
        file.prefetch(order)

    def walk(self, s: int) -> Walk:
        """The open walk over shard ``s`` (opening, and for a remote set fetching, it first)."""
        held = self._walks.get(s)
        if held is None:
            file = shard_file(self.set, s)
            env, db = file.environment()
            crc_db = file.crc_db if self.verify else None
            blocks = file.crc_blocks() if crc_db is not None else None
            options: dict[str, Any] = {"buffers": self.buffers, "defer_checks": self._deferred}
            walk = Walk(env, db, file.path, crc_db=crc_db, crc_blocks=blocks, **options).__enter__()
            held = self._walks[s] = (file, walk)
        return held[1]

    def _take_deferred(self) -> list[DeferredCheck]:
        if not self._deferred:
            return []
        checks = self._deferred[:]
        self._deferred.clear()  # the list the walks append to
        return checks

    def settle_deferred(self) -> None:
        """Settle, here and now, the checks the walks deferred (before a record is decoded)."""
        for check in self._take_deferred():
            check.settle()

    def checks_ahead(self, need: np.ndarray) -> ChecksAhead | None:
        """The checks the walks deferred since the last call (one window's), computed from now on on a helper
        thread in the order of ``need`` (the window rows in the order its batches use them); None if none."""
        checks = self._take_deferred()
        if not checks:
            return None
        self._ahead = [a for a in self._ahead if not a.done]
        self._ahead.append(ChecksAhead(checks, need, self._ahead[-1] if self._ahead else None))
        return self._ahead[-1]

    def advise(self, pieces: Sequence[LocalRun]) -> None:
        """Ask the kernel to read the records of ``pieces`` ahead (shards already open; see ``_advise``)."""
        if not pieces or not self._can_advise or self._warm_file:
            return
        runs: dict[int, list[tuple[int, int]]] = {}
        for s, start, stop in pieces:
            if s in self._walks or self.set.num_shards == 1:
                runs.setdefault(s, []).append((start, stop))
        for s, sample_runs in runs.items():
            if s in self._warm:
                continue
            advisor = self._advisors.get(s)
            if advisor is None:
                file, walk = self.file(s), self.walk(s)
                if _advise.resident(file.path):  # checked once per shard and reader (an epoch, a worker)
                    self._warm.add(s)
                    continue
                record_bytes = os.path.getsize(file.path) // max(1, file.num_records)
                try:
                    advisor = self._advisors[s] = Advisor(walk.env, walk.db, file.path, record_bytes)
                except OSError:
                    continue
            advisor.advise(record_runs(sample_runs, self.file(s).samples_per_record))

    @property
    def _warm_file(self) -> bool:
        """True for a set of one file found in the page cache: nothing to advise."""
        return self.set.num_shards == 1 and 0 in self._warm

    def file(self, s: int) -> RecordFile:
        self.walk(s)
        return self._walks[s][0]

    def count(self, s: int) -> int:
        """Samples in shard ``s``."""
        return int(self.counts[s])

    def done(self, i: int) -> None:
        """Window ``i`` is fully handed out: close the shards the next window does not need.

        A closed shard of a remote set may be evicted from the cache (and is
        fetched again if a later window needs it); one file is never closed.
        """
        if self.set.num_shards == 1:
            return
        following = self.plan[i + 1] if i + 1 < len(self.plan) else set()
        for s in [s for s in self._walks if s not in following]:
            self._close(s)

    def _close(self, s: int) -> None:
        advisor = self._advisors.pop(s, None)
        if advisor is not None:
            advisor.close()
        _, walk = self._walks.pop(s)
        self.records_read += walk.records_read
        walk.close()
        self.set.release(s)

    def close(self) -> int:
        """Close every walk (after every helper thread reading their values has finished); returns the records
        read through them all."""
        for checks in self._ahead:
            checks.join(stop=True)
        self._ahead = []
        for s in list(self._walks):
            self._close(s)
        return self.records_read
