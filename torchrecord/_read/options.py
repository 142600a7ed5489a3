"""The shared options of the reader datasets, each checked by one checker with one message.

``batch_size``, ``shuffle``, ``transform``... mean one thing in every reader
(``docs/vocabulary.md``); :data:`CHECKERS` holds the checker of each, and
:func:`check_options` checks them together (an option that contradicts another,
or that would do nothing, is refused with the fix).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from torchrecord._store.checked import parse_check
from torchrecord.errors import ArgumentError, ArgumentTypeError

__all__ = ["CHECKERS", "check_choice", "check_options", "check_world", "integer", "integer_below"]


# -- option checks ------------------------------------------------------------------------------
def integer(name: str, value: Any, minimum: int, *, none: bool) -> Any:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        allowed = " or None" if none else ""
        raise ArgumentError(f"{name} must be an integer >= {minimum}{allowed}, got {value!r}")
    return int(value)


def _positive_or_none(name: str) -> Callable[[Any], Any]:
    return lambda value: integer(name, value, 1, none=True)


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
    "shuffle_buffer": lambda value: integer("shuffle_buffer", value, 0, none=False),
    "seed": lambda value: integer("seed", value, 0, none=False),
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
    if out.get("batch_transform") is not None and batch_size is None:
        raise ArgumentError(
            "batch_transform is for batch mode (batch_size=...): in per-sample mode the dataset builds no "
            "batches, so it would never be called; give batch_size=..., or do the work in the DataLoader's "
            "collate_fn"
        )
    return out


def check_world(rank: int | None, world_size: int | None) -> tuple[int, int] | None:
    if (rank is None) != (world_size is None):
        raise ArgumentError("give both rank and world_size, or neither")
    if rank is None or world_size is None:
        return None
    world_size = integer("world_size", world_size, 1, none=False)
    rank = integer("rank", rank, 0, none=False)
    if not rank < world_size:
        raise ArgumentError(f"rank {rank} is not in [0, {world_size})")
    return rank, world_size


def integer_below(name: str, value: Any, most: int) -> int:
    """``value`` as an int in ``[0, most]``, else ArgumentError naming ``name``."""
    out = int(integer(name, value, 0, none=False))
    if out > most:
        raise ArgumentError(f"{name} must be an integer from 0 to {most}, got {value!r}")
    return out
