"""torchrecord._memory.batches: load(), BatchIter and GroupBatchIter, on real record sets under tmp_path."""

from __future__ import annotations

import json
from collections import Counter, namedtuple
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchrecord
from benchmarks.post_groups import PostGroupBatchIter
from tests.conftest import IndexedImages
from tests.helpers import assert_exactly_once
from torchrecord import BatchIter, GroupBatchIter, RecordFile, SampleList, load
from torchrecord._memory import batches as memory_module
from torchrecord._memory import load as load_module
from torchrecord._order.group_batches import batch_bounds_by_samples
from torchrecord.errors import ResumeStateError

Pair = namedtuple("Pair", ["a", "b"])


# -- BatchIter -------------------------------------------------------------------------------------------


def _rows_of(batches: list[Any]) -> list[int]:
    return [int(i) for batch in batches for i in batch[0]]


@pytest.mark.parametrize("count", [32, 33, 31])  # N mod B = 0, 1, B-1 with B = 8
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batch_iter_covers_every_row_once(count: int, drop_last: bool, shuffle: bool) -> None:
    rows = torch.arange(count)
    it = BatchIter((rows, rows * 10), batch_size=8, shuffle=shuffle, seed=3, drop_last=drop_last)
    batches = list(it)
    assert len(it) == len(batches)
    rest = count % 8
    assert len(batches) == count // 8 + (1 if rest and not drop_last else 0)
    assert all(len(b[0]) == 8 for b in batches[:-1])
    assert len(batches[-1][0]) == (8 if drop_last or not rest else rest)
    for index, tens in batches:
        assert torch.equal(tens, index * 10)  # fields stay aligned
    assert_exactly_once(_rows_of(batches), count, drop=rest if drop_last else 0)
    order = _rows_of(batches)
    assert (order == sorted(order)) == (not shuffle)


@pytest.mark.parametrize(("count", "drop_last", "expected"), [(0, False, 0), (0, True, 0), (5, False, 1), (5, True, 0)])
def test_batch_iter_fewer_rows_than_a_batch(count: int, drop_last: bool, expected: int) -> None:
    it = BatchIter(torch.arange(count), batch_size=8, drop_last=drop_last)
    batches = list(it)
    assert len(it) == len(batches) == expected
    if expected:
        assert sorted(batches[0].tolist()) == list(range(count))


def test_batch_iter_order_is_a_pure_function_of_seed_and_epoch() -> None:
    data = torch.arange(1000)

    def order(seed: int, epoch: int, it: BatchIter | None = None) -> list[int]:
        it = it or BatchIter(data, batch_size=64, seed=seed)
        it.set_epoch(epoch)
        return torch.cat(list(it)).tolist()

    it = BatchIter(data, batch_size=64, seed=5)
    first = order(5, 0, it)
    assert order(5, 0, it) == first  # iterating again repeats the epoch
    assert order(5, 1, it) != first  # a new epoch, a new order
    assert order(5, 0, it) == first  # and back: nothing carried over
    assert order(5, 0) == first  # a fresh iterator with the same seed
    assert order(6, 0) != first
    assert first != sorted(first)


def test_batch_iter_batches_are_fresh_tensors() -> None:
    data = torch.arange(100.0)
    it = iter(BatchIter((data,), batch_size=10, seed=1))
    (first,) = next(it)
    kept = first.clone()
    (second,) = next(it)
    first.fill_(-1.0)  # the caller may write into a batch...
    assert torch.equal(data, torch.arange(100.0))  # ...without touching the data
    assert not torch.equal(second, first) and (second >= 0).all()
    assert first.untyped_storage().data_ptr() != data.untyped_storage().data_ptr()
    assert not torch.equal(kept, first)


def test_batch_iter_keeps_nested_structure() -> None:
    n = 23
    rows = torch.arange(n)
    data = {
        "x": (rows.float() * 2, {"y": rows * 3}),
        "pair": Pair(rows, [rows + 1, SampleList(f"s{i}" for i in range(n))]),
    }
    seen = []
    for batch in BatchIter(data, batch_size=5, seed=2):
        assert set(batch) == {"x", "pair"}
        x, inner = batch["x"]
        index = batch["pair"].a
        assert isinstance(batch["x"], tuple) and isinstance(batch["pair"], Pair)
        assert torch.equal(x, index.float() * 2) and torch.equal(inner["y"], index * 3)
        plus, names = batch["pair"].b
        assert isinstance(batch["pair"].b, list) and torch.equal(plus, index + 1)
        assert isinstance(names, SampleList) and names == [f"s{i}" for i in index.tolist()]
        seen += index.tolist()
    assert_exactly_once(seen, n)


def test_batch_iter_keeps_bool_and_bfloat16_exactly() -> None:
    n = 200
    rows = torch.arange(n)
    flags = rows % 3 == 0
    half = (rows % 256).to(torch.bfloat16)  # integers up to 256 are exact in bfloat16
    for index, f, h in BatchIter((rows, flags, half), batch_size=16, seed=9):
        assert f.dtype == torch.bool and h.dtype == torch.bfloat16
        assert torch.equal(f, index % 3 == 0)
        assert torch.equal(h, (index % 256).to(torch.bfloat16))


def test_iterators_index_on_each_tensors_device() -> None:
    """The meta device stands in for a GPU: indices go to each field's device, offsets to the data's."""
    rows = torch.arange(12)
    on_meta = torch.empty(12, 3, device="meta")
    for index, meta in BatchIter((rows, on_meta), batch_size=5, seed=1):
        assert index.device.type == "cpu" and meta.device.type == "meta" and meta.shape == (len(index), 3)
    for (meta, index), offsets in GroupBatchIter((on_meta, rows), [0, 4, 12], groups_per_batch=1, seed=1):
        assert meta.device.type == offsets.device.type == "meta" and index.device.type == "cpu"
        assert meta.shape == (len(index), 3) and offsets.shape == (2,)


def test_batch_iter_rejects_bad_data_and_arguments() -> None:
    with pytest.raises(ValueError, match=r"data\[0\] has 10 rows but data\[1\]\['y'\] has 9"):
        BatchIter((torch.zeros(10), {"y": torch.zeros(9)}), batch_size=2)
    with pytest.raises(ValueError, match="0-d tensor"):
        BatchIter((torch.zeros(10), torch.tensor(1.0)), batch_size=2)
    with pytest.raises(TypeError, match=r"data\[1\] is a ndarray.*torch.as_tensor"):
        BatchIter((torch.zeros(3), np.zeros(3)), batch_size=2)
    with pytest.raises(TypeError, match=r"data\[0\] is a str.*SampleList"):
        BatchIter(["a", "b"], batch_size=2)
    with pytest.raises(ValueError, match="holds no tensors"):
        BatchIter({}, batch_size=2)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        BatchIter(torch.zeros(3), batch_size=0)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        BatchIter(torch.zeros(3), batch_size=2, seed=-1)
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        BatchIter(torch.zeros(3), batch_size=2).set_epoch(-1)


# -- GroupBatchIter ----------------------------------------------------------------------------------------


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int64)


def _group_data(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, group id) per row for groups of ``lengths``."""
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch.int64))
    return torch.arange(len(ids)), ids


def _check_group_batches(
    lengths: list[int], it: GroupBatchIter, *, per_batch: int | None, max_samples: int | None, drop_last: bool
) -> list[list[int]]:
    """Check every property of one epoch; returns the groups of each batch, in order."""
    offsets = _offsets(lengths).tolist()
    batches = list(it)
    assert len(it) == len(batches)
    groups_of: list[list[int]] = []
    seen: list[int] = []
    for (rows, ids), inner in batches:
        assert inner.dtype == torch.int64 and inner[0] == 0 and inner[-1] == len(rows)
        assert bool((inner[1:] > inner[:-1]).all())
        groups = []
        for start, stop in zip(inner[:-1].tolist(), inner[1:].tolist()):
            g = int(ids[start])
            assert (ids[start:stop] == g).all(), "a segment mixes groups"
            # a whole group, its rows in stored order
            assert rows[start:stop].tolist() == list(range(offsets[g], offsets[g + 1]))
            groups.append(g)
        groups_of.append(groups)
        seen += rows.tolist()
    visited = [g for groups in groups_of for g in groups]
    assert len(set(visited)) == len(visited)
    dropped = len(lengths) - len(visited)
    if per_batch is not None:
        assert all(len(groups) == per_batch for groups in groups_of[:-1])
        if groups_of:
            assert 1 <= len(groups_of[-1]) <= per_batch
        assert dropped == (len(lengths) % per_batch if drop_last else 0)
        if drop_last and groups_of:
            assert len(groups_of[-1]) == per_batch
    else:
        assert max_samples is not None
        sizes = [sum(lengths[g] for g in groups) for groups in groups_of]
        for groups, size in zip(groups_of, sizes):
            assert size <= max_samples or len(groups) == 1  # a bigger group goes alone
        for size, following in zip(sizes, groups_of[1:]):
            assert size + lengths[following[0]] > max_samples  # greedy: the next group did not fit
        if not drop_last:
            assert dropped == 0
        elif dropped:
            assert sum(lengths[g] for g in set(range(len(lengths))) - set(visited)) < max_samples
    assert_exactly_once(seen, sum(lengths), drop=sum(lengths) - len(seen))
    return groups_of


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=0, max_size=40),
    rule=st.sampled_from(["count", "samples"]),
    size=st.integers(1, 12),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
)
def test_group_batches_properties(
    lengths: list[int], rule: str, size: int, shuffle: bool, drop_last: bool, seed: int, epoch: int
) -> None:
    per_batch, max_samples = (size, None) if rule == "count" else (None, size)
    data = _group_data(lengths)
    it = GroupBatchIter(
        data,
        _offsets(lengths),
        groups_per_batch=per_batch,
        max_samples=max_samples,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )
    it.set_epoch(epoch)
    groups_of = _check_group_batches(lengths, it, per_batch=per_batch, max_samples=max_samples, drop_last=drop_last)
    if not shuffle:
        assert [g for groups in groups_of for g in groups] == list(range(sum(len(g) for g in groups_of)))
    # the same batches from group ids instead of offsets
    by_ids = GroupBatchIter(
        data,
        group_ids=data[1],
        groups_per_batch=per_batch,
        max_samples=max_samples,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )
    by_ids.set_epoch(epoch)
    expected = [[r for g in groups for r in _rows(lengths, g)] for groups in groups_of]
    assert [b[0][0].tolist() for b in by_ids] == expected
    # drop_last leaves out at most the last batch of the same epoch
    if drop_last:
        full = GroupBatchIter(
            data, _offsets(lengths), groups_per_batch=per_batch, max_samples=max_samples, shuffle=shuffle, seed=seed
        )
        full.set_epoch(epoch)
        everything = [[int(i) for i in b[0][1].unique_consecutive()] for b in full]
        assert everything[: len(groups_of)] == groups_of and len(everything) - len(groups_of) in (0, 1)


def _rows(lengths: list[int], group: int) -> list[int]:
    start = sum(lengths[:group])
    return list(range(start, start + lengths[group]))


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=0, max_size=60), max_samples=st.integers(1, 60))
def test_greedy_bounds_match_a_plain_loop(lengths: list[int], max_samples: int) -> None:
    """The pointer-doubling planner against the obvious greedy loop."""
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    expected, start = [0], 0
    while start < len(lengths):
        stop, size = start, 0
        while stop < len(lengths) and (stop == start or size + lengths[stop] <= max_samples):
            size += lengths[stop]
            stop += 1
        expected.append(stop)
        start = stop
    assert batch_bounds_by_samples(offsets, max_samples, drop_last=False).tolist() == expected


@pytest.mark.parametrize("groups", [5, 6, 9, 10])
@pytest.mark.parametrize("shuffle", [False, True])
def test_post_failure_cases_four_groups_per_batch(groups: int, shuffle: bool) -> None:
    lengths = [3 + g % 4 for g in range(groups)]
    data = _group_data(lengths)
    it = GroupBatchIter(data, _offsets(lengths), groups_per_batch=4, shuffle=shuffle, seed=1)
    assert len(it) == -(-groups // 4)
    _check_group_batches(lengths, it, per_batch=4, max_samples=None, drop_last=False)
    # control: the post's iterator loses samples on exactly these cases
    post = PostGroupBatchIter(data[1], data[0], batch_size=4, shuffle=shuffle, shuffle_seed=1)
    assert sum(len(b[0]) for b in post) < sum(lengths)


@pytest.mark.parametrize("groups", [7, 8])
def test_post_len_control(groups: int) -> None:
    """Control: where (G+1) mod 4 is 0 or 1 the post keeps every sample but len() says one batch too many."""
    lengths = [2] * groups
    ids = _group_data(lengths)[1]
    post = PostGroupBatchIter(ids, batch_size=4, shuffle=False)
    assert len(post) == len(list(post)) + 1
    assert len(GroupBatchIter(ids, _offsets(lengths), groups_per_batch=4)) == len(list(post))


def test_post_failure_case_at_scale() -> None:
    """62,480 groups (the post's scale) with 64 a batch: (G+1) mod 64 = 17, where the post drops groups."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 16, size=62_480).tolist()
    rows, ids = _group_data(lengths)
    it = GroupBatchIter((rows,), _offsets(lengths), groups_per_batch=64, seed=1)
    batches = list(it)
    assert len(it) == len(batches) == 977
    seen = torch.cat([b[0][0] for b in batches])
    assert torch.equal(seen.sort().values, rows)
    assert sum(len(b[1]) - 1 for b in batches) == 62_480
    post = PostGroupBatchIter(ids, rows, batch_size=64, shuffle_seed=1)
    assert sum(len(b[0]) for b in post) < len(rows)  # control


def _visiting_order(make: Callable[[int], Any], seed: int) -> np.ndarray:
    """The group order of one epoch, for groups of one row each (so rows are groups)."""
    return torch.cat([b[0][0] if isinstance(b[0], tuple) else b[1] for b in make(seed)]).numpy()


def _best_shift_agreement(first: np.ndarray, second: np.ndarray) -> float:
    """The largest fraction of neighbours (a, b) in ``first`` that are neighbours (a+k, b+k) in ``second``.

    Over every shift k. Neighbours rather than positions: a shifted order may also
    gain or lose a group at one place, which moves every later position by one.
    """
    by_step: dict[int, list[int]] = {}
    for c, d in zip(second[:-1].tolist(), second[1:].tolist()):
        by_step.setdefault(d - c, []).append(c)
    shifts: Counter[int] = Counter()
    for a, b in zip(first[:-1].tolist(), first[1:].tolist()):
        shifts.update(c - a for c in by_step.get(b - a, []))
    return max(shifts.values(), default=0) / (len(first) - 1)


def test_seeds_one_and_two_are_not_shifts_of_each_other() -> None:
    groups = 2000
    rows = torch.arange(groups)
    offsets = torch.arange(groups + 1)

    def ours(seed: int) -> GroupBatchIter:
        return GroupBatchIter((rows,), offsets, groups_per_batch=64, seed=seed)

    def post(seed: int) -> PostGroupBatchIter:
        return PostGroupBatchIter(rows, rows, batch_size=64, shuffle_seed=seed)

    one, two = _visiting_order(ours, 1), _visiting_order(ours, 2)
    assert sorted(one.tolist()) == sorted(two.tolist()) == list(range(groups))
    assert _best_shift_agreement(one, two) < 0.02
    # control: the post's seed 2 is its seed 1 shifted by one group id
    post_one, post_two = _visiting_order(post, 1), _visiting_order(post, 2)
    assert _best_shift_agreement(post_one, post_two) > 0.9


def test_group_epochs_are_independent_and_repeatable() -> None:
    lengths = [1 + i % 5 for i in range(300)]
    data = _group_data(lengths)
    it = GroupBatchIter(data, _offsets(lengths), max_samples=20, seed=4)

    def epoch(e: int) -> list[list[int]]:
        it.set_epoch(e)
        return [b[0][0].tolist() for b in it]

    first = epoch(0)
    assert epoch(1) != first
    assert epoch(0) == first


def test_group_ids_that_reappear_name_the_id_and_both_ranges() -> None:
    ids = torch.tensor([5, 5, 3, 7, 3, 5])
    with pytest.raises(ValueError, match=r"group id 3 appears in rows \[2, 3\) and again in rows \[4, 5\).*argsort"):
        GroupBatchIter(torch.arange(6), group_ids=ids, groups_per_batch=2)
    with pytest.raises(ValueError, match=r"group id 1 appears in rows \[0, 2\) and again in rows \[4, 5\)"):
        GroupBatchIter(torch.arange(5), group_ids=[1, 1, 2, 2, 1], groups_per_batch=2)


def test_group_arguments_are_checked() -> None:
    data = torch.arange(6)
    with pytest.raises(ValueError, match="start at 0 and end at the number of rows"):
        GroupBatchIter(data, [0, 3, 5], groups_per_batch=1)
    with pytest.raises(ValueError, match=r"group 1 is rows \[3, 3\), which is empty"):
        GroupBatchIter(data, [0, 3, 3, 6], groups_per_batch=1)
    with pytest.raises(ValueError, match="1-D group offsets"):
        GroupBatchIter(data, [[0, 6]], groups_per_batch=1)
    with pytest.raises(ValueError, match="integer offsets"):
        GroupBatchIter(data, [0.0, 6.0], groups_per_batch=1)
    with pytest.raises(ValueError, match="either groups="):
        GroupBatchIter(data, [0, 6], group_ids=torch.zeros(6), groups_per_batch=1)
    with pytest.raises(ValueError, match="either groups="):
        GroupBatchIter(data, groups_per_batch=1)
    with pytest.raises(ValueError, match="either groups_per_batch= or max_samples="):
        GroupBatchIter(data, [0, 6])
    with pytest.raises(ValueError, match="either groups_per_batch= or max_samples="):
        GroupBatchIter(data, [0, 6], groups_per_batch=1, max_samples=3)
    with pytest.raises(ValueError, match="max_samples must be an int >= 1"):
        GroupBatchIter(data, [0, 6], max_samples=0)
    with pytest.raises(ValueError, match=r"one id per row: shape \[6\]"):
        GroupBatchIter(data, group_ids=[1, 2], groups_per_batch=1)
    with pytest.raises(ValueError, match="group_ids must be integers"):
        GroupBatchIter(data, group_ids=torch.zeros(6), groups_per_batch=1)


def test_group_batch_iter_structure_and_dtypes() -> None:
    lengths = [2, 1, 3]
    rows, _ = _group_data(lengths)
    data = {"row": rows, "flags": (rows % 2 == 0, rows.to(torch.bfloat16)), "names": SampleList("abcdef")}
    ((batch, inner),) = GroupBatchIter(data, _offsets(lengths), groups_per_batch=3, shuffle=False)
    assert torch.equal(batch["row"], rows) and inner.tolist() == [0, 2, 3, 6]
    assert batch["flags"][0].dtype == torch.bool and batch["flags"][1].dtype == torch.bfloat16
    assert batch["names"] == list("abcdef")


def test_group_batch_iter_with_no_groups() -> None:
    it = GroupBatchIter(torch.zeros(0), [0], max_samples=4)
    assert len(it) == 0 and list(it) == []


# -- load ---------------------------------------------------------------------------------------------------


def _mixed(i: int) -> dict[str, Any]:
    return {
        "x": torch.arange(3, dtype=torch.float32) + i,
        "half": torch.tensor([i, -i], dtype=torch.float32).to(torch.bfloat16),
        "meta": {"flags": torch.tensor([i % 2 == 0, i % 3 == 0, True, False]), "arr": np.arange(2, dtype=np.int16) * i},
        "label": i,
        "score": i / 4,
        "ok": i % 5 == 0,
        "name": f"n{i}",
        "blob": bytes([i % 256]) * (i % 4),
        "tokens": torch.arange(i % 5),
    }


#: the field of _mixed whose length varies, stated so that the write does not warn
_VARIABLE = {"tokens": [None]}


def _equal(column_item: Any, stored: Any) -> bool:
    if isinstance(stored, torch.Tensor):
        return stored.dtype == column_item.dtype and torch.equal(column_item, stored)
    if isinstance(stored, np.ndarray):
        return bool(np.array_equal(column_item.numpy(), stored))
    if isinstance(column_item, torch.Tensor):
        return bool(column_item.item() == stored)
    return bool(column_item == stored)


def _assert_load_matches(path: str, loaded: Any, rows: list[int] | None = None) -> None:
    rf = RecordFile(path)
    rows = list(range(len(rf))) if rows is None else rows
    names = rf.schema.names
    leaves = load_module._leaf_columns(rf.schema.tree, loaded)
    assert len(leaves) == len(names)
    for position, i in enumerate(rows):
        stored = load_module._leaf_columns(rf.schema.tree, rf[i])
        for name, column, value in zip(names, leaves, stored):
            assert len(column) == len(rows)
            assert _equal(column[position], value), f"field {name}, sample {i}"


def test_load_equals_record_file_for_every_sample(make_record: Callable[..., str]) -> None:
    path = make_record([_mixed(i) for i in range(37)], schema=_VARIABLE)
    loaded = load(path)
    _assert_load_matches(path, loaded)
    assert loaded["x"].shape == (37, 3) and loaded["half"].dtype == torch.bfloat16
    assert loaded["meta"]["flags"].dtype == torch.bool and loaded["meta"]["arr"].dtype == torch.int16
    assert loaded["label"].dtype == torch.int64 and loaded["score"].dtype == torch.float64
    assert loaded["ok"].dtype == torch.bool
    for name in ("name", "blob", "tokens"):
        assert isinstance(loaded[name], SampleList)


@pytest.mark.parametrize("samples_per_record", [1, 4])
def test_load_fixed_layout_sets(make_record: Callable[..., str], samples_per_record: int) -> None:
    path = make_record(IndexedImages(50), samples_per_record=samples_per_record)
    images, labels = load(path)
    assert images.shape == (50, 3, 4, 4) and images.dtype == torch.uint8
    _assert_load_matches(path, (images, labels))
    assert sorted(labels.tolist()) == list(range(50))


def test_load_large_samples(make_record: Callable[..., str]) -> None:
    """Samples over 16 KiB are read as one chunk; subsets still work."""
    path = make_record(IndexedImages(12, size=80))
    _assert_load_matches(path, load(path))
    _assert_load_matches(path, load(path, subset=[11, 0, 5]), [11, 0, 5])


def test_load_many_chunks(make_record: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_record([_mixed(i) for i in range(23)], schema=_VARIABLE)
    monkeypatch.setattr(load_module, "_chunk_size", lambda schema, count: 5)
    _assert_load_matches(path, load(path))
    rows = [22, 3, 3, 9, 0, 14]
    _assert_load_matches(path, load(path, subset=rows), rows)
    _assert_load_matches(path, load(path, subset=range(2, 7)), list(range(2, 7)))  # stops after the third chunk


def test_load_subsets(make_record: Callable[..., str]) -> None:
    path = make_record([_mixed(i) for i in range(20)], schema=_VARIABLE)
    full = load(path)
    cases: list[tuple[Any, list[int]]] = [
        (range(3, 11, 2), list(range(3, 11, 2))),
        (slice(None, None, 3), list(range(0, 20, 3))),
        (slice(-4, 100), list(range(16, 20))),
        ([5, -1, 2, 2], [5, 19, 2, 2]),
        (np.array([7, 0]), [7, 0]),
        (torch.tensor([19, 1]), [19, 1]),
        (np.arange(20) % 6 == 0, [0, 6, 12, 18]),
        ([], []),
    ]
    for subset, rows in cases:
        part = load(path, subset=subset)
        assert torch.equal(part["x"], full["x"][rows]), subset
        assert part["name"] == [full["name"][i] for i in rows]
        _assert_load_matches(path, part, rows)


def test_load_bad_subsets(make_record: Callable[..., str]) -> None:
    path = make_record([_mixed(i) for i in range(5)], schema=_VARIABLE)
    with pytest.raises(ValueError, match=r"subset index 5 \(position 1\) is out of range for 5 samples"):
        load(path, subset=[0, 5])
    with pytest.raises(ValueError, match="out of range"):
        load(path, subset=range(-6, 0))
    with pytest.raises(ValueError, match="1-D"):
        load(path, subset=[[0, 1]])
    with pytest.raises(ValueError, match="integer indices or booleans"):
        load(path, subset=[0.5])
    with pytest.raises(ValueError, match=r"one entry per sample \(5\), got 2"):
        load(path, subset=[True, False])


def test_load_chosen_fields(make_record: Callable[..., str]) -> None:
    path = make_record([_mixed(i) for i in range(9)], schema=_VARIABLE)
    full = load(path)
    part = load(path, fields=["meta.arr", "name", "x"])
    assert list(part) == ["x", "meta", "name"]  # the schema's order and nesting
    assert list(part["meta"]) == ["arr"]
    assert torch.equal(part["meta"]["arr"], full["meta"]["arr"]) and part["name"] == full["name"]
    assert list(load(path, fields="label")) == ["label"]
    tuple_path = make_record(IndexedImages(6))
    (labels,) = load(tuple_path, fields=["1"])
    assert labels.shape == (6,)
    with pytest.raises(ValueError, match=r"has no field 'meta'; its fields are \['x', 'half', 'meta.flags'"):
        load(path, fields=["meta"])
    with pytest.raises(ValueError, match="fields=None for all"):
        load(path, fields=[])


def test_load_puts_every_tensor_on_the_device(make_record: Callable[..., str]) -> None:
    """The meta device stands in for a GPU: nothing may stay behind on the CPU."""
    path = make_record([_mixed(i) for i in range(6)], schema=_VARIABLE)
    rf = RecordFile(path)
    for subset in (None, [4, 1]):
        loaded = load(path, device="meta", subset=subset)
        assert loaded["x"].device.type == "meta" and loaded["meta"]["flags"].device.type == "meta"
        assert len(loaded["tokens"]) == len(subset or range(6))
        assert all(t.device.type == "meta" for t in loaded["tokens"])
        assert loaded["name"] == [rf[i]["name"] for i in subset or range(6)]


def test_load_an_empty_set(make_record: Callable[..., str]) -> None:
    with pytest.warns(torchrecord.TorchRecordWarning, match="no samples"):
        path = make_record([])
    with pytest.raises(ValueError, match="holds no samples"):
        load(path)


def test_load_then_batch(make_record: Callable[..., str]) -> None:
    path = make_record([_mixed(i) for i in range(30)], schema=_VARIABLE)
    data = load(path)
    seen = []
    for batch in BatchIter(data, batch_size=7, seed=3):
        labels = batch["label"].tolist()
        assert batch["name"] == [f"n{i}" for i in labels]
        assert all(torch.equal(t, torch.arange(i % 5)) for t, i in zip(batch["tokens"], labels))
        assert torch.equal(batch["x"][:, 0], batch["label"].float())
        seen += labels
    assert_exactly_once(seen, 30)


def test_load_is_exported() -> None:
    for name in ("load", "BatchIter", "GroupBatchIter", "SampleList"):
        assert getattr(torchrecord, name) is getattr(memory_module, name)


def _fixed(i: int) -> dict[str, Any]:
    """A sample whose every field has a fixed shape (the fast path), bool and bfloat16 among them."""
    full = _mixed(i)
    return {k: full[k] for k in ("x", "half", "meta", "label", "score", "ok")}


@pytest.mark.parametrize("samples_per_record", [1, 3, 8])
@pytest.mark.parametrize("chunk", [4, 1000])
def test_load_reads_fixed_sets_straight_into_the_result(
    make_record: Callable[..., str], monkeypatch: pytest.MonkeyPatch, samples_per_record: int, chunk: int
) -> None:
    """The direct path (every row, fixed layout): chunks that start inside a record and span windows."""
    path = make_record([_fixed(i) for i in range(41)], samples_per_record=samples_per_record)
    monkeypatch.setattr(load_module, "_chunk_size", lambda schema, count: chunk)
    filled: list[int] = []
    original = load_module._fill_direct

    def spy(*args: Any) -> Any:
        result = original(*args)
        filled.append(result is not None)
        return result

    monkeypatch.setattr(load_module, "_fill_direct", spy)
    loaded = load(path)
    assert filled == [True]
    _assert_load_matches(path, loaded)
    assert loaded["half"].dtype == torch.bfloat16 and loaded["meta"]["flags"].dtype == torch.bool
    part = load(path, fields=["half", "ok"])
    assert torch.equal(part["half"].view(torch.int16), loaded["half"].view(torch.int16))
    assert torch.equal(part["ok"], loaded["ok"]) and list(part) == ["half", "ok"]
    on_meta = load(path, device="meta")
    assert on_meta["x"].device.type == "meta" and on_meta["x"].shape == (41, 3)


def test_load_direct_path_checks_bool_bytes(make_record: Callable[..., str]) -> None:
    """A stored bool byte other than 0 or 1 is a CorruptRecordError on the direct path too."""
    import lmdb

    from torchrecord._store import format as _format
    from torchrecord.errors import CorruptRecordError

    path = make_record([{"ok": torch.ones(16, dtype=torch.bool), "n": i} for i in range(5)], samples_per_record=1)
    env = lmdb.open(path, subdir=False, max_dbs=8, lock=False)
    with env.begin(write=True) as txn:
        db = env.open_db(_format.RECORDS_DB, txn=txn, create=False)
        key, value = next(iter(txn.cursor(db)))
        assert value.count(b"\x01" * 16) == 1
        txn.put(key, value.replace(b"\x01" * 16, b"\x01" * 15 + b"\x07"), db=db)
    env.close()
    with pytest.raises(CorruptRecordError, match="bool bytes other than 0 and 1"):
        load(path)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_copy_run_equals_a_fancy_gather(k: int) -> None:
    from torchrecord._store.fastread import _copy_run

    rng = np.random.default_rng(k)
    field = rng.integers(0, 256, (7, k, 3), dtype=np.uint8)
    flat = field.reshape(7 * k, 3)
    for first in range(7 * k):
        for n in range(1, 7 * k - first + 1):
            dst = np.zeros((n, 3), np.uint8)
            _copy_run(field, first, dst, k)
            assert np.array_equal(dst, flat[first : first + n]), (first, n)


def test_host_empty_gives_contiguous_cpu_tensors_of_any_dtype_and_shape() -> None:
    """load()'s CPU columns come from NumPy's allocator (huge pages): same tensors as torch.empty's."""
    from torchrecord._memory.load import host_empty

    for dtype in (torch.bool, torch.uint8, torch.bfloat16, torch.float16, torch.int64, torch.complex64):
        for shape in ((0,), (0, 3), (7,), (5, 3, 2)):
            t = host_empty(shape, dtype)
            assert (tuple(t.shape), t.dtype, t.device.type) == (shape, dtype, "cpu") and t.is_contiguous()
            t.fill_(1)
            assert bool((t == 1).all())


def test_loaded_columns_own_their_memory(tmp_path: Any) -> None:
    """The result outlives everything that made it (its NumPy buffers are kept by the tensors)."""
    import gc

    path = tmp_path / "own.tr"
    samples = [
        (torch.full((3, 8, 8), i, dtype=torch.uint8), torch.tensor(float(i), dtype=torch.bfloat16)) for i in range(50)
    ]
    torchrecord.write_record(samples, path, shuffle=False, progress=False)
    x, y = torchrecord.load(path)
    gc.collect()
    big = [torch.ones(1 << 20) for _ in range(8)]  # reuse freed memory, if any had been freed
    assert [int(v) for v in x[:, 0, 0, 0]] == list(range(50))
    assert y.tolist() == [float(i) for i in range(50)]
    del big


# -- resume: state_dict / load_state_dict --------------------------------------------------------


@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_iter_state_mid_epoch_gives_exactly_the_rest(drop_last: bool) -> None:
    rows = torch.arange(103)
    it = BatchIter((rows,), batch_size=10, seed=4, drop_last=drop_last)
    it.set_epoch(2)
    whole = [b[0].tolist() for b in it]
    stream = iter(it)
    head = [next(stream)[0].tolist() for _ in range(4)]
    state = json.loads(json.dumps(it.state_dict()))
    assert state["epoch"] == 2 and state["yielded"] == 4
    fresh = BatchIter((rows,), batch_size=10, seed=4, drop_last=drop_last)
    fresh.load_state_dict(state)
    rest = [b[0].tolist() for b in fresh]
    assert head + rest == whole and fresh.epoch == 2
    assert [b[0].tolist() for b in fresh] == whole  # the resume point is used once: the next pass is whole


def test_batch_iter_refuses_a_state_that_does_not_fit() -> None:
    it = BatchIter(torch.arange(50), batch_size=10, seed=1)
    state = it.state_dict()
    for other, match in (
        (BatchIter(torch.arange(50), batch_size=5, seed=1), "batch_size=10"),
        (BatchIter(torch.arange(50), batch_size=10, seed=2), "seed=1"),
        (BatchIter(torch.arange(60), batch_size=10, seed=1), "rows=50"),
    ):
        with pytest.raises(ValueError, match=match):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="upgrade torchrecord"):
        it.load_state_dict({**state, "version": 99})
    with pytest.raises(ValueError, match=r"not a torchrecord\.BatchIter state"):
        it.load_state_dict({**state, "kind": "torchrecord.GroupBatchIter"})
    with pytest.raises(ValueError, match="past the epoch"):
        it.load_state_dict({**state, "yielded": 6})


def test_group_batch_iter_state_mid_epoch_gives_exactly_the_rest() -> None:
    rows = torch.arange(40)
    groups = torch.tensor([0, 3, 5, 9, 10, 17, 20, 26, 33, 40])
    it = GroupBatchIter((rows,), groups, max_samples=8, seed=3)
    it.set_epoch(1)
    whole = [(b[0].tolist(), o.tolist()) for b, o in it]
    stream = iter(it)
    head = [next(stream) for _ in range(2)]
    state = json.loads(json.dumps(it.state_dict()))
    fresh = GroupBatchIter((rows,), groups, max_samples=8, seed=3)
    fresh.load_state_dict(state)
    rest = [(b[0].tolist(), o.tolist()) for b, o in fresh]
    assert [(b[0].tolist(), o.tolist()) for b, o in head] + rest == whole
    with pytest.raises(ValueError, match="groups_per_batch"):
        GroupBatchIter((rows,), groups, groups_per_batch=2, seed=3).load_state_dict(state)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("version", True),
        ("version", 0),
        ("epoch", 0.0),
        ("epoch", True),
        ("yielded", 2.0),
        ("rows", 50.0),
        ("surprise", 1),
    ],
)
def test_iterators_refuse_crafted_states_naming_the_field(field: str, value: Any) -> None:
    rows = torch.arange(50)
    for make in (
        lambda: BatchIter(rows, batch_size=10, seed=1),
        lambda: GroupBatchIter((rows,), torch.tensor([0, 10, 20, 50]), groups_per_batch=1, seed=1),
    ):
        state = make().state_dict()
        with pytest.raises(ResumeStateError, match=f"{field}="):
            make().load_state_dict({**state, field: value})
