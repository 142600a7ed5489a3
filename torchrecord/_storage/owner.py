"""The cache's folders: created owner-only, refused when another user owns them, marked as the cache's own.

The cache folder is created 0700 and refused when another user owns it. Each set's shards go to
a subfolder named by its ``set_id`` that the cache creates (0700) and marks as its own
(``.torchrecord-cache``); only folders so marked are ever looked into for eviction, so a user's
own files in ``cache_dir`` are never touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat

from torchrecord._storage.location import CACHE_ENV
from torchrecord.errors import CacheError

__all__ = ["MARKER", "SET_FOLDER", "is_own_set_folder", "make_root", "make_set_folder"]

#: The file that marks a set folder as the cache's own.
MARKER = ".torchrecord-cache"
_MARKER_TEXT = (
    "torchrecord shard cache: the shards in this folder were downloaded by torchrecord, which may delete them.\n"
)
#: A set folder's name: a manifest's set_id.
SET_FOLDER = re.compile(r"^[0-9A-Za-z_-]{1,64}$")


def make_root(root: str) -> bool:
    """Create the cache folder owner-only if absent (True if this call created it); refuse another user's."""
    created = False
    if not os.path.lexists(root):
        try:
            os.makedirs(root, mode=0o700)
            created = True
        except FileExistsError:
            pass
        except OSError as exc:
            raise CacheError(f"{root}: cannot create the shard cache's folder ({exc}); choose cache_dir=") from exc
    try:
        st = os.stat(root)  # a symlink the user made to a folder of theirs is fine here
    except OSError as exc:
        raise CacheError(f"{root}: cannot use it as the shard cache's folder ({exc})") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"{root}: is not a directory; the shard cache needs a folder (cache_dir=)")
    _check_owner(root, st)
    return created


def make_set_folder(folder: str) -> None:
    """Create a set's folder owner-only and mark it as the cache's; refuse one that is not safe to trust."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise CacheError(f"{folder}: cannot create the shard cache's folder for this set ({exc})") from exc
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode):
        raise CacheError(f"{folder}: is a symlink; the shard cache never follows one out of its folder (remove it)")
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"{folder}: is not a directory; it is where the shard cache keeps this set (remove it)")
    _check_owner(folder, st)
    if st.st_mode & 0o022:
        raise CacheError(
            f"{folder}: others may write in it (mode {stat.S_IMODE(st.st_mode):o}); the shard cache trusts only "
            "a folder that is yours alone: chmod 700 it after checking its files, or choose another cache_dir="
        )
    marker = os.path.join(folder, MARKER)
    try:
        mst = os.lstat(marker)
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(_MARKER_TEXT)
        mst = os.lstat(marker)
    if not stat.S_ISREG(mst.st_mode):
        raise CacheError(f"{marker}: is not the shard cache's marker file (remove it)")


def _check_owner(path: str, st: os.stat_result) -> None:
    if st.st_uid != os.geteuid():
        raise CacheError(
            f"{path}: the shard cache's folder belongs to user {st.st_uid}, not to you ({os.geteuid()}); "
            f"torchrecord keeps downloaded shards only in a folder of your own: pass cache_dir= "
            f"(or set ${CACHE_ENV}) to one"
        )


def is_own_set_folder(folder: str) -> bool:
    """A set folder the cache made: a real directory of ours, not writable by others, with the marker."""
    try:
        st = os.lstat(folder)
        mst = os.lstat(os.path.join(folder, MARKER))
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022 and stat.S_ISREG(mst.st_mode)
    )
