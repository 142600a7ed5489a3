"""The on-disk layout of a record set (see docs/FORMAT.md): names, keys, the metadata and its checks.

A record set is one LMDB environment in a single file (``subdir=False``) with
three named databases:

* ``records``: key = record index as 8-byte big-endian unsigned int, value = TensorProtos;
* ``crc32``:   same keys, value = CRC-32 (zlib polynomial) of the record value, 4 bytes LE;
* ``meta``:    key ``b"metadata"`` = msgpack map (format version, count, schema, ...).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from typing import Any, TypeGuard

import lmdb
import msgpack
import numpy as np

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.compression import CODECS
from torchrecord._core.schema import MAX_RANK
from torchrecord.errors import (
    ArgumentError,
    CorruptRecordError,
    FormatError,
    IncompleteRecordSetError,
    NotARecordSetError,
    VersionError,
)

__all__ = [
    "COMPRESSION_CODECS",
    "CRC_BLOCK",
    "CRC_BLOCKS_KEY",
    "CRC_BLOCK_BYTES",
    "CRC_DB",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_DBS",
    "MAX_FIELD_BYTES",
    "MAX_METADATA_BYTES",
    "MAX_METADATA_CONTAINERS",
    "MAX_RANK",
    "MAX_SAMPLES_PER_RECORD",
    "META_DB",
    "META_KEY",
    "PLAIN_VERSION",
    "RECORDS_DB",
    "REWRITE",
    "check_metadata",
    "check_metadata_size",
    "check_schema",
    "decode_key",
    "encode_key",
    "encode_keys",
    "lmdb_errors",
    "pack_metadata",
    "read_metadata",
    "unpack_metadata",
]

FORMAT_NAME = "torchrecord"
#: Bump on any change a reader of the previous version would misread. The newest version this
#: torchrecord reads; it writes version 1 unless a field is compressed (version 2, see docs/FORMAT.md).
FORMAT_VERSION = 2
#: The version of a set without compressed fields (older readers read it).
PLAIN_VERSION = 1
#: Codec names a version-2 schema field may name (``compression``): the registry's.
COMPRESSION_CODECS = tuple(sorted(CODECS))

RECORDS_DB = b"records"
CRC_DB = b"crc32"
#: The ``meta`` entry of the block checksums: uint32 little-endian, the CRC-32 of the values of records
#: [CRC_BLOCK * j, CRC_BLOCK * (j + 1)) joined, for each block j (the last one may be shorter).
CRC_BLOCKS_KEY = b"crc32-blocks"
#: The most records a writer puts in one checksum block (the metadata's ``checksum_block``) ...
CRC_BLOCK = 256
#: ... and the bytes of records it aims at in one: a reader checks records one by one in the blocks a run of
#: records only partly covers, so blocks stay small against a reader's runs.
CRC_BLOCK_BYTES = 4 << 10
#: The most records a checksum block may hold (a reader holds a whole block to check it).
MAX_CHECKSUM_BLOCK = 4096
META_DB = b"meta"
META_KEY = b"metadata"
MAX_DBS = 4
#: The most samples one record may hold (``write_record`` refuses more).
MAX_SAMPLES_PER_RECORD = 1 << 24
#: The largest byte size of one field of one sample (NumPy's arrays stop below 2**63 bytes).
MAX_FIELD_BYTES = 1 << 62
#: The largest metadata map, in bytes of msgpack and in maps and arrays it holds: decoding
#: it costs up to about 70 bytes of Python objects per byte, in every reader process.
MAX_METADATA_BYTES = 16 << 20
MAX_METADATA_CONTAINERS = 1 << 20

_KEY = struct.Struct(">Q")

#: What to tell the user when a file is damaged beyond reading (in every message that says so).
REWRITE = "copy it again from a good source or write it again with torchrecord.write_record"


@contextlib.contextmanager
def lmdb_errors(path: str) -> Iterator[None]:
    """Turn LMDB's own errors while reading into CorruptRecordError naming the file."""
    try:
        yield
    except lmdb.Error as exc:
        raise lmdb_error(path, exc) from exc


def lmdb_error(path: str, exc: BaseException) -> CorruptRecordError:
    """The error :func:`lmdb_errors` raises for LMDB's error ``exc`` while reading ``path``."""
    return CorruptRecordError(
        f"{path}: LMDB cannot read the file ({exc}); it is damaged: run torchrecord.verify to find the bad records"
    )


def encode_key(index: int) -> bytes:
    """The 8-byte big-endian key of record ``index`` (cursor order = index order)."""
    return _KEY.pack(index)


def encode_keys(first: int, n: int) -> list[bytes]:
    """The keys of records ``first`` .. ``first + n - 1`` (as :func:`encode_key`), made in bulk."""
    packed = np.arange(first, first + n, dtype=">u8").tobytes()
    return [packed[i : i + 8] for i in range(0, 8 * n, 8)]


def decode_key(key: bytes) -> int:
    """The record index of an 8-byte key."""
    return int(_KEY.unpack(key)[0])


def pack_metadata(meta: dict[str, Any]) -> bytes:
    """msgpack-encode the metadata map."""
    return bytes(msgpack.packb(meta, use_bin_type=True))


def unpack_metadata(raw: bytes, path: str) -> dict[str, Any]:
    """Decode the metadata map, refusing anything but plain msgpack data (no ext types).

    Bounded before anything is built: at most :data:`MAX_METADATA_BYTES` bytes and
    :data:`MAX_METADATA_CONTAINERS` maps and arrays (an empty map is one byte of
    msgpack but about 70 bytes of Python), so a crafted metadata record cannot make
    every reader process allocate gigabytes.
    """
    if len(raw) > MAX_METADATA_BYTES:
        raise FormatError(
            f"{path}: the metadata is {len(raw)} bytes, more than the {MAX_METADATA_BYTES} torchrecord reads "
            f"(and writes); the file is damaged or was not written by torchrecord: {REWRITE}"
        )
    budget = [MAX_METADATA_CONTAINERS]

    def count(container: Any) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooMany
        return container

    try:
        meta = msgpack.unpackb(raw, object_hook=count, list_hook=count, **_UNPACK)
    except _TooMany:
        raise FormatError(
            f"{path}: the metadata holds more than {MAX_METADATA_CONTAINERS} maps and arrays, more than torchrecord "
            f"reads (and writes); the file is damaged or was not written by torchrecord: {REWRITE}"
        ) from None
    except Exception as exc:  # msgpack raises several unrelated types
        raise NotARecordSetError(
            f"{path}: metadata is not valid msgpack ({exc}); the file is damaged: {REWRITE}"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise NotARecordSetError(f"{path}: metadata does not describe a torchrecord record set; check the path")
    return meta


class _TooMany(Exception):
    """Raised inside msgpack's hooks when the metadata holds too many containers."""


def check_metadata_size(packed: bytes, containers: int) -> None:
    """ValueError unless packed metadata of ``containers`` maps and arrays is within what readers read."""
    if len(packed) > MAX_METADATA_BYTES:
        raise ArgumentError(
            f"the metadata packs to {len(packed)} bytes, more than the {MAX_METADATA_BYTES} readers accept; "
            "keep large data in records or files beside the set"
        )
    if containers > MAX_METADATA_CONTAINERS:
        raise ArgumentError(
            f"the metadata holds {containers} maps and lists, more than the {MAX_METADATA_CONTAINERS} readers accept"
        )


def _no_ext(code: int, data: bytes) -> Any:
    raise FormatError(f"msgpack extension type {code} is not allowed in torchrecord metadata")


#: How metadata is unpacked: str keys only, no extension types (nothing a file holds runs code), bounded bins.
_UNPACK: dict[str, Any] = {
    "raw": False,
    "strict_map_key": True,
    "ext_hook": _no_ext,
    "max_bin_len": MAX_METADATA_BYTES,
}


def read_metadata(env: lmdb.Environment, path: str) -> dict[str, Any]:
    """Read and check the metadata: known format, supported version, completed write, sane fields."""
    try:
        meta_db = env.open_db(META_DB, create=False)
    except (lmdb.NotFoundError, lmdb.Error):
        raise NotARecordSetError(
            f"{path}: LMDB file without torchrecord metadata (no 'meta' database); "
            "it was not written by torchrecord.write_record"
        ) from None
    try:
        with env.begin(db=meta_db) as txn:
            raw = txn.get(META_KEY)
    except lmdb.Error as exc:
        raise CorruptRecordError(f"{path}: cannot read the metadata ({exc}); {REWRITE}") from None
    if raw is None:
        raise NotARecordSetError(f"{path}: the 'meta' database holds no metadata record; {REWRITE}")
    return check_metadata(unpack_metadata(bytes(raw), path), path)


def check_metadata(meta: dict[str, Any], path: str) -> dict[str, Any]:
    """Check decoded metadata before any reader relies on it; returns it unchanged.

    Checks the format version first (a newer version may lay fields out
    differently), then that the write completed, then the fields readers use:
    counts, checksum kind and a well-formed schema, so that damaged metadata is
    a FormatError here rather than a KeyError or TypeError deep in a reader.
    """
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
    count = meta.get("count")
    if not _is_int(count) or count < 0:
        raise FormatError(f"{path}: metadata count {count!r} is not a record count; {REWRITE}")
    per_record = meta.get("samples_per_record", 1)
    if not _is_int(per_record) or not 1 <= per_record <= MAX_SAMPLES_PER_RECORD:
        raise FormatError(
            f"{path}: metadata samples_per_record {per_record!r} is not in 1..{MAX_SAMPLES_PER_RECORD}; {REWRITE}"
        )
    records = meta.get("records", count)
    if not _is_int(records) or records != -(-count // per_record):
        raise FormatError(
            f"{path}: metadata records {records!r} does not match count {count} at "
            f"{per_record} samples per record; {REWRITE}"
        )
    if meta.get("checksum") not in (None, "crc32"):
        raise FormatError(f"{path}: unknown checksum kind {meta.get('checksum')!r} in the metadata")
    block = meta.get("checksum_block")
    if block is not None and (not _is_int(block) or not 1 <= block <= MAX_CHECKSUM_BLOCK or not meta.get("checksum")):
        raise FormatError(
            f"{path}: metadata checksum_block {block!r} is not a block of 1..{MAX_CHECKSUM_BLOCK} records "
            f"of a set with checksums; {REWRITE}"
        )
    if not isinstance(meta.get("user", {}), dict):
        raise FormatError(f"{path}: metadata 'user' is not a map; {REWRITE}")
    schema = meta.get("schema")
    if schema is None:
        if count:
            raise FormatError(f"{path}: metadata has {count} samples but no schema; {REWRITE}")
    else:
        check_schema(schema, path)
    return meta


_MAX_DEPTH = 64  # write_record refuses samples nested deeper than 32
_MAX_RANK = MAX_RANK
_STRING_KINDS = ("bytes", "str")
_SCALAR_KINDS = ("int", "float", "bool")
_ARRAY_KINDS = ("tensor", "ndarray")


def _is_int(x: object) -> TypeGuard[int]:
    """True for an int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def check_schema(schema: Any, path: str) -> None:
    """A FormatError unless ``schema`` is a tree plus one valid field per leaf."""
    if not isinstance(schema, dict) or not isinstance(schema.get("fields"), list):
        raise FormatError(f"{path}: the schema in the metadata is malformed; {REWRITE}")
    leaves = _count_leaves(schema.get("tree"), 0, path)
    fields = schema["fields"]
    if leaves != len(fields):
        raise FormatError(f"{path}: the schema tree has {leaves} leaves but {len(fields)} fields; {REWRITE}")
    for fld in fields:
        _check_field(fld, path)


def _count_leaves(tree: Any, depth: int, path: str) -> int:
    bad = FormatError(f"{path}: the sample structure in the metadata schema is malformed; {REWRITE}")
    if depth > _MAX_DEPTH or not isinstance(tree, dict):
        raise bad
    kind = tree.get("t")
    if kind == "leaf":
        return 1
    children = tree.get("c")
    if kind not in ("tuple", "list", "dict") or not isinstance(children, list):
        raise bad
    if kind == "dict":
        keys = tree.get("k")
        if not isinstance(keys, list) or len(keys) != len(children) or not all(isinstance(k, str) for k in keys):
            raise bad
    return sum(_count_leaves(child, depth + 1, path) for child in children)


def _check_field(fld: Any, path: str) -> None:
    if not isinstance(fld, dict) or not isinstance(fld.get("name"), str):
        raise FormatError(f"{path}: a schema field in the metadata is malformed; {REWRITE}")
    name, kind, dtype, shape = fld["name"], fld.get("kind"), fld.get("dtype"), fld.get("shape")
    where = f"{path}: schema field {name!r}"
    codec = fld.get("compression")
    if codec is not None and (codec not in COMPRESSION_CODECS or kind in _STRING_KINDS):
        raise FormatError(f"{where}: unknown compression {codec!r}; upgrade torchrecord to read it")
    if kind in _STRING_KINDS:
        if dtype != kind or shape != []:
            raise FormatError(f"{where}: a {kind} field with dtype {dtype!r} and shape {shape!r}; {REWRITE}")
        return
    if kind not in _SCALAR_KINDS + _ARRAY_KINDS:
        raise FormatError(f"{where}: unknown kind {kind!r}; {REWRITE}")
    try:
        _dtypes.by_name(str(dtype) if isinstance(dtype, str) else "")
    except KeyError:
        raise FormatError(f"{where}: unknown dtype {dtype!r}; {REWRITE}") from None
    if not isinstance(shape, list) or len(shape) > _MAX_RANK:
        raise FormatError(f"{where}: shape {shape!r} is not a list of at most {_MAX_RANK} sizes; {REWRITE}")
    if not all(d is None or (_is_int(d) and d >= 0) for d in shape):
        raise FormatError(f"{where}: shape {shape!r} holds something other than sizes >= 0; {REWRITE}")
    if kind in _SCALAR_KINDS and shape:
        raise FormatError(f"{where}: a Python {kind} with shape {shape!r}; {REWRITE}")
    size = _dtypes.by_name(str(dtype)).itemsize
    for d in shape:
        size *= d or 1
    if size >= MAX_FIELD_BYTES:
        raise FormatError(f"{where}: shape {shape!r} is {size} bytes per sample, more than an array holds; {REWRITE}")
