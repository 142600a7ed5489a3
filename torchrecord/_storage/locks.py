"""Locks on small files (``flock``): one download of a shard at a time, and a dead holder told from a live one.

A lock file is held by an exclusive ``flock`` on it and removed by its holder before it lets go,
so no lock file stays behind; whoever opened it meanwhile finds it gone (or another file) once it
gets the lock, and locks the new one. A lock that can be taken without waiting belongs to nobody
alive: that is how the shard cache and the upload staging folders find what killed processes left.
A forked child closes its copies of the locks this process holds, so a lock lives exactly as long
as its holder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time

from torchrecord.errors import CacheError

__all__ = ["Lock", "UNFILLED_GRACE", "holds", "keep", "let_go", "remove"]

#: An empty lock file may be one a holder has just created and not yet locked: left alone this long (s).
UNFILLED_GRACE = 3600.0

#: the lock descriptors this process holds: a forked child closes its copies
_HELD: set[int] = set()


def _close_in_child() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


def keep(fd: int) -> None:
    """Count the lock descriptor ``fd`` as held by this process: a forked child closes its copy."""
    _HELD.add(fd)


def holds(fd: int) -> bool:
    """This process holds the lock descriptor ``fd`` (False in a forked child, which closed its copy)."""
    return fd in _HELD


def let_go(fd: int) -> None:
    """Close the lock descriptor ``fd`` this process holds."""
    _HELD.discard(fd)
    os.close(fd)


def remove(path: str) -> bool:
    """Best-effort removal of a file (on a read-only file system even a missing file gives EROFS); True if removed."""
    try:
        os.remove(path)
    except OSError:
        return False
    return True


class Lock:
    """An exclusive ``flock`` on the file ``path``, removed by its holder before it lets go.

    With ``blocking=False`` the context's value says whether the lock was taken (an empty lock
    file younger than ``UNFILLED_GRACE`` is left to the process that has just made it).
    ``note`` is written into the file for people (and for the cache: a download's full size).
    """

    def __init__(self, path: str, *, blocking: bool = True, note: str = "") -> None:
        self.path, self.blocking, self.note = path, blocking, note
        self.fd: int | None = None

    def __enter__(self) -> bool:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        while True:
            created = False
            try:
                fd = os.open(self.path, flags)
            except FileNotFoundError:
                try:
                    fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    continue  # another process made it meanwhile: open that one
                except OSError as exc:
                    raise CacheError(f"{self.path}: cannot create the lock file ({exc})") from exc
                created = True
            except OSError as exc:
                if exc.errno == errno.ELOOP and remove(self.path):  # a symlink where the lock goes
                    continue
                raise CacheError(f"{self.path}: cannot open the lock file ({exc})") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.blocking else fcntl.LOCK_NB))
            except OSError as exc:
                os.close(fd)
                if not self.blocking:
                    return False  # held by a live process (or no flock here: then never guess)
                raise CacheError(f"{self.path}: cannot lock the lock file ({exc})") from exc
            st = os.fstat(fd)
            try:
                now: os.stat_result | None = os.lstat(self.path)
            except FileNotFoundError:
                now = None
            if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                os.close(fd)  # its holder removed it while we waited: lock the one now there
                continue
            if not self.blocking and not created and st.st_size == 0 and time.time() - st.st_mtime < UNFILLED_GRACE:
                os.close(fd)  # a holder has just made it and is about to lock it: left alone
                return False
            self.fd = fd
            keep(fd)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()} {socket.gethostname()} {self.note}\n".encode())
            return True

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Remove the lock file (while still locked) and let go; nothing if not held."""
        if self.fd is not None:
            remove(self.path)
            let_go(self.fd)
            self.fd = None
