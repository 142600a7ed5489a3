"""RecordDataset: an IterableDataset that streams a record set with LMDB cursors."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from torchrecord import _dtypes, _format, _partition
from torchrecord._fastread import fixed_batches
from torchrecord._layout import FixedLayout
from torchrecord._reader import iter_records, shuffle_buffer
from torchrecord._structure import Tree, flatten, unflatten
from torchrecord.errors import CorruptRecordError
from torchrecord.record_file import RecordFile
from torchrecord.schema import Schema

__all__ = ["RecordDataset", "collate_samples"]


class RecordDataset(IterableDataset[Any]):
    """Stream a record set into a DataLoader, sharded over ranks and workers.

    Every reader (one per DataLoader worker per distributed rank) opens the file
    read-only in its own process when iteration starts, takes its share of the
    epoch's runs (see ``torchrecord._partition``: blocks of records visited in a
    seeded order that changes every epoch), walks them with one LMDB cursor, mixes
    them, and only then decodes and applies ``transform``.

    Two read paths give the same samples:

    * fixed schema (every field numeric with a fixed shape): records are read as
      zero-copy views in windows of ``shuffle_buffer`` samples, the window is
      permuted, and each batch is gathered at fixed byte offsets straight into
      fresh arrays (``torchrecord._fastread``); records that do not match the
      expected layout are decoded the checked slow way;
    * any other schema: records are parsed one by one with protobuf after a
      reservoir shuffle buffer of ``shuffle_buffer`` encoded records.

    The order is a pure function of (seed, epoch, world size, rank, number of
    workers): call :meth:`set_epoch` before each epoch, as with
    ``DistributedSampler``, to get a new order. It reaches persistent workers too,
    because the epoch lives in shared memory.

    Args:
        path: a record set written by :func:`torchrecord.write_record`.
        shuffle: visit blocks in a seeded order and mix through the buffer;
            ``False`` reads each reader's share in stored order.
        shuffle_buffer: samples mixed at a time by each reader (on the fixed-schema
            path also capped at 64 MiB of records per reader).
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

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is None:
            self._refresh_distributed()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        runs = self.reader_runs(worker, num_workers)
        seed = _partition.reader_seed(self.seed, self.epoch, self._distributed[0], worker)
        layout = self._fixed_layout()
        if layout is not None:
            return self._fast(runs, layout, seed)
        return self._generic(runs, seed)

    def _fixed_layout(self) -> FixedLayout | None:
        key = (self.file.path, self.file.samples_per_record)
        if self._layout_cache is None or self._layout_cache[0] != key:
            self._layout_cache = (key, FixedLayout.build(self.file.schema, self.file.samples_per_record))
        return self._layout_cache[1]

    def _window(self, layout: FixedLayout) -> int:
        """Samples mixed at a time: shuffle_buffer, capped at WINDOW_BYTES of records."""
        step = self.batch_size or _SAMPLE_MODE_BATCH
        if not self.shuffle:
            return step
        per_sample = max(1, layout.length // layout.rows)
        return max(step, min(self.shuffle_buffer, WINDOW_BYTES // per_sample))

    def _fast(self, runs: list[tuple[int, int]], layout: FixedLayout, seed: int) -> Iterator[Any]:
        """Fixed layout: gather whole batches at fixed offsets (see torchrecord._fastread)."""
        env, db = self.file.environment()
        crc_db = self.file.crc_db if self.verify else None
        shapes = [(tuple(int(d or 0) for d in f.shape), _dtypes.by_name(f.dtype)) for f in layout.fields]
        rng = np.random.default_rng(seed) if self.shuffle else None
        batched = self.batch_size is not None
        with _format.lmdb_errors(self.file.path), env.begin(buffers=True) as txn:
            for arrays in fixed_batches(
                txn,
                db,
                runs,
                layout,
                len(self.file),
                path=self.file.path,
                batch_size=self.batch_size or _SAMPLE_MODE_BATCH,
                window=self._window(layout),
                rng=rng,
                drop_last=self.drop_last and batched,
                crc_db=crc_db,
            ):
                typed = [
                    a.view(info.numpy).reshape((len(a), *shape)) for a, (shape, info) in zip(arrays, shapes)
                ]
                _check_bools(typed, layout, self.file.path)
                if batched and self.transform is not None:
                    samples = [self.transform(sample) for sample in self._split(typed, layout)]
                    yield self._finish_batch(torch.utils.data.default_collate(samples))
                elif batched:
                    yield self._finish_batch(self._batch_structure(typed, layout))
                else:
                    for sample in self._split(typed, layout):
                        yield self.transform(sample) if self.transform is not None else sample

    def _batch_structure(self, typed: list[np.ndarray], layout: FixedLayout) -> Any:
        leaves = [_as_tensor(a, f.dtype) for a, f in zip(typed, layout.fields)]
        return unflatten(self.file.schema.tree, leaves)

    def _split(self, typed: list[np.ndarray], layout: FixedLayout) -> Iterator[Any]:
        """Per-sample leaves of a decoded batch, each of the kind it was written as."""
        columns: list[list[Any]] = []
        for a, f in zip(typed, layout.fields):
            if f.kind == "tensor":
                columns.append(list(_as_tensor(a, f.dtype).unbind(0)))
            elif f.kind == "ndarray":
                # a[i, ...] keeps a 0-d field a 0-d array (iterating a 1-d array gives NumPy scalars)
                columns.append([a[i, ...] for i in range(len(a))])
            else:
                columns.append(a.tolist())
        build = _builder(self.file.schema.tree)
        for leaves in zip(*columns):
            yield build(list(leaves))

    def _generic(self, runs: list[tuple[int, int]], seed: int) -> Iterator[Any]:
        """Any schema: decode record by record (protobuf), mixing raw records in a reservoir."""
        env, db = self.file.environment()
        crc_db = self.file.crc_db if self.verify else None
        path, k = self.file.path, self.file.samples_per_record
        items: Iterator[Any]
        if k == 1:
            items = iter_records(env, db, runs, path, crc_db=crc_db)
        else:
            items = self._chunk_samples(runs, crc_db)
        if self.shuffle and self.shuffle_buffer > 1:
            items = shuffle_buffer(items, self.shuffle_buffer, seed)
        samples: Iterator[Any]
        if k == 1:
            samples = (self.file.decode(value, index) for index, value in items)
        else:
            samples = (sample for _, sample in items)
        if self.transform is not None:
            samples = (self.transform(s) for s in samples)
        if self.batch_size is None:
            return samples
        return self._batched(samples)

    def _chunk_samples(self, runs: list[tuple[int, int]], crc_db: Any) -> Iterator[tuple[int, Any]]:
        env, db = self.file.environment()
        k = self.file.samples_per_record
        for start, stop in runs:
            for record, value in iter_records(
                env, db, [(start, stop)], self.file.path, samples_per_record=k, crc_db=crc_db
            ):
                for j, sample in enumerate(self.file.decode_record(value, record)):
                    if start <= record * k + j < stop:
                        yield record * k + j, sample

    def _batched(self, samples: Iterator[Any]) -> Iterator[Any]:
        size = self.batch_size
        assert size is not None
        batch: list[Any] = []
        for sample in samples:
            batch.append(sample)
            if len(batch) == size:
                yield self._finish_batch(self._collate(batch))
                batch = []
        if batch and not self.drop_last:
            yield self._finish_batch(self._collate(batch))

    def _collate(self, batch: list[Any]) -> Any:
        if self.transform is not None:
            return torch.utils.data.default_collate(batch)
        return collate_samples(batch, self.file.schema)

    def _finish_batch(self, batch: Any) -> Any:
        return self.batch_transform(batch) if self.batch_transform is not None else batch


#: Samples mixed at a time are capped at this many bytes of records per reader.
WINDOW_BYTES = 64 << 20
#: Internal batch of the fast path when the dataset yields single samples.
_SAMPLE_MODE_BATCH = 256


def _as_tensor(a: np.ndarray, dtype: str) -> torch.Tensor:
    tensor = torch.from_numpy(a)
    return tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor


def _check_bools(typed: list[np.ndarray], layout: FixedLayout, path: str) -> None:
    for a, f in zip(typed, layout.fields):
        if f.dtype == "bool" and a.size and a.view(np.uint8).max() > 1:
            raise CorruptRecordError(f"{path}: field {f.name!r} holds bool bytes other than 0 and 1")


def _builder(tree: Tree) -> Callable[[list[Any]], Any]:
    """A fast constructor for the common flat structures, else the general unflatten."""
    if tree["t"] == "leaf":
        return lambda leaves: leaves[0]
    flat = all(c["t"] == "leaf" for c in tree["c"])
    if flat and tree["t"] == "tuple":
        return tuple
    if flat and tree["t"] == "list":
        return list
    if flat and tree["t"] == "dict":
        keys = tree["k"]
        return lambda leaves: dict(zip(keys, leaves))
    return lambda leaves: unflatten(tree, leaves)


def collate_samples(batch: list[Any], schema: Schema) -> Any:
    """Collate samples by the schema: fixed numeric fields stack into tensors, the rest become lists."""
    flat = [flatten(sample)[1] for sample in batch]
    leaves: list[Any] = []
    for i, fld in enumerate(schema.fields):
        column = [leaves_of[i] for leaves_of in flat]
        if fld.is_fixed:
            if fld.kind == "tensor":
                leaves.append(torch.stack(column))
            else:
                arr = np.stack([np.asarray(x) for x in column])
                leaves.append(torch.from_numpy(arr))
        else:
            leaves.append(column)
    return unflatten(schema.tree, leaves)
