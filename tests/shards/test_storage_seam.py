"""The storage seam: a back end registered for a URL scheme, or passed as ``storage=``, reads and writes a set.

This is the recipe of docs/ARCHITECTURE.md (*How to add a storage back end*) kept true: a class
with the methods of ``Storage``, registered in ``BACKENDS``, is all a new kind of storage needs.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.shards.faults import Versioned, versions
from torchrecord import ShardedSet, finalize_shards, open_set, write_shard
from torchrecord._storage import BACKENDS
from torchrecord._storage.transport import ObjectInfo, Storage
from torchrecord.errors import ArgumentError, IncompleteRecordSetError


class MemoryStorage:
    """A whole storage back end in a dict (``mem://`` URLs): what a new back end implements."""

    objects: ClassVar[dict[str, tuple[bytes, dict[str, str]]]] = {}
    lock = threading.Lock()

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        self.options = storage_options

    def open(self, url: str, deadline: float | None, size: int | None) -> io.BytesIO:
        with self.lock:
            if url not in self.objects:
                raise FileNotFoundError(url)
            return io.BytesIO(self.objects[url][0])

    def names(self, url: str) -> list[str]:
        prefix = url.rstrip("/") + "/"
        with self.lock:
            return [k[len(prefix) :] for k in self.objects if k.startswith(prefix) and "/" not in k[len(prefix) :]]

    def stat(self, url: str) -> ObjectInfo | None:
        with self.lock:
            found = self.objects.get(url)
        return None if found is None else ObjectInfo(len(found[0]), dict(found[1]))

    def put_file(self, local: str, url: str, metadata: dict[str, str]) -> None:
        data = Path(local).read_bytes()
        with self.lock:
            self.objects[url] = (data, dict(metadata))

    def put_bytes(self, url: str, data: bytes) -> None:
        with self.lock:
            self.objects[url] = (bytes(data), {})

    def remove(self, url: str) -> None:
        with self.lock:
            self.objects.pop(url, None)

    def abort_uploads(self, url: str, started_before: float) -> int:
        return 0  # an upload here is one dict assignment: nothing is ever half-uploaded


@pytest.fixture
def mem(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setitem(BACKENDS, "mem", MemoryStorage)
    monkeypatch.setenv("TORCHRECORD_CACHE", str(tmp_path / "cache"))
    MemoryStorage.objects = {}
    yield
    MemoryStorage.objects = {}


def test_a_registered_back_end_writes_finalizes_and_reads_a_set(mem: None) -> None:
    assert isinstance(MemoryStorage(), Storage)
    for i in range(3):
        write_shard(Versioned(30, 0), "mem://bucket/set", shard=i, num_shards=3, seed=2, progress=False)
    assert "mem://bucket/set/manifest.json" in MemoryStorage.objects
    rs = open_set("mem://bucket/set")
    assert sorted(int(s["x"]) for s in rs) == list(range(30)) and versions(rs) == [0] * 30
    # the checks of the seam hold for any back end: a shard replaced after finalize is named at once
    MemoryStorage.objects["mem://bucket/set/shard-00001-of-00003.tr"] = (b"x" * 10, {"torchrecord-sha256": "0" * 64})
    with pytest.raises(IncompleteRecordSetError, match="shard 1 is not the file its note describes"):
        finalize_shards("mem://bucket/set")


def test_an_fsspec_file_system_passed_as_storage(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    url = "memory://seam/set"
    try:
        for i in range(2):
            write_shard(Versioned(20, 1), url, shard=i, num_shards=2, seed=0, progress=False, storage=fs)
        rs = ShardedSet(url, storage=fs, cache_dir=str(tmp_path / "cache"))
        assert sorted(int(s["x"]) for s in rs) == list(range(20)) and set(versions(rs)) == {1}
        assert len(finalize_shards(url, storage=fs)) == 20
        with pytest.raises(ArgumentError, match="storage_options= or storage=, not both"):
            open_set(url, storage=fs, storage_options={"x": 1})
        with pytest.raises(ArgumentError, match="neither an fsspec file system nor a torchrecord storage"):
            open_set(url, storage=object())
    finally:
        fs.rm("/seam", recursive=True)
    assert not os.path.exists(tmp_path / "seam")
