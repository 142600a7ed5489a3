"""One reader's share of an epoch, read window by window, with its position as plain state.

A :class:`ShareReader` is given the runs of sample indices that one reader
(one DataLoader worker of one rank) visits this epoch, and who it is (seed,
epoch, rank, worker). It cuts that share into windows (``torchrecord._order``),
reads each window through the cursor walk, permutes it on its own, and hands
out consecutive chunks of the permuted sequence, starting from any position.

Two decoding paths give the same samples in the same order:

* fixed layout (every field numeric with a fixed shape): a chunk is a list of
  typed column arrays [B, ...], one per schema field (``torchrecord._fastread``);
* any other schema: a chunk is a list of decoded samples; the window holds the
  stored bytes and each sample is decoded by protobuf only when it is handed out.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrecord import _dtypes, _order
from torchrecord._fastread import JOIN_LIMIT, FixedWindowReader
from torchrecord._kinds import check_bools
from torchrecord._layout import FixedLayout
from torchrecord._walk import Walk, record_runs
from torchrecord.record_file import RecordFile

__all__ = ["LocalRun", "Share", "ShareReader", "split_runs"]

Run = tuple[int, int]
#: (shard, start, stop): a run of sample indices inside one shard
LocalRun = tuple[int, int, int]


@dataclass(frozen=True)
class Share:
    """What one reader reads in one epoch, and the identity its order is seeded from.

    Attributes:
        runs: runs [start, stop) of sample indices, in visiting order.
        seed, epoch, rank, worker: seed the per-window permutations.
        shuffle: permute each window (False: visit the runs in order).
        window: samples per window.
    """

    runs: tuple[Run, ...]
    seed: int
    epoch: int
    rank: int
    worker: int
    shuffle: bool
    window: int

    @property
    def total(self) -> int:
        """Samples in the share."""
        return sum(stop - start for start, stop in self.runs)

    def order(self, j: int, n: int) -> np.ndarray | None:
        """The permutation of window ``j`` (``n`` samples), or None to keep run order."""
        if not self.shuffle:
            return None
        return _order.window_order(n, seed=self.seed, epoch=self.epoch, rank=self.rank, worker=self.worker, window=j)


class ShareReader:
    """Reads a :class:`Share` of a record set and yields chunks of its permuted sequence.

    Args:
        file: the record set.
        share: what to read.
        layout: the set's fixed layout, or None for the generic (protobuf) path.
        verify: check every record's CRC-32 as it is read.
    """

    def __init__(self, file: RecordFile, share: Share, *, layout: FixedLayout | None, verify: bool = False) -> None:
        self.file, self.share, self.layout, self.verify = file, share, layout, verify
        self.offsets = file.shard_offsets
        self.records_read = 0

    @property
    def fixed(self) -> bool:
        """True when chunks are typed column arrays (the fixed-layout path)."""
        return self.layout is not None

    def chunks(self, size: int, start: int = 0) -> Iterator[list[Any]]:
        """Consecutive chunks of ``size`` samples from position ``start`` (the last may be short).

        Only the windows at or after ``start``'s are read, and only the shards
        they need are opened (a sharded set's shard is closed after the last
        window that needs it).
        """
        for chunk, _ in self.indexed_chunks(size, start):
            yield chunk

    def indexed_chunks(self, size: int, start: int = 0) -> Iterator[tuple[list[Any], np.ndarray]]:
        """Like :meth:`chunks`, each chunk with the set's sample index of each of its samples (int64).

        The indices let an error raised while transforming a sample name it.
        """
        share = self.share
        total = share.total
        if start >= total:
            return
        first_window = start // share.window
        window = share.window
        window_runs = [
            _order.slice_runs(share.runs, j * window, min(total, (j + 1) * window))
            for j in range(first_window, -(-total // window))
        ]
        plan = [split_runs(runs, self.offsets) for runs in window_runs]
        # zero-copy views only pay for long records: for short ones, bytes objects are cheaper to make
        buffers = self.layout is not None and self.layout.length >= JOIN_LIMIT
        walks = _ShardWalks(self.file, plan, verify=self.verify, buffers=buffers)
        try:
            windows = self._fixed_windows(walks) if self.layout is not None else self._generic_windows(walks)
            pending: list[tuple[Any, np.ndarray]] = []
            held = 0
            skip = start - first_window * share.window
            for i, pieces in enumerate(plan):
                taker = windows(first_window + i, pieces, _indices(window_runs[i]))
                if skip:
                    taker.offset, skip = skip, 0
                while taker.remaining:
                    n = min(size - held, taker.remaining)
                    pending.append(taker.take(n))
                    held += n
                    if held == size:
                        yield self._join(pending)
                        pending, held = [], 0
                walks.done(i)
            if pending:
                yield self._join(pending)
        finally:
            self.records_read += walks.close()

    # -- the two paths --------------------------------------------------------
    def _fixed_windows(self, walks: _ShardWalks) -> Any:
        layout = self.layout
        assert layout is not None
        # sized by the samples this reader will hold at once, never by a claim (a batch_size of 10**7
        # on a set of 2,000 samples makes a window of 10**7 positions, of which 2,000 are filled)
        reader = FixedWindowReader(layout, min(self.share.window, self.share.total))
        shapes = [(tuple(int(d or 0) for d in f.shape), _dtypes.by_name(f.dtype).numpy) for f in layout.fields]
        path = self.file.path

        def window(j: int, pieces: Sequence[LocalRun], indices: np.ndarray) -> _Taken:
            win, rec, row = reader.read([(walks.walk(s), walks.count(s), a, b) for s, a, b in pieces])
            order = self.share.order(j, len(rec))
            if order is not None:
                rec, row, indices = rec[order], row[order], indices[order]

            def gather(sel: slice) -> list[np.ndarray]:
                arrays = win.gather(rec[sel], row[sel])
                typed = [a.view(dt).reshape((len(a), *shape)) for a, (shape, dt) in zip(arrays, shapes)]
                check_bools(typed, layout.fields, path)
                return typed

            return _Taken(len(rec), gather, indices)

        return window

    def _generic_windows(self, walks: _ShardWalks) -> Any:
        k = self.file.samples_per_record

        def window(j: int, pieces: Sequence[LocalRun], indices: np.ndarray) -> _Taken:
            items: list[tuple[RecordFile, int, Any]] = []
            for s, start, stop in pieces:
                walk, file = walks.walk(s), walks.file(s)
                if k == 1:
                    for first, values in walk.pieces(record_runs([(start, stop)], 1)):
                        items.extend(zip([file] * len(values), range(first, first + len(values)), values))
                    continue
                for first, values in walk.pieces(record_runs([(start, stop)], k)):
                    for record, value in zip(range(first, first + len(values)), values):
                        for i, sample in enumerate(file.decode_record(value, record)):
                            if start <= record * k + i < stop:
                                items.append((file, -1, sample))
            order = self.share.order(j, len(items))
            if order is not None:
                items = [items[i] for i in order.tolist()]
                indices = indices[order]

            def decode(sel: slice) -> list[Any]:
                if k == 1:
                    return [file.decode(value, index) for file, index, value in items[sel]]
                return [sample for _, _, sample in items[sel]]

            return _Taken(len(items), decode, indices)

        return window

    def _join(self, parts: list[tuple[Any, np.ndarray]]) -> tuple[list[Any], np.ndarray]:
        if len(parts) == 1:
            return parts[0]
        indices = np.concatenate([i for _, i in parts])
        if self.layout is not None:
            return [np.concatenate(column) for column in zip(*(c for c, _ in parts))], indices
        return [sample for part, _ in parts for sample in part], indices


def _indices(runs: Sequence[Run]) -> np.ndarray:
    """The sample indices of runs, in run order."""
    if not runs:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs])


def split_runs(runs: Sequence[Run], offsets: np.ndarray) -> list[LocalRun]:
    """Runs of global sample indices as (shard, start, stop) in shard indices, cut at shard bounds."""
    out: list[LocalRun] = []
    bounds = offsets.tolist()
    for a, b in runs:
        while a < b:
            s = bisect.bisect_right(bounds, a) - 1
            e = min(b, bounds[s + 1])
            out.append((s, a - bounds[s], e - bounds[s]))
            a = e
    return out


class _ShardWalks:
    """The open walks of one reader, one per shard, opened on first use and closed after their last window.

    Args:
        file: the set (a RecordFile: one shard; a ShardedSet: several).
        plan: the (shard, start, stop) pieces of each window the reader reads, in order.
        verify, buffers: as for :class:`~torchrecord._walk.Walk`.
    """

    def __init__(self, file: RecordFile, plan: Sequence[Sequence[LocalRun]], *, verify: bool, buffers: bool) -> None:
        self.set, self.verify, self.buffers = file, verify, buffers
        self.counts = np.diff(file.shard_offsets).tolist()
        self._walks: dict[int, tuple[RecordFile, Walk]] = {}
        self.records_read = 0
        self.plan = [{s for s, _, _ in pieces} for pieces in plan]  # the shards of each window
        order: list[int] = []  # the shards in the order they are needed (a remote set fetches ahead)
        for pieces in plan:
            for s, _, _ in pieces:
                if not order or order[-1] != s:
                    order.append(s)
        prefetch = getattr(file, "prefetch", None)
        if prefetch is not None:
            prefetch(order)

    def walk(self, s: int) -> Walk:
        """The open walk over shard ``s`` (opening, and for a remote set fetching, it first)."""
        held = self._walks.get(s)
        if held is None:
            file = self.set.shard(s)
            env, db = file.environment()
            crc_db = file.crc_db if self.verify else None
            walk = Walk(env, db, file.path, crc_db=crc_db, buffers=self.buffers).__enter__()
            held = self._walks[s] = (file, walk)
        return held[1]

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
        _, walk = self._walks.pop(s)
        self.records_read += walk.records_read
        walk.close()
        release = getattr(self.set, "release", None)
        if release is not None:
            release(s)

    def close(self) -> int:
        """Close every walk; returns the records read through them all."""
        for s in list(self._walks):
            self._close(s)
        return self.records_read


class _Taken:
    """A permuted window handed out front to back: ``take(n)`` gives the next n samples and their indices."""

    def __init__(self, n: int, get: Any, indices: np.ndarray) -> None:
        self.n, self.get, self.indices, self.offset = n, get, indices, 0

    @property
    def remaining(self) -> int:
        return self.n - self.offset

    def take(self, n: int) -> tuple[Any, np.ndarray]:
        sel = slice(self.offset, self.offset + n)
        self.offset += n
        return self.get(sel), self.indices[sel]
