"""RecordDataset: an IterableDataset that streams a record set with LMDB cursors."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from torchrecord._core.kinds import collate_samples
from torchrecord._core.layout import FixedLayout
from torchrecord._order import partition as _partition
from torchrecord._order import windows as _order
from torchrecord._order.plan import Part, Reader
from torchrecord._order.share import Share, SharePlan
from torchrecord._read.base import ReaderDataset, in_worker
from torchrecord._read.ipc import arena_places, slot_allocator
from torchrecord._read.items import SAMPLE_CHUNK
from torchrecord._read.reader import ShareReader
from torchrecord._read.state import Start
from torchrecord._shards.open import SetLike, open_set
from torchrecord._store.checked import Check, checks_crc
from torchrecord._store.record_set import RecordSet
from torchrecord._store.subset import Subset
from torchrecord._store.subset import resolve as resolve_subset

__all__ = ["RecordDataset", "collate_samples"]


class RecordDataset(ReaderDataset):
    """Stream a record set into a DataLoader, sharded over ranks and workers.

    Every reader (one per DataLoader worker per distributed rank) opens the file
    read-only in its own process when iteration starts, takes its share of the
    epoch's runs (see ``torchrecord._order.partition``: blocks of records visited in a
    seeded order that changes every epoch), walks them with one LMDB cursor, mixes
    them, and only then decodes and applies ``transform``.

    Each reader's share of the epoch is cut into windows of ``shuffle_buffer``
    samples (see ``torchrecord._order.windows``); window ``j`` is read with one cursor walk
    and permuted by a generator seeded from (seed, epoch, rank, worker, j) alone,
    so any window can be rebuilt without the ones before it. Two decoding paths
    give the same samples in the same order:

    * fixed schema (every field numeric with a fixed shape): records are copied
      once into a window buffer, checked against the layout in one step, and each
      batch is gathered at fixed byte offsets straight into fresh arrays
      (``torchrecord._store.fastread``); records that do not match the expected layout
      are decoded the checked slow way;
    * any other schema: the window holds the stored bytes, and each sample is
      decoded by protobuf when it is handed out.

    The order is a pure function of (seed, epoch, world size, rank, number of
    workers): call :meth:`set_epoch` before each epoch, as with
    ``DistributedSampler``, to get a new order. It reaches persistent workers too,
    because the epoch lives in shared memory.

    A sharded set (:func:`torchrecord.write_shard`; a directory, manifest or URL)
    reads as one set: one global index over its shards, blocks that never
    straddle two shards, and each reader opens (or fetches) only the shards its
    share needs, when it first needs them.

    Args:
        path: a record set written by :func:`torchrecord.write_record`, a sharded
            set (its folder, manifest or URL), or a :class:`~torchrecord.RecordSet`
            (what :func:`torchrecord.open_set` returns). It is opened, checked and
            closed when the dataset is made, so a wrong path fails here with a
            message saying what the path holds; the dataset keeps no open handle
            (it pickles as configuration).
        shuffle: visit blocks in a seeded order and mix through the buffer;
            ``False`` reads each reader's share in stored order.
        shuffle_buffer: samples per window, mixed at a time by each reader (capped
            at 64 MiB of records for fixed-size samples, never below one batch).
        block_size: samples per block of the coarse, per-epoch block shuffle;
            default: about count/256, within [16, 4096].
        seed: the base seed of all orders (an integer >= 0).
        transform: called on each decoded sample (after shuffling). An exception
            it raises (also in a DataLoader worker) keeps its type and gets a note
            naming the sample's index and the file (Python 3.11+). In batch mode
            the transformed samples are collated like untransformed ones: a leaf
            the transform passes through unchanged by its field (fixed numeric
            stacked, variable-shape and strings as lists); a leaf it makes by what
            it holds (tensors or arrays of one shape and dtype stacked, Python
            numbers into a tensor, anything else a list). The structure may change.
        collate_fn: batch mode: turns the list of (transformed) samples of a batch
            into the batch, replacing the default collation (e.g.
            ``torch.utils.data.default_collate``, or a padding collate).
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
        loader_batch_size: per-sample mode: the ``batch_size`` of the DataLoader,
            so each worker's share is cut on whole batches and the loader yields
            exactly ``len(loader)`` batches for any batch size (see below).
        subset: read only these samples of the set: a ``range``, a ``slice``, a
            sequence or array of sample indices, or a boolean mask (e.g. a
            train/validation split of one file, or ``slice(0, n // 100)`` for a
            quick run). Sharding, shuffling, ``len()`` and resume all work over
            the selected samples; a resume state records which subset it was
            saved on and is refused by another.
        rank, world_size: override what ``torch.distributed`` reports.
        check: integrity on read. ``"checksums"``: each record's CRC-32 is checked
            as it is read (:class:`~torchrecord.errors.ChecksumError` on a
            mismatch). ``"structure"`` for files of unknown provenance: LMDB's page
            structure is checked in pure Python when the dataset is made, so a
            damaged file raises :class:`~torchrecord.errors.StructureError` here
            instead of killing a reader; workers do not check it again unless
            the file changed (see :class:`RecordFile`, and docs/GUARANTEES.md
            for the cost). ``"full"``: both. A :class:`RecordFile` given as
            ``path`` is checked too.
        cache_dir, cache_limit: for a remote sharded set (a manifest URL): the
            local folder its shards are fetched to, and the bytes of shards it
            keeps (see :class:`~torchrecord.ShardedSet`).
        storage_options: for a remote sharded set: keyword arguments for its
            fsspec file system (for ``s3://``: s3fs's ``key``, ``secret``,
            ``endpoint_url``...; see docs/s3.md).

    ``len()`` is the number of items this rank yields per epoch: samples, or
    batches when ``batch_size`` is set. Rank and world size are read from
    ``torch.distributed`` when the dataset is made and again by ``len()``,
    ``set_epoch()`` and iteration in the main process.

    ``len(loader)`` in per-sample mode: a ``DataLoader(ds, batch_size=B,
    num_workers=N)`` batches each worker's samples on its own, so every worker
    that ends on a partial batch adds one short batch. Worker shares are
    therefore cut on whole units: ``loader_batch_size`` when given, else a power
    of two (up to 4096, at most half a worker's share). The loader then yields
    exactly ``len(loader)`` batches whenever B divides that unit (any power of
    two up to it, so the usual 32, 64, 256...); for another B, pass
    ``loader_batch_size=B``. Taking ``len(loader)`` of a loader whose count
    would differ warns with the fix, and :meth:`check_loader` checks a loader
    explicitly.

    Example:
        >>> ds = RecordDataset("train.tr", batch_size=256)          # doctest: +SKIP
        >>> loader = DataLoader(ds, batch_size=None, num_workers=2) # doctest: +SKIP
        >>> for epoch in range(3):                                  # doctest: +SKIP
        ...     ds.set_epoch(epoch)
        ...     for images, labels in loader: ...
    """

    def __init__(
        self,
        path: SetLike,
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
        cache_dir: str | None = None,
        cache_limit: int | None = None,
        loader_batch_size: int | None = None,
        subset: Any = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        check: Check | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self._init_reader(locals())
        self.file: RecordSet = open_set(
            path, cache_dir=cache_dir, cache_limit=cache_limit, check=self.check, storage_options=storage_options
        )
        # a bad path fails here, in the main process, not at len() or in a worker; nothing stays open
        count = int(self.file.read_header()["count"])
        self._subset: Subset | None = None
        if subset is not None:
            self._subset = resolve_subset(subset, count, self.file.path)
        self._force_generic = False  # tests: read a fixed-layout set the generic way

    def __repr__(self) -> str:
        parts = [repr(self.file.path), f"{self._count()} samples"]
        if self._subset is not None:
            parts.append(f"subset={self._subset.describe()}")
        parts.append(f"batch_size={self.batch_size}" if self.batch_size is not None else "per-sample")
        if self.loader_batch_size is not None:
            parts.append(f"loader_batch_size={self.loader_batch_size}")
        parts += [f"shuffle={self.shuffle}", f"seed={self.seed}", f"epoch={self.epoch}"]
        if self.drop_last:
            parts.append("drop_last=True")
        rank, world = self._distributed
        if world > 1:
            parts.append(f"rank {rank} of {world}")
        for name in ("transform", "batch_transform", "collate_fn"):
            fn = getattr(self, name, None)
            if fn is not None:
                parts.append(f"{name}={getattr(fn, '__qualname__', None) or type(fn).__name__}")
        return f"RecordDataset({', '.join(parts)})"

    # -- configuration ------------------------------------------------------
    STATE_KIND = "torchrecord.RecordDataset"
    PLAN_KEYS: ClassVar[Mapping[str, str]] = {
        "subset": "the samples its subset= selects; None: the whole set",
        "count": "the samples it reads",
        **ReaderDataset.SHARE_PLAN_KEYS,
    }

    def _set_id(self) -> str:
        return self.file.set_id

    def _where(self) -> str:
        return self.file.path

    def _per_rank(self) -> int:
        return _partition.samples_per_rank(self._count(), self._distributed[1], self.drop_last)

    def _count(self) -> int:
        """Samples this dataset reads per epoch over all ranks: the subset's, or the whole set's."""
        return len(self._subset) if self._subset is not None else len(self.file)

    @property
    def subset(self) -> range | np.ndarray | None:
        """The selected sample indices in order (a range or a read-only int64 array), or None for all."""
        return self._subset.indices if self._subset is not None else None

    def _plan_keys(self) -> dict[str, Any]:
        plan = self._epoch_plan()
        subset = self._subset.digest if self._subset is not None else None
        return {"subset": subset, "count": plan.count, **self._share_plan_keys(plan)}

    def _epoch_plan(self) -> SharePlan:
        """This epoch's blocks and windows over every reader (``torchrecord._order.share``)."""
        count = self._count()
        k = self.file.samples_per_record
        block = self.block_size or _partition.auto_block_size(count)
        return self._share_plan(count, -(-block // k) * k, self._window_size(), self._bounds())  # whole records

    def _bounds(self) -> Any:
        """The shard offsets of a sharded set (its blocks restart at each shard), None for one file.

        A subset's positions are not set indices, so its blocks ignore shard bounds (a
        block that straddles two shards is read from both).
        """
        if self._subset is not None or self.file.num_shards == 1:
            return None
        return self.file.shard_offsets

    def _window_size(self) -> int:
        layout = self._fixed_layout()
        per_sample = layout.length // layout.rows if layout is not None else None
        step = self.batch_size or SAMPLE_CHUNK
        return _order.window_size(self.shuffle_buffer, step, per_sample, shuffle=self.shuffle)

    def _fixed_layout(self) -> FixedLayout | None:
        return self.file.fixed_layout()

    def _batch_bytes(self) -> int | None:
        layout = self._fixed_layout()
        return None if layout is None else (self.batch_size or 1) * sum(layout.sample_bytes)

    # -- iteration ------------------------------------------------------------
    def reader_runs(self, worker: int = 0, num_workers: int = 1) -> list[tuple[int, int]]:
        """The sample runs of reader ``worker`` of ``num_workers`` on this rank this epoch (for inspection and tests).

        With a subset, the runs are of the selected sample indices (the order is
        decided over subset positions, then mapped).
        """
        return list(self.share(worker, num_workers).runs)

    def share(self, worker: int = 0, num_workers: int = 1) -> Share:
        """What reader ``worker`` of ``num_workers`` reads this epoch (sample indices) and the identity its order is
        seeded from."""
        rank, world_size = self._distributed
        return self._of_set(self._epoch_plan().part(Reader(rank, world_size, worker, num_workers)))

    def _of_set(self, part: Share) -> Share:
        """A share of positions as the sample indices it reads (a subset's positions mapped, in order)."""
        if self._subset is None:
            return part
        return dataclasses.replace(part, runs=tuple(self._subset.runs(part.runs)))

    def _read(self, start: Start, part: Part) -> Iterator[Any]:
        assert isinstance(part, Share)
        layout = None if self._force_generic else self._fixed_layout()
        allocate = None
        # in a worker, batches made of the gathered columns are gathered straight into a handover slot
        plain = self.transform is None and self.collate_fn is None
        fused = self._fused_now()
        batch = self.batch_size if fused is None else fused
        places = None  # small batches gathered several at once: straight into their bundle's arena
        if layout is not None and batch is not None and in_worker() and plain:
            allocate = slot_allocator(batch * sum(layout.sample_bytes))
            places = arena_places if allocate is None else None
        share = self._of_set(part)
        reader = ShareReader(
            self.file, share, layout=layout, verify=checks_crc(self.check), allocate=allocate, places=places
        )
        items = self._items(self.file.path, self.file.schema, self._sample_chunk or self.loader_batch_size)
        if fused is not None:
            return items.whole_batches(reader, start.yielded, fused)
        return items.of(reader, start.yielded)

    def _fusable(self) -> bool:
        # fixed shapes and no per-sample transform: a loader batch of samples collated is the batch read whole
        # (with variable shapes default_collate refuses what batch mode gives as lists)
        return self.transform is None and not self._force_generic and self._fixed_layout() is not None

    def _pass_over(self) -> None:
        # the file stays in the process's small cache of idle files rather than held open
        self.file._let_go(hard=False)
