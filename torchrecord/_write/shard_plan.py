"""What every shard of one set must share, and the checks of it: at a writer's start, before it publishes, at finalize.

A shard's *plan* (from its metadata: shard count, seed, source kind, total, and the options that
decide what the shards hold) must be the same in every shard; so must its write *attempt*
(``_write/attempts.py``). A writer checks its plan against the set already in the folder before
anything is written or removed; ``finalize_shards`` checks every shard again, and names the shards
of another attempt.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Protocol

from torchrecord._core import compress as _compress
from torchrecord._shards import manifest as _manifest
from torchrecord._storage.locks import Lock
from torchrecord._storage.temps import parse_temp
from torchrecord._store.record_file import RecordFile
from torchrecord._write.attempts import Attempt, attempt_of, resolve_attempt
from torchrecord._write.declared import Declared
from torchrecord._write.settings import WriteSettings
from torchrecord.errors import (
    ArgumentError,
    CacheError,
    FormatError,
    IncompleteRecordSetError,
    RecordExistsError,
    TorchRecordError,
)

__all__ = [
    "FolderView",
    "LocalFolder",
    "PLAN_KEYS",
    "PLAN_NAMES",
    "SetLock",
    "Start",
    "Superseded",
    "check_attempts",
    "check_fits",
    "check_folder",
    "check_packing",
    "check_plans",
    "compression_levels",
    "describe_missing",
    "plan_conflict",
    "plan_of",
    "plan_options",
    "recheck",
    "view_limit",
]

#: What every shard of one set must agree on (from each shard's ``shard`` metadata): its place in
#: the plan, and the options that decide what the shards hold and how (``options``).
PLAN_KEYS = ("of", "seed", "source", "total", "options")


def plan_options(settings: WriteSettings) -> dict[str, Any]:
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


#: How a plan key is named to the user (the option that sets it).
PLAN_NAMES = {"of": "num_shards", "total": "len(dataset)", "source": "the source's kind"}


def plan_of(meta: dict[str, Any]) -> dict[str, Any] | None:
    """A shard's plan from its metadata, the options spread out (None: not a shard of write_shard)."""
    info = meta.get("shard")
    if not isinstance(info, dict):
        return None
    plan = {k: info.get(k) for k in PLAN_KEYS if k != "options"}
    options = info.get("options")
    if isinstance(options, dict):  # a shard of an older writer has no options: they are unknown
        plan.update(options)
    return plan


def plan_conflict(mine: dict[str, Any], theirs: dict[str, Any], where: str) -> str | None:
    """The first setting two plans disagree on, in words (``"seed=1, but shard 0 ... seed=0"``), or None."""
    for key, value in mine.items():
        if key in theirs and theirs[key] != value:
            name = PLAN_NAMES.get(key, key)
            return f"{name}={value!r}, but {where} was written with {name}={theirs[key]!r}"
    return None


def check_fits(manifest: dict[str, Any] | None, folder: str, shard: int, temp: str) -> None:
    """Refuse to replace a shard of a finalized set with one the set cannot hold (before the rename).

    The set stays readable (the old shard, the old manifest) when the new
    shard's fields or packing differ from the set's.
    """
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


class FolderView(Protocol):
    """A sharded set's folder as a writer sees it: a local folder, or a prefix on object storage."""

    where: str

    def names(self) -> list[str]:
        """The names in the folder now."""
        ...

    def read_manifest(self) -> dict[str, Any] | None:
        """The folder's manifest, checked (None: none there); raises if it cannot be read."""
        ...

    def shard_meta(self, i: int, n: int) -> dict[str, Any] | None:
        """Shard ``i`` of ``n``'s metadata (None: not there, or unreadable)."""
        ...


@dataclass
class Start:
    """What a shard writer found when it started: the finalized set (if any), its attempt, what to do."""

    manifest: dict[str, Any] | None
    attempt: Attempt
    #: a finalized set holds this shard already, of this attempt (or of a retry's): return it unchanged
    done: bool


def check_folder(view: FolderView, shard: int, plan: dict[str, Any], overwrite: bool, chosen: str | None) -> Start:
    """Check this writer's plan against the set already in the folder, before anything is written or removed.

    Returns what it found (:class:`Start`), with this writer's attempt (``_write/attempts.py``;
    ``chosen``: the attempt id the user or the run chose, else None).
    Raises ArgumentError when the folder holds shards of another number of shards, or shards (or a
    finalized set) written with other settings, and RecordExistsError when it holds a finalized
    set of another chosen attempt (without ``overwrite``) or a damaged one: nothing is removed
    then, and the set stays as it was.
    """
    n = plan["of"]
    shards = [(name, parsed) for name, parsed in ((x, _manifest.parse_shard_name(x)) for x in view.names()) if parsed]
    others = sorted({parsed[1] for _, parsed in shards if parsed[1] != n})
    if others:
        example = next(name for name, parsed in shards if parsed[1] == others[0])
        raise ArgumentError(
            f"{view.where}: holds shards of a set of {others[0]} shards ({example}...); this writer has "
            f"num_shards={n}: every writer of a set passes the same num_shards. Pass num_shards={others[0]} to "
            "write a shard of that set, or write the new set into another folder (or remove the old one first)"
        )
    manifest = _finalized(view, n, overwrite)
    _check_present(view, shard, plan, manifest, sorted({i for _, (i, _) in shards if i != shard}))
    rewrites = manifest["set_id"] if manifest is not None and overwrite else None
    attempt = resolve_attempt(chosen, {k: plan.get(k) for k in PLAN_KEYS}, rewrites)
    if manifest is None:
        return Start(None, attempt, False)
    theirs = manifest.get("attempt")
    if attempt.chosen and theirs == attempt.id:
        return Start(manifest, attempt, True)  # this attempt finalized the set: its shard is done
    if overwrite:
        return Start(manifest, attempt, False)  # the old manifest stays until finalizing replaces it
    if attempt.chosen and theirs is not None:
        raise RecordExistsError(
            f"{view.where}: holds a set finalized by write attempt {theirs!r}; this writer is attempt "
            f"{attempt.id!r}. Nothing was written or removed. Pass attempt={theirs!r} to write one of its shards "
            "again, overwrite=True to replace the set with this attempt's, or write to another folder"
        )
    # a retry of a finalized set's shard (same plan): unchanged if it is there; written again into the set if not
    return Start(manifest, Attempt(theirs, False) if theirs is not None else attempt, True)


def _finalized(view: FolderView, n: int, overwrite: bool) -> dict[str, Any] | None:
    """The folder's checked manifest (None: not finalized, or damaged and ``overwrite``)."""
    try:
        manifest = view.read_manifest()
    except (TorchRecordError, OSError):
        if not overwrite:
            raise RecordExistsError(
                f"{view.where}: holds a damaged finalized sharded set ({_manifest.MANIFEST_NAME} cannot be read); "
                "pass overwrite=True to write its shards again (finalizing replaces the manifest), or write to "
                "another folder"
            ) from None
        return None
    if manifest is not None and len(manifest["shards"]) != n:
        raise ArgumentError(
            f"{view.where}: holds a finalized set of {len(manifest['shards'])} shards; this writer has "
            f"num_shards={n}: pass num_shards={len(manifest['shards'])}, or write the new set into another "
            "folder (or remove the old one first)"
        )
    return manifest


def _check_present(
    view: FolderView, shard: int, plan: dict[str, Any], manifest: dict[str, Any] | None, present: list[int]
) -> None:
    """ArgumentError when a shard already there (or the finalized set) was written with other settings."""
    n = plan["of"]
    mine = {**{k: plan[k] for k in PLAN_KEYS if k != "options"}, **plan["options"]}
    # one shard speaks for a finalized set (finalize checked that they agree); without a manifest,
    # the shards present (a stale one of an earlier attempt is named)
    if manifest is not None:
        present = present[:1] or [shard]
    for i in present[: view_limit(view)]:
        meta = view.shard_meta(i, n)
        theirs = plan_of(meta) if meta is not None else None
        where = f"the finalized set (its shard {i})" if manifest is not None else f"shard {i}"
        conflict = plan_conflict(mine, theirs, where) if theirs is not None else None
        if conflict is None:
            continue
        if manifest is not None:
            raise ArgumentError(
                f"{view.where}: this writer of shard {shard} has {conflict}: every shard of a set is written "
                "with the same settings, so nothing was written or removed and the set is unchanged. Pass "
                "the set's settings to write one of its shards again; to write a new set, use another "
                "folder (or remove this one first)"
            )
        raise ArgumentError(
            f"{view.where}: this writer of shard {shard} has {conflict}: every shard of a set is written with "
            f"the same settings, so nothing was written. Pass the other shards' settings; if shard {i} is "
            f"left from an earlier attempt, remove {_manifest.shard_name(i, n)} and write it again"
        )


def view_limit(view: FolderView) -> int:
    """How many other shards a writer looks at when it starts (each costs a request on object storage)."""
    return int(getattr(view, "look_at", 1 << 30))


def describe_missing(names: list[str], missing: list[int], n: int) -> str:
    """The shards missing from a folder, each with why (a writer's temporary left behind says it did not finish)."""
    parts = []
    for i in missing:
        name = _manifest.shard_name(i, n)
        pids = sorted({str(t.pid) for t in map(parse_temp, names) if t is not None and t.name == name})
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


def check_plans(folder: str, metas: list[dict[str, Any]]) -> None:
    def plan(meta: dict[str, Any]) -> dict[str, Any]:
        info = meta["shard"]
        flat = {k: info.get(k) for k in PLAN_KEYS if k != "options"}
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


def compression_levels(metas: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per field: the codec and level asked for (the same in every shard), and whether any shard applied it."""
    levels: dict[str, dict[str, Any]] = {}
    for meta in metas:
        for name, report in (meta.get("compression") or {}).items():
            entry = levels.setdefault(name, {"codec": report.get("codec"), "level": report.get("level")})
            entry["applied"] = bool(entry.get("applied")) or bool(report.get("applied"))
    return levels


def check_packing(folder: str, metas: list[dict[str, Any]]) -> int:
    """One packing for every shard that holds samples (an empty one packs nothing); returns it."""
    full = [(i, meta) for i, meta in enumerate(metas) if meta.get("count", 1)]
    if not full:
        return 1
    first, first_meta = full[0]
    options = first_meta["shard"].get("options")
    auto = isinstance(options, dict) and options.get("samples_per_record", 0) is None
    packed_first = first_meta.get("samples_per_record", 1)
    for i, meta in full[1:]:
        packed = meta.get("samples_per_record", 1)
        if packed != packed_first:
            chosen = (
                " (samples_per_record=None: each shard chose from its first sample, and one with fields of "
                "other shapes, or one that turned variable, chooses differently)"
                if auto
                else ""
            )
            raise FormatError(
                f"{folder}: shard {i} holds {packed} samples per record, shard {first} {packed_first}{chosen}; a "
                "sharded set is read with one packing: write every shard with the same samples_per_record=K "
                "(1 packs nothing)"
            )
    return int(packed_first)


def check_attempts(folder: str, metas: list[dict[str, Any]], mine: str | None = None) -> str | None:
    """The one write attempt of every shard (returned), else IncompleteRecordSetError naming the shards of each.

    ``mine``: the attempt of the writer that finalizes (the shards of other attempts are the ones
    to write again). Shards of a torchrecord without attempts record none: they agree with each
    other only.
    """
    attempts = [attempt_of(meta) for meta in metas]
    if len(set(attempts)) == 1:
        return attempts[0]
    groups: dict[str | None, list[int]] = {}
    for i, attempt in enumerate(attempts):
        groups.setdefault(attempt, []).append(i)
    sizes = sorted((len(g) for g in groups.values()), reverse=True)
    keep = mine if mine in groups else (max(groups, key=lambda a: len(groups[a])) if sizes[0] > sizes[1] else None)
    described = "; ".join(
        f"shard{'s' if len(shards) > 1 else ''} {_list(shards)} ({attempt or 'no attempt'})"
        for attempt, shards in groups.items()
    )
    if keep is None:
        fix = "write the shards of the other attempts again in the attempt you keep (write_shard(..., attempt=...))"
    else:
        stray = [i for i, a in enumerate(attempts) if a != keep]
        plural = "s" if len(stray) > 1 else ""
        fix = f"write shard{plural} {_list(stray)} again in attempt {keep!r}, or wait for its writer"
    raise IncompleteRecordSetError(
        f"{folder}: its shards belong to another write attempt than each other: {described}. A set holds the "
        f"shards of one write attempt, so it was not finalized (an earlier set stays as it was): {fix}, then "
        "finalize_shards"
    )


def _list(shards: list[int]) -> str:
    """Shard numbers for a message: the first ten, and how many more."""
    more = f" and {len(shards) - 10} more" if len(shards) > 10 else ""
    return ", ".join(map(str, shards[:10])) + more


class LocalFolder:
    """A sharded set's local folder, as :func:`check_folder` looks at it."""

    def __init__(self, folder: str) -> None:
        self.where = folder

    def names(self) -> list[str]:
        return sorted(os.listdir(self.where))

    def read_manifest(self) -> dict[str, Any] | None:
        path = os.path.join(self.where, _manifest.MANIFEST_NAME)
        if not os.path.exists(path):
            return None
        return _manifest.check_manifest(_manifest.read_json(path), path)

    def shard_meta(self, i: int, n: int) -> dict[str, Any] | None:
        try:
            return RecordFile(os.path.join(self.where, _manifest.shard_name(i, n))).read_header()
        except (TorchRecordError, OSError):
            return None  # unreadable, or replaced meanwhile: finalize_shards names it


class SetLock:
    """The lock of a local set's folder: held by a shard's publish (with its last check) and by finalize.

    So a writer never replaces a shard of a set finalized after its last check. Where the file
    system has no ``flock``, nothing is locked (the checks still run).
    """

    def __init__(self, folder: str) -> None:
        self.lock = Lock(os.path.join(folder, f".{_manifest.MANIFEST_NAME}.lock"), note="sharded set")

    def __enter__(self) -> SetLock:
        if self.lock.fd is None:
            with contextlib.suppress(CacheError):  # no flock here
                self.lock.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        self.lock.release()


class Superseded(Exception):
    """The set was finalized by this writer's own attempt while it wrote: its shard is done, nothing to publish."""

    def __init__(self, manifest: dict[str, Any]) -> None:
        super().__init__("superseded")
        self.manifest = manifest


def recheck(view: FolderView, start: Start, shard: int) -> dict[str, Any] | None:
    """What changed since the writer started: None (nothing: go on), or the set's new manifest of this attempt.

    Raises RecordExistsError when a set was finalized meanwhile by another write attempt: this
    writer's shard would break it, so nothing of it is published.
    """
    try:
        now = view.read_manifest()
    except (TorchRecordError, OSError):
        return None  # damaged or gone meanwhile: the writer goes on, finalizing replaces it
    seen = start.manifest["set_id"] if start.manifest is not None else None
    if now is None or now["set_id"] == seen:
        return None
    if now.get("attempt") == start.attempt.id:
        return now
    raise RecordExistsError(
        f"{view.where}: while this writer of shard {shard} was writing, the set was finalized by another write "
        f"attempt ({now.get('attempt') or 'no attempt'}; this writer is {start.attempt.id}). Nothing of this writer "
        "was published, and the set is unchanged. Pass overwrite=True to replace that set, or write to another folder"
    )
