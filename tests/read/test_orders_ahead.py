"""Window orders made ahead on a helper thread: the same orders, errors met in their turn, no thread left.

The helper only changes when an order is made. Every test compares what a reader
gives with the helper forced on (``AHEAD_SAMPLES`` lowered) against the helper off,
on real record sets.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import torchrecord
from tests.conftest import IndexedImages
from torchrecord import RecordDataset, RecordLoader
from torchrecord._read import orders_ahead
from torchrecord._read.orders_ahead import OrdersAhead, orders_ahead_pay


def _helpers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "torchrecord-orders"]


def _labels(batches: list[Any]) -> list[int]:
    return [int(i) for _, labels in batches for i in labels]


@pytest.fixture
def image_set(tmp_path: Path) -> Path:
    path = tmp_path / "images.tr"
    torchrecord.write_record(IndexedImages(2000, 4), path, progress=False, samples_per_record=7)
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_orders_made_ahead_give_every_epoch_the_same_batches(
    image_set: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    settings = {"batch_size": 8, "shuffle_buffer": 24, "seed": 11}

    def epochs() -> list[list[int]]:
        ds = RecordDataset(image_set, **settings)
        loader = RecordLoader(ds, num_workers=workers)
        out = []
        for epoch in range(3):
            ds.set_epoch(epoch)
            out.append(_labels(list(loader)))
        return out

    monkeypatch.setattr(orders_ahead, "AHEAD_SAMPLES", 10**9)
    without = epochs()
    monkeypatch.setattr(orders_ahead, "AHEAD_SAMPLES", 0)
    monkeypatch.setattr(orders_ahead.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    made = []
    real = OrdersAhead.__init__

    def counting(self: OrdersAhead, *args: Any) -> None:
        made.append(1)
        real(self, *args)

    monkeypatch.setattr(OrdersAhead, "__init__", counting)
    with_helper = epochs()
    assert with_helper == without
    assert sorted(with_helper[0]) == list(range(2000))
    assert with_helper[0] != with_helper[1]  # each epoch has its own order
    if workers == 0:
        assert len(made) == 3  # the helper ran (in this process; workers count in their own)
    assert not _helpers()


def test_a_pass_cut_short_stops_its_helper(image_set: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(orders_ahead, "AHEAD_SAMPLES", 0)
    monkeypatch.setattr(orders_ahead.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    ds = RecordDataset(image_set, batch_size=8, shuffle_buffer=16, seed=1)
    it = iter(ds)
    first = next(it)
    assert _helpers()  # 2,000 samples in windows of 16 (8 groups): the helper waits ahead of the reader
    it.close()  # the generator's finally stops and joins it
    assert not _helpers()
    assert first[0].shape == (8, 3, 4, 4)


def test_the_helper_makes_each_order_as_make_does_and_at_most_two_ahead() -> None:
    asked: list[int] = []

    def make(g: int) -> np.ndarray:
        asked.append(g)
        return np.arange(g, g + 4)

    ahead = OrdersAhead(make, 6)
    try:
        assert np.array_equal(ahead(0), np.arange(0, 4))
        threading.Event().wait(0.2)  # time for the helper to run as far ahead as it may
        assert max(asked) <= orders_ahead.AHEAD  # group 0 taken: groups up to 0 + AHEAD made, no further
        for g in range(1, 6):
            assert np.array_equal(ahead(g), np.arange(g, g + 4))
    finally:
        ahead.close()
    assert sorted(asked) == list(range(6))


def test_an_error_making_an_order_is_raised_where_that_order_is_taken() -> None:
    def make(g: int) -> np.ndarray:
        if g == 2:
            raise ValueError("order 2 failed")
        return np.arange(3)

    ahead = OrdersAhead(make, 4)
    try:
        assert len(ahead(0)) == 3 and len(ahead(1)) == 3
        with pytest.raises(ValueError, match="order 2 failed"):
            ahead(2)
        assert len(ahead(3)) == 3  # made in the reading thread once the helper has stopped
    finally:
        ahead.close()


def test_the_helper_needs_small_samples_enough_of_them_and_a_spare_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(orders_ahead.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert not orders_ahead_pay(10**7, 72)
    monkeypatch.setattr(orders_ahead.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert orders_ahead_pay(orders_ahead.AHEAD_SAMPLES, 72)
    assert not orders_ahead_pay(orders_ahead.AHEAD_SAMPLES - 1, 72)
    assert not orders_ahead_pay(10**7, orders_ahead.AHEAD_SAMPLE_BYTES + 1)


class _PayInWorkers(torch.utils.data.IterableDataset[bool]):
    def __iter__(self) -> Any:
        yield orders_ahead_pay(10**7, 72)


@pytest.mark.parametrize(("cpus", "pays"), [(2, False), (3, False), (4, True)])
def test_in_a_dataloader_worker_the_spare_cpu_is_one_beyond_the_workers_and_the_main_process(
    monkeypatch: pytest.MonkeyPatch, cpus: int, pays: bool
) -> None:
    monkeypatch.setattr(orders_ahead.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    loader = torch.utils.data.DataLoader(
        _PayInWorkers(), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    assert list(loader) == [pays, pays]  # 2 workers and the main process: 3 busy processes


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_fork_waits_for_a_helper_making_an_order() -> None:
    started, finished = threading.Event(), threading.Event()

    def make(g: int) -> np.ndarray:
        started.set()
        threading.Event().wait(0.3)  # still making an order when the fork comes
        finished.set()
        return np.arange(2)

    ahead = OrdersAhead(make, 1)
    started.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: the fork waited until the helper had finished its order
        os._exit(0 if finished.is_set() else 1)
    _, status = os.waitpid(pid, 0)
    ahead.close()
    assert os.waitstatus_to_exitcode(status) == 0


_FORK_FROM_THE_READER = """
import os, threading, time
import numpy as np
from torchrecord._read.orders_ahead import AHEAD, OrdersAhead

made = []
def make(g):
    made.append(g)
    return np.arange(g, g + 3)

ahead = OrdersAhead(make, 10)
assert list(ahead(0)) == [0, 1, 2]
deadline = time.monotonic() + 5
while len(made) < 1 + AHEAD and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.1)  # the helper now waits for this thread to take the next order
pid = os.fork()  # from the reader's own thread
if pid == 0:  # the child reads with a helper of its own
    child = OrdersAhead(lambda g: np.arange(g, g + 3), 4)
    ok = [list(child(g)) for g in range(4)] == [[g, g + 1, g + 2] for g in range(4)]
    child.close()
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
assert [list(ahead(g)) for g in range(1, 10)] == [[g, g + 1, g + 2] for g in range(1, 10)]
ahead.close()
assert sorted(made) == list(range(10))
print("ok")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_fork_from_the_readers_thread_stops_a_waiting_helper_and_the_reader_goes_on() -> None:
    """The helper waits for its reader to catch up; the reader's own thread forks (a DataLoader with workers
    started inside the loop): the fork stops the helper rather than wait for it forever, and the reader makes
    the rest of the orders itself. In a subprocess, so that a hang fails the test instead of stopping it."""
    done = subprocess.run(
        [sys.executable, "-c", _FORK_FROM_THE_READER], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
