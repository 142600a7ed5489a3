"""Read-ahead hints: the byte ranges of upcoming record runs, advised on a thread that always stops."""

from __future__ import annotations

import mmap
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import torchrecord
from torchrecord._store import advise as _advise
from torchrecord._store.advise import Advisor, hint_span, map_base
from torchrecord._store.walk import Walk

pytestmark = pytest.mark.skipif(not _advise.available(), reason="read-ahead hints need Linux")


def _advisor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "torchrecord-advise"]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("advise") / "images.tr"
    samples = [(torch.full((3, 40, 40), i % 251, dtype=torch.uint8), i) for i in range(400)]
    torchrecord.write_record(samples, path, progress=False, samples_per_record=1)
    return path


def test_hint_span_is_page_aligned_and_refuses_odd_stretches() -> None:
    assert hint_span(5000, 9000, 4000, 1 << 20) == (0, 12288)
    assert hint_span(100_000, 104_000, 4000, 1 << 20) == (94208, 12288)
    assert hint_span(0, 10 << 20, 1000, 100 << 20) is None  # far more bytes than its records
    assert hint_span(10, 5, 100, 1000) is None
    assert hint_span(0, 2000, 100, 1000) is None  # past the end of the file


def test_advisor_advises_the_runs_it_is_given(images: Path) -> None:
    rf = torchrecord.RecordFile(images)
    env, db = rf.environment()
    record = os.path.getsize(images) // rf.num_records
    advisor = Advisor(env, db, str(images), record)
    try:
        advisor.advise([(0, 100), (300, 400)])
        deadline = time.monotonic() + 10
        while advisor.advised == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 200 * 4800 <= advisor.advised <= 2 * 200 * record + (4 << 20)
    finally:
        advisor.close()
    assert not advisor._thread.is_alive()


def test_map_base_finds_where_the_file_is_mapped(images: Path) -> None:
    rf = torchrecord.RecordFile(images)
    env, db = rf.environment()
    with Walk(env, db, str(images), buffers=True) as walk:
        value = walk.records(0, 1)[0]
        address = int(np.frombuffer(value, np.uint8).__array_interface__["data"][0])
        base = map_base(address, str(images))
        assert base is not None
        offset = address - base
        with open(images, "rb") as f:
            f.seek(offset)
            assert f.read(len(value)) == bytes(value)
    assert map_base(12345, str(images)) is None


def _count_advisors(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    started: list[str] = []
    real = Advisor.__init__

    def counting(self: Advisor, *args: object) -> None:
        started.append(str(args[2]))
        real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Advisor, "__init__", counting)
    return started


def test_resident_sees_whether_a_file_is_in_the_page_cache(tmp_path: Path) -> None:
    path = tmp_path / "sparse.bin"
    with open(path, "wb") as f:
        f.truncate(4 << 20)  # a hole: no page of it is cached until it is read
    pages = (4 << 20) // mmap.PAGESIZE
    assert not _advise.resident(str(path))
    assert _advise.cached_pages(str(path)) == (0, pages)
    assert path.read_bytes() == bytes(4 << 20)
    assert _advise.resident(str(path))
    assert _advise.cached_pages(str(path)) == (pages, pages)
    assert _advise.cached_pages(str(path), 64) == (64, 64)
    empty = tmp_path / "empty.bin"
    empty.touch()
    assert not _advise.resident(str(empty)) and _advise.cached_pages(str(empty)) == (0, 0)
    assert not _advise.resident(str(tmp_path / "missing.bin"))
    assert _advise.cached_pages(str(tmp_path / "missing.bin")) is None


def test_a_file_in_the_page_cache_gets_no_advisor(images: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _advise.resident(str(images))  # just written
    started = _count_advisors(monkeypatch)
    ds = torchrecord.RecordDataset(images, batch_size=32, shuffle_buffer=64, seed=0)
    assert sorted(int(y) for _, labels in ds for y in labels) == list(range(400))
    assert started == []
    monkeypatch.setattr(_advise, "resident", lambda path: False)  # as for a file out of the cache
    assert sorted(int(y) for _, labels in ds for y in labels) == list(range(400))
    assert started == [str(images)]


def test_reading_stops_every_advisor_thread(images: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_advise, "resident", lambda path: False)  # advise even though the file is cached
    started = _count_advisors(monkeypatch)
    before = len(_advisor_threads())
    ds = torchrecord.RecordDataset(images, batch_size=32, shuffle_buffer=64, seed=0)
    assert sorted(int(y) for _, labels in ds for y in labels) == list(range(400))
    it = iter(torchrecord.RecordDataset(images, shuffle_buffer=64, seed=0))
    next(it)
    del it  # an abandoned iteration closes its reader too
    deadline = time.monotonic() + 5
    while len(_advisor_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_advisor_threads()) == before
    assert len(started) == 2  # both readers advised, and both advisors stopped


def test_hints_can_be_turned_off(images: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHRECORD_READAHEAD", "0")
    assert not _advise.available()
    started = threading.Event()
    real = Advisor.__init__

    def spy(self: Advisor, *args: object) -> None:
        started.set()
        real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Advisor, "__init__", spy)
    assert sum(len(labels) for _, labels in torchrecord.RecordDataset(images, batch_size=50)) == 400
    assert not started.is_set()
