"""Sharded record sets: written in parallel without a coordinator, finalized into one set.

``write_shard(dataset, directory, shard=i, num_shards=n)`` writes shard ``i`` of
``n`` as an ordinary record set ``shard-IIIII-of-NNNNN.tr`` through the same
writer as :func:`~torchrecord.write_record` (temporary file, atomic rename), in
any process on any machine: under torchrun (rank and world size), as a Ray,
Dask or Spark task, or as a SLURM array job. ``finalize_shards(directory)``
checks that every shard is there, complete and of one schema, and publishes
``manifest.json`` atomically; the last writer to finish runs it itself. The
format is specified in docs/FORMAT.md (*Sharded sets*).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch.distributed as dist
from typing_extensions import Unpack

from torchrecord._shards import manifest as _manifest
from torchrecord._shards.sharded import ShardedSet
from torchrecord._storage.objects import ObjectFolder
from torchrecord._storage.stamps import file_digest
from torchrecord._store.record_file import RecordFile
from torchrecord._store.record_set import is_url
from torchrecord._version import __version__
from torchrecord._write.attempts import chosen_attempt
from torchrecord._write.objects import remote_shard_entry, stop_for_test, uploaded, write_remote_shard
from torchrecord._write.settings import WriteOptions, WriteSettings, spell_out
from torchrecord._write.shard_body import ShardBody
from torchrecord._write.shard_plan import (
    LocalFolder,
    SetLock,
    Start,
    Superseded,
    check_attempts,
    check_fits,
    check_folder,
    check_packing,
    check_plans,
    compression_levels,
    describe_missing,
    recheck,
)
from torchrecord.errors import (
    ArgumentError,
    FormatError,
    IncompleteRecordSetError,
    RecordNotFoundError,
    TorchRecordError,
    WriteError,
)

__all__ = ["finalize_shards", "write_shard", "write_shard_source"]

_GROUPS_REFUSED = (
    "write_shard does not take group_by: a sharded set has no groups (ShardedSet.groups is None, so "
    "SequenceDataset, WindowDataset and GroupBatchIter could not read them), and a map-style source's "
    "slices of the global order would cut a group at a shard boundary. Write a grouped set with "
    "write_record(..., group_by=...), or give each writer whole groups as its own iterable and leave "
    "group_by out"
)


@spell_out(WriteOptions)
def write_shard(
    dataset: Any,
    directory: str | os.PathLike[str],
    *,
    shard: int | None = None,
    num_shards: int | None = None,
    finalize: bool = True,
    storage_options: dict[str, Any] | None = None,
    attempt: str | None = None,
    storage: Any = None,
    **options: Unpack[WriteOptions],
) -> RecordFile:
    """Write shard ``shard`` of ``num_shards`` of a sharded set in ``directory``.

    A map-style source (``__len__`` and ``__getitem__``) is the whole data set,
    the same in every writer: shard ``i`` writes positions
    ``[i*N//n, (i+1)*N//n)`` of the one global permutation seeded by ``seed``, so
    the shards in order hold exactly what one :func:`write_record` of the source
    with that seed holds, in the same order. An iterable source is this writer's
    own part of the data: it is written whole, shuffled with a seed derived from
    ``(seed, shard)``.

    Every shard records the write *attempt* that wrote it, and a set is
    finalized only from the shards of one attempt (a shard of another attempt is
    named, to be written again): a retry, a rewrite or a duplicate writer ends
    in the old set, the new set, or an error naming the shards that do not
    belong, never in a mix (see ``attempt`` and docs/shards.md).

    Writing a shard again (a retried task) replaces it atomically; once the set
    is finalized, a retry with the same plan returns the existing shard
    unchanged, and a writer that finds the set finalized by its own attempt
    while it wrote publishes nothing. With ``finalize=True`` the writer that finds every shard done
    after its own publishes the manifest (:func:`finalize_shards`; concurrent
    finalizers publish the same bytes).

    Every writer of one set must pass the same ``num_shards``, ``shuffle``,
    ``seed``, ``checksums``, ``samples_per_record``, ``schema``, ``compression``
    and ``compression_level`` (and, for a map-style source, one of the same
    length). A writer checks this when it starts, against the finalized set's
    shards or the other shards already in ``directory``, and refuses to start
    (``ArgumentError`` naming the option and the shard) before anything is
    written or removed; :func:`finalize_shards` checks every shard again.

    Args:
        dataset: the whole map-style data set, or this shard's iterable.
        directory: the sharded set's folder (created if needed; on a file system
            every writer sees), or an ``s3://bucket/prefix`` URL (extra ``s3``):
            the shard is written to a local temporary folder and uploaded once
            complete, then a small note of what :func:`finalize_shards` needs
            (see docs/s3.md).
        storage_options: for an ``s3://`` folder: keyword arguments for s3fs
            (``key``, ``secret``, ``endpoint_url``...; None: the ``AWS_*``
            environment variables).
        attempt: the id of this write attempt (1-64 letters, digits, ``_ . : -``),
            the same in every writer of one run, e.g. a job id. None:
            ``$TORCHRECORD_WRITE_ATTEMPT``, else under torch.distributed (shard
            and count from the rank and world size) an id rank 0 draws and
            broadcasts, else one derived from the plan (and, with ``overwrite``,
            from the set it replaces). Writers of one plan without an attempt id
            cannot tell an earlier run's unfinished shard from this run's: give
            one where runs may be retried.
        storage: for a remote folder: the storage back end instead of the one
            built from ``storage_options`` (an fsspec file system, or a
            torchrecord storage back end; see docs/s3.md).
        shard, num_shards: which shard of how many; default: the rank and world
            size of ``torch.distributed`` (torchrun).
        finalize: finalize the set when this writer finds every shard done.
        **options: the write options of :func:`torchrecord.write_record`
            (:class:`~torchrecord.WriteOptions`), for this shard; ``max_skipped``
            bounds what this shard leaves out. ``overwrite`` writes the shards of
            a finalized set again, with the set's settings (never another set's:
            write that into another folder), as a new write attempt: the set is
            finalized again only once every shard is of the new attempt. The old
            shards and manifest stay in place until each new shard is complete
            and fits the set; readers then refuse a rewritten shard until the set
            is finalized again.
            ``samples_per_record=None`` lets each shard choose from its first
            sample, and :func:`finalize_shards` refuses shards that chose
            differently: pass the same count (e.g. 1) to every writer of a set
            whose fields vary. ``group_by`` is refused (ValueError): a sharded
            set has no groups.

    Returns:
        The shard, a :class:`RecordFile` (a record set on its own). For an
        ``s3://`` folder the local copy it was written to is removed after the
        upload (its ``write_summary`` says what was written); a retry of a
        finalized set's shard returns the existing shard, fetched into the
        reader's shard cache.

    Raises:
        ArgumentError: ``directory`` holds shards of another ``num_shards``, or
            shards (or a finalized set) written with other settings; nothing is
            written or removed. Also ``num_shards`` above 100,000.
        RecordExistsError: the set's manifest is damaged (``overwrite`` writes
            the shard again and finalizing replaces it), the folder holds a set
            finalized by another chosen attempt (without ``overwrite``), or the set
            was finalized by another attempt while this writer wrote (nothing
            of it was published).
        SchemaError, FormatError: with ``overwrite``, the new shard's fields or
            packing do not fit the finalized set; it is not published, and the
            set stays as it was.
        SourceError, SchemaError, WriteError: as for :func:`write_record`; the
            shard is then absent and :func:`finalize_shards` names it.
        ValueError, TypeError: an option cannot work (checked before reading).
    """
    settings = WriteSettings.of(options, "write_shard")
    return write_shard_source(
        dataset,
        directory,
        settings,
        shard,
        num_shards,
        finalize=finalize,
        storage_options=storage_options,
        attempt=attempt,
        storage=storage,
    )


def write_shard_source(
    dataset: Any,
    directory: str | os.PathLike[str],
    settings: WriteSettings,
    shard: int | None,
    num_shards: int | None,
    *,
    finalize: bool = True,
    storage_options: dict[str, Any] | None = None,
    attempt: str | None = None,
    storage: Any = None,
) -> RecordFile:
    """The body of :func:`write_shard` with checked ``settings`` (also run by the converters)."""
    if settings.group_by is not None:
        raise ArgumentError(_GROUPS_REFUSED)
    shard, num_shards, from_dist = _who(shard, num_shards)
    chosen = chosen_attempt(attempt, from_dist)  # first: under torch.distributed every rank takes part
    folder = os.fspath(directory)
    body = ShardBody.of(dataset, settings, shard, num_shards)
    if is_url(folder):
        remote = ObjectFolder(folder, storage_options, storage)
        return write_remote_shard(body, remote, finalize, chosen, _finalize)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise WriteError(f"{folder}: cannot create the sharded set's folder: {exc}") from exc
    view = LocalFolder(folder)
    # the settings must agree with the set already there before anything is written or removed
    start = check_folder(view, shard, body.info, settings.overwrite, chosen)
    existing = _finalized_shard(folder, start, shard) if start.done else None
    if existing is not None:
        return existing
    body.join(start.attempt)
    target = os.path.join(folder, _manifest.shard_name(shard, num_shards))
    lock = SetLock(folder)

    def before_publish(temp: str) -> None:
        check_fits(start.manifest, folder, shard, temp)  # a finalized set stays readable if it cannot hold it
        body.digest(temp)
        lock.__enter__()  # held until the note is written: finalize_shards sees the shard and its note together
        now = recheck(view, start, shard)
        if now is not None:  # finalized by this attempt meanwhile (a duplicate writer): nothing to publish
            raise Superseded(now)

    try:
        rf = body.write(target, before_publish)
        _manifest.write_json_atomic(_manifest.note_path(target), body.note(rf))
    except Superseded as done:
        return _finalized_shard(folder, Start(done.manifest, start.attempt, True), shard) or RecordFile(target)
    finally:
        lock.release()
    if finalize and _all_written(folder, num_shards):
        with contextlib.suppress(IncompleteRecordSetError):  # shards still to come: the last writer finalizes
            _finalize(folder, None, None, start.attempt.id)
    return rf


def finalize_shards(
    directory: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None, storage: Any = None
) -> ShardedSet:
    """Check the shards in ``directory`` and publish its manifest; returns the set, a :class:`~torchrecord.ShardedSet`.

    Every shard ``0 .. n-1`` must be there and complete, written by one write
    attempt with one plan (number of shards, seed, source kind, ...) and one
    schema (shapes may differ between shards: the manifest widens them).
    Running it again (or in several processes at once) publishes the same
    manifest.

    ``directory`` may be an ``s3://bucket/prefix`` URL the shards were written
    to by :func:`write_shard` (``storage_options`` and ``storage`` as there):
    the shards' notes are read and checked against the checksum each shard was
    uploaded with, never the shards, and the manifest is uploaded last.

    Raises:
        IncompleteRecordSetError: a shard is missing or unfinished, or belongs to
            another write attempt than the others; the message names every such
            shard (and a writer's leftover temporary file).
        SchemaError: two shards hold different kinds of sample (names both).
        FormatError: shards of different plans, or of several shard counts.
        RecordNotFoundError: ``directory`` holds no shard at all.
        WriteError: object storage cannot be reached, or refuses the upload.
    """
    return _finalize(os.fspath(directory), storage_options, storage, None)


def _finalize(folder: str, storage_options: dict[str, Any] | None, storage: Any, mine: str | None) -> ShardedSet:
    """:func:`finalize_shards`; ``mine``: the finalizing writer's attempt (other attempts' shards are named)."""
    remote = ObjectFolder(folder, storage_options, storage) if is_url(folder) else None
    if remote is None and not os.path.isdir(folder):
        raise RecordNotFoundError(f"{folder}: no such folder; write its shards with torchrecord.write_shard")
    with contextlib.nullcontext() if remote is not None else SetLock(folder):
        names = uploaded(remote.names()) if remote is not None else os.listdir(folder)
        n = _shard_count(folder, names)
        missing = [i for i in range(n) if _manifest.shard_name(i, n) not in names]
        if missing:
            raise IncompleteRecordSetError(f"{folder}: {describe_missing(names, missing, n)}")
        entries: list[dict[str, Any]] = []
        metas: list[dict[str, Any]] = []
        for i in range(n):
            entry, meta = remote_shard_entry(remote, i, n) if remote is not None else _shard_entry(folder, i, n)
            entries.append(entry)
            metas.append(meta)
        manifest = _build_manifest(folder, entries, metas, mine)
        if remote is not None:
            stop_for_test("before-manifest")
            remote.put_json(_manifest.MANIFEST_NAME, manifest)  # last: readers see the set from now on
            return ShardedSet(remote.url, storage_options=remote.storage_options, storage=remote.given)
        _manifest.write_json_atomic(os.path.join(folder, _manifest.MANIFEST_NAME), manifest)
    return ShardedSet(folder)


def _shard_count(folder: str, names: list[str]) -> int:
    """The one shard count of the shards in a folder (RecordNotFoundError: none; FormatError: several)."""
    counts = sorted({parsed[1] for parsed in map(_manifest.parse_shard_name, names) if parsed is not None})
    if not counts:
        raise RecordNotFoundError(f"{folder}: holds no shard files; write them with torchrecord.write_shard")
    if len(counts) > 1:
        raise FormatError(
            f"{folder}: holds shards of sets of {', '.join(map(str, counts))} shards; a folder holds one sharded "
            "set: remove the files of the other one"
        )
    return counts[0]


def _build_manifest(
    folder: str, entries: list[dict[str, Any]], metas: list[dict[str, Any]], mine: str | None
) -> dict[str, Any]:
    """The manifest of the checked shards: one attempt, one plan, one schema, one packing."""
    check_plans(folder, metas)  # first: a shard of another plan is named with the setting that differs
    attempt = check_attempts(folder, metas, mine)
    schema = _manifest.merge_schemas([(e["name"], m.get("schema")) for e, m in zip(entries, metas)])
    packing = check_packing(folder, metas)
    first = metas[0]
    manifest: dict[str, Any] = {
        "format": _manifest.MANIFEST_FORMAT,
        "manifest_version": _manifest.MANIFEST_VERSION,
        "library_version": __version__,
        # the newest format among the shards (2 where a field is compressed), for `torchrecord info`
        "format_version": max(int(m.get("format_version", 1)) for m in metas),
        "set_id": _manifest.manifest_set_id([e["set_id"] for e in entries]),
        "count": sum(e["count"] for e in entries),
        "samples_per_record": packing,
        "schema": schema,
        "shuffled": bool(first.get("shuffled")),
        "seed": int(first["shard"]["seed"]),
        "source": first["shard"]["source"],
        "skipped": sum(int(m.get("skipped", 0)) for m in metas),
        "checksum": first.get("checksum"),
        "created": max(str(m.get("created", "")) for m in metas),
        "user": first.get("user") or {},
        "shards": entries,
    }
    if attempt is not None:
        manifest["attempt"] = attempt
    compression = compression_levels(metas)
    if compression:
        manifest["compression"] = compression
    return manifest


def _finalized_shard(folder: str, start: Start, shard: int) -> RecordFile | None:
    """The finalized set's shard, if the file there is the one its manifest lists (else None: write it)."""
    manifest = start.manifest
    if manifest is None:
        return None
    entry = manifest["shards"][shard]
    try:
        rf = RecordFile(os.path.join(folder, entry["name"]))
        if rf.set_id == entry["set_id"]:
            return rf  # a retry of a finalized set's shard: unchanged
    except (TorchRecordError, OSError):
        pass  # the shard is gone or unreadable: write it again
    return None


# -- helpers ----------------------------------------------------------------------------


def _who(shard: int | None, num_shards: int | None) -> tuple[int, int, bool]:
    """(shard, num_shards, whether they came from torch.distributed), checked."""
    if shard is None and num_shards is None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), True
    if shard is None or num_shards is None:
        raise ArgumentError(
            "give shard= and num_shards= (or run under torch.distributed, whose rank and world size are the default)"
        )
    if isinstance(shard, bool) or not isinstance(shard, int) or not isinstance(num_shards, int) or num_shards < 1:
        raise ArgumentError(f"shard and num_shards must be ints with num_shards >= 1, got {shard!r}, {num_shards!r}")
    if num_shards > _manifest.MAX_SHARDS:
        raise ArgumentError(
            f"num_shards={num_shards}: a sharded set has at most {_manifest.MAX_SHARDS} shards (readers refuse a "
            "manifest of more); write fewer, larger shards"
        )
    if not 0 <= shard < num_shards:
        raise ArgumentError(f"shard {shard} is not in [0, {num_shards})")
    return shard, num_shards, False


def _all_written(folder: str, n: int) -> bool:
    names = set(os.listdir(folder))
    return all(_manifest.shard_name(i, n) in names and _manifest.shard_name(i, n) + ".json" in names for i in range(n))


def _shard_entry(folder: str, i: int, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest entry of shard ``i`` and its metadata, the checksum from its note (or computed).

    The note is taken only when it is the note of this very file: its ``set_id`` (a random id
    written inside the file) and its size; else the file is hashed.
    """
    name = _manifest.shard_name(i, n)
    path = os.path.join(folder, name)
    rf = RecordFile(path)
    meta = rf.metadata  # raises IncompleteRecordSetError / FormatError naming the shard's file
    info = meta.get("shard")
    if not isinstance(info, dict) or info.get("index") != i or info.get("of") != n:
        raise FormatError(f"{path}: not shard {i} of {n} written by write_shard (its metadata says {info!r})")
    note: Any = None
    with contextlib.suppress(OSError, FormatError):
        note = _manifest.read_json(_manifest.note_path(path))
    size = os.path.getsize(path)
    if (
        isinstance(note, dict)
        and note.get("set_id") == rf.set_id
        and isinstance(note.get("sha256"), str)
        and note.get("bytes") == size
    ):
        digest = note["sha256"]
    else:  # no note (the writer stopped right after its rename), or one of an earlier write
        digest, size = file_digest(path)
    entry = {
        "name": name,
        "count": len(rf),
        "records": rf.num_records,
        "bytes": size,
        "sha256": digest,
        "set_id": rf.set_id,
    }
    return entry, meta
