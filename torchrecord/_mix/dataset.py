"""MixedDataset: many record sets mixed by weight, exact counts per epoch, never stalled by one slow source."""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import numpy as np
import torch
from torch.utils.data import get_worker_info

from torchrecord._mix import resume as _mix_resume
from torchrecord._mix.mixer import Mixer, Picked, Placement
from torchrecord._mix.resume import MIX_POSITION_KIND, MIX_STATE_KIND, placement_problem, reader_units_of
from torchrecord._mix.source import FileSource, Source, SourceInfo, shared_schema
from torchrecord._order import mix_plan as _mix_plan
from torchrecord._order import partition as _partition
from torchrecord._order import windows as _order
from torchrecord._read import resume as _resume
from torchrecord._read.base import Reader, ReaderDataset, check_choice, in_worker
from torchrecord._read.items import Items
from torchrecord._shards.open import SetLike
from torchrecord._store.checked import Check
from torchrecord.errors import ArgumentError, ResumeStateError, TorchRecordWarning

__all__ = ["MixedDataset"]

Policy = Literal["exact", "ready"]
Stop = Literal["all_once", "until_all", "first_exhausted"]
POLICIES: tuple[str, ...] = get_args(Policy)

#: Internal chunk of the read path when the dataset yields single samples.
_SAMPLE_MODE_BATCH = 256


class MixedDataset(ReaderDataset):
    """Mix several record sets by weight into one stream, with exact per-source counts every epoch.

    Every mix epoch takes an exact number of samples from each source (from the
    weights and the stop rule, by largest remainder), in *draws* of ``draw_size``
    consecutive samples of that source, interleaved evenly over the epoch by a
    seeded plan; the plan is split over ranks (equal counts per rank) and
    DataLoader workers like :class:`~torchrecord.RecordDataset`. Each source reads
    an endless stream of its own epochs: a source read less than once per mix
    epoch continues where it stopped in the next one, a source read more than
    once wraps into its own next epoch (a new order). Everything is a pure
    function of (seed, epoch, world size): call :meth:`set_epoch` each epoch.

    Each reader reads its draws ahead on a few threads (``threads``, bounded by
    ``read_ahead_bytes``), the first planned draws first; a slow read (a cold
    start) stops holding up the others after 10 ms, so cold starts overlap.
    Draws are mixed in windows of ``shuffle_buffer`` samples holding the *stored*
    bytes (typed columns of a fixed-layout set, or the stored records), and only
    the samples handed out are decoded and transformed. The first windows ramp up
    from one batch (about half more per window), so the first batch waits for
    about a batch of draws; the next window is filled while the current one is
    handed out, so each batch waits for about one batch of reading, never for a
    whole window (a reader holds two windows: the one handed out and the next).

    ``policy="exact"`` places the planned draw next, waiting for it: the order is
    bit-for-bit reproducible. ``policy="ready"`` places the first draw that is
    read among the next ``max_defer`` planned ones, so a slow source never stalls
    the others; the epoch keeps exactly the same samples and a draw moves at most
    ``max_defer`` draws away from its planned place (then the mixer waits for it).
    No mixer with exact counts can hide a source slower than its share: once its
    draws are ``max_defer`` behind, batches come at its pace.

    Args:
        sources: a list of paths (record-set files, or sharded sets' folders,
            manifests or URLs) or :class:`~torchrecord.RecordSet`\\ s, or a dict
            name -> path. They must share one schema (fields, kinds, dtypes and
            ranks; a size that differs becomes variable). An object implementing
            ``torchrecord._mix.source.Source`` is read through that interface
            (tests and benchmarks use it to throttle or gate a set).
        weights: ``"size"`` (each source's sample count), ``"uniform"``, or one
            number >= 0 per source (a list, or a dict by name); 0 leaves a source out.
        stop: the epoch's length when ``epoch_size`` is None: ``"all_once"``
            (every sample of every source with a weight > 0 exactly once, for any
            weights: with weights other than ``"size"`` the weights set the rates
            at which the sources are drawn while they last, so a small source with
            a large weight is used up early in the epoch and the rest mixes the
            others), ``"until_all"`` (until every source was read whole at least
            once) or ``"first_exhausted"`` (until the first source is read whole).
            With ``"until_all"``, ``"first_exhausted"`` and ``epoch_size`` the
            weights are the exact shares of the epoch, spread evenly over it.
        epoch_size: the epoch's length in samples (overrides ``stop``).
        policy: ``"exact"`` or ``"ready"`` (see above).
        draw_size: samples per draw: consecutive samples of one source read together.
        batch_size: yield batches of this many samples built in the reader (use
            ``DataLoader(batch_size=None)``); None yields samples. Batches are
            collated as :class:`~torchrecord.RecordDataset` collates them
            (fixed numeric leaves stacked, variable shapes and strings as lists).
        shuffle: permute the samples of each mixing window (``False``: they are
            handed out in the order of their draws; the plan of draws and each
            source's own block order still come from the seed, so the mix is
            still interleaved by weight).
        shuffle_buffer: samples per mixing window once ramped up (capped at 64 MiB
            of stored records, never below one batch).
        transform: called on each decoded sample after the mix.
        batch_transform: called on each batch (batch mode).
        collate_fn: batch mode: turns the list of (transformed) samples of a batch
            into the batch, replacing the default collation.
        seed: the base seed of the plan and of every order.
        drop_last: ranks cut the remainder instead of padding by wrapping; in batch
            mode each reader also drops its last short batch.
        rank, world_size: override what ``torch.distributed`` reports.
        loader_batch_size: per-sample mode: the ``batch_size`` of the DataLoader,
            so each worker's share is cut on whole batches and the loader yields
            exactly ``len(loader)`` batches for any batch size (as for
            :class:`~torchrecord.RecordDataset`).
        tag_source: yield ``(item, source)``: the source index of a sample (an
            int), or of each sample of a batch (an int64 tensor).
        max_defer: how far (in draws) ``policy="ready"`` may move a draw.
        read_ahead_bytes: budget of draws read ahead and not yet mixed, per reader.
        threads: reading threads per reader; keep it above the number of sources
            that may stall at once, so the others keep flowing. Two reads run at
            once (reading a fast source is Python work under the GIL, and busy
            readers delay the mixer); a read still running after 10 ms (a stalled
            source) stops counting, and the next one starts.
        check: integrity on read: ``"checksums"`` checks every record's CRC-32 as it
            is read, ``"structure"`` each file's LMDB page structure when the
            dataset is made (files of unknown provenance; see :class:`RecordFile`),
            ``"full"`` both. A :class:`RecordFile` source made with a ``check``
            carries its own check.

    :meth:`stats` reports this process's time to the first batch, draws read per
    source, waits, deferrals and the realised share of every source.

    Example:
        >>> ds = MixedDataset({"a": "a.tr", "b": "b.tr"}, weights={"a": 3, "b": 1},   # doctest: +SKIP
        ...                   stop="until_all", batch_size=128, policy="ready")
        >>> loader = DataLoader(ds, batch_size=None, num_workers=2)               # doctest: +SKIP
        >>> for epoch in range(3):                                                  # doctest: +SKIP
        ...     ds.set_epoch(epoch)
        ...     for images, labels in loader: ...
    """

    def __init__(
        self,
        sources: Sequence[SetLike | Source] | Mapping[str, SetLike | Source],
        weights: Literal["size", "uniform"] | Sequence[float] | Mapping[str, float] = "size",
        *,
        stop: Stop = "all_once",
        epoch_size: int | None = None,
        policy: Policy = "exact",
        draw_size: int = 16,
        batch_size: int | None = None,
        shuffle: bool = True,
        shuffle_buffer: int = 8192,
        transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        loader_batch_size: int | None = None,
        tag_source: bool = False,
        max_defer: int = 1024,
        read_ahead_bytes: int = 64 << 20,
        threads: int = 8,
        check: Check | None = None,
    ) -> None:
        self._init_reader(
            rank,
            world_size,
            batch_size=batch_size,
            shuffle=shuffle,
            shuffle_buffer=shuffle_buffer,
            transform=transform,
            batch_transform=batch_transform,
            collate_fn=collate_fn,
            seed=seed,
            drop_last=drop_last,
            loader_batch_size=loader_batch_size,
            check=check,
        )
        check_choice("policy", policy, POLICIES)
        check_choice("stop", stop, _mix_plan.STOPS)
        if isinstance(weights, str):
            check_choice("weights", weights, ("size", "uniform"))
        for name, value in (
            ("draw_size", draw_size),
            ("max_defer", max_defer),
            ("threads", threads),
            ("read_ahead_bytes", read_ahead_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ArgumentError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(sources, Mapping):
            names = [str(k) for k in sources]
            given = list(sources.values())
        else:
            given = list(sources)
            names = []
        if not given:
            raise ArgumentError("sources is empty: give at least one record set")
        self.sources: list[Source] = [s if isinstance(s, Source) else FileSource(s, check=self.check) for s in given]
        with ThreadPoolExecutor(max_workers=min(16, len(self.sources))) as pool:  # cold sources open at once
            self.infos: list[SourceInfo] = list(pool.map(lambda s: s.describe(), self.sources))
        self.names = names or [info.name for info in self.infos]
        self.schema, self.fixed = shared_schema(self.infos, self.names)
        sizes = [info.count for info in self.infos]
        fractions = _mix_plan.normalize_weights(weights, sizes, self.names)
        self.counts = _mix_plan.epoch_counts(sizes, fractions, stop, epoch_size)
        # all_once with weights other than the sizes: the weights are the rates of the draws while sources last
        all_once = stop == "all_once" and epoch_size is None
        self._rates = _mix_plan.draw_rates(self.counts, fractions) if all_once else None
        self.weights = [float(w) for w in fractions]
        self.stop, self.epoch_size, self.policy, self.draw_size = stop, epoch_size, policy, int(draw_size)
        self.tag_source = tag_source
        self.max_defer, self.read_ahead_bytes, self.threads = max_defer, read_ahead_bytes, threads
        digest = hashlib.sha256("\n".join(info.set_id for info in self.infos).encode()).hexdigest()
        self.set_id = "mix-" + digest[:32]
        self._plan_cache: tuple[int, _mix_plan.MixPlan] | None = None
        self._resume: dict[str, Any] | None = None
        self._live: dict[str, Any] | None = None  # the current iteration (this process)
        self._yielded = 0
        self._unyielded = 0  # samples of the current chunk not yet yielded (sample mode)
        self._iter_epoch: int | None = None
        self._board = _StatsBoard(len(self.sources))  # the workers' figures, for stats() in the main process

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_live"] = None  # threads and locks stay in the process that iterates
        state["_plan_cache"] = None
        return state

    # -- configuration ------------------------------------------------------
    def plan(self) -> _mix_plan.MixPlan:
        """This epoch's draws over all ranks (a pure function of the sources, weights, seed and epoch)."""
        epoch = self.epoch
        if self._plan_cache is None or self._plan_cache[0] != epoch:
            self._plan_cache = (
                epoch,
                _mix_plan.plan_epoch(self.counts, block=self.draw_size, seed=self.seed, epoch=epoch, rates=self._rates),
            )
        return self._plan_cache[1]

    @property
    def epoch_length(self) -> int:
        """Samples per mix epoch over all ranks (before padding or cutting for the ranks)."""
        return sum(self.counts)

    STATE_KIND = MIX_STATE_KIND
    RETIRED_STATE_KEYS: ClassVar[Mapping[str, str]] = {"block": "draw_size"}

    def _set_id(self) -> str:
        return self.set_id

    def _per_rank(self) -> int:
        return _partition.samples_per_rank(self.epoch_length, self._distributed[1], self.drop_last)

    def __repr__(self) -> str:
        return f"MixedDataset({len(self.sources)} sources, epoch_length={self.epoch_length}, policy={self.policy!r})"

    def _window(self) -> int:
        per_sample = max(info.bytes_per_sample for info in self.infos)
        return _order.window_size(self.shuffle_buffer, self.batch_size or 1, per_sample)

    def _settings(self, num_workers: int) -> dict[str, Any]:
        return {
            "sizes": [info.count for info in self.infos],
            "counts": list(self.counts),
            "rates": self._rates,
            "draw_size": self.draw_size,
            "seed": int(self.seed),
            "shuffle": bool(self.shuffle),
            "window": self._window(),
            "drop_last": bool(self.drop_last),
            "batch_size": self.batch_size,
            "world_size": self._distributed[1],
            "num_workers": num_workers,
            "worker_unit": self._unit(num_workers),
            "policy": self.policy,
            "horizon": self._horizon(),
        }

    def _horizon(self) -> int:
        return self.max_defer if self.policy == "ready" else 1

    # -- iteration ------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        started = time.perf_counter()  # first_batch_seconds counts the plan and the mixer's start too
        who = self.reader()
        rank, worker, num_workers = who.rank, who.worker, who.num_workers
        plan = self.plan()
        if self._resume is None:  # a fresh epoch: this reader's part of the plan
            base, placement, yielded = None, Placement(), 0
            units = _mix_plan.reader_units(
                plan,
                rank=rank,
                world_size=who.world_size,
                worker=worker,
                num_workers=num_workers,
                drop_last=self.drop_last,
                batch_size=self._unit(num_workers),
            )
        else:  # a loaded resume point: used by this iteration only
            base, placement, yielded, units = self._resume_point(plan, who)
        seed, epoch, shuffle = self.seed, self.epoch, self.shuffle

        def order(j: int, n: int) -> np.ndarray:
            if not shuffle:
                return np.arange(n)
            return _order.window_order(n, seed=seed, epoch=epoch, rank=rank, worker=worker, window=j)

        blocks = [_mix_plan.order_block(i.count, self.draw_size, i.samples_per_record) for i in self.infos]
        seeds = [_mix_plan.source_seed(self.seed, s) for s in range(len(self.infos))]
        sizes = [i.count for i in self.infos]

        def runs_of(u: int) -> list[tuple[int, int]]:
            s, lo = int(units.source[u]), int(units.stream[u])
            return _mix_plan.stream_runs(sizes[s], blocks[s], seeds[s], lo, lo + int(units.length[u]))

        mixer = Mixer(
            self.sources,
            units.source,
            units.length,
            runs_of,
            window=self._window(),
            step=self.batch_size or _SAMPLE_MODE_BATCH,
            order=order,
            horizon=self._horizon(),
            placement=placement,
            readahead={
                "columns": self.fixed,
                "estimate": [i.bytes_per_sample for i in self.infos],
                "max_bytes": self.read_ahead_bytes,
                "threads": self.threads,
            },
        )
        self._live = {
            "mixer": mixer,
            "started": started,
            "wall": time.time(),
            "first": None,
            "base": base,
            "reader": (rank, worker, num_workers),
        }
        self._iter_epoch, self._yielded, self._unyielded = epoch, yielded, 0
        items = self._batches(mixer) if self.batch_size is not None else self._samples(mixer)
        return self._handed_over(self._counted(items))

    def _counted(self, items: Iterator[Any]) -> Iterator[Any]:
        live = self._live
        info = get_worker_info()
        post = None
        if info is not None and live is not None:  # a DataLoader worker: its figures go on the board
            row = self._board.row(info.id, info.seed - info.id, self.epoch, info.num_workers, live["wall"])
            every = 1 if self.batch_size is not None else _SAMPLE_MODE_BATCH

            def post() -> None:
                if row is not None:
                    self._board.post(row, self._figures(live))

        for item in items:
            self._yielded += 1
            if live is not None and live["first"] is None:
                live["first"] = time.perf_counter() - live["started"]
            if post is not None and (self._yielded % every == 0 or self._yielded == 1):
                post()
            yield item
        if post is not None:
            post()

    def _items(self) -> Items:
        """How this dataset turns mixed chunks into samples or batches: the one path of every reader."""
        return Items(
            self._where(),
            self.schema,
            transform=self.transform,
            collate_fn=self.collate_fn,
            batch_transform=self.batch_transform,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            room=self._stack_room(),
        )

    def _samples(self, mixer: Mixer) -> Iterator[Any]:
        items, tag = self._items(), self.tag_source
        for picked in mixer.chunks(_SAMPLE_MODE_BATCH, cross=False):
            chunk, fixed = _chunk_of(picked)
            sources = picked.source.tolist()
            self._unyielded = len(sources)
            for sample, source in zip(items.samples(chunk, fixed), sources):
                self._unyielded -= 1
                yield (sample, source) if tag else sample

    def _batches(self, mixer: Mixer) -> Iterator[Any]:
        size = self.batch_size
        assert size is not None
        items = self._items()
        for picked in mixer.chunks(size):
            if len(picked) < size and self.drop_last:
                return
            batch = items.batch(*_chunk_of(picked))
            yield (batch, torch.from_numpy(picked.source)) if self.tag_source else batch

    # -- statistics ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Figures of the current (or last) iteration: this process's, or its DataLoader workers' together.

        With DataLoader workers (fork or spawn) each worker posts its figures to
        shared memory as it goes, and ``stats()`` in the main process adds up those
        of the workers of the latest iteration (the latest ``iter(loader)`` and
        epoch); when the main process iterated the dataset itself more recently,
        its own figures. Called in a worker, the worker's own. Up to 64 workers
        per process are counted (a warning says when more ran).

        Keys: ``first_batch_seconds`` (from ``iter()`` to the first item; with
        workers, the earliest worker's), ``draws_read`` and ``reads`` per source
        name, ``waits`` (times the mixer waited for a read) and ``wait_seconds``,
        ``deferrals`` (draws placed ahead of an unread planned one), ``samples``
        handed out per source, ``share`` (their realised fractions),
        ``planned_share`` (the epoch's counts as fractions) and ``workers`` (the
        DataLoader workers whose figures are counted; 0 for this process's own).
        """
        total = max(1, self.epoch_length)
        planned = {n: c / total for n, c in zip(self.names, self.counts)}
        live = self._live
        board = None if in_worker() else self._board.gather(after=live["wall"] if live is not None else None)
        if board is not None:
            figures = board
        elif live is not None:
            figures = self._figures(live)
        else:
            return {
                "first_batch_seconds": None,
                "draws_read": {},
                "reads": {},
                "waits": 0,
                "wait_seconds": 0.0,
                "deferrals": 0,
                "samples": {},
                "share": {},
                "planned_share": planned,
                "workers": 0,
            }
        handed = figures.handed
        out = max(1, sum(handed))
        return {
            "first_batch_seconds": figures.first,
            "draws_read": dict(zip(self.names, figures.draws)),
            "reads": dict(zip(self.names, figures.reads)),
            "waits": figures.waits,
            "wait_seconds": figures.wait_seconds,
            "deferrals": figures.deferrals,
            "samples": dict(zip(self.names, handed)),
            "share": {n: h / out for n, h in zip(self.names, handed)},
            "planned_share": planned,
            "workers": figures.workers,
        }

    def _figures(self, live: dict[str, Any]) -> _Figures:
        """This process's figures of its current iteration."""
        mixer: Mixer = live["mixer"]
        return _Figures(
            first=live["first"],
            draws=[int(x) for x in mixer.reader.units_read],
            reads=[int(x) for x in mixer.reader.reads],
            waits=int(mixer.reader.waits),
            wait_seconds=float(mixer.reader.wait_seconds),
            deferrals=int(mixer.deferrals),
            handed=[int(x) for x in mixer.handed.tolist()],
            workers=0,
        )

    # -- resume -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This reader's resume point: plain, JSON-serialisable values.

        It holds ``kind``, ``version``, ``set_id`` (a digest of the sources'
        set ids), ``epoch``, the settings that decide the plan, who this reader is,
        the items it yielded and where its mix stands (which draws are placed, the
        draws of the current window, and how many of its samples
        were handed out).
        """
        who = self.reader()
        state = self._state_header(who, self._iter_epoch if self._iter_epoch is not None else self.epoch)
        state.update(self._settings(who.num_workers))
        live = self._live
        if live is not None and live["reader"] == (who.rank, who.worker, who.num_workers):
            placement = live["mixer"].placement.to_state()
            placement["offset"] -= self._unyielded
            base = live["base"]
        else:
            placement, base = Placement().to_state(), None
        state.update(yielded=self._yielded, base=base, placement=placement)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the current epoch from a state or a position; the next iteration starts there.

        ``state`` is what :meth:`state_dict` returned (same ranks, workers and
        settings: with ``policy="exact"`` exactly the rest of the epoch in the same
        order, with ``"ready"`` every sample not yet handed out, once), or a
        position from :func:`torchrecord.loader_position` (any world size and
        number of workers: every sample not yet handed out, exactly once over the
        new readers). Call :meth:`set_epoch` with the saved epoch first.

        Raises:
            ValueError: a state of other sources, of a later epoch, of a newer
                state version, or of other weights, draw_size, seed or shuffle. A
                state of an earlier epoch is ignored with a warning.
        """
        self._refresh_distributed()
        self._resume = self._accept_state(
            state,
            kinds=(MIX_STATE_KIND, MIX_POSITION_KIND),
            plan=self._settings(1),
            plan_keys=("sizes", "counts", "rates", "draw_size", "seed", "shuffle"),
            advice="resume with the same sources, weights, stop rule, draw_size, seed and shuffle",
        )
        if self._resume is not None:
            try:
                self._check_resume(self._resume, self.plan(), 0)
            except ResumeStateError:
                self._resume = None
                raise

    def _check_resume(self, state: Mapping[str, Any], plan: _mix_plan.MixPlan, depth: int) -> None:
        """Every field of a state or position (and of the positions it rests on), against this dataset.

        The settings must be this dataset's (the unit workers were cut on follows from them, the world
        size and the number of workers); each reader named one of the run's, and each placement one its
        units allow (:func:`~torchrecord._mix.resume.placement_problem`). Nothing is expanded before it
        is checked against the reader's units.
        """
        r = _resume
        where = self._where()
        kind = str(state.get("kind")) if isinstance(state, Mapping) else "MixedDataset"
        if depth > r.MAX_DEPTH:
            r.refuse(where, kind, "base", "...", f"positions nest more than {r.MAX_DEPTH} deep")
        if not isinstance(state, Mapping) or state.get("kind") != (MIX_POSITION_KIND if depth else state.get("kind")):
            r.refuse(where, kind, "base", state, f"must be None or a {MIX_POSITION_KIND} position")
        mine = self._settings(1)
        rules: dict[str, r.Rule] = {key: r.anything for key in ("kind", "version", "set_id", "epoch")}
        for key in ("sizes", "counts", "rates", "draw_size", "seed", "shuffle", "window", "drop_last", "batch_size"):
            rules[key] = r.equal(mine[key], f"its {key}")
        rules.update(
            policy=r.equal(self.policy, "its policy"),
            horizon=r.equal(self._horizon(), "its max_defer"),
            world_size=r.integer(1, r.MAX_READERS),
            num_workers=r.integer(1, r.MAX_READERS),
            worker_unit=r.integer(1),
            base=r.anything,
        )
        position = state.get("kind") == MIX_POSITION_KIND
        if position:
            rules["readers"] = r.rows(r.integer(0), r.integer(0), r.anything, names=("rank", "worker", "placement"))
        else:
            rules.update(rank=r.integer(0), worker=r.integer(0), yielded=r.integer(0), placement=r.anything)
        # states saved before draw rates existed have no "rates": fine where this mix has none either
        optional = ("rates",) if mine["rates"] is None else ()
        r.check_state(state, rules, where=where, what=kind, optional=optional)
        if depth:  # a base: the same set and epoch as the state resting on it
            r.check_state(
                state,
                {"set_id": r.equal(self.set_id, "its set_id"), "epoch": r.equal(self.epoch, "its epoch")},
                where=where,
                what=kind,
                every_key=False,
                prefix="base.",
            )
        world, workers = int(state["world_size"]), int(state["num_workers"])
        if world * workers > r.MAX_READERS:
            r.refuse(where, kind, "num_workers", workers, f"{world} ranks x {workers} workers are too many readers")
        per_rank = _partition.samples_per_rank(self.epoch_length, world, self.drop_last)
        unit = _partition.worker_unit(per_rank, workers, self.batch_size, self.loader_batch_size)
        if state["worker_unit"] != unit:
            r.refuse(
                where,
                kind,
                "worker_unit",
                state["worker_unit"],
                f"a run of this dataset on {world} ranks x {workers} workers cuts worker shares on {unit} samples",
            )
        base = state["base"]
        if base is not None:
            self._check_resume(base, plan, depth + 1)
        if position:
            same = world == self._distributed[1] and base is None
            r.check_readers(
                state["readers"],
                world_size=world,
                num_workers=workers,
                where=where,
                what=kind,
                field="readers",
                rank=self._distributed[0] if same else None,
            )
            readers = [(int(a), int(b), p) for a, b, p in state["readers"]]
        else:
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
            readers = [(int(state["rank"]), int(state["worker"]), state["placement"])]
        for rank, worker, placement in readers:
            units = _mix_resume.reader_units_of(
                plan,
                base,
                rank=rank,
                world_size=world,
                worker=worker,
                num_workers=workers,
                drop_last=self.drop_last,
                unit=unit,
            )
            problem = placement_problem(
                placement,
                units.length,
                window=self._window(),
                step=self.batch_size or _SAMPLE_MODE_BATCH,
                exact=self._horizon() == 1,
            )
            if problem:
                field, value, reason = problem
                r.refuse(
                    where,
                    kind,
                    field if not position else f"readers (rank {rank}, worker {worker}) {field}",
                    value,
                    reason,
                )
            if not position and state["yielded"] > int(units.length.sum()):
                r.refuse(
                    where,
                    kind,
                    "yielded",
                    state["yielded"],
                    f"the reader's units hold {int(units.length.sum())} samples",
                )

    def _where(self) -> str:
        return f"MixedDataset of {len(self.sources)} sources ({self.names[0]}, ...)"

    def _resume_point(self, plan: _mix_plan.MixPlan, who: Reader) -> tuple[Any, Placement, int, _mix_plan.Units]:
        """(base position, placement, items yielded, units) of this reader under the loaded resume point (used once)."""
        resume, self._resume = self._resume, None
        rank, worker, num_workers = who.rank, who.worker, who.num_workers
        base: dict[str, Any] | None = None
        placement, yielded = Placement(), 0
        if resume is not None and int(resume["epoch"]) == self.epoch:
            same = all(resume.get(k) == v for k, v in self._settings(num_workers).items())
            if resume["kind"] == MIX_STATE_KIND:
                if not (same and (resume["rank"], resume["worker"]) == (rank, worker)):
                    raise ResumeStateError(
                        f"{self._where()}: this state belongs to rank {resume['rank']} worker {resume['worker']} of "
                        f"{resume['world_size']} ranks x {resume['num_workers']} workers with its settings, not to "
                        f"rank {rank} worker {worker} of {who.world_size} x {num_workers}: merge the states of every "
                        "reader with torchrecord.loader_position(...) and load that position instead"
                    )
                base, placement, yielded = (
                    resume.get("base"),
                    Placement.from_state(resume["placement"]),
                    int(resume["yielded"]),
                )
            else:
                assert resume["kind"] == MIX_POSITION_KIND
                mine = [p for r, w, p in resume["readers"] if (r, w) == (rank, worker)]
                if same and resume.get("base") is None and mine:
                    placement = Placement.from_state(mine[0])
                else:
                    base = resume
        units = reader_units_of(
            plan,
            base,
            rank=rank,
            world_size=who.world_size,
            worker=worker,
            num_workers=num_workers,
            drop_last=self.drop_last,
            unit=self._unit(num_workers),
        )
        return base, placement, yielded, units


def _chunk_of(picked: Picked) -> tuple[Any, bool]:
    """(chunk, fixed) of a mixed chunk: its typed columns, or its decoded samples."""
    if picked.columns is not None:
        return picked.columns, True
    assert picked.samples is not None
    return picked.samples, False


@dataclass
class _Figures:
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


class _StatsBoard:
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

    def post(self, row: int, figures: _Figures) -> None:
        """Write one worker's figures to its row (only that worker writes there)."""
        ints, floats = self.ints.numpy(), self.floats.numpy()
        s = self.sources
        ints[row, 3:6] = (figures.waits, figures.deferrals, 1)
        ints[row, _HEAD : _HEAD + s] = figures.draws
        ints[row, _HEAD + s : _HEAD + 2 * s] = figures.reads
        ints[row, _HEAD + 2 * s :] = figures.handed
        floats[row, 1:] = (np.nan if figures.first is None else figures.first, figures.wait_seconds)

    def gather(self, after: float | None) -> _Figures | None:
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
        return _Figures(
            first=float(firsts.min()) if len(firsts) else None,
            draws=[int(x) for x in added[_HEAD : _HEAD + s]],
            reads=[int(x) for x in added[_HEAD + s : _HEAD + 2 * s]],
            waits=int(added[3]),
            wait_seconds=float(floats[rows, 2].sum()),
            deferrals=int(added[4]),
            handed=[int(x) for x in added[_HEAD + 2 * s :]],
            workers=len(rows),
        )
