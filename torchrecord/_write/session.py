"""One write in progress: the parts of a record set write, put together.

``write_record`` (which pulls samples from a source) and ``RecordWriter`` (to
which samples are pushed) both run a :class:`WriteSession`:

    Publisher      the hidden temporary beside the target, its lock, the atomic move, cleanup
    LmdbAppender   the temporary LMDB file: growing map, bounded commits
    Admission      schema, on_error policy, group contiguity
    Packer         records of one sample or of chunks of K samples
    Spool          samples parked until the write order is known (shuffle at close)

A session either appends samples in the order they come (``spool=False``: an
unshuffled write, or a map-style source read in permuted order) or spools them
and writes them at :meth:`close` in a seeded permuted order (of samples, or of
whole groups).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from torchrecord._core.progress import progress_bar
from torchrecord._store import format as _format
from torchrecord._store.groups import GROUPS_KEY, pack_offsets
from torchrecord._store.identity import new_set_id
from torchrecord._store.record_file import RecordFile
from torchrecord._store.summary import WriteSummary
from torchrecord._version import __version__
from torchrecord._write.admission import Admission
from torchrecord._write.autopack import AutoPacker
from torchrecord._write.declared import Declared
from torchrecord._write.grouping import GroupTracker, describe, group_order, key_function
from torchrecord._write.lmdb_writer import LmdbAppender
from torchrecord._write.publish import Publisher
from torchrecord._write.settings import WriteSettings
from torchrecord._write.sources import Encoded, Item, KeyFunction
from torchrecord._write.spool import Spool
from torchrecord.errors import InternalError

__all__ = ["WriteSession"]


class WriteSession:
    """The temporary file, the admission, and the packing or spooling of one write.

    Creating it checks the target and creates the temporary file; end it with
    :meth:`close` (publish) or :meth:`abort` (remove every file of the write).

    Args:
        target: the record set to create.
        overwrite: replace an existing set at ``target``.
        settings: the write's options.
        spool: park the samples and write them in a seeded permuted order at close.
        source: how errors name where samples come from.
        extra: more metadata keys (a shard's place in its sharded set).
    """

    def __init__(
        self,
        target: str,
        overwrite: bool,
        settings: WriteSettings,
        *,
        spool: bool,
        source: str = "the source",
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.target = target
        self.settings = settings
        self.extra = dict(extra or {})
        chunk = settings.samples_per_record
        #: the group key of a sample, or None for an ungrouped set
        self.key: KeyFunction | None = key_function(settings.group_by) if settings.group_by is not None else None
        #: whether samples may come as fast-encoded record bytes
        self.fast = spool or chunk is None or chunk == 1
        self.publisher = Publisher(target, overwrite)
        self.spool: Spool | None = None
        self._bar: Any = None
        self.set_id = new_set_id()
        try:
            self.appender = LmdbAppender(
                self.publisher.temp,
                initial_map_size=settings.initial_map_size,
                commit_bytes=settings.commit_bytes,
                checksums=settings.checksums,
                name=target,
            )
        except BaseException:
            self.publisher.discard()
            raise
        try:
            self._assemble(source, spool)
        except BaseException:
            self.abort()
            raise

    def _assemble(self, source: str, spool: bool) -> None:
        """The parts that take the samples, on the open temporary file: admission, packer, spool."""
        settings, chunk, target = self.settings, self.settings.samples_per_record, self.target
        self.tracker = GroupTracker(target) if self.key is not None else None
        self.admission = Admission(
            target,
            settings.on_error,
            chunk or 1,
            self.tracker,
            source,
            max_skipped=settings.max_skipped,
            declared=Declared.parse(settings.schema),
        )
        self.packer = AutoPacker(
            self.appender,
            chunk,
            schema_of=lambda: self.admission.schema,
            compression=settings.compression,
            compression_level=settings.compression_level,
            checksums=settings.checksums,
            packable=lambda: not self.admission.has_lists,
        )
        if spool:
            self.spool = Spool.create(
                self.publisher.scratch(".spool"),
                initial_map_size=settings.initial_map_size,
                commit_bytes=settings.commit_bytes,
                name=target,
            )

    # -- taking samples --------------------------------------------------------------
    def consume(self, stream: Iterator[Item | Encoded], total: int | None) -> None:
        """Take every sample of a source's stream (``total``: its length, for the bar)."""
        self.admission.total = total
        bar = progress_bar(total, self.settings.progress, "spooling" if self.spool else "writing")
        sink = self.spool if self.spool is not None else self.packer
        put, put_encoded = sink.add, sink.add_encoded
        try:
            for sample in self.admission.check(stream):
                if isinstance(sample, Encoded):
                    put_encoded(sample)
                    bar.update(len(sample))
                    continue
                put(sample)
                bar.update(1)
        finally:
            bar.close()
            # on an error, stop the reader (and its DataLoader workers) now rather than when the
            # garbage collector finds it through the traceback: shutting down late hangs 5 s per worker
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    def push(self, item: Item) -> None:
        """Take one prepared sample (from a :class:`~torchrecord._write.sources.Preparer`)."""
        if self._bar is None:
            self._bar = progress_bar(None, self.settings.progress, "spooling" if self.spool else "writing")
        sample = self.admission.admit(*item)
        if sample is None:
            return
        if self.spool is not None:
            self.spool.add(sample)
        else:
            self.packer.add(sample)
        self._bar.update(1)

    def put_entries(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        """Store more (key, value) entries in the set's ``meta`` database, beside its records.

        For data that belongs to the set but is no sample (no reader's index
        reaches it): the robomimic converter's final frames. The format's own
        keys (``metadata``, ``groups``, ``crc32-blocks``) are refused.
        """

        def checked() -> Iterator[tuple[bytes, bytes]]:
            for key, value in entries:
                if key in (_format.META_KEY, GROUPS_KEY, _format.CRC_BLOCKS_KEY):
                    raise InternalError(f"{self.target}: meta entry {key!r} is the format's own")
                yield key, value

        self.appender.put_entries(checked())

    # -- ending ------------------------------------------------------------------------
    def close(self, before_publish: Callable[[str], None] | None = None) -> RecordFile:
        """Write the spooled samples in their final order, the metadata, and publish.

        ``before_publish`` is called with the finished, closed temporary file just
        before it is renamed over the target (a shard writer takes its checksum there).
        """
        if self._bar is not None:
            self._bar.close()
        self.admission.finish()  # nothing kept, or too much skipped: an error, before any more work
        offsets = None
        if self.spool is not None:
            offsets = self._replay(self.spool)
        elif self.tracker is not None:
            offsets = group_order(self.tracker.sizes, False, self.settings.seed)[1]
        self.packer.flush()
        extra = {GROUPS_KEY: pack_offsets(offsets)} if offsets is not None else None
        summary = self.admission.summary()
        summary = WriteSummary(self.packer.count, summary.skipped, summary.skipped_samples, summary.variable_fields)
        self.appender.finish(_format.pack_metadata(self._metadata(offsets, summary)), extra)
        self.appender.close()
        if before_publish is not None:
            before_publish(self.publisher.temp)
        self.publisher.publish()
        written = RecordFile(self.target)
        # it reads this write's set: should another writer replace the path, opening it raises
        # RecordReplacedError instead of reading that other set
        written._pin = self.set_id
        written.__dict__["_write_summary"] = summary  # the whole summary (the metadata keeps a bounded one)
        return written

    def abort(self) -> None:
        """Remove every file of this write; the target keeps whatever it held before."""
        if self._bar is not None:
            with contextlib.suppress(Exception):
                self._bar.close()
        with contextlib.suppress(Exception):
            self.appender.close()
        if self.spool is not None:
            self.spool.close()
        self.publisher.discard()

    def _replay(self, spool: Spool) -> np.ndarray | None:
        """Copy the spooled samples out in the seeded order; returns the group offsets if grouped."""
        seed = self.settings.seed
        offsets = None
        if self.tracker is not None:
            order, offsets = group_order(self.tracker.sizes, True, seed)
        else:
            order = np.random.default_rng(seed).permutation(spool.count)
        bar = progress_bar(spool.count, self.settings.progress, "shuffling")
        packer = self.packer
        try:
            for _, value in spool.replay(order):
                packer.add(value)  # chunks are joined from the single-sample records
                bar.update(1)
        finally:
            bar.close()
        self.publisher.drop(spool.path)
        return offsets

    def _metadata(self, offsets: np.ndarray | None, summary: WriteSummary) -> dict[str, Any]:
        s = self.settings
        count = self.packer.count
        chunk = self.packer.chunk or 1
        schema = self.admission.schema
        compressor = self.packer.compressor
        applied = compressor.applied() if compressor is not None else {}
        schema_map = schema.to_dict() if schema is not None else None
        if schema_map is not None:
            for fld in schema_map["fields"]:
                if fld["name"] in applied:
                    fld["compression"] = applied[fld["name"]]
        meta: dict[str, Any] = {
            "format": _format.FORMAT_NAME,
            # compressed fields: a version older readers refuse; else the version they read
            "format_version": _format.FORMAT_VERSION if applied else _format.PLAIN_VERSION,
            "library_version": __version__,
            "count": count,
            "records": -(-count // chunk),
            "samples_per_record": chunk,
            "schema": schema_map,
            "shuffled": bool(s.shuffle),
            "seed": int(s.seed),
            "skipped": summary.skipped,
            **summary.metadata(),
            "checksum": "crc32" if s.checksums else None,
            **({"checksum_block": self.appender.checksum_block} if s.checksums else {}),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "user": s.metadata or {},
            "set_id": self.set_id,
        }
        if compressor is not None:
            meta["compression"] = compressor.report()
        if offsets is not None:
            meta["groups"] = len(offsets) - 1
            meta["group_by"] = describe(s.group_by)  # type: ignore[arg-type]
        meta.update(self.extra)
        meta["complete"] = True
        return meta
