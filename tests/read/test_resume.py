"""Resumable iteration: exact same-size resume, elastic resume, the state contract and its errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.helpers import assert_exactly_once
from torchrecord import RecordDataset, loader_position, write_record
from torchrecord._read.reader import ShareReader
from torchrecord.errors import ArgumentError, ResumeStateError

COUNT = 301


def _samples(n: int) -> list[tuple[torch.Tensor, int]]:
    return [(torch.full((3,), i % 100, dtype=torch.int32), i) for i in range(n)]


def _labels(batch: Any) -> list[int]:
    return [int(x) for x in batch[1]]


def _loader(ds: RecordDataset, workers: int, batch: int | None, **kw: Any) -> StatefulDataLoader:
    if workers:
        kw.setdefault("multiprocessing_context", "fork")
    return StatefulDataLoader(ds, batch_size=batch, num_workers=workers, **kw)


def _epoch(loader: Any) -> list[list[int]]:
    return [_labels(b) for b in loader]


def _run_and_resume(
    path: str, *, workers: int, stop: int, epoch: int = 1, **ds_kw: Any
) -> tuple[list[list[int]], list[list[int]], list[list[int]], list[list[int]]]:
    """(uninterrupted epoch, before the stop, after resuming, the epoch after) as label batches."""
    batch_mode = ds_kw.get("batch_size") is not None
    loader_batch = None if batch_mode else 16
    ds = RecordDataset(path, **ds_kw)
    ds.set_epoch(epoch)
    full = _epoch(_loader(ds, workers, loader_batch))
    ds = RecordDataset(path, **ds_kw)
    ds.set_epoch(epoch)
    loader = _loader(ds, workers, loader_batch)
    before: list[list[int]] = []
    state = loader.state_dict()
    for b in loader:
        if len(before) == stop:
            break
        before.append(_labels(b))
        state = loader.state_dict()
    state = json.loads(json.dumps(state))  # what a checkpoint keeps
    ds2 = RecordDataset(path, **ds_kw)
    ds2.set_epoch(epoch)
    loader2 = _loader(ds2, workers, loader_batch)
    loader2.load_state_dict(state)
    after = _epoch(loader2)
    ds2.set_epoch(epoch + 1)
    following = _epoch(loader2)
    return full, before, after, following


def _fresh(path: str, epoch: int, workers: int, **ds_kw: Any) -> list[list[int]]:
    ds = RecordDataset(path, **ds_kw)
    ds.set_epoch(epoch)
    return _epoch(_loader(ds, workers, None if ds_kw.get("batch_size") else 16))


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    out = {}
    for k in (1, 4):
        path = tmp_path_factory.mktemp("resume") / f"k{k}.tr"
        write_record(_samples(COUNT), path, samples_per_record=k, progress=False)
        out[k] = str(path)
    return out


# stops, in batches of 16: none, one, mid-window (window 64), at a window edge, one before the end, the end
STOPS = [0, 1, 3, 4, 18, 19]


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("batch_size", [None, 16])
@pytest.mark.parametrize("shuffle", [True, False])
def test_same_config_resume_without_workers(
    sets: dict[int, str], k: int, batch_size: int | None, shuffle: bool
) -> None:
    kw = dict(batch_size=batch_size, shuffle=shuffle, shuffle_buffer=64)
    for stop in STOPS:
        full, before, after, following = _run_and_resume(sets[k], workers=0, stop=stop, **kw)
        assert len(full) == 19
        assert before + after == full, stop
        assert following == _fresh(sets[k], 2, 0, **kw)


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("batch_size", [None, 16])
def test_same_config_resume_with_workers(sets: dict[int, str], workers: int, batch_size: int | None) -> None:
    kw = dict(batch_size=batch_size, shuffle_buffer=64)
    for stop in (5, 17):
        full, before, after, following = _run_and_resume(sets[1], workers=workers, stop=stop, **kw)
        assert before + after == full, stop
        assert following == _fresh(sets[1], 2, workers, **kw)
        assert_exactly_once([x for b in full for x in b], COUNT)


def test_same_config_resume_with_spawn(sets: dict[int, str]) -> None:
    kw = dict(batch_size=16, shuffle_buffer=64)
    full = _fresh(sets[4], 0, 2, **kw)  # the order does not depend on the start method
    spawn: dict[str, Any] = dict(batch_size=None, num_workers=2, multiprocessing_context="spawn")
    loader = StatefulDataLoader(RecordDataset(sets[4], **kw), **spawn)
    before = []
    for b in loader:
        before.append(_labels(b))
        if len(before) == 7:
            break
    state = loader.state_dict()
    loader2 = StatefulDataLoader(RecordDataset(sets[4], **kw), **spawn)
    loader2.load_state_dict(state)
    assert before + _epoch(loader2) == full


def test_persistent_workers_run_full_epochs_after_a_resume(sets: dict[int, str]) -> None:
    kw = dict(batch_size=16, shuffle_buffer=64)
    ds = RecordDataset(sets[1], **kw)
    loader = _loader(ds, 2, None, persistent_workers=True)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    del it
    ds2 = RecordDataset(sets[1], **kw)
    loader2 = _loader(ds2, 2, None, persistent_workers=True)
    loader2.load_state_dict(state)
    rest = _epoch(loader2)
    assert len(rest) == 19 - 5
    for epoch in (1, 2, 3):
        ds2.set_epoch(epoch)
        got = _epoch(loader2)
        assert got == _fresh(sets[1], epoch, 2, **kw)
        assert_exactly_once([x for b in got for x in b], COUNT)


def test_plain_dataloader_position_after(sets: dict[int, str]) -> None:
    """A plain DataLoader: save the step count; a main-process load reaches the workers' copies."""
    for batch_size, loader_batch in ((16, None), (None, 16)):
        ds = RecordDataset(sets[1], batch_size=batch_size, shuffle_buffer=64)
        full = _epoch(DataLoader(ds, batch_size=loader_batch, num_workers=3))
        for step in (0, 4, 11, len(full)):
            ds2 = RecordDataset(sets[1], batch_size=batch_size, shuffle_buffer=64)
            ds2.load_state_dict(ds2.position_after(step, num_workers=3, loader_batch_size=loader_batch))
            rest = _epoch(DataLoader(ds2, batch_size=loader_batch, num_workers=3))
            assert full[:step] + rest == full, (batch_size, step)


def test_position_after_per_sample_refuses_a_count_without_its_unit(sets: dict[int, str]) -> None:
    """issue 27 item 3: per-sample mode with no loader_batch_size anywhere would read the step as samples."""
    ds = RecordDataset(sets[1], shuffle_buffer=64)
    with pytest.raises(ArgumentError, match=r"loader_batch_size=B") as info:
        ds.position_after(4, num_workers=2)
    assert sets[1] in str(info.value) and "DataLoader's batch_size" in str(info.value)
    with pytest.raises(ArgumentError, match="leave loader_batch_size out"):
        RecordDataset(sets[1], batch_size=16).position_after(4, num_workers=2, loader_batch_size=16)
    with pytest.raises(ArgumentError, match="differs from the dataset's loader_batch_size=16"):
        RecordDataset(sets[1], loader_batch_size=16).position_after(4, num_workers=2, loader_batch_size=8)
    with pytest.raises(ArgumentError, match="integer >= 1"):
        ds.position_after(4, num_workers=2, loader_batch_size=0)
    # a DataLoader that yields single samples: loader_batch_size=1 counts them
    full = [int(x[1]) for x in DataLoader(ds, batch_size=None, num_workers=2)]
    ds2 = RecordDataset(sets[1], shuffle_buffer=64)
    ds2.load_state_dict(ds2.position_after(37, num_workers=2, loader_batch_size=1))
    assert full[:37] + [int(x[1]) for x in DataLoader(ds2, batch_size=None, num_workers=2)] == full


# -- elastic -----------------------------------------------------------------------


def _rank_loaders(path: str, world: int, workers: int, **kw: Any) -> list[StatefulDataLoader]:
    loaders = []
    for rank in range(world):
        ds = RecordDataset(path, rank=rank, world_size=world, **kw)
        ds.set_epoch(3)
        loaders.append(_loader(ds, workers, None))
    return loaders


@pytest.mark.parametrize(("old", "new"), [((2, 2), (1, 1)), ((1, 1), (2, 3)), ((2, 1), (3, 2)), ((4, 0), (2, 2))])
@pytest.mark.parametrize("steps", [0, 5])
def test_elastic_resume_every_sample_once(
    sets: dict[int, str], old: tuple[int, int], new: tuple[int, int], steps: int
) -> None:
    kw = dict(batch_size=8, shuffle_buffer=32)
    (world, workers), (new_world, new_workers) = old, new
    before: list[int] = []
    states = []
    for loader in _rank_loaders(sets[1], world, workers, **kw):
        it = iter(loader)
        for _ in range(steps):  # every rank steps in lockstep, as under DDP
            before += _labels(next(it))
        states.append(loader.state_dict())
        del it
    position = json.loads(json.dumps(loader_position(states)))
    after: list[int] = []
    counts = []
    for rank in range(new_world):
        ds = RecordDataset(sets[1], rank=rank, world_size=new_world, **kw)
        ds.set_epoch(3)
        ds.load_state_dict(position)
        got = [x for b in _loader(ds, new_workers, None) for x in _labels(b)]
        counts.append(len(got))
        after += got
    assert len(set(counts)) == 1, f"ranks yield different counts: {counts}"
    done = set(before)
    assert not done & set(after), "a sample yielded before the stop came again"
    rest = COUNT - len(done)
    # the rest exactly once over the new readers, padded up to a multiple of the new world size
    assert_exactly_once(after, COUNT, drop=len(done), pad=-(-rest // new_world) * new_world - rest)


def test_state_is_small_and_does_not_grow_with_the_set(tmp_path: Any) -> None:
    sizes = []
    for n in (1_000, 200_000):
        path = tmp_path / f"{n}.tr"
        write_record(torch.arange(n, dtype=torch.int64), path, progress=False)
        ds = RecordDataset(path, batch_size=64)
        it = iter(ds)
        next(it)
        state = ds.state_dict()
        text = json.dumps(state)
        assert all(isinstance(v, (int, str, bool)) or v is None for k, v in state.items() if k != "plan")
        assert all(isinstance(v, (int, str, bool)) or v is None for v in state["plan"].values())
        sizes.append(len(text))
    assert max(sizes) < 1024
    assert abs(sizes[0] - sizes[1]) <= 8, sizes  # only the digits of the counts differ


def test_resume_near_the_end_reads_at_most_one_window(sets: dict[int, str]) -> None:
    ds = RecordDataset(sets[1], batch_size=16, shuffle_buffer=64)
    state = ds.state_dict()
    state["yielded"] = 18  # one batch before the end
    ds2 = RecordDataset(sets[1], batch_size=16, shuffle_buffer=64)
    ds2.load_state_dict(state)
    share = ds2.share()
    reader = ShareReader(ds2.file, share, layout=ds2._fixed_layout())
    rest = list(reader.chunks(16, 18 * 16))
    assert sum(len(c[1]) for c in rest) == COUNT - 18 * 16
    assert reader.records_read <= share.window
    assert sum(len(labels) for _, labels in ds2) == COUNT - 18 * 16


# -- errors ------------------------------------------------------------------------------


def test_later_epoch_is_refused_and_earlier_is_ignored(sets: dict[int, str]) -> None:
    ds = RecordDataset(sets[1], batch_size=16)
    ds.set_epoch(4)
    state = ds.state_dict()
    fresh = RecordDataset(sets[1], batch_size=16)
    with pytest.raises(ValueError, match=r"saved in epoch 4.*set_epoch\(4\)"):
        fresh.load_state_dict(state)
    fresh.set_epoch(5)
    with pytest.warns(UserWarning, match="ignoring a state saved in epoch 4"):
        fresh.load_state_dict(state)
    assert len(list(fresh)) == 19


def test_state_of_another_set_or_newer_version_is_refused(sets: dict[int, str], tmp_path: Any) -> None:
    state = RecordDataset(sets[1]).state_dict()
    other = tmp_path / "other.tr"
    write_record(_samples(COUNT), other, progress=False)
    with pytest.raises(ValueError, match="another record set"):
        RecordDataset(other).load_state_dict(state)
    with pytest.raises(ValueError, match="upgrade torchrecord"):
        RecordDataset(sets[1]).load_state_dict({**state, "version": 99})
    with pytest.raises(ValueError, match=r"no torchrecord\.RecordDataset state found"):
        RecordDataset(sets[1]).load_state_dict({"epoch": 0})


def test_a_single_worker_state_on_another_reader_is_refused(sets: dict[int, str]) -> None:
    ds = RecordDataset(sets[1], rank=1, world_size=2)
    state = ds.state_dict()
    other = RecordDataset(sets[1], rank=0, world_size=2)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="loader_position"):
        list(other)


def test_loader_position_errors() -> None:
    with pytest.raises(ValueError, match="no torchrecord reader state found"):
        loader_position({"something": 1})


def test_loader_position_names_a_missing_reader(sets: dict[int, str]) -> None:
    states = [RecordDataset(sets[1], rank=0, world_size=2).state_dict()]
    with pytest.raises(ValueError, match="rank 1, worker 0"):
        loader_position(states)


# -- crafted states (issue 30: resume states are untrusted input) ---------------------------------------------


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("untrusted") / "plain.tr"
    write_record([{"x": torch.tensor(i)} for i in range(200)], path, progress=False)
    return str(path)


def _after_37(path: str) -> tuple[dict[str, Any], set[int]]:
    ds = RecordDataset(path, shuffle_buffer=64)
    it = iter(ds)
    first = {int(next(it)["x"]) for _ in range(37)}
    return json.loads(json.dumps(ds.state_dict())), first


def _resume(path: str, state: Any) -> list[int]:
    ds = RecordDataset(path, shuffle_buffer=64)
    ds.load_state_dict(state)
    return [int(s["x"]) for s in ds]


def test_a_real_state_and_its_position_resume_exactly(plain: str) -> None:
    state, first = _after_37(plain)
    for resume_from in (state, loader_position([state])):
        rest = _resume(plain, resume_from)
        assert len(rest) == 163 and not first & set(rest) and first | set(rest) == set(range(200))


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("yielded", 500, "has 200 items"),  # yielded nothing
        ("plan.count", 10, "this dataset has 200"),  # yielded nothing
        ("yielded", 37.9, "must be an integer, not float"),  # was rounded
        ("yielded", True, "not a bool"),
        ("epoch", 0.9, "must be an integer"),
        ("epoch", "0", "must be an integer"),
        ("epoch", 2**63, "must be <= 9223372036854775807"),
        ("version", 0, "from 1 to 2"),
        ("version", -3, "from 1 to 2"),
        ("version", True, "from 1 to 2"),
        ("num_workers", 0, "must be >= 1"),
        ("plan.block_size", 0, "this dataset has"),
        ("rank", 3, "the last rank of its world_size"),
        ("plan.seed", -1, "this dataset has 0"),
        ("plan.shuffle", 1, "this dataset has True"),
        ("rotate", 1, "below its num_workers"),
    ],
)
def test_a_crafted_state_is_refused_naming_the_path_and_field(plain: str, field: str, value: Any, reason: str) -> None:
    state, _ = _after_37(plain)
    crafted = json.loads(json.dumps(state))
    key = field.split(".")[-1]
    (crafted["plan"] if field.startswith("plan.") else crafted)[key] = value
    with pytest.raises(ResumeStateError) as info:
        _resume(plain, crafted)
    message = str(info.value)
    assert plain in message and f"{key}=" in message and reason in message, message


@pytest.mark.parametrize(
    ("readers", "reason"),
    [
        ([[3, 0, 37]], "rank 3 must be <= 0"),  # replayed the 37
        ([[0, 0, 37], [0, 0, 1]], "the run has 1 readers"),
        ([[0, 0, 201]], "has 200 items"),
        (5, "must be a non-empty list of [rank, worker, yielded] rows"),  # 'int' object is not iterable
        ([[0, 0]], "a row is [rank, worker, yielded]"),
        ([[0, 0, "37"]], "yielded '37' must be an integer"),
    ],
)
def test_a_crafted_position_is_refused_naming_the_path_and_field(plain: str, readers: Any, reason: str) -> None:
    state, _ = _after_37(plain)
    position = {**loader_position([state]), "readers": readers}
    with pytest.raises(ResumeStateError) as info:
        _resume(plain, position)
    message = str(info.value)
    assert plain in message and "readers" in message and reason in message, message


def test_an_elastic_position_must_name_every_reader(plain: str) -> None:
    states = []
    for worker in range(2):  # the two workers of one rank, as a StatefulDataLoader saves them
        state = RecordDataset(plain, shuffle_buffer=64).state_dict()
        states.append({**state, "worker": worker, "num_workers": 2})
    position = loader_position(states)
    assert len(_resume(plain, position)) == 200  # nothing yielded yet: the whole epoch on one reader
    with pytest.raises(ResumeStateError, match=r"reader \(rank 0, worker 1\) .* is missing"):
        _resume(plain, {**position, "readers": position["readers"][:1]})


def test_unknown_and_missing_keys_are_refused(plain: str) -> None:
    state, _ = _after_37(plain)
    with pytest.raises(ResumeStateError, match=r"surprise=1: .* no such key"):
        _resume(plain, {**state, "surprise": 1})
    del state["plan"]["window"]
    with pytest.raises(ResumeStateError, match=r"plan.window=None: the key is missing"):
        _resume(plain, state)
    del state["yielded"]
    with pytest.raises(ResumeStateError, match=r"yielded=None: the key is missing"):
        _resume(plain, state)
