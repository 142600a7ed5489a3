"""Remote sharded sets: shards fetched through fsspec into a local cache, ahead of use.

A shard is downloaded to a hidden temporary in the cache folder, its SHA-256 and
size are checked against the manifest (a mismatch is fetched again, up to
``ATTEMPTS`` times), and only then renamed into place, so a half-written or
damaged shard is never opened. An exclusive ``flock`` per shard makes concurrent
readers on one machine share one download. Each process's :class:`ShardCache`
fetches the next shards of its plan in a background thread, and evicts the least
recently used shards it is not using whenever the cache holds more than
``cache_limit`` bytes. Every network call has a timeout: a server that stops
gives a :class:`~torchrecord.errors.FetchError` naming the shard, not a hang.

fsspec (and aiohttp for ``http(s)://``) come with the ``remote`` extra.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from torchrecord._core.extras import REMOTE_HINT
from torchrecord._shards.manifest import MANIFEST_NAME, file_digest
from torchrecord._store.record_set import is_url
from torchrecord.errors import ChecksumError, FetchError, MissingDependencyError

__all__ = ["AHEAD", "ATTEMPTS", "ShardCache", "TIMEOUT", "fetch_manifest", "is_url"]

#: Downloads of one shard whose checksum does not match, before giving up.
ATTEMPTS = 3
#: Seconds to connect, and between two reads of one response.
TIMEOUT = 30.0
#: Shards of the plan fetched ahead of the one being read.
AHEAD = 2


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError as exc:
        raise MissingDependencyError(f"{url}: reading a remote set needs fsspec: {REMOTE_HINT}") from exc
    options: dict[str, Any] = {}
    if url.startswith(("http://", "https://")):
        try:
            import aiohttp
        except ImportError as exc:
            raise MissingDependencyError(f"{url}: http(s) needs aiohttp: {REMOTE_HINT}") from exc
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=TIMEOUT, sock_read=TIMEOUT)
        options["client_kwargs"] = {"timeout": timeout}
        options["skip_instance_cache"] = True  # its event loop thread must not cross a fork
    fs, path = fsspec.core.url_to_fs(url, **options)
    return fs, path


def fetch_manifest(url: str) -> tuple[str, str]:
    """(the manifest's URL, its text) for a manifest URL or a URL prefix holding ``manifest.json``."""
    where = url if url.endswith(".json") else url.rstrip("/") + "/" + MANIFEST_NAME
    fs, path = _filesystem(where)
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        raise FetchError(f"{where}: no manifest there (finalize the set, or check the URL)") from None
    except Exception as exc:  # fsspec back ends raise many kinds
        raise FetchError(f"{where}: cannot fetch the manifest ({type(exc).__name__}: {exc})") from exc
    return where, bytes(data).decode("utf-8")


class ShardCache:
    """The shards of one remote set in a local folder, fetched ahead, checked, evicted over a limit.

    Args:
        base: the URL prefix the manifest's shard names are relative to.
        manifest: the set's manifest.
        cache_dir: the cache folder (shared by every set and process; None: the temp dir's).
        cache_limit: bytes of shard files to keep at most (None: no limit).
    """

    def __init__(self, base: str, manifest: dict[str, Any], cache_dir: str | None, cache_limit: int | None) -> None:
        self.base = base
        self.entries = manifest["shards"]
        self.root = os.path.abspath(cache_dir or os.path.join(tempfile.gettempdir(), "torchrecord-cache"))
        self.folder = os.path.join(self.root, str(manifest["set_id"]))
        os.makedirs(self.folder, exist_ok=True)
        self.limit = cache_limit
        self.in_use: set[int] = set()
        self._plan: list[int] = []
        self._next = 0  # position in the plan of the shard being read
        self._errors: dict[int, BaseException] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- what the reader calls ------------------------------------------------------
    def fetch(self, s: int) -> str:
        """The local path of shard ``s``, fetched and checked first if the cache lacks it."""
        with self._cond:
            self.in_use.add(s)
            with contextlib.suppress(ValueError):  # s is needed now: the plan goes on from there
                self._next = self._plan.index(s, self._next)
            self._cond.notify_all()
            error = self._errors.pop(s, None)
        if error is not None and not isinstance(error, FetchError):
            raise error
        return self._fetch(s)

    def plan(self, shards: Sequence[int]) -> None:
        """The shards this process reads next, in the order it needs them (a shard may come back).

        A background thread fetches the next AHEAD of them; eviction spares them.
        """
        with self._cond:
            self._plan, self._next = list(shards), 0
            self._cond.notify_all()
            if self._thread is None and self._plan:
                self._thread = threading.Thread(target=self._ahead, name="torchrecord-prefetch", daemon=True)
                self._thread.start()

    def release(self, s: int) -> None:
        """Shard ``s`` is not being read now: evict over the limit."""
        with self._cond:
            self.in_use.discard(s)
        self.evict()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- fetching -------------------------------------------------------------------
    def path_of(self, s: int) -> str:
        return os.path.join(self.folder, self.entries[s]["name"])

    def url_of(self, s: int) -> str:
        return f"{self.base}/{self.entries[s]['name']}"

    def _present(self, s: int) -> bool:
        try:
            return os.path.getsize(self.path_of(s)) == int(self.entries[s]["bytes"])
        except OSError:
            return False

    def _fetch(self, s: int) -> str:
        local = self.path_of(s)
        if self._present(s):
            with contextlib.suppress(OSError):
                os.utime(local)  # recently used
            return local
        with _locked(local + ".lock"):
            if self._present(s):  # another process (or our prefetch thread) fetched it meanwhile
                return local
            self.evict(need=int(self.entries[s]["bytes"]), keep={s})
            self._download(s, local)
        return local

    def _download(self, s: int, local: str) -> None:
        entry, url = self.entries[s], self.url_of(s)
        fs, path = _filesystem(url)
        for attempt in range(1, ATTEMPTS + 1):
            temp = os.path.join(self.folder, f".{entry['name']}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
            try:
                try:
                    fs.get_file(path, temp)
                except FileNotFoundError:
                    raise FetchError(f"{url}: shard {s} is not there (the manifest lists it); check the set") from None
                except Exception as exc:  # fsspec back ends raise many kinds (aiohttp, botocore, OSError)
                    raise FetchError(
                        f"{url}: cannot fetch shard {s} ({type(exc).__name__}: {exc}); is the server up?"
                    ) from exc
                digest, size = file_digest(temp)
                if digest == entry["sha256"] and size == int(entry["bytes"]):
                    with open(temp, "rb") as f:
                        os.fsync(f.fileno())
                    os.replace(temp, local)
                    return
                if attempt == ATTEMPTS:
                    raise ChecksumError(
                        f"{url}: shard {s} was fetched {ATTEMPTS} times and never matched the manifest "
                        f"({size} bytes, SHA-256 {digest[:16]}...; expected {entry['bytes']} bytes, "
                        f"{entry['sha256'][:16]}...): the copy on the server is damaged or was replaced"
                    )
            finally:
                with contextlib.suppress(OSError):
                    os.remove(temp)

    def _ahead(self) -> None:
        """Background thread: fetch the next AHEAD shards of the plan that the cache lacks."""
        while True:
            with self._cond:
                target = None
                while target is None:
                    if self._closed:
                        return
                    upcoming = [s for s in dict.fromkeys(self._plan[self._next : self._next + AHEAD + 1])]
                    pending = [s for s in upcoming if s not in self._errors and not self._present(s)]
                    if pending:
                        target = pending[0]
                    else:
                        self._cond.wait(timeout=1.0)
            try:
                self._fetch(target)
            except BaseException as exc:  # handed to the reader when it asks for this shard
                with self._cond:
                    self._errors[target] = exc

    # -- eviction -------------------------------------------------------------------
    def evict(self, need: int = 0, keep: set[int] | None = None) -> None:
        """Remove least recently used shard files until ``need`` more bytes fit under the limit.

        Shards this process is reading, or will read next, are kept.
        """
        if self.limit is None:
            return
        with self._cond:
            protect = {self.path_of(s) for s in self.in_use | (keep or set())}
            protect |= {self.path_of(s) for s in self._plan[self._next : self._next + AHEAD + 1]}
        files = sorted(_shard_files(self.root), key=lambda f: f[1])  # oldest use first
        total = sum(size for _, _, size in files)
        for path, _, size in files:
            if total + need <= self.limit:
                break
            if path in protect:
                continue
            with contextlib.suppress(OSError):
                os.remove(path)  # a process reading it keeps its mapping; the disk space returns after
                total -= size


def _shard_files(root: str) -> Iterator[tuple[str, float, int]]:
    """(path, last use, size) of every published shard file under the cache root."""
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".tr") and not name.startswith("."):
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    yield path, max(st.st_mtime, st.st_atime), st.st_size


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive flock on ``path`` (created if needed): one download of a shard at a time per machine."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
