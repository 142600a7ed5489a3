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

from torchrecord._mix.mixer import Placement, window_target
from torchrecord._order import partition as _partition
from torchrecord._order import windows as _order
from torchrecord._order.mix_plan import MixPlan, Units, plan_epoch, reader_units, units_of_positions
from torchrecord._read import resume as _r
from torchrecord._read.resume import STATE_VERSION, per_reader

__all__ = [
    "MIX_PLAN_KEYS",
    "MIX_POSITION_KIND",
    "MIX_STATE_KIND",
    "consumed_positions",
    "mix_position",
    "placement_problem",
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


# -- checking a mix state (untrusted input) ----------------------------------------------------------------


def placement_problem(
    placement: Any, lengths: np.ndarray, *, window: int, step: int, exact: bool
) -> tuple[str, Any, str] | None:
    """Why a saved placement cannot be where a reader with units of ``lengths`` stood, or None.

    ``(field, value, reason)``. Every field is checked before any list is expanded (runs within the
    reader's units), then against the others: the current window's units are placed, the handed-out
    samples fit in it, and the window's index fits the units placed before it (the ramp-up of
    :func:`~torchrecord._mix.mixer.window_target`); with ``exact`` the windows are rebuilt exactly.
    """
    n = len(lengths)
    if not isinstance(placement, Mapping):
        return "placement", placement, "must be a dict (window, members, offset, prefix, extra)"
    rules = {
        "window": _r.integer(-1, max(n - 1, -1), what="the reader's last unit"),
        "members": _r.index_runs(n, "units of the reader"),
        "offset": _r.integer(0),
        "prefix": _r.integer(0, n, what="the reader's units"),
        "extra": _r.index_runs(n, "units of the reader"),
    }
    for key in placement:
        if key not in rules:
            return f"placement.{key}", placement[key], "placements have no such key"
    for key, rule in rules.items():
        if key not in placement:
            return f"placement.{key}", None, "the key is missing"
        reason = rule(placement[key])
        if reason:
            return f"placement.{key}", placement[key], reason
    p = Placement.from_state(dict(placement))  # bounded now: every run is within the n units
    if any(i <= p.prefix for i in p.extra):
        return "placement.extra", placement["extra"], f"units at or below prefix {p.prefix} are placed already"
    if p.window == -1:
        if p.members or p.offset or p.prefix or p.extra:
            return "placement.window", -1, "a reader before its first window has placed nothing"
        return None
    if not p.members:
        return "placement.members", placement["members"], "the current window holds no unit"
    if any(i >= p.prefix and i not in p.extra for i in p.members):
        return "placement.members", placement["members"], "the current window's units must be placed"
    held = int(lengths[p.members].sum())
    if p.offset > held:
        return "placement.offset", p.offset, f"the current window holds {held} samples"
    before = [i for i in range(p.prefix) if i not in set(p.members)] + [i for i in p.extra if i not in p.members]
    if exact:  # the windows of a reader placing its units in plan order, rebuilt
        start = 0
        for j in range(p.window + 1):
            end, acc = start, 0
            target = window_target(j, window, step)
            while acc < target and end < n:
                acc += int(lengths[end])
                end += 1
            if j < p.window:
                if end >= n:
                    return "placement.window", p.window, f"the reader's units fill only {j + 1} windows"
                start = end
        if p.members != list(range(start, end)) or p.prefix != end or p.extra:
            return "placement.members", placement["members"], f"window {p.window} holds units [{start}, {end})"
        return None
    # "ready": units are taken out of plan order, so only what the counts allow
    target = window_target(p.window, window, step)
    longest = int(lengths.max())
    if held < target and p.prefix < n:
        return "placement.members", placement["members"], f"window {p.window} holds at least {target} samples"
    if held - int(lengths[p.members].max()) >= target:
        return "placement.members", placement["members"], f"window {p.window} ends once it holds {target} samples"
    prior = int(lengths[before].sum()) if before else 0
    targets = [window_target(j, window, step) for j in range(p.window)]
    lo = sum(targets)
    # a window ends past its target only by part of its last unit: when a unit shorter than the
    # longest is in it, or its target is not a multiple of the longest (else it ends on the target)
    short = int((lengths[before] < longest).sum()) if before else 0
    misaligned = sum(1 for t in targets if t % longest)
    slack = min(p.window, short + misaligned) * (longest - 1)
    if not lo <= prior <= lo + slack or len(before) < p.window:
        return "placement.window", p.window, f"the {prior} samples placed before it do not make {p.window} windows"
    return None
