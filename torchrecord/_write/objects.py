"""A sharded set's folder on object storage (``s3://``; any fsspec file system that can put files).

Object storage has no rename and no partial visibility: an object appears whole when its upload
ends, or not at all. So :func:`~torchrecord.write_shard` writes a shard in a local temporary
folder, uploads the finished file in one put, and then a small *note* beside it
(``shard-...tr.json``: the shard's size, SHA-256, counts and metadata, what
:func:`~torchrecord.finalize_shards` needs, so finalizing never downloads a shard). A shard counts
as written once its note is up. ``finalize_shards`` reads the notes and uploads ``manifest.json``
last: readers need the manifest, so they never see a partial set.

This module is the folder's I/O (list, put, read a note); ``shards.py`` decides what goes where.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from typing import Any, TypeVar

from torchrecord._shards import manifest as _manifest
from torchrecord._shards.remote import FsspecTransport
from torchrecord.errors import ArgumentError, FormatError, TorchRecordError, WriteError

__all__ = ["RemoteFolder", "stop_for_test"]

#: Test hook: the writer kills itself (SIGKILL, as a killed task would be) at this point of an
#: upload: ``before-note`` (its shard is up, its note is not) or ``before-manifest`` (every note
#: is read and the manifest built, not uploaded).
STOP_ENV = "TORCHRECORD_TEST_STOP"

_T = TypeVar("_T")


def stop_for_test(point: str) -> None:
    """Kill this process if ``$TORCHRECORD_TEST_STOP`` names ``point`` (tests of a killed writer)."""
    if os.environ.get(STOP_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def json_bytes(value: Any) -> bytes:
    """``value`` as JSON, byte for byte as :func:`~torchrecord._shards.manifest.write_json_atomic` writes it."""
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8")


class RemoteFolder:
    """The objects under one URL prefix (a sharded set's "folder"), through fsspec.

    Args:
        url: ``s3://bucket/prefix`` (or another fsspec protocol that can put files; not ``http(s)://``).
        storage_options: keyword arguments of the fsspec file system (for S3: s3fs's ``key``,
            ``secret``, ``endpoint_url``...; None: the ``AWS_*`` environment variables).
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None) -> None:
        self.url = url.rstrip("/")
        if self.url.startswith(("http://", "https://")):
            raise ArgumentError(
                f"{url}: a sharded set cannot be written over http(s) (it is read-only there); write it to a "
                "local folder or to object storage (s3://bucket/prefix), then serve that"
            )
        self.storage_options = dict(storage_options) if storage_options else None
        fs, path = FsspecTransport(self.storage_options).filesystem(self.url)
        self.fs = fs
        self.prefix = str(path).rstrip("/")

    def where(self, name: str) -> str:
        """The URL of ``name`` in the folder (for messages)."""
        return f"{self.url}/{name}"

    def _do(self, what: str, name: str, call: Callable[[], _T]) -> _T:
        """Run one storage call; its errors (fsspec back ends raise many kinds) become a WriteError naming it."""
        try:
            return call()
        except TorchRecordError:
            raise
        except Exception as exc:
            raise WriteError(f"{self.where(name)}: cannot {what} ({type(exc).__name__}: {exc})") from exc

    def names(self) -> list[str]:
        """The names of the objects in the folder (none if it does not exist yet)."""

        def listing() -> list[str]:
            self.fs.invalidate_cache()
            try:
                found = self.fs.ls(self.prefix, detail=False)
            except FileNotFoundError:
                return []
            return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in found]

        return self._do("list the sharded set's folder", "", listing)

    def has(self, name: str) -> bool:
        def exists() -> bool:
            self.fs.invalidate_cache()
            return bool(self.fs.exists(f"{self.prefix}/{name}"))

        return self._do("look for it", name, exists)

    def upload(self, local: str, name: str) -> None:
        """Put the finished file ``local`` at ``name`` in one upload (it appears whole, or not at all)."""
        self._do("upload it", name, lambda: self.fs.put_file(local, f"{self.prefix}/{name}"))

    def put_json(self, name: str, value: Any) -> None:
        self._do("upload it", name, lambda: self.fs.pipe_file(f"{self.prefix}/{name}", json_bytes(value)))

    def remove(self, name: str) -> None:
        def remove() -> None:
            try:
                self.fs.rm_file(f"{self.prefix}/{name}")
            except FileNotFoundError:
                pass

        self._do("remove it", name, remove)

    def size(self, name: str) -> int:
        return self._do("read its size", name, lambda: int(self.fs.size(f"{self.prefix}/{name}")))

    def read_json(self, name: str) -> Any:
        """A small JSON object's value (FormatError naming it if it is not JSON, or too large)."""

        def cat() -> bytes:
            if int(self.fs.size(f"{self.prefix}/{name}")) > _manifest.MAX_MANIFEST_BYTES:
                raise FormatError(f"{self.where(name)}: larger than {_manifest.MAX_MANIFEST_BYTES} bytes: no note")
            return bytes(self.fs.cat_file(f"{self.prefix}/{name}"))

        data = self._do("read it", name, cat)
        return _manifest.parse_json(_manifest.decode_text(data, self.where(name)), self.where(name))

    def shard_entry(self, i: int, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The manifest entry of shard ``i`` of ``n`` and its metadata, from its note (the shard is not read)."""
        name = _manifest.shard_name(i, n)
        note = self.read_json(name + ".json")
        where = self.where(name + ".json")
        try:
            meta = note["meta"]
            entry = {
                "name": name,
                "count": int(note["count"]),
                "records": int(note["records"]),
                "bytes": int(note["bytes"]),
                "sha256": str(note["sha256"]),
                "set_id": str(note["set_id"]),
            }
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(
                f"{where}: not the note of a shard written by write_shard ({exc!r}); write shard {i} again"
            ) from None
        info = meta.get("shard") if isinstance(meta, dict) else None
        if not isinstance(info, dict) or info.get("index") != i or info.get("of") != n:
            raise FormatError(f"{where}: not the note of shard {i} of {n} written by write_shard (it says {info!r})")
        size = self.size(name)
        if size != entry["bytes"]:
            raise FormatError(
                f"{self.where(name)}: {size} bytes, its note says {entry['bytes']}: the shard was replaced "
                f"after its note was written; write shard {i} again"
            )
        return entry, meta
