"""len(loader) in per-sample mode: the batches a DataLoader yields equal len(loader), or we say so up front."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import torchrecord
from tests.helpers import assert_exactly_once
from torchrecord import RecordDataset
from torchrecord._order import partition as P

COUNT = 1437  # the count of scikit-learn's digits training split: divides by nothing useful


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("len") / "digits.tr"
    samples = [(torch.full((4,), i % 17, dtype=torch.float32), i) for i in range(COUNT)]
    torchrecord.write_record(samples, path, seed=1, progress=False)
    return str(path)


def _loader(ds: RecordDataset, batch: int, workers: int, **kw: Any) -> DataLoader[Any]:
    if workers:
        kw.setdefault("multiprocessing_context", "fork")
    return DataLoader(ds, batch_size=batch, num_workers=workers, **kw)


def _batches(loader: DataLoader[Any]) -> list[list[int]]:
    with warnings.catch_warnings():  # 3 workers on a 2-core machine: DataLoader suggests fewer
        warnings.filterwarnings("ignore", message=".*suggested max number of worker", category=UserWarning)
        return [[int(x) for x in labels] for _, labels in loader]


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_power_of_two_batch_gives_len_loader_batches(digits: str, workers: int, drop_last: bool) -> None:
    """The issue's case: 1,437 samples, batch 32, workers 0 to 3, without any extra argument."""
    ds = RecordDataset(digits, shuffle_buffer=64)
    loader = _loader(ds, 32, workers, drop_last=drop_last)
    promised = len(loader)
    batches = _batches(loader)
    assert len(batches) == promised == (COUNT // 32 if drop_last else -(-COUNT // 32))
    assert sum(len(b) < 32 for b in batches) == (0 if drop_last else 1)
    if not drop_last:
        assert_exactly_once([x for b in batches for x in b], COUNT)
    assert ds.check_loader(loader) == promised


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("batch", [32, 50])
def test_loader_batch_size_cuts_on_any_batch(digits: str, workers: int, batch: int) -> None:
    ds = RecordDataset(digits, shuffle_buffer=64, loader_batch_size=batch)
    loader = _loader(ds, batch, workers)
    batches = _batches(loader)
    assert len(batches) == len(loader) == -(-COUNT // batch)
    assert_exactly_once([x for b in batches for x in b], COUNT)


def test_one_cycle_schedule_sized_by_len_loader(digits: str) -> None:
    """OneCycleLR(total_steps=epochs * len(loader)) steps exactly once per batch, no more."""
    ds = RecordDataset(digits, shuffle_buffer=64, loader_batch_size=50)
    loader = _loader(ds, 50, 2)
    epochs = 2
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=epochs * len(loader))
    steps = 0
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for _ in _batches(loader):
            opt.step()
            sched.step()  # raises "Tried to step N times" past total_steps
            steps += 1
    assert steps == epochs * len(loader)


def test_a_batch_size_that_does_not_fit_warns_at_len_loader(digits: str) -> None:
    ds = RecordDataset(digits, shuffle_buffer=64)
    loader = _loader(ds, 50, 2)
    with pytest.warns(UserWarning, match=r"loader_batch_size=50") as caught:
        promised = len(loader)
    message = str(caught[0].message)
    assert digits in message and "len(loader) is 29" in message
    assert len(_batches(loader)) == 30 != promised  # what the warning announced
    with pytest.raises(ValueError, match=r"loader_batch_size=50"):
        ds.check_loader(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(ds) == COUNT  # a plain len() is not a loader's: no warning
        assert len(_loader(ds, 32, 2)) == 45  # a batch that fits: no warning


def test_check_loader_refuses_batching_batches_and_other_datasets(digits: str) -> None:
    ds = RecordDataset(digits, batch_size=32)
    assert ds.check_loader(DataLoader(ds, batch_size=None)) == len(ds)
    with pytest.raises(ValueError, match="batch_size=None"):
        ds.check_loader(DataLoader(ds, batch_size=4))
    with pytest.raises(ValueError, match="another object"):
        ds.check_loader(DataLoader(RecordDataset(digits), batch_size=4))
    with pytest.raises(ValueError, match="per-sample mode"):
        RecordDataset(digits, batch_size=32, loader_batch_size=32)
    with pytest.raises(ValueError, match="loader_batch_size"):
        RecordDataset(digits, loader_batch_size=0)


def test_position_after_uses_the_loader_batch_size(digits: str) -> None:
    """A plain DataLoader resumed mid-epoch with a batch that needs loader_batch_size."""
    ds = RecordDataset(digits, shuffle_buffer=64, loader_batch_size=50)
    full = _batches(_loader(ds, 50, 3))
    for step in (0, 7, 29):
        ds2 = RecordDataset(digits, shuffle_buffer=64, loader_batch_size=50)
        ds2.load_state_dict(ds2.position_after(step, num_workers=3))
        assert full[:step] + _batches(_loader(ds2, 50, 3)) == full, step


def test_worker_unit() -> None:
    assert P.worker_unit(1437, 2, None) == 256  # 1437 // 4 = 359
    assert P.worker_unit(1437, 3, None) == 128
    assert P.worker_unit(10**9, 4, None) == 4096
    assert P.worker_unit(3, 2, None) == 1
    assert P.worker_unit(1437, 2, None, 50) == 50
    assert P.worker_unit(1437, 2, 64, None) == 64  # batch mode: the batch


@pytest.mark.parametrize("per_rank", [1, 7, 100, 1437, 5000, 70_001])
def test_loader_batches_matches_len_for_dividing_batches(per_rank: int) -> None:
    for workers in range(0, 5):
        unit = P.worker_unit(per_rank, max(1, workers), None)
        for batch in (1, 2, 4, 8, 16, 32, 64):
            if unit % batch:
                continue
            for drop in (False, True):
                want = per_rank // batch if drop else -(-per_rank // batch)
                assert P.loader_batches(per_rank, workers, unit, batch, drop) == want
        for batch in (3, 50, 100):  # an exact unit fits any batch
            assert P.loader_batches(per_rank, workers, batch, batch, False) == -(-per_rank // batch)
