"""ShardedSet: several record-set files and their manifest, read as one record set.

The shards are concatenated in manifest order into one global index: sample
``g`` is sample ``g - offsets[s]`` of shard ``s``, where ``offsets`` are the
cumulative shard counts. A ShardedSet offers what readers use of a
:class:`~torchrecord.RecordFile` (length, schema, ``samples_per_record``,
``set_id``, random access, iteration) plus the shards themselves
(:meth:`ShardedSet.shard`), each opened lazily, in the process that reads, on
first use. A manifest given as a URL is read through a local cache
(``torchrecord._shards.remote``): a shard is fetched, checked and published into the
cache before it is opened.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from torchrecord._core.schema import Schema
from torchrecord._shards import manifest as _manifest
from torchrecord._shards.remote import ShardCache, fetch_manifest, is_url
from torchrecord._store.checked import Check, combine_checks, parse_check
from torchrecord._store.format import _describe_directory
from torchrecord._store.record_file import RecordFile
from torchrecord._store.subset import position as subset_position
from torchrecord.errors import FormatError, NotARecordSetError, RecordNotFoundError, TorchRecordError

__all__ = ["ShardedSet", "is_sharded"]


def is_sharded(path: str) -> bool:
    """True for a URL, a directory, or a path to a manifest file: what ShardedSet opens."""
    return is_url(path) or os.path.isdir(path) or os.path.basename(path) == _manifest.MANIFEST_NAME


class ShardedSet(RecordFile):
    """A sharded set (a directory or URL with ``manifest.json``) as one record set.

    ``RecordFile(path)`` returns one when ``path`` is a directory, a manifest
    file or a URL. ``len``, ``[i]``, iteration, ``schema``, ``metadata`` and
    ``set_id`` (the manifest's) cover all shards; :meth:`shard` opens one.

    Args:
        path: a directory holding ``manifest.json``, the manifest's path, or its
            URL (``http(s)://``, ``s3://``, ``gs://``, ``file://``: fsspec, extra
            ``remote``), or a URL prefix that holds ``manifest.json``.
        cache_dir: where shards of a remote set are fetched to (default: the
            ``torchrecord-cache`` folder in the temporary directory).
        cache_limit: bytes of fetched shards the cache keeps; shards a reader has
            finished with are evicted beyond it (None: no limit).
        subset: not supported here (ValueError): ``RecordDataset(path, subset=...)``
            reads a subset of a sharded set.
        check: integrity on read, for each shard: ``"checksums"`` (each record's
            CRC-32), ``"structure"`` (each shard's LMDB page structure before it
            is first opened in a process) or ``"full"`` (both; see :class:`RecordFile`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        subset: Any = None,
        cache_dir: str | None = None,
        cache_limit: int | None = None,
        check: Check | None = None,
    ) -> None:
        self.path = os.fsdecode(path)
        self._check = parse_check(check)
        self._checked = None
        self._lenient_count = False
        if subset is not None:
            raise ValueError(
                f"{self.path}: subset= is not supported on a sharded set's RecordFile; "
                "use RecordDataset(path, subset=...), or index the set (rf[indices])"
            )
        self._subset = None
        self.cache_dir = cache_dir
        self.cache_limit = cache_limit
        self._manifest: dict[str, Any] | None = None
        self._files: dict[int, RecordFile] = {}
        self._cache: ShardCache | None = None
        self._pid = os.getpid()

    # -- the manifest ---------------------------------------------------------
    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest (format version, shards with their counts and checksums, schema, seed...)."""
        if self._manifest is None:
            if is_url(self.path):
                where, text = fetch_manifest(self.path)
            else:
                where = self.path
                if os.path.isdir(where):
                    where = os.path.join(where, _manifest.MANIFEST_NAME)
                if not os.path.exists(where):
                    raise _not_a_set(self.path, where)
                with open(where, encoding="utf-8") as f:
                    text = f.read()
            self._manifest = _manifest.check_manifest(_manifest.parse_json(text, where), where)
        return self._manifest

    def _base(self) -> str:
        """The folder or URL prefix the shard names are relative to."""
        if os.path.isdir(self.path):
            return self.path
        if is_url(self.path) and not self.path.endswith(".json"):
            return self.path.rstrip("/")
        return self.path.rsplit("/", 1)[0] if is_url(self.path) else os.path.dirname(self.path)

    # -- RecordFile's description ---------------------------------------------------
    @property
    def metadata(self) -> dict[str, Any]:
        """The set's metadata, as a record set's (from the manifest), plus ``shards``."""
        m = self.manifest
        meta = {k: v for k, v in m.items() if k != "shards"}
        meta["records"] = sum(int(s["records"]) for s in m["shards"])
        meta["shards"] = len(m["shards"])
        return meta

    @property
    def schema(self) -> Schema:
        """The schema shared by every shard (shapes widened where shards differ)."""
        schema = self.manifest.get("schema")
        return Schema.from_dict(schema) if schema is not None else Schema({"t": "leaf"}, [])

    def __len__(self) -> int:
        return int(self.manifest["count"])

    def __repr__(self) -> str:
        return f"ShardedSet({self.path!r})"

    @property
    def samples_per_record(self) -> int:
        """Samples per LMDB value (the same in every shard)."""
        return int(self.manifest.get("samples_per_record", 1))

    @property
    def num_records(self) -> int:
        """LMDB values in all shards together."""
        return int(self.metadata["records"])

    @property
    def set_id(self) -> str:
        """The manifest's ``set_id`` (derived from its shards' ids)."""
        return str(self.manifest["set_id"])

    @property
    def size_bytes(self) -> int:
        """Bytes of every shard file together."""
        return sum(int(s["bytes"]) for s in self.manifest["shards"])

    def environment(self) -> tuple[Any, Any]:
        """Not available on a sharded set (TypeError): each shard has its own environment."""
        raise TypeError(f"{self.path}: a sharded set has one LMDB environment per shard: use .shard(i).environment()")

    @property
    def crc_db(self) -> Any:
        """Not available on a sharded set (TypeError): each shard has its own checksums."""
        raise TypeError(f"{self.path}: a sharded set has one checksum database per shard: use .shard(i).crc_db")

    @property
    def groups(self) -> Any:
        """None: sharded sets have no groups."""
        return None

    # -- shards -------------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        """Shards in the set."""
        return len(self.manifest["shards"])

    @property
    def shard_offsets(self) -> np.ndarray:
        """int64[num_shards + 1]: shard ``s`` holds global samples ``offsets[s] .. offsets[s+1]-1``."""
        counts = [int(s["count"]) for s in self.manifest["shards"]]
        return np.concatenate(([0], np.cumsum(counts, dtype=np.int64))).astype(np.int64)

    def shard_name(self, s: int) -> str:
        """The location of shard ``s`` (its path or URL), for messages."""
        return f"{self._base()}/{self.manifest['shards'][s]['name']}"

    def shard(self, s: int) -> RecordFile:
        """Shard ``s`` as a RecordFile, opened (and, for a remote set, fetched) on first use in this process."""
        self._check_process()
        rf = self._files.get(s)
        if rf is None:
            entry = self.manifest["shards"][s]
            if is_url(self.path):
                rf = self._fetched(s)
            else:
                rf = RecordFile(os.path.join(self._base(), entry["name"]), check=self._check)
            local = rf.path
            if rf.set_id != entry["set_id"] or len(rf) != entry["count"]:
                raise FormatError(
                    f"{local}: shard {s} is not the file the manifest lists (set_id {rf.set_id}, {len(rf)} samples; "
                    f"the manifest says {entry['set_id']}, {entry['count']}): it was rewritten after the set was "
                    "finalized; run torchrecord.finalize_shards again"
                )
            self._files[s] = rf
        return rf

    def _fetched(self, s: int) -> RecordFile:
        """Shard ``s`` of a remote set, fetched into the cache and opened."""
        cache = self._remote()
        try:
            rf = RecordFile(cache.fetch(s), check=self._check)
            len(rf)  # open it now: its mapping outlives an eviction by another process
        except RecordNotFoundError:  # evicted by another reader between the fetch and the open
            rf = RecordFile(cache.fetch(s), check=self._check)
            len(rf)
        return rf

    def prefetch(self, plan: Sequence[int]) -> None:
        """The shards (``plan``) this process will read, in order: a remote set fetches them ahead."""
        if is_url(self.path):
            self._remote().plan(plan)

    def release(self, s: int) -> None:
        """This process has finished with shard ``s`` for now: a remote cache may evict it over its limit."""
        self._files.pop(s, None)
        if self._cache is not None:
            self._cache.release(s)

    def _remote(self) -> ShardCache:
        if self._cache is None:
            self._cache = ShardCache(self._base(), self.manifest, self.cache_dir, self.cache_limit)
        return self._cache

    def _check_process(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's shards, cache thread and handles are not ours
            self._files, self._cache, self._pid = {}, None, os.getpid()

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, index in that shard) of global sample ``index`` (in range)."""
        s = int(np.searchsorted(self.shard_offsets, index, side="right")) - 1
        return s, index - int(self.shard_offsets[s])

    # -- access ---------------------------------------------------------------------
    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.__getitems__(range(*index.indices(len(self))))
        if isinstance(index, (list, tuple)) or getattr(index, "ndim", 0) > 0:
            return self.__getitems__(index)
        position = subset_position(index, len(self), self.path)
        s, local = self.locate(position)
        return self.shard(s)[local]

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """The samples at ``indices``, each read from its shard."""
        return [self[i] for i in self._sample_indices(indices).tolist()]

    def check(self) -> dict[str, Any]:
        """Read and check the manifest; returns the set's metadata."""
        return self.metadata

    def raw(self, record: int) -> bytes:
        """Stored bytes of global record ``record`` (the shards' records, concatenated)."""
        counts = [int(e["records"]) for e in self.manifest["shards"]]
        n = sum(counts)
        position = record + n if record < 0 else record
        if not 0 <= position < n:
            raise IndexError(f"record index {record} out of range for {self.path} with {n} records")
        for s, c in enumerate(counts):
            if position < c:
                return self.shard(s).raw(position)
            position -= c
        raise AssertionError("unreachable")

    def __iter__(self) -> Iterator[Any]:
        for s in range(self.num_shards):
            yield from self.shard(s)
            self.release(s)

    def group(self, g: int) -> list[Any]:
        """IndexError: a sharded set has no groups (write_shard does not take group_by)."""
        raise IndexError(f"group index {g} out of range for {self.path}: a sharded set has no groups")

    def _require_check(self, check: str | None) -> None:
        """Turn on ``check`` for every shard opened from now on."""
        combined = combine_checks(self._check, parse_check(check))
        if combined != self._check:
            self._check = combined
            self._files = {}

    def close(self) -> None:
        """Close the opened shards (they open again on next use)."""
        files, self._files = self._files, {}
        for rf in files.values():
            rf.close()

    def __enter__(self) -> ShardedSet:
        self.manifest  # noqa: B018  (read and checked now)
        return self

    def __getstate__(self) -> dict[str, Any]:
        # the manifest travels with the set, so every worker reads the same snapshot of it
        return {
            "path": self.path,
            "cache_dir": self.cache_dir,
            "cache_limit": self.cache_limit,
            "m": self._manifest,
            "check": self._check,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["path"],
            cache_dir=state["cache_dir"],
            cache_limit=state["cache_limit"],
            check=state.get("check"),
        )
        self._manifest = state["m"]


def _not_a_set(path: str, manifest: str) -> TorchRecordError:
    """The error for a folder (or manifest path) without a manifest."""
    if not os.path.isdir(path):
        return RecordNotFoundError(f"{path}: no sharded-set manifest here; check the path")
    if any(_manifest.parse_shard_name(name) for name in os.listdir(path)):
        return NotARecordSetError(
            f"{path}: is a directory of shards without {_manifest.MANIFEST_NAME}: the set was never finalized; "
            "run torchrecord.finalize_shards on it (it names any missing shard)"
        )
    return NotARecordSetError(
        f"{path}: is a directory{_describe_directory(path)} (a sharded set is a directory with "
        f"{_manifest.MANIFEST_NAME}: write_shard, finalize_shards)"
    )
