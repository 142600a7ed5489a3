"""RecordDataset: an IterableDataset that streams a record set with LMDB cursors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from torchrecord._core.kinds import collate_samples
from torchrecord._core.layout import FixedLayout
from torchrecord._order import partition as _partition
from torchrecord._order import windows as _order
from torchrecord._read import resume as _resume
from torchrecord._read.base import ReaderDataset
from torchrecord._read.ipc import slot_allocator
from torchrecord._read.items import SAMPLE_CHUNK, Items
from torchrecord._read.reader import Share, ShareReader
from torchrecord._shards.open import SetLike, open_set
from torchrecord._store.checked import Check, checks_crc
from torchrecord._store.record_set import RecordSet
from torchrecord._store.subset import Subset
from torchrecord._store.subset import resolve as resolve_subset
from torchrecord.errors import ArgumentError, ResumeStateError

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
        self._init_reader(
            rank,
            world_size,
            shuffle=shuffle,
            shuffle_buffer=shuffle_buffer,
            block_size=block_size,
            seed=seed,
            transform=transform,
            batch_transform=batch_transform,
            collate_fn=collate_fn,
            drop_last=drop_last,
            batch_size=batch_size,
            loader_batch_size=loader_batch_size,
            check=check,
        )
        self.file: RecordSet = open_set(
            path, cache_dir=cache_dir, cache_limit=cache_limit, check=self.check, storage_options=storage_options
        )
        # a bad path fails here, in the main process, not at len() or in a worker; nothing stays open
        count = int(self.file.read_header()["count"])
        self._subset: Subset | None = None
        if subset is not None:
            self._subset = resolve_subset(subset, count, self.file.path)
        self._layout_cache: tuple[tuple[str, int], FixedLayout | None] | None = None
        self._force_generic = False  # tests: read a fixed-layout set the generic way
        self._resume: dict[str, Any] | None = None  # a loaded resume point, used by the next iteration only
        self._yielded = 0  # items this reader yielded in the current iteration
        self._iter_epoch: int | None = None

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
    STATE_KIND = _resume.STATE_KIND

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

    # -- resume -------------------------------------------------------------------
    def _plan(self, num_workers: int) -> dict[str, Any]:
        count = self._count()
        k = self.file.samples_per_record
        block = self.block_size or _partition.auto_block_size(count)
        return {
            "count": count,
            "seed": int(self.seed),
            "shuffle": bool(self.shuffle),
            "window": self._window_size(),
            "block_size": -(-block // k) * k,
            "drop_last": bool(self.drop_last),
            "batch_size": self.batch_size,
            "worker_unit": self._unit(num_workers),
            "world_size": self._distributed[1],
            "num_workers": num_workers,
            "subset": self._subset.digest if self._subset is not None else None,
        }

    def state_dict(self) -> dict[str, Any]:
        """This reader's resume point: small, plain and JSON-serialisable (see the README's resume recipe).

        torchdata's ``StatefulDataLoader`` calls it on each worker's copy after
        every batch; with ``num_workers=0`` on this object. It holds the set's
        ``set_id``, the epoch, the order settings, who this reader is and how many
        items (samples, or batches in batch mode) it yielded this epoch.
        """
        reader = self.reader()
        state = self._state_header(reader, self._iter_epoch if self._iter_epoch is not None else self.epoch)
        state.update(self._plan(reader.num_workers))
        state["yielded"] = self._yielded
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the current epoch from a state or a position; the next iteration starts there.

        ``state`` is what :meth:`state_dict` returned (same ranks, workers and
        batch size: exactly the rest of the epoch, in the same order), or a
        position from :func:`torchrecord.loader_position` (any world size and
        number of workers: every sample not yet yielded, exactly once over the new
        readers). Call :meth:`set_epoch` with the saved epoch first. The resume
        point is used by one iteration and then cleared.

        Raises:
            ValueError: a state of another record set, of a later epoch than the
                dataset's, of a newer state version, or not a torchrecord state.
                A state of an earlier epoch is ignored with a warning.
        """
        self._refresh_distributed()
        accepted = self._accept_state(
            state,
            kinds=(_resume.STATE_KIND, _resume.POSITION_KIND),
            subset=self._subset.digest if self._subset is not None else None,
        )
        if accepted is not None:
            self._check_resume(accepted)
        self._resume = accepted

    def _check_resume(self, state: dict[str, Any]) -> None:
        """Every field of an accepted state or position, against this dataset (states are untrusted input).

        The order settings must be this dataset's (count, seed, shuffle, window, block size, drop_last,
        batch size; the unit workers were cut on follows from them, the world size and the number of
        workers); each reader named must be one of the run's; the items a reader yielded at most what its
        share holds. A position may come from another world size or number of workers (elastic resume).
        """
        r = _resume
        plan = self._plan(1)
        where, kind = self._where(), str(state["kind"])
        rules: dict[str, r.Rule] = {
            "kind": r.anything,
            "version": r.anything,
            "set_id": r.anything,
            "epoch": r.anything,
            "subset": r.anything,
            "count": r.equal(plan["count"], "the samples it reads"),
            "seed": r.equal(plan["seed"], "its seed"),
            "shuffle": r.equal(plan["shuffle"], "its shuffle"),
            "window": r.equal(plan["window"], "the window of its shuffle_buffer and batch_size"),
            "block_size": r.equal(plan["block_size"], "its block size, in whole records"),
            "drop_last": r.equal(plan["drop_last"], "its drop_last"),
            "batch_size": r.equal(plan["batch_size"], "its batch_size"),
            "world_size": r.integer(1, r.MAX_READERS),
            "num_workers": r.integer(1, r.MAX_READERS),
            "worker_unit": r.integer(1),
        }
        position = kind == r.POSITION_KIND
        if position:
            rules["yielded"] = r.rows(r.integer(0), r.integer(0), r.integer(0), names=("rank", "worker", "items"))
            rules["rotate"] = r.integer(0)
        else:
            rules.update(rank=r.integer(0), worker=r.integer(0), yielded=r.integer(0))
        r.check_state(state, rules, where=where, what=kind, optional=("worker_unit", "rotate"))
        world, workers = int(state["world_size"]), int(state["num_workers"])
        if world * workers > r.MAX_READERS:
            r.refuse(where, kind, "num_workers", workers, f"{world} ranks x {workers} workers are too many readers")
        # the unit a run of this dataset on the state's world and workers cut its worker shares on
        per_rank = _partition.samples_per_rank(plan["count"], world, self.drop_last)
        unit = _partition.worker_unit(per_rank, workers, self.batch_size, self.loader_batch_size)
        if "worker_unit" in state and state["worker_unit"] != unit:
            r.refuse(
                where,
                kind,
                "worker_unit",
                state["worker_unit"],
                f"a run of this dataset on {world} ranks x {workers} workers cuts worker shares on {unit} samples",
            )
        if not position:
            r.check_state(
                state,
                {
                    "rank": r.integer(0, world - 1, what="the last rank of its world_size"),
                    "worker": r.integer(0, workers - 1, what="the last worker of its num_workers"),
                },
                where=where,
                what=kind,
                every_key=False,
            )
            readers = [(int(state["rank"]), int(state["worker"]), int(state["yielded"]))]
        else:
            if "rotate" in state and state["rotate"] >= workers:
                r.refuse(where, kind, "rotate", state["rotate"], f"must be below its num_workers, {workers}")
            same_plan = world == self._distributed[1]
            r.check_readers(
                state["yielded"],
                world_size=world,
                num_workers=workers,
                where=where,
                what=kind,
                field="yielded",
                rank=self._distributed[0] if same_plan else None,
            )
            readers = [(int(a), int(b), int(c)) for a, b, c in state["yielded"]]
        bounds = self._bounds()
        for rank, worker, items in readers:
            share = sum(b - a for a, b in r.share_runs(state, int(state["epoch"]), rank, worker, bounds))
            most = r.reader_items(share, self.batch_size, self.drop_last)
            if items > most:
                field = "yielded" if not position else f"yielded (rank {rank}, worker {worker})"
                r.refuse(
                    where,
                    kind,
                    field,
                    items,
                    f"the reader's share of the epoch holds {most} {'batches' if self.batch_size else 'samples'}",
                )

    def position_after(self, batches: int, *, num_workers: int, loader_batch_size: int | None = None) -> dict[str, Any]:
        """The position of this rank after a plain DataLoader handed out ``batches`` batches this epoch.

        For a plain ``torch.utils.data.DataLoader`` (no torchdata): save the
        number of batches your loop consumed in the epoch, and on resume pass
        ``ds.position_after(step, num_workers=...)`` (merged over ranks with
        :func:`torchrecord.loader_position`) to :meth:`load_state_dict`. The
        DataLoader takes one batch from each worker in turn, so the position of
        every worker follows from the count. ``loader_batch_size`` is the
        DataLoader's ``batch_size`` in per-sample mode (default: the dataset's
        ``loader_batch_size``; 1 for a DataLoader that yields single samples);
        leave it out in batch mode.

        Raises:
            ArgumentError: per-sample mode with no ``loader_batch_size`` here nor
                on the dataset (``batches`` could not be turned into samples), one
                that differs from the dataset's, or one given in batch mode.
        """
        self._refresh_distributed()
        where = self.file.path
        if self.batch_size is not None:
            if loader_batch_size is not None:
                raise ArgumentError(
                    f"{where}: position_after(loader_batch_size={loader_batch_size}) is for per-sample mode; this "
                    f"dataset yields whole batches (batch_size={self.batch_size}), so `batches` counts them: leave "
                    "loader_batch_size out"
                )
        elif loader_batch_size is None:
            if self.loader_batch_size is None:
                raise ArgumentError(
                    f"{where}: position_after({batches}, ...) in per-sample mode needs the DataLoader's batch size "
                    "to turn batches into samples: pass position_after(step, num_workers=..., loader_batch_size=B) "
                    "with B the DataLoader's batch_size (1 if it yields single samples), or make the dataset with "
                    "loader_batch_size=B"
                )
            loader_batch_size = self.loader_batch_size
        elif self.loader_batch_size is not None and loader_batch_size != self.loader_batch_size:
            raise ArgumentError(
                f"{where}: position_after(loader_batch_size={loader_batch_size}) differs from the dataset's "
                f"loader_batch_size={self.loader_batch_size}, which cuts its worker shares: pass the DataLoader's "
                "batch_size, the same as the dataset's"
            )
        if loader_batch_size is not None and (
            isinstance(loader_batch_size, bool) or not isinstance(loader_batch_size, int) or loader_batch_size < 1
        ):
            raise ArgumentError(f"{where}: loader_batch_size must be an integer >= 1, got {loader_batch_size!r}")
        readers = max(1, num_workers)
        plan = self._plan(readers)
        per_worker: list[int] = []
        for worker in range(readers):
            total = sum(b - a for a, b in self.reader_runs(worker, readers))
            if self.batch_size is not None:
                items = total // self.batch_size if self.drop_last else -(-total // self.batch_size)
            else:
                items = -(-total // loader_batch_size) if loader_batch_size else total
            per_worker.append(items)
        taken, next_worker = _resume.rounds_consumed(per_worker, batches)
        position: dict[str, Any] = {"kind": _resume.POSITION_KIND, "version": _resume.STATE_VERSION}
        position.update(set_id=self.file.set_id, epoch=self.epoch, **plan)
        rank = self._distributed[0]
        if self.batch_size is None and loader_batch_size:  # samples, not past a worker's share
            taken = [
                min(t * loader_batch_size, sum(b - a for a, b in self.reader_runs(w, readers)))
                for w, t in enumerate(taken)
            ]
        position["yielded"] = [[rank, w, t] for w, t in enumerate(taken)]
        # a new DataLoader starts its rotation at worker 0: worker j takes the role of worker
        # (next + j) mod n, so the rotation goes on where it stopped and the order is unchanged
        position["rotate"] = next_worker
        return position

    def _resume_share(self, share: Share, worker: int, num_workers: int) -> tuple[Share, int]:
        """The share and start position of this reader under the loaded resume point (used once)."""
        resume, self._resume = self._resume, None
        if resume is None:
            return share, 0
        if int(resume["epoch"]) != self.epoch:
            return share, 0  # set_epoch moved on after loading: a fresh epoch
        rank = self._distributed[0]
        same_plan = _resume.plan_key(resume) == _resume.plan_key(self._plan(num_workers))
        if resume["kind"] == _resume.STATE_KIND:
            if same_plan and (resume["rank"], resume["worker"]) == (rank, worker):
                return share, int(resume["yielded"])
            raise ResumeStateError(
                f"{self.file.path}: this state belongs to rank {resume['rank']} worker {resume['worker']} of "
                f"{resume['world_size']} ranks x {resume['num_workers']} workers, not to rank {rank} worker {worker} "
                f"of {self._distributed[1]} x {num_workers}: merge the states of every reader with "
                "torchrecord.loader_position(...) and load that position instead"
            )
        if same_plan:
            role = (worker + int(resume.get("rotate", 0))) % max(1, num_workers)
            if role != worker:
                share = self.share(role, num_workers)
            mine = [n for r, w, n in resume["yielded"] if (r, w) == (rank, role)]
            return share, int(mine[0]) if mine else 0
        runs = _resume.remaining_runs(
            resume,
            rank=rank,
            world_size=self._distributed[1],
            worker=worker,
            num_workers=num_workers,
            unit=self._unit(num_workers),
            drop_last=self.drop_last,
            bounds=self._bounds(),
        )
        runs = self._subset.runs(runs) if self._subset is not None else runs
        return Share(tuple(runs), share.seed, share.epoch, share.rank, share.worker, share.shuffle, share.window), 0

    # -- iteration ------------------------------------------------------------
    def reader_runs(self, worker: int = 0, num_workers: int = 1) -> list[tuple[int, int]]:
        """The sample runs of reader ``worker`` of ``num_workers`` on this rank this epoch (for inspection and tests).

        With a subset, the runs are of the selected sample indices (the order is
        decided over subset positions, then mapped).
        """
        count = self._count()
        k = self.file.samples_per_record
        block = self.block_size or _partition.auto_block_size(count)
        rank, world_size = self._distributed
        runs = _partition.reader_runs(
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
            unit=self._unit(num_workers),
            bounds=self._bounds(),
        )
        return self._subset.runs(runs) if self._subset is not None else runs

    def _bounds(self) -> Any:
        """The shard offsets of a sharded set (its blocks restart at each shard), None for one file.

        A subset's positions are not set indices, so its blocks ignore shard bounds (a
        block that straddles two shards is read from both).
        """
        if self._subset is not None or self.file.num_shards == 1:
            return None
        return self.file.shard_offsets

    def share(self, worker: int = 0, num_workers: int = 1) -> Share:
        """What reader ``worker`` of ``num_workers`` reads this epoch and the identity its order is seeded from."""
        window = self._window_size()
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
        who = self.reader()
        worker, num_workers = who.worker, who.num_workers
        layout = None if self._force_generic else self._fixed_layout()
        share, start = self.share(worker, num_workers), 0
        if self._resume is not None:  # a loaded resume point: used by this iteration only
            share, start = self._resume_share(share, worker, num_workers)
        allocate = None
        # in a worker, batches made of the gathered columns are gathered straight into a handover slot
        plain = self.transform is None and self.collate_fn is None
        if layout is not None and self.batch_size is not None and who.in_worker and plain:
            allocate = slot_allocator(self.batch_size * sum(layout.sample_bytes))
        reader = ShareReader(self.file, share, layout=layout, verify=checks_crc(self.check), allocate=allocate)
        self._iter_epoch = self.epoch
        self._yielded = start
        items = Items(
            self.file.path,
            self.file.schema,
            transform=self.transform,
            collate_fn=self.collate_fn,
            batch_transform=self.batch_transform,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            room=self._stack_room(),
            sample_chunk=self._sample_chunk or self.loader_batch_size,
        )
        return self._handed_over(self._counted(items.of(reader, start)))

    def _counted(self, items: Iterator[Any]) -> Iterator[Any]:
        """Count each item before it is yielded, so state_dict() always says what was handed out.

        When the pass ends (or the iterator is dropped), the file is let go: it
        stays in the process's small cache of idle files rather than held open.
        """
        try:
            for item in items:
                self._yielded += 1
                yield item
        finally:
            self.file._let_go(hard=False)

    def _window_size(self) -> int:
        layout = self._fixed_layout()
        per_sample = layout.length // layout.rows if layout is not None else None
        step = self.batch_size or SAMPLE_CHUNK
        return _order.window_size(self.shuffle_buffer, step, per_sample, shuffle=self.shuffle)

    def _fixed_layout(self) -> FixedLayout | None:
        key = (self.file.path, self.file.samples_per_record)
        if self._layout_cache is None or self._layout_cache[0] != key:
            self._layout_cache = (key, FixedLayout.of_file(self.file))
        return self._layout_cache[1]
