"""A set's block checksums: the CRC-32 of every block of consecutive records, read and checked.

Beside each record's own CRC-32 (the ``crc32`` database), a set written with
checksums holds, in the ``meta`` entry ``crc32-blocks``, the CRC-32 of the values of
records ``[b * block, (b + 1) * block)`` joined, for every block ``b`` (the last one
may be shorter; ``block`` is the metadata's ``checksum_block``, chosen by the writer
so that a block holds about 4 KiB: 256 records of up to 16 bytes, one record of
4 KiB or more). A reader walking a run of records checks one CRC-32 for each block
the run covers whole instead of one a record: one call over joined bytes and one
stored value, not a cursor step and a call for each record, which for records of a
few hundred bytes was most of what ``check="checksums"`` cost. The records of a block
the run covers only in part, and those of a block that does not match (to name the
record at fault), are checked by their own CRC-32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lmdb
import numpy as np

from torchrecord._store import format as _format
from torchrecord.errors import ChecksumError

__all__ = ["BlockChecksums", "read_block_checksums"]

_CRC = np.dtype("<u4")


@dataclass(frozen=True)
class BlockChecksums:
    """The stored CRC-32 of every block of ``block`` records of a set of ``records`` records."""

    block: int
    crcs: np.ndarray
    records: int

    def stored(self, at: int) -> int:
        """The stored CRC-32 of the block starting at record ``at``."""
        return int(self.crcs[at // self.block])


def read_block_checksums(
    env: lmdb.Environment, path: str, meta: dict[str, Any], records: int | None = None
) -> BlockChecksums | None:
    """The checked block checksums of an open set, or None for a set without them (written with
    ``checksums=False``, or by a torchrecord before block checksums).

    ``records``: the records they must cover (default: the metadata's; ``verify``
    passes the records the file holds). Raises ChecksumError naming the file when the
    metadata announces them but the entry is missing or of the wrong length.
    """
    block = meta.get("checksum_block")
    if block is None or not meta.get("checksum"):
        return None
    if records is None:
        records = int(meta.get("records", meta["count"]))
    blocks = -(-records // block)
    with _format.lmdb_errors(path), env.begin() as txn:
        raw = txn.get(_format.CRC_BLOCKS_KEY, db=env.open_db(_format.META_DB, create=False))
    if raw is None or len(raw) != blocks * _CRC.itemsize:
        found = "none" if raw is None else f"{len(raw)} bytes"
        raise ChecksumError(
            f"{path}: the block checksums are damaged: {records} records in blocks of {block} need "
            f"{blocks * _CRC.itemsize} bytes of them, the file holds {found}; run torchrecord.verify on it"
        )
    crcs = np.frombuffer(raw, dtype=_CRC).astype(np.uint32)
    crcs.flags.writeable = False
    return BlockChecksums(int(block), crcs, records)
