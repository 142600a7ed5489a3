"""The shuffle spool: encoded samples parked in a temporary LMDB file, replayed in any order.

Used when the write order is known only after the last sample: an iterable of
unknown length, pushed samples (:class:`~torchrecord.RecordWriter`), grouped
sets. Each sample is stored as a single-sample record under its arrival index;
the spool grows its map and commits in bounded chunks like the record file
itself, so memory stays bounded whatever the size of the set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import lmdb
import numpy as np

from torchrecord._store import format as _format
from torchrecord._write.lmdb_writer import LmdbAppender
from torchrecord._write.packing import encode_sample, single_records
from torchrecord._write.sources import Encoded, Normalized

__all__ = ["Spool"]


class Spool:
    """An append-only scratch LMDB file of single-sample records, read back by index.

    Create it with :meth:`create`; :meth:`seal` ends the appends, :meth:`replay`
    reads the records back in a given order, :meth:`close` releases the file
    (its removal is the caller's: it is one of the write's scratch paths).
    """

    def __init__(self, appender: LmdbAppender) -> None:
        self.path = appender.path
        self.name = appender.name
        self._appender: LmdbAppender | None = appender
        self.count = 0

    @classmethod
    def create(cls, path: str, *, initial_map_size: int, commit_bytes: int, name: str) -> Spool:
        """A new, empty spool at ``path`` (``name``: the target, for error messages)."""
        appender = LmdbAppender(
            path, initial_map_size=initial_map_size, commit_bytes=commit_bytes, checksums=False, name=name
        )
        return cls(appender)

    def add(self, sample: bytes | Normalized) -> None:
        """Park one admitted sample."""
        assert self._appender is not None, "the spool is sealed"
        self._appender.append(encode_sample(sample))
        self.count += 1

    def add_encoded(self, encoded: Encoded) -> None:
        """Park consecutive samples given as columns (a fast-encoded batch), one record each."""
        assert self._appender is not None, "the spool is sealed"
        self._appender.append_many(single_records(encoded))
        self.count += len(encoded)

    def seal(self) -> None:
        """Commit what is pending and close the spool for appends."""
        if self._appender is None:
            return
        self._appender.flush()
        self._appender.close()
        self._appender = None

    def replay(self, order: np.ndarray) -> Iterator[tuple[int, bytes]]:
        """Yield ``(arrival index, record)`` for each index of ``order``, in that order."""
        self.seal()
        env = lmdb.open(self.path, subdir=False, readonly=True, lock=False, max_dbs=_format.MAX_DBS)
        try:
            db = env.open_db(_format.RECORDS_DB, create=False)
            with env.begin(db=db) as txn:
                for index in order.tolist():
                    value = txn.get(_format.encode_key(index))
                    assert value is not None, "spooled record missing"
                    yield index, value
        finally:
            env.close()

    def close(self) -> None:
        """Release the file without committing (on abort)."""
        if self._appender is not None:
            with contextlib.suppress(Exception):
                self._appender.close()
            self._appender = None
