"""Checking a resume state field by field: declarative rules, one error naming the field (states are untrusted).

A rule takes a field's value and returns None when it fits, or the reason it does not.
:func:`check_state` applies a table ``field -> rule``: unknown and missing keys, types (a
bool is not an integer, a float is never rounded) and ranges, one ``ResumeStateError`` naming
the dataset, the field, the value and the reason. Nothing is allocated from a number in a
state before its rule passed. ``torchrecord._read.state`` builds the one table every reader's
states are checked by; the in-memory iterators (``torchrecord._memory``) use the same rules.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeGuard

import numpy as np

from torchrecord.errors import ResumeStateError

__all__ = [
    "MAX_DEPTH",
    "MAX_READERS",
    "Rule",
    "anything",
    "check_readers",
    "check_state",
    "equal",
    "flag",
    "index_runs",
    "integer",
    "is_int",
    "one_of",
    "refuse",
    "rows",
    "same",
    "show",
    "text",
]

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
