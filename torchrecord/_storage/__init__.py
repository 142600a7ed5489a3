"""Storage: where the bytes of a remote set live, and the local files that stand in for them.

The one seam for remote reading and writing: :func:`backend_for` gives the
:class:`~torchrecord._storage.transport.Storage` that reaches a URL (a back end registered for its
scheme in :data:`BACKENDS`, else fsspec), or wraps what the user passed (``storage=``: a
``Storage``, a read-only ``Transport``, or an fsspec file system). Every remote read
(``cache.py``, ``fetch.py``) and write (``objects.py``) goes through it. See docs/ARCHITECTURE.md,
*How to add a storage back end*.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchrecord._storage.transport import FsspecStorage, Storage, Transport
from torchrecord.errors import ArgumentError

__all__ = ["BACKENDS", "backend_for", "scheme_of", "writable"]

#: URL scheme -> the back end for it, made from the user's ``storage_options``. Schemes not here
#: go to fsspec (:class:`FsspecStorage`), which knows ``s3``, ``gs``, ``http(s)``, ``file``...
BACKENDS: dict[str, Callable[[dict[str, Any] | None], Storage]] = {}


def scheme_of(url: str) -> str:
    """The scheme of ``url`` (``"s3"`` for ``s3://bucket/set``), lower case."""
    return url.split("://", 1)[0].lower() if "://" in url else ""


def backend_for(url: str, storage_options: dict[str, Any] | None = None, storage: Any = None) -> Transport:
    """The back end that reaches ``url``: ``storage`` if given (an fsspec file system is wrapped), else by scheme.

    Raises ArgumentError for a ``storage`` that is neither a transport nor an fsspec file system,
    or given together with ``storage_options``.
    """
    if storage is None:
        return BACKENDS.get(scheme_of(url), FsspecStorage)(storage_options)
    if storage_options:
        raise ArgumentError(
            f"{url}: pass storage_options= or storage=, not both (a storage object is already configured)"
        )
    if _is_fsspec(storage):
        return FsspecStorage(filesystem=storage)
    if isinstance(storage, Transport):
        return storage
    raise ArgumentError(
        f"{url}: storage={type(storage).__name__} is neither an fsspec file system nor a torchrecord storage "
        "back end (an object with open(url, deadline, size); see docs/s3.md)"
    )


def writable(backend: Transport, url: str) -> Storage:
    """``backend`` as a :class:`Storage` that can write, or ArgumentError naming what it lacks."""
    if isinstance(backend, Storage):
        return backend
    raise ArgumentError(
        f"{url}: storage={type(backend).__name__} can only read (it has open() but not names, stat, "
        "put_file, put_bytes, remove and abort_uploads); pass an fsspec file system or a full Storage to write"
    )


def _is_fsspec(obj: Any) -> bool:
    try:
        from fsspec import AbstractFileSystem
    except ImportError:
        return False
    return isinstance(obj, AbstractFileSystem)
