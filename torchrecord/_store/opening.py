"""A record set's file opened read-only, and what to say when the path holds something else.

The open creates no lock file (safe in any process), never maps a file shorter
than its LMDB pages (reading past the end would kill the process with SIGBUS),
identifies the file it opened (so a file replaced meanwhile is never measured for
another), and names what a wrong path holds: nothing, a directory (of images?),
an image or an array file, a file that is not LMDB, or a process out of file
descriptors.
"""

from __future__ import annotations

import errno
import os
import stat

import lmdb

from torchrecord._store.format import MAX_DBS, REWRITE
from torchrecord.errors import (
    CorruptRecordError,
    NotARecordSetError,
    RecordNotFoundError,
    TooManyOpenFilesError,
)

__all__ = ["check_kind", "check_path", "describe_directory", "open_identified"]


_OPEN_ATTEMPTS = 3


def open_identified(path: str) -> tuple[lmdb.Environment, tuple[int, int]]:
    """Open a record set read-only; returns the environment and the file's (st_dev, st_ino).

    Raises RecordNotFoundError / NotARecordSetError with the path in the message,
    and CorruptRecordError for a file shorter than its LMDB pages (truncated):
    LMDB maps the file, and reading a page past its end would kill the process
    with SIGBUS, so the length is checked here, before any page is read. The
    file is identified by stat before and after the open, so a file replaced at
    the path meanwhile (``write_record(overwrite=True)``) is never measured for
    another one: the open is retried instead.
    """
    for _ in range(_OPEN_ATTEMPTS):
        before = _stat(path)
        env = _open_lmdb(path)
        try:
            after = os.stat(path)
        except OSError:
            after = None
        if after is not None and (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino):
            _check_length(env, path, after.st_size)
            return env, (after.st_dev, after.st_ino)
        env.close()  # replaced while it was being opened: open the new file
    raise RecordNotFoundError(f"{path}: the file keeps being replaced while it is opened; try again")


def check_path(path: str) -> None:
    """RecordNotFoundError / NotARecordSetError for a missing path, a directory or an empty file."""
    _stat(path)


def check_kind(path: str) -> None:
    """NotARecordSetError naming what the file is when it is a common non-record-set format (an image...)."""
    kind = _sniff(path)
    if kind is not None:
        raise NotARecordSetError(f"{path}: is {kind}, not a torchrecord record set; {_CONVERT.format(path=path)}")


def _stat(path: str) -> os.stat_result:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise RecordNotFoundError(f"{path}: no record set here (write one with torchrecord.write_record)") from None
    if stat.S_ISDIR(st.st_mode):
        raise NotARecordSetError(f"{path}: is a directory{describe_directory(path)}")
    if st.st_size == 0:
        raise NotARecordSetError(f"{path}: empty file, not a record set; {REWRITE}")
    return st


#: How to make a record set out of images or arrays.
_CONVERT = "to make a record set of it, run: torchrecord convert {path} OUT.tr (see torchrecord convert --help)"

#: File signatures of what people point a reader at by mistake, and what to call them.
_SIGNATURES = (
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"GIF8", "a GIF image"),
    (b"BM", "a BMP image"),
    (b"\x93NUMPY", "a NumPy .npy file"),
    (b"PK\x03\x04", "a zip archive (a NumPy .npz file?)"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file"),
)

#: Image file name extensions, to recognise a folder of images.
_IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})


def _sniff(path: str) -> str | None:
    """What the file at ``path`` is, by its first bytes, when it is a common non-record-set format."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    for signature, kind in _SIGNATURES:
        if head.startswith(signature):
            return kind
    return None


def describe_directory(path: str, limit: int = 2000) -> str:
    """The end of the message for a directory given as a record set: what it holds, what to do."""
    single = "; a torchrecord record set is a single file written by write_record"
    if os.path.exists(os.path.join(path, "data.mdb")):
        return f" holding an LMDB environment (data.mdb), not a torchrecord record set{single}"
    images = 0
    seen = 0
    try:  # a bounded look at the folder and its subfolders (class-per-folder layout)
        with os.scandir(path) as top:
            for entry in top:
                seen += 1
                if seen > limit:
                    break
                if entry.is_dir(follow_symlinks=False):
                    with os.scandir(entry.path) as inner:
                        for sub in inner:
                            seen += 1
                            images += os.path.splitext(sub.name)[1].lower() in _IMAGE_SUFFIXES
                            if seen > limit or images:
                                break
                else:
                    images += os.path.splitext(entry.name)[1].lower() in _IMAGE_SUFFIXES
                if images:
                    break
    except OSError:
        pass
    if images:
        return f" of images, not a record set; {_CONVERT.format(path=path)}"
    return single


def _open_lmdb(path: str) -> lmdb.Environment:
    try:
        return lmdb.open(
            path,
            subdir=False,
            readonly=True,
            lock=False,
            max_dbs=MAX_DBS,
            max_spare_txns=2,
        )
    except lmdb.InvalidError:
        kind = _sniff(path)
        if kind is not None:
            raise NotARecordSetError(
                f"{path}: is {kind}, not a torchrecord record set; {_CONVERT.format(path=path)}"
            ) from None
        raise NotARecordSetError(
            f"{path}: not an LMDB file, so not a torchrecord record set; check the path, or {REWRITE}"
        ) from None
    except (lmdb.Error, OSError) as exc:
        if _out_of_descriptors(path, exc):
            raise TooManyOpenFilesError(
                errno.EMFILE,
                f"{path}: cannot open the record set: too many open files in this process ({exc}). The file is "
                "not at fault: close RecordFiles you no longer need (rf.close(), or a with block), or raise the "
                "limit on open files (ulimit -n; resource.setrlimit(resource.RLIMIT_NOFILE, ...))",
            ) from None
        if isinstance(exc, lmdb.Error):
            raise NotARecordSetError(f"{path}: cannot open as LMDB ({exc}); {REWRITE}") from None
        raise


def _out_of_descriptors(path: str, exc: BaseException) -> bool:
    """Whether opening ``path`` failed because no file descriptor was left (EMFILE, ENFILE).

    py-lmdb reports it as a plain ``lmdb.Error`` without an errno, so an ``open(2)``
    of the same path tells.
    """
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as probe:
        return probe.errno in (errno.EMFILE, errno.ENFILE)
    os.close(fd)
    return False


def _check_length(env: lmdb.Environment, path: str, size: int) -> None:
    """Close ``env`` and raise unless the file holds every page LMDB's header says it uses."""
    try:
        needed = (int(env.info()["last_pgno"]) + 1) * int(env.stat()["psize"])
    except lmdb.Error as exc:
        env.close()
        raise NotARecordSetError(f"{path}: unreadable LMDB header ({exc}); {REWRITE}") from None
    if size < needed:
        env.close()
        raise CorruptRecordError(
            f"{path}: the file is truncated: it has {size} bytes, its LMDB pages need {needed}; {REWRITE}"
        )
