"""Resume points: the small state a reader saves, and the rest of an epoch on any world size.

A reader's state (``RecordDataset.state_dict()``) is a flat dict of plain ints
and strings: which set (``set_id``), which epoch, the order settings, who the
reader is (rank, world size, worker, number of workers) and how many items it
yielded. Resuming with the same configuration starts each reader at its own
position: its share is the same, so only the window holding that position is
read again (``torchrecord._order.windows``), nothing is replayed.

A *position* (:func:`loader_position`) gathers the states of every reader of a
run. Loaded into a dataset with another world size or number of workers, it
resumes *elastically*: the samples every old reader had yielded are rebuilt from
the pure order functions (no reading), the rest of the epoch is laid out in the
epoch's block order, and split evenly over the new ranks and workers.
"""

from __future__ import annotations

import itertools
import reprlib
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, TypeGuard

import numpy as np

from torchrecord._order import partition as _partition
from torchrecord._order import windows as _order
from torchrecord.errors import ResumeStateError

__all__ = [
    "MAX_READERS",
    "POSITION_KIND",
    "STATE_KIND",
    "STATE_VERSION",
    "accept",
    "anything",
    "check_readers",
    "check_state",
    "consumed_samples",
    "equal",
    "find_states",
    "flag",
    "index_runs",
    "integer",
    "is_int",
    "one_of",
    "per_reader",
    "plan_key",
    "reader_items",
    "refuse",
    "remaining_runs",
    "rounds_consumed",
    "rows",
    "same",
    "share_runs",
    "show",
    "text",
    "worker_unit",
]

STATE_KIND = "torchrecord.RecordDataset"
POSITION_KIND = "torchrecord.position"
STATE_VERSION = 1

#: The settings that decide which samples a reader visits and in which order.
PLAN_KEYS = (
    "count",
    "seed",
    "shuffle",
    "window",
    "block_size",
    "drop_last",
    "batch_size",
    "worker_unit",
    "world_size",
    "num_workers",
    "subset",
)

Run = tuple[int, int]


def plan_key(state: Mapping[str, Any]) -> tuple[Any, ...]:
    """The order settings of a state or position, comparable with ``==``."""
    return tuple(worker_unit(state) if k == "worker_unit" else state.get(k) for k in PLAN_KEYS)


def worker_unit(plan: Mapping[str, Any]) -> int:
    """What a plan's rank spans were cut on among workers (states without the key: the batch, or 1)."""
    return int(plan.get("worker_unit") or plan.get("batch_size") or 1)


def accept(
    state: Any,
    *,
    set_id: str,
    epoch: int,
    path: str,
    subset: str | None = None,
    kinds: tuple[str, ...] = (STATE_KIND, POSITION_KIND),
) -> dict[str, Any] | None:
    """Check a state or position against this dataset; the resume point to use, or None.

    Raises ValueError (saying what to do) for another set or subset (``subset``
    is the digest of the dataset's subset, None for the whole set), a newer
    state version, a later epoch or something that is not a torchrecord state.
    A state from an earlier epoch is ignored with a warning.
    """
    if not isinstance(state, Mapping) or state.get("kind") not in kinds:
        raise ResumeStateError(
            f"{path}: not a torchrecord state of the right kind (expected kind {' or '.join(kinds)}); pass what "
            "the dataset's state_dict() or torchrecord.loader_position(...) returned"
        )
    version = state.get("version")
    if not is_int(version) or version < 1:
        refuse(path, str(state.get("kind")), "version", version, f"must be an integer from 1 to {STATE_VERSION}")
    if version > STATE_VERSION:
        raise ResumeStateError(
            f"{path}: the state has version {version!r}, this torchrecord reads states up to version "
            f"{STATE_VERSION}: upgrade torchrecord to resume from it"
        )
    if state.get("set_id") != set_id:
        raise ResumeStateError(
            f"{path}: the state was saved while reading another record set (set_id {state.get('set_id')!r}, "
            f"this one is {set_id!r}); resume on the set the state came from, or start the epoch afresh"
        )
    if state.get("subset") != subset:

        def name(digest: Any) -> str:
            return f"the subset {digest}" if digest else "the whole set"

        raise ResumeStateError(
            f"{path}: the state was saved while reading {name(state.get('subset'))}, this dataset reads "
            f"{name(subset)}; make the dataset with the subset= it was saved with to resume, or start the "
            "epoch afresh"
        )
    saved = state.get("epoch")
    if not is_int(saved) or saved < 0:
        refuse(path, str(state.get("kind")), "epoch", saved, "must be an integer >= 0 (states are never rounded)")
    if saved > epoch:
        raise ResumeStateError(
            f"{path}: the state was saved in epoch {saved}, but the dataset is at epoch {epoch}: call "
            f"set_epoch({saved}) before load_state_dict, or the resumed epoch would repeat and skip samples"
        )
    if saved < epoch:
        warnings.warn(
            f"{path}: ignoring a state saved in epoch {saved}; the dataset is at epoch {epoch}, whose "
            "iteration starts from the beginning",
            stacklevel=3,
        )
        return None
    return dict(state)


def per_reader(
    readers: Sequence[Mapping[str, Any]], agree: Sequence[str], value: str, what: str
) -> dict[tuple[int, int], Any]:
    """``(rank, worker) -> state[value]`` over the reader states of one run, every reader present.

    Raises ValueError when the states disagree on a key of ``agree`` or a reader
    of the run's ranks x workers is missing (``what`` names the readers in messages).
    """
    first = readers[0]
    for s in readers[1:]:
        for key in agree:
            if s.get(key) != first.get(key):
                raise ResumeStateError(
                    f"the {what} states disagree on {key!r} ({first.get(key)!r} and {s.get(key)!r}): "
                    "pass the states of one run, saved at one step"
                )
    found = {(int(s["rank"]), int(s["worker"])): s[value] for s in readers}
    world, workers = int(first["world_size"]), int(first["num_workers"])
    missing = [(r, w) for r in range(world) for w in range(workers) if (r, w) not in found]
    if missing:
        r, w = missing[0]
        raise ResumeStateError(
            f"the states of {len(missing)} {what}(s) are missing (first: rank {r}, worker {w} of {world} ranks x "
            f"{workers} workers): pass the loader states of every rank"
        )
    return found


def find_states(
    obj: Any, kinds: tuple[str, ...] = (STATE_KIND, POSITION_KIND), depth: int = 0
) -> Iterable[Mapping[str, Any]]:
    """Every dict of one of ``kinds`` nested anywhere in ``obj`` (loader states nest them)."""
    if depth > 32:
        return
    if isinstance(obj, Mapping):
        if obj.get("kind") in kinds:
            yield obj
            return
        for value in obj.values():
            yield from find_states(value, kinds, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from find_states(value, kinds, depth + 1)


def share_runs(plan: Mapping[str, Any], epoch: int, rank: int, worker: int, bounds: np.ndarray | None) -> list[Run]:
    return _partition.reader_runs(
        int(plan["count"]),
        block_size=int(plan["block_size"]),
        seed=int(plan["seed"]),
        epoch=epoch,
        shuffle=bool(plan["shuffle"]),
        rank=rank,
        world_size=int(plan["world_size"]),
        worker=worker,
        num_workers=int(plan["num_workers"]),
        drop_last=bool(plan["drop_last"]),
        unit=worker_unit(plan),
        bounds=bounds,
    )


def _samples_of(runs: Sequence[Run]) -> np.ndarray:
    if not runs:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs])


def consumed_samples(position: Mapping[str, Any], bounds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(every sample the position's epoch visits, the samples already yielded), as index arrays.

    Pure: rebuilt from the order functions, nothing is read. ``bounds``: the
    shard offsets of a sharded set (its blocks restart at each shard).
    """
    epoch, window = int(position["epoch"]), int(position["window"])
    batch = position["batch_size"]
    planned: list[np.ndarray] = []
    done: list[np.ndarray] = []
    for rank, worker, items in position["yielded"]:
        seq = _samples_of(share_runs(position, epoch, rank, worker, bounds))
        planned.append(seq)
        n = min(len(seq), items * batch if batch else items)
        full = n // window * window
        done.append(seq[:full])
        if n > full:
            size = min(window, len(seq) - full)
            order = (
                _order.window_order(
                    size, seed=int(position["seed"]), epoch=epoch, rank=rank, worker=worker, window=full // window
                )
                if position["shuffle"]
                else np.arange(size)
            )
            done.append(seq[full:][order[: n - full]])
    return np.unique(np.concatenate(planned)), np.unique(np.concatenate(done))


def remaining_runs(
    position: Mapping[str, Any],
    *,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    unit: int | None,
    drop_last: bool,
    bounds: np.ndarray | None = None,
) -> list[Run]:
    """One new reader's runs of the rest of the position's epoch (every sample once over all new readers).

    The rest is laid out in the epoch's block order, split evenly over the new
    ranks (padded by wrapping, or cut with ``drop_last``) and then over each
    rank's workers on multiples of ``unit`` samples, like a fresh epoch.
    """
    planned, done = consumed_samples(position, bounds)
    rest = np.setdiff1d(planned, done, assume_unique=True)
    if len(rest) == 0:
        return []
    count, block = int(position["count"]), int(position["block_size"])
    seed, epoch, shuffle = int(position["seed"]), int(position["epoch"]), bool(position["shuffle"])
    starts = _partition.block_order(count, block, seed, epoch, shuffle, bounds)
    by_start = np.argsort(starts)  # the k-th block in index order is visited at position by_start[k]
    block_of = np.searchsorted(starts[by_start], rest, side="right") - 1
    rest = rest[np.lexsort((rest, by_start[block_of]))]
    lo, hi = _partition.worker_span(
        _partition.rank_span(len(rest), rank, world_size, drop_last), worker, num_workers, unit
    )
    picked = rest[np.arange(lo, hi) % len(rest)]
    if len(picked) == 0:
        return []
    breaks = np.flatnonzero(np.diff(picked) != 1) + 1
    bounds = np.concatenate(([0], breaks, [len(picked)]))
    return [(int(picked[a]), int(picked[b - 1]) + 1) for a, b in itertools.pairwise(bounds)]


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


# -- checking a state field by field (states are untrusted input) -----------------------------------------
#
# A rule takes a field's value and returns None when it fits, or the reason it does not. The rules
# are declarative: each dataset builds one table ``field -> rule`` from what it knows (its count,
# its settings) and :func:`check_state` applies it: unknown and missing keys, types (a bool is not an
# integer, a float is never rounded) and ranges, one ResumeStateError naming the path, the field,
# the value and the reason. Nothing is allocated from a number in the state before its rule passed.

Rule = Callable[[Any], "str | None"]

#: the most readers (ranks x workers) a state may describe
MAX_READERS = 1 << 20
#: how deep positions may nest (each elastic resume within an epoch adds one)
MAX_DEPTH = 64
#: the largest seed a state may hold
MAX_SEED = (1 << 64) - 1


def is_int(value: Any) -> TypeGuard[int]:
    """An integer that is not a bool (a float, even 3.0, is not one: states are never rounded)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def show(value: Any) -> str:
    """A short repr of a state's value for messages (big lists and strings are cut)."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = 60
    short.maxlist = short.maxtuple = short.maxdict = 6
    short.maxlevel = 3
    return short.repr(value)


def same(a: Any, b: Any) -> bool:
    """``a == b`` where types count: True is not 1, 1.0 is not 1 (lists compared element by element)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if is_int(a) and is_int(b):
        return int(a) == int(b)
    return type(a) is type(b) and bool(a == b)


def anything(_value: Any) -> str | None:
    """A field checked elsewhere (by :func:`accept`)."""
    return None


def integer(lo: int = 0, hi: int | None = None, *, none: bool = False, what: str = "") -> Rule:
    """An integer in ``[lo, hi]`` (``none``: or None); ``what`` says what ``hi`` is."""

    def rule(value: Any) -> str | None:
        if value is None and none:
            return None
        if not is_int(value):
            kind = "a bool" if isinstance(value, (bool, np.bool_)) else type(value).__name__
            return f"must be an integer{' or None' if none else ''}, not {kind} (states are never rounded)"
        if value < lo:
            return f"must be >= {lo}"
        if hi is not None and value > hi:
            return f"must be <= {hi}{f' ({what})' if what else ''}"
        return None

    return rule


def flag(value: Any) -> str | None:
    """True or False."""
    return None if isinstance(value, bool) else f"must be True or False, not {type(value).__name__}"


def text(value: Any) -> str | None:
    """A string."""
    return None if isinstance(value, str) else f"must be a string, not {type(value).__name__}"


def one_of(*choices: Any) -> Rule:
    def rule(value: Any) -> str | None:
        if any(same(value, c) for c in choices):
            return None
        return f"must be one of {', '.join(repr(c) for c in choices)}"

    return rule


def equal(expected: Any, what: str) -> Rule:
    """Exactly ``expected`` (types count), which is ``what`` of the dataset loading the state."""

    def rule(value: Any) -> str | None:
        return None if same(value, expected) else f"this one has {show(expected)} ({what})"

    return rule


def index_runs(limit: int, what: str) -> Rule:
    """Runs ``[a, b)`` of indices in ``[0, limit)``, ascending and apart (what ``compress`` writes).

    Checked before anything is expanded: at most ``limit`` runs, each within ``[0, limit]``.
    """

    def rule(value: Any) -> str | None:
        if not isinstance(value, (list, tuple)):
            return f"must be a list of [start, stop] runs, not {type(value).__name__}"
        if len(value) > limit:
            return f"holds {len(value)} runs, more than the {limit} {what}"
        last = -1
        for run in value:
            if not isinstance(run, (list, tuple)) or len(run) != 2 or not all(is_int(x) for x in run):
                return f"run {show(run)} is not a pair of integers [start, stop]"
            a, b = int(run[0]), int(run[1])
            if not 0 <= a < b <= limit:
                return f"run [{a}, {b}) is not within the {limit} {what} (or is empty)"
            if a <= last:
                return f"run [{a}, {b}) overlaps or does not follow the run before it"
            last = b
        return None

    return rule


def rows(*columns: Rule, names: Sequence[str], limit: int = MAX_READERS) -> Rule:
    """A list of at most ``limit`` rows, each a list of ``len(columns)`` values checked by ``columns``."""

    def rule(value: Any) -> str | None:
        if not isinstance(value, (list, tuple)):
            return f"must be a list of [{', '.join(names)}] rows, not {type(value).__name__}"
        if not value:
            return "is empty"
        if len(value) > limit:
            return f"holds {len(value)} rows, more than {limit}"
        for row in value:
            if not isinstance(row, (list, tuple)) or len(row) != len(columns):
                return f"row {show(row)} is not a list [{', '.join(names)}]"
            for name, col, x in zip(names, columns, row):
                reason = col(x)
                if reason:
                    return f"row {show(row)}: {name} {show(x)} {reason}"
        return None

    return rule


def refuse(where: str, what: str, field: str, value: Any, reason: str) -> NoReturn:
    """Raise the ResumeStateError of one field that does not fit."""
    raise ResumeStateError(
        f"{where}: the {what} state has {field}={show(value)}: {reason}; resume from a state as it was saved "
        "(or a position from torchrecord.loader_position)"
    )


def check_state(
    state: Mapping[str, Any],
    rules: Mapping[str, Rule],
    *,
    where: str,
    what: str,
    optional: Sequence[str] = (),
    prefix: str = "",
    every_key: bool = True,
) -> None:
    """Check every key of ``state`` against ``rules``: no unknown key, none missing (but ``optional``), each fits.

    ``every_key=False``: check only the keys of ``rules`` (a second pass, with ranges from the first).
    Raises ResumeStateError naming ``where`` (the dataset's path), the field and the reason.
    """
    for key in state if every_key else ():
        if key not in rules:
            refuse(
                where,
                what,
                f"{prefix}{key}",
                state[key],
                f"{what} states have no such key (known: {', '.join(sorted(rules))})",
            )
    for key, rule in rules.items():
        if key not in state:
            if key in optional:
                continue
            refuse(where, what, f"{prefix}{key}", None, "the key is missing")
        reason = rule(state[key])
        if reason:
            refuse(where, what, f"{prefix}{key}", state[key], reason)


def reader_items(samples: int, batch_size: Any, drop_last: bool) -> int:
    """Items a reader of ``samples`` samples yields: samples, or batches (the short one unless ``drop_last``)."""
    if not batch_size:
        return samples
    size = int(batch_size)
    return samples // size if drop_last else -(-samples // size)


def check_readers(
    entries: Sequence[Sequence[Any]],
    *,
    world_size: int,
    num_workers: int,
    where: str,
    what: str,
    field: str,
    rank: int | None = None,
) -> None:
    """The (rank, worker) of a position's rows: each in the run, none twice, and every reader present.

    ``rank``: only that rank's workers must all be present (a position of the run's own plan,
    whose other ranks' rows are not used); None: every rank's.
    """
    seen: set[tuple[int, int]] = set()
    for row in entries:
        r, w = int(row[0]), int(row[1])
        if not (r < world_size and w < num_workers):
            refuse(
                where,
                what,
                field,
                row,
                f"reader (rank {r}, worker {w}) is not one of the run's {world_size} ranks x {num_workers} workers",
            )
        if (r, w) in seen:
            refuse(where, what, field, row, f"reader (rank {r}, worker {w}) is listed twice")
        seen.add((r, w))
    ranks = range(world_size) if rank is None else [rank]
    for r in ranks:
        for w in range(num_workers):
            if (r, w) not in seen:
                refuse(
                    where,
                    what,
                    field,
                    f"{len(entries)} rows",
                    f"reader (rank {r}, worker {w}) of the run's "
                    f"{world_size} ranks x {num_workers} workers is missing: merge the states of every reader "
                    "with torchrecord.loader_position(...)",
                )
