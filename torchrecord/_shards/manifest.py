"""The on-disk layout of a sharded set (see docs/FORMAT.md, *Sharded sets*): names, manifest, notes.

A sharded set is a directory (or a URL prefix) of ordinary record-set files
``shard-IIIII-of-NNNNN.tr`` and one ``manifest.json`` that lists them. Each
writer leaves a small note beside its shard (``shard-...tr.json``: count, size,
SHA-256 and ``set_id`` of the file it published) so that finalizing does not
read the data again. Nothing here opens LMDB; the manifest is plain JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from typing import Any

from torchrecord._core.schema import Field, Schema
from torchrecord._store.format import check_schema
from torchrecord._store.record_set import MANIFEST_NAME
from torchrecord.errors import FormatError, NotARecordSetError, SchemaError, VersionError

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "check_manifest",
    "file_digest",
    "manifest_set_id",
    "merge_schemas",
    "note_path",
    "parse_json",
    "parse_shard_name",
    "read_json",
    "shard_name",
    "write_json_atomic",
]

MANIFEST_FORMAT = "torchrecord-shards"
#: Bump on any change a reader of the previous version would misread.
MANIFEST_VERSION = 1

_SET_ID = re.compile(r"^[0-9A-Za-z_-]{1,64}$")  # it names a cache folder: nothing else
_SHARD = re.compile(r"^shard-(\d{5,})-of-(\d{5,})\.tr$")
_DIGEST_CHUNK = 8 << 20


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


def file_digest(path: str) -> tuple[str, int]:
    """(SHA-256 hex digest, size in bytes) of a file, read in 8 MiB pieces."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while piece := f.read(_DIGEST_CHUNK):
            h.update(piece)
            size += len(piece)
    return h.hexdigest(), size


def manifest_set_id(shard_ids: list[str]) -> str:
    """The set_id of a sharded set: 32 hex digits of SHA-256 over its shards' set_ids, in order.

    Deterministic, so two writers that finalize the same shards at once publish
    the same manifest.
    """
    return hashlib.sha256(json.dumps(["torchrecord-shards", *shard_ids]).encode()).hexdigest()[:32]


def read_json(path: str) -> Any:
    """A small JSON file's value (FormatError naming the file if it is not JSON)."""
    with open(path, encoding="utf-8") as f:
        return parse_json(f.read(), path)


def parse_json(text: str, where: str) -> Any:
    """JSON text's value (FormatError naming ``where`` if it is not JSON)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise FormatError(f"{where}: not valid JSON ({exc})") from None


def write_json_atomic(path: str, value: Any) -> None:
    """Write ``value`` as JSON to a hidden temporary beside ``path``, sync it and rename it into place."""
    directory, name = os.path.split(os.path.abspath(path))
    temp = os.path.join(directory, f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
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


def check_manifest(manifest: Any, where: str) -> dict[str, Any]:
    """Check a decoded manifest before any reader relies on it; returns it unchanged."""
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise NotARecordSetError(f"{where}: not a torchrecord sharded-set manifest; check the path")
    version = manifest.get("manifest_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FormatError(f"{where}: the manifest has no valid manifest_version")
    if version > MANIFEST_VERSION:
        raise VersionError(
            f"{where}: sharded-set manifest version {version} (torchrecord {manifest.get('library_version', '?')}); "
            f"this torchrecord reads versions up to {MANIFEST_VERSION}. Upgrade torchrecord to read it."
        )
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not shards:
        raise FormatError(f"{where}: the manifest lists no shards")
    total = 0
    for i, entry in enumerate(shards):
        if not isinstance(entry, dict) or any(not isinstance(entry.get(k), t) for k, t in _SHARD_KEYS.items()):
            raise FormatError(f"{where}: shard entry {i} of the manifest is malformed")
        name = entry["name"]
        if "/" in name or "\\" in name or name in ("", ".", "..") or entry["count"] < 0:
            raise FormatError(f"{where}: shard entry {i} of the manifest has a bad name or count")
        total += entry["count"]
    if manifest.get("count") != total:
        raise FormatError(f"{where}: the manifest's count {manifest.get('count')!r} is not the sum of its shards'")
    per_record = manifest.get("samples_per_record", 1)
    if not isinstance(per_record, int) or per_record < 1:
        raise FormatError(f"{where}: the manifest's samples_per_record {per_record!r} is not >= 1")
    if not isinstance(manifest.get("set_id"), str) or not _SET_ID.match(manifest["set_id"]):
        raise FormatError(f"{where}: the manifest has no valid set_id (letters, digits, '-' and '_')")
    if manifest.get("schema") is not None:
        check_schema(manifest["schema"], where)
    elif total:
        raise FormatError(f"{where}: the manifest has {total} samples but no schema")
    return manifest
