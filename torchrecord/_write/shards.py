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
import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import torch.distributed as dist

from torchrecord._core import compress as _compress
from torchrecord._shards import manifest as _manifest
from torchrecord._shards.sharded import ShardedSet
from torchrecord._store.record_file import RecordFile
from torchrecord._store.record_set import is_url
from torchrecord._version import __version__
from torchrecord._write.declared import Declared
from torchrecord._write.objects import RemoteFolder, stop_for_test
from torchrecord._write.settings import WriteSettings
from torchrecord._write.sources import is_map_style
from torchrecord._write.writer import SchemaArg, write_source
from torchrecord.errors import (
    ArgumentError,
    FormatError,
    IncompleteRecordSetError,
    RecordExistsError,
    RecordNotFoundError,
    TorchRecordError,
    WriteError,
)

__all__ = ["finalize_shards", "write_shard", "write_shard_source"]

#: What every shard of one set must agree on (from each shard's ``shard`` metadata): its place in
#: the plan, and the options that decide what the shards hold and how (``options``).
_PLAN_KEYS = ("of", "seed", "source", "total", "options")

_GROUPS_REFUSED = (
    "write_shard does not take group_by: a sharded set has no groups (ShardedSet.groups is None, so "
    "SequenceDataset, WindowDataset and GroupBatchIter could not read them), and a map-style source's "
    "slices of the global order would cut a group at a shard boundary. Write a grouped set with "
    "write_record(..., group_by=...), or give each writer whole groups as its own iterable and leave "
    "group_by out"
)


def write_shard(
    dataset: Any,
    directory: str | os.PathLike[str],
    *,
    shard: int | None = None,
    num_shards: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    overwrite: bool = False,
    finalize: bool = True,
    progress: bool | None = None,
    metadata: dict[str, Any] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    max_skipped: int | float | None = None,
    checksums: bool = True,
    samples_per_record: int | None = None,
    group_by: str | Callable[[Any], Any] | None = None,
    schema: SchemaArg = None,
    initial_map_size: int = 1 << 28,
    commit_bytes: int = 64 << 20,
    multiprocessing_context: Literal["fork", "spawn", "forkserver"] | None = None,
    compression: Literal["zstd", "lz4"] | Mapping[str, Literal["zstd", "lz4"] | None] | None = None,
    compression_level: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> RecordFile:
    """Write shard ``shard`` of ``num_shards`` of a sharded set in ``directory``.

    A map-style source (``__len__`` and ``__getitem__``) is the whole data set,
    the same in every writer: shard ``i`` writes positions
    ``[i*N//n, (i+1)*N//n)`` of the one global permutation seeded by ``seed``, so
    the shards in order hold exactly what one :func:`write_record` of the source
    with that seed holds, in the same order. An iterable source is this writer's
    own part of the data: it is written whole, shuffled with a seed derived from
    ``(seed, shard)``.

    Writing a shard again (a retried task) replaces it atomically; once the set
    is finalized, a retry with the same plan returns the existing shard
    unchanged. With ``finalize=True`` the writer that finds every shard done
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
        shard, num_shards: which shard of how many; default: the rank and world
            size of ``torch.distributed`` (torchrun).
        overwrite: write the shard of a finalized set again, with the set's
            settings (never another set's: write that into another folder). The
            old shard and manifest stay in place until the new shard is complete
            and fits the set; readers then refuse the rewritten shard until the
            set is finalized again (by this writer with ``finalize=True``).
        finalize: finalize the set when this writer finds every shard done.
        samples_per_record: as for :func:`torchrecord.write_record`; None (the
            default) lets each shard choose from its first sample. A sharded set
            is read with one packing, so shards that choose differently (their
            fields differ in shape, or one turned variable) are refused by
            :func:`finalize_shards`: pass the same count (e.g. 1) to every writer
            of such a set.
        group_by: not supported (None only; ValueError): a sharded set has no groups.
        shuffle, seed, num_workers, progress, metadata, on_error, max_skipped,
            checksums, schema, initial_map_size, commit_bytes,
            multiprocessing_context, compression, compression_level: as for
            :func:`torchrecord.write_record`, for this shard (``max_skipped``
            bounds what this shard leaves out).

    Returns:
        The shard, a :class:`RecordFile` (a record set on its own). For an
        ``s3://`` folder the local copy it was written to is removed after the
        upload (its ``write_summary`` says what was written); a retry of a
        finalized set's shard returns the existing shard, fetched into the
        reader's shard cache.

    Raises:
        ArgumentError: ``directory`` holds shards of another ``num_shards``, or
            shards (or a finalized set) written with other settings; nothing is
            written or removed.
        RecordExistsError: the set's manifest is damaged (``overwrite`` writes
            the shard again and finalizing replaces it).
        SchemaError, FormatError: with ``overwrite``, the new shard's fields or
            packing do not fit the finalized set; it is not published, and the
            set stays as it was.
        SourceError, SchemaError, WriteError: as for :func:`write_record`; the
            shard is then absent and :func:`finalize_shards` names it.
        ValueError, TypeError: an option cannot work (checked before reading).
    """
    settings = WriteSettings.of(locals())
    return write_shard_source(
        dataset, directory, settings, shard, num_shards, finalize=finalize, storage_options=storage_options
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
) -> RecordFile:
    """The body of :func:`write_shard` with checked ``settings`` (also run by the converters)."""
    if settings.group_by is not None:
        raise ArgumentError(_GROUPS_REFUSED)
    shard, num_shards = _who(shard, num_shards)
    folder = os.fspath(directory)
    if is_url(folder):
        remote = RemoteFolder(folder, storage_options)
        return _write_remote_shard(dataset, remote, settings, shard, num_shards, finalize)
    seed = settings.seed
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise WriteError(f"{folder}: cannot create the sharded set's folder: {exc}") from exc
    target = os.path.join(folder, _manifest.shard_name(shard, num_shards))
    options = _plan_options(settings)
    if is_map_style(dataset):
        total = len(dataset)
        lo, hi = shard * total // num_shards, (shard + 1) * total // num_shards
        info = {"index": shard, "of": num_shards, "first": lo, "total": total, "seed": seed, "source": "map"}
        positions: slice | None = slice(lo, hi)
    else:
        info = {"index": shard, "of": num_shards, "first": None, "total": None, "seed": seed, "source": "iterable"}
        positions = None
        # each writer shuffles its own part, with its own stream of the seed
        mixed = np.random.SeedSequence([seed, shard, 0x73686172]).generate_state(1)[0]
        settings = dataclasses.replace(settings, seed=int(mixed))
    info["options"] = options
    # the settings must agree with the set already there before anything is written or removed
    existing, found = _check_folder(folder, shard, info, settings.overwrite)
    if existing is not None:
        return existing
    digest: dict[str, Any] = {}

    def take_digest(temp: str) -> None:
        found.check_before_publish(folder, shard, temp)  # a finalized set stays readable if it cannot hold it
        digest["sha256"], digest["bytes"] = _manifest.file_digest(temp)

    rf = write_source(
        dataset,
        target,
        dataclasses.replace(settings, overwrite=True),  # a shard written again replaces the earlier one
        positions=positions,
        extra={"shard": info},
        before_publish=take_digest,
    )
    # this write's identity and count, not read back from the path (a duplicate writer may have replaced it)
    note = {"shard": shard, "num_shards": num_shards, "set_id": rf._pin, "count": rf.write_summary.count, **digest}
    _manifest.write_json_atomic(_manifest.note_path(target), note)
    if finalize and _all_written(folder, num_shards):
        with contextlib.suppress(IncompleteRecordSetError):  # a shard vanished meanwhile: not ours to finalize
            finalize_shards(folder)
    return rf


def _plan_options(settings: WriteSettings) -> dict[str, Any]:
    """The options every shard of a set must share, as the shard's metadata stores them."""
    declared = Declared.parse(settings.schema)
    schema = None
    if declared is not None:
        schema = {
            "full": declared.full is not None,
            "fields": {
                name: [s.kind, s.dtype, None if s.shape is None else list(s.shape)]
                for name, s in sorted(declared.fields.items())
            },
        }
    return {
        "shuffle": bool(settings.shuffle),
        "checksums": bool(settings.checksums),
        "samples_per_record": None if settings.samples_per_record is None else int(settings.samples_per_record),
        "schema": schema,
        "compression": _compress.parse_option(settings.compression, settings.compression_level),
        "compression_level": settings.compression_level,
    }


def finalize_shards(directory: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> ShardedSet:
    """Check the shards in ``directory`` and publish its manifest; returns the set, a :class:`~torchrecord.ShardedSet`.

    Every shard ``0 .. n-1`` must be there and complete, written with one plan
    (number of shards, seed, source kind, ...) and one schema (shapes may differ
    between shards: the manifest widens them). Running it again (or in several
    processes at once) publishes the same manifest.

    ``directory`` may be an ``s3://bucket/prefix`` URL the shards were written
    to by :func:`write_shard` (``storage_options`` as there): the shards' notes
    are read, never the shards, and the manifest is uploaded last.

    Raises:
        IncompleteRecordSetError: a shard is missing or unfinished; the message
            names every such shard (and a writer's leftover temporary file).
        SchemaError: two shards hold different kinds of sample (names both).
        FormatError: shards of different plans, or of several shard counts.
        RecordNotFoundError: ``directory`` holds no shard at all.
        WriteError: object storage cannot be reached, or refuses the upload.
    """
    folder = os.fspath(directory)
    remote = RemoteFolder(folder, storage_options) if is_url(folder) else None
    if remote is None and not os.path.isdir(folder):
        raise RecordNotFoundError(f"{folder}: no such folder; write its shards with torchrecord.write_shard")
    names = _uploaded(remote.names()) if remote is not None else os.listdir(folder)
    counts = sorted({parsed[1] for parsed in map(_manifest.parse_shard_name, names) if parsed is not None})
    if not counts:
        raise RecordNotFoundError(f"{folder}: holds no shard files; write them with torchrecord.write_shard")
    if len(counts) > 1:
        raise FormatError(
            f"{folder}: holds shards of sets of {', '.join(map(str, counts))} shards; a folder holds one sharded "
            "set: remove the files of the other one"
        )
    n = counts[0]
    missing = [i for i in range(n) if _manifest.shard_name(i, n) not in names]
    if missing:
        raise IncompleteRecordSetError(f"{folder}: {_describe_missing(folder, names, missing, n)}")
    entries: list[dict[str, Any]] = []
    metas: list[dict[str, Any]] = []
    for i in range(n):
        entry, meta = remote.shard_entry(i, n) if remote is not None else _shard_entry(folder, i, n)
        entries.append(entry)
        metas.append(meta)
    _check_plans(folder, metas)
    schema = _manifest.merge_schemas([(e["name"], m.get("schema")) for e, m in zip(entries, metas)])
    _check_packing(folder, metas)
    first = metas[0]
    manifest: dict[str, Any] = {
        "format": _manifest.MANIFEST_FORMAT,
        "manifest_version": _manifest.MANIFEST_VERSION,
        "library_version": __version__,
        # the newest format among the shards (2 where a field is compressed), for `torchrecord info`
        "format_version": max(int(m.get("format_version", 1)) for m in metas),
        "set_id": _manifest.manifest_set_id([e["set_id"] for e in entries]),
        "count": sum(e["count"] for e in entries),
        "samples_per_record": int(first.get("samples_per_record", 1)),
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
    compression = _compression_levels(metas)
    if compression:
        manifest["compression"] = compression
    if remote is not None:
        stop_for_test("before-manifest")
        remote.put_json(_manifest.MANIFEST_NAME, manifest)  # last: readers see the set from now on
        return ShardedSet(remote.url, storage_options=remote.storage_options)
    _manifest.write_json_atomic(os.path.join(folder, _manifest.MANIFEST_NAME), manifest)
    return ShardedSet(folder)


# -- sets on object storage (s3://) --------------------------------------------------------------


def _write_remote_shard(
    dataset: Any,
    remote: RemoteFolder,
    settings: WriteSettings,
    shard: int,
    num_shards: int,
    finalize: bool,
) -> RecordFile:
    """Write the shard in a local temporary folder, upload it whole, then its note (see ``objects.py``)."""
    name = _manifest.shard_name(shard, num_shards)
    if remote.has(_manifest.MANIFEST_NAME):
        if not settings.overwrite:
            return _finalized_remote_shard(remote, dataset, settings, shard, num_shards)
        remote.remove(_manifest.MANIFEST_NAME)  # the set changes: it is not readable until finalized again
    local = tempfile.mkdtemp(prefix="torchrecord-shard-")
    try:
        rf = write_shard_source(
            dataset, local, dataclasses.replace(settings, overwrite=True), shard, num_shards, finalize=False
        )
        path = os.path.join(local, name)
        note = _manifest.read_json(_manifest.note_path(path))
        note.update(meta=rf.metadata, records=rf.num_records)
        remote.upload(path, name)  # one put: the shard appears whole, or not at all
        stop_for_test("before-note")
        remote.put_json(name + ".json", note)  # the shard counts as written from now on
    finally:
        shutil.rmtree(local, ignore_errors=True)
    if finalize:
        with contextlib.suppress(IncompleteRecordSetError):  # shards still to come: the last writer finalizes
            finalize_shards(remote.url, storage_options=remote.storage_options)
    return rf


def _uploaded(names: list[str]) -> list[str]:
    """The names in a remote folder, shards without their note left out (not completely uploaded)."""
    present = set(names)
    return [n for n in names if _manifest.parse_shard_name(n) is None or n + ".json" in present]


def _finalized_remote_shard(
    remote: RemoteFolder, dataset: Any, settings: WriteSettings, shard: int, num_shards: int
) -> RecordFile:
    """A retried writer of a finalized remote set: the existing shard (fetched) if the plans agree, else an error."""
    name = _manifest.shard_name(shard, num_shards)
    if is_map_style(dataset):
        total = len(dataset)
        plan = {"of": num_shards, "seed": settings.seed, "source": "map", "total": total}
    else:
        plan = {"of": num_shards, "seed": settings.seed, "source": "iterable", "total": None}
    plan["options"] = _plan_options(settings)
    try:
        manifest = _manifest.check_manifest(remote.read_json(_manifest.MANIFEST_NAME), remote.where("manifest.json"))
        entry, meta = remote.shard_entry(shard, num_shards)
        listed = manifest["shards"][shard] if len(manifest["shards"]) == num_shards else None
        same = {k: meta["shard"].get(k) for k in _PLAN_KEYS} == json.loads(json.dumps(plan))
        if listed is not None and listed["set_id"] == entry["set_id"] and same:
            return ShardedSet(remote.url, storage_options=remote.storage_options).shard(shard)
    except (TorchRecordError, KeyError, TypeError, IndexError):
        pass
    raise RecordExistsError(
        f"{remote.url}: holds a finalized sharded set written with another plan (or a damaged one; {name} "
        "differs); pass overwrite=True to rewrite it (its manifest is removed until it is finalized again), "
        "or write to another prefix"
    )


# -- helpers ----------------------------------------------------------------------------


def _who(shard: int | None, num_shards: int | None) -> tuple[int, int]:
    if shard is None and num_shards is None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if shard is None or num_shards is None:
        raise ArgumentError(
            "give shard= and num_shards= (or run under torch.distributed, whose rank and world size are the default)"
        )
    if isinstance(shard, bool) or not isinstance(shard, int) or not isinstance(num_shards, int) or num_shards < 1:
        raise ArgumentError(f"shard and num_shards must be ints with num_shards >= 1, got {shard!r}, {num_shards!r}")
    if not 0 <= shard < num_shards:
        raise ArgumentError(f"shard {shard} is not in [0, {num_shards})")
    return shard, num_shards


#: How a plan key is named to the user (the option that sets it).
_PLAN_NAMES = {"of": "num_shards", "total": "len(dataset)", "source": "the source's kind"}


def _plan_of(meta: dict[str, Any]) -> dict[str, Any] | None:
    """A shard's plan from its metadata, the options spread out (None: not a shard of write_shard)."""
    info = meta.get("shard")
    if not isinstance(info, dict):
        return None
    plan = {k: info.get(k) for k in _PLAN_KEYS if k != "options"}
    options = info.get("options")
    if isinstance(options, dict):  # a shard of an older writer has no options: they are unknown
        plan.update(options)
    return plan


def _plan_conflict(mine: dict[str, Any], theirs: dict[str, Any], where: str) -> str | None:
    """The first setting two plans disagree on, in words (``"seed=1, but shard 0 ... seed=0"``), or None."""
    for key, value in mine.items():
        if key in theirs and theirs[key] != value:
            name = _PLAN_NAMES.get(key, key)
            return f"{name}={value!r}, but {where} was written with {name}={theirs[key]!r}"
    return None


class _SetInFolder:
    """What a shard writer found in its set's folder when it started (see :func:`_check_folder`)."""

    def __init__(self, manifest: dict[str, Any] | None) -> None:
        #: the finalized set's checked manifest, or None (not finalized, or a damaged manifest)
        self.manifest = manifest

    def check_before_publish(self, folder: str, shard: int, temp: str) -> None:
        """Refuse to replace a shard of a finalized set with one the set cannot hold (before the rename).

        The set stays readable (the old shard, the old manifest) when the new
        shard's fields or packing differ from the set's.
        """
        manifest = self.manifest
        if manifest is None:
            return
        meta = RecordFile(temp).read_header()
        name = _manifest.shard_name(shard, len(manifest["shards"]))
        where = os.path.join(folder, _manifest.MANIFEST_NAME)
        _manifest.merge_schemas([(where, manifest.get("schema")), (name, meta.get("schema"))])
        packed, theirs = int(meta.get("samples_per_record", 1)), int(manifest.get("samples_per_record", 1))
        if packed != theirs and meta.get("count"):
            raise FormatError(
                f"{folder}: the new {name} holds {packed} samples per record, the finalized set {theirs}; a "
                f"sharded set is read with one packing: pass samples_per_record={theirs} (the set and its "
                "manifest are unchanged)"
            )


def _check_folder(
    folder: str, shard: int, plan: dict[str, Any], overwrite: bool
) -> tuple[RecordFile | None, _SetInFolder]:
    """Check this writer's plan against the set already in ``folder``, before anything is written or removed.

    Returns ``(existing, found)``: ``existing`` is the shard of a finalized set
    that a retry with the same plan returns unchanged (None: write it), and
    ``found`` what :meth:`_SetInFolder.check_before_publish` checks the new
    shard against. Raises ArgumentError when the folder holds shards of another
    number of shards, or shards (or a finalized set) written with other
    settings: nothing is removed then, and the set stays as it was.
    """
    n = plan["of"]
    names = sorted(os.listdir(folder))
    shards = [(name, parsed) for name, parsed in ((x, _manifest.parse_shard_name(x)) for x in names) if parsed]
    others = sorted({parsed[1] for _, parsed in shards if parsed[1] != n})
    if others:
        example = next(name for name, parsed in shards if parsed[1] == others[0])
        raise ArgumentError(
            f"{folder}: holds shards of a set of {others[0]} shards ({example}...); this writer has "
            f"num_shards={n}: every writer of a set passes the same num_shards. Pass num_shards={others[0]} to "
            "write a shard of that set, or write the new set into another folder (or remove the old one first)"
        )
    manifest_path = os.path.join(folder, _manifest.MANIFEST_NAME)
    manifest: dict[str, Any] | None = None
    if os.path.exists(manifest_path):
        try:
            manifest = _manifest.check_manifest(_manifest.read_json(manifest_path), manifest_path)
        except (TorchRecordError, OSError):
            if not overwrite:
                raise RecordExistsError(
                    f"{folder}: holds a damaged finalized sharded set ({manifest_path} cannot be read); pass "
                    "overwrite=True to write its shards again (finalizing replaces the manifest), or write to "
                    "another folder"
                ) from None
        if manifest is not None and len(manifest["shards"]) != n:
            raise ArgumentError(
                f"{folder}: holds a finalized set of {len(manifest['shards'])} shards; this writer has "
                f"num_shards={n}: pass num_shards={len(manifest['shards'])}, or write the new set into another "
                "folder (or remove the old one first)"
            )
    mine = {**{k: plan[k] for k in _PLAN_KEYS if k != "options"}, **plan["options"]}
    # the other shards' metadata: one speaks for a finalized set (finalize checked that they agree);
    # without a manifest, every shard present (a stale one of an earlier attempt is named)
    present = [i for _, (i, _) in shards if i != shard]
    if manifest is not None:
        present = present[:1] or [shard]
    for i in present:
        path = os.path.join(folder, _manifest.shard_name(i, n))
        try:
            theirs = _plan_of(RecordFile(path).read_header())
        except (TorchRecordError, OSError):
            continue  # unreadable, or replaced meanwhile: finalize_shards names it
        where = f"the finalized set (its shard {i})" if manifest is not None else f"shard {i}"
        conflict = _plan_conflict(mine, theirs, where) if theirs is not None else None
        if conflict is None:
            continue
        if manifest is not None:
            raise ArgumentError(
                f"{folder}: this writer of shard {shard} has {conflict}: every shard of a set is written "
                "with the same settings, so nothing was written or removed and the set is unchanged. Pass "
                "the set's settings to write one of its shards again; to write a new set, use another "
                "folder (or remove this one first)"
            )
        raise ArgumentError(
            f"{folder}: this writer of shard {shard} has {conflict}: every shard of a set is written with "
            f"the same settings, so nothing was written. Pass the other shards' settings; if shard {i} is "
            f"left from an earlier attempt, remove {path} and write it again"
        )
    found = _SetInFolder(manifest)
    if manifest is None or overwrite:
        return None, found  # the old manifest stays until finalizing replaces it
    entry = manifest["shards"][shard]
    try:
        rf = RecordFile(os.path.join(folder, entry["name"]))
        if rf.set_id == entry["set_id"]:
            return rf, found  # a retry of a finalized set's shard: unchanged
    except (TorchRecordError, OSError):
        pass  # the shard is gone or unreadable: write it again
    return None, found  # rewritten since the set was finalized, or gone: write it (again)


def _all_written(folder: str, n: int) -> bool:
    names = set(os.listdir(folder))
    return all(_manifest.shard_name(i, n) in names and _manifest.shard_name(i, n) + ".json" in names for i in range(n))


def _describe_missing(folder: str, names: list[str], missing: list[int], n: int) -> str:
    parts = []
    for i in missing:
        name = _manifest.shard_name(i, n)
        temp = re.compile(r"^\." + re.escape(name) + r"\.tmp-(\d+)-")
        pids = sorted({m.group(1) for m in map(temp.match, names) if m})
        why = (
            f"its writer did not finish (it left a temporary file, pid {', '.join(pids)}: killed, or still running)"
            if pids
            else "it was never written, or its writer failed"
        )
        parts.append(f"shard {i} ({name}) is missing: {why}")
    return (
        f"{len(missing)} of {n} shards missing: "
        + "; ".join(parts)
        + ". Run write_shard(..., shard=i) for each, then finalize_shards again"
    )


def _shard_entry(folder: str, i: int, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest entry of shard ``i`` and its metadata, the checksum from its note (or computed)."""
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
    if isinstance(note, dict) and note.get("set_id") == rf.set_id and isinstance(note.get("sha256"), str):
        digest, size = note["sha256"], int(note["bytes"])
    else:  # no note (the writer stopped right after its rename), or one of an earlier write
        digest, size = _manifest.file_digest(path)
    entry = {
        "name": name,
        "count": len(rf),
        "records": rf.num_records,
        "bytes": size,
        "sha256": digest,
        "set_id": rf.set_id,
    }
    return entry, meta


def _check_plans(folder: str, metas: list[dict[str, Any]]) -> None:
    def plan(meta: dict[str, Any]) -> dict[str, Any]:
        info = meta["shard"]
        flat = {k: info.get(k) for k in _PLAN_KEYS if k != "options"}
        options = info.get("options")
        if not isinstance(options, dict):  # a shard of an older writer: its options are unknown
            return {**flat, "options": options}
        return {**flat, **options}

    first = plan(metas[0])
    for i, meta in enumerate(metas[1:], 1):
        other = plan(meta)
        for key in dict.fromkeys([*first, *other]):
            if other.get(key) != first.get(key):
                raise FormatError(
                    f"{folder}: shard {i} was written with {key}={other.get(key)!r}, shard 0 with "
                    f"{first.get(key)!r}; write every shard of a set with the same settings"
                )
        info = meta["shard"]
        if info["source"] == "map" and info["first"] != i * info["total"] // info["of"]:
            raise FormatError(f"{folder}: shard {i} starts at position {info['first']} of the permutation, not its own")


def _compression_levels(metas: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per field: the codec and level asked for (the same in every shard), and whether any shard applied it."""
    levels: dict[str, dict[str, Any]] = {}
    for meta in metas:
        for name, report in (meta.get("compression") or {}).items():
            entry = levels.setdefault(name, {"codec": report.get("codec"), "level": report.get("level")})
            entry["applied"] = bool(entry.get("applied")) or bool(report.get("applied"))
    return levels


def _check_packing(folder: str, metas: list[dict[str, Any]]) -> None:
    """One packing for every shard (after the schemas: a shard of other fields packs differently)."""
    options = metas[0]["shard"].get("options")
    auto = isinstance(options, dict) and options.get("samples_per_record", 0) is None
    for i, meta in enumerate(metas[1:], 1):
        packed, packed_first = meta.get("samples_per_record", 1), metas[0].get("samples_per_record", 1)
        if packed != packed_first:
            chosen = (
                " (samples_per_record=None: each shard chose from its first sample, and one with fields of "
                "other shapes, or one that turned variable, chooses differently)"
                if auto
                else ""
            )
            raise FormatError(
                f"{folder}: shard {i} holds {packed} samples per record, shard 0 {packed_first}{chosen}; a "
                "sharded set is read with one packing: write every shard with the same samples_per_record=K "
                "(1 packs nothing)"
            )
