"""Where a mix reader stands: its :class:`Placement`, and the check of a saved one (untrusted input).

With ``policy="ready"`` a reader places the draws it has read first, so which units
are placed is not a function of the samples it handed out: its state keeps the
placement (the ``progress`` of ``torchrecord._read.state``), and
:func:`placement_problem` checks a saved one against the reader's units before
anything is expanded. With ``"exact"`` the placement follows from the count
(``torchrecord._order.mix_parts.MixPart.placement_at``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchrecord._order.mix_parts import compress, expand, window_target
from torchrecord._read import rules as r

__all__ = ["Placement", "placement_problem"]


@dataclass
class Placement:
    """Where a reader's mix stands (see the module docstring).

    Attributes:
        window: index of the current window (-1 before the first).
        members: its units, in planned order.
        offset: its samples handed out.
        prefix: units [0, prefix) are all placed.
        extra: units past ``prefix`` that are placed.
    """

    window: int = -1
    members: list[int] = field(default_factory=list)
    offset: int = 0
    prefix: int = 0
    extra: set[int] = field(default_factory=set)

    def to_state(self) -> dict[str, Any]:
        """Plain, JSON-serialisable values."""
        return {
            "window": self.window,
            "members": compress(self.members),
            "offset": self.offset,
            "prefix": self.prefix,
            "extra": compress(sorted(self.extra)),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Placement:
        return cls(
            int(state["window"]),
            expand(state["members"]),
            int(state["offset"]),
            int(state["prefix"]),
            set(expand(state["extra"])),
        )

    def place(self, i: int) -> None:
        if i == self.prefix:
            self.prefix += 1
            while self.prefix in self.extra:
                self.extra.discard(self.prefix)
                self.prefix += 1
        else:
            self.extra.add(i)

    def unplaced(self, count: int) -> list[int]:
        """The units not placed yet, in planned order."""
        rest = np.arange(self.prefix, count, dtype=np.int64)
        if self.extra:
            keep = np.ones(len(rest), bool)
            keep[[i - self.prefix for i in self.extra if i < count]] = False
            rest = rest[keep]
        out: list[int] = rest.tolist()
        return out


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
        "window": r.integer(-1, max(n - 1, -1), what="the reader's last unit"),
        "members": r.index_runs(n, "units of the reader"),
        "offset": r.integer(0),
        "prefix": r.integer(0, n, what="the reader's units"),
        "extra": r.index_runs(n, "units of the reader"),
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
        return _exact_problem(placement, p, lengths, window, step)
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


def _exact_problem(
    placement: Mapping[str, Any], p: Placement, lengths: np.ndarray, window: int, step: int
) -> tuple[str, Any, str] | None:
    """Why ``p`` is not where a reader placing its units in plan order stands (its windows rebuilt), or None."""
    n = len(lengths)
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
