"""open_set: one way to open a record set, a single file or a sharded set, from where it is.

The top of the sets layer: every reader (``RecordDataset``, ``MixedDataset``,
``StreamDataset``, the robomimic datasets, ``load``, ``verify``, the command
line) opens what it is given through :func:`open_set` and reads it as a
:class:`~torchrecord.RecordSet`.
"""

from __future__ import annotations

import os
from typing import Any

from torchrecord._shards.sharded import ShardedSet
from torchrecord._store.checked import Check
from torchrecord._store.paths import expand, folder_hint
from torchrecord._store.record_file import RecordFile
from torchrecord._store.record_set import RecordSet, is_sharded
from torchrecord.errors import ArgumentError, NotARecordSetError

__all__ = ["SetLike", "open_set"]

#: What a reader takes as a record set: a path (str, bytes, path-like) or an open set.
SetLike = str | bytes | os.PathLike[str] | os.PathLike[bytes] | RecordSet


def open_set(
    path: SetLike,
    *,
    subset: Any = None,
    cache_dir: str | None = None,
    cache_limit: int | None = None,
    check: Check | None = None,
    storage_options: dict[str, Any] | None = None,
    storage: Any = None,
) -> RecordSet:
    """Open the record set at ``path``: a :class:`~torchrecord.RecordFile` or a :class:`~torchrecord.ShardedSet`.

    A file path opens one file; a directory, a ``manifest.json`` path or a URL
    (``http(s)://``, ``s3://``, ``gs://``, ``file://``) opens a sharded set
    (its manifest is read and checked now). A set already open is returned
    as it is, with ``check`` turned on if asked; options that would change
    which samples it reads or where it caches are refused.

    Args:
        path: a record-set file, a sharded set's folder, manifest or URL, or a
            :class:`~torchrecord.RecordSet`.
        subset: read only these samples of a single file (see
            :class:`~torchrecord.RecordFile`); not for a sharded set (ValueError:
            ``RecordDataset(path, subset=...)`` reads a subset of one).
        cache_dir: for a remote sharded set: where its shards are fetched to
            (see :class:`~torchrecord.ShardedSet`); ignored for local sets.
        cache_limit: for a remote sharded set: bytes of fetched shards to keep
            (None: ``$TORCHRECORD_CACHE_LIMIT``, else 20 GiB).
        check: ``"structure"``: check LMDB's page structure of each file before
            it is first mapped in a process (files of unknown provenance; see
            :class:`~torchrecord.RecordFile`). None: trust the structure.
        storage_options: for a remote sharded set: keyword arguments for its
            fsspec file system (for ``s3://``: s3fs's ``key``, ``secret``,
            ``endpoint_url``...; None: the ``AWS_*`` environment variables).
            Readers other than ``RecordDataset`` take the set this returns.
        storage: for a remote sharded set: the storage back end instead of the one
            built from ``storage_options``: an fsspec file system, or an object with
            ``open(url, deadline, size)`` (see :class:`~torchrecord.ShardedSet`).

    Returns:
        The set, read lazily: a file opens on first use (its path is checked
        now), a shard when it is first read. A leading ``~`` is expanded.

    Raises:
        ValueError: ``subset`` for a sharded set, or ``subset``, ``cache_dir`` or
            ``cache_limit`` given with a set already open.
        torchrecord.errors.RecordNotFoundError: no set at ``path``.
        torchrecord.errors.NotARecordSetError: a folder that holds no finalized
            sharded set (a folder of shards never finalized says so; a folder of
            record sets names one, a Hugging Face ``save_to_disk`` folder names
            ``torchrecord convert``), or a path through a file (``"set.tr/"``).

    Example:
        >>> rs = open_set("train.tr")                   # doctest: +SKIP
        >>> shards = open_set("train-shards/")          # doctest: +SKIP
        >>> len(shards), shards.num_shards, shards[0]   # doctest: +SKIP
    """
    if isinstance(path, RecordSet):
        options = {
            "subset": subset,
            "cache_dir": cache_dir,
            "cache_limit": cache_limit,
            "storage_options": storage_options,
            "storage": storage,
        }
        given = [name for name, value in options.items() if value is not None]
        if given:
            raise ArgumentError(
                f"{path.path}: {', '.join(given)} cannot be applied to a set already open; "
                f"open the path with them instead: open_set({path.path!r}, {given[0]}=...)"
            )
        path._require_check(check)
        return path
    where = expand(path)  # ~ as the shell reads it
    if is_sharded(where):
        hint = folder_hint(where)  # a folder of record sets, or a Hugging Face dataset on disk
        if hint is not None:
            raise NotARecordSetError(hint)
        return ShardedSet(
            where,
            subset=subset,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            check=check,
            storage_options=storage_options,
            storage=storage,
        )
    return RecordFile(where, subset=subset, check=check)
