"""RecordFile: random access to a record set of one file, opened lazily in the process that reads.

Long because it is the one facade over a file: opening and identity, metadata, the
checks asked for, single lookups, slices and iteration, decoding, groups and block
checksums; the work behind each lives in the ``_store`` modules it calls.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lmdb
import numpy as np

from torchrecord._core.schema import Schema
from torchrecord._store import checked as _checked
from torchrecord._store import claims as _claims
from torchrecord._store import envcache as _envcache
from torchrecord._store import format as _format
from torchrecord._store import paths as _paths
from torchrecord._store.crc_blocks import BlockChecksums, read_block_checksums
from torchrecord._store.groups import read_offsets
from torchrecord._store.identity import set_id_of
from torchrecord._store.record_decode import RecordDecoding
from torchrecord._store.record_set import RecordSet, _integer, is_sharded, not_one_file
from torchrecord._store.subset import Subset
from torchrecord._store.subset import resolve as resolve_subset
from torchrecord._store.walk import PIECE, Walk, check_crc, record_runs
from torchrecord.errors import (
    CorruptRecordError,
    IndexOutOfRangeError,
    InternalError,
    NotARecordSetError,
    RecordReplacedError,
    StructureError,
)

__all__ = ["RecordFile", "shard_file"]


def shard_file(records: RecordSet, s: int) -> RecordFile:
    """Shard ``s`` of ``records``, typed as the single file every shard is (``RecordSet`` cannot name this
    class: this module builds on it)."""
    shard = records.shard(s)
    if not isinstance(shard, RecordFile):
        raise InternalError(f"{records.path}: shard {s} is a {type(shard).__name__}, not a single record file")
    return shard


class RecordFile(RecordDecoding, RecordSet):
    r"""Map-style, read-only access to the records of a record set in one file.

    ``rf[i]`` is the i-th stored sample (negative indices count from the end),
    with the structure, kinds, dtypes and shapes it was written with; ``rf[2:10]``
    and ``rf[[1, 5, 9]]`` (or an integer array) give lists of samples, read in
    one transaction, and so does ``__getitems__``, which a map-style DataLoader
    calls once per batch. Iteration walks the records in stored order with one
    cursor.

    The LMDB environment is opened on first use, read-only and without a lock
    file, and re-opened after a fork; a RecordFile pickles as its path, subset
    and identity alone, so it can be handed to DataLoader workers under fork,
    spawn or forkserver.

    A RecordFile reads one record set: the one its writer published (for the
    RecordFile ``write_record`` returns) or the one it first opened. While it is
    open it keeps reading that set even if the path is replaced (a snapshot);
    re-opened after :meth:`close`, or in a process it was pickled to, it
    raises :class:`~torchrecord.errors.RecordReplacedError` if the path now
    holds another set. :meth:`close` (or leaving a ``with`` block) releases the
    file's descriptor and mapping once no other RecordFile of this process uses
    the file and no iteration over it is running; a RecordFile dropped without
    ``close`` leaves its file in a small per-process cache of idle files.

    A RecordFile is one file: a sharded set (a directory, a ``manifest.json`` or
    a URL; see :func:`torchrecord.write_shard`) is a
    :class:`~torchrecord.ShardedSet`, and ``RecordFile`` of its path raises
    :class:`~torchrecord.errors.NotARecordSetError` saying so. Both are
    :class:`~torchrecord.RecordSet`\ s; :func:`torchrecord.open_set` opens either.

    Args:
        path: a record set written by :func:`torchrecord.write_record` (one file).
        subset: read only these samples: a ``range``, a ``slice``, a sequence or
            array of sample indices, or a boolean mask with one entry per sample.
            ``len()``, indexing and iteration then see the selected samples in
            the order given (``rf[0]`` is the first selected sample). A subset
            is checked against the set when the RecordFile is made (which opens
            the file); without one, the file opens on first use.
        check: integrity on read. ``"checksums"``: each record's CRC-32 is checked as
            it is read (:class:`~torchrecord.errors.ChecksumError` on a mismatch).
            ``"structure"`` for a file of unknown provenance (downloaded, copied
            from elsewhere, written by someone else): LMDB's page structure is
            checked in pure Python before liblmdb maps the file, so a damaged
            file raises :class:`~torchrecord.errors.StructureError` instead of
            killing the process. The check runs here, when the RecordFile is
            made, once per file per process: copies pickled into DataLoader
            workers remember it, unless the file changed since (size,
            modification time). It reads the whole file once and costs about
            1.5 us per record: 0.2 s per 100 MB of 3 KB images, 1 s per 100 MB
            of 72-byte vectors (``python -m benchmarks.checks``; see
            docs/GUARANTEES.md). ``"full"``: both. None (default): trust the file.

    Example:
        >>> rf = RecordFile("train.tr")                      # doctest: +SKIP
        >>> len(rf), rf.schema, rf[0]                        # doctest: +SKIP
        >>> val = RecordFile("train.tr", subset=range(9000, 10000))  # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | bytes | os.PathLike[str] | os.PathLike[bytes],
        *,
        subset: Any = None,
        check: _checked.Check | None = None,
    ) -> None:
        self.path = _paths.expand(path)  # bytes paths too, as str for messages; ~ expanded
        self._check = _checked.parse_check(check)
        self._checked: _checked.Identity | None = None  # the file that passed the structural check
        self._lenient_count = False  # verify: the count may claim missing records (each is reported)
        self._handle: _envcache.Handle | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None  # gives the handle back when this is dropped
        self._inode: tuple[int, int] | None = None  # the file read before: kept while this process has it open
        self._pin: str | None = None  # the set_id of the set this RecordFile reads, once known
        self._meta: dict[str, Any] | None = None
        self._schema: Schema | None = None
        self._records_db: Any = None
        self._crc_db: Any = None
        self._subset: Subset | None = None
        if is_sharded(self.path):  # a folder, manifest or URL: a sharded set (or nothing), never one file
            raise not_one_file(self.path)
        _paths.require_file(self.path)  # a stat, no handle: a missing file fails here, not at first use
        if _checked.checks_structure(self._check):
            self._checked = _checked.ensure(self.path)
        if subset is not None:
            self._subset = resolve_subset(subset, self._set_count(), self.path)

    # -- lazy opening -------------------------------------------------------
    def _open(self) -> lmdb.Environment:
        handle = self._handle
        if handle is not None and handle.usable():
            return handle.env
        self._let_go(hard=False)  # an inherited handle (forked): a no-op besides forgetting it
        handle = self._acquire()
        try:
            self._attach(handle)
        except BaseException:
            _envcache.release(handle, hard=False)
            raise
        return handle.env

    def _attach(self, handle: _envcache.Handle) -> None:
        """Read the metadata through ``handle`` (a reference this RecordFile now owns) and keep it."""
        env = handle.env
        try:
            meta = _format.read_metadata(env, self.path)
            self._records_db = env.open_db(_format.RECORDS_DB, create=False)
            self._crc_db = env.open_db(_format.CRC_DB, create=False) if meta.get("checksum") else None
        except lmdb.Error as exc:
            raise NotARecordSetError(f"{self.path}: missing database ({exc})") from None
        _claims.check_claims(env, self._records_db, meta, self.path, slack=self._lenient_count)
        self._pin = self._check_identity(env, meta)
        self._handle, self._meta, self._inode = handle, meta, handle.inode
        self._finalizer = weakref.finalize(self, _envcache.release, handle, False)
        self._finalizer.atexit = False
        schema = meta.get("schema")
        self._schema = Schema.from_dict(schema) if schema is not None else Schema({"t": "leaf"}, [])

    def _check_identity(self, env: lmdb.Environment, meta: dict[str, Any]) -> str:
        """The set_id of the set in ``env``; RecordReplacedError if this RecordFile reads another set."""
        found = meta.get("set_id")
        if not (isinstance(found, str) and found):
            with _format.lmdb_errors(self.path), env.begin() as txn:
                raw = txn.get(_format.META_KEY, db=env.open_db(_format.META_DB, create=False))
            found = set_id_of(meta, bytes(raw or b""))
        if self._pin is not None and found != self._pin:
            raise RecordReplacedError(
                f"{self.path}: holds another record set now (set_id {found}) than the one this RecordFile reads "
                f"(set_id {self._pin}): the file was replaced after it was written or first opened (a write with "
                f"overwrite=True). Open RecordFile({self.path!r}) again to read the set now there"
            )
        return found

    def _let_go(self, hard: bool) -> None:
        """Give back this RecordFile's reference to its environment (``hard``: drop it if it was the last).

        Not hard (a reader's pass ended): the file stays in the process's small
        cache of idle files, so the next use finds it, and its snapshot, again
        unless the cache needed the room. At interpreter exit (a reader's iterator
        left open is closed while modules are torn down) it does nothing: the
        process's end closes the file.
        """
        if sys.is_finalizing():
            return
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None and finalizer.detach() is not None and self._handle is not None:
            _envcache.release(self._handle, hard)
        self._handle = None
        self._records_db = self._crc_db = None
        self.__dict__.pop("_group_offsets", None)
        self.__dict__.pop("_crc_blocks", None)

    def read_header(self) -> dict[str, Any]:
        """Open the file, read and check its metadata and databases, and close it again; returns the metadata.

        Raises the same errors as the first real use would (missing path, a
        directory, an image, not a record set, newer version, truncated...),
        but leaves no descriptor or mapping behind unless this process already
        had the file open: for checking a path in a process that will not read.
        """
        if not _checked.checks_structure(self._check):
            return _envcache.read_closed(self.path, self._read_description)
        for _ in range(3):
            self._checked = _checked.ensure(self.path, self._checked)
            meta = _envcache.read_closed(self.path, self._read_description)
            if _checked.identity(self.path) == self._checked:
                return meta
        raise StructureError(f"{self.path}: the file keeps changing while it is opened; try again when it is not")

    def _require_check(self, check: str | None) -> None:
        """Turn on ``check`` too for this RecordFile (a dataset was given it with ``check=``); checks now."""
        check = _checked.parse_check(check)
        before = self._check
        self._check = _checked.combine_checks(before, check)
        if _checked.checks_structure(self._check) and not _checked.checks_structure(before):
            self._checked = _checked.ensure(self.path)

    def _acquire(self) -> _envcache.Handle:
        """This process's handle of the file; with ``check="structure"`` only after the file passed the check."""
        if not _checked.checks_structure(self._check):
            return _envcache.acquire(self.path, self._inode)
        for _ in range(3):
            self._checked = _checked.ensure(self.path, self._checked)
            handle = _envcache.acquire(self.path, self._inode)
            if _checked.identity(self.path) == self._checked:  # the file opened is the file checked
                return handle
            _envcache.release(handle, hard=False)
        raise StructureError(f"{self.path}: the file keeps changing while it is opened; try again when it is not")

    def _read_description(self, env: lmdb.Environment) -> dict[str, Any]:
        meta = _format.read_metadata(env, self.path)
        try:
            records_db = env.open_db(_format.RECORDS_DB, create=False)
            if meta.get("checksum"):
                env.open_db(_format.CRC_DB, create=False)
        except lmdb.Error as exc:
            raise NotARecordSetError(f"{self.path}: missing database ({exc})") from None
        _claims.check_claims(env, records_db, meta, self.path, slack=self._lenient_count)
        if self._pin is not None:
            self._check_identity(env, meta)
        return meta

    def close(self) -> None:
        """Release the file: its descriptor and mapping are freed unless another RecordFile of this
        process uses it, or an iteration over it is still running (then when that ends).

        The RecordFile stays usable: it opens the file again on next use (and
        raises RecordReplacedError if the path holds another set by then).
        """
        self._let_go(hard=True)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "subset": self._subset,
            "check": self._check,
            "checked": self._checked,
            "set_id": self._pin,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        RecordFile.__init__(self, state["path"])
        self._subset = state.get("subset")  # already resolved: no need to open here
        # the structural check passed where this copy was made: not again unless the file changed
        self._check, self._checked = state.get("check"), state.get("checked")
        self._pin = state.get("set_id")

    def __enter__(self) -> RecordFile:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- description --------------------------------------------------------
    @property
    def metadata(self) -> dict[str, Any]:
        """The metadata map (format version, count, schema, seed, user metadata...)."""
        if self._meta is None:  # read once: a RecordFile reads one set (see RecordReplacedError)
            self._open()
        assert self._meta is not None
        return self._meta

    @property
    def schema(self) -> Schema:
        """The field schema: names, kinds, dtypes and shapes."""
        if self._schema is None:
            self._open()
        assert self._schema is not None
        return self._schema

    def __len__(self) -> int:
        if self._subset is not None:
            return len(self._subset)
        return self._set_count()

    def _set_count(self) -> int:
        """Samples in the whole set (``len()`` counts the subset's)."""
        return int(self.metadata["count"])

    @property
    def subset(self) -> range | np.ndarray | None:
        """The selected sample indices in order (a range or a read-only int64 array), or None for all."""
        return self._subset.indices if self._subset is not None else None

    def __repr__(self) -> str:
        if self._subset is not None:
            return f"RecordFile({self.path!r}, subset={self._subset.describe()})"
        return f"RecordFile({self.path!r})"

    # -- access ---------------------------------------------------------------
    def environment(self) -> tuple[lmdb.Environment, Any]:
        """The open environment of this process and its records database (for readers)."""
        env = self._open()
        return env, self._records_db

    @property
    def samples_per_record(self) -> int:
        """Samples stored in each LMDB value (1 unless written with ``samples_per_record``)."""
        return int(self.metadata.get("samples_per_record", 1))

    @property
    def num_records(self) -> int:
        """LMDB values in the whole set (its samples divided by ``samples_per_record``, rounded up)."""
        return int(self.metadata.get("records", self._set_count()))

    @property
    def crc_db(self) -> Any:
        """The checksum database handle, or None for a set written without checksums."""
        self._open()
        return self._crc_db

    def raw(self, record: int) -> bytes:
        """The stored bytes of record ``record`` (a serialized TensorProtos)."""
        n = self.num_records
        record = _integer(record, "record index", self.path)
        if record < 0:
            record += n
        if not 0 <= record < n:
            raise IndexOutOfRangeError(f"record index {record} out of range for {self.path} with {n} records")
        env, db = self.environment()
        try:
            with _format.lmdb_errors(self.path), env.begin(db=db) as txn:
                value = txn.get(_format.encode_key(record))
                crc_db = self._crc_to_check()
                stored = txn.get(_format.encode_key(record), db=crc_db) if crc_db is not None else None
        except MemoryError:  # a damaged node can claim a value of gigabytes
            raise CorruptRecordError(
                f"{self.path}: record {record}: LMDB returned a value larger than the memory available; "
                "the file is probably damaged: run torchrecord.verify on it"
            ) from None
        if value is None:
            raise CorruptRecordError(f"{self.path}: record {record} is missing")
        if crc_db is not None:
            check_crc(value, stored, f"{self.path}: record {record}")
        return bytes(value)

    def _crc_to_check(self) -> Any:
        """The checksum database when ``check`` asks for checksums (and the set has them), else None."""
        return self.crc_db if _checked.checks_crc(self._check) else None

    def crc_blocks(self) -> BlockChecksums | None:
        """The set's block checksums (``docs/FORMAT.md``), or None for a set without them; a walk that checks
        checksums checks these, one a block of records. Raises ChecksumError naming the file if they are damaged."""
        blocks: BlockChecksums | None = self._per_environment("_crc_blocks", read_block_checksums)
        return blocks

    def _per_environment(self, key: str, read: Callable[[lmdb.Environment, str, dict[str, Any]], Any]) -> Any:
        """``read(env, path, metadata)`` once for the open environment, kept under ``key`` until it is let go;
        arrays come back read-only (the group offsets)."""
        env = self.environment()[0]
        cached = self.__dict__.get(key)
        if cached is not None and cached[0] is env:
            return cached[1]
        value = read(env, self.path, self.metadata)
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
        self.__dict__[key] = (env, value)
        return value

    def _walk_checks(self) -> dict[str, Any]:
        """The checks of a :class:`Walk` over this set, as ``check`` asks (Walk's keyword arguments)."""
        crc_db = self._crc_to_check()
        return {"crc_db": crc_db, "crc_blocks": self.crc_blocks() if crc_db is not None else None}

    def _sample(self, position: int) -> Any:
        if self._subset is not None:
            position = int(self._subset.take(np.array([position]))[0])
        k = self.samples_per_record
        if k == 1:
            return self.decode(self.raw(position), position)
        record, row = divmod(position, k)
        return self.decode_record(self.raw(record), record, row)[0]

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """The samples at ``indices`` (positions in the subset, if any), read in one transaction.

        Records are read once each, in key order, whatever the order asked;
        a sample asked twice is decoded twice (no shared tensors).
        """
        samples = self._sample_indices(indices)
        if len(samples) == 0:
            return []
        k = self.samples_per_record
        records = np.unique(samples // k)
        breaks = np.flatnonzero(np.diff(records) != 1) + 1
        runs = [(int(r[0]), int(r[-1]) + 1) for r in np.split(records, breaks)]
        values: dict[int, bytes] = {}
        env, db = self.environment()
        with Walk(env, db, self.path, **self._walk_checks()) as walk:
            for first, piece in walk.pieces(runs):
                values.update(zip(range(first, first + len(piece)), piece))
        if k == 1:
            return [self.decode(values[i], i) for i in samples.tolist()]
        decoded: dict[int, list[Any]] = {}
        out = []
        for i in samples.tolist():
            record, row = divmod(i, k)
            rows = decoded.get(record)
            if rows is None or rows[row] is None:  # first use, or asked again: decode afresh
                rows = decoded[record] = self.decode_record(values[record], record)
            out.append(rows[row])
            rows[row] = None
        return out

    def _sample_indices(self, indices: Any) -> np.ndarray:
        """Positions given by the user (ints, negative from the end) as set sample indices, checked."""
        positions = self._positions(indices)
        return self._subset.take(positions) if self._subset is not None else positions

    def __iter__(self) -> Iterator[Any]:
        if self._subset is not None:  # the selected samples, in their order, a piece at a time
            yield from (s for lo in range(0, len(self), PIECE) for s in self[lo : lo + PIECE])
            return
        env, db = self.environment()
        with Walk(env, db, self.path, **self._walk_checks()) as walk:
            for first, values in walk.pieces([(0, self.num_records)]):
                for record, value in enumerate(values, first):
                    yield from self.decode_record(value, record)

    # -- shards: a record set is a sharded set of one ----------------------------------
    @property
    def num_shards(self) -> int:
        """1 (a :class:`~torchrecord._shards.sharded.ShardedSet` has more)."""
        return 1

    @property
    def shard_offsets(self) -> np.ndarray:
        """int64 ``[0, len(self)]``: shard ``s`` holds samples ``offsets[s] .. offsets[s+1]-1``."""
        return np.array([0, len(self)], dtype=np.int64)

    def shard(self, s: int) -> RecordFile:
        """Shard ``s``: the file itself for ``s == 0`` (IndexError for any other).

        Args:
            s: the shard index.
        """
        if s != 0:
            raise IndexOutOfRangeError(f"shard {s} out of range for {self.path}, a record set of one file")
        return self

    @property
    def size_bytes(self) -> int:
        """The file's size on disk."""
        return os.path.getsize(self.path)

    # -- groups and identity ------------------------------------------------------
    @property
    def groups(self) -> np.ndarray | None:
        """Group offsets int64[G+1] of a grouped set (``write_record(group_by=...)``), or None.

        Group ``g`` is samples ``groups[g] .. groups[g+1]-1`` in stored order. None
        means the set was written without ``group_by`` (it has no groups). Raises
        CorruptRecordError naming the file if the stored offsets are damaged.
        """
        offsets: np.ndarray | None = self._per_environment("_group_offsets", read_offsets)
        return offsets

    def _read_range(self, lo: int, hi: int) -> list[Any]:
        """Samples [lo, hi) in stored order, through one cursor walk."""
        if hi <= lo:
            return []
        k = self.samples_per_record
        env, db = self.environment()
        out: list[Any] = []
        with Walk(env, db, self.path) as walk:
            for first, values in walk.pieces(record_runs([(lo, hi)], k)):
                for record, value in enumerate(values, first):
                    for j, sample in enumerate(self.decode_record(value, record)):
                        if lo <= record * k + j < hi:
                            out.append(sample)
        return out

    @property
    def set_id(self) -> str:
        """The set's identity: a random id written with it (uuid4 hex).

        A set written before ``set_id`` existed gets ``"legacy-"`` followed by 32
        hex digits of the SHA-256 of its raw metadata bytes: stable for that file.
        """
        if self._meta is None or self._pin is None:
            self._open()
        assert self._pin is not None
        return self._pin
