"""RecordDataset in real DataLoaders: fork, spawn and forkserver workers, persistent workers."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import torchrecord
from tests.conftest import IndexedImages
from tests.helpers import assert_exactly_once
from torchrecord import RecordDataset, RecordFile

COUNT = 157
CONTEXTS = ["fork", "spawn", "forkserver"]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("loader") / "images.tr"
    torchrecord.write_record(IndexedImages(COUNT), path, seed=4, progress=False)
    return str(path)


def label_plus_pixel(sample: tuple[torch.Tensor, int]) -> tuple[int, int, int]:
    """Module level, so spawn and forkserver workers can unpickle it."""
    image, label = sample
    return label, int(image[0, 0, 0]), os.getpid()


def _loader(ds: RecordDataset, context: str, **kw: Any) -> DataLoader[Any]:
    return DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context, **kw)


def _labels(loader: DataLoader[Any]) -> list[int]:
    return [int(item[1]) for item in loader]


@pytest.mark.parametrize("context", CONTEXTS)
def test_every_sample_once(images: str, context: str) -> None:
    ds = RecordDataset(images, shuffle_buffer=16, transform=label_plus_pixel)
    items = list(_loader(ds, context))
    assert len(items) == len(ds) == COUNT
    assert_exactly_once([label for label, _, _ in items], COUNT)
    assert all(pixel == label % 251 for label, pixel, _ in items)
    pids = {pid for _, _, pid in items}
    assert len(pids) == 2 and os.getpid() not in pids, "both workers should have read"


def test_batches_through_workers(images: str) -> None:
    ds = RecordDataset(images, batch_size=10, shuffle_buffer=16)
    batches = list(_loader(ds, "fork"))
    assert len(batches) == len(ds) == 16
    labels = [int(x) for _, ys in batches for x in ys]
    assert_exactly_once(labels, COUNT)
    assert sum(1 for _, ys in batches if len(ys) < 10) == 1


def _fresh_order(path: str, epoch: int) -> list[int]:
    ds = RecordDataset(path, shuffle_buffer=16)
    ds.set_epoch(epoch)
    return _labels(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_persistent_workers_follow_set_epoch(images: str, context: str) -> None:
    ds = RecordDataset(images, shuffle_buffer=16, transform=label_plus_pixel)
    loader = _loader(ds, context, persistent_workers=True)
    orders = []
    worker_pids = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        items = list(loader)
        orders.append([label for label, _, _ in items])
        worker_pids.append({pid for _, _, pid in items})
    assert len(worker_pids[0]) == 2
    assert worker_pids[0] == worker_pids[1] == worker_pids[2], "workers were not kept"
    for order in orders:
        assert_exactly_once(order, COUNT)
    assert len({tuple(o) for o in orders}) == 3, "the long-lived workers ignored set_epoch"
    for epoch, order in enumerate(orders):
        assert order == _fresh_order(images, epoch), f"epoch {epoch} differs from a fresh loader's"


def test_epoch_going_back_repeats_the_order(images: str) -> None:
    ds = RecordDataset(images, shuffle_buffer=16)
    loader = _loader(ds, "fork", persistent_workers=True)
    ds.set_epoch(5)
    first = _labels(loader)
    ds.set_epoch(6)
    _labels(loader)
    ds.set_epoch(5)
    assert _labels(loader) == first


def test_dataset_pickles_before_iteration(images: str) -> None:
    ds = RecordDataset(images, shuffle_buffer=16, seed=3, transform=label_plus_pixel)
    ds.set_epoch(2)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.epoch == 2
    assert [x[0] for x in clone] == [x[0] for x in ds]
    pickle.dumps(ds)  # still picklable after iterating in this process


_PROBE = textwrap.dedent(
    """
    import json, os, pickle, sys
    from torchrecord import RecordDataset

    path = os.path.realpath(sys.argv[1])

    def state():
        with open("/proc/self/maps") as f:
            mapped = any(line.rstrip().endswith(path) for line in f)
        fds = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds.append(os.readlink(os.path.join("/proc/self/fd", fd)))
            except OSError:
                pass
        return {"mapped": mapped, "open": path in fds}

    report = {"start": state()}
    ds = RecordDataset(sys.argv[1], shuffle_buffer=4)
    report["constructed"] = state()
    blob = pickle.dumps(ds)
    report["pickled"] = state()
    clone = pickle.loads(blob)
    report["unpickled"] = state()
    report["first"] = int(next(iter(clone))[1])
    report["iterated"] = state()
    print(json.dumps(report))
    """
)


def test_no_lmdb_handle_before_iteration(images: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, images], capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    closed = {"mapped": False, "open": False}
    assert report["start"] == closed
    assert report["constructed"] == closed, "RecordDataset() opened the record file"
    assert report["pickled"] == closed, "pickling opened the record file"
    assert report["unpickled"] == closed
    # the probe does see an open file: iteration maps it
    assert report["iterated"] == {"mapped": True, "open": True}
    assert 0 <= report["first"] < COUNT


def test_open_in_main_process_before_fork_workers(images: str) -> None:
    rf = RecordFile(images)
    ds = RecordDataset(images, shuffle_buffer=16)
    assert len(ds) == len(rf) == COUNT
    first = rf[0]
    partial = iter(ds)
    next(partial)  # an iteration left open in the parent while workers start
    labels = _labels(_loader(ds, "fork"))
    assert_exactly_once(labels, COUNT)
    # the parent's handles still work after the workers ran
    assert rf[0][1] == first[1]
    assert len(list(partial)) == COUNT - 1
    assert len(list(RecordDataset(images))) == COUNT


def test_written_and_read_in_one_process_then_forked(tmp_path: Path) -> None:
    path = tmp_path / "fresh.tr"
    rf = torchrecord.write_record(IndexedImages(40), path, progress=False)
    assert len(rf) == 40
    ds = RecordDataset(path)
    assert_exactly_once(_labels(_loader(ds, "fork")), 40)


_LEFT_OPEN = textwrap.dedent(
    """
    import sys
    import torchrecord
    from torch.utils.data import DataLoader

    path = sys.argv[1]
    iterators = [
        iter(torchrecord.RecordDataset(path, batch_size=8)),
        iter(torchrecord.RecordDataset(path)),
        iter(DataLoader(torchrecord.RecordDataset(path, batch_size=8), batch_size=None)),
        iter(torchrecord.MixedDataset([path, path], batch_size=8)),
        iter(torchrecord.RecordLoader(torchrecord.RecordDataset(path), batch_size=8, num_workers=1)),
    ]
    for it in iterators:
        next(it)
    print("left open")
    """
)


def test_an_iterator_left_open_at_exit_prints_nothing(images: str) -> None:
    # a user who takes one batch and exits (a REPL, a quick script) must not see a traceback from
    # the reader's clean-up running while the interpreter tears its modules down
    out = subprocess.run(
        [sys.executable, "-c", _LEFT_OPEN, images], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "left open"
    assert out.stderr == "", out.stderr
