"""The resume-state part of the mutation campaign: crafted states loaded into fresh datasets.

For every state kind (``RecordDataset`` states and positions, ``MixedDataset`` states and
positions with both policies, ``StreamDataset``, ``StreamLoader``, ``BatchIter``,
``GroupBatchIter``) real states are taken at several points of an epoch, and every field
(nested placements and position rows included) is given crafted values: wrong types,
negative, huge, floats, bools, strings, nested junk, the key missing, an extra key,
neighbours of the real value, and swapped sources and readers. Each crafted state is loaded
into a fresh dataset and iterated to the end of the epoch in a forked child (address-space
limit, timeout). Outcomes:

* ``error``: a torchrecord error naming where (the dataset's path) and the field, or the
  documented warning that ignores a state of an earlier epoch;
* ``correct``: what came back is the rest of the epoch at some point of the real run (the
  oracle: every suffix of the uninterrupted epoch, as a multiset);
* ``unclear``: a torchrecord error whose message names neither the dataset nor a field;
* ``wrong``: data came back that is the rest of the epoch at no point;
* ``other``: any other exception; ``crash``: killed by a signal; ``hang``: past the timeout;
  ``memory``: a MemoryError inside the address-space limit.

Lives in ``tests/`` (imported by ``tests/read/test_untrusted_states.py`` and by
``scripts/mutation_campaign.py --states``), like ``tests/lmdb_mutations.py``.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

import torchrecord
from tests.lmdb_mutations import canonical
from torchrecord._check.isolate import run_each_in_child
from torchrecord.errors import TorchRecordError

OUTCOMES = ("error", "correct", "unclear", "wrong", "other", "crash", "hang", "memory")
BAD = ("unclear", "wrong", "other", "crash", "hang", "memory")
MISSING = object()  # a crafted "value": the key removed


# -- the targets: a fresh dataset, and its real states ----------------------------------------------------


@dataclass
class Target:
    """One state kind: how to make a fresh reader, the real run's items and states at several points."""

    name: str
    where: str  # what every torchrecord error about it must name
    make: Callable[[], Any]
    items: list[Any] = field(default_factory=list)  # canonical items of the uninterrupted epoch
    states: list[dict[str, Any]] = field(default_factory=list)
    rests: set[str] = field(default_factory=set)  # digests of every suffix's multiset
    #: an item as the units the oracle counts: a batch of samples as its samples, else the item itself
    split: Callable[[Any], list[Any]] = lambda item: [canonical(item)]
    #: the state sets the epoch (BatchIter, GroupBatchIter): the oracle is that epoch's run
    epoch_from_state: bool = False


def digest(items: list[Any]) -> str:
    return hashlib.sha256(repr(sorted(repr(x) for x in items)).encode()).hexdigest()


def _collect(target: Target, points: int, position: Callable[[dict[str, Any]], dict[str, Any]] | None) -> Target:
    """Iterate one epoch, keeping the state after k items at ``points`` spread points and every suffix."""
    reader = target.make()
    total = sum(1 for _ in target.make())
    wanted = sorted({round(i * total / max(1, points - 1)) for i in range(points)})
    items: list[Any] = []
    it = iter(reader)
    for k in range(total + 1):
        if k in wanted:
            state = copy.deepcopy(reader.state_dict())
            target.states.append(position(state) if position else state)
        if k < total:
            items += target.split(next(it))
    target.items = items
    target.rests = _suffixes(items)
    return target


def _suffixes(items: list[Any]) -> set[str]:
    return {digest(items[k:]) for k in range(len(items) + 1)}


def _samples(item: Any) -> list[Any]:
    """The sample values of a sample or a batch of the record sets here ({"x": int or int[n]})."""
    x = item["x"]
    return [int(x)] if x.dim() == 0 else [int(v) for v in x.tolist()]


def build_targets(directory: str, points: int = 4) -> list[Target]:
    """Write the record sets and take the real states of every kind."""
    os.makedirs(directory, exist_ok=True)
    plain = os.path.join(directory, "plain.tr")
    torchrecord.write_record([{"x": torch.tensor(i)} for i in range(200)], plain, progress=False)
    sources = []
    for k, n in enumerate((300, 200)):
        path = os.path.join(directory, f"source{k}.tr")
        torchrecord.write_record([{"x": torch.tensor(1000 * (k + 1) + i)} for i in range(n)], path, progress=False)
        sources.append(path)
    grouped = os.path.join(directory, "grouped.tr")
    frames = [{"x": torch.tensor(i), "g": i // 7 + (i > 60)} for i in range(140)]
    torchrecord.write_record(frames, grouped, group_by="g", progress=False)
    mix_where = f"MixedDataset of 2 sources ({sources[0]}"
    rows = torch.arange(50)
    groups = torch.tensor([0, 3, 5, 9, 20, 21, 30, 42, 50])

    def stream_loader() -> Any:
        return torchrecord.StreamLoader(torchrecord.StreamDataset(grouped, batch_size=2, steps=3, seed=1))

    def record_loader() -> Any:
        return torchrecord.RecordLoader(torchrecord.RecordDataset(plain, batch_size=16, shuffle_buffer=64))

    demos = os.path.join(directory, "demos.hdf5")
    robo = os.path.join(directory, "demos.tr")
    if not os.path.exists(robo):
        from pathlib import Path

        from tests.robomimic_files import write_demo_file
        from torchrecord.convert import from_robomimic

        write_demo_file(Path(demos), [9, 5, 14, 7], seed=2)
        from_robomimic(demos, robo, progress=False)

    def window() -> Any:
        return torchrecord.WindowDataset(robo, ["pos"], ["actions"], seq_length=3, shuffle_buffer=8, batch_size=4)

    def window_ids(item: Any) -> list[Any]:
        pos = item["obs"]["pos"]
        return [canonical(w) for w in pos] if pos.dim() == 3 else [canonical(pos)]

    def samples(t: Target) -> Target:
        t.split = _samples
        return t

    def own_epoch(t: Target) -> Target:
        t.epoch_from_state = True
        return t

    targets = [
        (Target("record", plain, lambda: torchrecord.RecordDataset(plain, shuffle_buffer=64)), None),
        (
            Target("record_batch", plain, lambda: torchrecord.RecordDataset(plain, batch_size=16, shuffle_buffer=64)),
            None,
        ),
        (
            Target("record_position", plain, lambda: torchrecord.RecordDataset(plain, shuffle_buffer=64)),
            torchrecord.loader_position,
        ),
        (
            Target("mix_exact", mix_where, lambda: torchrecord.MixedDataset(sources, draw_size=4, shuffle_buffer=32)),
            None,
        ),
        (
            Target(
                "mix_ready_batch",
                mix_where,
                lambda: torchrecord.MixedDataset(
                    sources, draw_size=4, shuffle_buffer=32, batch_size=8, policy="ready", max_defer=3
                ),
            ),
            None,
        ),
        (
            Target(
                "mix_position",
                mix_where,
                lambda: torchrecord.MixedDataset(sources, draw_size=4, shuffle_buffer=32, batch_size=8),
            ),
            torchrecord.loader_position,
        ),
        (Target("stream", grouped, lambda: torchrecord.StreamDataset(grouped, batch_size=2, steps=3, seed=1)), None),
        (Target("stream_loader", grouped, stream_loader), None),
        (Target("record_loader", plain, record_loader), None),
        (Target("window", robo, window, split=window_ids), None),
        (Target("window_position", robo, window, split=window_ids), torchrecord.loader_position),
        (Target("batch_iter", "BatchIter", lambda: torchrecord.BatchIter((rows,), batch_size=8, seed=3)), None),
        (
            Target(
                "group_batch_iter",
                "GroupBatchIter",
                lambda: torchrecord.GroupBatchIter((rows,), groups, groups_per_batch=2, seed=3),
            ),
            None,
        ),
    ]
    for t, _ in targets:
        if t.name.startswith(("record", "mix")):
            samples(t)
        if t.name == "record_loader":
            t.split = lambda item: _samples(item)
        if t.name.endswith(("iter", "loader")):  # a loader's state sets the epoch
            own_epoch(t)
    return [_collect(t, points, position) for t, position in targets]


# -- the crafted values -----------------------------------------------------------------------------------

JUNK: list[Any] = [
    MISSING,
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    7,
    10**9,
    10**12,
    2**63,
    -(2**63),
    2**70,
    0.5,
    37.9,
    float("nan"),
    float("inf"),
    "0",
    "",
    "x" * 200,
    [],
    [1],
    [[0, 10**9]],
    [[7, 16]],
    [[-1, 2]],
    [[3, 1]],
    [[0, 2], [1, 3]],
    [[0, 0, 37]],
    [[5, 0, 37]],
    {},
    {"kind": "torchrecord.position"},
    [[[[[]]]]],
]


def _near(value: Any) -> list[Any]:
    """Neighbours and look-alikes of a real value."""
    out: list[Any] = []
    if isinstance(value, bool):
        out += [not value, int(value)]
    elif isinstance(value, int):
        out += [value + 1, value - 1, value * 2 + 1, -value, float(value), str(value), [value]]
    elif isinstance(value, str):
        out += [value[:-1], value + "0", value.upper()]
    elif isinstance(value, list) and value:
        out += [value[::-1], value[:-1], value + value[-1:], [value]]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            out += [[v + 1 for v in value], [float(v) for v in value]]
    return out


def _paths(state: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every field of a state: top-level keys, the keys of its plan, progress, base and (a loader's) position,
    and each cell of position rows."""
    for key, value in state.items():
        yield (*prefix, key)
        if isinstance(value, dict) and key in ("placement", "progress", "base", "plan", "position"):
            yield from _paths(value, (*prefix, key))
        if key in ("yielded", "readers") and isinstance(value, list):
            for i, row in enumerate(value[:2]):
                for j, cell in enumerate(row):
                    yield (*prefix, key, i, j)
                    if isinstance(cell, dict):
                        yield from _paths(cell, (*prefix, key, i, j))


def _get(state: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        state = state[p]
    return state


def _set(state: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(state)
    holder = _get(out, path[:-1])
    if value is MISSING:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    return out


def mutations(state: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(description, crafted state) for every field of ``state`` and every crafted value, plus whole-state ones."""
    for path in _paths(state):
        original = _get(state, path)
        name = ".".join(str(p) for p in path)
        for value in [*JUNK, *_near(original)]:
            if isinstance(path[-1], int) and value is MISSING:
                continue
            yield f"{name}={'<missing>' if value is MISSING else repr(value)[:40]}", _set(state, path, value)
    yield "extra key", {**state, "surprise": 1}
    plan = state.get("plan")
    for key in ("sizes", "counts"):  # the sources swapped
        if isinstance(plan, dict) and key in plan:
            yield f"plan.{key} swapped", {**state, "plan": {**plan, key: plan[key][::-1]}}
    for key in ("yielded", "readers"):  # the readers swapped or one renamed
        rows = state.get(key)
        if isinstance(rows, list) and rows:
            yield f"{key}: reader renamed", {**state, key: [[7, *rows[0][1:]], *rows[1:]]}
            yield f"{key}: reader twice", {**state, key: [*rows, rows[0]]}
            yield f"{key}: rank and worker swapped", {**state, key: [[r[1], r[0], *r[2:]] for r in rows]}
    if "rank" in state:
        yield "another reader", {**state, "rank": 1, "world_size": 2}
        yield "another world", {**state, "world_size": 2, "num_workers": 3, "worker": 2}


# -- one crafted state in a child -------------------------------------------------------------------------


def _load_and_iterate(target: Target, state: dict[str, Any]) -> list[str]:
    """[outcome, detail] of loading ``state`` into a fresh reader and iterating to the end of the epoch."""
    try:
        reader = target.make()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reader.load_state_dict(state)
        ignored = any("ignoring a state" in str(w.message) for w in caught)
        got = [x for item in reader for x in target.split(item)]
        rests = target.rests
        if target.epoch_from_state and reader.epoch != 0:  # a state of another epoch: that epoch's run
            reference = target.make()
            reference.set_epoch(reader.epoch)
            rests = _suffixes([x for item in reference for x in target.split(item)])
        if ignored and digest(got) == digest(target.items):
            return ["error", "ignored with a warning (an earlier epoch)"]
        if digest(got) in rests:
            return ["correct", f"{len(got)} items"]
        return ["wrong", f"{len(got)} items, the rest of the epoch at no point"]
    except MemoryError as exc:
        return ["memory", f"MemoryError {str(exc)[:200]}"]
    except TorchRecordError as exc:
        message = str(exc)
        clear = target.where in message and ("state" in message or "position" in message)
        return ["error" if clear else "unclear", f"{type(exc).__name__}: {message[:300]}"]
    except Exception as exc:
        return ["other", f"{type(exc).__name__}: {str(exc)[:300]}"]


@dataclass
class StateResult:
    target: str
    point: int
    description: str
    outcome: str
    detail: str


@dataclass
class StateCampaign:
    results: list[StateResult]
    seconds: float
    memory_limit: int

    def table(self) -> dict[str, Counter[str]]:
        rows: dict[str, Counter[str]] = {}
        for r in self.results:
            rows.setdefault(r.target, Counter())[r.outcome] += 1
        return rows

    def failures(self) -> dict[str, int]:
        total = Counter(r.outcome for r in self.results)
        return {o: total[o] for o in BAD}

    def render(self) -> str:
        lines = [
            f"{len(self.results)} crafted resume states, {self.seconds:.0f} s, "
            f"{self.memory_limit >> 20} MiB of address space per child over the parent's"
        ]
        lines.append(f"{'state kind':<18}" + "".join(f"{o:>9}" for o in OUTCOMES))
        total: Counter[str] = Counter()
        for name, row in self.table().items():
            total += row
            lines.append(f"{name:<18}" + "".join(f"{row[o]:>9}" for o in OUTCOMES))
        lines.append(f"{'total':<18}" + "".join(f"{total[o]:>9}" for o in OUTCOMES))
        for r in self.results:
            if r.outcome in BAD:
                lines.append(f"  FAILED {r.target} point {r.point}: {r.description} -> {r.outcome}: {r.detail}")
        return "\n".join(lines)


def run_state_campaign(
    directory: str,
    *,
    points: int = 4,
    every: int = 1,
    timeout: float = 20.0,
    memory_limit: int = 1 << 30,
    targets: tuple[str, ...] | None = None,
    progress: Callable[[str], None] | None = None,
) -> StateCampaign:
    """Every crafted state (``every``: only each ``every``-th, a deterministic subset) of every target."""
    start = time.monotonic()
    results: list[StateResult] = []
    for target in build_targets(directory, points):
        if targets is not None and target.name not in targets:
            continue
        crafted = [
            (point, description, state)
            for point, real in enumerate(target.states)
            for description, state in mutations(real)
        ][::every]
        outcomes = run_each_in_child(
            functools.partial(_run_one, target), [s for _, _, s in crafted], timeout=timeout, memory_limit=memory_limit
        )
        for (point, description, _), outcome in zip(crafted, outcomes):
            if outcome.status == "returned":
                kind, detail = str(outcome.value[0]), str(outcome.value[1])
            elif outcome.status == "signal":
                kind, detail = "crash", f"{outcome.signal_name} {outcome.stderr.strip()[-200:]}"
            elif outcome.status == "timeout":
                kind, detail = "hang", f"no result in {timeout} s"
            else:
                kind, detail = "other", f"{outcome.status} {outcome.error_type} {outcome.message}"
            results.append(StateResult(target.name, point, description, kind, detail))
        if progress is not None:
            progress(f"{target.name}: {len(crafted)} crafted states")
    return StateCampaign(results, time.monotonic() - start, memory_limit)


def _run_one(target: Target, state: dict[str, Any]) -> list[str]:
    return _load_and_iterate(target, state)
