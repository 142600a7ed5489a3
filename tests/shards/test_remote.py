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
from torchrecord.errors import CacheError, FetchError, TorchRecordWarning

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

COUNT = 160
SHARDS = 8


class _Server:
    """A threaded HTTP server on 127.0.0.1 serving one folder, counting GETs and corrupting on request.

    It also misbehaves on request: ``drip`` names files sent one byte every ``drip_interval`` seconds
    (``"*"``: every shard), ``pad`` names files answered with that many extra bytes.
    """

    def __init__(self, folder: str) -> None:
        self.gets: Counter[str] = Counter()
        self.corrupt: set[str] = set()  # file names whose next GET gets one flipped byte
        self.drip: set[str] = set()
        self.drip_interval = 0.2
        self.pad: dict[str, int] = {}
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        handler = functools.partial(_Handler, self, directory=folder)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
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
        state = self.state
        with state.lock:
            state.gets[name] += 1
            corrupt = name in state.corrupt
            state.corrupt.discard(name)
            drip = name in state.drip or ("*" in state.drip and name.endswith(".tr"))
            pad = state.pad.get(name, 0)
        if not (corrupt or drip or pad):
            super().do_GET()
            return
        data = bytearray(Path(self.translate_path(self.path)).read_bytes())
        if corrupt:
            data[len(data) // 2] ^= 0x01
        data += b"\0" * pad
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not drip:
            self.wfile.write(bytes(data))
            return
        with contextlib.suppress(OSError):  # the client gave up, or was killed
            for i in range(len(data)):
                if state.stopping.wait(state.drip_interval):
                    return
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()


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


# -- the cache as untrusted ground (issue 30, items 1-5; issue 27, item 13) ----------------------------
def _shard(tmp_path: Path, s: int) -> Path:
    return tmp_path / "www" / "set" / f"shard-{s:05d}-of-{SHARDS:05d}.tr"


def _set_id(tmp_path: Path) -> str:
    return open_set(tmp_path / "www" / "set").set_id


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file (and the target of every link) under ``folder``: its contents."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_eviction_touches_only_what_the_cache_downloaded(served: tuple[_Server, str], tmp_path: Path) -> None:
    server, url = served
    cache = tmp_path / "cache"
    outside = tmp_path / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "precious_outside.tr").write_bytes(b"o" * 5000)
    (outside / "folder" / "shard-00000-of-00001.tr").write_bytes(b"f" * 5000)
    (cache / "projects" / "old").mkdir(parents=True)
    (cache / "precious.tr").write_bytes(b"p" * 5000)
    (cache / "projects" / "old" / "also_precious.tr").write_bytes(b"a" * 5000)
    lookalike = cache / ("0123456789abcdef" * 2)  # named like a set's folder, but the user's
    lookalike.mkdir()
    (lookalike / "shard-00000-of-00001.tr").write_bytes(b"l" * 5000)
    (cache / "linked.tr").symlink_to(outside / "precious_outside.tr")
    (cache / ("fedcba9876543210" * 2)).symlink_to(outside / "folder")
    before, outside_before = _tree(cache), _tree(outside)
    size = os.path.getsize(_shard(tmp_path, 0))
    limit = int(size * 2.5)
    ds = RecordDataset(url, batch_size=4, shuffle_buffer=8, cache_dir=str(cache), cache_limit=limit)
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert_exactly_once(_labels(ds), COUNT)
    assert sum(n for name, n in server.gets.items() if name.endswith(".tr")) > SHARDS, "it evicted"
    after = _tree(cache)
    assert {k: v for k, v in after.items() if k in before} == before, "a file of the user's was changed or deleted"
    assert _tree(outside) == outside_before
    own = cache / _set_id(tmp_path)
    assert sum(p.stat().st_size for p in own.glob("*.tr")) <= limit


def test_a_planted_file_of_the_right_size_is_not_trusted(served: tuple[_Server, str], tmp_path: Path) -> None:
    server, url = served
    cache = tmp_path / "cache"
    folder = cache / _set_id(tmp_path)
    folder.mkdir(parents=True)
    names = [_shard(tmp_path, s).name for s in range(SHARDS)]
    # shard 0: another shard's file padded (or cut) to shard 0's size; shard 1: damaged, right size;
    # shard 2: a true copy (adopted after its SHA-256 is checked, not fetched)
    size0 = _shard(tmp_path, 0).stat().st_size
    (folder / names[0]).write_bytes(_shard(tmp_path, 5).read_bytes().ljust(size0, b"\0")[:size0])
    damaged = bytearray(_shard(tmp_path, 1).read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    (folder / names[1]).write_bytes(bytes(damaged))
    (folder / names[2]).write_bytes(_shard(tmp_path, 2).read_bytes())
    for check in (None, "structure"):
        ds = RecordDataset(url, batch_size=8, cache_dir=str(cache), check=check)
        assert sorted(_labels(ds)) == list(range(COUNT))
    assert server.gets[names[0]] == 1 and server.gets[names[1]] == 1, "the planted files were fetched again"
    assert server.gets[names[2]] == 0, "a true copy is checked, not fetched"
    for s in (0, 1, 2):
        assert (folder / names[s]).read_bytes() == _shard(tmp_path, s).read_bytes()
    # a stamped shard changed in place, its size and mtime kept, is checked again (its ctime moved)
    target = folder / names[3]
    st = target.stat()
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    with open(target, "r+b") as f:
        f.write(bytes(data))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    ds = RecordDataset(url, batch_size=8, cache_dir=str(cache))
    assert sorted(_labels(ds)) == list(range(COUNT))
    assert server.gets[names[3]] == 2
    assert target.read_bytes() == _shard(tmp_path, 3).read_bytes()


def test_symlinks_in_the_cache_are_never_followed(served: tuple[_Server, str], tmp_path: Path) -> None:
    server, url = served
    cache = tmp_path / "cache"
    outside = tmp_path / "outside"
    outside.mkdir()
    copy = outside / "evil.tr"
    copy.write_bytes(_shard(tmp_path, 4).read_bytes())  # the right bytes, but not in the cache
    folder = cache / _set_id(tmp_path)
    folder.mkdir(parents=True)
    name = _shard(tmp_path, 4).name
    (folder / name).symlink_to(copy)
    ds = RecordDataset(url, batch_size=8, cache_dir=str(cache), cache_limit=0)
    assert sorted(_labels(ds)) == list(range(COUNT))
    assert server.gets[name] == 1, "a shard that is a symlink is fetched again"
    assert copy.read_bytes() == _shard(tmp_path, 4).read_bytes() and not (folder / name).is_symlink()
    # the set's folder a symlink out of the cache: refused, nothing written there
    cache2 = tmp_path / "cache2"
    cache2.mkdir()
    (cache2 / _set_id(tmp_path)).symlink_to(outside)
    with pytest.raises(CacheError, match="is a symlink"):
        list(RecordDataset(url, batch_size=8, cache_dir=str(cache2)))
    assert sorted(p.name for p in outside.iterdir()) == ["evil.tr"]


def test_cache_folders_are_owner_only_and_another_users_is_refused(served: tuple[_Server, str], tmp_path: Path) -> None:
    _, url = served
    cache = tmp_path / "fresh" / "cache"
    assert sorted(_labels(RecordDataset(url, batch_size=8, cache_dir=str(cache)))) == list(range(COUNT))
    assert (cache.stat().st_mode & 0o777) == 0o700
    assert ((cache / _set_id(tmp_path)).stat().st_mode & 0o777) == 0o700
    shared = tmp_path / "shared"
    (shared / _set_id(tmp_path)).mkdir(parents=True)
    os.chmod(shared / _set_id(tmp_path), 0o777)  # another user could plant shards here
    with pytest.raises(CacheError, match="others may write in it"):
        list(RecordDataset(url, batch_size=8, cache_dir=str(shared)))
    if os.geteuid() != 0:
        pytest.skip("making a folder another user's needs root")
    for folder in (tmp_path / "theirs", tmp_path / "mine"):
        (folder / _set_id(tmp_path)).mkdir(parents=True)
    os.chown(tmp_path / "theirs", 65534, 65534)  # the whole cache folder another user's
    os.chown(tmp_path / "mine" / _set_id(tmp_path), 65534, 65534)  # the set's folder another user's
    for folder in (tmp_path / "theirs", tmp_path / "mine"):
        with pytest.raises(CacheError, match="belongs to user 65534, not to you"):
            list(RecordDataset(url, batch_size=8, cache_dir=str(folder)))


@pytest.mark.timeout(120)
def test_a_dripping_server_is_given_up_at_the_deadline(
    served: tuple[_Server, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, url = served
    monkeypatch.setenv("TORCHRECORD_FETCH_GRACE", "3")
    monkeypatch.setenv("TORCHRECORD_FETCH_MIN_RATE", str(10**9))
    name = _shard(tmp_path, 3).name
    server.drip.add(name)  # one byte every 0.2 s: the read timeout never fires
    ds = RecordDataset(url, batch_size=8, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(FetchError, match=rf"{name}: shard 3 did not arrive within its deadline"):
        _labels(ds)


def test_an_oversized_answer_is_cut_at_the_manifest_size(served: tuple[_Server, str], tmp_path: Path) -> None:
    server, url = served
    cache = tmp_path / "cache"
    size = _shard(tmp_path, 0).stat().st_size
    limit = int(size * 3.5)
    name = _shard(tmp_path, 2).name
    server.pad[name] = 8_400_000
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            with contextlib.suppress(OSError):
                # by inode: a listing taken during a rename can name one file twice (old and new name)
                files = {
                    (st.st_dev, st.st_ino): st.st_size for st in (p.stat() for p in cache.rglob("*") if p.is_file())
                }
                peak = max(peak, sum(files.values()))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        ds = RecordDataset(url, batch_size=4, cache_dir=str(cache), cache_limit=limit)
        with pytest.raises(FetchError, match=rf"{name}: the server sent more than the {size}? ?\d* ?bytes"):
            _labels(ds)
    finally:
        stop.set()
        watcher.join()
    # the limit bends only for shards being read and the next AHEAD + 1 of the plan (a shuffle window can
    # read blocks of two shards at once): 6 shards at the peak were seen against a limit of 3.5. The bound
    # stays under the whole set (8 shards), so a cache that never evicts fails; the 8.4 MB answer never lands
    from torchrecord._storage.cache import AHEAD

    bound = limit + (AHEAD + 2) * size
    assert peak <= bound, f"the cache held {peak} bytes at its peak, over its limit {limit} (bound {bound})"


def _read_slowly(url: str, cache: str) -> None:
    RecordDataset(url, batch_size=8, cache_dir=cache, shuffle_buffer=8).__iter__().__next__()


@pytest.mark.timeout(180)
def test_a_killed_readers_partial_downloads_are_counted_then_removed(
    served: tuple[_Server, str], tmp_path: Path
) -> None:
    import signal

    from torchrecord._storage.cache import ShardCache
    from torchrecord._storage.transport import FsspecStorage

    server, url = served
    cache = tmp_path / "cache"
    folder = cache / _set_id(tmp_path)
    server.drip.add("*")
    child = multiprocessing.get_context("fork").Process(target=_read_slowly, args=(url, str(cache)))
    child.start()
    try:
        deadline = time.monotonic() + 120
        while not list(folder.glob(".*.tmp-*")):
            assert time.monotonic() < deadline and child.is_alive(), "the reader never started downloading"
            time.sleep(0.05)
        manifest = open_set(url, cache_dir=str(cache)).manifest
        live = ShardCache(url, manifest, str(cache), None, FsspecStorage())
        in_flight = live.held()
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    finally:
        child.join(30)
    sizes = sorted(int(e["bytes"]) for e in manifest["shards"])
    assert in_flight >= sizes[0], "a download in flight counts at its full size"
    assert list(folder.glob(".*.tmp-*")) and list(folder.glob("*.lock")), "the killed reader left its files"
    server.drip.clear()
    size = _shard(tmp_path, 0).stat().st_size
    ds = RecordDataset(url, batch_size=8, cache_dir=str(cache), cache_limit=int(size * 2.5))
    assert sorted(_labels(ds)) == list(range(COUNT))
    leftovers = [p.name for p in folder.iterdir() if ".tmp-" in p.name or p.name.endswith(".lock")]
    assert leftovers == [], "partial downloads and lock files are gone"
    assert ShardCache(url, manifest, str(cache), None, FsspecStorage()).held() <= int(size * 2.5)


def test_the_default_cache_is_per_user_with_a_limit(
    served: tuple[_Server, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import warnings

    _, url = served
    set_id = _set_id(tmp_path)
    monkeypatch.delenv("TORCHRECORD_CACHE", raising=False)
    monkeypatch.delenv("TORCHRECORD_CACHE_LIMIT", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with (
        caplog.at_level(logging.INFO, logger="torchrecord"),
        pytest.warns(
            TorchRecordWarning, match=r"keeps the shards of remote sets in .*xdg/torchrecord \(at most 20 GiB"
        ),
    ):
        assert sorted(_labels(RecordDataset(url, batch_size=8))) == list(range(COUNT))
    assert [r for r in caplog.records if "xdg/torchrecord" in r.getMessage()], "logged where the shards go"
    assert len(list((tmp_path / "xdg" / "torchrecord" / set_id).glob("*.tr"))) == SHARDS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the folder exists: said once, when it was made
        rs = open_set(url)
        rs.shard(0)
        assert rs._remote().limit == 20 << 30
    monkeypatch.delenv("XDG_CACHE_HOME")
    with pytest.warns(TorchRecordWarning, match=r"home/\.cache/torchrecord"):
        open_set(url).shard(1)
    assert (tmp_path / "home" / ".cache" / "torchrecord" / set_id / _shard(tmp_path, 1).name).is_file()
    monkeypatch.setenv("TORCHRECORD_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("TORCHRECORD_CACHE_LIMIT", "12345")
    rs = open_set(url)
    rs.shard(2)
    assert (tmp_path / "mine" / set_id / _shard(tmp_path, 2).name).is_file()
    assert rs._remote().limit == 12345
