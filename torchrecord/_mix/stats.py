"""A mix's statistics across DataLoader workers: each worker posts its figures to shared memory.

``MixedDataset.stats()`` in the main process adds up the figures of the workers of the
latest iteration (time to the first batch, draws and reads per source, waits, deferrals,
samples handed out per source).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from torchrecord.errors import TorchRecordWarning

__all__ = ["Figures", "StatsBoard", "figures_of"]


@dataclass
class Figures:
    """One reader's (or several workers' added) statistics."""

    first: float | None
    draws: list[int]
    reads: list[int]
    waits: int
    wait_seconds: float
    deferrals: int
    handed: list[int]
    workers: int


#: DataLoader workers per process whose figures the board holds (a row each).
_BOARD_ROWS = 64
_HEAD = 6  # int columns before the per-source ones: key, epoch + 1, workers, waits, deferrals, posted


class StatsBoard:
    """Shared memory where each DataLoader worker posts its figures, for ``stats()`` in the main process.

    Made in the main process with the dataset, so forked workers share it and
    spawned ones receive it (torch's multiprocessing pickler passes shared
    tensors by handle). Row w belongs to worker w and is written only by it:
    ints ``[key, epoch + 1, num_workers, waits, deferrals, posted, draws_read[S],
    reads[S], handed[S]]`` and floats ``[wall-clock start, first batch seconds
    (NaN before it), wait seconds]``. ``key`` is the DataLoader's base seed of
    the iteration (the same in every worker of one ``iter(loader)``), so the main
    process adds up the rows of the latest iteration only.
    """

    def __init__(self, sources: int) -> None:
        self.sources = sources
        self.ints = torch.zeros((_BOARD_ROWS, _HEAD + 3 * sources), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self.floats = torch.zeros((_BOARD_ROWS, 3), dtype=torch.float64).share_memory_()  # type: ignore[no-untyped-call]
        self.warned = False

    def row(self, worker: int, key: int, epoch: int, num_workers: int, wall: float) -> int | None:
        """Claim worker ``worker``'s row for an iteration (None past the board's rows)."""
        if worker >= _BOARD_ROWS:
            return None
        ints, floats = self.ints.numpy(), self.floats.numpy()
        ints[worker, :] = 0
        floats[worker] = (wall, np.nan, 0.0)
        ints[worker, :3] = (key & 0x3FFFFFFFFFFFFFFF, epoch + 1, num_workers)
        return worker

    def post(self, row: int, figures: Figures) -> None:
        """Write one worker's figures to its row (only that worker writes there)."""
        ints, floats = self.ints.numpy(), self.floats.numpy()
        s = self.sources
        ints[row, 3:6] = (figures.waits, figures.deferrals, 1)
        ints[row, _HEAD : _HEAD + s] = figures.draws
        ints[row, _HEAD + s : _HEAD + 2 * s] = figures.reads
        ints[row, _HEAD + 2 * s :] = figures.handed
        floats[row, 1:] = (np.nan if figures.first is None else figures.first, figures.wait_seconds)

    def gather(self, after: float | None) -> Figures | None:
        """The added figures of the workers of the latest iteration started after ``after``, or None."""
        ints, floats = self.ints.numpy(), self.floats.numpy()
        used = np.flatnonzero(ints[:, 1] > 0)
        if not len(used):
            return None
        latest = used[np.argmax(floats[used, 0])]
        if after is not None and floats[latest, 0] < after:
            return None  # this process iterated the dataset itself since
        rows = used[(ints[used, 0] == ints[latest, 0]) & (ints[used, 1] == ints[latest, 1])]
        rows = rows[ints[rows, 5] > 0]  # the workers that posted
        if int(ints[latest, 2]) > _BOARD_ROWS and not self.warned:
            self.warned = True
            warnings.warn(
                f"MixedDataset.stats(): {int(ints[latest, 2])} DataLoader workers ran, the figures count the "
                f"first {_BOARD_ROWS}",
                TorchRecordWarning,
                stacklevel=3,
            )
        s = self.sources
        added = ints[rows].sum(axis=0)
        firsts = floats[rows, 1]
        firsts = firsts[~np.isnan(firsts)]
        return Figures(
            first=float(firsts.min()) if len(firsts) else None,
            draws=[int(x) for x in added[_HEAD : _HEAD + s]],
            reads=[int(x) for x in added[_HEAD + s : _HEAD + 2 * s]],
            waits=int(added[3]),
            wait_seconds=float(floats[rows, 2].sum()),
            deferrals=int(added[4]),
            handed=[int(x) for x in added[_HEAD + 2 * s :]],
            workers=len(rows),
        )


def figures_of(mixer: Any, first: float | None) -> Figures:
    """The figures of a reader's current iteration: its ``Mixer`` and its seconds to the first item."""
    return Figures(
        first=first,
        draws=[int(x) for x in mixer.reader.units_read],
        reads=[int(x) for x in mixer.reader.reads],
        waits=int(mixer.reader.waits),
        wait_seconds=float(mixer.reader.wait_seconds),
        deferrals=int(mixer.deferrals),
        handed=[int(x) for x in mixer.handed.tolist()],
        workers=0,
    )
