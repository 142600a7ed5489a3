"""Remote sharded sets: a local HTTP server on 127.0.0.1 (and file://) serving shards into a local cache."""

from __future__ import annotations

import contextlib
import functools
import http.server
import multiprocessing
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IndexedImages
from tests.helpers import assert_exactly_once
from torchrecord import RecordDataset, ShardedSet, open_set, write_shard
from torchrecord.errors import FetchError

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

COUNT = 160
SHARDS = 8


class _Server:
    """A threaded HTTP server on 127.0.0.1 serving one folder, counting GETs and corrupting on request."""

    def __init__(self, folder: str) -> None:
        self.gets: Counter[str] = Counter()
        self.corrupt: set[str] = set()  # file names whose next GET gets one flipped byte
        self.lock = threading.Lock()
        handler = functools.partial(_Handler, self, directory=folder)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


class _Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, server_state: _Server, *args: Any, **kwargs: Any) -> None:
        self.state = server_state
        super().__init__(*args, **kwargs)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        name = self.path.rsplit("/", 1)[-1]
        with self.state.lock:
            self.state.gets[name] += 1
            corrupt = name in self.state.corrupt
            self.state.corrupt.discard(name)
        if not corrupt:
            super().do_GET()
            return
        data = bytearray(Path(self.translate_path(self.path)).read_bytes())
        data[len(data) // 2] ^= 0x01
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(bytes(data))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[_Server, str]]:
    """(server, URL of the sharded set): 8 shards of 20 samples."""
    folder = tmp_path / "www" / "set"
    for i in range(SHARDS):
        write_shard(IndexedImages(COUNT, size=16), folder, shard=i, num_shards=SHARDS, seed=1, progress=False)
    server = _Server(str(tmp_path / "www"))
    try:
        yield server, f"{server.url}/set"
    finally:
        server.stop()


def _labels(items: Any) -> list[int]:
    return [int(y) for _, ys in items for y in ys]


def _cache_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.rglob("*.tr"))


def test_http_set_reads_as_the_local_one(served: tuple[_Server, str], tmp_path: Path) -> None:
    server, url = served
    local = open_set(tmp_path / "www" / "set")
    for address in (url, url + "/", url + "/manifest.json"):
        remote = open_set(address, cache_dir=str(tmp_path / "cache"))
        assert isinstance(remote, ShardedSet) and remote.set_id == local.set_id and len(remote) == COUNT
    ds = RecordDataset(url, batch_size=8, shuffle_buffer=32, cache_dir=str(tmp_path / "cache"))
    expected = RecordDataset(local, batch_size=8, shuffle_buffer=32)
    assert _labels(ds) == _labels(expected)
    assert sorted(_labels(ds)) == list(range(COUNT))
    assert all(server.gets[e["name"]] == 1 for e in local.manifest["shards"]), server.gets  # fetched once each
    file_url = "file://" + str(tmp_path / "www" / "set")
    from_file = RecordDataset(file_url, batch_size=8, shuffle_buffer=32, cache_dir=str(tmp_path / "c2"))
    assert _labels(from_file) == _labels(expected)


def _read_in_process(url: str, cache: str, out: str) -> None:
    ds = RecordDataset(url, batch_size=8, cache_dir=cache)
    Path(out).write_text(" ".join(map(str, _labels(ds))))


def test_two_reader_processes_share_one_cache(served: tuple[_Server, str], tmp_path: Path) -> None:
    server, url = served
    cache = str(tmp_path / "cache")
    ctx = multiprocessing.get_context("fork")
    outs = [str(tmp_path / f"out{i}") for i in range(2)]
    procs = [ctx.Process(target=_read_in_process, args=(url, cache, out)) for out in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    for out in outs:
        assert sorted(map(int, Path(out).read_text().split())) == list(range(COUNT))
    shard_gets = {name: n for name, n in server.gets.items() if name.endswith(".tr")}
    assert len(shard_gets) == SHARDS and set(shard_gets.values()) == {1}, "one download per shard for both readers"
    assert not [p for p in Path(cache).rglob(".*tmp*")], "no temporary left in the cache"


def test_corrupted_download_is_fetched_again(served: tuple[_Server, str], tmp_path: Path) -> None:
    server, url = served
    server.corrupt.add("shard-00003-of-00008.tr")
    ds = RecordDataset(url, batch_size=8, cache_dir=str(tmp_path / "cache"))
    assert sorted(_labels(ds)) == list(range(COUNT))
    assert server.gets["shard-00003-of-00008.tr"] == 2
    assert server.gets["shard-00002-of-00008.tr"] == 1


def test_eviction_keeps_the_cache_under_its_limit(served: tuple[_Server, str], tmp_path: Path) -> None:
    server, url = served
    cache = tmp_path / "cache"
    size = os.path.getsize(tmp_path / "www" / "set" / "shard-00000-of-00008.tr")
    limit = int(size * 4.5)
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            with contextlib.suppress(OSError):
                peak = max(peak, _cache_bytes(cache))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        ds = RecordDataset(url, batch_size=4, shuffle_buffer=8, cache_dir=str(cache), cache_limit=limit)
        first = _labels(ds)
        ds.set_epoch(1)
        second = _labels(ds)
    finally:
        stop.set()
        watcher.join()
    assert_exactly_once(first, COUNT)
    assert_exactly_once(second, COUNT)
    assert _cache_bytes(cache) <= limit
    assert peak <= limit + size, f"peak {peak} over the limit {limit} by more than one shard"
    assert sum(n for name, n in server.gets.items() if name.endswith(".tr")) > SHARDS, "evicted shards refetched"


def test_an_empty_limit_still_reads(served: tuple[_Server, str], tmp_path: Path) -> None:
    _, url = served
    ds = RecordDataset(url, batch_size=8, cache_dir=str(tmp_path / "cache"), cache_limit=0)
    assert sorted(_labels(ds)) == list(range(COUNT))


@pytest.mark.timeout(120)
def test_server_stopping_mid_epoch_is_a_clear_error(served: tuple[_Server, str], tmp_path: Path) -> None:
    server, url = served
    ds = RecordDataset(url, batch_size=4, shuffle_buffer=8, cache_dir=str(tmp_path / "cache"))
    it = iter(ds)
    next(it)
    server.stop()
    started = time.monotonic()
    with pytest.raises(FetchError, match=r"127\.0\.0\.1:\d+/set/shard-000\d\d-of-00008\.tr: cannot fetch shard"):
        for _ in it:
            pass
    assert time.monotonic() - started < 60


def test_a_missing_manifest_url_is_a_clear_error(served: tuple[_Server, str], tmp_path: Path) -> None:
    server, _ = served
    with pytest.raises(FetchError, match="no manifest there"):
        len(open_set(server.url + "/nothing", cache_dir=str(tmp_path / "cache")))


def test_dataloader_workers_and_load_read_a_remote_set(served: tuple[_Server, str], tmp_path: Path) -> None:
    import torch
    from torch.utils.data import DataLoader

    import torchrecord

    server, url = served
    cache = str(tmp_path / "cache")
    ds = RecordDataset(url, batch_size=8, shuffle_buffer=16, cache_dir=cache)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    assert sorted(_labels(loader)) == list(range(COUNT))
    assert all(n == 1 for name, n in server.gets.items() if name.endswith(".tr")), "the workers share the cache"
    images, labels = torchrecord.load(open_set(url, cache_dir=cache))
    local_images, local_labels = torchrecord.load(tmp_path / "www" / "set")
    assert torch.equal(labels, local_labels) and torch.equal(images, local_images)
    assert torchrecord.verify(url, cache_dir=cache).ok
