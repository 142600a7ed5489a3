"""Subsets (RecordDataset and RecordFile), slices and index lists on RecordFile, __getitems__, strict indices."""

from __future__ import annotations

import json
import pickle
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import torchrecord
from tests.helpers import assert_exactly_once
from torchrecord import RecordDataset, RecordFile, loader_position

COUNT = 500


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Stored in source order, so a sample's label is its index; one plain set and one packed 4 per record."""
    out = {}
    for k in (1, 4):
        path = tmp_path_factory.mktemp("subset") / f"k{k}.tr"
        samples = [(torch.full((2,), i, dtype=torch.int64), i) for i in range(COUNT)]
        torchrecord.write_record(samples, path, shuffle=False, samples_per_record=k, progress=False)
        out[k] = str(path)
    return out


SELECTIONS: list[tuple[Any, list[int]]] = [
    (range(100, 220), list(range(100, 220))),
    (slice(None, None, 7), list(range(0, COUNT, 7))),
    (slice(-50, None), list(range(450, 500))),
    ([499, 3, 250, 4], [499, 3, 250, 4]),
    (np.array([10, 11, 12, 40, 41, -1]), [10, 11, 12, 40, 41, 499]),
    (torch.arange(0, 60, 3), list(range(0, 60, 3))),
    (np.arange(COUNT) % 3 == 0, list(range(0, COUNT, 3))),
    ([], []),
]


def _labels(items: Any) -> list[int]:
    return [int(label) for _, label in items]


# -- RecordFile -----------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize(("selection", "want"), SELECTIONS)
def test_record_file_subset(sets: dict[int, str], k: int, selection: Any, want: list[int]) -> None:
    rf = RecordFile(sets[k], subset=selection)
    assert len(rf) == len(want)
    assert _labels(rf) == want
    assert [int(rf[i][1]) for i in range(len(rf))] == want
    if want:
        assert int(rf[-1][1]) == want[-1]
        with pytest.raises(IndexError, match=f"out of range for {sets[k]}"):
            rf[len(want)]
    copy = pickle.loads(pickle.dumps(rf))
    assert len(copy) == len(want) and _labels(copy) == want


def test_record_file_slices_lists_and_getitems(sets: dict[int, str]) -> None:
    for k in (1, 4):
        rf = RecordFile(sets[k])
        assert _labels(rf[2:10]) == list(range(2, 10))
        assert _labels(rf[-3:]) == [497, 498, 499]
        assert _labels(rf[10:0:-3]) == [10, 7, 4, 1]
        assert _labels(rf[[1, 5, -1]]) == [1, 5, 499]
        assert _labels(rf[np.array([7, 3])]) == [7, 3]
        assert _labels(rf[torch.tensor([0, 2])]) == [0, 2]
        assert rf[[]] == [] and rf[5:5] == []
        twice = rf[[6, 6]]
        assert _labels(twice) == [6, 6] and twice[0][0] is not twice[1][0], "no shared tensors"
        assert _labels(rf.__getitems__([9, 1, 400])) == [9, 1, 400]
        with pytest.raises(IndexError, match="sample index 500 out of range"):
            rf[[1, 500]]
        sub = RecordFile(sets[k], subset=range(100, 200))
        assert _labels(sub[:3]) == [100, 101, 102] and _labels(sub[[0, -1]]) == [100, 199]


class CountingFile(RecordFile):
    """Counts the batch fetches a map-style DataLoader makes (num_workers=0: in this process)."""

    calls = 0

    def __getitems__(self, indices: Any) -> list[Any]:
        type(self).calls += 1
        return super().__getitems__(indices)


def test_map_style_dataloader_fetches_a_batch_in_one_call(sets: dict[int, str]) -> None:
    rf = CountingFile(sets[1], subset=range(0, 100))
    batches = list(DataLoader(rf, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0)))
    assert CountingFile.calls == len(batches) == 7
    assert sorted(int(x) for _, labels in batches for x in labels) == list(range(100))
    batches = list(DataLoader(RecordFile(sets[4]), batch_size=64, num_workers=2, multiprocessing_context="fork"))
    assert [int(x) for _, labels in batches for x in labels] == list(range(COUNT))


@pytest.mark.parametrize("index", [1.9, "3", True, np.bool_(False), torch.tensor(True), 2.0, None])
def test_record_file_refuses_non_integer_indices(sets: dict[int, str], index: Any) -> None:
    rf = RecordFile(sets[1])
    with pytest.raises(TypeError, match=r"not an integer|is a bool"):
        rf[index]
    assert int(rf[np.int64(3)][1]) == 3 and int(rf[torch.tensor(4)][1]) == 4


@pytest.mark.parametrize(
    ("selection", "error", "match"),
    [
        (range(490, 510), IndexError, "reaches outside"),
        ([1, 2, 600], IndexError, "subset index 600"),
        ([1, 2, 1], ValueError, "sample 1 more than once"),
        (np.array([0.5, 1.0]), TypeError, "float64 values"),
        (np.ones(3, bool), ValueError, "needs 500 entries"),
        ("0:10", TypeError, "not a selection"),
        (5, TypeError, "not a selection"),
        (np.zeros((2, 2), np.int64), TypeError, "shape"),
    ],
)
def test_bad_subsets(sets: dict[int, str], selection: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        RecordFile(sets[1], subset=selection)
    with pytest.raises(error, match=match):
        RecordDataset(sets[1], subset=selection)


# -- RecordDataset --------------------------------------------------------------------------------


def _read(ds: RecordDataset, workers: int, batch: int | None = None) -> list[int]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*suggested max number of worker", category=UserWarning)
        kw: dict[str, Any] = {"multiprocessing_context": "fork"} if workers else {}
        loader = DataLoader(ds, batch_size=batch, num_workers=workers, **kw)
        out: list[int] = []
        for _, labels in loader:
            out.extend(int(x) for x in (labels if isinstance(labels, torch.Tensor) else [labels]))
        return out


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("workers", [0, 3])
@pytest.mark.parametrize("world", [1, 2])
def test_dataset_reads_the_subset_once(sets: dict[int, str], k: int, workers: int, world: int) -> None:
    for selection, want in SELECTIONS[:5]:
        seen: list[int] = []
        for rank in range(world):
            ds = RecordDataset(sets[k], subset=selection, shuffle_buffer=16, rank=rank, world_size=world)
            assert len(ds) == -(-len(want) // world)
            mine = _read(ds, workers)
            assert len(mine) == len(ds)
            seen.extend(mine)
        pad = -(-len(want) // world) * world - len(want)
        assert set(seen) == set(want)
        assert_exactly_once([want.index(x) for x in seen], len(want), pad=pad)


def test_dataset_subset_batches_and_shuffle(sets: dict[int, str]) -> None:
    ds = RecordDataset(sets[1], subset=range(0, 300), batch_size=32, drop_last=True)
    batches = list(ds)
    assert len(batches) == len(ds) == 9
    labels = [int(x) for _, ys in batches for x in ys]
    assert len(set(labels)) == 288 and max(labels) < 300
    assert labels != sorted(labels), "shuffled within the subset"
    ds.set_epoch(1)
    assert [int(x) for _, ys in ds for x in ys] != labels
    empty = RecordDataset(sets[1], subset=[])
    assert len(empty) == 0 and list(empty) == []


def test_dataset_subset_split_is_disjoint(sets: dict[int, str]) -> None:
    order = np.random.default_rng(0).permutation(COUNT)
    train = RecordDataset(sets[4], subset=order[:400])
    val = RecordDataset(sets[4], subset=order[400:])
    a, b = _read(train, 2), _read(val, 0)
    assert sorted(a + b) == list(range(COUNT)) and len(a) == 400
    assert "subset=100 indices" in repr(val)


def test_resume_within_a_subset(sets: dict[int, str]) -> None:
    kw: dict[str, Any] = dict(subset=slice(1, None, 2), shuffle_buffer=32)
    full = _stateful_epoch(RecordDataset(sets[1], **kw), 2)
    ds = RecordDataset(sets[1], **kw)
    loader = _stateful(ds, 2)
    before: list[list[int]] = []
    for step, (_, labels) in enumerate(loader):
        before.append([int(x) for x in labels])
        if step == 5:
            state = json.loads(json.dumps(loader.state_dict()))
            break
    # same configuration: exactly the rest
    again = _stateful(RecordDataset(sets[1], **kw), 2)
    again.load_state_dict(state)
    assert before + [[int(x) for x in labels] for _, labels in again] == full
    # elastic, over 3 workers: every odd sample not yet seen, once
    ds3 = RecordDataset(sets[1], **kw)
    ds3.load_state_dict(loader_position(state))
    rest = _read(ds3, 3)
    seen = [x for b in before for x in b]
    assert sorted(seen + rest) == list(range(1, COUNT, 2))
    # another subset (or none) refuses the state
    for other in ({"subset": slice(0, None, 2)}, {}):
        with pytest.raises(ValueError, match="subset"):
            RecordDataset(sets[1], **other).load_state_dict(loader_position(state))
    plain_state = RecordDataset(sets[1]).state_dict()
    with pytest.raises(ValueError, match="the whole set"):
        RecordDataset(sets[1], **kw).load_state_dict(plain_state)


def test_equal_selections_have_equal_digests(sets: dict[int, str]) -> None:
    a = RecordDataset(sets[1], subset=range(0, 10, 3)).state_dict()["plan"]["subset"]
    b = RecordDataset(sets[1], subset=[0, 3, 6, 9]).state_dict()["plan"]["subset"]
    c = RecordDataset(sets[1], subset=slice(0, 10, 3)).state_dict()["plan"]["subset"]
    d = RecordDataset(sets[1], subset=[0, 3, 9, 6]).state_dict()["plan"]["subset"]
    assert a == b == c != d
    assert RecordDataset(sets[1]).state_dict()["plan"]["subset"] is None


def _stateful(ds: RecordDataset, workers: int) -> StatefulDataLoader:
    return StatefulDataLoader(ds, batch_size=16, num_workers=workers, multiprocessing_context="fork")


def _stateful_epoch(ds: RecordDataset, workers: int) -> list[list[int]]:
    return [[int(x) for x in labels] for _, labels in _stateful(ds, workers)]


@pytest.mark.slow
def test_subset_in_spawn_workers(sets: dict[int, str]) -> None:
    ds = RecordDataset(sets[4], subset=np.arange(0, COUNT, 5))
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert sorted(int(label) for _, label in loader) == list(range(0, COUNT, 5))


def test_repr_says_what_the_dataset_reads(sets: dict[int, str]) -> None:
    ds = RecordDataset(sets[1], subset=range(10, 20), batch_size=4, transform=repr, rank=1, world_size=2)
    text = repr(ds)
    assert text.startswith(f"RecordDataset({sets[1]!r}, 10 samples, subset=range(10, 20), batch_size=4")
    assert "shuffle=True, seed=0, epoch=0" in text and "rank 1 of 2" in text and "transform=repr" in text
    plain = f"RecordDataset({sets[1]!r}, 500 samples, per-sample, shuffle=True, seed=0, epoch=0)"
    assert repr(RecordDataset(sets[1])) == plain
