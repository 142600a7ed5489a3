"""RecordDataset: an IterableDataset that streams a record set with LMDB cursors."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from torchrecord import _order, _partition
from torchrecord._kinds import collate_samples, split_columns, stack_columns
from torchrecord._layout import FixedLayout
from torchrecord._reader import Share, ShareReader
from torchrecord.record_file import RecordFile

__all__ = ["RecordDataset", "collate_samples"]


class RecordDataset(IterableDataset[Any]):
    """Stream a record set into a DataLoader, sharded over ranks and workers.

    Every reader (one per DataLoader worker per distributed rank) opens the file
    read-only in its own process when iteration starts, takes its share of the
    epoch's runs (see ``torchrecord._partition``: blocks of records visited in a
    seeded order that changes every epoch), walks them with one LMDB cursor, mixes
    them, and only then decodes and applies ``transform``.

    Each reader's share of the epoch is cut into windows of ``shuffle_buffer``
    samples (see ``torchrecord._order``); window ``j`` is read with one cursor walk
    and permuted by a generator seeded from (seed, epoch, rank, worker, j) alone,
    so any window can be rebuilt without the ones before it. Two decoding paths
    give the same samples in the same order:

    * fixed schema (every field numeric with a fixed shape): records are copied
      once into a window buffer, checked against the layout in one step, and each
      batch is gathered at fixed byte offsets straight into fresh arrays
      (``torchrecord._fastread``); records that do not match the expected layout
      are decoded the checked slow way;
    * any other schema: the window holds the stored bytes, and each sample is
      decoded by protobuf when it is handed out.

    The order is a pure function of (seed, epoch, world size, rank, number of
    workers): call :meth:`set_epoch` before each epoch, as with
    ``DistributedSampler``, to get a new order. It reaches persistent workers too,
    because the epoch lives in shared memory.

    Args:
        path: a record set written by :func:`torchrecord.write_record`.
        shuffle: visit blocks in a seeded order and mix through the buffer;
            ``False`` reads each reader's share in stored order.
        shuffle_buffer: samples per window, mixed at a time by each reader (capped
            at 64 MiB of records for fixed-size samples, never below one batch).
        block_size: samples per block of the coarse, per-epoch block shuffle;
            default: about count/256, within [16, 4096].
        seed: the base seed of all orders.
        transform: called on each decoded sample (after shuffling). In batch mode
            the transformed samples are collated with ``default_collate``.
        batch_transform: called on each batch (batch mode only), e.g. to convert
            uint8 images to float in one vectorized step.
        drop_last: distributed ranks cut the remainder (``True``) or pad by
            repeating samples from the start of the epoch (``False``), so every
            rank yields the same number; in batch mode also drop each rank's last
            short batch.
        batch_size: yield batches of this many samples built inside the worker;
            use with ``DataLoader(batch_size=None)``. A batch has the structure of
            a sample with every fixed-shape numeric leaf stacked into one tensor and
            every other leaf (strings, variable shapes) a list. ``None`` yields
            samples, each leaf of the kind it was written as.
        rank, world_size: override what ``torch.distributed`` reports.
        verify: check each record's CRC-32 as it is read (ChecksumError on mismatch).

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
        shuffle_buffer: int = 8192,
        block_size: int | None = None,
        seed: int = 0,
        transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        drop_last: bool = False,
        batch_size: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        verify: bool = False,
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
        self.batch_transform = batch_transform
        self.verify = verify
        self._layout_cache: tuple[tuple[str, int], FixedLayout | None] | None = None
        self._force_generic = False  # tests: read a fixed-layout set the generic way
        self.drop_last = drop_last
        self.batch_size = batch_size
        self._explicit = (rank, world_size) if rank is not None else None
        self._distributed = self._detect_distributed()
        # shared memory: set_epoch in the main process reaches persistent workers
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

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
        """The sample runs one reader visits this epoch (for inspection and tests)."""
        count = len(self.file)
        k = self.file.samples_per_record
        block = self.block_size or _partition.auto_block_size(count)
        rank, world_size = self._distributed
        return _partition.reader_runs(
            count,
            block_size=-(-block // k) * k,  # whole records per block
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

    def share(self, worker: int = 0, num_workers: int = 1) -> Share:
        """What one reader reads this epoch and the identity its order is seeded from."""
        layout = self._fixed_layout()
        per_sample = layout.length // layout.rows if layout is not None else None
        step = self.batch_size or _SAMPLE_MODE_BATCH
        window = _order.window_size(self.shuffle_buffer, step, per_sample, shuffle=self.shuffle)
        return Share(
            runs=tuple(self.reader_runs(worker, num_workers)),
            seed=self.seed,
            epoch=self.epoch,
            rank=self._distributed[0],
            worker=worker,
            shuffle=self.shuffle,
            window=window,
        )

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is None:
            self._refresh_distributed()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        layout = None if self._force_generic else self._fixed_layout()
        reader = ShareReader(self.file, self.share(worker, num_workers), layout=layout, verify=self.verify)
        if self.batch_size is not None:
            return self._batches(reader)
        return self._samples(reader)

    def _fixed_layout(self) -> FixedLayout | None:
        key = (self.file.path, self.file.samples_per_record)
        if self._layout_cache is None or self._layout_cache[0] != key:
            self._layout_cache = (key, FixedLayout.build(self.file.schema, self.file.samples_per_record))
        return self._layout_cache[1]

    def _samples(self, reader: ShareReader) -> Iterator[Any]:
        """Per-sample mode: each sample of the kind it was written as, transformed."""
        schema, transform = self.file.schema, self.transform
        for chunk in reader.chunks(_SAMPLE_MODE_BATCH):
            samples = split_columns(chunk, schema) if reader.fixed else chunk
            if transform is None:
                yield from samples
            else:
                for sample in samples:
                    yield transform(sample)

    def _batches(self, reader: ShareReader) -> Iterator[Any]:
        """Batch mode: batches built here, fixed numeric leaves stacked, the rest lists."""
        size = self.batch_size
        assert size is not None
        schema, transform = self.file.schema, self.transform
        for chunk in reader.chunks(size):
            n = len(chunk[0]) if reader.fixed and chunk else len(chunk)
            if n < size and self.drop_last:
                return
            if transform is not None:
                samples = split_columns(chunk, schema) if reader.fixed else chunk
                batch = torch.utils.data.default_collate([transform(s) for s in samples])
            elif reader.fixed:
                batch = stack_columns(chunk, schema)
            else:
                batch = collate_samples(chunk, schema)
            yield self.batch_transform(batch) if self.batch_transform is not None else batch


#: Internal chunk of the read path when the dataset yields single samples.
_SAMPLE_MODE_BATCH = 256
