"""RecordDataset: an IterableDataset that streams a record set with LMDB cursors."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from torchrecord import _partition
from torchrecord._reader import iter_runs, shuffle_buffer
from torchrecord.record_file import RecordFile

__all__ = ["RecordDataset"]


class RecordDataset(IterableDataset[Any]):
    """Stream a record set into a DataLoader, sharded over ranks and workers.

    Every reader (one per DataLoader worker per distributed rank) opens the file
    read-only in its own process when iteration starts, takes its share of the
    epoch's runs (see ``torchrecord._partition``), walks them with one LMDB cursor,
    mixes the raw records in a shuffle buffer, and only then decodes them and
    applies ``transform``, so the buffer holds compact encoded bytes.

    The order is a pure function of (seed, epoch, world size, rank, number of
    workers): call :meth:`set_epoch` before each epoch, as with
    ``DistributedSampler``, to get a new order. It reaches persistent workers too,
    because the epoch lives in shared memory.

    Args:
        path: a record set written by :func:`torchrecord.write_record`.
        shuffle: visit blocks in a seeded order and mix through the buffer;
            ``False`` reads each reader's share in stored order.
        shuffle_buffer: records held by each reader's buffer (memory: this many
            encoded records per worker).
        block_size: records per block of the coarse, per-epoch block shuffle;
            default: about count/256, within [16, 4096].
        seed: the base seed of all orders.
        transform: called on each decoded sample (after shuffling).
        drop_last: distributed ranks cut the remainder (``True``) or pad by
            repeating samples from the start of the epoch (``False``), so every
            rank yields the same number; in batch mode also drop each rank's last
            short batch.
        batch_size: yield collated batches of this many samples built inside the
            worker; use with ``DataLoader(batch_size=None)``. ``None`` yields samples.
        rank, world_size: override what ``torch.distributed`` reports.

    ``len()`` is the number of items this rank yields per epoch: samples, or
    batches when ``batch_size`` is set. Rank and world size are read from
    ``torch.distributed`` when the dataset is made and again by ``len()``,
    ``set_epoch()`` and iteration in the main process.

    Example:
        >>> ds = RecordDataset("train.tr", batch_size=256)          # doctest: +SKIP
        >>> loader = DataLoader(ds, batch_size=None, num_workers=2) # doctest: +SKIP
        >>> for epoch in range(3):                                  # doctest: +SKIP
        ...     ds.set_epoch(epoch)
        ...     for images, labels in loader: ...
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        shuffle: bool = True,
        shuffle_buffer: int = 2048,
        block_size: int | None = None,
        seed: int = 0,
        transform: Callable[[Any], Any] | None = None,
        drop_last: bool = False,
        batch_size: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, got {shuffle_buffer}")
        if block_size is not None and block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        if world_size is not None and not 0 <= rank < world_size:  # type: ignore[operator]
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        self.file = RecordFile(path)
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.block_size = block_size
        self.seed = seed
        self.transform = transform
        self.drop_last = drop_last
        self.batch_size = batch_size
        self._explicit = (rank, world_size) if rank is not None else None
        self._distributed = self._detect_distributed()
        # shared memory: set_epoch in the main process reaches persistent workers
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    # -- configuration ------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration produces."""
        self._epoch.fill_(int(epoch))
        self._refresh_distributed()

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def _detect_distributed(self) -> tuple[int, int]:
        if self._explicit is not None:
            return self._explicit  # type: ignore[return-value]
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def _refresh_distributed(self) -> None:
        if get_worker_info() is None:
            self._distributed = self._detect_distributed()

    def __len__(self) -> int:
        self._refresh_distributed()
        per_rank = _partition.samples_per_rank(len(self.file), self._distributed[1], self.drop_last)
        if self.batch_size is None:
            return per_rank
        if self.drop_last:
            return per_rank // self.batch_size
        return -(-per_rank // self.batch_size)

    # -- iteration ------------------------------------------------------------
    def reader_runs(self, worker: int = 0, num_workers: int = 1) -> list[tuple[int, int]]:
        """The record runs one reader visits this epoch (for inspection and tests)."""
        count = len(self.file)
        rank, world_size = self._distributed
        return _partition.reader_runs(
            count,
            block_size=self.block_size or _partition.auto_block_size(count),
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
            drop_last=self.drop_last,
            batch_size=self.batch_size,
        )

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is None:
            self._refresh_distributed()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        runs = self.reader_runs(worker, num_workers)
        env, db = self.file.environment()
        records: Iterator[tuple[int, bytes]] = iter_runs(env, db, runs, self.file.path)
        if self.shuffle and self.shuffle_buffer > 1:
            seed = _partition.reader_seed(self.seed, self.epoch, self._distributed[0], worker)
            records = shuffle_buffer(records, self.shuffle_buffer, seed)
        samples = self._decoded(records)
        if self.batch_size is None:
            return samples
        return self._batched(samples)

    def _decoded(self, records: Iterator[tuple[int, bytes]]) -> Iterator[Any]:
        decode, transform = self.file.decode, self.transform
        for index, value in records:
            sample = decode(value, index)
            yield transform(sample) if transform is not None else sample

    def _batched(self, samples: Iterator[Any]) -> Iterator[Any]:
        size = self.batch_size
        assert size is not None
        batch: list[Any] = []
        for sample in samples:
            batch.append(sample)
            if len(batch) == size:
                yield torch.utils.data.default_collate(batch)
                batch = []
        if batch and not self.drop_last:
            yield torch.utils.data.default_collate(batch)
