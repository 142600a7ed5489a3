"""Checksums computed on a helper thread (``torchrecord._store.checks_ahead``): the same batches as without
checks, no batch holding a damaged record, the same errors, and no helper alive at a fork or after an epoch.

Records of 24 KiB are read from LMDB's map, where ``RecordDataset`` reads each
window one ahead and computes its CRC-32s on a helper; ``THREAD_BYTES`` is set to 0
(every window on a helper) or out of reach (every window in the reading thread).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import torchrecord
from tests.read.test_reliability import _flip_in_file, put
from tests.store.test_crc_blocks import _raw_meta, _records, _stored_blocks
from torchrecord._read import reader as reader_module
from torchrecord._store import address_book, checks_ahead, fastread
from torchrecord._store import format as _format
from torchrecord._store.walk import RunCheck
from torchrecord.errors import ChecksumError

COUNT = 300
WIDTH = 40 << 10  # bytes a sample: read from the map, copied a sample at a time (fastread.checks_ahead_pay)
BATCH = 16


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ahead") / "set.tr"
    samples = [{"x": np.full(WIDTH, i % 251, np.uint8), "label": i} for i in range(COUNT)]
    torchrecord.write_record(samples, path, progress=False, samples_per_record=1, seed=4)
    return path


@pytest.fixture(params=["blocks", "record by record"])
def path(written: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A copy of the set, with its block checksums (one a record here) or as written before them."""
    copy = tmp_path / "set.tr"
    copy.write_bytes(written.read_bytes())
    if request.param == "record by record":
        meta = _raw_meta(copy)
        del meta["checksum_block"]
        put(copy, _format.META_DB, _format.META_KEY, _format.pack_metadata(meta))
        put(copy, _format.META_DB, _format.CRC_BLOCKS_KEY, None)
    return copy


@pytest.fixture(params=["helper", "reading thread"])
def helper(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Where windows are checked; yields the ChecksAhead made (to see that the helper did the work)."""
    monkeypatch.setattr(checks_ahead, "THREAD_BYTES", 0 if request.param == "helper" else 1 << 62)
    made: list[Any] = []
    original = checks_ahead.ChecksAhead.__init__

    def recording(self: Any, *args: Any) -> None:
        original(self, *args)
        made.append(self)

    monkeypatch.setattr(checks_ahead.ChecksAhead, "__init__", recording)
    yield made
    assert made, "no window was checked through ChecksAhead"
    assert all(c._by_rows for c in made) == (request.param == "helper")


def _batches(path: Path, **kwargs: Any) -> list[dict[str, torch.Tensor]]:
    return list(torchrecord.RecordDataset(path, batch_size=BATCH, seed=2, **kwargs))


def test_batches_checked_on_a_helper_equal_those_read_without_checks(path: Path, helper: list[Any]) -> None:
    for rank in range(3):
        kwargs: dict[str, Any] = {"rank": rank, "world_size": 3}
        got, want = _batches(path, check="checksums", **kwargs), _batches(path, **kwargs)
        assert len(got) == len(want) > 3
        for a, b in zip(got, want):
            assert torch.equal(a["label"], b["label"]) and torch.equal(a["x"], b["x"])
    resumed = torchrecord.RecordDataset(path, batch_size=BATCH, seed=2, check="checksums")
    resumed.load_state_dict(resumed.position_after(5, num_workers=0))
    assert [b["label"].tolist() for b in resumed] == [b["label"].tolist() for b in _batches(path)[5:]]
    assert not checks_ahead._helpers


def test_a_damaged_record_is_named_and_no_batch_holds_it(path: Path, helper: list[Any]) -> None:
    values = _records(path)
    victim = 211
    _flip_in_file(path, values[victim], len(values[victim]) // 2)
    order = [label for b in _batches(path) for label in b["label"].tolist()]  # unchecked: read as it is
    assert len(order) == COUNT
    handed: list[int] = []
    with pytest.raises(ChecksumError, match=rf"{path}: record {victim}: CRC-32 is"):
        for batch in torchrecord.RecordDataset(path, batch_size=BATCH, seed=2, check="checksums"):
            handed += batch["label"].tolist()
    at = order.index(_label_of(path, victim))
    assert handed == order[: len(handed)] and len(handed) <= at  # batches before it only, none holding it


def _label_of(path: Path, record: int) -> int:
    return int(torchrecord.RecordFile(path)[record]["label"])


def test_damaged_block_checksums_are_named_on_a_helper(written: Path, tmp_path: Path, helper: list[Any]) -> None:
    copy = tmp_path / "set.tr"
    copy.write_bytes(written.read_bytes())
    assert _raw_meta(copy)["checksum_block"] == 1
    blocks = bytearray(_stored_blocks(copy) or b"")
    blocks[4 * 77] ^= 1  # record 77's block
    put(copy, _format.META_DB, _format.CRC_BLOCKS_KEY, bytes(blocks))
    message = rf"{copy}: records 77 to 77: the checksum of their block does not match while every record's own does"
    with pytest.raises(ChecksumError, match=message):
        _batches(copy, check="checksums")


@pytest.mark.parametrize("k", [1, 2])
def test_a_second_pass_hands_the_records_its_books_know_to_the_helper(
    tmp_path: Path, helper: list[Any], k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second pass in the process looks each window up in the address books (``fastread.read_known``) and hands
    its records' checks over as one ``KnownChecks`` (their CRC-32s computed where they lie, in the order the
    batches need them): the same batches as without checks. A record damaged in place after that (the pages this
    process has mapped change) is named on the next pass, and no batch holding it is handed out."""
    path = tmp_path / "set.tr"
    samples = [{"x": np.full(WIDTH, i % 251, np.uint8), "label": i} for i in range(COUNT)]
    written = torchrecord.write_record(samples, path, progress=False, samples_per_record=k, seed=4)
    address_book._BOOKS.clear()
    _batches(path, check="checksums")  # the first pass: the books learn where every record lies
    made: list[str] = []  # the deferred checks made: a window's records at once, or a walk's run
    for kind in (checks_ahead.KnownChecks, RunCheck):
        monkeypatch.setattr(kind, "__init__", _recorded(kind.__init__, kind.__name__, made))
    helper.clear()
    got, want = _batches(path, check="checksums"), _batches(path)
    assert len(got) == len(want) == -(-COUNT // BATCH)
    for a, b in zip(got, want):
        assert torch.equal(a["label"], b["label"]) and torch.equal(a["x"], b["x"])
    assert helper and made and set(made) == {"KnownChecks"}, made
    victim = 111
    value = written.raw(victim)
    damaged = [int(written[s]["label"]) for s in range(victim * k, victim * k + k)]  # the record's samples
    data = path.read_bytes()
    assert data.count(value) == 1
    with open(path, "r+b") as file:  # in place
        file.seek(data.index(value) + len(value) // 2)
        file.write(bytes([data[data.index(value) + len(value) // 2] ^ 0x10]))
    helper.clear()
    made.clear()
    handed: list[int] = []
    with pytest.raises(ChecksumError, match=rf"{path}: record {victim}: CRC-32 is"):
        for batch in torchrecord.RecordDataset(path, batch_size=BATCH, seed=2, check="checksums"):
            handed += batch["label"].tolist()
    order = [label for b in want for label in b["label"].tolist()]
    first_damaged = min(order.index(label) for label in damaged)
    assert handed == order[: len(handed)] and len(handed) <= first_damaged  # none holding it
    assert helper and made and set(made) == {"KnownChecks"}, made


def _recorded(init: Any, name: str, made: list[str]) -> Any:
    def recording(self: Any, *args: Any) -> None:
        made.append(name)
        init(self, *args)

    return recording


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_no_helper_is_alive_when_the_process_forks(path: Path, helper: list[Any]) -> None:
    """A fork made while a helper computes waits for it: the child never starts with a CRC half done."""
    alive_at_fork: list[int] = []
    watching = [True]

    def after_in_parent() -> None:
        if watching:
            alive_at_fork.append(len(checks_ahead._helpers))

    os.register_at_fork(after_in_parent=after_in_parent)
    try:
        batches = iter(torchrecord.RecordDataset(path, batch_size=BATCH, seed=2, check="checksums"))
        got = [next(batches)["label"]]  # the next window is read and being checked
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        got += [b["label"] for b in batches]
    finally:
        watching.clear()
    assert alive_at_fork == [0]
    assert [t.tolist() for t in got] == [b["label"].tolist() for b in _batches(path)]


def test_leaving_an_epoch_early_stops_its_helpers(path: Path, helper: list[Any]) -> None:
    batches = iter(torchrecord.RecordDataset(path, batch_size=BATCH, seed=2, check="checksums"))
    next(batches)
    batches.close()  # type: ignore[attr-defined]
    assert not checks_ahead._helpers


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_check_on_their_own_helpers(written: Path, tmp_path: Path, context: str) -> None:
    """In DataLoader workers (default THREAD_BYTES: each worker's window of 3.6 MB is checked on a helper)
    every sample comes once, as written, and a damaged record stops the epoch, named."""
    loader: dict[str, Any] = {"batch_size": None, "num_workers": 2, "multiprocessing_context": context}
    got = list(DataLoader(torchrecord.RecordDataset(written, batch_size=BATCH, check="checksums"), **loader))
    assert sorted(label for b in got for label in b["label"].tolist()) == list(range(COUNT))
    assert all(torch.equal(b["x"], (b["label"] % 251).to(torch.uint8)[:, None].expand(-1, WIDTH)) for b in got)
    copy = tmp_path / "set.tr"
    copy.write_bytes(written.read_bytes())
    values = _records(copy)
    _flip_in_file(copy, values[123], len(values[123]) // 3)
    with pytest.raises(ChecksumError, match=rf"{copy}: record 123: CRC-32 is"):
        list(DataLoader(torchrecord.RecordDataset(copy, batch_size=BATCH, check="checksums"), **loader))


def test_one_ahead_makes_each_item_early_and_raises_in_turn() -> None:
    made: list[int] = []

    def items() -> Iterator[int]:
        for i in range(3):
            made.append(i)
            yield i
        raise ValueError("the fourth item")

    ahead = checks_ahead.one_ahead(items())
    assert next(ahead) == 0 and made == [0, 1]  # the next one is made before this one is handed out
    assert next(ahead) == 1 and made == [0, 1, 2]
    assert next(ahead) == 2  # handed out although making the next one failed
    with pytest.raises(ValueError, match="the fourth item"):
        next(ahead)
    assert list(checks_ahead.one_ahead(iter([]))) == []


@pytest.mark.parametrize("k", [1, 4])
def test_samples_gathered_by_one_fancy_index_are_checked_as_each_window_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, k: int
) -> None:
    """Samples under ``fastread.ROW_COPY`` (records still read from the map) are gathered by one NumPy fancy
    index that keeps the GIL, so no helper is started (``fastread.checks_ahead_pay``): each window's records are
    checked as it is found, the batches are those read without checks, and a damaged record is refused, named,
    before any batch holding it."""
    width = 20 << 10
    assert fastread.JOIN_LIMIT <= width < fastread.ROW_COPY
    path = tmp_path / "set.tr"
    samples = [{"x": np.full(width // k, i % 251, np.uint8), "label": i} for i in range(COUNT)]
    torchrecord.write_record(samples, path, progress=False, samples_per_record=k, seed=4)
    made: list[Any] = []
    original = checks_ahead.ChecksAhead.__init__
    monkeypatch.setattr(checks_ahead.ChecksAhead, "__init__", lambda self, *a: made.append(original(self, *a)))
    got, want = _batches(path, check="checksums"), _batches(path)
    assert len(got) == len(want) > 3 and made == []
    for a, b in zip(got, want):
        assert torch.equal(a["label"], b["label"]) and torch.equal(a["x"], b["x"])
    damaged = tmp_path / "damaged.tr"  # a copy: this process holds the first open
    damaged.write_bytes(path.read_bytes())
    values = _records(damaged)
    victim = 41
    _flip_in_file(damaged, values[victim], len(values[victim]) // 2)
    order = [label for b in _batches(damaged) for label in b["label"].tolist()]
    handed: list[int] = []
    with pytest.raises(ChecksumError, match=rf"{damaged}: record {victim}: CRC-32"):
        for batch in torchrecord.RecordDataset(damaged, batch_size=BATCH, seed=2, check="checksums"):
            handed += batch["label"].tolist()
    held = [int(torchrecord.RecordFile(damaged)[victim * k + i]["label"]) for i in range(k)]
    assert handed == order[: len(handed)] and not set(held) & set(handed)


def test_one_helper_computes_at_a_time(written: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows are read one ahead, so two windows' checks are handed over at once; the second helper waits for
    the first to finish before it computes, so that the helpers never take both cores from the reading thread.
    Each CRC-32 is slowed down here, so that helpers computing at once would overlap."""
    monkeypatch.setattr(checks_ahead, "THREAD_BYTES", 0)
    monkeypatch.setattr(reader_module, "MAPPED_GROUP_BYTES", reader_module.GROUP_BYTES)  # windows read apart
    events: list[tuple[str, int]] = []
    original = checks_ahead.ChecksAhead._compute_rows

    def logged(self: checks_ahead.ChecksAhead) -> None:
        events.append(("start", id(self)))
        original(self)
        events.append(("end", id(self)))

    def slow_crc32(data: Any) -> int:
        time.sleep(0.0005)
        return fastread.crc32(data)

    monkeypatch.setattr(checks_ahead.ChecksAhead, "_compute_rows", logged)
    monkeypatch.setattr(checks_ahead, "crc32", slow_crc32)
    got = list(torchrecord.RecordDataset(written, batch_size=BATCH, seed=2, shuffle_buffer=64, check="checksums"))
    assert len(got) == -(-COUNT // BATCH)
    assert len(events) >= 8, events  # at least four windows on helpers
    for (a, first), (b, second) in zip(events[::2], events[1::2], strict=True):
        assert (a, b) == ("start", "end") and first == second, events  # one helper's start, then its own end
