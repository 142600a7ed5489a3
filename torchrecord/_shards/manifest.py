"""The on-disk layout of a sharded set (see docs/FORMAT.md, *Sharded sets*): names, manifest, notes.

A sharded set is a directory (or a URL prefix) of ordinary record-set files
``shard-IIIII-of-NNNNN.tr`` and one ``manifest.json`` that lists them. Each
writer leaves a small note beside its shard (``shard-...tr.json``: count, size,
SHA-256 and ``set_id`` of the file it published) so that finalizing does not
read the data again. Nothing here opens LMDB; the manifest is plain JSON.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
from typing import Any, TypeGuard

from torchrecord._core.schema import Field, Schema
from torchrecord._storage.stamps import file_digest
from torchrecord._storage.temps import temp_path
from torchrecord._store.claims import fixed_sample_bytes
from torchrecord._store.format import MAX_SAMPLES_PER_RECORD, check_schema
from torchrecord._store.record_set import MANIFEST_NAME
from torchrecord.errors import FormatError, NotARecordSetError, RecordNotFoundError, SchemaError, VersionError

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "MAX_MANIFEST_BYTES",
    "MAX_SHARDS",
    "MIN_RECORD_BYTES",
    "check_manifest",
    "file_digest",
    "manifest_set_id",
    "merge_schemas",
    "note_path",
    "parse_json",
    "parse_shard_name",
    "read_json",
    "read_text",
    "shard_name",
    "write_json_atomic",
]

MANIFEST_FORMAT = "torchrecord-shards"
#: Bump on any change a reader of the previous version would misread.
MANIFEST_VERSION = 1

#: The most shards a manifest may list: shard names have five digits (``shard-00000`` .. ``shard-99999``).
MAX_SHARDS = 100_000
#: The largest manifest read: one of :data:`MAX_SHARDS` entries takes about 30 MB.
MAX_MANIFEST_BYTES = 64 << 20
#: Bytes of file a record takes at least (LMDB's node header, key and page pointer): bounds the
#: records, and so the samples, a manifest may claim for a shard of a given size.
MIN_RECORD_BYTES = 16

_SET_ID = re.compile(r"^[0-9A-Za-z_-]{1,64}$")  # it names a cache folder: nothing else
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHARD = re.compile(r"^shard-(\d{5,})-of-(\d{5,})\.tr$")


def shard_name(shard: int, num_shards: int) -> str:
    """The file name of shard ``shard`` of ``num_shards``: ``shard-00002-of-00004.tr``."""
    return f"shard-{shard:05d}-of-{num_shards:05d}.tr"


def parse_shard_name(name: str) -> tuple[int, int] | None:
    """(shard, num_shards) of a shard file name, or None for any other name."""
    match = _SHARD.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def note_path(shard_path: str) -> str:
    """The writer's note beside a shard file."""
    return shard_path + ".json"


def manifest_set_id(shard_ids: list[str]) -> str:
    """The set_id of a sharded set: 32 hex digits of SHA-256 over its shards' set_ids, in order.

    Deterministic, so two writers that finalize the same shards at once publish
    the same manifest.
    """
    return hashlib.sha256(json.dumps(["torchrecord-shards", *shard_ids]).encode()).hexdigest()[:32]


def read_json(path: str) -> Any:
    """A small JSON file's value (FormatError naming the file if it is not JSON; see :func:`read_text`)."""
    return parse_json(read_text(path), path)


def read_text(path: str, limit: int = MAX_MANIFEST_BYTES) -> str:
    """The UTF-8 text of a manifest (or note) file, read only if it is a regular file of at most ``limit`` bytes.

    A FIFO, a device or a folder is never read from (opening does not block: a
    FIFO would otherwise hang the reader), and every failure is a torchrecord
    error naming the path: RecordNotFoundError (no file), NotARecordSetError
    (not a regular file, a symbolic-link loop, a name too long, a null byte in
    the path), FormatError (too large, not UTF-8).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: a FIFO must not block
    except FileNotFoundError:
        raise RecordNotFoundError(f"{path}: no sharded-set manifest here; check the path") from None
    except ValueError:  # a null byte in the path
        raise NotARecordSetError(f"{path!r}: a path cannot hold a null byte; check the path") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotARecordSetError(
                f"{path}: a symbolic link that loops (or too many links in a row); not a sharded-set manifest"
            ) from None
        raise NotARecordSetError(f"{path}: cannot open it: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARecordSetError(f"{path}: not a regular file, so not a sharded-set manifest")
        if st.st_size > limit:
            raise FormatError(f"{path}: {st.st_size} bytes, more than the {limit} a manifest may have")
        pieces = []
        size = 0
        while piece := os.read(fd, 1 << 20):
            pieces.append(piece)
            size += len(piece)
            if size > limit:
                raise FormatError(f"{path}: more than the {limit} bytes a manifest may have")
    except OSError as exc:
        raise NotARecordSetError(f"{path}: cannot read it: {exc.strerror}") from None
    finally:
        os.close(fd)
    return decode_text(b"".join(pieces), path)


def decode_text(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text; FormatError naming ``where`` and the byte if it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(
            f"{where}: not UTF-8 text at byte {exc.start} ({exc.reason}); a manifest is UTF-8 JSON"
        ) from None


def parse_json(text: str, where: str) -> Any:
    """JSON text's value (FormatError naming ``where`` if it is not JSON, or nested too deeply to read)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise FormatError(f"{where}: not a manifest: its JSON is nested too deeply") from None
    except ValueError as exc:
        raise FormatError(f"{where}: not valid JSON ({str(exc)[:200]})") from None


def write_json_atomic(path: str, value: Any) -> None:
    """Write ``value`` as JSON to a hidden temporary beside ``path``, sync it and rename it into place."""
    directory = os.path.dirname(os.path.abspath(path))
    temp = temp_path(path)
    try:
        with open(temp, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def merge_schemas(schemas: list[tuple[str, dict[str, Any] | None]]) -> dict[str, Any] | None:
    """The schema shared by every shard, shapes widened where shards differ; SchemaError naming a shard.

    ``schemas`` holds (shard name, its schema dict or None for an empty shard).
    Structure, field names, kinds, dtypes and ranks must agree.
    """
    merged: Schema | None = None
    first = ""
    for name, d in schemas:
        if d is None:
            continue
        schema = Schema.from_dict(d)
        if merged is None:
            merged, first = schema, name
            continue
        if schema.tree != merged.tree or schema.names != merged.names:
            raise SchemaError(
                f"{name}: its samples have the fields ({', '.join(schema.names)}), {first} has "
                f"({', '.join(merged.names)}); every shard must be written from the same kind of sample"
            )
        fields = []
        for a, b in zip(merged.fields, schema.fields):
            if (a.kind, a.dtype, len(a.shape)) != (b.kind, b.dtype, len(b.shape)):
                raise SchemaError(
                    f"{name}, field {b.name!r}: {b.kind} of {b.dtype} with rank {len(b.shape)} differs from "
                    f"{first}'s {a.kind} of {a.dtype} with rank {len(a.shape)}; every shard must agree"
                )
            shape = tuple(x if x == y else None for x, y in zip(a.shape, b.shape))
            fields.append(Field(a.name, a.kind, a.dtype, shape))
        merged = Schema(merged.tree, fields)
    return merged.to_dict() if merged is not None else None


_SHARD_KEYS = {"name": str, "count": int, "records": int, "bytes": int, "sha256": str, "set_id": str}


def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def check_manifest(manifest: Any, where: str) -> dict[str, Any]:
    """Check a decoded manifest before any reader relies on it; returns it unchanged.

    Every field is checked for its type and range, every shard entry must name
    shard ``i`` of ``n`` in order (no repeats, no other paths), the shards' own
    ``set_id`` values must differ and give the manifest's ``set_id``, and each
    shard's count must fit its records and its bytes. Each failure is a
    FormatError naming ``where`` and the field.
    """
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise NotARecordSetError(f"{where}: not a torchrecord sharded-set manifest; check the path")
    version = manifest.get("manifest_version")
    if not _is_int(version) or version < 1:
        raise FormatError(f"{where}: the manifest has no valid manifest_version")
    if version > MANIFEST_VERSION:
        raise VersionError(
            f"{where}: sharded-set manifest version {version} (torchrecord "
            f"{str(manifest.get('library_version', '?'))[:40]}); "
            f"this torchrecord reads versions up to {MANIFEST_VERSION}. Upgrade torchrecord to read it."
        )
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not shards:
        raise FormatError(f"{where}: the manifest lists no shards")
    n = len(shards)
    if n > MAX_SHARDS:
        raise FormatError(f"{where}: the manifest lists {n} shards, more than the {MAX_SHARDS} a set may have")
    per_record = manifest.get("samples_per_record", 1)
    if not _is_int(per_record) or not 1 <= per_record <= MAX_SAMPLES_PER_RECORD:
        raise FormatError(
            f"{where}: the manifest's samples_per_record {per_record!r} is not in 1..{MAX_SAMPLES_PER_RECORD}"
        )
    if manifest.get("schema") is not None:
        check_schema(manifest["schema"], where)
    per_sample = fixed_sample_bytes((manifest.get("schema") or {}).get("fields", []))
    total = 0
    ids: dict[str, int] = {}
    for i, entry in enumerate(shards):
        _check_entry(entry, i, n, per_record, per_sample, where)
        first = ids.setdefault(entry["set_id"], i)
        if first != i:
            raise FormatError(
                f"{where}: shard entries {first} and {i} of the manifest have the same set_id "
                f"{entry['set_id']}: one file listed twice; run torchrecord.finalize_shards again"
            )
        total += entry["count"]
    count = manifest.get("count")
    if not _is_int(count) or count != total:
        raise FormatError(f"{where}: the manifest's count {str(count)[:40]} is not the sum of its shards' ({total})")
    set_id = manifest.get("set_id")
    if not isinstance(set_id, str) or not _SET_ID.match(set_id):
        raise FormatError(f"{where}: the manifest has no valid set_id (letters, digits, '-' and '_')")
    if set_id != manifest_set_id(list(ids)):
        raise FormatError(
            f"{where}: the manifest's set_id {set_id} is not the one its shards' set_ids give "
            f"({manifest_set_id(list(ids))}): the shard list was changed after finalizing; "
            "run torchrecord.finalize_shards again"
        )
    if not isinstance(manifest.get("user", {}), dict):
        raise FormatError(f"{where}: the manifest's user {str(manifest.get('user'))[:40]!r} is not a map")
    if manifest.get("checksum") not in (None, "crc32"):
        raise FormatError(f"{where}: the manifest's checksum {str(manifest.get('checksum'))[:40]!r} is not 'crc32'")
    if manifest.get("schema") is None and total:
        raise FormatError(f"{where}: the manifest has {total} samples but no schema")
    return manifest


def _check_entry(entry: Any, i: int, n: int, per_record: int, per_sample: int, where: str) -> None:
    """One shard entry: types, the name of shard ``i`` of ``n``, and counts that fit its records and bytes."""
    at = f"{where}: shard entry {i} of the manifest"
    if not isinstance(entry, dict):
        raise FormatError(f"{at} is not a map")
    for key, kind in _SHARD_KEYS.items():
        value = entry.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise FormatError(f"{at}: {key} {str(value)[:40]!r} is not a {kind.__name__}")
        if isinstance(value, int) and value < 0:
            raise FormatError(f"{at}: {key} {value} is negative")
    name = entry["name"]
    if name != shard_name(i, n):
        raise FormatError(
            f"{at}: the name {name[:80]!r} is not {shard_name(i, n)!r}; a manifest lists shard 0 .. {n - 1} of {n}, "
            "in order, each once"
        )
    if not _SET_ID.match(entry["set_id"]):
        raise FormatError(f"{at}: set_id {entry['set_id'][:80]!r} is not a set_id (letters, digits, '-' and '_')")
    if not _SHA256.match(entry["sha256"]):
        raise FormatError(f"{at}: sha256 {entry['sha256'][:80]!r} is not 64 hex digits")
    count, records, size = entry["count"], entry["records"], entry["bytes"]
    if records != -(-count // per_record):
        raise FormatError(f"{at}: records {records} do not hold count {count} at {per_record} samples per record")
    if records * MIN_RECORD_BYTES > size or count * per_sample > size:
        raise FormatError(
            f"{at}: count {count} ({records} records, at least {per_sample} bytes a sample) does not fit in "
            f"its bytes {size}"
        )
