"""Checksums computed on a helper thread (``torchrecord._store.checks_ahead``): the same batches as without
checks, no batch holding a damaged record, the same errors, and no helper alive at a fork or after an epoch.

Records of 24 KiB are read from LMDB's map, where ``RecordDataset`` reads each
window one ahead and computes its CRC-32s on a helper; ``THREAD_BYTES`` is set to 0
(every window on a helper) or out of reach (every window in the reading thread).
"""

from __future__ import annotations

import os
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
from torchrecord._store import checks_ahead, fastread
from torchrecord._store import format as _format
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
