"""The per-window order: any window rebuilt alone, the same order on both read paths."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers import assert_exactly_once
from torchrecord import RecordDataset, write_record, write_shard
from torchrecord._order.windows import slice_runs, window_order, window_runs, window_size
from torchrecord._read import reader as reader_module
from torchrecord._read.reader import ShareReader, split_runs

COUNT = 1_003


def _labelled(n: int) -> list[tuple[torch.Tensor, int]]:
    return [(torch.full((2, 3), i % 200, dtype=torch.int16), i) for i in range(n)]


def _labels(items: Any, batched: bool) -> list[int]:
    if batched:
        return [int(x) for _, labels in items for x in labels]
    return [int(label) for _, label in items]


def _generic(ds: RecordDataset) -> RecordDataset:
    ds._force_generic = True
    return ds


def test_window_order_is_a_pure_function() -> None:
    a = window_order(100, seed=3, epoch=1, rank=0, worker=2, window=5)
    assert sorted(a.tolist()) == list(range(100))
    assert np.array_equal(a, window_order(100, seed=3, epoch=1, rank=0, worker=2, window=5))
    for other in (dict(seed=4), dict(epoch=2), dict(rank=1), dict(worker=3), dict(window=6)):
        kw: dict[str, int] = dict(seed=3, epoch=1, rank=0, worker=2, window=5)
        kw.update(other)
        assert not np.array_equal(a, window_order(100, **kw)), other


@pytest.mark.parametrize(
    ("seed", "epoch", "window"),
    [(0, 0, 0), (3, 1, 5), (-1, 7, 2), (2**32, 2**32 + 5, 2**33), (2**64 - 1, 0, 1), (-(2**70) + 3, 12, 0)],
)
def test_window_order_is_the_generator_of_its_entropy_list(seed: int, epoch: int, window: int) -> None:
    """The order is ``default_rng(SeedSequence([...]))``'s permutation, as it always was (resumed epochs depend
    on it), however the entropy is handed to SeedSequence: values of one word, of several, and 0."""
    entropy = [seed & 0xFFFFFFFFFFFFFFFF, epoch, 1, 2, window, 0x77696E64]
    want = np.random.default_rng(np.random.SeedSequence(entropy)).permutation(300)
    got = window_order(300, seed=seed, epoch=epoch, rank=1, worker=2, window=window)
    assert np.array_equal(got, want)


def test_slice_runs_cuts_the_virtual_sequence() -> None:
    runs = [(10, 20), (50, 55), (0, 3)]
    flat = [i for a, b in runs for i in range(a, b)]
    for lo in range(0, len(flat) + 1):
        for hi in range(lo, len(flat) + 2):
            got = [i for a, b in slice_runs(runs, lo, hi) for i in range(a, b)]
            assert got == flat[lo:hi]


def test_window_runs_are_slice_runs_of_every_window() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        lengths = rng.integers(0, 9, size=int(rng.integers(0, 12))).tolist()
        starts = rng.integers(0, 1000, size=len(lengths)).tolist()
        runs = [(a, a + n) for a, n in zip(starts, lengths)]
        total = sum(lengths)
        window = int(rng.integers(1, 10))
        windows = -(-total // window)
        for first in range(windows + 1):
            expected = [slice_runs(runs, j * window, min(total, (j + 1) * window)) for j in range(first, windows)]
            got = window_runs(runs, window, first)
            # the same positions window by window (slice_runs may also keep an empty run)
            assert [[(a, b) for a, b in w if b > a] for w in got] == [[(a, b) for a, b in w if b > a] for w in expected]
            assert len(got) == len(expected)


def test_window_size_holds_a_batch_and_respects_the_byte_cap() -> None:
    assert window_size(8192, 256, 3_000) == 8192
    assert window_size(8192, 256, 150_000) == 447  # 64 MiB of 150 KB samples
    assert window_size(8192, 1024, 150_000) == 1024  # never below one batch
    assert window_size(0, 256, None) == 256


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("batch_size", [None, 32])
@pytest.mark.parametrize("shuffle", [True, False])
def test_fast_and_generic_paths_give_the_same_order(
    make_record: Callable[..., str], k: int, batch_size: int | None, shuffle: bool
) -> None:
    path = make_record(_labelled(COUNT), samples_per_record=k)
    for epoch in (0, 1):
        kw: dict[str, Any] = dict(shuffle=shuffle, shuffle_buffer=100, batch_size=batch_size, seed=7)
        fast = RecordDataset(path, **kw)
        slow = _generic(RecordDataset(path, **kw))
        fast.set_epoch(epoch)
        slow.set_epoch(epoch)
        fast_items, slow_items = list(fast), list(slow)
        assert _labels(fast_items, batch_size is not None) == _labels(slow_items, batch_size is not None)
        assert_exactly_once(_labels(fast_items, batch_size is not None), COUNT)
        if batch_size is not None:
            for (a_img, a_lab), (b_img, b_lab) in zip(fast_items, slow_items):
                assert torch.equal(a_img, b_img) and torch.equal(a_lab, b_lab)


def test_same_order_on_both_paths_over_ranks_and_workers(make_record: Callable[..., str]) -> None:
    path = make_record(_labelled(COUNT))
    everything: list[int] = []
    for rank in range(2):
        for worker in range(3):
            fast = RecordDataset(path, shuffle_buffer=64, rank=rank, world_size=2)
            slow = _generic(RecordDataset(path, shuffle_buffer=64, rank=rank, world_size=2))
            a = _read_share(fast, worker, 3)
            assert a == _read_share(slow, worker, 3)
            everything += a
    assert_exactly_once(everything, COUNT, pad=1)


def _read_share(ds: RecordDataset, worker: int, workers: int, start: int = 0) -> list[int]:
    layout = None if ds._force_generic else ds._fixed_layout()
    reader = ShareReader(ds.file, ds.share(worker, workers), layout=layout)
    labels: list[int] = []
    for chunk in reader.chunks(50, start):
        labels += chunk[1].reshape(-1).tolist() if reader.fixed else [label for _, label in chunk]
    return labels


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("k", [1, 4])
def test_any_position_is_rebuilt_from_its_window_alone(make_record: Callable[..., str], generic: bool, k: int) -> None:
    path = make_record(_labelled(COUNT), samples_per_record=k)
    ds = RecordDataset(path, shuffle_buffer=100)
    ds._force_generic = generic
    share = ds.share()
    full = _read_share(ds, 0, 1)
    layout = None if generic else ds._fixed_layout()
    for start in (0, 1, 99, 100, 101, 550, COUNT - 1, COUNT):
        reader = ShareReader(ds.file, share, layout=layout)
        got: list[int] = []
        for chunk in reader.chunks(50, start):
            got += chunk[1].reshape(-1).tolist() if reader.fixed else [label for _, label in chunk]
        assert got == full[start:], start
        # only the windows from the start's on are read: at most one window before the rest
        window = share.window
        first = start // window * window
        assert reader.records_read <= -(-(COUNT - first) // k) + len(share.runs) + 2


def test_resume_near_the_end_reads_one_window(make_record: Callable[..., str]) -> None:
    path = make_record(_labelled(COUNT), samples_per_record=1)  # counts records read
    ds = RecordDataset(path, shuffle_buffer=128)
    share = ds.share()
    assert share.window == 256  # at least the internal batch of per-sample mode
    reader = ShareReader(ds.file, share, layout=ds._fixed_layout())
    tail = [c for c in reader.chunks(10, COUNT - 5)]
    assert sum(len(c[1]) for c in tail) == 5
    assert reader.records_read == COUNT - COUNT // 256 * 256  # the last window, nothing before it


def test_shuffle_is_not_just_local_jitter(make_record: Callable[..., str]) -> None:
    path = make_record(_labelled(COUNT), shuffle=False)
    a = [label for _, label in RecordDataset(path, shuffle_buffer=64)]
    ds = RecordDataset(path, shuffle_buffer=64)
    ds.set_epoch(1)
    b = [label for _, label in ds]
    assert a != b
    assert_exactly_once(a, COUNT)
    assert_exactly_once(b, COUNT)
    # far from the stored order: the first 10% of reads touch most of the file
    assert len({x * 10 // COUNT for x in a[: COUNT // 10]}) >= 6


def _chunks(ds: RecordDataset, start: int, size: int, worker: int = 0, workers: int = 1) -> list[np.ndarray]:
    reader = ShareReader(ds.file, ds.share(worker, workers), layout=ds._fixed_layout(), verify=True)
    return [
        np.concatenate([column.reshape(len(column), -1).view(np.uint8) for column in chunk], axis=1)
        for chunk in reader.chunks(size, start)
    ]


def test_windows_gathered_from_the_map_are_read_in_larger_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows whose samples are gathered straight from LMDB's map (records of 16 KiB or more) are grouped up to
    MAPPED_GROUP_BYTES, more than GROUP_BYTES allows, and give the same chunks, checksums checked, as one
    window at a time."""
    samples = [(torch.full((1024,), i % 251, dtype=torch.int16), i) for i in range(600)]  # 2 KiB images
    path = tmp_path / "mapped.tr"
    write_record(samples, path, seed=1, progress=False, samples_per_record=10)  # records of about 20 KiB
    ds = RecordDataset(path, shuffle_buffer=100, seed=9, batch_size=8)  # windows of 100 samples, 205 KB
    ds.set_epoch(1)
    layout = ds._fixed_layout()
    assert layout is not None and reader_module.gathers_from_map(layout)
    reader = ShareReader(ds.file, ds.share(), layout=layout)
    window_bytes = 100 * layout.length // layout.rows
    assert reader_module.GROUP_BYTES // window_bytes < 6 == len(window_runs(ds.share().runs, 100))
    plans = [split_runs(runs, ds.file.shard_offsets) for runs in window_runs(ds.share().runs, 100)]
    assert reader._groups(plans) == [(0, 6)]  # all six windows in one group
    cases = [(start, size) for start in (0, 1, 99, 100, 350, 599) for size in (7, 64)]
    grouped = {case: _chunks(ds, *case) for case in cases}
    monkeypatch.setattr(reader_module, "MAPPED_GROUP_BYTES", 0)  # one window a group
    assert ShareReader(ds.file, ds.share(), layout=layout)._groups(plans) == [(i, i + 1) for i in range(6)]
    for case, chunks in grouped.items():
        alone = _chunks(ds, *case)
        assert len(chunks) == len(alone), case
        for got, want in zip(chunks, alone):
            assert np.array_equal(got, want), case


def test_a_window_holding_a_short_last_record_is_read_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Of windows gathered from the map, the one holding the set's short last record (fewer samples than the
    others, which a second pass cannot look up in the address books) is a group of its own: the windows
    around it stay grouped and looked up. The chunks are the same as one window at a time."""
    samples = [(torch.full((1024,), i % 251, dtype=torch.int16), i) for i in range(605)]  # 60 records and 5
    path = tmp_path / "tail.tr"
    write_record(samples, path, seed=1, progress=False, samples_per_record=10)
    ds = RecordDataset(path, shuffle_buffer=100, seed=9, batch_size=8)
    ds.set_epoch(1)
    layout = ds._fixed_layout()
    assert layout is not None and reader_module.gathers_from_map(layout)
    plans = [split_runs(runs, ds.file.shard_offsets) for runs in window_runs(ds.share().runs, 100)]
    tail = [w for w, pieces in enumerate(plans) if any(b == 605 for _, _, b in pieces)]
    assert len(tail) == 1 and len(plans) == 7
    groups = ShareReader(ds.file, ds.share(), layout=layout)._groups(plans)
    assert (tail[0], tail[0] + 1) in groups and [a for a, _ in groups] == sorted({a for a, _ in groups})
    assert groups[-1][1] == 7 and len(groups) <= 3  # the windows before it and after it, grouped
    cases = [(start, size) for start in (0, 99, 300, 604) for size in (7, 64)]
    grouped = {case: _chunks(ds, *case) for case in cases}
    monkeypatch.setattr(reader_module, "MAPPED_GROUP_BYTES", 0)  # one window a group
    for case, chunks in grouped.items():
        alone = _chunks(ds, *case)
        assert len(chunks) == len(alone) and all(np.array_equal(g, w) for g, w in zip(chunks, alone)), case


@pytest.mark.parametrize("sharded", [False, True])
def test_windows_read_together_give_what_windows_read_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sharded: bool
) -> None:
    """Small windows of the fixed path are read in groups (one walk, one check, one gather a field for several
    windows), each still permuted on its own: the same chunks, from any start, at any chunk size, from every
    share, with checksums checked, as one window at a time; and of a sharded set, whose shards close as groups end."""
    samples = _labelled(COUNT)
    if sharded:
        path = tmp_path / "shards"
        for s in range(3):
            write_shard(samples, path, shard=s, num_shards=3, seed=1, progress=False, samples_per_record=4)
    else:
        path = tmp_path / "one.tr"
        write_record(samples, path, seed=1, progress=False, samples_per_record=4)
    ds = RecordDataset(path, shuffle_buffer=40, seed=9, batch_size=8)  # windows of 40 samples
    ds.set_epoch(2)
    assert ds.share().window == 40
    reader = ShareReader(ds.file, ds.share(), layout=ds._fixed_layout())
    plans = [split_runs(runs, ds.file.shard_offsets) for runs in window_runs(ds.share().runs, 40)]
    groups = reader._groups(plans)
    assert [a for a, _ in groups] == sorted({a for a, _ in groups}) and groups[-1][1] == len(plans) == 26
    assert max(b - a for a, b in groups) == reader_module.MAX_GROUP  # windows of 40 x 16 bytes
    for a, b in groups:  # no group needs a shard its first window does not
        assert {s for pieces in plans[a:b] for s, _, _ in pieces} == {s for s, _, _ in plans[a]}
    cases = [(start, size, 0) for start in (0, 1, 39, 40, 41, 333, 640, COUNT - 1) for size in (7, 50)]
    cases += [(0, 64, 1), (17, 30, 2)]
    grouped = {case: _chunks(ds, case[0], case[1], case[2], 3 if case[2] else 1) for case in cases}
    monkeypatch.setattr(reader_module, "GROUP_BYTES", 0)  # one window a group
    assert ShareReader(ds.file, ds.share(), layout=ds._fixed_layout())._groups(plans[:3]) == [(0, 1), (1, 2), (2, 3)]
    for (start, size, worker), chunks in grouped.items():
        alone = _chunks(ds, start, size, worker, 3 if worker else 1)
        assert len(chunks) == len(alone), (start, size, worker)
        for got, want in zip(chunks, alone):
            assert np.array_equal(got, want), (start, size, worker)
