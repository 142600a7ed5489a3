"""A shard of a sharded set on object storage (``s3://``): staged locally, uploaded whole, then its note.

Object storage has no rename and no partial visibility: an object appears whole when its upload
ends, or not at all. So a shard is written in a local staging folder (``_storage/staging.py``:
a killed writer's copy is removed by the next writer on the machine), its plan is checked again,
a killed writer's unfinished uploads of that shard are aborted, and the finished file is uploaded
in one put with its SHA-256, ``set_id`` and write attempt stored as the object's metadata; then a
small *note* beside it (``shard-...tr.json``: what :func:`~torchrecord.finalize_shards` needs, so
finalizing never downloads a shard). A shard counts as written once its note is up and the note
names the checksum the object was uploaded with. ``finalize_shards`` uploads ``manifest.json`` last.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from torchrecord._shards import manifest as _manifest
from torchrecord._shards.sharded import ShardedSet
from torchrecord._storage.cache import SHA256_KEY
from torchrecord._storage.objects import ObjectFolder
from torchrecord._storage.staging import Staging
from torchrecord._store.record_file import RecordFile
from torchrecord._write.shard_body import ShardBody
from torchrecord._write.shard_plan import Start, check_fits, check_folder, recheck
from torchrecord.errors import FormatError, IncompleteRecordSetError, TorchRecordError, WriteError

__all__ = [
    "ATTEMPT_KEY",
    "RemoteFolder",
    "SET_ID_KEY",
    "STOP_ENV",
    "remote_shard_entry",
    "stop_for_test",
    "uploaded",
    "write_remote_shard",
]

#: Test hook: the writer kills itself (SIGKILL, as a killed task would be) at this point of an
#: upload: ``before-upload`` (its shard is staged, not uploaded), ``before-note`` (its shard is up,
#: its note is not) or ``before-manifest`` (every note is read and the manifest built, not uploaded).
STOP_ENV = "TORCHRECORD_TEST_STOP"
#: The object metadata keys of a shard: its write attempt and set_id (its SHA-256: SHA256_KEY).
ATTEMPT_KEY = "torchrecord-attempt"
SET_ID_KEY = "torchrecord-set-id"


def stop_for_test(point: str) -> None:
    """Kill this process if ``$TORCHRECORD_TEST_STOP`` names ``point`` (tests of a killed writer)."""
    if os.environ.get(STOP_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


class RemoteFolder:
    """A sharded set's prefix on object storage, as :func:`~torchrecord._write.shard_plan.check_folder` sees it.

    A writer looks at two other shards' notes at most (each is a request): one is enough to see
    another plan, and ``finalize_shards`` checks every note.
    """

    look_at = 2

    def __init__(self, objects: ObjectFolder) -> None:
        self.objects = objects
        self.where = objects.url

    def names(self) -> list[str]:
        return sorted(self.objects.names())

    def read_manifest(self) -> dict[str, Any] | None:
        try:
            data = self.objects.read_bytes(_manifest.MANIFEST_NAME, _manifest.MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            return None
        where = self.objects.where(_manifest.MANIFEST_NAME)
        return _manifest.check_manifest(_manifest.parse_json(_manifest.decode_text(data, where), where), where)

    def shard_meta(self, i: int, n: int) -> dict[str, Any] | None:
        try:
            meta = _read_note(self.objects, _manifest.shard_name(i, n) + ".json").get("meta")
        except (TorchRecordError, FileNotFoundError):
            return None
        return meta if isinstance(meta, dict) else None


def write_remote_shard(
    body: ShardBody,
    objects: ObjectFolder,
    finalize: bool,
    chosen: str | None,
    finalizer: Callable[[str, dict[str, Any] | None, Any, str | None], ShardedSet],
) -> RecordFile:
    """Write ``body``'s shard into ``objects`` (see the module's docstring); returns the shard as written."""
    shard, n = int(body.info["index"]), int(body.info["of"])
    name = _manifest.shard_name(shard, n)
    view = RemoteFolder(objects)
    start = check_folder(view, shard, body.info, body.settings.overwrite, chosen)
    if start.done and (existing := _finalized_shard(objects, start, shard)) is not None:
        return existing
    body.join(start.attempt)
    with Staging() as staging:
        path = os.path.join(staging.path, name)
        rf = body.write(path, lambda temp: check_fits(start.manifest, objects.url, shard, temp))
        digest = body.digest(path)
        note = {**body.note(rf), "meta": rf.metadata, "records": rf.num_records}
        if (now := recheck(view, start, shard)) is not None:  # finalized by this attempt meanwhile: done
            return _finalized_shard(objects, Start(now, start.attempt, True), shard) or rf
        stop_for_test("before-upload")
        objects.abort_uploads(name, time.time())  # what a killed writer of this shard left on the server
        metadata = {SHA256_KEY: digest["sha256"], SET_ID_KEY: str(note["set_id"])}
        if "attempt" in note:
            metadata[ATTEMPT_KEY] = str(note["attempt"])
        objects.upload(path, name, metadata)  # one put: the shard appears whole, or not at all
    stop_for_test("before-note")
    again = _after_upload(view, start, shard)
    objects.put_json(name + ".json", note)  # the shard counts as written from now on
    if finalize or again:
        try:  # the last writer finalizes; one whose upload replaced a shard of its own attempt's set must
            finalizer(objects.url, objects.storage_options, objects.given, start.attempt.id)
        except IncompleteRecordSetError:
            if again:
                raise
    return rf


def _after_upload(view: RemoteFolder, start: Start, shard: int) -> bool:
    """After the upload: True when the set was finalized meanwhile by this attempt (it must be finalized again).

    A set finalized meanwhile by another attempt had this shard replaced under it: a WriteError
    says so (readers refuse that shard by its checksum at once, and name it).
    """
    try:
        return recheck(view, start, shard) is not None
    except TorchRecordError as exc:
        raise WriteError(
            f"{view.where}: shard {shard} was uploaded while another write attempt finalized the set there, so it "
            f"replaced that set's shard {shard}; readers now refuse it by its checksum. Write shard {shard} again "
            f"with that set's attempt (attempt=...), or rewrite the set (overwrite=True). ({exc})"
        ) from None


def _finalized_shard(objects: ObjectFolder, start: Start, shard: int) -> RecordFile | None:
    """The finalized set's shard (fetched), if the object there is the one its manifest lists (else None)."""
    manifest = start.manifest
    if manifest is None:
        return None
    entry = manifest["shards"][shard]
    info = objects.stat(entry["name"])
    recorded = info.metadata.get(SHA256_KEY) if info is not None else None
    if info is None or info.size != entry["bytes"] or (recorded is not None and recorded != entry["sha256"]):
        return None  # gone, or replaced since: write it (again)
    return ShardedSet(objects.url, storage_options=objects.storage_options, storage=objects.given).shard(shard)


def uploaded(names: list[str]) -> list[str]:
    """The names in a remote folder, shards without their note left out (not completely uploaded)."""
    present = set(names)
    return [n for n in names if _manifest.parse_shard_name(n) is None or n + ".json" in present]


def _read_note(objects: ObjectFolder, name: str) -> dict[str, Any]:
    data = objects.read_bytes(name, _manifest.MAX_MANIFEST_BYTES)
    note = _manifest.parse_json(_manifest.decode_text(data, objects.where(name)), objects.where(name))
    if not isinstance(note, dict):
        raise FormatError(f"{objects.where(name)}: not the note of a shard written by write_shard")
    return note


def remote_shard_entry(objects: ObjectFolder, i: int, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest entry of shard ``i`` of ``n`` and its metadata, from its note, checked against the object.

    The note must name the checksum the object was uploaded with (where the back end keeps
    metadata; else its size): a note left by an earlier upload is not taken for a new body.
    """
    name = _manifest.shard_name(i, n)
    where = objects.where(name + ".json")
    note = _read_note(objects, name + ".json")
    try:
        meta = note["meta"]
        entry: dict[str, Any] = {
            "name": name,
            "count": int(note["count"]),
            "records": int(note["records"]),
            "bytes": int(note["bytes"]),
            "sha256": str(note["sha256"]),
            "set_id": str(note["set_id"]),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(
            f"{where}: not the note of a shard written by write_shard ({exc!r}); write shard {i} again"
        ) from None
    info = meta.get("shard") if isinstance(meta, dict) else None
    if not isinstance(info, dict) or info.get("index") != i or info.get("of") != n:
        raise FormatError(f"{where}: not the note of shard {i} of {n} written by write_shard (it says {info!r})")
    found = objects.stat(name)
    if found is None:
        raise IncompleteRecordSetError(f"{objects.where(name)}: shard {i} is not there (its note is); write it again")
    recorded = found.metadata.get(SHA256_KEY)
    if found.size != entry["bytes"] or (recorded is not None and recorded != entry["sha256"]):
        said = f"SHA-256 {recorded[:16]}..." if recorded else f"{found.size} bytes"
        raise IncompleteRecordSetError(
            f"{objects.where(name)}: shard {i} is not the file its note describes (the object was uploaded with "
            f"{said}, the note says SHA-256 {str(entry['sha256'])[:16]}..., {entry['bytes']} bytes): its writer "
            f"stopped after uploading it and before writing its note, or another writer replaced it. Write shard {i} "
            "again, then finalize_shards"
        )
    return entry, meta
