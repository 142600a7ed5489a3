"""What the shard cache holds, what killed readers left in it, and the removal of least recently used shards.

Eviction deletes only stamped shards (files the cache downloaded, still the same file) in folders
the cache marked, never a symlink and never anything outside those folders. Partial downloads of
killed readers (their lock can be taken) are removed; those of live downloads count against the
limit at their full size, which the downloader wrote in the shard's lock file.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

from torchrecord._storage.locks import Lock, remove
from torchrecord._storage.owner import SET_FOLDER, is_own_set_folder
from torchrecord._storage.stamps import lock_path, stamped
from torchrecord._storage.temps import parse_temp

__all__ = ["Owned", "evict_one", "holdings", "remove_temporaries", "tidy"]

_LOCK = re.compile(r"^\.(.+)\.lock$")
_STAMP = re.compile(r"^\.(.+)\.verified$")


@dataclass
class Owned:
    """A shard file the cache downloaded and stamped: what eviction may delete."""

    path: str
    stamp: str
    lock: str
    size: int
    last_use: float


def _download_of(entry: str) -> str | None:
    """The shard a partial download (a bare temporary, no suffix) is of, else None."""
    temp = parse_temp(entry)
    return temp.name if temp is not None and not temp.suffix else None


def remove_temporaries(folder: str, name: str) -> None:
    """Remove the partial downloads of shard ``name`` (the caller holds its lock: none is live)."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(folder):
            if _download_of(entry) == name:
                remove(os.path.join(folder, entry))


def tidy(folder: str) -> list[str]:
    """Remove what killed readers left in a set folder: partial downloads and lock files whose lock can be taken.

    Returns the names of the shards tidied.
    """
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    names = {n for e in entries for n in (_download_of(e), _lock_of(e)) if n}
    tidied = []
    for name in sorted(names):
        with Lock(os.path.join(folder, f".{name}.lock"), blocking=False) as held:
            if held:
                remove_temporaries(folder, name)
                tidied.append(name)
    return tidied


def _lock_of(entry: str) -> str | None:
    match = _LOCK.match(entry)
    return match.group(1) if match else None


def holdings(root: str) -> tuple[list[Owned], int]:
    """(stamped shards, bytes of live downloads at their full size) in the cache's own set folders under ``root``.

    Partial downloads of killed readers are removed on the way. Only folders the cache marked are
    looked into, only their own entries (no recursion, no symlink followed).
    """
    owned: list[Owned] = []
    in_flight = 0
    try:
        children = os.listdir(root)
    except OSError:
        return owned, 0
    for child in children:
        folder = os.path.join(root, child)
        if not SET_FOLDER.match(child) or not is_own_set_folder(folder):
            continue
        tidy(folder)
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            stamp = _STAMP.match(entry)
            if stamp:
                local = os.path.join(folder, stamp.group(1))
                if stamped(local, None, None):
                    with contextlib.suppress(OSError):
                        st = os.lstat(local)
                        last = os.lstat(os.path.join(folder, entry)).st_mtime
                        owned.append(Owned(local, os.path.join(folder, entry), lock_path(local), st.st_size, last))
                continue
            name = _download_of(entry)
            if name is not None:
                with contextlib.suppress(OSError):
                    size = os.lstat(os.path.join(folder, entry)).st_size
                    in_flight += max(size, _expected(os.path.join(folder, f".{name}.lock")))
    return owned, in_flight


def _expected(lock: str) -> int:
    """The full size of a live download, as its downloader wrote it in the shard's lock file (0 if unknown)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        fields = os.read(fd, 256).split()
        return int(fields[2]) if len(fields) >= 3 and fields[2].isdigit() else 0
    except OSError:
        return 0
    finally:
        os.close(fd)


def evict_one(item: Owned) -> bool:
    """Remove one stamped shard unless a download of it is in flight or it changed since it was listed."""
    with Lock(item.lock, blocking=False) as held:
        if not held or not stamped(item.path, None, None):
            return False
        removed = remove(item.path)
        remove(item.stamp)
        return removed
