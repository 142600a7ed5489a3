"""The position of a whole run, read out of the data-loader states of any torchrecord dataset.

It sits above every dataset's resume module (``torchrecord._read.resume`` for RecordDataset's
states, ``torchrecord._mix.resume`` for the mix's), so neither has to import the other.
"""

from __future__ import annotations

from typing import Any

from torchrecord._mix import resume as _mix_resume
from torchrecord._read.resume import (
    PLAN_KEYS,
    POSITION_KIND,
    STATE_KIND,
    STATE_VERSION,
    find_states,
    per_reader,
)
from torchrecord.errors import ResumeStateError

__all__ = ["loader_position"]


def loader_position(states: Any) -> dict[str, Any]:
    """The position of a whole run, read out of data-loader states.

    Args:
        states: a torchdata ``StatefulDataLoader.state_dict()``, a list of them
            (one per rank), a ``RecordDataset.state_dict()`` or
            ``MixedDataset.state_dict()``, or any nesting of these. The states are
            found by their ``kind`` key, so changes in the loader's own nesting do
            not matter.

    Returns:
        A position (a small dict of plain values) for the dataset's ``load_state_dict``
        on any world size and number of workers.

    Raises:
        ValueError: no RecordDataset state found, states of different sets,
            epochs or settings, or a reader missing.
    """
    mixed = list(find_states(states, (_mix_resume.MIX_STATE_KIND, _mix_resume.MIX_POSITION_KIND)))
    found = [s for s in find_states(states) if s.get("kind") == STATE_KIND]
    positions = [s for s in find_states(states) if s.get("kind") == POSITION_KIND]
    if mixed and (found or positions):
        raise ResumeStateError("pass the states of one dataset: both RecordDataset and MixedDataset states were found")
    if mixed:
        return _mix_resume.mix_position(mixed)
    if not found and not positions:
        raise ResumeStateError(
            "no RecordDataset state found (nor a MixedDataset state): pass the StatefulDataLoader state(s) of the run"
        )
    if found and positions:
        raise ResumeStateError("pass either reader states or positions, not both")
    if positions:  # e.g. one RecordDataset.position_after per rank: merge their readers
        found = [
            {**p, "kind": STATE_KIND, "rank": r, "worker": w, "yielded": n}
            for p in positions
            for r, w, n in p["yielded"]
        ]
    first = found[0]
    yielded = per_reader(found, ("set_id", "epoch", "rotate", *PLAN_KEYS), "yielded", "reader")
    yielded = {reader: int(n) for reader, n in yielded.items()}
    position = {k: first.get(k) for k in ("set_id", "epoch", *PLAN_KEYS)}
    if "rotate" in first:
        position["rotate"] = first["rotate"]
    position.update(kind=POSITION_KIND, version=STATE_VERSION)
    position["yielded"] = [[r, w, n] for (r, w), n in sorted(yielded.items())]
    return position
