"""The reader contract, checked the same way for every dataset class (issue 26).

A :class:`Case` describes one reader: how to make it, how to tell its samples
apart, what one epoch holds, and which modes it has. Each ``check_*`` function
checks one part of the contract and can be used alone; :func:`check_reader_contract`
runs them all and reports every part that fails.

The parts (after torchdata's ``run_test_save_load_state``, for datasets):

1. :func:`check_exactly_once`: one epoch over ranks x DataLoader workers is the
   case's epoch (every sample once, plus the repeats a rank padding documents),
   and every rank yields as many items.
2. :func:`check_set_epoch`: ``set_epoch`` reaches persistent workers: epochs 0 and
   1 differ in order, not in content, and epoch 1 through persistent workers is
   epoch 1 read by a new loader.
3. :func:`check_state_round_trip`: ``state_dict()`` taken after k items (0, 1, a
   seeded random k and the last) and loaded into a fresh reader gives exactly the
   rest of the epoch, in order (in the process, through JSON, with 0 workers and
   with torchdata's ``StatefulDataLoader`` over 2 workers); the resume point is used
   once; and :func:`check_state_in_another_process` resumes from a JSON state in a
   spawned process and gets the same rest.
4. :func:`check_len_loader`: ``len(loader)`` is the number of batches the loader
   yields, in batch mode (``DataLoader(batch_size=None)``) and in per-sample mode
   (``DataLoader(batch_size=B)``, with ``loader_batch_size=B`` where the reader
   takes it), with 0 and 2 workers, for batch sizes that do and do not divide
   the epoch.
5. :func:`check_pickling`: a fresh reader and one that has been iterated (and one
   in the middle of an epoch) pickle without an LMDB handle, and the copy plays
   the same epoch.
6. :func:`check_refuses_breaking_loader`: a DataLoader that would break the
   reader's order or count (one that batches the batches again, one that
   delivers out of order with ``in_order=False``, one whose ``len()`` is not what
   it yields) is refused with the reader's documented error (``ValueError``, or a
   ``TorchRecordError``) by ``check_loader`` or when it runs, rather than
   silently yielding something else.
7. :func:`check_record_loader`: ``torchrecord.RecordLoader`` with 2 workers (bundles
   on) yields exactly what a plain DataLoader with 2 workers yields, in order, and
   ``len()`` of it.
8. :func:`check_elastic_resume`: a ``RecordLoader`` state taken mid-epoch on 2
   workers (through JSON), resumed on 3 workers and on 0: what was played plus the
   rest is the epoch, every item once; a state taken mid-way through that resumed
   pass, resumed again on 2 workers, still gives every item once; and
   ``loader_position`` turns a torchdata ``StatefulDataLoader``'s state (each
   worker's dataset state) into a position that resumes on 0 workers the same way.

Per-sample mode is read through ``DataLoader(batch_size=case.batch_size)`` (the
way it is used), telling the reader with ``loader_batch_size=`` where its class
takes that parameter; batch mode through ``DataLoader(batch_size=None)``.
Workers are forked; the one spawned process is the state check's.

Only the public API is used: the constructor (through ``case.make``),
``set_epoch``, ``state_dict``/``load_state_dict``, ``len``, ``check_loader``,
iteration, and torch's (or torchdata's) DataLoader.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import multiprocessing
import pickle
import pickletools
import random
import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from torch.utils.data import DataLoader

from tests.helpers import assert_exactly_once
from torchrecord import RecordLoader, loader_position
from torchrecord.errors import TorchRecordError

__all__ = [
    "BATCH",
    "CHECKS",
    "SAMPLE",
    "Case",
    "Epoch",
    "check_exactly_once",
    "check_len_loader",
    "check_pickling",
    "check_reader_contract",
    "check_elastic_resume",
    "check_record_loader",
    "check_refuses_breaking_loader",
    "check_set_epoch",
    "check_state_in_another_process",
    "check_state_round_trip",
    "spawn_pool",
]

#: The two modes: the reader yields samples (the DataLoader may batch them), or whole batches.
SAMPLE = "sample"
BATCH = "batch"
#: The errors a reader refuses a loader with: its documented ValueError, or the library's own errors.
REFUSALS = (ValueError, TorchRecordError)
#: Worker processes are forked (cheap); the one spawned process is :func:`check_state_in_another_process`.
CONTEXT = "fork"


@dataclass(frozen=True)
class Epoch:
    """What one epoch over all ranks holds: every identity in ``ids`` once, plus ``pad`` repeats of some of them."""

    ids: Sequence[Hashable]
    pad: int = 0


@dataclass(frozen=True)
class Case:
    """One reader under the contract.

    Attributes:
        name: for messages.
        make: ``make(**overrides) -> reader``: module level (or a ``functools.partial`` of a
            module-level function) so that it pickles into a spawned process. Overrides used:
            ``batch_size`` (``None`` for per-sample mode), ``rank``/``world_size`` (when
            ``distributed``), ``loader_batch_size`` (where the reader's class takes it).
        identity: the identities of the samples in one yielded item, in order (one for a
            sample, one per valid sample of a batch); module level for the same reason.
        epoch: ``epoch(world_size) -> Epoch``: what one epoch over that many ranks holds,
            from the reader's documented epoch (padding included).
        modes: ``SAMPLE`` and/or ``BATCH``.
        batch_size: the batch size of batch mode, and the DataLoader's in per-sample mode.
        dataloader: the reader is an IterableDataset for ``DataLoader`` (workers, ranks);
            ``False`` for in-process iterators, which are iterated directly.
        distributed: the reader takes ``rank=`` and ``world_size=``.
        len_sizes: batch sizes :func:`check_len_loader` tries (some should not divide the epoch).
        seed: seeds the random stop points of :func:`check_state_round_trip`.
    """

    name: str
    make: Callable[..., Any]
    identity: Callable[[Any], list[Hashable]]
    epoch: Callable[[int], Epoch]
    modes: tuple[str, ...] = (SAMPLE, BATCH)
    batch_size: int = 8
    dataloader: bool = True
    distributed: bool = True
    len_sizes: tuple[int, ...] = (7, 8, 13)
    seed: int = 0

    def overrides(self, mode: str, *, rank: int = 0, world_size: int = 1, **overrides: Any) -> dict[str, Any]:
        """What :meth:`reader` passes to ``make``.

        ``batch_size`` by mode, ``rank``/``world_size`` where the reader is distributed, and
        in per-sample mode ``loader_batch_size=batch_size`` where the reader's class takes it
        (the DataLoader batches ``batch_size`` samples there: see :func:`loader`).
        """
        if mode not in self.modes:
            raise ValueError(f"{self.name} has no {mode} mode (modes: {self.modes})")
        overrides.setdefault("batch_size", self.batch_size if mode == BATCH else None)
        if self.distributed:
            overrides.update(rank=rank, world_size=world_size)
        elif world_size != 1:
            raise ValueError(f"{self.name} is not distributed")
        if mode == SAMPLE and "loader_batch_size" not in overrides and _takes_loader_batch_size(self):
            overrides["loader_batch_size"] = self.batch_size
        return overrides

    def reader(self, mode: str, *, rank: int = 0, world_size: int = 1, **overrides: Any) -> Any:
        """A fresh reader in ``mode`` (see :meth:`overrides`)."""
        return self.make(**self.overrides(mode, rank=rank, world_size=world_size, **overrides))


@functools.cache
def _takes_loader_batch_size(case: Case) -> bool:
    """Whether the class of the case's per-sample reader has a ``loader_batch_size`` parameter."""
    overrides: dict[str, Any] = {"batch_size": None}
    if case.distributed:
        overrides.update(rank=0, world_size=1)
    return _takes(case.make(**overrides), "loader_batch_size")


def _takes(reader: Any, parameter: str) -> bool:
    return parameter in inspect.signature(type(reader)).parameters


# -- reading -------------------------------------------------------------------------------------


def loader(case: Case, reader: Any, mode: str, *, num_workers: int = 0, stateful: bool = False, **kwargs: Any) -> Any:
    """What iterates ``reader``: a DataLoader, or the reader itself for an in-process iterator.

    The DataLoader's ``batch_size`` (unless given): None in batch mode (the reader
    batches), ``case.batch_size`` in per-sample mode. ``stateful``: torchdata's
    ``StatefulDataLoader``.
    """
    if not case.dataloader:
        if num_workers or stateful or kwargs:
            raise ValueError(f"{case.name} is iterated in the process, without a DataLoader")
        return reader
    kwargs.setdefault("batch_size", case.batch_size if mode == SAMPLE else None)
    if num_workers:
        kwargs.setdefault("multiprocessing_context", CONTEXT)
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(reader, num_workers=num_workers, **kwargs)
    return DataLoader(reader, num_workers=num_workers, **kwargs)


def items(case: Case, iterable: Iterable[Any]) -> list[list[Hashable]]:
    """The identities of every item ``iterable`` yields, item by item."""
    return [list(case.identity(item)) for item in iterable]


def flat(order: Iterable[Sequence[Hashable]]) -> list[Hashable]:
    return [x for item in order for x in item]


def assert_epoch(seen: Sequence[Hashable], epoch: Epoch, where: str) -> None:
    """``seen`` holds every identity of ``epoch`` once, nothing else, and exactly ``epoch.pad`` repeats."""
    index = {x: i for i, x in enumerate(epoch.ids)}
    assert len(index) == len(epoch.ids), f"{where}: the case's epoch names an identity twice"
    unknown = [x for x in seen if x not in index]
    assert not unknown, f"{where}: {len(unknown)} items that are not in the epoch, e.g. {unknown[:3]}"
    try:
        assert_exactly_once([index[x] for x in seen], len(index), pad=epoch.pad)
    except AssertionError as e:
        raise AssertionError(f"{where}: {e}") from None


def _ranks(case: Case) -> tuple[int, ...]:
    return (1, 2) if case.distributed else (1,)


def _workers(case: Case) -> tuple[int, ...]:
    return (0, 2) if case.dataloader else (0,)


# -- 1. exactly once -----------------------------------------------------------------------------


def check_exactly_once(case: Case) -> None:
    """Every mode, 1 and 2 ranks, 0 and 2 workers: the union of one epoch over the ranks is ``case.epoch``."""
    for mode in case.modes:
        for world_size in _ranks(case):
            expected = case.epoch(world_size)
            for num_workers in _workers(case):
                where = f"{case.name} {mode} mode, {world_size} ranks x {num_workers} workers"
                seen: list[Hashable] = []
                per_rank = []
                for rank in range(world_size):
                    reader = case.reader(mode, rank=rank, world_size=world_size)
                    reader.set_epoch(1)
                    got = items(case, loader(case, reader, mode, num_workers=num_workers))
                    per_rank.append(len(got))
                    seen += flat(got)
                assert len(set(per_rank)) == 1, f"{where}: ranks yield different numbers of items {per_rank}"
                assert_epoch(seen, expected, where)


# -- 2. set_epoch ----------------------------------------------------------------------------------


def check_set_epoch(case: Case) -> None:
    """Epochs 0 and 1 through one persistent loader: same samples, another order, and epoch 1 as a new loader reads it.

    In-process iterators: the same without workers, and iterating again without
    ``set_epoch`` repeats the epoch.
    """
    mode = case.modes[-1]
    num_workers = 2 if case.dataloader else 0
    persistent = {"persistent_workers": True} if case.dataloader else {}
    reader = case.reader(mode)
    run = loader(case, reader, mode, num_workers=num_workers, **persistent)
    reader.set_epoch(0)
    epoch0 = items(case, run)
    reader.set_epoch(1)
    epoch1 = items(case, run)
    again = items(case, run)
    where = f"{case.name} {mode} mode, {num_workers} {'persistent ' if persistent else ''}workers"
    assert Counter(flat(epoch0)) == Counter(flat(epoch1)), f"{where}: epochs 0 and 1 hold different samples"
    assert epoch0 != epoch1, f"{where}: epoch 1 repeats epoch 0's order (set_epoch did not reach the workers)"
    assert again == epoch1, f"{where}: iterating again without set_epoch changed the order"
    fresh = case.reader(mode)
    fresh.set_epoch(1)
    assert items(case, loader(case, fresh, mode, num_workers=num_workers)) == epoch1, (
        f"{where}: epoch 1 through the persistent workers is not epoch 1 read by a new loader"
    )


# -- 3. state_dict round trips -----------------------------------------------------------------------


def stop_points(n: int, seed: int) -> list[int]:
    """0, 1 (a worker that has not yielded yet), a seeded random point, and the last item (sorted, distinct)."""
    return sorted({0, min(1, n), random.Random(seed).randint(0, n), n})


def _resumed(case: Case, mode: str, epoch: int, state: Any, num_workers: int) -> tuple[Any, Any]:
    """A fresh reader at ``epoch`` with ``state`` loaded, and what iterates it."""
    reader = case.reader(mode)
    reader.set_epoch(epoch)
    if num_workers:
        run = loader(case, reader, mode, num_workers=num_workers, stateful=True)
        run.load_state_dict(state)
    else:
        reader.load_state_dict(state)
        run = loader(case, reader, mode)
    return reader, run


def check_state_round_trip(case: Case, *, epoch: int = 1) -> None:
    """Stop after k items, ``state_dict()``, JSON, a fresh reader: exactly the rest of the epoch, in order.

    With 0 workers the reader's own ``state_dict``; with 2 workers torchdata's
    ``StatefulDataLoader`` (which calls it in each worker). The states are taken
    during one pass, which must play the reference epoch (taking a state changes
    nothing). The resume point is used once: the resumed loader's next pass plays
    the whole epoch.
    """
    for mode in case.modes:
        for num_workers in _workers(case):
            stateful = num_workers > 0
            if stateful:
                pytest.importorskip("torchdata.stateful_dataloader")
            reference_reader = case.reader(mode)
            reference_reader.set_epoch(epoch)
            reference = items(case, loader(case, reference_reader, mode, num_workers=num_workers))
            stops = stop_points(len(reference), case.seed + 7 * num_workers + (mode == BATCH))
            reader = case.reader(mode)
            reader.set_epoch(epoch)
            run = loader(case, reader, mode, num_workers=num_workers, stateful=stateful)
            states: dict[int, Any] = {}
            played: list[list[Hashable]] = []
            for item in _with_stops(run, stops, (run if stateful else reader).state_dict, states):
                played.append(list(case.identity(item)))
            where = f"{case.name} {mode} mode, {num_workers} workers"
            assert played == reference, f"{where}: taking state_dict() during the epoch changed it"
            for k in stops:
                at = f"{where}, stopped after {k} of {len(reference)} items"
                _, resumed = _resumed(case, mode, epoch, json.loads(json.dumps(states[k])), num_workers)
                rest = items(case, resumed)
                assert rest == reference[k:], (
                    f"{at}: the resumed reader yields {len(rest)} items, not the {len(reference) - k} after the "
                    f"stop in order (first difference at item {_first_difference(rest, reference[k:])} of the rest)"
                )
                if 1 < k < len(reference):
                    assert items(case, resumed) == reference, f"{at}: the resume point was used more than once"


def _with_stops(
    iterable: Iterable[Any], stops: Sequence[int], state_dict: Callable[[], Any], states: dict[int, Any]
) -> Iterator[Any]:
    """The items of ``iterable``; ``states[k] = state_dict()`` once k items were handed out, for each k in ``stops``."""

    def stop(k: int) -> None:
        states[k] = state_dict()

    k = 0
    if k in stops:
        stop(k)
    it = iter(iterable)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        yield item
        k += 1
        if k in stops:
            stop(k)


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _rest_in_child(
    make: Callable[..., Any], identity: Callable[[Any], list[Hashable]], overrides: Any, job: str
) -> Any:
    """Run in a spawned process: a fresh reader, ``set_epoch``, ``load_state_dict`` of the JSON state, the rest."""
    epoch, state = json.loads(job)
    reader = make(**overrides)
    reader.set_epoch(epoch)
    reader.load_state_dict(state)
    return [list(identity(item)) for item in reader]


def check_state_in_another_process(case: Case, *, epoch: int = 1, pool: Any = None) -> None:
    """A state taken here after a seeded random number of items, as JSON, resumed in a spawned process: the same rest.

    The reader is iterated directly (its own ``state_dict``) in batch mode (or its
    only mode). ``pool``: a ``multiprocessing`` pool of spawned processes to use
    (one is started and closed otherwise; a process costs seconds to start).
    """
    mode = case.modes[-1]
    reader = case.reader(mode)
    reader.set_epoch(epoch)
    reference = items(case, reader)
    k = random.Random(case.seed).randrange(1, max(2, len(reference)))
    reader = case.reader(mode)
    reader.set_epoch(epoch)
    it = iter(reader)
    for _ in range(k):
        next(it)
    job = json.dumps([epoch, reader.state_dict()])
    del it
    here = items(case, _resumed(case, mode, epoch, json.loads(job)[1], 0)[1])
    assert here == reference[k:], f"{case.name}: the rest after {k} items here is not the reference's rest"
    args = (case.make, case.identity, case.overrides(mode), job)
    if pool is None:
        with spawn_pool() as own:
            rest = own.apply(_rest_in_child, args)
    else:
        rest = pool.apply(_rest_in_child, args)
    assert rest == here, (
        f"{case.name} {mode} mode: resumed after {k} items in another process, it yields {len(rest)} items, "
        f"here {len(here)} (first difference at item {_first_difference(rest, here)})"
    )


def spawn_pool() -> Any:
    """One spawned process for :func:`check_state_in_another_process` (a context manager; share it between cases)."""
    return multiprocessing.get_context("spawn").Pool(1)


# -- 4. len(loader) ------------------------------------------------------------------------------------


def check_len_loader(case: Case) -> None:
    """``len(loader)`` is the number of batches it yields, in both modes, with 0 and 2 workers, for several sizes.

    Batch mode: ``make(batch_size=B)`` in ``DataLoader(batch_size=None)``. Per-sample
    mode: ``make(batch_size=None)`` in ``DataLoader(batch_size=B)``, with
    ``loader_batch_size=B`` where the reader's class takes it. Where the reader
    has ``check_loader``, it returns that count too.
    """
    problems = []
    for mode in case.modes:
        for size in case.len_sizes:
            for num_workers in _workers(case):
                if mode == BATCH:
                    reader = case.reader(mode, batch_size=size)
                    run = loader(case, reader, mode, num_workers=num_workers)
                else:
                    extra = {"loader_batch_size": size} if _takes_loader_batch_size(case) else {}
                    reader = case.reader(mode, **extra)
                    run = loader(case, reader, mode, num_workers=num_workers, batch_size=size)
                promised = len(run)
                yielded = sum(1 for _ in run)
                where = f"{mode} mode, batch size {size}, {num_workers} workers"
                if promised != yielded:
                    problems.append(f"{where}: len {promised}, yields {yielded}")
                elif case.dataloader and hasattr(reader, "check_loader"):
                    checked = reader.check_loader(run)
                    if checked is not None and checked != yielded:
                        problems.append(f"{where}: check_loader says {checked}, the loader yields {yielded}")
    assert not problems, f"{case.name}: len(loader) is not what the loader yields: " + "; ".join(problems)


# -- 5. pickling ----------------------------------------------------------------------------------------


def _globals_in(data: bytes) -> set[str]:
    """The modules of the classes and functions a pickle refers to."""
    names: set[str] = set()
    strings: list[str] = []
    for opcode, arg, _ in pickletools.genops(data):
        if opcode.name in ("GLOBAL", "INST"):
            names.add(str(arg).split(" ")[0])
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            names.add(strings[-2])
        if isinstance(arg, str):
            strings.append(arg)
    return names


def check_pickling(case: Case) -> None:
    """Fresh, iterated and mid-epoch readers pickle without an LMDB handle, and each copy plays the same epoch."""
    for mode in case.modes:
        reader = case.reader(mode)
        reader.set_epoch(1)
        copies = {"fresh": pickle.dumps(reader)}
        reference = items(case, reader)
        copies["iterated"] = pickle.dumps(reader)
        it = iter(reader)
        next(it)
        copies["in the middle of an epoch"] = pickle.dumps(reader)
        del it
        for when, data in copies.items():
            where = f"{case.name} {mode} mode, pickled {when}"
            modules = sorted(m for m in _globals_in(data) if m == "lmdb" or m.startswith("lmdb."))
            assert not modules, f"{where}: the pickle holds {modules} objects (an open LMDB handle)"
            copy = pickle.loads(data)
            assert items(case, copy) == reference, f"{where}: the copy plays another epoch"


# -- 6. a loader that breaks the order ----------------------------------------------------------------------


def _breaking_loaders(case: Case, mode: str) -> list[tuple[str, Callable[[Any], Any]]]:
    """(description, reader -> loader) for DataLoaders that would not deliver the reader's items as they are."""
    out: list[tuple[str, Callable[[Any], Any]]] = [
        ("DataLoader(in_order=False, num_workers=2)", lambda r: loader(case, r, mode, num_workers=2, in_order=False))
    ]
    if mode == BATCH:
        out.append(("DataLoader(batch_size=4) over a batch-mode reader", lambda r: loader(case, r, mode, batch_size=4)))
    else:
        size = case.len_sizes[-1]  # not the reader's loader_batch_size, and dividing nothing
        out.append(
            (
                f"DataLoader(batch_size={size}, num_workers=2) whose len() is not what it yields",
                lambda r: loader(case, r, mode, num_workers=2, batch_size=size),
            )
        )
    return out


def check_refuses_breaking_loader(case: Case) -> None:
    """Loaders that would break the reader's order or count are refused, by ``check_loader`` or when they run.

    A per-sample loader whose ``len()`` the reader meets anyway is no breaking
    loader and is left out. "Refused" is a ``ValueError`` (the readers' documented
    error; ``TorchRecordError``\\ s for bad input derive from it) from
    ``reader.check_loader(loader)``, or from iterating the loader.
    """
    if not case.dataloader:
        return
    unrefused = []
    for mode in case.modes:
        for description, make_loader in _breaking_loaders(case, mode):
            reader = case.reader(mode)
            run = make_loader(reader)
            if "len()" in description:
                with _warnings_allowed():
                    promised = len(run)
                if sum(1 for _ in run) == promised:
                    continue  # not a breaking loader for this reader
            if _refused(reader, run):
                continue
            unrefused.append(f"{mode} mode: {description}")
    assert not unrefused, f"{case.name}: loaders that break the order were not refused: " + "; ".join(unrefused)


def _refused(reader: Any, run: Any) -> bool:
    """Whether ``reader.check_loader(run)`` or running ``run`` raises the reader's error (with a message)."""
    check = getattr(reader, "check_loader", None)
    if check is not None:
        try:
            with _warnings_allowed():
                check(run)
        except REFUSALS as e:
            assert str(e), "refused without a message"
            return True
    try:
        with _warnings_allowed():
            for _ in run:
                pass
    except REFUSALS as e:
        assert str(e), "refused without a message"
        return True
    except Exception:  # broke on something else (e.g. torch's collate): not the reader refusing it
        return False
    return False


@contextlib.contextmanager
def _warnings_allowed() -> Iterator[None]:
    """The suite turns warnings into errors; a breaking loader may warn (a warning is not a refusal)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# -- 7. RecordLoader ----------------------------------------------------------------------------------------


def record_loader(case: Case, reader: Any, mode: str, num_workers: int) -> RecordLoader:
    """``torchrecord.RecordLoader`` over ``reader`` (the DataLoader's batch size in per-sample mode)."""
    kwargs: dict[str, Any] = {"batch_size": case.batch_size} if mode == SAMPLE else {}
    if num_workers:
        kwargs["multiprocessing_context"] = CONTEXT
    return RecordLoader(reader, num_workers=num_workers, **kwargs)


def check_record_loader(case: Case, *, epoch: int = 1) -> None:
    """RecordLoader with 2 workers (bundles on) yields the plain DataLoader's items, in order, and its ``len()``."""
    if not case.dataloader:
        return
    for mode in case.modes:
        where = f"{case.name} {mode} mode, 2 workers"
        reader = case.reader(mode)
        reader.set_epoch(epoch)
        plain = items(case, loader(case, reader, mode, num_workers=2))
        reader = case.reader(mode)
        reader.set_epoch(epoch)
        run = record_loader(case, reader, mode, 2)
        got = items(case, run)
        assert got == plain, (
            f"{where}: RecordLoader yields {len(got)} items, a plain DataLoader {len(plain)} (first difference at "
            f"item {_first_difference(got, plain)})"
        )
        assert len(run) == len(got), f"{where}: len(RecordLoader) is {len(run)}, it yields {len(got)}"


# -- 8. elastic resume -------------------------------------------------------------------------------------------


def _played_then_state(run: Any, case: Case, k: int) -> tuple[list[list[Hashable]], Any]:
    """The first ``k`` items of ``run`` and its state after them (through JSON); the rest is not read."""
    played: list[list[Hashable]] = []
    it = iter(run)
    for _ in range(k):
        played.append(list(case.identity(next(it))))
    state = json.loads(json.dumps(run.state_dict()))
    del it
    return played, state


def _resumed_loader(case: Case, mode: str, epoch: int, state: Any, num_workers: int) -> RecordLoader:
    reader = case.reader(mode)
    reader.set_epoch(epoch)
    run = record_loader(case, reader, mode, num_workers)
    run.load_state_dict(state)
    return run


def check_elastic_resume(case: Case, *, epoch: int = 1) -> None:
    """A mid-epoch RecordLoader state of 2 workers resumes on 3 and on 0 workers, and again on 2: every item once.

    Also: ``loader_position`` of a torchdata ``StatefulDataLoader``'s state (2 workers) resumes the
    dataset itself (0 workers) with every item once.
    """
    if not case.dataloader:
        return
    expected = case.epoch(1)
    for mode in case.modes:
        reader = case.reader(mode)
        reader.set_epoch(epoch)
        total = sum(1 for _ in record_loader(case, reader, mode, 2))
        k = random.Random(case.seed + 11).randint(1, max(1, total - 1))
        reader = case.reader(mode)
        reader.set_epoch(epoch)
        played, state = _played_then_state(record_loader(case, reader, mode, 2), case, k)
        for workers in (3, 0):
            where = f"{case.name} {mode} mode, {k} of {total} items on 2 workers, resumed on {workers}"
            run = _resumed_loader(case, mode, epoch, state, workers)
            rest = items(case, run)
            assert_epoch(flat(played + rest), expected, where)
            assert_epoch(flat(items(case, run)), expected, f"{where}, the next pass (the resume point is used once)")
        where = f"{case.name} {mode} mode, resumed on 3 workers, stopped again, resumed on 2"
        run = _resumed_loader(case, mode, epoch, state, 3)
        n = sum(1 for _ in _resumed_loader(case, mode, epoch, state, 3))
        again, state2 = _played_then_state(run, case, n // 2)
        assert json.loads(json.dumps(loader_position(state2))) == state2["position"], f"{where}: loader_position"
        rest = items(case, _resumed_loader(case, mode, epoch, state2, 2))
        assert_epoch(flat(played + again + rest), expected, where)
        _check_stateful_position(case, mode, epoch, k, expected)


def _check_stateful_position(case: Case, mode: str, epoch: int, k: int, expected: Epoch) -> None:
    """loader_position of a StatefulDataLoader's state (2 workers) resumes the dataset alone: every item once."""
    pytest.importorskip("torchdata.stateful_dataloader")
    reader = case.reader(mode)
    reader.set_epoch(epoch)
    played, state = _played_then_state(loader(case, reader, mode, num_workers=2, stateful=True), case, k)
    position = loader_position(state)
    fresh = case.reader(mode)
    fresh.set_epoch(epoch)
    fresh.load_state_dict(json.loads(json.dumps(position)))
    rest = items(case, loader(case, fresh, mode))
    assert_epoch(flat(played + rest), expected, f"{case.name} {mode} mode: a StatefulDataLoader state's position")


# -- all of it -----------------------------------------------------------------------------------------------

#: Every check by name, in the order :func:`check_reader_contract` runs them.
CHECKS: dict[str, Callable[[Case], None]] = {
    "exactly_once": check_exactly_once,
    "set_epoch": check_set_epoch,
    "state_round_trip": check_state_round_trip,
    "state_in_another_process": check_state_in_another_process,
    "len_loader": check_len_loader,
    "pickling": check_pickling,
    "refuses_breaking_loader": check_refuses_breaking_loader,
    "record_loader": check_record_loader,
    "elastic_resume": check_elastic_resume,
}


def check_reader_contract(case: Case, checks: Iterable[str] | None = None, *, pool: Any = None) -> None:
    """Run ``checks`` (default: all of :data:`CHECKS`) on ``case``; one AssertionError names every part that fails.

    ``pool``: the spawned process of :func:`check_state_in_another_process` (see :func:`spawn_pool`).
    """
    failures = []
    for name in checks if checks is not None else CHECKS:
        try:
            if name == "state_in_another_process":
                check_state_in_another_process(case, pool=pool)
            else:
                CHECKS[name](case)
        except Exception as e:  # every failing part is reported, not only the first
            failures.append(f"[{name}] {type(e).__name__}: {e}")
    if failures:
        raise AssertionError(f"{case.name} breaks the reader contract:\n" + "\n".join(failures))
