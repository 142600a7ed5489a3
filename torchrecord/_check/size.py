"""How much of a record set's file is sample data: the payload bytes, and the file's overhead over them.

The payload is the bytes of the samples as written (each number's bytes, each
string's UTF-8 bytes), without keys, protobuf framing, checksums or LMDB pages.
For a schema of fixed-size fields it follows from the schema alone; otherwise it
takes a scan that decodes every record.
"""

from __future__ import annotations

import math
from typing import Any

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.codec import decode_leaves
from torchrecord._store.record_file import shard_file
from torchrecord._store.record_set import RecordSet
from torchrecord._store.walk import Walk

__all__ = ["SCAN_LIMIT", "bytes_per_sample", "payload_bytes"]

#: Files up to this size are scanned by default when the payload is not known from the schema.
SCAN_LIMIT = 64 << 20


def bytes_per_sample(rf: RecordSet) -> int | None:
    """Payload bytes of one sample when every field has a fixed size, else None."""
    fields = rf.schema.fields
    if not all(f.is_fixed for f in fields):
        return None
    return sum(math.prod(int(d or 0) for d in f.shape) * _dtypes.by_name(f.dtype).itemsize for f in fields)


def payload_bytes(rf: RecordSet, *, scan: bool) -> int | None:
    """The payload bytes of the whole set, or None when only a scan could tell and ``scan`` is False.

    Fixed-size schemas: count x bytes per sample, nothing read. Otherwise, with
    ``scan``, every record of every shard is read through the cursor walk and decoded.
    """
    count = int(rf.metadata["count"])
    per_sample = bytes_per_sample(rf)
    if per_sample is not None:
        return count * per_sample
    if not scan:
        return None
    total = 0
    for s in range(rf.num_shards):
        shard = shard_file(rf, s)
        fields, k, count = shard.schema.fields, shard.samples_per_record, int(shard.metadata["count"])
        env, db = shard.environment()
        with Walk(env, db, shard.path) as walk:
            for first, values in walk.pieces([(0, shard.num_records)]):
                for record, value in enumerate(values, first):
                    rows = None if k == 1 else min(k, count - record * k)
                    for leaf in decode_leaves(value, fields, f"{shard.path}: record {record}", rows):
                        total += _size(leaf)
        rf.release(s)
    return total


def _size(leaf: Any) -> int:
    """Payload bytes of one decoded leaf: an array, a string's bytes, or a chunk's list of strings."""
    if isinstance(leaf, list):
        return sum(len(x) for x in leaf)
    if isinstance(leaf, bytes):
        return len(leaf)
    return int(leaf.nbytes)
