"""Address books (``torchrecord._store.address_book``): a second pass over a set in the same process finds its
long records where the first pass found and checked them, without a cursor step a record; it reads the same
batches, still checks checksums, and starts afresh when the file holds a new snapshot.

Records of 20 KiB are read from LMDB's map (longer than ``fastread.JOIN_LIMIT``); records of 6 KiB are read
as views and joined into the window buffer (at least ``fastread.VIEW_LIMIT``), from the map in one call once
their book knows them.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from torchrecord import RecordDataset, write_record, write_shard
from torchrecord._read import reader as reader_module
from torchrecord._store import address_book, fastread
from torchrecord._store.walk import Walk
from torchrecord.errors import ChecksumError

COUNT = 121
MAPPED, JOINED = 20 << 10, 6 << 10  # bytes of a sample's image: records read from the map, or joined
WIDTH = MAPPED


@pytest.fixture(params=[MAPPED, JOINED], ids=["mapped", "joined"])
def width(request: pytest.FixtureRequest) -> int:
    width: int = request.param
    assert (width >= fastread.JOIN_LIMIT) == (width == MAPPED) and width >= fastread.VIEW_LIMIT
    return width


def _samples(width: int = WIDTH) -> list[dict[str, Any]]:
    return [{"x": np.full(width, i % 251, np.uint8), "label": i} for i in range(COUNT)]


@pytest.fixture(params=[1, 2], ids=["one-thread", "two-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """torch's threads while the test reads: on one, records and samples are copied from the map with torch
    (``fastread.Mapped.copy``), on more with NumPy; both must give the same bytes."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    try:
        yield request.param
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def walked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """The (first, stop) of every run of records read by a cursor walk."""
    runs: list[tuple[int, int]] = []
    original = Walk.records

    def recording(self: Walk, first: int, stop: int) -> list[Any]:
        runs.append((first, stop))
        return original(self, first, stop)

    monkeypatch.setattr(Walk, "records", recording)
    address_book._BOOKS.clear()  # no book left by an earlier test
    yield runs


def _epoch(path: Path, epoch: int, **kwargs: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    ds = RecordDataset(path, batch_size=8, shuffle_buffer=32, seed=2, **kwargs)
    ds.set_epoch(epoch)
    return [(b["label"].numpy().copy(), b["x"].numpy().copy()) for b in ds]


def _assert_read_as_without_books(
    path: Path, epoch: int, check: str | None, batches: list[tuple[np.ndarray, np.ndarray]]
) -> None:
    """``batches`` (epoch ``epoch``) are those a process without address books reads, each sample intact."""
    address_book._BOOKS.clear()
    without = _epoch(path, epoch, check=check)
    assert len(batches) == len(without) == -(-COUNT // 8)
    for (label, x), (label_0, x_0) in zip(batches, without):
        assert np.array_equal(label, label_0) and np.array_equal(x, x_0)
        assert np.array_equal(x[:, 0], label % 251)


def _write(tmp_path: Path, sharded: bool, k: int, width: int) -> Path:
    if not sharded:
        write_record(_samples(width), tmp_path / "set.tr", seed=1, progress=False, samples_per_record=k)
        return tmp_path / "set.tr"
    path = tmp_path / "shards"
    for s in range(3):
        write_shard(_samples(width), path, shard=s, num_shards=3, seed=1, progress=False, samples_per_record=k)
    return path


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("check", [None, "checksums"])
def test_a_second_pass_walks_only_records_the_first_could_not_vouch_for(
    tmp_path: Path, walked: list[tuple[int, int]], sharded: bool, k: int, check: str | None, width: int, threads: int
) -> None:
    """The second epoch reads the same batches as a process without books, walking no piece but those holding
    a shard's short last record (never kept: it is re-encoded on every read)."""
    path = _write(tmp_path, sharded, k, width)
    _epoch(path, 0, check=check)
    assert walked, "the first pass walks"
    walked.clear()
    second = _epoch(path, 1, check=check)
    counts = np.diff(RecordDataset(path).file.shard_offsets).tolist()
    short_last = [c // k for c in counts if c % k]  # each shard's short last record
    assert len(walked) <= len(short_last), walked  # each walk a piece holding one: the rest is in the books
    assert all(any(first <= r < stop for r in short_last) for first, stop in walked), walked
    if k == 1:
        assert walked == []
    _assert_read_as_without_books(path, 1, check, second)


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("check", [None, "checksums"])
def test_a_window_the_books_know_in_part_walks_only_the_pieces_they_do_not(
    tmp_path: Path, walked: list[tuple[int, int]], sharded: bool, check: str | None, width: int
) -> None:
    """A persistent worker reads another share each epoch, so its books fill over several: a window whose
    records they know in part walks only the pieces holding a record they do not know (and learns those),
    and reads the same batches as a process without books."""
    path = _write(tmp_path, sharded, 1, width)
    _epoch(path, 0, check=check)
    books = list(address_book._BOOKS.values())
    for book in books:
        assert book.addresses.all()
        book.addresses[: len(book.addresses) // 3] = 0  # the first third of each file's records
    walked.clear()
    second = _epoch(path, 1, check=check)
    lost = [len(book.addresses) // 3 for book in books]
    assert all(first < max(lost) for first, _ in walked), walked  # a walked piece holds a record lost
    assert sum(min(stop, max(lost)) - first for first, stop in walked) >= sum(lost)  # each lost one walked
    assert sum(stop - first for first, stop in walked) < COUNT * 2 // 3, walked  # not the pieces known whole
    assert all(book.addresses.all() for book in address_book._BOOKS.values()), "walked records are learned"
    _assert_read_as_without_books(path, 1, check, second)


def test_checksums_are_checked_on_every_pass(
    tmp_path: Path, walked: list[tuple[int, int]], width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record damaged in place after the first pass (its payload: the layout still fits) is refused on the
    second, which finds it through the book. On an intact file the second pass checks each window's records all
    at once (``fastread.matches_stored_crcs``), without a walk's check of each piece."""
    path = tmp_path / "set.tr"
    raw = write_record(_samples(width), path, seed=1, progress=False, samples_per_record=1).raw(7)
    first = _epoch(path, 0, check="checksums")
    piece_checks: list[int] = []
    original = Walk._run_check

    def counting(self: Walk, values: list[Any], first: int) -> Any:
        piece_checks.append(first)
        return original(self, values, first)

    monkeypatch.setattr(Walk, "_run_check", counting)
    walked.clear()
    again = _epoch(path, 0, check="checksums")
    assert piece_checks == [] and walked == [], "every window known whole and checked at once"
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(first, again, strict=True))
    data = path.read_bytes()
    at = data.index(raw) + len(raw) // 2
    assert data.count(raw) == 1
    with open(path, "r+b") as file:  # in place: the pages this process has mapped change
        file.seek(at)
        file.write(bytes([data[at] ^ 0x10]))
    walked.clear()
    with pytest.raises(ChecksumError, match=rf"{path}: record 7\b"):
        _epoch(path, 1, check="checksums")
    assert walked == [], "the second pass found its records in the book"
    assert piece_checks, "the window that differs is checked piece by piece, which names the record"


_REPLACE = """
import lmdb, sys
from torchrecord._store import format as f
env = lmdb.open(sys.argv[1], subdir=False, lock=False, max_dbs=f.MAX_DBS)
db = env.open_db(f.RECORDS_DB)
with env.begin(write=True) as txn:
    txn.put(f.encode_key(5), txn.get(f.encode_key(9), db=db), db=db)
env.close()
"""


def test_a_new_snapshot_of_the_file_starts_a_new_book(
    tmp_path: Path, walked: list[tuple[int, int]], width: int
) -> None:
    """A commit to the file after the first pass (record 5 now holds record 9's bytes, written elsewhere in the
    file, as LMDB never overwrites a committed page) is seen by the second: its book is of the old snapshot."""
    samples = _samples(width)
    path = tmp_path / "set.tr"
    write_record(samples, path, seed=1, progress=False, samples_per_record=1, shuffle=False)
    first = {int(label): x for labels, xs in _epoch(path, 0) for label, x in zip(labels, xs)}
    assert np.array_equal(first[5], samples[5]["x"])
    subprocess.run([sys.executable, "-c", _REPLACE, str(path)], check=True)  # another process: LMDB's rule
    walked.clear()
    labels = np.concatenate([labels for labels, _ in _epoch(path, 1)])
    assert walked, "the new snapshot is walked"
    assert sorted(labels.tolist()) == sorted([*range(5), 9, *range(6, COUNT)])


def test_a_database_over_the_limit_gets_an_empty_book(
    tmp_path: Path, walked: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A book costs 8 bytes a record: past ``BOOK_LIMIT`` records nothing is kept, and every pass walks."""
    monkeypatch.setattr(address_book, "BOOK_LIMIT", COUNT - 1)
    path = _write(tmp_path, False, 1, MAPPED)
    first = _epoch(path, 0)
    walked.clear()
    second = _epoch(path, 0)
    assert sum(stop - first for first, stop in walked) == COUNT
    assert all(len(book.addresses) == 0 for book in address_book._BOOKS.values())
    for (label, x), (label_0, x_0) in zip(second, first):
        assert np.array_equal(label, label_0) and np.array_equal(x, x_0)


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("check", [None, "checksums"])
def test_a_window_known_whole_is_looked_up_sample_by_sample_without_a_walk_or_its_pieces(
    tmp_path: Path, walked: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch, sharded: bool, check: str | None
) -> None:
    """Records read from the map, a second pass: a window whose records the books know every one of (of one
    shard or several) is read by ``FixedWindowReader.read_known``, a lookup of each sample's record, without
    :meth:`FixedWindowReader.read`'s look at its pieces; it gives the batches a process without books reads.
    With checksums too: every record's CRC-32 is computed where it lies and all compared with the stored ones
    at once (each shard's own, where a window holds several)."""
    monkeypatch.setattr(reader_module, "MAPPED_GROUP_BYTES", reader_module.GROUP_BYTES)  # windows read apart
    path = _write(tmp_path, sharded, 2, MAPPED)
    _epoch(path, 0, check=check)
    calls = {"read": 0, "read_known": 0}

    def counting(name: str) -> Any:
        original = getattr(fastread.FixedWindowReader, name)

        def counted(self: fastread.FixedWindowReader, *args: Any) -> Any:
            result = original(self, *args)
            calls[name] += result is not None
            return result

        return counted

    for name in calls:
        monkeypatch.setattr(fastread.FixedWindowReader, name, counting(name))
    walked.clear()
    ds = RecordDataset(path, batch_size=8, shuffle_buffer=32, seed=2, check=check)
    ds.set_epoch(1)
    second = [(b["label"].numpy().copy(), b["x"].numpy().copy()) for b in ds]
    counts = np.diff(ds.file.shard_offsets).tolist()
    assert calls["read_known"] > calls["read"]
    assert calls["read"] <= sum(c % 2 for c in counts)  # a window holding a shard's short last record
    _assert_read_as_without_books(path, 1, check, second)


def _walk_log(log: Path) -> np.ndarray:
    """How many times each record was walked, from the lines ``first stop`` of ``log``."""
    walked = np.zeros(COUNT, np.int64)
    for line in log.read_text().splitlines() if log.exists() else []:
        first, stop = map(int, line.split())
        walked[first:stop] += 1
    return walked


@pytest.mark.parametrize("persistent", [True, False])
def test_a_persistent_workers_books_learn_every_record_in_its_second_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, persistent: bool
) -> None:
    """A persistent DataLoader worker reads another share each epoch: its second pass walks every record of the
    file it did not know (found in the page cache), so that no later epoch walks any. A worker that reads once
    (not persistent) walks only its share. Every epoch holds every sample once. Recorded from the (forked)
    workers in a file: a line a run of records walked."""
    path = _write(tmp_path, False, 1, MAPPED)
    log = tmp_path / "walked.log"
    original = Walk.records

    def recording(self: Walk, first: int, stop: int) -> list[Any]:
        with open(log, "a") as file:
            file.write(f"{first} {stop}\n")
        return original(self, first, stop)

    monkeypatch.setattr(Walk, "records", recording)
    address_book._BOOKS.clear()
    ds = RecordDataset(path, batch_size=8, shuffle_buffer=32, seed=2)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, persistent_workers=persistent, multiprocessing_context="fork"
    )
    walks = []
    for epoch in range(4):
        ds.set_epoch(epoch)
        batches = [(b["label"].numpy().copy(), b["x"].numpy().copy()) for b in loader]
        walks.append(_walk_log(log))
        assert sorted(np.concatenate([label for label, _ in batches]).tolist()) == list(range(COUNT))
        for label, x in batches:
            assert np.array_equal(x[:, 0], label % 251)
    if not persistent:
        assert all((w == e + 1).all() for e, w in enumerate(walks)), "each record walked once an epoch"
        return
    assert (walks[0] == 1).all(), "the first epoch walks each worker's share"
    assert (walks[1] == 2).all(), "by the end of the second, each worker walked every record once"
    assert np.array_equal(walks[1], walks[3]), "no record walked after the second epoch"
