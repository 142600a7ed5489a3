"""The epoch a reader plays and the (rank, world size) it plays it as, shared by the datasets.

The epoch lives in a shared-memory tensor, so ``set_epoch`` in the main process
reaches persistent DataLoader workers. Rank and world size are given, or read
from ``torch.distributed`` in the main process; DataLoader workers do not see
the process group and keep what the main process saw last (the dataset reaches
them pickled).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

__all__ = ["EpochAndWorld"]


class EpochAndWorld:
    """Mixin: ``set_epoch``/``epoch`` and ``_distributed`` (rank, world size) for a dataset."""

    _epoch: torch.Tensor
    _explicit: tuple[int, int] | None
    _distributed: tuple[int, int]

    def _init_epoch_and_world(self, rank: int | None, world_size: int | None) -> None:
        """Call from ``__init__`` (after checking that rank and world size come together)."""
        self._explicit = (rank, world_size) if rank is not None and world_size is not None else None
        self._distributed = self._detect_distributed()
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration plays (persistent workers see it too)."""
        self._epoch.fill_(int(epoch))
        self._refresh_distributed()

    @property
    def epoch(self) -> int:
        """The epoch set by :meth:`set_epoch` (shared with persistent workers)."""
        return int(self._epoch.item())

    def _detect_distributed(self) -> tuple[int, int]:
        if self._explicit is not None:
            return self._explicit
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def _refresh_distributed(self) -> None:
        if get_worker_info() is None:
            self._distributed = self._detect_distributed()
