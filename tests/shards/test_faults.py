"""Faults on the way to S3 (a fault-injecting proxy on 127.0.0.1 in front of moto), and what killed writers leave.

A damaged or failed transfer is fetched again within torchrecord's own deadline, then named
plainly: the shard, the cause in words, the settings of the deadline. A writer killed during its
upload leaves a multipart upload or a local copy only until the next run of that shard.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.shards.faults import BUCKET, FaultProxy, Versioned, start_writer, versions, wait_for
from torchrecord import open_set, write_shard
from torchrecord.errors import FetchError

pytest.importorskip("s3fs")

N = 2
COUNT = 24
SHARD0 = r"/shard-00000-of-00002\.tr(\?|$)"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TMPDIR (where upload copies are staged) under tmp_path, for this process and its children."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def _set(s3: Any, prefix: str, pad: int = 16) -> str:
    url = f"s3://{BUCKET}/{prefix}"
    for i in range(N):
        write_shard(Versioned(COUNT, 0, pad=pad), url, shard=i, num_shards=N, seed=1, progress=False)
    return url


def _through(proxy: FaultProxy) -> dict[str, Any]:
    return {"key": "testing", "secret": "testing", "endpoint_url": proxy.url}


def _gets(proxy: FaultProxy, path: str) -> int:
    return sum(1 for method, p in proxy.seen if method == "GET" and re.search(path, p))


def _seen(proxy: FaultProxy, method: str, path: str) -> bool:
    return any(m == method and p.split("?")[0] == path for m, p in proxy.seen)


def test_a_flipped_byte_in_a_small_shard_is_fetched_again(s3: Any, proxy: FaultProxy, tmp_path: Path) -> None:
    url = _set(s3, "flip")
    proxy.add("GET", SHARD0, "flip")
    rs = open_set(url, cache_dir=str(tmp_path / "cache"), storage_options=_through(proxy))
    assert versions(rs) == [0] * COUNT and sorted(int(s["x"]) for s in rs) == list(range(COUNT))
    assert _gets(proxy, SHARD0) == 2  # the damaged GET, then a good one


@pytest.mark.parametrize("action", ["reset", "truncate", "503"])
def test_a_failed_transfer_is_tried_again(s3: Any, proxy: FaultProxy, tmp_path: Path, action: str) -> None:
    url = _set(s3, action)
    proxy.add("GET", SHARD0, action)
    rs = open_set(url, cache_dir=str(tmp_path / "cache"), storage_options=_through(proxy))
    assert sorted(int(s["x"]) for s in rs) == list(range(COUNT))


def test_a_stalled_transfer_ends_at_torchrecords_deadline_naming_the_shard(
    s3: Any, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _set(s3, "stall")
    monkeypatch.setenv("TORCHRECORD_FETCH_GRACE", "3")
    proxy.add("GET", SHARD0, "stall", times=100)
    rs = open_set(url, cache_dir=str(tmp_path / "cache"), storage_options=_through(proxy))
    started = time.monotonic()
    with pytest.raises(FetchError) as err:
        rs[0]
    message = str(err.value)
    assert "shard-00000-of-00002.tr: shard 0 did not arrive within its deadline" in message
    assert "no data arrived" in message and "$TORCHRECORD_FETCH_GRACE" in message
    assert "$TORCHRECORD_FETCH_MIN_RATE" in message
    assert time.monotonic() - started < 60  # torchrecord's deadline (3 s here), not the storage library's retries


def test_a_server_that_keeps_failing_is_named_with_the_cause(
    s3: Any, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _set(s3, "fails")
    monkeypatch.setenv("TORCHRECORD_FETCH_GRACE", "5")
    proxy.add("GET", SHARD0, "403", times=100)  # refused every time: tried again within the deadline, then named
    rs = open_set(url, cache_dir=str(tmp_path / "cache"), storage_options=_through(proxy))
    with pytest.raises(FetchError) as err:
        rs[0]
    message = str(err.value)
    assert "shard-00000-of-00002.tr: cannot fetch shard 0: the server answered HTTP 403" in message
    assert "tried 3 times" in message and "$TORCHRECORD_FETCH_GRACE" in message
    assert _gets(proxy, SHARD0) == 3
    # a connection reset every time: the storage library retries on its own, torchrecord stops at its deadline
    proxy.clear()
    proxy.add("GET", SHARD0, "reset", times=1000)
    with pytest.raises(FetchError, match=r"shard 0 did not arrive within its deadline \(\d+ s\): no data arrived"):
        open_set(url, cache_dir=str(tmp_path / "cache2"), storage_options=_through(proxy))[0]


def _staged() -> list[str]:
    root = os.path.join(tempfile.gettempdir(), f"torchrecord-staging-{os.geteuid()}")
    return sorted(e for e in os.listdir(root) if not e.endswith(".lock")) if os.path.isdir(root) else []


def _uploads(s3: Any) -> list[str]:
    return [u["Key"] for u in s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])]


def _killed_during_upload(s3: Any, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch, prefix: str, pad: int) -> str:
    """Shard 0 of a set written by a child through the proxy, stalled mid upload and SIGKILLed there."""
    url = f"s3://{BUCKET}/{prefix}"
    monkeypatch.setenv("TORCHRECORD_UPLOAD_PART_SIZE", str(5 << 20))
    data = f"Versioned({COUNT}, 0, pad={pad})"
    child = start_writer(url, 0, N, data, seed=1, env={"AWS_ENDPOINT_URL": proxy.url})
    multipart = pad * COUNT // N >= 10 << 20
    if multipart:
        wait_for(lambda: _uploads(s3) or child.poll() is not None, what="the multipart upload to begin")
    else:
        put = f"/{BUCKET}/{prefix}/shard-00000-of-00002.tr"
        wait_for(lambda: _seen(proxy, "PUT", put) or child.poll() is not None, what="the upload to begin")
    child.send_signal(signal.SIGKILL)
    assert child.wait(60) == -signal.SIGKILL
    return url


@pytest.mark.parametrize("kind", ["single", "multipart"])
def test_a_writer_killed_mid_upload_leaves_nothing_after_the_next_run(
    s3: Any, proxy: FaultProxy, env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str
) -> None:
    pad = 1 << 20 if kind == "multipart" else 1024  # 12 MiB shards go up in 5 MiB parts
    proxy.add("PUT", r"partNumber=2" if kind == "multipart" else r"shard-00000-of-00002\.tr(\?|$)", "stall")
    url = _killed_during_upload(s3, proxy, monkeypatch, kind, pad)
    prefix = f"{kind}/"
    names = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]
    assert not any(n.endswith(".tr") for n in names)  # nothing a reader could take for a shard
    assert len(_staged()) == 1  # its local copy
    if kind == "multipart":
        assert _uploads(s3) == [f"{kind}/shard-00000-of-00002.tr"]  # its parts, on the server
    proxy.clear()
    for i in range(N):  # the next run, straight to the server
        write_shard(Versioned(COUNT, 0, pad=pad), url, shard=i, num_shards=N, seed=1, progress=False)
    assert _uploads(s3) == [] and _staged() == []
    rs = open_set(url, cache_dir=str(tmp_path / "cache"))
    assert sorted(int(s["x"]) for s in rs) == list(range(COUNT))
