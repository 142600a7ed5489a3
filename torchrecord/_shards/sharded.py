"""ShardedSet: several record-set files and their manifest, read as one record set.

The shards are concatenated in manifest order into one global index: sample
``g`` is sample ``g - offsets[s]`` of shard ``s``, where ``offsets`` are the
cumulative shard counts. A ShardedSet is a :class:`~torchrecord.RecordSet`, as a
:class:`~torchrecord.RecordFile` is: length, schema, ``samples_per_record``,
``set_id``, random access, iteration, and the shards themselves
(:meth:`ShardedSet.shard`, each a RecordFile), each opened lazily, in the
process that reads, on first use. A manifest given as a URL is read through the storage
seam (``torchrecord._storage``): a shard is fetched, checked and published into a local
cache before it is opened.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from torchrecord._core.schema import Schema
from torchrecord._shards import manifest as _manifest
from torchrecord._shards.entries import check_shard, check_shard_file
from torchrecord._storage import backend_for
from torchrecord._storage.cache import ShardCache
from torchrecord._storage.fetch import fetch_bytes
from torchrecord._storage.transport import Storage, Transport
from torchrecord._store.checked import Check, combine_checks, parse_check
from torchrecord._store.claims import fixed_sample_bytes
from torchrecord._store.opening import describe_directory
from torchrecord._store.record_file import RecordFile
from torchrecord._store.record_set import RecordSet, _integer, is_sharded, is_url, not_one_file
from torchrecord.errors import (
    ArgumentError,
    FetchError,
    IndexOutOfRangeError,
    NotARecordSetError,
    RecordNotFoundError,
    TorchRecordError,
)

__all__ = ["ShardedSet", "is_sharded"]


class ShardedSet(RecordSet):
    """A sharded set (a directory or URL with ``manifest.json``) as one record set.

    :func:`torchrecord.open_set` returns one when ``path`` is a directory, a
    manifest file or a URL. ``len``, ``[i]``, iteration, ``schema``, ``metadata``
    and ``set_id`` (the manifest's) cover all shards; :meth:`shard` opens one, a
    :class:`~torchrecord.RecordFile`. The manifest is read (for a URL: fetched)
    and checked when the ShardedSet is made, so a folder that holds no finalized
    set fails here; the shards open on first use.

    Args:
        path: a directory holding ``manifest.json``, the manifest's path, or its
            URL (``http(s)://``, ``s3://``, ``gs://``, ``file://``: fsspec, extra
            ``remote``), or a URL prefix that holds ``manifest.json``.
        cache_dir: where shards of a remote set are fetched to (None:
            ``$TORCHRECORD_CACHE``, else ``$XDG_CACHE_HOME/torchrecord``, else
            ``~/.cache/torchrecord``); a folder of the user's own (another
            user's is refused), where the cache touches only what it downloaded.
        cache_limit: bytes of fetched shards (and downloads in flight) the cache
            keeps; shards a reader has finished with are evicted beyond it (None:
            ``$TORCHRECORD_CACHE_LIMIT``, else 20 GiB).
        storage_options: for a remote set: keyword arguments for its fsspec file system (for
            ``s3://``: s3fs's ``key``, ``secret``, ``endpoint_url``...; None: the back end's
            defaults, for S3 the ``AWS_*`` environment variables). See docs/s3.md.
        storage: for a remote set: the storage back end to read it through instead of the one built
            from ``storage_options``: an fsspec file system (e.g. ``s3fs.S3FileSystem(...)``), or an
            object with ``open(url, deadline, size)`` (see docs/s3.md); it must pickle, for
            DataLoader workers.
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
        storage_options: dict[str, Any] | None = None,
        storage: Any = None,
    ) -> None:
        self.path = os.fsdecode(path)
        self.storage_options = dict(storage_options) if storage_options else None
        self.storage = storage
        if is_url(self.path):
            backend_for(self.path, self.storage_options, storage)  # a storage it cannot use fails here
        if subset is not None:
            raise ArgumentError(
                f"{self.path}: subset= is not supported on a sharded set; "
                "use RecordDataset(path, subset=...), or index the set (rs[indices])"
            )
        self._setup(cache_dir, cache_limit, parse_check(check), None)
        self.read_header()  # a folder without a finalized set fails here, not at len()

    def _setup(
        self, cache_dir: str | None, cache_limit: int | None, check: Check | None, manifest: dict[str, Any] | None
    ) -> None:
        self.cache_dir = cache_dir
        self.cache_limit = cache_limit
        self._check: Check | None = check
        self._manifest = manifest
        self._files: dict[int, RecordFile] = {}
        self._cache: ShardCache | None = None
        self._pid = os.getpid()

    # -- the manifest ---------------------------------------------------------
    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest (format version, shards with their counts and checksums, schema, seed...)."""
        if self._manifest is None:
            if is_url(self.path):
                where, text = self._fetch_manifest()
            else:
                where = self.path
                if os.path.isdir(where):
                    where = os.path.join(where, _manifest.MANIFEST_NAME)
                if not os.path.lexists(where):
                    raise _not_a_set(self.path, where)
                text = _manifest.read_text(where)  # a FIFO, a folder or a link loop is refused, never read
            manifest = _manifest.check_manifest(_manifest.parse_json(text, where), where)
            if not is_url(self.path):
                self._check_local_shards(manifest)
            self._manifest = manifest
            if is_url(self.path):
                try:
                    self._check_empty_remote_shards()
                except BaseException:
                    self._manifest = None
                    raise
        return self._manifest

    def _backend(self) -> Transport:
        return backend_for(self.path, self.storage_options, self.storage)

    def _fetch_manifest(self) -> tuple[str, str]:
        """(the manifest's URL, its text), fetched now from the server (never from a cached listing)."""
        where = self.path if self.path.endswith(".json") else self.path.rstrip("/") + "/" + _manifest.MANIFEST_NAME
        backend = self._backend()
        try:
            data = fetch_bytes(where, backend, "the manifest")
        except FileNotFoundError:
            if _lists_shards(backend, where.rsplit("/", 1)[0]):
                raise NotARecordSetError(
                    f"{where}: not there, but shards are: the set was never finalized (or its writer stopped "
                    "before publishing the manifest); run torchrecord.finalize_shards on its folder, then open it"
                ) from None
            raise FetchError(f"{where}: no manifest there (finalize the set, or check the URL)") from None
        return where, _manifest.decode_text(data, where)

    def _check_empty_remote_shards(self) -> None:
        """Fetch the shards a remote manifest says hold no samples and check each against its entry.

        Readers never open a shard whose count is 0, so a manifest that says 0 of a shard that
        holds samples would drop them silently: checked when the set is opened (such shards are
        small: a real empty shard is a few KiB).
        """
        manifest = self.manifest
        for s, entry in enumerate(manifest["shards"]):
            if entry["count"] == 0:
                rf = self._fetched(s)
                try:
                    check_shard(rf, s, manifest)
                finally:
                    rf._let_go(hard=True)

    def _check_local_shards(self, manifest: dict[str, Any]) -> None:
        """Each shard file's size against its entry's claims; a shard that claims no samples is opened now.

        Readers size their index arrays by the counts before any shard is read, and
        never open a shard whose count is 0, so these are the claims to check first.
        """
        base = self._base()
        per_sample = fixed_sample_bytes((manifest.get("schema") or {}).get("fields", []))
        for s, entry in enumerate(manifest["shards"]):
            check_shard_file(entry, s, os.path.join(base, entry["name"]), per_sample)
        self._check_headers(manifest, [s for s, entry in enumerate(manifest["shards"]) if entry["count"] == 0])

    def _check_headers(self, manifest: dict[str, Any] | None = None, shards: list[int] | None = None) -> None:
        """Open the metadata of local shards (all by default) and check each against its manifest entry.

        ``info`` describes a set by its manifest: this makes what it says true of the
        files. A remote set's shards are checked when they are fetched instead.
        """
        if is_url(self.path):
            return
        manifest = self.manifest if manifest is None else manifest
        base = self._base()
        for s in range(len(manifest["shards"])) if shards is None else shards:
            path = os.path.join(base, manifest["shards"][s]["name"])
            if not os.path.lexists(path):
                continue  # a missing shard is named when it is read
            rf = RecordFile(path, check=self._check)
            try:
                check_shard(rf, s, manifest)
            finally:
                rf._let_go(hard=True)

    def _base(self) -> str:
        """The folder or URL prefix the shard names are relative to."""
        if os.path.isdir(self.path):
            return self.path
        if is_url(self.path) and not self.path.endswith(".json"):
            return self.path.rstrip("/")
        return self.path.rsplit("/", 1)[0] if is_url(self.path) else os.path.dirname(self.path)

    # -- the set's description --------------------------------------------------------
    def read_header(self) -> dict[str, Any]:
        """Read and check the manifest (once: it is kept); returns the set's metadata."""
        return self.metadata

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

    @property
    def groups(self) -> np.ndarray | None:
        """None: sharded sets have no groups (``write_shard`` does not take ``group_by``)."""
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
        """Shard ``s`` as a RecordFile, opened (and, for a remote set, fetched) on first use in this process.

        Args:
            s: the shard index (IndexError outside ``0 .. num_shards - 1``).
        """
        s = _integer(s, "shard index", self.path)
        if not 0 <= s < self.num_shards:
            raise IndexOutOfRangeError(
                f"shard {s} out of range for {self.path}, a sharded set of {self.num_shards} shards"
            )
        self._check_process()
        rf = self._files.get(s)
        if rf is None:
            entry = self.manifest["shards"][s]
            if is_url(self.path):
                rf = self._fetched(s)
            else:
                rf = RecordFile(os.path.join(self._base(), entry["name"]), check=self._check)
            check_shard(rf, s, self.manifest)
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
        """The shards (``plan``) this process will read, in order: a remote set fetches them ahead.

        Args:
            plan: shard indices in the order they will be read.
        """
        if is_url(self.path):
            self._remote().plan(plan)

    def release(self, s: int) -> None:
        """This process has finished with shard ``s`` for now: a remote cache may evict it over its limit.

        Args:
            s: the shard.
        """
        self._files.pop(s, None)
        if self._cache is not None:
            self._cache.release(s)

    def _remote(self) -> ShardCache:
        if self._cache is None:
            self._cache = ShardCache(self._base(), self.manifest, self.cache_dir, self.cache_limit, self._backend())
        return self._cache

    def _check_process(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's shards, cache thread and handles are not ours
            self._files, self._cache, self._pid = {}, None, os.getpid()

    def _record_offsets(self) -> list[int]:
        """Where each shard's records begin among all records (and the total at the end)."""
        out = [0]
        for entry in self.manifest["shards"]:
            out.append(out[-1] + int(entry["records"]))
        return out

    def _locate_record(self, record: int) -> tuple[int, int]:
        """(shard, record in that shard) of global record ``record``; IndexError outside the set."""
        record = _integer(record, "record index", self.path)
        bounds = self._record_offsets()
        n = bounds[-1]
        position = record + n if record < 0 else record
        if not 0 <= position < n:
            raise IndexOutOfRangeError(f"record index {record} out of range for {self.path} with {n} records")
        s = bisect.bisect_right(bounds, position) - 1
        return s, position - bounds[s]

    # -- access ---------------------------------------------------------------------
    def _sample(self, position: int) -> Any:
        s, local = self.locate(position)
        return self.shard(s)[local]

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """The samples at ``indices`` (ints, negative from the end), each shard's read in one transaction.

        Args:
            indices: sample indices, a list or 1-d integer array.
        """
        positions = self._positions(indices)
        if len(positions) == 0:
            return []
        offsets = self.shard_offsets
        shards = np.searchsorted(offsets, positions, side="right") - 1
        out: list[Any] = [None] * len(positions)
        for s in np.unique(shards).tolist():
            where = np.flatnonzero(shards == s)
            samples = self.shard(s).__getitems__(positions[where] - offsets[s])
            for i, sample in zip(where.tolist(), samples):
                out[i] = sample
        return out

    def raw(self, record: int) -> bytes:
        """Stored bytes of global record ``record`` (the shards' records, concatenated).

        Args:
            record: the record index over all shards (negative counts from the end).
        """
        s, local = self._locate_record(record)
        return self.shard(s).raw(local)

    def decode(self, value: bytes | memoryview, index: int) -> Any:
        """Decode the stored ``value`` of global record ``index`` (one sample per record) with its shard.

        Args:
            value: the stored bytes.
            index: the record index over all shards.
        """
        s, local = self._locate_record(index)
        return self.shard(s).decode(value, local)

    def decode_record(self, value: bytes | memoryview, record: int, row: int | None = None) -> list[Any]:
        """Decode the stored ``value`` of global record ``record`` into its samples, with its shard.

        Args:
            value: the stored bytes.
            record: the record index over all shards.
            row: only this sample of a chunked record (a list of one).
        """
        s, local = self._locate_record(record)
        return self.shard(s).decode_record(value, local, row)

    def __iter__(self) -> Iterator[Any]:
        for s in range(self.num_shards):
            yield from self.shard(s)
            self.release(s)

    def _read_range(self, lo: int, hi: int) -> list[Any]:
        offsets = self.shard_offsets
        out: list[Any] = []
        for s in range(self.num_shards):
            a, b = max(lo, int(offsets[s])), min(hi, int(offsets[s + 1]))
            if a < b:
                out.extend(self.shard(s)._read_range(a - int(offsets[s]), b - int(offsets[s])))
        return out

    def _require_check(self, check: str | None) -> None:
        """Turn on ``check`` for every shard opened from now on."""
        combined = combine_checks(self._check, parse_check(check))
        if combined != self._check:
            self._check = combined
            self._files = {}

    def close(self) -> None:
        """Close the opened shards (they open again on next use)."""
        self._let_go(hard=True)

    def _let_go(self, hard: bool) -> None:
        files, self._files = self._files, {}
        for rf in files.values():
            rf._let_go(hard)

    def __enter__(self) -> ShardedSet:
        self.read_header()
        return self

    def __getstate__(self) -> dict[str, Any]:
        # the manifest travels with the set, so every worker reads the same snapshot of it
        return {
            "path": self.path,
            "cache_dir": self.cache_dir,
            "cache_limit": self.cache_limit,
            "m": self._manifest,
            "check": self._check,
            "storage_options": self.storage_options,
            "storage": self.storage,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.storage_options = state.get("storage_options")
        self.storage = state.get("storage")
        self._setup(state["cache_dir"], state["cache_limit"], state.get("check"), state["m"])


def _not_a_set(path: str, manifest: str) -> TorchRecordError:
    """The error for a folder (or manifest path) without a manifest."""
    if not os.path.isdir(path):
        return RecordNotFoundError(f"{path}: no sharded-set manifest here; check the path")
    if any(_manifest.parse_shard_name(name) for name in os.listdir(path)):
        return not_one_file(path)  # the shards of a set never finalized
    return NotARecordSetError(
        f"{path}: is a directory{describe_directory(path)} (a sharded set is a directory with "
        f"{_manifest.MANIFEST_NAME}: write_shard, finalize_shards)"
    )


def _lists_shards(backend: Transport, prefix: str) -> bool:
    """True when ``prefix`` (a URL folder) holds shard files; False when it does not or cannot be listed."""
    if not isinstance(backend, Storage):
        return False
    try:
        names = backend.names(prefix)
    except Exception:  # listing is a courtesy for the message: any failure means "cannot tell"
        return False
    return any(_manifest.parse_shard_name(name) for name in names)
