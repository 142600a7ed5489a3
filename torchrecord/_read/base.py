"""ReaderDataset: what every streaming dataset shares, written once.

``RecordDataset``, ``MixedDataset``, ``StreamDataset`` and ``WindowDataset``
stand on :class:`ReaderDataset`. It owns:

* the checks of the shared options (:data:`CHECKERS`: one checker, one message
  per option, whichever dataset is given it);
* the epoch and the world: ``set_epoch`` writes the epoch to a shared-memory
  tensor, so persistent DataLoader workers see it; rank and world size are given,
  or read from ``torch.distributed`` in the main process (workers do not see the
  process group and keep what the main process saw last, the dataset reaches
  them pickled);
* who reads: :meth:`ReaderDataset.reader` gives the :class:`Reader` (rank, world
  size, DataLoader worker, number of workers) of the calling process;
* the state header every ``state_dict`` carries (kind, version, set, epoch, who
  saved it) and its checks on load (:meth:`ReaderDataset._accept_state`);
* the ``len(loader)`` glue: ``loader_batch_size`` cuts worker shares on whole
  loader batches in per-sample mode, ``len(loader)`` warns when a loader would
  yield another count, and :meth:`ReaderDataset.check_loader` checks a loader.

The order itself stays in the pure functions of ``torchrecord._order``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from torchrecord._core.kinds import Room
from torchrecord._order import partition as _partition
from torchrecord._read import glue as _glue
from torchrecord._read import resume as _resume
from torchrecord._read.ipc import bundled, for_parent, slot_room
from torchrecord._store.checked import Check, parse_check
from torchrecord.errors import ArgumentError, ArgumentTypeError, LoaderMismatchError, ResumeStateError

__all__ = ["CHECKERS", "Reader", "ReaderDataset", "check_choice", "check_options", "current_worker", "in_worker"]


@dataclass(frozen=True)
class Reader:
    """One reader of an epoch: a (rank, DataLoader worker) pair, and how many of each there are."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    @property
    def in_worker(self) -> bool:
        """Is this process a DataLoader worker?"""
        return in_worker()


def in_worker() -> bool:
    """Is this process a DataLoader worker?"""
    return get_worker_info() is not None


def current_worker() -> tuple[int, int]:
    """(worker, number of workers) of this process: its DataLoader worker, or (0, 1) outside one."""
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


# -- option checks ------------------------------------------------------------------------------
def _integer(name: str, value: Any, minimum: int, *, none: bool) -> Any:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        allowed = " or None" if none else ""
        raise ArgumentError(f"{name} must be an integer >= {minimum}{allowed}, got {value!r}")
    return int(value)


def _positive_or_none(name: str) -> Callable[[Any], Any]:
    return lambda value: _integer(name, value, 1, none=True)


def _callable_or_none(name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is not None and not callable(value):
            raise ArgumentTypeError(f"{name} must be a callable or None, got {type(value).__name__} {value!r}")
        return value

    return check


def _flag(name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, (bool, np.bool_)):
            raise ArgumentTypeError(f"{name} must be True or False, got {value!r}")
        return bool(value)

    return check


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value`` if it is one of ``choices`` (a ``Literal`` option's values), else ValueError naming them."""
    if isinstance(value, (str, type(None))) and value in choices:
        return value
    raise ArgumentError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


#: The shared options and their checker: each returns the value to keep, or raises with one message.
CHECKERS: dict[str, Callable[[Any], Any]] = {
    "batch_size": _positive_or_none("batch_size"),
    "loader_batch_size": _positive_or_none("loader_batch_size"),
    "block_size": _positive_or_none("block_size"),
    "shuffle_buffer": lambda value: _integer("shuffle_buffer", value, 0, none=False),
    "seed": lambda value: _integer("seed", value, 0, none=False),
    "shuffle": _flag("shuffle"),
    "drop_last": _flag("drop_last"),
    "transform": _callable_or_none("transform"),
    "batch_transform": _callable_or_none("batch_transform"),
    "collate_fn": _callable_or_none("collate_fn"),
    "check": parse_check,
}


def check_options(options: Mapping[str, Any], *, batch_required: bool = False) -> dict[str, Any]:
    """The shared options checked, each by its checker of :data:`CHECKERS`, and against each other.

    ``batch_required``: the dataset always builds batches (StreamDataset), so
    ``batch_size`` may not be None.
    """
    out = {name: CHECKERS[name](value) for name, value in options.items()}
    batch_size = out.get("batch_size")
    if batch_required and batch_size is None and "batch_size" in out:
        raise ArgumentError("batch_size must be an integer >= 1 (this dataset always builds batches), got None")
    if out.get("loader_batch_size") is not None and batch_size is not None:
        raise ArgumentError(
            "loader_batch_size is for per-sample mode (the DataLoader batches); with batch_size= the "
            "dataset yields whole batches: use DataLoader(ds, batch_size=None) and leave loader_batch_size out"
        )
    if out.get("collate_fn") is not None and batch_size is None:
        raise ArgumentError(
            "collate_fn is for batch mode (batch_size=...); in per-sample mode the DataLoader collates: "
            "pass it to DataLoader(ds, batch_size=..., collate_fn=...)"
        )
    return out


def _check_world(rank: int | None, world_size: int | None) -> tuple[int, int] | None:
    if (rank is None) != (world_size is None):
        raise ArgumentError("give both rank and world_size, or neither")
    if rank is None or world_size is None:
        return None
    world_size = _integer("world_size", world_size, 1, none=False)
    rank = _integer("rank", rank, 0, none=False)
    if not rank < world_size:
        raise ArgumentError(f"rank {rank} is not in [0, {world_size})")
    return rank, world_size


class ReaderDataset(IterableDataset[Any]):
    """The base of the streaming datasets: options, epoch and world, reader identity, state header, len(loader).

    A subclass calls :meth:`_init_reader` from ``__init__`` with its shared
    options (they become attributes of the same names), sets :attr:`STATE_KIND`,
    and implements :meth:`_set_id`, :meth:`_where` and :meth:`_per_rank`.
    """

    #: The ``kind`` of this dataset's states.
    STATE_KIND: ClassVar[str] = ""
    #: State keys of older versions that this one cannot resume from: old key -> its replacement.
    RETIRED_STATE_KEYS: ClassVar[Mapping[str, str]] = {}

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

    def _init_reader(
        self, rank: int | None, world_size: int | None, *, batch_required: bool = False, **options: Any
    ) -> None:
        """Check the shared ``options`` and keep them as attributes; set up the epoch and the world."""
        for name, value in check_options(options, batch_required=batch_required).items():
            setattr(self, name, value)
        self._explicit = _check_world(rank, world_size)
        self._distributed = self._detect_distributed()
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

    # -- epoch and world ---------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration plays (persistent workers see it too)."""
        self._epoch.fill_(_integer("epoch", epoch, 0, none=False))
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

    # -- len() and len(loader) ------------------------------------------------------------
    def __len__(self) -> int:
        """Items this rank yields per epoch: samples, or batches when ``batch_size`` is set."""
        self._refresh_distributed()
        per_rank = self._per_rank()
        if self.batch_size is None:
            loader = _glue.calling_loader(self)
            if loader is not None:  # len(loader): say so now if the loader will yield another count
                problem = self._loader_problem(loader)
                if problem:
                    warnings.warn(problem, UserWarning, stacklevel=3)
            return per_rank
        if self.drop_last:
            return per_rank // self.batch_size
        return -(-per_rank // self.batch_size)

    def _unit(self, num_workers: int) -> int:
        """What this rank's span is cut on among ``num_workers`` readers."""
        return _partition.worker_unit(self._per_rank(), num_workers, self.batch_size, self.loader_batch_size)

    def _loader_problem(self, loader: Any) -> str | None:
        """Why ``loader`` yields another number of batches than ``len(loader)``, or None."""
        return _glue.loader_problem(
            loader,
            path=self._where(),
            batch_size=self.batch_size,
            per_rank=self._per_rank(),
            unit_of=self._unit,
            dataset=type(self).__name__,
        )

    def check_loader(self, loader: Any) -> int:
        """The number of batches ``loader`` yields from this rank per epoch; raises when it is not ``len(loader)``.

        Use it to size schedules (``OneCycleLR(total_steps=epochs * ds.check_loader(loader))``)
        or as an assertion before training. In per-sample mode the count
        differs when the DataLoader's batch size does not divide the unit
        worker shares are cut on; the error says which ``loader_batch_size``
        fixes it. In batch mode the DataLoader must not batch again.

        Raises:
            ValueError: ``loader`` does not read this dataset, or it yields
                another number of batches than ``len(loader)``, or it would break
                this dataset's order.
        """
        if getattr(loader, "dataset", None) is not self:
            raise LoaderMismatchError(
                "check_loader: the loader does not read this dataset (loader.dataset is another object)"
            )
        if getattr(loader, "in_order", True) is False and getattr(loader, "num_workers", 0) > 0:
            raise LoaderMismatchError(
                f"{self._where()}: DataLoader(in_order=False) hands items out as workers finish them, not in "
                f"{type(self).__name__}'s order: the epoch's order and a resume would not be reproducible; "
                "use in_order=True (the default)"
            )
        self._refresh_distributed()
        problem = self._loader_problem(loader)
        if problem:
            raise LoaderMismatchError(problem)
        return len(loader)

    # -- the state header ------------------------------------------------------------------
    #: batches per handover in a DataLoader worker (``RecordLoader`` sets it in its workers' copies)
    _bundle: int = 1
    #: per-sample mode: samples read at a time, the loader's batch size when a ``RecordLoader`` knows it
    #: (None: the reader's own rule). It only cuts the reading, never the order: a batch that is one chunk
    #: is collated by ``torchrecord.collate`` without a copy.
    _sample_chunk: int | None = None

    def _stack_room(self) -> Room | None:
        """Where this reader builds the batches it collates: in a DataLoader worker in batch mode, straight in
        the slot each leaves in when it crosses in one (:func:`torchrecord._read.ipc.slot_room`), so
        :meth:`_handed_over` need not copy it; else None (fresh memory)."""
        if getattr(self, "batch_size", None) is None or not in_worker():
            return None
        return slot_room

    def _handed_over(self, items: Iterator[Any]) -> Iterator[Any]:
        """``items`` as they leave this process: in a DataLoader worker in batch mode, each batch through the
        one handover (:func:`torchrecord._read.ipc.for_parent`), or :attr:`_bundle` batches at a time
        (:func:`torchrecord._read.ipc.bundled`); samples and the main process's items as they are.
        """
        if getattr(self, "batch_size", None) is None or not in_worker():
            return items
        if self._bundle > 1:
            return bundled(items, self._bundle)
        return (for_parent(item) for item in items)

    def _state_header(self, reader: Reader, epoch: int) -> dict[str, Any]:
        """The keys every state of this dataset starts with: what, which version, which set, when, who."""
        return {
            "kind": self.STATE_KIND,
            "version": _resume.STATE_VERSION,
            "set_id": self._set_id(),
            "epoch": int(epoch),
            "rank": reader.rank,
            "world_size": reader.world_size,
            "worker": reader.worker,
            "num_workers": reader.num_workers,
        }

    def _accept_state(
        self,
        state: Any,
        *,
        kinds: tuple[str, ...] | None = None,
        subset: str | None = None,
        plan: Mapping[str, Any] | None = None,
        plan_keys: Sequence[str] = (),
        advice: str = "resume with the same settings",
    ) -> dict[str, Any] | None:
        """Check a state (or position) against this dataset: the resume point to use, or None (an earlier epoch).

        Refuses (ValueError) a state of another kind, a newer version, another
        set or subset, a later epoch, a state of an older torchrecord with a
        retired key, or one whose ``plan_keys`` differ from ``plan``.
        """
        where = self._where()
        if isinstance(state, Mapping):
            for old, new in self.RETIRED_STATE_KEYS.items():
                if old in state and new not in state:
                    raise ResumeStateError(
                        f"{where}: the state was saved by an older torchrecord (it has {old!r}, now {new!r}): "
                        "this version cannot resume from it; start the epoch afresh"
                    )
        accepted = _resume.accept(
            state,
            set_id=self._set_id(),
            epoch=self.epoch,
            path=where,
            subset=subset,
            kinds=kinds or (self.STATE_KIND,),
        )
        if accepted is not None and plan is not None:
            for key in plan_keys:
                if accepted.get(key) != plan[key]:
                    raise ResumeStateError(
                        f"{where}: the state was saved with {key}={accepted.get(key)!r}, this dataset has "
                        f"{plan[key]!r}: {advice}"
                    )
        return accepted
