"""Publishing a record set: a hidden temporary beside the target, then one atomic rename.

Nothing appears at the target until the write is complete. The temporary is
``.NAME.tmp-PID-TOKEN`` in the target's directory (same file system, so
``rename(2)`` is atomic); scratch files of the same write (the shuffle spool)
share its name with a suffix. Temporaries whose PID is dead were left by a
killed writer and are removed by the next write to the same target.
"""

from __future__ import annotations

import contextlib
import os
import re

import lmdb

from torchrecord.errors import RecordExistsError, TorchRecordError, WriteError

__all__ = ["Publisher", "as_write_error"]

_TEMP_PATTERN = ".{name}.tmp-{pid}-{token}"


class Publisher:
    """The temporary files of one write and the move of the finished file into place.

    Creating it checks the target (``RecordExistsError`` unless ``overwrite``, a
    ``WriteError`` for a missing parent directory) and removes dead writers'
    temporaries; it creates no file itself.
    """

    def __init__(self, target: str, overwrite: bool) -> None:
        if os.path.lexists(target) and (not overwrite or os.path.isdir(target)):
            what = "a directory" if os.path.isdir(target) else "a file"
            hint = "remove it first" if overwrite else "pass overwrite=True to replace it"
            raise RecordExistsError(f"{target}: {what} exists already; {hint}")
        self.target = target
        self.parent = os.path.dirname(os.path.abspath(target))
        if not os.path.isdir(self.parent):
            raise WriteError(f"{target}: parent directory {self.parent} does not exist")
        _remove_stale_temporaries(target)
        self.temp = _temporary_path(target)
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
        """Rename the finished temporary over the target, then sync the directory."""
        _remove(self.temp + "-lock")
        os.replace(self.temp, self.target)
        _fsync_dir(self.parent)

    def discard(self) -> None:
        """Remove every file of this write (best effort: also on a read-only file system)."""
        for path in self._scratch:
            _remove(path)
            _remove(path + "-lock")


def as_write_error(exc: BaseException, target: str) -> BaseException:
    """The exception to raise for ``exc``: LMDB and OS errors become a WriteError naming the target."""
    if isinstance(exc, lmdb.Error):
        return WriteError(f"{target}: LMDB error while writing: {exc}")
    if isinstance(exc, OSError) and not isinstance(exc, TorchRecordError):
        return WriteError(f"{target}: write failed: {exc}")
    return exc


def _temporary_path(target: str) -> str:
    directory, name = os.path.split(os.path.abspath(target))
    token = os.urandom(4).hex()
    return os.path.join(directory, _TEMP_PATTERN.format(name=name, pid=os.getpid(), token=token))


def _remove_stale_temporaries(target: str) -> None:
    """Delete temp files left beside ``target`` by writers that no longer run (e.g. killed)."""
    directory, name = os.path.split(os.path.abspath(target))
    pattern = re.compile(r"^\." + re.escape(name) + r"\.tmp-(\d+)-[0-9a-f]+")
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        match = pattern.match(entry)
        if match and not _pid_alive(int(match.group(1))):
            _remove(os.path.join(directory, entry))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: str) -> None:
    """Best-effort removal: on a read-only file system even a missing file gives EROFS."""
    with contextlib.suppress(OSError):
        os.remove(path)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
