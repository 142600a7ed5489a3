"""ReaderDataset: the one reader contract. The base owns the pass, the state and the loader glue.

``RecordDataset``, ``MixedDataset``, ``StreamDataset`` and ``WindowDataset``
stand on :class:`ReaderDataset`. A reader supplies only what it alone knows:

* its plan: an :class:`~torchrecord._order.plan.EpochPlan` (pure, in
  ``torchrecord._order``) of what each (rank, worker) reads in what order this
  epoch (:meth:`ReaderDataset._epoch_plan`), and the settings that decide it
  (:meth:`ReaderDataset._plan_keys`, saved as the state's ``plan``);
* how its part of that plan becomes items (:meth:`ReaderDataset._read`).

The base implements everything else once, for every reader:

* the checks of the shared options (``torchrecord._read.options``);
* the epoch and the world: ``set_epoch`` writes the epoch to a shared-memory
  tensor, so persistent DataLoader workers see it; rank and world size are given,
  or read from ``torch.distributed`` in the main process;
* iteration: who reads (:meth:`ReaderDataset.reader`), where its pass starts
  (a resume point, used by exactly one pass in every process that holds the
  dataset), counting what it yields, and the handover out of a DataLoader worker;
* ``state_dict``/``load_state_dict`` in one layout, checked by one table
  (``torchrecord._read.state``), resume on the same world or elastically on any
  other, and ``position_after`` for plain DataLoaders;
* the ``len(loader)`` glue: ``loader_batch_size``, ``len(loader)`` warnings,
  :meth:`ReaderDataset.check_loader`, and a DataLoader that batches batches;
* per-sample mode read as whole loader batches for ``RecordLoader`` (``_fused``).

The module is over 500 lines because it is the contract: every item above is
implemented here once so that no reader repeats it; the state layout, the resume
table and the loader glue's checks already live in their own modules.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, NamedTuple

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from torchrecord._core.kinds import Room
from torchrecord._core.schema import Schema
from torchrecord._order.plan import EpochPlan, Part, Reader
from torchrecord._order.share import SharePlan
from torchrecord._read import glue as _glue
from torchrecord._read import state as _state
from torchrecord._read.glue import LoaderGlue
from torchrecord._read.ipc import bundled, for_parent, slot_room
from torchrecord._read.items import Items
from torchrecord._read.options import CHECKERS, check_options, check_world, integer, integer_below
from torchrecord._read.state import POSITION_KIND, STATE_VERSION, Start, StateCheck
from torchrecord._store.checked import Check
from torchrecord.errors import (
    IgnoredOptionWarning,
    LoaderMismatchError,
    ResumeStateError,
)

__all__ = ["Reader", "ReaderDataset", "current_worker", "in_worker"]

#: the shared resume token: a loaded resume point not yet used by any pass, or used by none any more
_FRESH, _SPENT = -1, -2


def in_worker() -> bool:
    """Is this process a DataLoader worker?"""
    return get_worker_info() is not None


def current_worker() -> tuple[int, int]:
    """(worker, number of workers) of this process: its DataLoader worker, or (0, 1) outside one."""
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


class _Pass(NamedTuple):
    """The pass this process is playing: its epoch, the part it plays, where it started from and its rotation."""

    epoch: int
    reader: Reader
    base: Mapping[str, Any] | None
    rotate: int


class ReaderDataset(LoaderGlue, IterableDataset[Any]):
    """The base of the streaming datasets: one reader contract (see the module docstring).

    A subclass calls :meth:`_init_reader` from ``__init__`` with its
    ``locals()`` (the shared options become attributes of the same names), sets :attr:`STATE_KIND`,
    and implements :meth:`_set_id`, :meth:`_where`, :meth:`_per_rank`,
    :meth:`_plan_keys`, :meth:`_epoch_plan` and :meth:`_read`.
    """

    #: The ``kind`` of this dataset's states.
    STATE_KIND: ClassVar[str] = ""
    #: What each key of :meth:`_plan_keys` is, for the message that refuses a state saved with another value.
    PLAN_KEYS: ClassVar[Mapping[str, str]] = {}
    #: What the plan keys of every reader of a SharePlan are (:meth:`_share_plan_keys`).
    SHARE_PLAN_KEYS: ClassVar[Mapping[str, str]] = {
        "seed": "its seed",
        "shuffle": "its shuffle",
        "window": "its shuffle window (shuffle_buffer, batch_size)",
        "block_size": "its block size",
        "drop_last": "its drop_last",
        "batch_size": "its batch_size",
        "loader_batch_size": "its loader_batch_size",
    }
    #: What to do when a state's plan differs from this dataset's.
    RESUME_ADVICE: ClassVar[str] = "resume with the same settings"

    # the shared options (each dataset sets those it takes, through _init_reader)
    batch_size: int | None = None
    loader_batch_size: int | None = None
    drop_last: bool = False
    shuffle: bool = True
    shuffle_buffer: int
    block_size: int | None = None
    seed: int = 0
    transform: Callable[[Any], Any] | None = None
    batch_transform: Callable[[Any], Any] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    check: Check | None = None
    _epoch: torch.Tensor
    _explicit: tuple[int, int] | None
    _distributed: tuple[int, int]
    #: batches per handover in a DataLoader worker (``RecordLoader`` sets it in its workers' copies)
    _bundle: int = 1
    #: per-sample mode: samples read at a time, the loader's batch size when a ``RecordLoader`` knows it
    #: (None: the reader's own rule). It only cuts the reading, never the order.
    _sample_chunk: int | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.STATE_KIND:
            _state.STATE_KINDS.add(cls.STATE_KIND)

    def _init_reader(self, given: Mapping[str, Any], *, batch_required: bool = False) -> None:
        """Check the shared options among ``given`` (a constructor's ``locals()``) and keep them as attributes
        (:data:`~torchrecord._read.options.CHECKERS` names them); set up the epoch, the world and the state."""
        options = {name: value for name, value in given.items() if name in CHECKERS}
        for name, value in check_options(options, batch_required=batch_required).items():
            setattr(self, name, value)
        self._explicit = check_world(given.get("rank"), given.get("world_size"))
        self._distributed = self._detect_distributed()
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        # a loaded resume point, and which pass used it (shared: the workers of one pass use it, no later pass)
        self._resume: dict[str, Any] | None = None
        self._resume_token = torch.full((), _FRESH, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._loaded: dict[str, Any] | None = None  # the last resume point loaded here (position_after's base)
        self._pass: _Pass | None = None
        self._yielded = 0  # items this process's pass yielded
        alone = self._explicit is None and not (dist.is_available() and dist.is_initialized())
        if options.get("drop_last") and options.get("batch_size") is None and alone:
            warnings.warn(
                "drop_last=True in per-sample mode only cuts the samples that do not divide over the ranks; on one "
                "rank it changes nothing. To drop a short last batch, give drop_last=True to the DataLoader",
                IgnoredOptionWarning,
                stacklevel=3,
            )

    # -- epoch and world ---------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration plays (persistent workers see it too)."""
        self._epoch.fill_(integer_below("epoch", epoch, _state.MAX_EPOCH))
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
        if not in_worker():
            self._distributed = self._detect_distributed()

    def reader(self) -> Reader:
        """Who reads in this process: rank and world size (refreshed in the main process), worker and workers."""
        self._refresh_distributed()
        worker, num_workers = current_worker()
        rank, world_size = self._distributed
        return Reader(rank, world_size, worker, num_workers)

    # -- what a subclass says about itself ---------------------------------------------
    def _set_id(self) -> str:
        """The identity of what this dataset reads (the ``set_id`` of its states)."""
        raise NotImplementedError

    def _where(self) -> str:
        """What this dataset reads, for messages (a path)."""
        raise NotImplementedError

    def _per_rank(self) -> int:
        """Samples this rank yields per epoch (after padding or cutting for the ranks)."""
        raise NotImplementedError

    def _plan_keys(self) -> dict[str, Any]:
        """The settings that decide this dataset's order (plain values): the ``plan`` of its states."""
        raise NotImplementedError

    def _epoch_plan(self) -> EpochPlan:
        """This epoch's plan over every reader (pure; see ``torchrecord._order.plan``)."""
        raise NotImplementedError

    def _read(self, start: Start, part: Part) -> Iterator[Any]:
        """The items of ``part`` from item ``start.yielded`` on (``start.progress``: the reader's own record)."""
        raise NotImplementedError

    def _progress(self) -> Any:
        """What this process's pass records beside the items it yielded (None for most readers)."""
        return None

    def _progress_problem(self, progress: Any, part: Part) -> str | None:
        """Why a saved ``progress`` cannot belong to a reader of ``part``, or None."""
        return "this dataset keeps no progress beside the items yielded"

    def _count_problem(self) -> str | None:
        """Why a count of handed-out items does not give this reader's position (``position_after``), or None."""
        return None

    def _pass_over(self) -> None:
        """Called when a pass ends or its iterator is dropped (a reader lets its files go here)."""

    def _batch_bytes(self) -> int | None:
        """The bytes of one item in batch mode (or of one sample), when the reader knows them (bundles)."""
        return None

    # -- what the readers build from their options ------------------------------------------------
    def _share_plan(self, count: int, block_size: int, window: int, bounds: Any = None) -> SharePlan:
        """This epoch's plan of a reader of ``count`` positions in shuffled windows, with this dataset's options."""
        return SharePlan(
            count=count,
            block_size=block_size,
            window=window,
            seed=int(self.seed),
            epoch=self.epoch,
            shuffle=bool(self.shuffle),
            drop_last=bool(self.drop_last),
            batch_size=self.batch_size,
            loader_batch_size=self.loader_batch_size,
            bounds=None if bounds is None else tuple(int(b) for b in bounds),
        )

    @staticmethod
    def _share_plan_keys(plan: SharePlan) -> dict[str, Any]:
        """The state's ``plan`` keys every reader of a :class:`SharePlan` has (it adds what counts its positions)."""
        return {key: getattr(plan, key) for key in ReaderDataset.SHARE_PLAN_KEYS}

    def _items(self, where: str, schema: Schema | None, sample_chunk: int | None = None) -> Items:
        """How this dataset turns what it read into its items, with its transform, collation and batch options."""
        options = {name: getattr(self, name) for name in Items.OPTIONS}
        return Items(where, schema, room=self._stack_room(), sample_chunk=sample_chunk, **options)

    # -- iteration ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self.batch_size is not None and _glue.loader_batches_again():
            raise LoaderMismatchError(
                f"{self._where()}: the dataset yields whole batches (batch_size={self.batch_size}) and the "
                "DataLoader batches them again: use DataLoader(ds, batch_size=None)"
            )
        start = self._start(self.reader())
        part = self._epoch_plan().reader_part(start.reader, start.base)
        self._pass = _Pass(self.epoch, start.reader, start.base, self._rotate)
        self._yielded = start.yielded
        return self._handed_over(self._counted(self._read(start, part), self._fused_now() is not None))

    def _counted(self, items: Iterator[Any], weighed: bool = False) -> Iterator[Any]:
        """Count each item before it is yielded, so state_dict() always says what was handed out.

        ``weighed`` (fused per-sample mode): items come as ``(batch, samples in it)`` and count their samples.
        """
        try:
            for item in items:
                if weighed:
                    item, samples = item
                    self._yielded += samples
                else:
                    self._yielded += 1
                yield item
        finally:
            self._pass_over()

    # -- per-sample mode read as whole loader batches (RecordLoader's fast path) ------------------
    #: set by :class:`~torchrecord.RecordLoader` while its iterator starts (so only its own iteration sees it,
    #: in this process and in the workers it starts): read per-sample mode as whole loader batches of this
    #: many samples, each what collating that batch's samples gives. Positions still count samples.
    _fused: int | None = None

    #: set by :class:`~torchrecord.RecordLoader` in batch mode while its iterator starts (as :attr:`_fused`):
    #: what each batch goes through before it is handed out (the loader's ``collate_fn``, by default
    #: :func:`~torchrecord._read.handout.as_tensors`), in the process that makes the batch, so that a bundle's
    #: batches get it too
    _convert: Callable[[Any], Any] | None = None

    def _fusable(self) -> bool:
        """Can per-sample mode be read as whole batches equal to ``torchrecord.collate`` of its samples?

        A reader that can says so (``RecordDataset`` without a per-sample transform) and, while
        :meth:`_fused_now` says a size, its ``_read`` yields ``(batch, samples in it)``.
        """
        return False

    def _fused_now(self) -> int | None:
        """The loader batch size this pass reads whole batches of in per-sample mode (None: as usual)."""
        return self._fused if self.batch_size is None and self._fusable() else None

    def _batches_out(self) -> bool:
        """Does this pass hand out batches (batch mode, or fused per-sample mode) in a DataLoader worker?"""
        return (self.batch_size is not None or self._fused_now() is not None) and in_worker()

    _rotate = 0  # the rotation of the pass being started (see _start)

    def _start(self, who: Reader) -> Start:
        """Where this process's pass starts: a fresh epoch, or the loaded resume point (used by one pass only)."""
        self._rotate = 0
        resume = self._take_resume()
        if resume is None or int(resume["epoch"]) != self.epoch:
            return Start(who)
        world, workers = int(resume["world_size"]), int(resume["num_workers"])
        rotate = int(resume["rotate"])
        role = (who.worker + rotate) % who.num_workers
        if resume["kind"] != POSITION_KIND:
            if (world, workers, resume["rank"], resume["worker"]) != (who.world_size, who.num_workers, who.rank, role):
                raise ResumeStateError(
                    f"{self._where()}: this state belongs to rank {resume['rank']} worker {resume['worker']} of "
                    f"{world} ranks x {workers} workers, not to rank {who.rank} worker {who.worker} of "
                    f"{who.world_size} x {who.num_workers}: merge the states of every reader with "
                    "torchrecord.loader_position(...) and load that position instead"
                )
            self._rotate = rotate
            reader = Reader(who.rank, world, role, workers)
            return Start(reader, int(resume["yielded"]), resume["base"], resume.get("progress"))
        if (world, workers) == (who.world_size, who.num_workers):
            self._rotate = rotate
            row = next(row for row in resume["readers"] if (row[0], row[1]) == (who.rank, role))
            reader = Reader(who.rank, world, role, workers)
            return Start(reader, int(row[2]), resume["base"], row[3] if len(row) > 3 else None)
        return Start(who, 0, resume)  # another world: this reader's part of what the position left

    def _take_resume(self) -> dict[str, Any] | None:
        """The loaded resume point if this pass is the one that uses it (every process holding the dataset).

        The workers of the pass that first meets it use it (a pass is told by its DataLoader's base seed,
        shared by its workers); the main process uses it when it iterates first. Any later pass, in any
        process, starts afresh: the token in shared memory says the point was used.
        """
        resume, self._resume = self._resume, None
        if resume is None:
            return None
        token = int(self._resume_token.item())
        info = get_worker_info()
        if info is None:
            self._resume_token.fill_(_SPENT)
            return resume if token == _FRESH else None
        key = (info.seed - info.id) & 0x3FFFFFFFFFFFFFFF
        if token == _FRESH:
            self._resume_token.fill_(key)
            return resume
        return resume if token == key else None

    def _handed_over(self, items: Iterator[Any]) -> Iterator[Any]:
        """``items`` as they leave this process: in a DataLoader worker in batch mode, each batch through the
        one handover (:func:`torchrecord._read.ipc.for_parent`), or :attr:`_bundle` batches at a time
        (:func:`torchrecord._read.ipc.bundled`); samples and the main process's items as they are. In batch mode
        under a ``RecordLoader``, each batch goes through its :attr:`_convert` first.
        """
        convert = self._convert
        if convert is not None and self.batch_size is not None:
            items = map(convert, items)
        if not self._batches_out():
            return items
        if self._bundle > 1:
            return bundled(items, self._bundle)
        return (for_parent(item) for item in items)

    def _stack_room(self) -> Room | None:
        """Where this reader builds the batches it collates: in a DataLoader worker in batch mode, straight in
        the slot each leaves in when it crosses in one (:func:`torchrecord._read.ipc.slot_room`); else None."""
        return slot_room if self._batches_out() else None

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This reader's resume point: small, plain and JSON-serialisable (one layout for every reader).

        torchdata's ``StatefulDataLoader`` calls it on each worker's copy after
        every batch; with ``num_workers=0`` on this object. It holds the set's
        ``set_id``, the epoch, who this reader is, the settings that decide the
        order (``plan``) and how many items (samples, or batches in batch mode) it
        yielded this epoch. See ``torchrecord._read.state`` for every key.
        """
        now = self._pass
        if now is None:
            now = _Pass(self.epoch, self.reader(), None, 0)
        reader = now.reader
        state: dict[str, Any] = {
            "kind": self.STATE_KIND,
            "version": STATE_VERSION,
            "set_id": self._set_id(),
            "epoch": now.epoch,
            "rank": reader.rank,
            "world_size": reader.world_size,
            "worker": reader.worker,
            "num_workers": reader.num_workers,
            "rotate": now.rotate,
            "plan": self._plan_keys(),
            "base": now.base,
            "yielded": self._yielded if self._pass is not None else 0,
        }
        progress = self._progress() if self._pass is not None else None
        if progress is not None:
            state["progress"] = progress
        return state

    def load_state_dict(self, state: Any) -> None:
        """Resume the current epoch from a state or a position; the next iteration starts there.

        ``state`` is what :meth:`state_dict` returned (same ranks, workers and
        settings: exactly the rest of the epoch, in the same order), a position
        from :meth:`position_after` or :func:`torchrecord.loader_position` (any
        world size and number of workers: every item not yet yielded, exactly once
        over the new readers), or any nesting of these (the states of every worker
        are merged into a position). Call :meth:`set_epoch` with the saved epoch
        first. The resume point is used by one pass (in every process that holds
        the dataset, with any number of workers, persistent or not) and then
        dropped.

        Raises:
            ResumeStateError: a state of another dataset kind or record set, of a
                later epoch, of another state version, with other settings, or
                with any field that does not fit this dataset (it names the field).
                A state of an earlier epoch is ignored with a warning.
        """
        self._refresh_distributed()
        found = list(_state.find_states(state, {self.STATE_KIND, POSITION_KIND}))
        found = [s for s in found if _state.reader_kind(s) == self.STATE_KIND]
        if not found:
            raise ResumeStateError(
                f"{self._where()}: no {self.STATE_KIND} state found in what was given (its states and positions "
                f"have kind {self.STATE_KIND!r} or {POSITION_KIND!r}); pass what this dataset's state_dict(), "
                "position_after() or torchrecord.loader_position(...) returned"
            )
        one = found[0] if len(found) == 1 else _state.loader_position(found)
        accepted = self._state_check().accept(one)
        self._resume = self._loaded = accepted
        self._resume_token.fill_(_FRESH)

    def _state_check(self) -> StateCheck:
        """What a state must match to resume this dataset (the one table of ``torchrecord._read.state``)."""
        return StateCheck(
            kind=self.STATE_KIND,
            where=self._where(),
            set_id=self._set_id(),
            epoch=self.epoch,
            plan=self._plan_keys(),
            epoch_plan=self._epoch_plan(),
            describe=self.PLAN_KEYS,
            progress=self._progress_problem,
            advice=self.RESUME_ADVICE,
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
        leave it out in batch mode. After a resume on another world the count
        goes on from the resumed point (the loaded position is the base).

        Raises:
            ArgumentError: per-sample mode with no ``loader_batch_size`` here nor
                on the dataset (``batches`` could not be turned into samples), one
                that differs from the dataset's, or one given in batch mode.
            ResumeStateError: a reader whose position is more than a count
                (``MixedDataset(policy="ready")``).
        """
        self._refresh_distributed()
        problem = self._count_problem()
        if problem:
            raise ResumeStateError(f"{self._where()}: {problem}")
        size = self._loader_batch(batches, loader_batch_size)
        integer("batches", batches, 0, none=False)
        integer("num_workers", num_workers, 0, none=False)
        rank, world = self._distributed
        readers = max(1, num_workers)
        base = self._base_for(world, readers)
        plan = self._epoch_plan()
        parts = [plan.reader_part(Reader(rank, world, w, readers), base) for w in range(readers)]
        if size is None:
            per_worker = [plan.items(part) for part in parts]
        else:
            per_worker = [-(-part.size // size) for part in parts]
        taken, next_worker = _state.rounds_consumed(per_worker, batches)
        if size is not None:  # samples, not past a worker's part
            taken = [min(t * size, part.size) for t, part in zip(taken, parts)]
        return {
            "kind": POSITION_KIND,
            "version": STATE_VERSION,
            "reader": self.STATE_KIND,
            "set_id": self._set_id(),
            "epoch": self.epoch,
            "world_size": world,
            "num_workers": readers,
            # a new DataLoader starts its rotation at worker 0: worker j takes the part of worker
            # (next + j) mod n, so the rotation goes on where it stopped and the order is unchanged
            "rotate": next_worker,
            "plan": self._plan_keys(),
            "base": base,
            "readers": [[rank, w, t] for w, t in enumerate(taken)],
        }

    def _base_for(self, world: int, num_workers: int) -> Mapping[str, Any] | None:
        """The base position a pass of this epoch on ``world`` x ``num_workers`` readers plays under."""
        loaded = self._loaded
        if loaded is None or int(loaded["epoch"]) != self.epoch:
            return None
        same = (int(loaded["world_size"]), int(loaded["num_workers"])) == (world, num_workers)
        if loaded["kind"] == POSITION_KIND and not same:
            return loaded
        base: Mapping[str, Any] | None = loaded["base"]
        return base

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pass"] = None  # a pass stays in the process that plays it
        state["_yielded"] = 0
        return state
