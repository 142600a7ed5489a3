"""The on-disk layout of a record set (see docs/FORMAT.md): names, keys, metadata.

A record set is one LMDB environment in a single file (``subdir=False``) with
three named databases:

* ``records``: key = record index as 8-byte big-endian unsigned int, value = TensorProtos;
* ``crc32``:   same keys, value = CRC-32 (zlib polynomial) of the record value, 4 bytes LE;
* ``meta``:    key ``b"metadata"`` = msgpack map (format version, count, schema, ...).
"""

from __future__ import annotations

import os
import struct
from typing import Any

import lmdb
import msgpack

from torchrecord.errors import (
    FormatError,
    IncompleteRecordSetError,
    NotARecordSetError,
    RecordNotFoundError,
    VersionError,
)

__all__ = [
    "CRC_DB",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "META_DB",
    "META_KEY",
    "RECORDS_DB",
    "decode_key",
    "encode_key",
    "open_readonly",
    "pack_metadata",
    "read_metadata",
    "unpack_metadata",
]

FORMAT_NAME = "torchrecord"
#: Bump on any change a reader of the previous version would misread.
FORMAT_VERSION = 1

RECORDS_DB = b"records"
CRC_DB = b"crc32"
META_DB = b"meta"
META_KEY = b"metadata"
MAX_DBS = 4

_KEY = struct.Struct(">Q")


def encode_key(index: int) -> bytes:
    """The 8-byte big-endian key of record ``index`` (cursor order = index order)."""
    return _KEY.pack(index)


def decode_key(key: bytes) -> int:
    """The record index of an 8-byte key."""
    return int(_KEY.unpack(key)[0])


def pack_metadata(meta: dict[str, Any]) -> bytes:
    """msgpack-encode the metadata map."""
    return bytes(msgpack.packb(meta, use_bin_type=True))


def unpack_metadata(raw: bytes, path: str) -> dict[str, Any]:
    """Decode the metadata map, refusing anything but plain msgpack data (no ext types)."""
    try:
        meta = msgpack.unpackb(raw, raw=False, strict_map_key=True, ext_hook=_no_ext, max_bin_len=1 << 30)
    except Exception as exc:  # msgpack raises several unrelated types
        raise NotARecordSetError(f"{path}: metadata is not valid msgpack ({exc}); the file is damaged") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise NotARecordSetError(f"{path}: metadata does not describe a torchrecord record set")
    return meta


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code} is not allowed in torchrecord metadata")


def open_readonly(path: str) -> lmdb.Environment:
    """Open a record set read-only, creating no lock file (safe in any process).

    Raises RecordNotFoundError / NotARecordSetError with the path in the message.
    """
    if not os.path.exists(path):
        raise RecordNotFoundError(f"{path}: no record set here (write one with torchrecord.write_record)")
    if os.path.isdir(path):
        raise NotARecordSetError(
            f"{path}: is a directory; a torchrecord record set is a single file written by write_record"
        )
    try:
        return lmdb.open(
            path,
            subdir=False,
            readonly=True,
            lock=False,
            max_dbs=MAX_DBS,
            max_spare_txns=2,
        )
    except lmdb.InvalidError:
        raise NotARecordSetError(f"{path}: not an LMDB file, so not a torchrecord record set") from None
    except lmdb.Error as exc:
        raise NotARecordSetError(f"{path}: cannot open as LMDB ({exc}); the file may be truncated") from None


def read_metadata(env: lmdb.Environment, path: str) -> dict[str, Any]:
    """Read and check the metadata: known format, supported version, completed write."""
    try:
        meta_db = env.open_db(META_DB, create=False)
    except (lmdb.NotFoundError, lmdb.Error):
        raise NotARecordSetError(f"{path}: LMDB file without torchrecord metadata (no 'meta' database)") from None
    with env.begin(db=meta_db) as txn:
        raw = txn.get(META_KEY)
    if raw is None:
        raise NotARecordSetError(f"{path}: the 'meta' database holds no metadata record")
    meta = unpack_metadata(bytes(raw), path)
    version = meta.get("format_version")
    if not isinstance(version, int):
        raise FormatError(f"{path}: metadata has no integer format_version")
    if version > FORMAT_VERSION:
        raise VersionError(
            f"{path}: written in record format version {version} by torchrecord "
            f"{meta.get('library_version', '?')}; this torchrecord reads versions up to "
            f"{FORMAT_VERSION}. Upgrade torchrecord to read it."
        )
    if version < 1:
        raise VersionError(f"{path}: unknown record format version {version}")
    if meta.get("complete") is not True:
        raise IncompleteRecordSetError(f"{path}: the write of this record set never finished; write it again")
    return meta
