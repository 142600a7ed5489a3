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
import signal
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import torch.distributed as dist

from torchrecord._core import compress as _compress
from torchrecord._shards import manifest as _manifest
from torchrecord._shards.remote import FsspecTransport
from torchrecord._shards.sharded import ShardedSet
from torchrecord._store.record_file import RecordFile
from torchrecord._store.record_set import is_url
from torchrecord._version import __version__
from torchrecord._write.declared import Declared
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

    Every writer of one set must pass the same ``shuffle``, ``seed``,
    ``checksums``, ``samples_per_record``, ``schema``, ``compression`` and
    ``compression_level``: :func:`finalize_shards` refuses shards written with
    different ones, naming the shard and the option.

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
        overwrite: rewrite the shard of a finalized set (its manifest is removed
            until the set is finalized again).
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
        :func:`torchrecord.write_record`, for this shard (``max_skipped`` bounds
        what this shard leaves out).

    Returns:
        The shard, a :class:`RecordFile` (a record set on its own). For an
        ``s3://`` folder its local copy is removed after the upload: its
        ``write_summary`` says what was written.

    Raises:
        RecordExistsError: the set is finalized with another plan (``overwrite``
            rewrites it).
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
        return _write_remote_shard(dataset, folder, settings, shard, num_shards, finalize, storage_options)
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
    existing = _finalized_shard(folder, shard, info, settings.overwrite)
    if existing is not None:
        return existing
    digest: dict[str, Any] = {}

    def take_digest(temp: str) -> None:
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

    Raises:
        IncompleteRecordSetError: a shard is missing or unfinished; the message
            names every such shard (and a writer's leftover temporary file).
        SchemaError: two shards hold different kinds of sample (names both).
        FormatError: shards of different plans, or of several shard counts.
        RecordNotFoundError: ``directory`` holds no shard at all.

    ``directory`` may be an ``s3://bucket/prefix`` URL (written there by
    :func:`write_shard`; ``storage_options`` as there): the shards' notes are
    read, not the shards, and the manifest is uploaded last.
    """
    folder = os.fspath(directory)
    if is_url(folder):
        return _finalize_remote(folder, storage_options)
    if not os.path.isdir(folder):
        raise RecordNotFoundError(f"{folder}: no such folder; write its shards with torchrecord.write_shard")
    names = os.listdir(folder)
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
        entry, meta = _shard_entry(folder, i, n)
        entries.append(entry)
        metas.append(meta)
    _manifest.write_json_atomic(os.path.join(folder, _manifest.MANIFEST_NAME), _build_manifest(folder, entries, metas))
    return ShardedSet(folder)


def _build_manifest(folder: str, entries: list[dict[str, Any]], metas: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest of the shards ``entries`` (with their metadata ``metas``), checked to be one set."""
    _check_plans(folder, metas)
    schema = _manifest.merge_schemas([(e["name"], m.get("schema")) for e, m in zip(entries, metas)])
    _check_packing(folder, metas)
    first = metas[0]
    manifest: dict[str, Any] = {
        "format": _manifest.MANIFEST_FORMAT,
        "manifest_version": _manifest.MANIFEST_VERSION,
        "library_version": __version__,
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
    return manifest


# -- sets on object storage (s3://) ------------------------------------------------------------
#: Test hook: a writer stops (SIGKILL, as a killed task would) after its uploads, before the manifest.
_STOP_ENV = "TORCHRECORD_TEST_STOP_BEFORE_MANIFEST"


def _remote_fs(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """(fsspec file system, path without the protocol) for a remote folder."""
    fs, path = FsspecTransport(storage_options).filesystem(url)
    return fs, str(path).rstrip("/")


def _write_remote_shard(
    dataset: Any,
    url: str,
    settings: WriteSettings,
    shard: int,
    num_shards: int,
    finalize: bool,
    storage_options: dict[str, Any] | None,
) -> RecordFile:
    """Write the shard in a local temporary folder, upload it whole, then its note (with its metadata)."""
    url = url.rstrip("/")
    fs, prefix = _remote_fs(url, storage_options)
    manifest = f"{prefix}/{_manifest.MANIFEST_NAME}"
    try:
        if fs.exists(manifest):
            if not settings.overwrite:
                raise RecordExistsError(
                    f"{url}: holds a finalized sharded set; pass overwrite=True to rewrite its shards "
                    "(the manifest is removed until it is finalized again), or write to another prefix"
                )
            fs.rm_file(manifest)
        fs.invalidate_cache()
    except TorchRecordError:
        raise
    except Exception as exc:  # fsspec back ends raise many kinds
        raise WriteError(f"{url}: cannot reach the sharded set's folder ({type(exc).__name__}: {exc})") from exc
    local = tempfile.mkdtemp(prefix="torchrecord-shard-")
    try:
        settings = dataclasses.replace(settings, overwrite=True)
        rf = write_shard_source(dataset, local, settings, shard, num_shards, finalize=False)
        name = _manifest.shard_name(shard, num_shards)
        path = os.path.join(local, name)
        note = _manifest.read_json(_manifest.note_path(path))
        note.update(meta=rf.metadata, records=rf.num_records)
        try:
            fs.put_file(path, f"{prefix}/{name}")  # an object appears whole, or not at all
            fs.pipe_file(f"{prefix}/{name}.json", _json_bytes(note))  # the shard is complete once its note is up
        except Exception as exc:
            raise WriteError(f"{url}: cannot upload shard {shard} ({type(exc).__name__}: {exc})") from exc
    finally:
        shutil.rmtree(local, ignore_errors=True)
    if finalize:
        with contextlib.suppress(IncompleteRecordSetError):  # other shards still to come: the last writer finalizes
            _finalize_remote(url, storage_options)
    return rf


def _finalize_remote(url: str, storage_options: dict[str, Any] | None) -> ShardedSet:
    """finalize_shards for a URL folder: the entries from the shards' notes, the manifest uploaded last."""
    url = url.rstrip("/")
    fs, prefix = _remote_fs(url, storage_options)
    try:
        fs.invalidate_cache()
        names = [str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(prefix, detail=False)]
    except FileNotFoundError:
        names = []
    except Exception as exc:
        raise WriteError(f"{url}: cannot list the sharded set's folder ({type(exc).__name__}: {exc})") from exc
    counts = sorted({parsed[1] for parsed in map(_manifest.parse_shard_name, names) if parsed is not None})
    if not counts:
        raise RecordNotFoundError(f"{url}: holds no shard files; write them with torchrecord.write_shard")
    if len(counts) > 1:
        raise FormatError(f"{url}: holds shards of sets of {', '.join(map(str, counts))} shards; remove the others")
    n = counts[0]
    missing = [
        i
        for i in range(n)
        if _manifest.shard_name(i, n) not in names or _manifest.shard_name(i, n) + ".json" not in names
    ]
    if missing:
        raise IncompleteRecordSetError(
            f"{url}: {len(missing)} of {n} shards missing or not completely uploaded (shard and note): "
            f"{', '.join(map(str, missing))}. Run write_shard(..., shard=i) for each, then finalize_shards again"
        )
    entries: list[dict[str, Any]] = []
    metas: list[dict[str, Any]] = []
    for i in range(n):
        name = _manifest.shard_name(i, n)
        try:
            note = json.loads(fs.cat_file(f"{prefix}/{name}.json"))
            meta = note["meta"]
            entry = {
                "name": name,
                "count": int(note["count"]),
                "records": int(note["records"]),
                "bytes": int(note["bytes"]),
                "sha256": str(note["sha256"]),
                "set_id": str(note["set_id"]),
            }
            size = int(fs.size(f"{prefix}/{name}"))
        except (ValueError, KeyError, TypeError) as exc:
            raise FormatError(
                f"{url}/{name}.json: not a shard note of write_shard ({exc}); write shard {i} again"
            ) from exc
        except Exception as exc:
            raise WriteError(f"{url}/{name}: cannot read ({type(exc).__name__}: {exc})") from exc
        info = meta.get("shard") if isinstance(meta, dict) else None
        if not isinstance(info, dict) or info.get("index") != i or info.get("of") != n:
            raise FormatError(f"{url}/{name}: not shard {i} of {n} written by write_shard (its note says {info!r})")
        if size != entry["bytes"]:
            raise FormatError(
                f"{url}/{name}: {size} bytes, its note says {entry['bytes']}: it was replaced after its note; "
                f"write shard {i} again"
            )
        entries.append(entry)
        metas.append(meta)
    manifest = _build_manifest(url, entries, metas)
    if os.environ.get(_STOP_ENV):
        os.kill(os.getpid(), signal.SIGKILL)  # as a writer killed between the shard uploads and the manifest
    try:
        fs.pipe_file(f"{prefix}/{_manifest.MANIFEST_NAME}", _json_bytes(manifest))  # last: the set is readable now
    except Exception as exc:
        raise WriteError(f"{url}: cannot upload the manifest ({type(exc).__name__}: {exc})") from exc
    return ShardedSet(url, storage_options=storage_options)


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8")


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


def _finalized_shard(folder: str, shard: int, plan: dict[str, Any], overwrite: bool) -> RecordFile | None:
    """For a finalized set: the existing shard (a retry with the same plan), or an error, or None."""
    manifest_path = os.path.join(folder, _manifest.MANIFEST_NAME)
    if not os.path.exists(manifest_path):
        return None
    if overwrite:
        with contextlib.suppress(FileNotFoundError):
            os.remove(manifest_path)  # the set changes: it is not readable until finalized again
        return None
    try:
        manifest = _manifest.check_manifest(_manifest.read_json(manifest_path), manifest_path)
        entry = manifest["shards"][shard] if len(manifest["shards"]) == plan["of"] else None
        if entry is not None:
            rf = RecordFile(os.path.join(folder, entry["name"]))
            same = {k: rf.metadata.get("shard", {}).get(k, rf.metadata.get(k)) for k in _PLAN_KEYS}
            if rf.set_id == entry["set_id"] and same == {k: plan[k] for k in _PLAN_KEYS}:
                return rf
    except (TorchRecordError, OSError, KeyError, TypeError):
        pass
    raise RecordExistsError(
        f"{folder}: holds a finalized sharded set written with another plan (or a damaged one); pass "
        "overwrite=True to rewrite it, or write to another folder"
    )


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
