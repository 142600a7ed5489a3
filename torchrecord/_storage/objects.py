"""A folder on object storage (``s3://``; any back end that can put files): the writing side of the seam.

Object storage has no rename and no partial visibility: an object appears whole when its upload
ends, or not at all. This is the folder's I/O for writers: list, look at one object (its size and
the metadata stored with it), put a finished file whole with metadata, put and read small JSON
objects, remove, and abort a killed writer's unfinished uploads. Every failure of the back end is
a :class:`~torchrecord.errors.WriteError` naming the object and the cause.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from torchrecord._storage import backend_for, writable
from torchrecord._storage.fetch import fetch_bytes
from torchrecord._storage.transfer import describe_failure
from torchrecord._storage.transport import ObjectInfo, is_http
from torchrecord.errors import ArgumentError, TorchRecordError, WriteError

__all__ = ["ObjectFolder", "json_bytes"]

_T = TypeVar("_T")


def json_bytes(value: Any) -> bytes:
    """``value`` as JSON, byte for byte as ``_shards/manifest.write_json_atomic`` writes it."""
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8")


class ObjectFolder:
    """The objects under one URL prefix (a sharded set's "folder").

    Args:
        url: ``s3://bucket/prefix`` (or another URL a writable back end reaches; not ``http(s)://``).
        storage_options: keyword arguments of the back end (for S3: s3fs's ``key``, ``secret``,
            ``endpoint_url``...; None: the ``AWS_*`` environment variables).
        storage: a back end or an fsspec file system to use instead (see ``_storage/__init__.py``).
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None, storage: Any = None) -> None:
        self.url = url.rstrip("/")
        if is_http(self.url):
            raise ArgumentError(
                f"{url}: a sharded set cannot be written over http(s) (it is read-only there); write it to a "
                "local folder or to object storage (s3://bucket/prefix), then serve that"
            )
        self.storage_options = dict(storage_options) if storage_options else None
        self.given = storage
        self.backend = writable(backend_for(self.url, self.storage_options, storage), self.url)

    def where(self, name: str) -> str:
        """The URL of ``name`` in the folder."""
        return f"{self.url}/{name}" if name else self.url

    def _do(self, what: str, name: str, call: Callable[[], _T]) -> _T:
        """Run one storage call; its errors (back ends raise many kinds) become a WriteError naming it."""
        try:
            return call()
        except (TorchRecordError, FileNotFoundError):
            raise
        except Exception as exc:
            raise WriteError(f"{self.where(name)}: cannot {what}: {describe_failure(exc)}") from exc

    def names(self) -> list[str]:
        """The names of the objects in the folder, as the server has them now (none if it does not exist)."""
        return self._do("list the sharded set's folder", "", lambda: self.backend.names(self.url))

    def stat(self, name: str) -> ObjectInfo | None:
        """Object ``name`` as the server has it now (None: not there)."""
        return self._do("look at it", name, lambda: self.backend.stat(self.where(name)))

    def has(self, name: str) -> bool:
        return self.stat(name) is not None

    def upload(self, local: str, name: str, metadata: dict[str, str]) -> None:
        """Put the finished file ``local`` at ``name`` in one upload (it appears whole, or not at all)."""
        self._do("upload it", name, lambda: self.backend.put_file(local, self.where(name), metadata))

    def put_json(self, name: str, value: Any) -> None:
        self._do("upload it", name, lambda: self.backend.put_bytes(self.where(name), json_bytes(value)))

    def remove(self, name: str) -> None:
        self._do("remove it", name, lambda: self.backend.remove(self.where(name)))

    def abort_uploads(self, name: str, started_before: float) -> int:
        """Abort the unfinished uploads of ``name`` begun before ``started_before``; returns how many."""
        return self._do(
            "abort its unfinished uploads", name, lambda: self.backend.abort_uploads(self.where(name), started_before)
        )

    def read_bytes(self, name: str, limit: int) -> bytes:
        """The bytes of a small object (at most ``limit``), fetched with retries; FileNotFoundError if absent."""
        return self._do("read it", name, lambda: fetch_bytes(self.where(name), self.backend, name, limit))
