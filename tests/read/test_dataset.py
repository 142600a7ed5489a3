"""RecordDataset: sharding over ranks and workers, determinism, shuffle quality, batches."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import torchrecord
from tests.conftest import IndexedImages
from tests.helpers import assert_exactly_once
from torchrecord import RecordDataset, RecordFile
from torchrecord._order.windows import window_order

COUNT = 203  # odd, and not a multiple of 2, 3 or 4: every world size pads or drops


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> str:
    """203 (image, label) samples, pre-shuffled on write (stored index != label)."""
    path = tmp_path_factory.mktemp("dataset") / "images.tr"
    torchrecord.write_record(IndexedImages(COUNT), path, seed=9, progress=False)
    return str(path)


@pytest.fixture(scope="module")
def small_ints(tmp_path_factory: pytest.TempPathFactory) -> str:
    """20,000 int samples in source order (stored index == label)."""
    path = tmp_path_factory.mktemp("quality") / "ints.tr"
    torchrecord.write_record(range(20_000), path, shuffle=False, progress=False)
    return str(path)


def _labels_of(items: Iterable[Any], batched: bool) -> list[int]:
    out: list[int] = []
    for item in items:
        image, label = item
        if batched:
            assert isinstance(label, torch.Tensor) and label.dtype == torch.int64
            assert image.shape == (len(label), 3, 4, 4)
            assert torch.equal(image[:, 0, 0, 0], (label % 251).to(torch.uint8))
            out.extend(int(x) for x in label)
        else:
            assert int(image[0, 0, 0]) == int(label) % 251, "image and label do not belong together"
            out.append(int(label))
    return out


def read(ds: RecordDataset, num_workers: int = 0) -> list[Any]:
    """Everything one rank yields in one epoch: in-process, or through a fork DataLoader."""
    if num_workers == 0:
        return list(ds)
    with warnings.catch_warnings():  # 3 workers on this 2-core machine: DataLoader warns
        warnings.filterwarnings("ignore", message=".*suggested max number of worker", category=UserWarning)
        loader = DataLoader(ds, batch_size=None, num_workers=num_workers, multiprocessing_context="fork")
        return list(loader)


def read_labels(ds: RecordDataset, num_workers: int = 0) -> list[int]:
    return _labels_of(read(ds, num_workers), ds.batch_size is not None)


# -- sharding -------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_sample_once_per_epoch(images: str, num_workers: int, world: int) -> None:
    for drop_last in (False, True):
        per_rank = []
        seen: list[int] = []
        for rank in range(world):
            ds = RecordDataset(images, shuffle_buffer=16, seed=1, drop_last=drop_last, rank=rank, world_size=world)
            ds.set_epoch(3)
            labels = read_labels(ds, num_workers)
            assert len(ds) == len(labels), f"len() of rank {rank} disagrees with what it yields"
            per_rank.append(len(labels))
            seen += labels
        assert len(set(per_rank)) == 1, f"ranks yield different counts: {per_rank}"
        total = per_rank[0] * world
        if drop_last:
            assert_exactly_once(seen, COUNT, drop=COUNT - total)
            assert COUNT - total < world
        else:
            assert_exactly_once(seen, COUNT, pad=total - COUNT)
            assert total - COUNT < world


@pytest.mark.parametrize(("num_workers", "world"), [(0, 1), (2, 1), (0, 3), (2, 2), (3, 4)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_once_per_epoch(images: str, num_workers: int, world: int, drop_last: bool) -> None:
    size = 8
    seen: list[int] = []
    counts = []
    for rank in range(world):
        ds = RecordDataset(images, batch_size=size, shuffle_buffer=16, drop_last=drop_last, rank=rank, world_size=world)
        batches = read(ds, num_workers)
        assert len(ds) == len(batches), f"len() of rank {rank} is not its batch count"
        lengths = [len(b[1]) for b in batches]
        assert all(n == size for n in lengths[:-1]) or num_workers > 1
        if drop_last:
            assert all(n == size for n in lengths), "drop_last must drop short batches"
        assert sum(1 for n in lengths if n < size) <= 1, "at most one short batch per rank"
        counts.append(sum(lengths))
        seen += _labels_of(batches, batched=True)
    assert len(set(counts)) == 1
    per_rank = torchrecord._order.partition.samples_per_rank(COUNT, world, drop_last)
    if drop_last:
        per_rank_kept = per_rank // size * size
        assert counts[0] == per_rank_kept
        assert_exactly_once(seen, COUNT, drop=COUNT - per_rank_kept * world)
    else:
        assert counts[0] == per_rank
        assert_exactly_once(seen, COUNT, pad=per_rank * world - COUNT)


def test_batch_collation(images: str) -> None:
    ds = RecordDataset(images, batch_size=10, shuffle=False)
    batches = list(ds)
    assert len(ds) == len(batches) == 21
    images_, labels = batches[0]
    assert isinstance(images_, torch.Tensor) and images_.dtype == torch.uint8 and images_.shape == (10, 3, 4, 4)
    assert isinstance(labels, torch.Tensor) and labels.dtype == torch.int64 and labels.shape == (10,)
    stored = [s[1] for s in RecordFile(images)]
    assert labels.tolist() == stored[:10]
    assert len(batches[-1][1]) == 3
    dropped = list(RecordDataset(images, batch_size=10, shuffle=False, drop_last=True))
    assert len(dropped) == 20 and all(len(b[1]) == 10 for b in dropped)
    assert [int(x) for b in dropped for x in b[1]] == stored[:200]


def test_len_counts_samples_and_batches(images: str) -> None:
    assert len(RecordDataset(images)) == COUNT
    assert len(RecordDataset(images, rank=0, world_size=2)) == 102
    assert len(RecordDataset(images, rank=1, world_size=2, drop_last=True)) == 101
    assert len(RecordDataset(images, batch_size=50)) == 5
    assert len(RecordDataset(images, batch_size=50, drop_last=True)) == 4
    assert len(RecordDataset(images, batch_size=50, rank=2, world_size=4)) == 2


def test_shuffle_false_yields_stored_order(images: str) -> None:
    stored = [s[1] for s in RecordFile(images)]
    assert read_labels(RecordDataset(images, shuffle=False)) == stored
    ds = RecordDataset(images, shuffle=False, seed=5)
    ds.set_epoch(7)
    assert read_labels(ds) == stored, "without shuffle the epoch must not matter"
    halves = [read_labels(RecordDataset(images, shuffle=False, rank=r, world_size=2)) for r in range(2)]
    assert halves[0] == stored[:102]
    assert halves[1] == stored[102:] + stored[:1]


# -- determinism ----------------------------------------------------------------------


def _order(path: str, seed: int, epoch: int, num_workers: int = 0, **kw: Any) -> list[int]:
    ds = RecordDataset(path, seed=seed, shuffle_buffer=32, **kw)
    ds.set_epoch(epoch)
    assert ds.epoch == epoch
    return read_labels(ds, num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_order_is_a_function_of_seed_and_epoch(images: str, num_workers: int) -> None:
    a = _order(images, seed=0, epoch=0, num_workers=num_workers)
    assert sorted(a) == list(range(COUNT))
    assert _order(images, seed=0, epoch=0, num_workers=num_workers) == a
    assert _order(images, seed=0, epoch=1, num_workers=num_workers) != a
    assert _order(images, seed=1, epoch=0, num_workers=num_workers) != a
    assert _order(images, seed=0, epoch=1, num_workers=num_workers) == _order(
        images, seed=0, epoch=1, num_workers=num_workers
    )


def test_set_epoch_between_iterations_of_one_dataset(images: str) -> None:
    ds = RecordDataset(images, shuffle_buffer=32)
    first = read_labels(ds)
    again = read_labels(ds)
    ds.set_epoch(1)
    second = read_labels(ds)
    assert first == again
    assert second != first
    assert sorted(second) == sorted(first) == list(range(COUNT))


def test_ranks_differ_within_an_epoch_and_change_across_epochs(images: str) -> None:
    by_epoch = [
        [set(_order(images, seed=0, epoch=e, rank=r, world_size=2, drop_last=True)) for r in range(2)] for e in range(2)
    ]
    for ranks in by_epoch:
        assert not ranks[0] & ranks[1]
    assert by_epoch[0][0] != by_epoch[1][0], "a rank must not read the same subset every epoch"


# -- shuffle quality ------------------------------------------------------------------


def spearman(order: list[int]) -> float:
    """Spearman rank correlation of read position vs stored index (``order`` is a permutation)."""
    ranks = np.argsort(np.argsort(np.asarray(order)))
    return float(np.corrcoef(np.arange(len(order)), ranks)[0, 1])


def spread(order: list[int], n: int, parts: int = 10) -> int:
    """How many of ``parts`` equal slices of the file the first 1/parts of the reads touch."""
    head = np.asarray(order[: n // parts])
    return len(set((head * parts // n).tolist()))


@pytest.mark.parametrize("epoch", [0, 1, 2])
def test_shuffle_quality(small_ints: str, epoch: int) -> None:
    n, buffer = 20_000, 256
    ds = RecordDataset(small_ints, shuffle_buffer=buffer, seed=0)
    ds.set_epoch(epoch)
    order = [int(x) for x in ds]
    assert sorted(order) == list(range(n))
    rho = spearman(order)
    assert abs(rho) < 0.2, f"read order correlates with stored order: rho={rho:.3f}"
    assert spread(order, n) >= 7, "the first tenth of the reads should come from all over the file"

    # the same statistics fail for buffer-sized windows alone (no block order), so they can tell
    buffer_only = [
        lo + int(i)
        for j, lo in enumerate(range(0, n, buffer))
        for i in window_order(min(buffer, n - lo), seed=0, epoch=epoch, rank=0, worker=0, window=j)
    ]
    assert sorted(buffer_only) == list(range(n))
    assert abs(spearman(buffer_only)) > 0.9
    assert spread(buffer_only, n) <= 2


def test_shuffle_quality_of_a_rank(small_ints: str) -> None:
    ds = RecordDataset(small_ints, shuffle_buffer=256, rank=1, world_size=2)
    order = [int(x) for x in ds]
    assert len(order) == 10_000
    assert abs(spearman(order)) < 0.2
    assert len(set((np.asarray(order) * 20 // 20_000).tolist())) == 20, "a rank's share spans the whole file"


def test_no_shuffle_is_fully_correlated(small_ints: str) -> None:
    order = [int(x) for x in RecordDataset(small_ints, shuffle=False)]
    assert order == list(range(20_000))
    assert spearman(order) > 0.999


# -- transform ------------------------------------------------------------------------


def scale_and_tag(sample: tuple[torch.Tensor, int]) -> dict[str, Any]:
    image, label = sample
    assert isinstance(image, torch.Tensor) and image.dtype == torch.uint8, "transform gets decoded samples"
    assert type(label) is int
    return {"x": image.float() / 255.0, "y": label, "tag": f"s{label}"}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_transform_runs_on_decoded_samples(images: str, num_workers: int) -> None:
    ds = RecordDataset(images, transform=scale_and_tag, shuffle_buffer=8)
    out = read(ds, num_workers)
    assert len(out) == COUNT
    assert sorted(item["y"] for item in out) == list(range(COUNT))
    for item in out:
        assert item["x"].dtype == torch.float32
        assert torch.allclose(item["x"], torch.full((3, 4, 4), (item["y"] % 251) / 255.0))
        assert item["tag"] == f"s{item['y']}"


def test_transform_output_is_collated_in_batch_mode(images: str) -> None:
    ds = RecordDataset(images, transform=scale_and_tag, batch_size=16, shuffle=False)
    batch = next(iter(ds))
    assert batch["x"].shape == (16, 3, 4, 4) and batch["x"].dtype == torch.float32
    assert batch["y"].shape == (16,)
    assert batch["tag"] == [f"s{int(y)}" for y in batch["y"]]


# -- arguments ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"shuffle_buffer": -1},
        {"block_size": 0},
        {"batch_size": 0},
        {"rank": 0},
        {"world_size": 2},
        {"rank": 2, "world_size": 2},
        {"rank": -1, "world_size": 2},
    ],
)
def test_bad_arguments(images: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RecordDataset(images, **kwargs)


@pytest.mark.parametrize("block_size", [1, 7, 1000])
def test_explicit_block_size(images: str, block_size: int) -> None:
    labels = read_labels(RecordDataset(images, block_size=block_size, shuffle_buffer=0))
    assert sorted(labels) == list(range(COUNT))


def test_missing_file_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(torchrecord.errors.RecordNotFoundError):
        RecordDataset(tmp_path / "nope.tr")


def test_all_combinations_small(tmp_path: Path) -> None:
    """Tiny files (fewer samples than readers) still give equal counts and full coverage."""
    for count in (1, 2, 5):
        path = tmp_path / f"tiny{count}.tr"
        torchrecord.write_record(IndexedImages(count), path, progress=False)
        for world, drop_last in itertools.product(range(1, 5), (False, True)):
            seen: list[int] = []
            counts = set()
            for rank in range(world):
                labels = read_labels(RecordDataset(path, rank=rank, world_size=world, drop_last=drop_last))
                counts.add(len(labels))
                seen += labels
            assert len(counts) == 1
            total = counts.pop() * world
            assert_exactly_once(seen, count, pad=max(total - count, 0), drop=max(count - total, 0))


def _tagged(i: int) -> tuple[str, torch.Tensor, int]:
    return f"name-{i}", torch.arange(i % 3 + 1), i


def test_generic_schema_samples_and_batches(tmp_path: Path) -> None:
    """A schema with strings and a variable dimension takes the general decoding path."""
    path = tmp_path / "tagged.tr"
    torchrecord.write_record([_tagged(i) for i in range(50)], path, progress=False, schema={"1": [None]})
    samples = list(RecordDataset(path, shuffle_buffer=8))
    assert sorted(s[2] for s in samples) == list(range(50))
    for name, values, label in samples:
        assert name == f"name-{label}"
        assert torch.equal(values, torch.arange(label % 3 + 1))
    ds = RecordDataset(path, batch_size=4, shuffle_buffer=8, transform=lambda s: (s[0], s[2]))
    batches = list(ds)
    assert len(batches) == len(ds) == 13
    labels = [int(x) for names, ys in batches for x in ys]
    assert sorted(labels) == list(range(50))
    assert all(n == f"name-{int(y)}" for names, ys in batches for n, y in zip(names, ys, strict=True))


@pytest.mark.parametrize(("num_workers", "world"), [(0, 1), (0, 3), (2, 2)])
def test_chunked_records_once_per_epoch(tmp_path: Path, num_workers: int, world: int) -> None:
    """Several samples per stored record (the last record short) read like one per record."""
    path = tmp_path / "chunked.tr"
    torchrecord.write_record(IndexedImages(COUNT), path, samples_per_record=5, progress=False)
    assert len(RecordFile(path)) == COUNT
    for batch_size in (None, 8):
        seen: list[int] = []
        counts = set()
        for rank in range(world):
            ds = RecordDataset(path, shuffle_buffer=16, batch_size=batch_size, rank=rank, world_size=world)
            items = read(ds, num_workers)
            assert len(ds) == len(items)
            labels = _labels_of(items, batch_size is not None)
            counts.add(len(labels))
            seen += labels
        assert len(counts) == 1
        assert_exactly_once(seen, COUNT, pad=counts.pop() * world - COUNT)
