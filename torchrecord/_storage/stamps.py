"""Stamps: what the shard cache checked, tied to the very file it checked.

A shard the cache downloaded and verified gets a stamp ``.NAME.verified`` beside it: the file's
SHA-256 and its identity (device, inode, size, mtime and ctime in ns). A file is trusted only while
its stamp matches it; any other file at a shard's name (planted, truncated, padded, a symlink) is
hashed again or fetched again, never trusted by its size. Eviction deletes only stamped files.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Any

from torchrecord._storage.locks import remove

__all__ = ["adopt", "file_digest", "lock_path", "read_stamp", "stamp_path", "stamped", "write_stamp"]

_DIGEST_CHUNK = 8 << 20


def file_digest(path: str) -> tuple[str, int]:
    """(SHA-256 hex digest, size in bytes) of a file, read in 8 MiB pieces."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while piece := f.read(_DIGEST_CHUNK):
            h.update(piece)
            size += len(piece)
    return h.hexdigest(), size


def stamp_path(local: str) -> str:
    """The stamp of the shard file ``local``."""
    folder, name = os.path.split(local)
    return os.path.join(folder, f".{name}.verified")


def lock_path(local: str) -> str:
    """The lock file of the shard file ``local`` (held while it is downloaded or evicted)."""
    folder, name = os.path.split(local)
    return os.path.join(folder, f".{name}.lock")


def _identity(st: os.stat_result) -> list[int]:
    """The file's identity: device, inode, size, mtime and ctime in ns (a write or a utime changes the ctime)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def write_stamp(local: str, digest: str, st: os.stat_result) -> None:
    """Record that the file at ``local`` (this very file: its identity) has SHA-256 ``digest``."""
    path = stamp_path(local)
    remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"sha256": digest, "identity": _identity(st)}, f)


def read_stamp(local: str) -> dict[str, Any] | None:
    """The stamp of ``local``: a small regular file of ours (a symlink, a FIFO, another's file is none)."""
    try:
        fd = os.open(stamp_path(local), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > 4096:
            return None
        value = json.loads(os.read(fd, 4096).decode("utf-8"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return value if isinstance(value, dict) else None


def stamped(local: str, digest: str | None, size: int | None) -> bool:
    """``local`` is a regular file whose stamp matches its identity (and ``digest``, ``size`` if given)."""
    try:
        st = os.lstat(local)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
        return False
    stamp = read_stamp(local)
    if stamp is None or stamp.get("identity") != _identity(st):
        return False
    return digest is None or stamp.get("sha256") == digest


def adopt(local: str, digest: str, size: int) -> bool:
    """Stamp an unstamped regular file at ``local`` if it is byte for byte the shard (its SHA-256 and size)."""
    try:
        fd = os.open(local, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # absent, a symlink, not ours to read
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return False
        h = hashlib.sha256()
        while piece := os.read(fd, 1 << 20):
            h.update(piece)
        if h.hexdigest() != digest:
            return False
        write_stamp(local, digest, st)
        return True
    finally:
        os.close(fd)
