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

__all__ = ["Share", "ShareReader"]

Run = tuple[int, int]


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
        self.records_read = 0

    @property
    def fixed(self) -> bool:
        """True when chunks are typed column arrays (the fixed-layout path)."""
        return self.layout is not None

    def chunks(self, size: int, start: int = 0) -> Iterator[list[Any]]:
        """Consecutive chunks of ``size`` samples from position ``start`` (the last may be short).

        Only the windows at or after ``start``'s are read.
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
        env, db = self.file.environment()
        crc_db = self.file.crc_db if self.verify else None
        # zero-copy views only pay for long records: for short ones, bytes objects are cheaper to make
        buffers = self.layout is not None and self.layout.length >= JOIN_LIMIT
        with Walk(env, db, self.file.path, crc_db=crc_db, buffers=buffers) as walk:
            try:
                windows = self._fixed_windows(walk) if self.layout is not None else self._generic_windows(walk)
                pending: list[tuple[Any, np.ndarray]] = []
                held = 0
                first_window = start // share.window
                skip = start - first_window * share.window
                for j in range(first_window, -(-total // share.window)):
                    lo, hi = j * share.window, min(total, (j + 1) * share.window)
                    runs = _order.slice_runs(share.runs, lo, hi)
                    indices = _indices(runs)
                    order = share.order(j, len(indices))
                    if order is not None:
                        indices = indices[order]
                    taker = windows(runs, order, indices)
                    if skip:
                        taker.offset, skip = skip, 0
                    while taker.remaining:
                        n = min(size - held, taker.remaining)
                        pending.append(taker.take(n))
                        held += n
                        if held == size:
                            yield self._join(pending)
                            pending, held = [], 0
                if pending:
                    yield self._join(pending)
            finally:
                self.records_read += walk.records_read

    # -- the two paths --------------------------------------------------------
    def _fixed_windows(self, walk: Walk) -> Any:
        layout = self.layout
        assert layout is not None
        reader = FixedWindowReader(walk, layout, len(self.file), self.share.window)
        shapes = [(tuple(int(d or 0) for d in f.shape), _dtypes.by_name(f.dtype).numpy) for f in layout.fields]
        path = self.file.path

        def window(runs: Sequence[Run], order: np.ndarray | None, indices: np.ndarray) -> _Taken:
            win, rec, row = reader.read(runs)
            if order is not None:
                rec, row = rec[order], row[order]

            def gather(sel: slice) -> list[np.ndarray]:
                arrays = win.gather(rec[sel], row[sel])
                typed = [a.view(dt).reshape((len(a), *shape)) for a, (shape, dt) in zip(arrays, shapes)]
                check_bools(typed, layout.fields, path)
                return typed

            return _Taken(len(rec), gather, indices)

        return window

    def _generic_windows(self, walk: Walk) -> Any:
        file = self.file
        k = file.samples_per_record

        def window(runs: Sequence[Run], order: np.ndarray | None, indices: np.ndarray) -> _Taken:
            if k == 1:
                items: list[tuple[int, Any]] = []
                for first, values in walk.pieces(record_runs(runs, 1)):
                    items.extend(zip(range(first, first + len(values)), values))
            else:
                items = []
                for start, stop in runs:
                    for first, values in walk.pieces(record_runs([(start, stop)], k)):
                        for record, value in zip(range(first, first + len(values)), values):
                            for i, sample in enumerate(file.decode_record(value, record)):
                                if start <= record * k + i < stop:
                                    items.append((-1, sample))
            if order is not None:
                items = [items[i] for i in order.tolist()]

            def decode(sel: slice) -> list[Any]:
                if k == 1:
                    return [file.decode(value, index) for index, value in items[sel]]
                return [sample for _, sample in items[sel]]

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
