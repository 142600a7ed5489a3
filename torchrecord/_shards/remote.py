"""Remote sharded sets: shards fetched through a transport (fsspec) into a local cache, ahead of use.

The cache is a folder of the user's own (``cache_dir``; default: ``$TORCHRECORD_CACHE``, else
``$XDG_CACHE_HOME/torchrecord``, else ``~/.cache/torchrecord``), created owner-only (0700) and
refused when another user owns it. Each set's shards go to a subfolder named by its ``set_id``
that the cache creates (0700) and marks as its own (``.torchrecord-cache``).

What the cache trusts and deletes:

* A shard is downloaded to a hidden temporary ``.NAME.tmp-PID-TOKEN``, read no further than the
  manifest's size (more is a :class:`~torchrecord.errors.FetchError`), checked against the
  manifest's SHA-256 and size (a mismatch is fetched again, up to ``ATTEMPTS`` times), renamed
  into place, and then *stamped*: ``.NAME.verified`` records the digest and the file's identity
  (device, inode, size, mtime and ctime in ns). A shard file is used only while its stamp matches it; any
  other file at a shard's name (planted, truncated, padded, a symlink) is hashed again or fetched
  again, never trusted by its size.
* Eviction deletes only stamped shards (files the cache downloaded, still the same file) in folders
  the cache marked, never a symlink and never anything outside those folders: a user's own files
  in ``cache_dir`` are never touched.
* One download of a shard at a time per machine: a ``flock`` on ``.NAME.lock``, removed by its
  holder when it is done (no lock file stays behind). The lock also tells a live download from
  one whose reader was killed: partial downloads whose lock can be taken are removed; those of live
  downloads count against ``cache_limit`` at their full size.
* Every transfer has a deadline: ``FETCH_GRACE`` seconds plus the shard's size at
  ``FETCH_MIN_RATE`` bytes a second (``$TORCHRECORD_FETCH_GRACE``, ``$TORCHRECORD_FETCH_MIN_RATE``),
  besides ``TIMEOUT`` to connect and between two reads. A server that stops, or drips, gives a
  :class:`~torchrecord.errors.FetchError` naming the shard.

The transport is pluggable (:class:`Transport`); the default, :class:`FsspecTransport`, reaches
every protocol fsspec knows (``http(s)://`` through aiohttp, ``s3://``, ``gs://``, ``file://``).
fsspec (and aiohttp for ``http(s)://``) come with the ``remote`` extra.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import stat
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torchrecord._core.extras import REMOTE_HINT, S3_HINT
from torchrecord._shards.manifest import MANIFEST_NAME, file_digest, parse_shard_name
from torchrecord._store.record_set import is_url
from torchrecord.errors import (
    ArgumentError,
    CacheError,
    ChecksumError,
    FetchError,
    FormatError,
    MissingDependencyError,
    NotARecordSetError,
    TorchRecordError,
    TorchRecordWarning,
)

__all__ = [
    "AHEAD",
    "ATTEMPTS",
    "CACHE_ENV",
    "DEFAULT_CACHE_LIMIT",
    "FETCH_GRACE",
    "FETCH_MIN_RATE",
    "FsspecTransport",
    "ShardCache",
    "TIMEOUT",
    "Transport",
    "cache_location",
    "fetch_manifest",
    "is_url",
]

#: Downloads of one shard whose checksum does not match, before giving up.
ATTEMPTS = 3
#: Seconds to connect, and between two reads of one response.
TIMEOUT = 30.0
#: Shards of the plan fetched ahead of the one being read.
AHEAD = 2
#: Seconds every transfer may take besides its share at FETCH_MIN_RATE (env TORCHRECORD_FETCH_GRACE).
FETCH_GRACE = 60.0
#: Bytes a second a transfer must average, after FETCH_GRACE (env TORCHRECORD_FETCH_MIN_RATE): 64 KiB/s.
FETCH_MIN_RATE = 64 << 10
#: Bytes of shards the cache keeps when ``cache_limit`` is None (env TORCHRECORD_CACHE_LIMIT): 20 GiB.
DEFAULT_CACHE_LIMIT = 20 << 30
#: The environment variable naming the cache folder used when ``cache_dir`` is None.
CACHE_ENV = "TORCHRECORD_CACHE"
LIMIT_ENV = "TORCHRECORD_CACHE_LIMIT"
GRACE_ENV = "TORCHRECORD_FETCH_GRACE"
RATE_ENV = "TORCHRECORD_FETCH_MIN_RATE"
#: The largest manifest fetched (bytes): a server answering with more is refused.
MANIFEST_LIMIT = 256 << 20

#: The file that marks a set folder as the cache's own.
MARKER = ".torchrecord-cache"
_MARKER_TEXT = (
    "torchrecord shard cache: the shards in this folder were downloaded by torchrecord, which may delete them.\n"
)
_SET_FOLDER = re.compile(r"^[0-9A-Za-z_-]{1,64}$")  # a manifest's set_id
_TEMP = re.compile(r"^\.(.+)\.tmp-\d+-[0-9a-f]+$")
_LOCK = re.compile(r"^\.(.+)\.lock$")
_STAMP = re.compile(r"^\.(.+)\.verified$")
_CHUNK = 1 << 20
#: An empty lock file may be one a downloader has just created and not yet locked: left alone this long (s).
_UNFILLED_GRACE = 3600.0

_log = logging.getLogger("torchrecord")
_LOGGED: set[str] = set()  # cache folders this process has logged


# -- where the cache is ---------------------------------------------------------------------------
def cache_location(cache_dir: str | os.PathLike[str] | None) -> tuple[str, bool]:
    """(the cache folder, whether it is the implicit default) for a reader's ``cache_dir``.

    ``cache_dir`` if given, else ``$TORCHRECORD_CACHE``, else ``$XDG_CACHE_HOME/torchrecord``
    (an absolute ``XDG_CACHE_HOME`` only, as the XDG spec says), else ``~/.cache/torchrecord``.
    """
    if cache_dir is not None and os.fspath(cache_dir) != "":
        return os.path.abspath(os.path.expanduser(os.fsdecode(cache_dir))), False
    chosen = os.environ.get(CACHE_ENV)
    if chosen:
        return os.path.abspath(os.path.expanduser(chosen)), False
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torchrecord"), True


def _env_number(name: str, default: float, *, integer: bool = False, none_ok: bool = False) -> float | None:
    """The number in environment variable ``name`` (``default`` if unset; ArgumentError naming it if bad)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if none_ok and text.lower() in ("none", "unlimited"):
        return None
    try:
        value: float = int(text) if integer else float(text)
    except ValueError:
        value = -1
    if not value >= 0:  # NaN too
        kind = "a whole number of bytes" if integer else "a number"
        raise ArgumentError(f"${name}={text!r}: must be {kind} >= 0{' or none' if none_ok else ''}")
    return value


def _transfer_limits() -> tuple[float, float]:
    """(grace in seconds, minimum rate in bytes a second) from the environment or the defaults."""
    grace = _env_number(GRACE_ENV, FETCH_GRACE)
    rate = _env_number(RATE_ENV, FETCH_MIN_RATE)
    if not rate:
        raise ArgumentError(f"${RATE_ENV}: must be a number of bytes a second > 0")
    return float(grace or 0.0), float(rate)


def _default_limit() -> int | None:
    limit = _env_number(LIMIT_ENV, DEFAULT_CACHE_LIMIT, integer=True, none_ok=True)
    return None if limit is None else int(limit)


# -- transports -----------------------------------------------------------------------------------
class Stream(Protocol):
    """What a transport opens: ``read(n)`` gives at most ``n`` bytes, ``b""`` at the end."""

    def read(self, n: int) -> bytes: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """How a remote file is read. ``open`` should honour ``deadline`` (seconds for the whole transfer)
    where the back end can (the cache also checks it between reads); ``size`` is the file's size
    where the manifest gives it (the cache never reads more), else None."""

    def open(self, url: str, deadline: float | None, size: int | None) -> Stream: ...


class FsspecTransport:
    """Every protocol fsspec knows (``http(s)://`` through aiohttp, ``s3://``, ``gs://``, ``file://``).

    HTTP responses are streamed in one request, with ``TIMEOUT`` to connect and between two
    reads, and aiohttp's total timeout set to the transfer's deadline.

    Args:
        storage_options: keyword arguments for the fsspec file system (for ``s3://``: s3fs's
            ``key``, ``secret``, ``endpoint_url``, ``client_kwargs``...). None: the back end's
            defaults, which for S3 are the usual environment variables (``AWS_ACCESS_KEY_ID``,
            ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``...).

    Other file systems than http(s) are fsspec's cached instances (one per protocol and options;
    fsspec starts afresh in a forked child).
    """

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        self.storage_options = dict(storage_options or {})

    def filesystem(self, url: str, deadline: float | None = None) -> tuple[Any, str]:
        """(fsspec file system, path) for ``url``."""
        try:
            import fsspec
        except ImportError as exc:
            hint = S3_HINT if url.startswith(("s3://", "s3a://")) else REMOTE_HINT
            raise MissingDependencyError(f"{url}: a remote set needs fsspec: {hint}") from exc
        options: dict[str, Any] = dict(self.storage_options)
        if _is_http(url):
            try:
                import aiohttp
            except ImportError as exc:
                raise MissingDependencyError(f"{url}: http(s) needs aiohttp: {REMOTE_HINT}") from exc
            timeout = aiohttp.ClientTimeout(total=deadline, sock_connect=TIMEOUT, sock_read=TIMEOUT)
            options["client_kwargs"] = {**options.get("client_kwargs", {}), "timeout": timeout}
            options["skip_instance_cache"] = True  # its event loop thread must not cross a fork
        try:
            fs, path = fsspec.core.url_to_fs(url, **options)
        except ImportError as exc:  # fsspec knows the protocol, its back end is not installed
            raise MissingDependencyError(f"{url}: {_backend_hint(url, exc)}") from exc
        return fs, path

    def open(self, url: str, deadline: float | None, size: int | None) -> Stream:
        fs, path = self.filesystem(url, deadline)
        if _is_http(url):
            # one streamed GET, no ranges; a size skips fsspec's HEAD request (a stream does not use it)
            stream: Stream = fs.open(path, "rb", block_size=0, size=size or 1)
        else:
            stream = fs.open(path, "rb")
        return stream


def _backend_hint(url: str, exc: ImportError) -> str:
    """The one-line install hint for the fsspec back end of ``url``'s protocol."""
    if url.startswith(("s3://", "s3a://")):
        return f"s3:// needs s3fs: {S3_HINT}"
    return f"fsspec has no back end installed for this protocol ({exc})"


def _is_http(url: str) -> bool:
    return url.startswith(("http://", "https://"))


#: What ``_transfer`` says of a transfer it stopped: more than allowed, or past its deadline.
TOO_LONG, LATE = "too long", "late"


def _transfer(
    stream: Stream, write: Callable[[bytes], Any], limit: int, deadline: float | None, grace: float, rate: float
) -> str | None:
    """Copy ``stream`` to ``write``, at most ``limit`` bytes; None, or why it stopped (TOO_LONG, LATE).

    ``deadline`` (seconds): the whole transfer's; None: the transfer must average ``rate`` bytes a
    second after ``grace`` seconds. Checked after every read (each read also has the transport's timeout).
    """
    started = time.monotonic()
    got = 0
    while True:
        piece = stream.read(min(_CHUNK, limit - got + 1))
        if not piece:
            return None
        got += len(piece)
        if got > limit:
            return TOO_LONG
        write(piece)
        allowed = deadline if deadline is not None else grace + got / rate
        if time.monotonic() - started > allowed:
            return LATE


def fetch_manifest(url: str, transport: Transport | None = None) -> tuple[str, str]:
    """(the manifest's URL, its text) for a manifest URL or a URL prefix holding ``manifest.json``.

    No manifest where shards are (a set never finalized, or a writer that stopped before it) is a
    :class:`~torchrecord.errors.NotARecordSetError` that says so, when the transport can list
    (``FsspecTransport`` can).
    """
    where = url if url.endswith(".json") else url.rstrip("/") + "/" + MANIFEST_NAME
    grace, rate = _transfer_limits()
    chunks: list[bytes] = []
    started = time.monotonic()
    try:
        stream = (transport or FsspecTransport()).open(where, None, None)
        try:
            stopped = _transfer(stream, chunks.append, MANIFEST_LIMIT, None, grace, rate)
        finally:
            with contextlib.suppress(Exception):
                stream.close()
    except FileNotFoundError:
        if _lists_shards(transport or FsspecTransport(), where.rsplit("/", 1)[0]):
            raise NotARecordSetError(
                f"{where}: not there, but shards are: the set was never finalized (or its writer stopped "
                "before publishing the manifest); run torchrecord.finalize_shards on its folder, then open it"
            ) from None
        raise FetchError(f"{where}: no manifest there (finalize the set, or check the URL)") from None
    except TorchRecordError:
        raise
    except Exception as exc:  # fsspec back ends raise many kinds
        raise FetchError(f"{where}: cannot fetch the manifest ({type(exc).__name__}: {exc})") from exc
    if stopped == TOO_LONG:
        raise FetchError(f"{where}: the server sent more than {MANIFEST_LIMIT} bytes; that is no manifest")
    if stopped == LATE:
        raise FetchError(_late_message(where, "the manifest", time.monotonic() - started))
    try:
        return where, b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{where}: the manifest is not UTF-8 text ({exc})") from None


def _lists_shards(transport: Transport, prefix: str) -> bool:
    """True when ``prefix`` (a URL folder) holds shard files; False when it does not or cannot be listed."""
    filesystem = getattr(transport, "filesystem", None)
    if filesystem is None:
        return False
    try:
        fs, path = filesystem(prefix)
        try:
            names = [str(name).rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(path, detail=False)]
        finally:
            fs.invalidate_cache(path)  # a cached file system must not remember the set without its manifest
    except Exception:  # listing is a courtesy for the message: any failure means "cannot tell"
        return False
    return any(parse_shard_name(name) for name in names)


def _late_message(url: str, what: str, elapsed: float) -> str:
    return (
        f"{url}: {what} did not arrive within its deadline ({elapsed:.0f} s; a transfer may take "
        f"${GRACE_ENV} seconds plus its size at ${RATE_ENV} bytes a second): the server is too slow or stalled"
    )


# -- the cache --------------------------------------------------------------------------------------
@dataclass
class _Owned:
    """A shard file the cache downloaded and stamped: what eviction may delete."""

    path: str
    stamp: str
    lock: str
    size: int
    last_use: float


class ShardCache:
    """The shards of one remote set in a local folder, fetched ahead, checked, evicted over a limit.

    Args:
        base: the URL prefix the manifest's shard names are relative to.
        manifest: the set's manifest.
        cache_dir: the cache folder (shared by every set and process; None: see :func:`cache_location`).
        cache_limit: bytes of shard files (and downloads in flight) to keep at most (None: the
            default, ``$TORCHRECORD_CACHE_LIMIT`` or ``DEFAULT_CACHE_LIMIT``).
        transport: how shards are read (default: :class:`FsspecTransport`).
    """

    def __init__(
        self,
        base: str,
        manifest: dict[str, Any],
        cache_dir: str | None,
        cache_limit: int | None,
        transport: Transport | None = None,
    ) -> None:
        self.base = base
        self.entries = manifest["shards"]
        for i, entry in enumerate(self.entries):
            if str(entry["name"]).startswith("."):
                raise FormatError(f"{base}: shard entry {i} of the manifest has a hidden name {entry['name']!r}")
        self.transport: Transport = transport or FsspecTransport()
        self.root, implicit = cache_location(cache_dir)
        created = _make_root(self.root)
        self.limit = cache_limit if cache_limit is not None else _default_limit()
        if implicit and created:
            warnings.warn(
                f"torchrecord keeps the shards of remote sets in {self.root} (at most "
                f"{_describe_limit(self.limit)}); choose another folder with cache_dir= or ${CACHE_ENV}, "
                f"another limit with cache_limit= or ${LIMIT_ENV}",
                TorchRecordWarning,
                stacklevel=4,
            )
        if self.root not in _LOGGED:
            _LOGGED.add(self.root)
            _log.info("torchrecord: remote shards are cached in %s (limit %s)", self.root, _describe_limit(self.limit))
        self.folder = os.path.join(self.root, str(manifest["set_id"]))
        _make_set_folder(self.folder)
        self.grace, self.min_rate = _transfer_limits()
        self.in_use: set[int] = set()
        self._plan: list[int] = []
        self._next = 0  # position in the plan of the shard being read
        self._errors: dict[int, BaseException] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        _tidy(self.folder)  # partial downloads of killed readers

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

    def deadline(self, s: int) -> float:
        """Seconds the transfer of shard ``s`` may take: the grace plus its size at the minimum rate."""
        return self.grace + int(self.entries[s]["bytes"]) / self.min_rate

    def _present(self, s: int) -> bool:
        """Shard ``s`` is in the cache, and is the very file the cache checked against the manifest."""
        entry = self.entries[s]
        return _stamped(os.path.join(self.folder, entry["name"]), entry["sha256"], int(entry["bytes"]))

    def _fetch(self, s: int) -> str:
        local = self.path_of(s)
        name = self.entries[s]["name"]
        if self._present(s):
            with contextlib.suppress(OSError):
                os.utime(_stamp_path(local), follow_symlinks=False)  # recently used
            return local
        with _Lock(_lock_path(local), note=f"{int(self.entries[s]['bytes'])}"):
            if self._present(s):  # another process (or our prefetch thread) fetched it meanwhile
                return local
            if self._adopt(s, local):  # a file here we did not stamp: used only if its SHA-256 matches
                return local
            _remove_temporaries(self.folder, name)  # ours to remove: we hold the shard's lock
            self.evict(need=int(self.entries[s]["bytes"]), keep={s})
            self._download(s, local)
        return local

    def _adopt(self, s: int, local: str) -> bool:
        """Stamp an unstamped regular file at ``local`` if it is byte for byte the manifest's shard."""
        entry = self.entries[s]
        try:
            fd = os.open(local, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False  # absent, a symlink, not ours to read
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != int(entry["bytes"]):
                return False
            h = hashlib.sha256()
            while piece := os.read(fd, _CHUNK):
                h.update(piece)
            if h.hexdigest() != entry["sha256"]:
                return False
            _write_stamp(local, entry["sha256"], st)
            return True
        finally:
            os.close(fd)

    def _download(self, s: int, local: str) -> None:
        entry, url = self.entries[s], self.url_of(s)
        expected = int(entry["bytes"])
        deadline = self.deadline(s)
        for attempt in range(1, ATTEMPTS + 1):
            temp = os.path.join(self.folder, f".{entry['name']}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
            started = time.monotonic()
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    self._receive(s, url, out, expected, deadline, started)
                    out.flush()
                    os.fsync(out.fileno())
                digest, size = file_digest(temp)
                if digest == entry["sha256"] and size == expected:
                    try:
                        os.replace(temp, local)
                    except OSError as exc:
                        raise CacheError(f"{local}: cannot put the fetched shard {s} in place ({exc})") from exc
                    _write_stamp(local, digest, os.lstat(local))
                    return
                if attempt == ATTEMPTS:
                    raise ChecksumError(
                        f"{url}: shard {s} was fetched {ATTEMPTS} times and never matched the manifest "
                        f"({size} bytes, SHA-256 {digest[:16]}...; expected {entry['bytes']} bytes, "
                        f"{entry['sha256'][:16]}...): the copy on the server is damaged or was replaced"
                    )
            finally:
                _remove(temp)

    def _receive(self, s: int, url: str, out: Any, expected: int, deadline: float, started: float) -> None:
        """Stream shard ``s`` into ``out``: at most ``expected`` bytes, within ``deadline`` seconds."""
        try:
            stream = self.transport.open(url, deadline, expected)
            try:
                stopped = _transfer(stream, out.write, expected, deadline, self.grace, self.min_rate)
            finally:
                with contextlib.suppress(Exception):
                    stream.close()
        except FileNotFoundError:
            raise FetchError(f"{url}: shard {s} is not there (the manifest lists it); check the set") from None
        except TorchRecordError:
            raise
        except Exception as exc:  # fsspec back ends raise many kinds (aiohttp, botocore, OSError)
            elapsed = time.monotonic() - started
            if elapsed >= deadline:
                raise FetchError(_late_message(url, f"shard {s}", elapsed)) from exc
            raise FetchError(f"{url}: cannot fetch shard {s} ({type(exc).__name__}: {exc}); is the server up?") from exc
        if stopped == TOO_LONG:
            raise FetchError(
                f"{url}: the server sent more than the {expected} bytes the manifest lists for shard {s}; "
                "it serves another file than the set's (check the URL and the server)"
            )
        if stopped == LATE:
            raise FetchError(_late_message(url, f"shard {s}", time.monotonic() - started))

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
    def held(self) -> int:
        """Bytes the cache holds: its stamped shards, and downloads in flight at their full size."""
        owned, in_flight = _holdings(self.root)
        return sum(o.size for o in owned) + in_flight

    def evict(self, need: int = 0, keep: set[int] | None = None) -> None:
        """Remove least recently used shards the cache downloaded until ``need`` more bytes fit.

        Shards this process is reading, or will read next, are kept; downloads in flight count
        at their full size. Nothing but stamped shards in the cache's own folders is removed.
        """
        if self.limit is None:
            return
        with self._cond:
            protect = {self.path_of(s) for s in self.in_use | (keep or set())}
            protect |= {self.path_of(s) for s in self._plan[self._next : self._next + AHEAD + 1]}
        owned, in_flight = _holdings(self.root)
        total = sum(o.size for o in owned) + in_flight
        for item in sorted(owned, key=lambda o: o.last_use):  # oldest use first
            if total + need <= self.limit:
                break
            if item.path in protect:
                continue
            if _evict_one(item):  # a process reading it keeps its mapping; the disk space returns after
                total -= item.size


def _describe_limit(limit: int | None) -> str:
    if limit is None:
        return "no limit"
    return f"{limit / (1 << 30):.3g} GiB" if limit >= 1 << 30 else f"{limit} bytes"


# -- folders ------------------------------------------------------------------------------------------
def _make_root(root: str) -> bool:
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


def _make_set_folder(folder: str) -> None:
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


def _is_own_set_folder(folder: str) -> bool:
    """A set folder the cache made: a real directory of ours, not writable by others, with the marker."""
    try:
        st = os.lstat(folder)
        mst = os.lstat(os.path.join(folder, MARKER))
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022 and stat.S_ISREG(mst.st_mode)
    )


# -- stamps: what the cache checked --------------------------------------------------------------------
def _stamp_path(local: str) -> str:
    folder, name = os.path.split(local)
    return os.path.join(folder, f".{name}.verified")


def _lock_path(local: str) -> str:
    folder, name = os.path.split(local)
    return os.path.join(folder, f".{name}.lock")


def _identity(st: os.stat_result) -> list[int]:
    """The file's identity: device, inode, size, mtime and ctime in ns (a write or a utime changes the ctime)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _write_stamp(local: str, digest: str, st: os.stat_result) -> None:
    """Record that the file at ``local`` (this very file: its identity) has SHA-256 ``digest``."""
    path = _stamp_path(local)
    _remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"sha256": digest, "identity": _identity(st)}, f)


def _read_stamp(local: str) -> dict[str, Any] | None:
    """The stamp of ``local``: a small regular file of ours (a symlink, a FIFO, another's file is none)."""
    try:
        fd = os.open(_stamp_path(local), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
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


def _stamped(local: str, digest: str | None, size: int | None) -> bool:
    """``local`` is a regular file whose stamp matches its identity (and ``digest``, ``size`` if given)."""
    try:
        st = os.lstat(local)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
        return False
    stamp = _read_stamp(local)
    if stamp is None or stamp.get("identity") != _identity(st):
        return False
    return digest is None or stamp.get("sha256") == digest


# -- locks: one download at a time; a killed downloader's files found by their lock ----------------------
#: the lock descriptors this process holds: a forked child closes its copies
_HELD: set[int] = set()


def _close_in_child() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class _Lock:
    """An exclusive ``flock`` on a shard's lock file, removed by its holder before it lets go.

    Whoever opened the file meanwhile finds it gone (or another file) once it gets the lock,
    and locks the new one instead: so no lock file stays behind a finished download. With
    ``blocking=False`` the context's value says whether the lock was taken.
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
                    raise CacheError(f"{self.path}: cannot create the shard cache's lock file ({exc})") from exc
                created = True
            except OSError as exc:
                if exc.errno == errno.ELOOP and _remove(self.path):  # a symlink where the lock goes
                    continue
                raise CacheError(f"{self.path}: cannot open the shard cache's lock file ({exc})") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.blocking else fcntl.LOCK_NB))
            except OSError as exc:
                os.close(fd)
                if not self.blocking:
                    return False  # held by a live download (or no flock here: then never guess)
                raise CacheError(f"{self.path}: cannot lock the shard cache's lock file ({exc})") from exc
            st = os.fstat(fd)
            try:
                now: os.stat_result | None = os.lstat(self.path)
            except FileNotFoundError:
                now = None
            if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                os.close(fd)  # its holder removed it while we waited: lock the one now there
                continue
            if not self.blocking and not created and st.st_size == 0 and time.time() - st.st_mtime < _UNFILLED_GRACE:
                os.close(fd)  # a downloader has just made it and is about to lock it: left alone
                return False
            self.fd = fd
            _HELD.add(fd)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()} {socket.gethostname()} {self.note}\n".encode())
            return True

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            _remove(self.path)  # while still locked
            _HELD.discard(self.fd)
            os.close(self.fd)
            self.fd = None


def _remove(path: str) -> bool:
    try:
        os.remove(path)
    except OSError:
        return False
    return True


def _remove_temporaries(folder: str, name: str) -> None:
    """Remove the partial downloads of shard ``name`` (the caller holds its lock: none is live)."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(folder):
            match = _TEMP.match(entry)
            if match and match.group(1) == name:
                _remove(os.path.join(folder, entry))


def _tidy(folder: str) -> list[str]:
    """Remove what killed readers left in a set folder: partial downloads and lock files whose lock can be taken.

    Returns the names of the shards tidied.
    """
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    names = {m.group(1) for e in entries for m in (_TEMP.match(e), _LOCK.match(e)) if m}
    tidied = []
    for name in sorted(names):
        lock = _Lock(os.path.join(folder, f".{name}.lock"), blocking=False)
        with lock as held:
            if held:
                _remove_temporaries(folder, name)
                tidied.append(name)
    return tidied


def _holdings(root: str) -> tuple[list[_Owned], int]:
    """(stamped shards, bytes of live downloads at their full size) in the cache's own set folders under ``root``.

    Partial downloads of killed readers are removed on the way. Only folders the cache marked are
    looked into, only their own entries (no recursion, no symlink followed).
    """
    owned: list[_Owned] = []
    in_flight = 0
    try:
        children = os.listdir(root)
    except OSError:
        return owned, 0
    for child in children:
        folder = os.path.join(root, child)
        if not _SET_FOLDER.match(child) or not _is_own_set_folder(folder):
            continue
        _tidy(folder)
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            stamp = _STAMP.match(entry)
            if stamp:
                local = os.path.join(folder, stamp.group(1))
                if _stamped(local, None, None):
                    with contextlib.suppress(OSError):
                        st = os.lstat(local)
                        last = os.lstat(os.path.join(folder, entry)).st_mtime
                        owned.append(_Owned(local, os.path.join(folder, entry), _lock_path(local), st.st_size, last))
                continue
            temp = _TEMP.match(entry)
            if temp:
                with contextlib.suppress(OSError):
                    size = os.lstat(os.path.join(folder, entry)).st_size
                    in_flight += max(size, _expected(os.path.join(folder, f".{temp.group(1)}.lock")))
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


def _evict_one(item: _Owned) -> bool:
    """Remove one stamped shard unless a download of it is in flight or it changed since it was listed."""
    with _Lock(item.lock, blocking=False) as held:
        if not held or not _stamped(item.path, None, None):
            return False
        removed = _remove(item.path)
        _remove(item.stamp)
        return removed
