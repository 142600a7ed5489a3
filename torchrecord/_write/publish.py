"""Publishing a record set: a hidden temporary beside the target, then one atomic move into place.

Nothing appears at the target until the write is complete. The temporary is
``.NAME.tmp-PID-TOKEN`` in the target's directory (same file system, so the
move is atomic); scratch files of the same write (the shuffle spool) share its
name with a suffix.

The move:

* ``overwrite=True``: ``rename(2)`` over the target (atomic replace);
* ``overwrite=False``: atomic *no-replace*: ``renameat2(RENAME_NOREPLACE)`` on
  Linux, else (or where the file system does not support it) a hard link of
  the temporary at the target, which fails if the target exists, then the
  temporary's name is removed. Of several writers racing to create one absent
  path exactly one wins; the others get ``RecordExistsError`` and leave nothing.
  A file system with neither gives a ``WriteError`` saying so.

Stale temporaries (of a writer that was killed) are recognised by a lock, not
by a PID: every write holds an exclusive ``flock`` on its lock file
``.NAME.tmp-PID-TOKEN.lock`` from before its temporary exists until after its
files are gone. The next write to the same target removes the files of every
write whose lock it can take. A live writer's lock cannot be taken, whatever
its PID means here: one in another PID namespace (another container) or on
another host of a shared file system is never disturbed. Temporaries without a
lock file (left by earlier torchrecord versions) are judged by PID, as they were then.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import socket
import sys
import time

import lmdb

from torchrecord._storage.locks import holds, keep, let_go
from torchrecord._storage.locks import remove as _remove
from torchrecord._storage.temps import parse_temp, temp_path
from torchrecord._write.lmdb_writer import space_hint
from torchrecord.errors import RecordExistsError, TorchRecordError, WriteError

__all__ = ["LOCK_SUFFIX", "Publisher", "as_write_error", "remove_stale_temporaries"]

#: Suffix of the lock file a live write holds locked.
LOCK_SUFFIX = ".lock"
#: A lock file found empty and unlocked may belong to a writer that has created it but not locked it
#: yet (a few microseconds): it is removed only when it is older than this (seconds).
_UNFILLED_GRACE = 3600.0

_RENAME_NOREPLACE = 1
#: errnos of renameat2 that mean "not here" (old kernel or libc, file system without the flag)
_NO_RENAMEAT2 = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}
#: errnos of link(2) on a file system without hard links
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS, errno.EXDEV}


class Publisher:
    """The temporary files of one write, its lock, and the move of the finished file into place.

    Creating it checks the target (``RecordExistsError`` unless ``overwrite``, a
    ``WriteError`` for a missing parent directory), removes dead writers'
    temporaries and creates (and locks) this write's lock file; end it with
    :meth:`publish` or :meth:`discard`.
    """

    def __init__(self, target: str, overwrite: bool) -> None:
        if os.path.lexists(target) and (not overwrite or os.path.isdir(target)):
            raise _exists(target, overwrite)
        self.target = target
        self.overwrite = overwrite
        self.parent = os.path.dirname(os.path.abspath(target))
        if not os.path.isdir(self.parent):
            raise WriteError(f"{target}: parent directory {self.parent} does not exist")
        remove_stale_temporaries(target)
        self.temp = temp_path(target)
        self.lock_path = self.temp + LOCK_SUFFIX
        self._lock_fd: int | None = _hold_lock(self.lock_path, target)
        self._scratch = [self.temp]

    def scratch(self, suffix: str) -> str:
        """A scratch path of this write (``temp + suffix``), removed by :meth:`discard`."""
        path = self.temp + suffix
        self._scratch.append(path)
        return path

    def drop(self, path: str) -> None:
        """Remove a scratch file early (a replayed spool), freeing its space before the rename."""
        _remove(path)
        _remove(path + "-lock")

    def publish(self) -> None:
        """Move the finished temporary to the target (replacing it only with ``overwrite``), sync the directory.

        Raises RecordExistsError when ``overwrite`` is false and the target
        appeared meanwhile (another writer won); the temporary is then left for
        :meth:`discard`.
        """
        _remove(self.temp + "-lock")
        if self.overwrite:
            os.replace(self.temp, self.target)
        else:
            _move_no_replace(self.temp, self.target)
        _fsync_dir(self.parent)
        self._unlock()

    def discard(self) -> None:
        """Remove every file of this write (best effort: also on a read-only file system), the lock last."""
        for path in reversed(self._scratch):  # scratch files first: a live write never lacks its temporary
            _remove(path)
            _remove(path + "-lock")
        self._unlock()

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None and holds(fd):  # not in a forked child, which closed its copy
            _remove(self.lock_path)  # removed while still locked: nobody can take it for a stale one
            let_go(fd)


def as_write_error(exc: BaseException, target: str) -> BaseException:
    """The exception to raise for ``exc``: LMDB and OS errors become a WriteError naming the target."""
    if isinstance(exc, lmdb.Error):
        return WriteError(f"{target}: LMDB error while writing: {exc}")
    if isinstance(exc, OSError) and not isinstance(exc, TorchRecordError):
        return WriteError(f"{target}: write failed: {exc}")
    return exc


def _exists(target: str, overwrite: bool) -> RecordExistsError:
    what = "a directory" if os.path.isdir(target) else "a file"
    hint = "remove it first" if overwrite else "pass overwrite=True to replace it"
    return RecordExistsError(f"{target}: {what} exists already; {hint}")


# -- the move ------------------------------------------------------------------------------


def _move_no_replace(temp: str, target: str) -> None:
    """Move ``temp`` to ``target`` atomically unless ``target`` exists (then RecordExistsError)."""
    try:
        if _renameat2_noreplace(temp, target):
            return
    except FileExistsError:
        raise _lost_race(target) from None
    try:
        os.link(temp, target)
    except FileExistsError:
        raise _lost_race(target) from None
    except OSError as exc:
        if exc.errno in _NO_LINKS:
            directory = os.path.dirname(os.path.abspath(target))
            raise WriteError(
                f"{target}: cannot publish without replacing: the file system of {directory} supports neither "
                f"renameat2(RENAME_NOREPLACE) nor hard links ({exc.strerror}), so overwrite=False cannot be made "
                "safe against another writer creating the same path. Pass overwrite=True (atomic replace), or "
                "write on another file system and move the file"
            ) from exc
        raise
    _remove(temp)  # the set is at the target now; this was only its second name


def _lost_race(target: str) -> RecordExistsError:
    return RecordExistsError(
        f"{target}: another writer published a record set at this path while this one was writing; "
        "nothing of this write was kept. Pass overwrite=True to replace it, or write to another path"
    )


_renameat2_fn: object = None


def _renameat2_noreplace(temp: str, target: str) -> bool:
    """``renameat2(temp, target, RENAME_NOREPLACE)``; False where it is not available.

    Raises FileExistsError when ``target`` exists, OSError for other failures.
    """
    global _renameat2_fn
    if not sys.platform.startswith("linux"):
        return False
    if _renameat2_fn is None:
        _renameat2_fn = False
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fn = libc.renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
            _renameat2_fn = fn
    if _renameat2_fn is False:
        return False
    at_fdcwd = -100
    rc = _renameat2_fn(  # type: ignore[operator]
        at_fdcwd, os.fsencode(temp), at_fdcwd, os.fsencode(target), _RENAME_NOREPLACE
    )
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        raise FileExistsError(err, os.strerror(err), target)  # as os.rename would; _move_no_replace converts it
    if err in _NO_RENAMEAT2:
        return False
    raise OSError(err, os.strerror(err), temp)  # as os.rename would; as_write_error makes it a WriteError


# -- temporaries and their locks -------------------------------------------------------------


def _hold_lock(lock_path: str, target: str) -> int:
    """Create ``lock_path``, lock it (exclusive flock) and write who holds it; returns its descriptor.

    On a file system without flock the file is written unlocked: the next
    writers then cannot take it either, and never remove this write's files.
    """
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise WriteError(
            f"{target}: cannot create the write's lock file {lock_path}: {exc}{space_hint(lock_path)}"
        ) from exc
    with contextlib.suppress(OSError):  # ENOLCK, EOPNOTSUPP...: no locks here (see above)
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks only while another writer probes it (microseconds)
    with contextlib.suppress(OSError):  # who holds it, for people; a full disk fails the write just after
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    keep(fd)  # a forked child (a DataLoader worker of the writer) closes its copy: the lock lives as the writer
    return fd


def remove_stale_temporaries(target: str) -> list[str]:
    """Delete the files left beside ``target`` by writes that no longer run; returns what was removed.

    A write is stale when its lock file can be locked (its writer, wherever it
    ran, has exited); a live write's lock cannot be taken. Files of a write
    with no lock file at all come from an earlier torchrecord version and are
    judged by their PID.
    """
    directory, name = os.path.split(os.path.abspath(target))
    try:
        entries = os.listdir(directory)
    except OSError:
        return []
    writes: dict[str, list[str]] = {}
    pids: dict[str, int] = {}
    for entry in entries:
        temp = parse_temp(entry)
        if temp is not None and temp.name == name:
            writes.setdefault(temp.base, []).append(entry)
            pids[temp.base] = temp.pid
    removed: list[str] = []
    for base, files in writes.items():
        lock = base + LOCK_SUFFIX
        paths = [os.path.join(directory, f) for f in sorted(files, key=len, reverse=True) if f != lock]
        if lock in files:
            removed += _remove_if_unlocked(os.path.join(directory, lock), paths)
        elif not _pid_alive(pids[base]):  # written before lock files existed
            removed += [p for p in paths if _remove(p)]
    return removed


def _remove_if_unlocked(lock_path: str, paths: list[str]) -> list[str]:
    """Remove ``paths`` and then ``lock_path`` if the lock can be taken (its writer has exited)."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:  # gone meanwhile, or not ours to open: leave it
        return []
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return []  # held: a live writer
        st = os.fstat(fd)
        if st.st_size == 0 and time.time() - st.st_mtime < _UNFILLED_GRACE:
            return []  # just created, its writer is about to lock it
        if st.st_nlink == 0:
            return []  # its writer finished and removed it between our open and our lock
        removed = [p for p in paths if _remove(p)]
        if _remove(lock_path):
            removed.append(lock_path)
        return removed
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
