"""The reader base's own rules, on real sets and real DataLoader workers (issues 37, 38 and 41).

A resume point is used by exactly one pass in every process that holds the dataset; options
that would do nothing are refused or warned about; a DataLoader that batches batches is refused
when it runs; ``shuffle=False`` is one fixed order on every reader; old and overflowing states
are refused with a message.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import torchrecord
from torchrecord import MixedDataset, RecordDataset, RecordLoader, write_record
from torchrecord.errors import ArgumentError, IgnoredOptionWarning, LoaderMismatchError, ResumeStateError

COUNT = 300


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("base") / "plain.tr"
    write_record([{"x": np.full(2, i, np.float32), "label": i} for i in range(COUNT)], path, seed=1, progress=False)
    return str(path)


def _labels(loader: Any) -> list[int]:
    out: list[int] = []
    for batch in loader:
        out += torch.as_tensor(batch["label"]).reshape(-1).tolist()
    return out


@pytest.mark.parametrize(
    ("context", "persistent"),
    # spawn with fresh workers every pass spawns six workers (41 s in CI): fork covers fresh workers, and
    # spawn with persistent workers the resume point crossing in the pickled dataset
    [("fork", False), ("fork", True), pytest.param("spawn", False, marks=pytest.mark.slow), ("spawn", True)],
)
def test_a_resume_point_is_used_by_one_pass_only_with_workers(plain: str, persistent: bool, context: str) -> None:
    ds = RecordDataset(plain, batch_size=16)
    ds.load_state_dict(ds.position_after(5, num_workers=2))
    loader = DataLoader(
        ds, batch_size=None, num_workers=2, persistent_workers=persistent, multiprocessing_context=context
    )
    passes = [len(_labels(loader)) for _ in range(3)]  # no set_epoch between the passes
    assert passes == [COUNT - 5 * 16, COUNT, COUNT]


def test_a_resume_point_is_used_by_one_pass_through_record_loader(plain: str) -> None:
    loader = RecordLoader(RecordDataset(plain, batch_size=16), num_workers=2)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    del it
    resumed = RecordLoader(RecordDataset(plain, batch_size=16), num_workers=2)
    resumed.load_state_dict(state)
    assert [len(_labels(resumed)) for _ in range(3)] == [COUNT - 80, COUNT, COUNT]


def test_the_main_process_and_its_workers_share_one_use(plain: str) -> None:
    ds = RecordDataset(plain, batch_size=10)
    ds.load_state_dict(ds.position_after(3, num_workers=1))
    assert len(_labels(DataLoader(ds, batch_size=None, num_workers=1))) == COUNT - 30
    assert len(_labels(ds)) == COUNT  # the workers used it: this process's own pass starts afresh


def test_batch_transform_without_batch_size_is_refused(plain: str) -> None:
    with pytest.raises(ArgumentError, match="batch_transform is for batch mode"):
        RecordDataset(plain, batch_transform=lambda b: b)


def test_drop_last_in_per_sample_mode_on_one_rank_warns(plain: str) -> None:
    with pytest.warns(IgnoredOptionWarning, match="on one rank it changes nothing"):
        RecordDataset(plain, drop_last=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RecordDataset(plain, drop_last=True, rank=0, world_size=2)  # it cuts over ranks there
        RecordDataset(plain, drop_last=True, batch_size=8)  # it drops the short batch there


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_that_batches_batches_is_refused_when_it_runs(plain: str, workers: int) -> None:
    loader = DataLoader(RecordDataset(plain, batch_size=8), num_workers=workers)  # the default batch_size=1
    with pytest.raises(LoaderMismatchError, match=r"DataLoader\(ds, batch_size=None\)"):
        next(iter(loader))


def test_shuffle_false_is_one_fixed_order_on_every_reader(plain: str, tmp_path: Path) -> None:
    other = tmp_path / "other.tr"
    write_record([{"x": np.full(2, -i, np.float32), "label": 1000 + i} for i in range(50)], other, progress=False)
    for make in (
        lambda: RecordDataset(plain, shuffle=False, batch_size=7),
        lambda: MixedDataset([plain], shuffle=False, batch_size=7),
        lambda: MixedDataset([plain, str(other)], shuffle=False, batch_size=7),
    ):
        ds = make()
        orders = []
        for epoch in range(3):
            ds.set_epoch(epoch)
            orders.append(_labels(ds))
        assert orders[0] == orders[1] == orders[2]
    mixed = MixedDataset([plain], shuffle=False, batch_size=7)
    assert _labels(mixed) == _labels(RecordDataset(plain, shuffle=False, batch_size=7))


def test_a_state_of_the_earlier_layout_is_refused_saying_so(plain: str) -> None:
    ds = RecordDataset(plain, batch_size=8)
    old = {"kind": "torchrecord.RecordDataset", "version": 1, "set_id": ds.file.set_id, "epoch": 0, "yielded": 3}
    with pytest.raises(ResumeStateError, match=r"version 1, saved by an older torchrecord.*start the epoch afresh"):
        ds.load_state_dict(old)


def test_an_overflowing_epoch_is_refused_with_a_torchrecord_error(plain: str) -> None:
    loader = RecordLoader(RecordDataset(plain, batch_size=8))
    state = loader.state_dict()
    state["position"]["epoch"] = 2**63
    with pytest.raises(ResumeStateError, match="epoch must be an integer from 0 to"):
        loader.load_state_dict(state)
    with pytest.raises(ArgumentError, match="epoch must be an integer from 0 to"):
        loader.reader_dataset.set_epoch(2**63)


def test_record_loader_takes_every_reader_and_sets_the_epoch(plain: str) -> None:
    for ds in (RecordDataset(plain, batch_size=8), MixedDataset([plain], batch_size=8)):
        loader = RecordLoader(ds, num_workers=2)
        loader.set_epoch(3)
        assert ds.epoch == 3
        assert sorted(_labels(loader)) == list(range(COUNT))
        assert torchrecord.loader_position(loader.state_dict())["epoch"] == 3
