"""What a record set's metadata claims, checked against what its file can hold.

The metadata says how many samples there are, how many go in each record and
what shape every field has; readers size loops, index arrays and buffers by
those numbers. A damaged or crafted file can claim anything (10**12 records in
64 KB, a [2**15, 2**15] image per sample, 2**64-1 samples), so before a reader
relies on a claim it is checked against the file itself:

* the records the count needs (``ceil(count / samples_per_record)``) against the
  entries of the ``records`` database, which LMDB counts in its own tree;
* the bytes the fixed-size fields of ``count`` samples need against the bytes of
  the file LMDB uses (a compressed field counts as its raw size over the most its
  codec can expand, ``_core.compress.MAX_RATIO``);
* (in ``_format.check_metadata``) every field's size below NumPy's limit, and
  ``samples_per_record`` at most ``_format.MAX_SAMPLES_PER_RECORD``.

Each failure is a :class:`~torchrecord.errors.FormatError` naming the file and the
claim. The checks read two LMDB statistics: no record is read.
"""

from __future__ import annotations

from typing import Any

import lmdb

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.compress import MAX_RATIO
from torchrecord.errors import FormatError

__all__ = [
    "check_claims",
    "field_bytes",
    "fixed_sample_bytes",
    "verify_slack",
]

#: Bytes a string sample costs at least inside a chunked record (protobuf tag and length).
_STRING_BYTES = 2

_REWRITE = "the file is damaged or was not written by torchrecord: copy it again from its source or rewrite it"


def field_bytes(field: dict[str, Any] | Any) -> int | None:
    """Bytes of one sample of a numeric field of fixed shape (Python ints: no overflow); None otherwise."""
    kind, dtype, shape = _get(field, "kind"), _get(field, "dtype"), _get(field, "shape")
    if kind in ("bytes", "str") or not isinstance(shape, (list, tuple)) or any(d is None for d in shape):
        return None
    info = _dtypes.by_name(str(dtype))
    n = info.itemsize
    for d in shape:
        n *= int(d)
    return n


def fixed_sample_bytes(fields: list[Any]) -> int:
    """Bytes every sample stores at least: its fixed-size numeric fields, 2 per string field.

    A compressed field of fixed shape stores at least its raw size over the most its
    codec expands (zstd: 32,768 times, LZ4: 256), and never less than a string;
    one of variable shape, as little as a string.
    """
    total = 0
    for f in fields:
        codec = _get(f, "compression")
        if codec:
            raw = field_bytes(f)
            ratio = MAX_RATIO.get(str(codec), max(MAX_RATIO.values()))
            total += max(_STRING_BYTES, -(-raw // ratio)) if raw is not None else _STRING_BYTES
            continue
        size = field_bytes(f)
        if size is not None:
            total += size
        elif _get(f, "kind") in ("bytes", "str"):
            total += _STRING_BYTES
    return total


def check_claims(
    env: lmdb.Environment, records_db: Any, meta: dict[str, Any], path: str, *, slack: bool = False
) -> int:
    """Check the metadata's count and shapes against the file; returns the records database's entries.

    ``slack``: let the count claim missing records, up to as many as the file holds
    plus 65,536 (``verify`` reports each missing record; readers need them all).
    """
    try:
        with env.begin() as txn:
            entries = int(txn.stat(records_db)["entries"])
        used = (int(env.info()["last_pgno"]) + 1) * int(env.stat()["psize"])
    except lmdb.Error as exc:
        raise FormatError(f"{path}: LMDB cannot count the records ({exc}); {_REWRITE}") from None
    count = int(meta["count"])
    per_record = int(meta.get("samples_per_record", 1))
    records = -(-count // per_record)
    allowed = entries + verify_slack(entries) if slack else entries
    if records > allowed:
        raise FormatError(
            f"{path}: the metadata claims {count} samples ({records} records of {per_record}), but the records "
            f"database holds {entries} records; {_REWRITE}"
        )
    per_sample = fixed_sample_bytes((meta.get("schema") or {}).get("fields", []))
    if count * per_sample > used:
        raise FormatError(
            f"{path}: the metadata claims {count} samples of at least {per_sample} bytes each "
            f"({count * per_sample} bytes), but the file holds {used} bytes; {_REWRITE}"
        )
    return entries


def verify_slack(entries: int) -> int:
    """Records ``verify`` accepts as missing beyond the entries it finds (each is then reported)."""
    return max(entries, 1 << 16)


def _get(field: Any, name: str) -> Any:
    return field.get(name) if isinstance(field, dict) else getattr(field, name, None)
