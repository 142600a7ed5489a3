"""Resume points of a weighted mix: reader states, merged positions, and the rest of an epoch on any world.

A ``MixedDataset`` reader saves the ``torchrecord._read.resume`` keys (``kind``,
``version``, ``set_id``, ``epoch``), the settings that decide its units
(:data:`MIX_PLAN_KEYS`), who it is, and its :class:`~torchrecord._mix.mixer.Placement`.
Loaded by the same reader (same plan, rank and worker), it resumes exactly.

:func:`mix_position` merges the states of every reader of a run into a
*position* (``torchrecord.loader_position`` calls it for mix states). A
position's handed-out samples are rebuilt from pure functions
(:func:`consumed_positions`: the plan, each reader's units, and the order of
its current window), and :func:`reader_units_of` splits the rest of the epoch
over any world size and number of workers. A reader that resumed from a
position keeps that position as its ``base``, so a run can be resumed
elastically again in the same epoch.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from torchrecord._mix.mixer import Placement
from torchrecord._order import partition as _partition
from torchrecord._order import windows as _order
from torchrecord._order.mix_plan import MixPlan, Units, plan_epoch, reader_units, units_of_positions
from torchrecord._read.resume import STATE_VERSION, per_reader

__all__ = [
    "MIX_PLAN_KEYS",
    "MIX_POSITION_KIND",
    "MIX_STATE_KIND",
    "consumed_positions",
    "mix_position",
    "plan_of",
    "position_unit",
    "reader_units_of",
]

MIX_STATE_KIND = "torchrecord.MixedDataset"
MIX_POSITION_KIND = "torchrecord.MixedDataset.position"

#: The settings that decide a mix epoch's units, their split and their windows.
MIX_PLAN_KEYS = (
    "sizes",
    "counts",
    "rates",
    "draw_size",
    "seed",
    "shuffle",
    "window",
    "drop_last",
    "batch_size",
    "world_size",
    "num_workers",
    "worker_unit",
    "policy",
    "horizon",
)


def plan_of(position: Mapping[str, Any]) -> MixPlan:
    """The mix plan of a state's or position's epoch (pure)."""
    return plan_epoch(
        position["counts"],
        block=int(position["draw_size"]),
        seed=int(position["seed"]),
        epoch=int(position["epoch"]),
        rates=position.get("rates"),
    )


def reader_units_of(
    plan: MixPlan,
    base: Mapping[str, Any] | None,
    *,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    drop_last: bool,
    unit: int | None,
) -> Units:
    """One reader's units: its part of the epoch, or with ``base`` (a position) its part of the rest.

    ``unit``: what a rank's span is cut on among its workers (the batch, or the per-sample unit).
    """
    if base is None:
        return reader_units(
            plan,
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
            drop_last=drop_last,
            batch_size=unit,
        )
    rest = np.setdiff1d(np.arange(plan.total, dtype=np.int64), consumed_positions(base, plan), assume_unique=True)
    if not len(rest):
        return units_of_positions(plan, [])
    lo, hi = _partition.worker_span(
        _partition.rank_span(len(rest), rank, world_size, drop_last), worker, num_workers, unit
    )
    picked = rest[np.arange(lo, hi) % len(rest)]
    if not len(picked):
        return units_of_positions(plan, [])
    breaks = np.flatnonzero(np.diff(picked) != 1) + 1
    bounds = np.concatenate(([0], breaks, [len(picked)]))
    runs = [(int(picked[a]), int(picked[b - 1]) + 1) for a, b in itertools.pairwise(bounds)]
    return units_of_positions(plan, runs)


def position_unit(position: Mapping[str, Any]) -> int | None:
    """What the rank spans of a state's or position's readers were cut on among workers."""
    unit = position.get("worker_unit") or position.get("batch_size")
    return int(unit) if unit else None


def _handed_out(position: Mapping[str, Any], plan: MixPlan, rank: int, worker: int, placement: Placement) -> np.ndarray:
    """The virtual global positions one reader handed out (placed units; of its window, the first part)."""
    units = reader_units_of(
        plan,
        position.get("base"),
        rank=rank,
        world_size=int(position["world_size"]),
        worker=worker,
        num_workers=int(position["num_workers"]),
        drop_last=bool(position["drop_last"]),
        unit=position_unit(position),
    )
    members = set(placement.members)
    placed = [i for i in range(min(placement.prefix, len(units))) if i not in members]
    placed += [i for i in placement.extra if i not in members and i < len(units)]
    out = [np.arange(int(units.position[i]), int(units.position[i] + units.length[i])) for i in placed]
    window = [np.arange(int(units.position[i]), int(units.position[i] + units.length[i])) for i in placement.members]
    if window and placement.offset:
        flat = np.concatenate(window)
        if not position.get("shuffle", True):
            order = np.arange(len(flat))
        else:
            order = _order.window_order(
                len(flat),
                seed=int(position["seed"]),
                epoch=int(position["epoch"]),
                rank=rank,
                worker=worker,
                window=placement.window,
            )
        out.append(flat[order[: placement.offset]])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def consumed_positions(position: Mapping[str, Any], plan: MixPlan | None = None) -> np.ndarray:
    """The global positions of the epoch (in [0, total)) whose sample some reader of ``position`` handed out."""
    plan = plan if plan is not None else plan_of(position)
    parts = [consumed_positions(position["base"], plan)] if position.get("base") is not None else []
    for rank, worker, state in position["readers"]:
        parts.append(_handed_out(position, plan, int(rank), int(worker), Placement.from_state(state)))
    if not parts or plan.total == 0:
        return np.zeros(0, np.int64)
    return np.unique(np.concatenate(parts) % plan.total)


def mix_position(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the reader states (or positions) of one run into one position.

    Raises ValueError when they disagree on the set, epoch or settings, or a reader is missing.
    """
    readers: list[Mapping[str, Any]] = []
    for s in states:
        if s.get("kind") == MIX_POSITION_KIND:
            readers += [
                {**s, "kind": MIX_STATE_KIND, "rank": r, "worker": w, "placement": p} for r, w, p in s["readers"]
            ]
        else:
            readers.append(s)
    first = readers[0]
    by_reader = per_reader(readers, ("set_id", "epoch", "base", *MIX_PLAN_KEYS), "placement", "mix reader")
    position = {k: first.get(k) for k in ("set_id", "epoch", "base", *MIX_PLAN_KEYS)}
    position.update(kind=MIX_POSITION_KIND, version=STATE_VERSION)
    position["readers"] = [[r, w, p] for (r, w), p in sorted(by_reader.items())]
    return position
