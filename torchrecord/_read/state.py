"""Resume states: one layout for every reader, checked by one table, merged into positions.

Every streaming dataset saves the same state (``ReaderDataset.state_dict``), a
flat dict of plain values::

    kind        the dataset's state kind ("torchrecord.RecordDataset", ...)
    version     STATE_VERSION
    set_id      what it reads
    epoch       the epoch of the pass
    rank, world_size, worker, num_workers   the reader (worker: the part it plays)
    rotate      DataLoader worker j of the pass plays part (j + rotate) % num_workers
    plan        {the dataset's own settings that decide the order}
    base        the position this epoch resumed from on another world, or None
    yielded     items this reader handed out this epoch
    progress    (MixedDataset with policy="ready" only) the reader's placement

A *position* (:func:`loader_position`, ``position_after``) is every reader of a run
in one dict: ``kind`` is :data:`POSITION_KIND`, ``reader`` the state kind, the same
``set_id``, ``epoch``, ``world_size``, ``num_workers``, ``plan``, ``base`` and
``rotate``, and ``readers``: rows ``[rank, worker, yielded]`` (``[..., progress]``
where the reader keeps one). What a position leaves of the epoch follows from the
dataset's pure plan (``torchrecord._order.plan.EpochPlan.rest``).

:class:`StateCheck` checks a state or position against a dataset, every field,
through one table (``torchrecord._read.rules``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchrecord._order.plan import EpochPlan, Reader
from torchrecord._read import rules as r
from torchrecord.errors import ResumeStateError

__all__ = [
    "MAX_EPOCH",
    "POSITION_KIND",
    "STATE_KINDS",
    "STATE_VERSION",
    "Start",
    "StateCheck",
    "find_states",
    "loader_position",
    "rounds_consumed",
]

#: The layout of this version; version 1 (torchrecord before the one reader contract) is refused.
STATE_VERSION = 2
POSITION_KIND = "torchrecord.position"
#: The largest epoch a state may hold (the epoch lives in an int64).
MAX_EPOCH = (1 << 63) - 1
#: Every reader's state kind (each ``ReaderDataset`` subclass registers its own).
STATE_KINDS: set[str] = set()

#: The keys of a reader's state, and of a position.
_STATE_KEYS = ("kind", "version", "set_id", "epoch", "rank", "world_size", "worker", "num_workers", "rotate", "plan",
               "base", "yielded")  # fmt: skip
_POSITION_KEYS = ("kind", "version", "reader", "set_id", "epoch", "world_size", "num_workers", "rotate", "plan",
                  "base", "readers")  # fmt: skip


@dataclass(frozen=True)
class Start:
    """Where one reader's pass starts: the part it plays, items already yielded, the base position, its progress."""

    reader: Reader
    yielded: int = 0
    base: Mapping[str, Any] | None = None
    progress: Any = None


def find_states(obj: Any, kinds: Iterable[str] | None = None, depth: int = 0) -> Iterable[Mapping[str, Any]]:
    """Every state or position nested anywhere in ``obj`` (loader states nest them); ``kinds`` limits the kinds."""
    wanted = set(kinds) if kinds is not None else STATE_KINDS | {POSITION_KIND}
    if depth > 32:
        return
    if isinstance(obj, Mapping):
        kind = obj.get("kind")
        if isinstance(kind, str) and kind in wanted:
            yield obj
            return
        for value in obj.values():
            yield from find_states(value, wanted, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from find_states(value, wanted, depth + 1)


def reader_kind(state: Mapping[str, Any]) -> Any:
    """The reader kind of a state or a position."""
    return state.get("reader") if state.get("kind") == POSITION_KIND else state.get("kind")


def loader_position(states: Any) -> dict[str, Any]:
    """The position of a whole run, read out of data-loader states.

    Args:
        states: a torchdata ``StatefulDataLoader.state_dict()``, a list of them
            (one per rank), a dataset's ``state_dict()`` or ``position_after()``, a
            ``RecordLoader.state_dict()``, or any nesting of these, for any of
            torchrecord's streaming datasets. The states are found by their
            ``kind`` key, so the loader's own nesting does not matter.

    Returns:
        A position (a small dict of plain values) for the dataset's ``load_state_dict``
        on any world size and number of workers.

    Raises:
        ResumeStateError: no state found, states of several datasets, sets, epochs or
            settings, or a reader missing or listed twice.
    """
    found = list(find_states(states))
    if not found:
        raise ResumeStateError(
            "no torchrecord reader state found: pass the StatefulDataLoader state(s), the datasets' "
            "state_dict()s or positions of the run"
        )
    kinds = {str(reader_kind(s)) for s in found}
    if len(kinds) > 1:
        raise ResumeStateError(f"pass the states of one dataset: states of {', '.join(sorted(kinds))} were found")
    rows: list[list[Any]] = []
    for s in found:
        for key in ("rank", "worker") if s.get("kind") != POSITION_KIND else ("readers",):
            if key not in s:
                raise ResumeStateError(f"a {kinds.pop()} state has no {key!r}: pass states as they were saved")
        rows += list(s["readers"]) if s.get("kind") == POSITION_KIND else [_row(s)]
    first = found[0]
    agree = ("set_id", "epoch", "world_size", "num_workers", "plan", "base", "version")
    for s in found[1:]:
        for key in agree:
            if not r.same(s.get(key), first.get(key)):
                raise ResumeStateError(
                    f"the states disagree on {key!r} ({r.show(first.get(key))} and {r.show(s.get(key))}): pass the "
                    "states of one run, saved at one step"
                )
    rotates = {s.get("rotate", 0) for s in found}
    position = {key: first.get(key) for key in agree}
    position.update(kind=POSITION_KIND, reader=kinds.pop(), rotate=rotates.pop() if len(rotates) == 1 else 0)
    seen: set[tuple[Any, Any]] = set()
    for row in rows:
        who = (row[0], row[1])
        if who in seen:
            raise ResumeStateError(f"reader (rank {row[0]}, worker {row[1]}) is listed twice: pass each state once")
        seen.add(who)
    world, workers = first.get("world_size"), first.get("num_workers")
    if r.is_int(world) and r.is_int(workers) and world * workers <= r.MAX_READERS:
        missing = [(a, b) for a in range(world) for b in range(workers) if (a, b) not in seen]
        if missing:
            a, b = missing[0]
            raise ResumeStateError(
                f"the states of {len(missing)} reader(s) are missing (first: rank {a}, worker {b} of {world} ranks "
                f"x {workers} workers): pass the loader states of every rank"
            )
    position["readers"] = sorted(rows, key=lambda row: (row[0], row[1]))
    return {key: position[key] for key in _POSITION_KEYS}


def _row(state: Mapping[str, Any]) -> list[Any]:
    row = [state["rank"], state["worker"], state.get("yielded")]
    if state.get("progress") is not None:
        row.append(state["progress"])
    return row


def rounds_consumed(items_per_worker: Sequence[int], batches: int) -> tuple[list[int], int]:
    """Items each worker had handed out after ``batches`` batches of a plain DataLoader, and whose turn is next.

    A DataLoader over an IterableDataset takes one item from each worker in
    turn, skipping workers that are exhausted; this replays that rotation.
    """
    taken = [0] * len(items_per_worker)
    active = [w for w, n in enumerate(items_per_worker) if n > 0]
    i = 0
    for _ in range(batches):
        if not active:
            break
        w = active[i]
        taken[w] += 1
        if taken[w] == items_per_worker[w]:
            active.pop(i)
        else:
            i += 1
        if active:
            i %= len(active)
    return taken, active[i] if active else 0


@dataclass(frozen=True)
class StateCheck:
    """What a state must match to resume a dataset, and the one table every field is checked by.

    Attributes:
        kind: the dataset's state kind.
        where: the dataset, for messages (its path).
        set_id: what it reads.
        epoch: its current epoch.
        plan: its ``plan`` values; ``describe``: what each key is, for messages.
        epoch_plan: its order, to bound each reader's ``yielded``.
        progress: checks a row's progress against the reader's part (None: rows have none).
        advice: what to do when the plan differs.
    """

    kind: str
    where: str
    set_id: str
    epoch: int
    plan: Mapping[str, Any]
    epoch_plan: EpochPlan
    describe: Mapping[str, str]
    progress: Callable[[Any, Any], str | None] | None = None
    advice: str = "resume with the same settings"

    def accept(self, state: Any) -> dict[str, Any] | None:
        """``state`` checked field by field: the resume point to use, or None (a state of an earlier epoch).

        Raises:
            ResumeStateError: naming the dataset, the field, its value and why it does not fit.
        """
        if not isinstance(state, Mapping) or reader_kind(state) != self.kind:
            raise ResumeStateError(
                f"{self.where}: not a {self.kind} state or position; pass what the dataset's state_dict(), "
                "position_after() or torchrecord.loader_position(...) returned"
            )
        what = str(state.get("kind"))
        self._version(state, what)
        r.check_state(
            state,
            {"set_id": r.text, "epoch": r.integer(0, MAX_EPOCH)},
            where=self.where,
            what=what,
            every_key=False,
        )
        if state["set_id"] != self.set_id:
            raise ResumeStateError(
                f"{self.where}: the state was saved while reading another record set (set_id {state['set_id']!r}, "
                f"this one is {self.set_id!r}); resume on the set the state came from, or start the epoch afresh"
            )
        if state["epoch"] > self.epoch:
            raise ResumeStateError(
                f"{self.where}: the state was saved in epoch {state['epoch']}, but the dataset is at epoch "
                f"{self.epoch}: call set_epoch({state['epoch']}) before load_state_dict, or the resumed epoch would "
                "repeat and skip samples"
            )
        if state["epoch"] < self.epoch:
            warnings.warn(
                f"{self.where}: ignoring a state saved in epoch {state['epoch']}; the dataset is at epoch "
                f"{self.epoch}, whose iteration starts from the beginning",
                stacklevel=4,
            )
            return None
        self.check(state, 0)
        return dict(state)

    def _version(self, state: Mapping[str, Any], what: str) -> None:
        version = state.get("version")
        if not r.is_int(version) or version < 1:
            r.refuse(self.where, what, "version", version, f"must be an integer from 1 to {STATE_VERSION}")
        if version < STATE_VERSION:
            raise ResumeStateError(
                f"{self.where}: the state has version {version}, saved by an older torchrecord: since version "
                f"{STATE_VERSION} every reader saves one state layout (see the CHANGELOG), and older states cannot "
                "be resumed; start the epoch afresh"
            )
        if version > STATE_VERSION:
            raise ResumeStateError(
                f"{self.where}: the state has version {version}, this torchrecord reads states up to version "
                f"{STATE_VERSION}: upgrade torchrecord to resume from it"
            )

    def check(self, state: Mapping[str, Any], depth: int) -> None:
        """Every field of a state or position (``depth`` > 0: a base, which must be a position of this set)."""
        where = self.where
        prefix = "base." * depth
        if not isinstance(state, Mapping):
            r.refuse(where, POSITION_KIND, prefix.rstrip("."), state, f"must be None or a {POSITION_KIND} position")
        position = state.get("kind") == POSITION_KIND
        what = str(state.get("kind"))
        if depth > r.MAX_DEPTH:
            r.refuse(where, what, prefix.rstrip("."), "...", f"positions nest more than {r.MAX_DEPTH} deep")
        if depth and not position:
            r.refuse(where, what, prefix.rstrip("."), state, f"must be None or a {POSITION_KIND} position")
        table: dict[str, r.Rule] = {
            "kind": r.anything,
            "version": r.integer(STATE_VERSION, STATE_VERSION),
            "set_id": r.equal(self.set_id, "its set_id"),
            "epoch": r.integer(0, MAX_EPOCH) if not depth else r.equal(self.epoch, "its epoch"),
            "world_size": r.integer(1, r.MAX_READERS),
            "num_workers": r.integer(1, r.MAX_READERS),
            "rotate": r.integer(0),
            "plan": self._plan_rule,
            "base": r.anything,
        }
        if position:
            table.update(reader=r.equal(self.kind, "its state kind"), readers=r.anything)
        else:
            table.update(rank=r.integer(0), worker=r.integer(0), yielded=r.integer(0), progress=r.anything)
        optional = ("progress",) if not position else ()
        r.check_state(state, table, where=where, what=what, optional=optional, prefix=prefix)
        self._plan_keys(state["plan"], what, prefix)
        world, workers = int(state["world_size"]), int(state["num_workers"])
        if world * workers > r.MAX_READERS:
            r.refuse(where, what, f"{prefix}num_workers", workers, f"{world} ranks x {workers} workers are too many")
        if state["rotate"] >= workers:
            r.refuse(where, what, f"{prefix}rotate", state["rotate"], f"must be below its num_workers, {workers}")
        base = state["base"]
        if base is not None:
            self.check(base, depth + 1)
        if position:
            rows = self._rows(state["readers"], world, workers, what, prefix)
        else:
            r.check_state(
                state,
                {
                    "rank": r.integer(0, world - 1, what="the last rank of its world_size"),
                    "worker": r.integer(0, workers - 1, what="the last worker of its num_workers"),
                },
                where=where,
                what=what,
                every_key=False,
                prefix=prefix,
            )
            rows = [_row(state)]
        for row in rows:
            self._reader(row, world, workers, base, what, f"{prefix}readers" if position else f"{prefix}yielded")

    def _plan_rule(self, value: Any) -> str | None:
        return (
            None
            if isinstance(value, Mapping)
            else f"must be a dict of the dataset's settings, not {type(value).__name__}"
        )

    def _plan_keys(self, plan: Mapping[str, Any], what: str, prefix: str) -> None:
        for key in plan:
            if key not in self.plan:
                r.refuse(self.where, what, f"{prefix}plan.{key}", plan[key], f"{what} plans have no such key")
        for key, mine in self.plan.items():
            if key not in plan:
                r.refuse(self.where, what, f"{prefix}plan.{key}", None, "the key is missing")
            if not r.same(plan[key], mine):
                raise ResumeStateError(
                    f"{self.where}: the {what} state was saved with {key}={r.show(plan[key])}, this dataset has "
                    f"{r.show(mine)} ({self.describe.get(key, 'its ' + key)}): {self.advice}"
                )

    def _rows(self, rows: Any, world: int, workers: int, what: str, prefix: str) -> list[list[Any]]:
        """A position's rows: each [rank, worker, yielded] or [..., progress], every reader of the run once."""
        field = f"{prefix}readers"
        if not isinstance(rows, (list, tuple)) or not rows:
            r.refuse(self.where, what, field, rows, "must be a non-empty list of [rank, worker, yielded] rows")
        if len(rows) > world * workers:
            r.refuse(self.where, what, field, f"{len(rows)} rows", f"the run has {world * workers} readers")
        columns = (r.integer(0, world - 1), r.integer(0, workers - 1), r.integer(0))
        for row in rows:
            if not isinstance(row, (list, tuple)) or len(row) not in (3, 4):
                r.refuse(self.where, what, field, row, "a row is [rank, worker, yielded] (or [..., progress])")
            for name, rule, value in zip(("rank", "worker", "yielded"), columns, row):
                reason = rule(value)
                if reason:
                    r.refuse(self.where, what, field, row, f"{name} {r.show(value)} {reason}")
        r.check_readers(rows, world_size=world, num_workers=workers, where=self.where, what=what, field=field)
        return [list(row) for row in rows]

    def _reader(self, row: list[Any], world: int, workers: int, base: Any, what: str, field: str) -> None:
        """A reader's ``yielded`` (and progress) against its part of the epoch."""
        rank, worker, yielded = int(row[0]), int(row[1]), int(row[2])
        part = self.epoch_plan.reader_part(Reader(rank, world, worker, workers), base)
        most = self.epoch_plan.items(part)
        if yielded > most:
            r.refuse(self.where, what, field, yielded, f"reader (rank {rank}, worker {worker}) has {most} items")
        if len(row) > 3:
            problem = self.progress(row[3], part) if self.progress is not None else "this dataset keeps no progress"
            if problem:
                r.refuse(self.where, what, f"{field} progress", row[3], problem)
