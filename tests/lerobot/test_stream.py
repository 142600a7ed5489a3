"""LeRobotStreamDataset: LeRobotDataset's items on the reader contract, on sets converted from hand-made folders.

Every batch is ``default_collate`` of the drop-in's items for the indices the reader's plan
visits, in order; the camera frames of a window are read once. (The contract itself, workers,
RecordLoader and elastic resume included, is checked by tests/test_conformance.py.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from tests.lerobot.handmade import assert_same_item, write_dataset
from torchrecord import LeRobotDataset, LeRobotStreamDataset, RecordLoader
from torchrecord._read.ipc import HANDOVER_ENV
from torchrecord.convert import from_lerobot

LENGTHS = [7, 2, 12, 5, 9]
WINDOWS: dict[str, list[float]] = {
    "observation.images.top": [-0.1, 0.0],
    "observation.images.wrist": [0.2],
    "next.reward": [-0.1, 0.0, 0.1],
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("lerobot-stream")
    write_dataset(folder / "dataset", LENGTHS, rows_per_file=10)
    return str(from_lerobot(folder / "dataset", folder / "set.tr", progress=False).path)


def _assert_same_batch(ours: dict[str, Any], theirs: dict[str, Any], where: str) -> None:
    assert list(ours) == list(theirs), where
    for key, b in theirs.items():
        a = ours[key]
        if isinstance(b, list):
            assert a == b, f"{where}/{key}"
        else:
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), f"{where}/{key}"


@pytest.mark.parametrize("windows", [None, WINDOWS])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_items_and_batches_are_the_drop_ins_in_the_plans_order(
    converted: str, windows: Any, batch_size: int | None
) -> None:
    kw: dict[str, Any] = dict(delta_timestamps=windows, episodes=[0, 2, 3, 4])
    drop_in = LeRobotDataset(converted, **kw)
    ds = LeRobotStreamDataset(converted, batch_size=batch_size, shuffle_buffer=10, block_size=4, seed=2, **kw)
    ds.set_epoch(1)
    order = np.concatenate(ds.reader_items()).tolist()
    assert sorted(order) == list(range(len(drop_in)))  # every item once
    got = list(ds)
    if batch_size is None:
        assert len(got) == len(order)
        for item, i in zip(got, order):
            assert_same_item(item, drop_in[i], f"item {i}")
    else:
        chunks = [order[a : a + batch_size] for a in range(0, len(order), batch_size)]
        assert len(got) == len(chunks)
        for batch, chunk in zip(got, chunks):
            _assert_same_batch(batch, default_collate(drop_in.__getitems__(chunk)), f"batch of {chunk}")


def test_a_windows_frames_are_read_once(converted: str) -> None:
    one_window = LeRobotStreamDataset(converted, delta_timestamps=WINDOWS, batch_size=3, shuffle_buffer=1000)
    list(one_window)
    per_batch = LeRobotDataset(converted, delta_timestamps=WINDOWS)
    for chunk in np.array_split(np.arange(len(per_batch)), -(-len(per_batch) // 3)):
        per_batch.__getitems__(chunk.tolist())
    assert one_window.items.records_read < per_batch.records_read


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_and_the_record_loader_give_the_same_batches(converted: str, context: str) -> None:
    kw: dict[str, Any] = dict(delta_timestamps=WINDOWS, batch_size=4, shuffle_buffer=10, seed=5)
    plain = list(DataLoader(LeRobotStreamDataset(converted, **kw), batch_size=None, num_workers=2,
                            multiprocessing_context=context))  # fmt: skip
    loader = RecordLoader(LeRobotStreamDataset(converted, **kw), num_workers=2, multiprocessing_context=context)
    got = list(loader)
    assert len(got) == len(plain) == len(loader)
    for a, b in zip(got, plain):
        _assert_same_batch(a, b, "RecordLoader")
    assert sorted(int(x) for b in got for x in b["index"]) == list(range(sum(LENGTHS)))


def _items_by_index(batches: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for batch in batches:
        for i, index in enumerate(batch["index"].tolist()):
            out[index] = {key: value[i] for key, value in batch.items()}
    return out


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_batches_built_in_a_workers_slot_equal_those_built_in_this_process(
    converted: str, context: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With workers a plain batch is built straight in the slot it leaves in (the frames divided into it in one
    pass); its items equal, bit for bit, those read at 0 workers."""
    monkeypatch.setenv(HANDOVER_ENV, "slot")  # these batches are small: make them cross in slots anyway
    kw: dict[str, Any] = dict(delta_timestamps=WINDOWS, batch_size=4, shuffle_buffer=10, seed=5)
    here = _items_by_index(list(RecordLoader(LeRobotStreamDataset(converted, **kw), num_workers=0)))
    loader = RecordLoader(LeRobotStreamDataset(converted, **kw), num_workers=2, multiprocessing_context=context)
    there = _items_by_index(list(loader))
    assert sorted(there) == sorted(here) == list(range(sum(LENGTHS)))
    for index, item in here.items():
        assert list(there[index]) == list(item)
        for key, want in item.items():
            got = there[index][key]
            if isinstance(want, str):
                assert got == want, f"item {index}/{key}"
            else:
                assert got.dtype == want.dtype and torch.equal(got, want), f"item {index}/{key}"
