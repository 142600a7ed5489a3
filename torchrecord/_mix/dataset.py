"""MixedDataset: many record sets mixed by weight, exact counts per epoch, never stalled by one slow source."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Literal, get_args

import torch
from torch.utils.data import get_worker_info

from torchrecord._mix.mixer import Mixer, Picked
from torchrecord._mix.placement import Placement, placement_problem
from torchrecord._mix.source import FileSource, Source, SourceInfo, shared_schema
from torchrecord._mix.stats import StatsBoard, figures_of
from torchrecord._order import mix_plan as _mix_plan
from torchrecord._order import partition as _partition
from torchrecord._order import windows as _order
from torchrecord._order.mix_parts import MixEpochPlan, MixPart
from torchrecord._order.plan import Part
from torchrecord._read import rules as r
from torchrecord._read.base import ReaderDataset, in_worker
from torchrecord._read.options import check_choice, integer
from torchrecord._read.state import Start
from torchrecord._shards.open import SetLike
from torchrecord._store.checked import Check
from torchrecord.errors import ArgumentError

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
        >>> loader = torchrecord.RecordLoader(ds, num_workers=2)                   # doctest: +SKIP
        >>> for epoch in range(3):                                                  # doctest: +SKIP
        ...     loader.set_epoch(epoch)
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
        self._init_reader(locals())
        check_choice("policy", policy, POLICIES)
        check_choice("stop", stop, _mix_plan.STOPS)
        if isinstance(weights, str):
            check_choice("weights", weights, ("size", "uniform"))
        counts = {"draw_size": draw_size, "max_defer": max_defer, "threads": threads}
        for name, value in {**counts, "read_ahead_bytes": read_ahead_bytes}.items():
            integer(name, value, 1, none=False)
        self._open_sources(sources)
        self._weigh(weights, stop, epoch_size)
        self.stop, self.epoch_size, self.policy, self.draw_size = stop, epoch_size, policy, int(draw_size)
        self.tag_source = tag_source
        self.max_defer, self.read_ahead_bytes, self.threads = max_defer, read_ahead_bytes, threads
        self.set_id = "mix-" + hashlib.sha256("\n".join(i.set_id for i in self.infos).encode()).hexdigest()[:32]
        self._plan_cache: MixEpochPlan | None = None
        self._live: dict[str, Any] | None = None  # the current iteration (this process)
        self._unyielded = 0  # samples of the current chunk not yet yielded (sample mode)
        self._board = StatsBoard(len(self.sources))  # the workers' figures, for stats() in the main process

    def _weigh(self, weights: Any, stop: str, epoch_size: int | None) -> None:
        """The epoch's exact count per source (and the draw rates, where the weights are not the sizes' shares)."""
        sizes = [info.count for info in self.infos]
        fractions = _mix_plan.normalize_weights(weights, sizes, self.names)
        self.counts = _mix_plan.epoch_counts(sizes, fractions, stop, epoch_size)
        # all_once with weights other than the sizes: the weights are the rates of the draws while sources last
        all_once = stop == "all_once" and epoch_size is None
        self._rates = _mix_plan.draw_rates(self.counts, fractions) if all_once else None
        self.weights = [float(w) for w in fractions]

    def _open_sources(self, sources: Sequence[SetLike | Source] | Mapping[str, SetLike | Source]) -> None:
        """The sources (record sets opened as :class:`FileSource`), described at once, their names and schema."""
        names = [str(k) for k in sources] if isinstance(sources, Mapping) else []
        given = list(sources.values()) if isinstance(sources, Mapping) else list(sources)
        if not given:
            raise ArgumentError("sources is empty: give at least one record set")
        self.sources: list[Source] = [s if isinstance(s, Source) else FileSource(s, check=self.check) for s in given]
        with ThreadPoolExecutor(max_workers=min(16, len(self.sources))) as pool:  # cold sources open at once
            self.infos: list[SourceInfo] = list(pool.map(lambda s: s.describe(), self.sources))
        self.names = names or [info.name for info in self.infos]
        self.schema, self.fixed = shared_schema(self.infos, self.names)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_live"] = None  # threads and locks stay in the process that iterates
        state["_plan_cache"] = None
        return state

    # -- configuration ------------------------------------------------------
    def plan(self) -> _mix_plan.MixPlan:
        """This epoch's draws over all ranks (a pure function of the sources, weights, seed and epoch)."""
        return self._epoch_plan().draws

    @property
    def epoch_length(self) -> int:
        """Samples per mix epoch over all ranks (before padding or cutting for the ranks)."""
        return sum(self.counts)

    STATE_KIND = "torchrecord.MixedDataset"
    RESUME_ADVICE = "resume with the same sources, weights, stop rule, draw_size, seed and shuffle"
    PLAN_KEYS: ClassVar[Mapping[str, str]] = {
        "sizes": "its sources' sizes",
        "counts": "its samples per source and epoch (weights, stop, epoch_size)",
        "rates": "its draw rates (weights)",
        "draw_size": "its draw_size",
        "seed": "its seed",
        "shuffle": "its shuffle",
        "window": "its mixing window (shuffle_buffer, batch_size)",
        "drop_last": "its drop_last",
        "batch_size": "its batch_size",
        "loader_batch_size": "its loader_batch_size",
        "policy": "its policy",
        "horizon": "its max_defer",
    }

    def _set_id(self) -> str:
        return self.set_id

    def _where(self) -> str:
        return f"MixedDataset of {len(self.sources)} sources ({self.names[0]}, ...)"

    def _per_rank(self) -> int:
        return _partition.samples_per_rank(self.epoch_length, self._distributed[1], self.drop_last)

    def __repr__(self) -> str:
        return f"MixedDataset({len(self.sources)} sources, epoch_length={self.epoch_length}, policy={self.policy!r})"

    def _window(self) -> int:
        per_sample = max(info.bytes_per_sample for info in self.infos)
        return _order.window_size(self.shuffle_buffer, self.batch_size or 1, per_sample)

    def _horizon(self) -> int:
        return self.max_defer if self.policy == "ready" else 1

    def _epoch_plan(self) -> MixEpochPlan:
        plan = MixEpochPlan(
            sizes=tuple(i.count for i in self.infos),
            blocks=tuple(_mix_plan.order_block(i.count, self.draw_size, i.samples_per_record) for i in self.infos),
            counts=tuple(self.counts),
            rates=tuple(self._rates) if self._rates is not None else None,
            draw_size=self.draw_size,
            seed=int(self.seed),
            epoch=self.epoch,
            shuffle=bool(self.shuffle),
            window=self._window(),
            step=self.batch_size or _SAMPLE_MODE_BATCH,
            drop_last=bool(self.drop_last),
            batch_size=self.batch_size,
            loader_batch_size=self.loader_batch_size,
        )
        if self._plan_cache is None or self._plan_cache.key != plan.key:
            self._plan_cache = plan  # keeps its draws, worked out once per epoch
        return self._plan_cache

    def _plan_keys(self) -> dict[str, Any]:
        plan = self._epoch_plan()
        return {
            "sizes": list(plan.sizes),
            "counts": list(plan.counts),
            "rates": list(plan.rates) if plan.rates is not None else None,
            "draw_size": plan.draw_size,
            "seed": plan.seed,
            "shuffle": plan.shuffle,
            "window": plan.window,
            "drop_last": plan.drop_last,
            "batch_size": plan.batch_size,
            "loader_batch_size": plan.loader_batch_size,
            "policy": self.policy,
            "horizon": self._horizon(),
        }

    def _batch_bytes(self) -> int | None:
        per_sample = max(info.bytes_per_sample for info in self.infos)
        return (self.batch_size or 1) * per_sample

    # -- iteration ------------------------------------------------------------
    def _read(self, start: Start, part: Part) -> Iterator[Any]:
        assert isinstance(part, MixPart)
        started = time.perf_counter()  # first_batch_seconds counts the mixer's start too
        plan = self._epoch_plan()
        units = part.units
        placement = start.progress
        if placement is None:  # exact: where the reader stands follows from the samples it handed out
            placement = part.placement_at(plan.samples(start.yielded, part))

        def runs_of(u: int) -> list[tuple[int, int]]:
            return plan.source_runs(int(units.source[u]), int(units.stream[u]), int(units.length[u]))

        mixer = Mixer(
            self.sources,
            units.source,
            units.length,
            runs_of,
            window=part.window,
            step=part.step,
            order=part.order,
            horizon=self._horizon(),
            placement=Placement.from_state(placement),
            readahead={
                "columns": self.fixed,
                "estimate": [i.bytes_per_sample for i in self.infos],
                "max_bytes": self.read_ahead_bytes,
                "threads": self.threads,
            },
        )
        self._live = {"mixer": mixer, "started": started, "wall": time.time(), "first": None}
        self._unyielded = 0
        items = self._batches(mixer) if self.batch_size is not None else self._samples(mixer)
        return self._with_stats(items)

    def _with_stats(self, items: Iterator[Any]) -> Iterator[Any]:
        """``items``, noting the time to the first one, and posting a DataLoader worker's figures on the board."""
        live = self._live
        assert live is not None
        info = get_worker_info()
        post = None
        if info is not None:  # a DataLoader worker: its figures go on the board
            row = self._board.row(info.id, info.seed - info.id, self.epoch, info.num_workers, live["wall"])
            every = 1 if self.batch_size is not None else _SAMPLE_MODE_BATCH

            def post() -> None:
                if row is not None:
                    self._board.post(row, figures_of(live["mixer"], live["first"]))

        for count, item in enumerate(items, start=1):
            if live["first"] is None:
                live["first"] = time.perf_counter() - live["started"]
            if post is not None and (count % every == 0 or count == 1):
                post()
            yield item
        if post is not None:
            post()

    def _samples(self, mixer: Mixer) -> Iterator[Any]:
        items, tag = self._items(self._where(), self.schema), self.tag_source
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
        items = self._items(self._where(), self.schema)
        for picked in mixer.chunks(size):
            if len(picked) < size and self.drop_last:
                return
            batch = items.batch(*_chunk_of(picked))
            yield (batch, torch.from_numpy(picked.source)) if self.tag_source else batch

    # -- progress (policy="ready") -------------------------------------------------------
    def _progress(self) -> Any:
        """With ``policy="ready"`` the reader's placement: which units are placed is not a function of the count."""
        live = self._live
        if self.policy != "ready" or live is None:
            return None
        placement = live["mixer"].placement.to_state()
        placement["offset"] -= self._unyielded
        return placement

    def _progress_problem(self, progress: Any, part: Part) -> str | None:
        if self.policy != "ready":
            return "with policy='exact' a reader's placement follows from the items it yielded; states keep none"
        assert isinstance(part, MixPart)
        problem = placement_problem(progress, part.units.length, window=part.window, step=part.step, exact=False)
        return None if problem is None else f"{problem[0]} {r.show(problem[1])}: {problem[2]}"

    def _count_problem(self) -> str | None:
        if self.policy != "ready":
            return None
        return (
            "with policy='ready' draws are placed as they are read, so the batches a loader handed out do not give "
            "the position: save the dataset's state_dict() (0 workers), a torchdata StatefulDataLoader's state, "
            "or use policy='exact'"
        )

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
            figures = figures_of(live["mixer"], live["first"])
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


def _chunk_of(picked: Picked) -> tuple[Any, bool]:
    """(chunk, fixed) of a mixed chunk: its typed columns, or its decoded samples."""
    if picked.columns is not None:
        return picked.columns, True
    assert picked.samples is not None
    return picked.samples, False
