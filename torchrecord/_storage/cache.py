"""ShardCache: a remote set's shards fetched through a transport into a local cache, ahead of use.

A shard is downloaded to a hidden temporary (``_storage/temps.py``), read no further than the
manifest's size (more is a :class:`~torchrecord.errors.FetchError`), checked against the
manifest's SHA-256 and size, renamed into place and stamped (``_storage/stamps.py``). A failed
or damaged transfer is tried again, up to ``ATTEMPTS`` times, all within the shard's deadline
(``_storage/transfer.py``); a shard that was replaced on the server after the set was finalized
(the checksum stored with the object differs from the manifest's) is named at once. One download
of a shard at a time per machine (``_storage/locks.py``); least recently used shards are evicted
over the limit (``_storage/eviction.py``), in folders the cache made (``_storage/owner.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from torchrecord._storage import eviction
from torchrecord._storage.location import CACHE_ENV, LIMIT_ENV, cache_location, default_limit, describe_limit
from torchrecord._storage.locks import Lock, remove
from torchrecord._storage.owner import make_root, make_set_folder
from torchrecord._storage.stamps import adopt, file_digest, lock_path, stamp_path, stamped, write_stamp
from torchrecord._storage.temps import temp_name
from torchrecord._storage.transfer import LATE, TOO_LONG, Damaged, late_message, receive, transfer_limits, with_retries
from torchrecord._storage.transport import Storage, Transport
from torchrecord.errors import CacheError, ChecksumError, FetchError, FormatError, TorchRecordWarning

__all__ = ["AHEAD", "SHA256_KEY", "ShardCache"]

#: Shards of the plan fetched ahead of the one being read.
AHEAD = 2
#: The object metadata key under which torchrecord's writer stores a shard's SHA-256.
SHA256_KEY = "torchrecord-sha256"

_log = logging.getLogger("torchrecord")
_LOGGED: set[str] = set()  # cache folders this process has logged


class ShardCache:
    """The shards of one remote set in a local folder, fetched ahead, checked, evicted over a limit.

    Args:
        base: the URL prefix the manifest's shard names are relative to.
        manifest: the set's manifest.
        cache_dir: the cache folder (shared by every set and process; None: see :func:`cache_location`).
        cache_limit: bytes of shard files (and downloads in flight) to keep at most (None: the
            default, ``$TORCHRECORD_CACHE_LIMIT`` or ``DEFAULT_CACHE_LIMIT``).
        transport: how shards are read (a :class:`Transport`; a :class:`Storage` also tells a
            shard replaced on the server at once).
    """

    def __init__(
        self, base: str, manifest: dict[str, Any], cache_dir: str | None, cache_limit: int | None, transport: Transport
    ) -> None:
        self.base = base
        self.entries = manifest["shards"]
        for i, entry in enumerate(self.entries):
            if str(entry["name"]).startswith("."):
                raise FormatError(f"{base}: shard entry {i} of the manifest has a hidden name {entry['name']!r}")
        self.transport = transport
        self.root, implicit = cache_location(cache_dir)
        created = make_root(self.root)
        self.limit = cache_limit if cache_limit is not None else default_limit()
        if implicit and created:
            warnings.warn(
                f"torchrecord keeps the shards of remote sets in {self.root} (at most "
                f"{describe_limit(self.limit)}); choose another folder with cache_dir= or ${CACHE_ENV}, "
                f"another limit with cache_limit= or ${LIMIT_ENV}",
                TorchRecordWarning,
                stacklevel=4,
            )
        if self.root not in _LOGGED:
            _LOGGED.add(self.root)
            _log.info("torchrecord: remote shards are cached in %s (limit %s)", self.root, describe_limit(self.limit))
        self.folder = os.path.join(self.root, str(manifest["set_id"]))
        make_set_folder(self.folder)
        self.grace, self.min_rate = transfer_limits()
        self.in_use: set[int] = set()
        self._plan: list[int] = []
        self._next = 0  # position in the plan of the shard being read
        self._errors: dict[int, BaseException] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        eviction.tidy(self.folder)  # partial downloads of killed readers

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
        """Seconds the fetch of shard ``s`` may take, every attempt included: the grace plus its size at the rate."""
        return self.grace + int(self.entries[s]["bytes"]) / self.min_rate

    def _present(self, s: int) -> bool:
        """Shard ``s`` is in the cache, and is the very file the cache checked against the manifest."""
        entry = self.entries[s]
        return stamped(os.path.join(self.folder, entry["name"]), entry["sha256"], int(entry["bytes"]))

    def _fetch(self, s: int) -> str:
        local = self.path_of(s)
        entry = self.entries[s]
        if self._present(s):
            with contextlib.suppress(OSError):
                os.utime(stamp_path(local), follow_symlinks=False)  # recently used
            return local
        with Lock(lock_path(local), note=f"{int(entry['bytes'])}"):
            if self._present(s):  # another process (or our prefetch thread) fetched it meanwhile
                return local
            if adopt(local, entry["sha256"], int(entry["bytes"])):  # a file here we did not stamp, if it matches
                return local
            eviction.remove_temporaries(self.folder, entry["name"])  # ours to remove: we hold the shard's lock
            self.evict(need=int(entry["bytes"]), keep={s})
            self._download(s, local)
        return local

    def _download(self, s: int, local: str) -> None:
        entry, url = self.entries[s], self.url_of(s)
        expected = int(entry["bytes"])

        def attempt(left: float | None) -> None:
            temp = os.path.join(self.folder, temp_name(entry["name"]))
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    self._receive(s, url, out, expected, left)
                    out.flush()
                    os.fsync(out.fileno())
                digest, size = file_digest(temp)
                if digest != entry["sha256"] or size != expected:
                    self._check_replaced(s, url)
                    raise Damaged(
                        f"{size} bytes, SHA-256 {digest[:16]}...; expected {expected} bytes, {entry['sha256'][:16]}..."
                    )
                try:
                    os.replace(temp, local)
                except OSError as exc:
                    raise CacheError(f"{local}: cannot put the fetched shard {s} in place ({exc})") from exc
                write_stamp(local, digest, os.lstat(local))
            finally:
                remove(temp)

        with_retries(url, f"shard {s}", self.deadline(s), attempt)

    def _receive(self, s: int, url: str, out: Any, expected: int, left: float | None) -> None:
        """Stream shard ``s`` into ``out``: at most ``expected`` bytes, within ``left`` seconds."""
        deadline = self.deadline(s) if left is None else left
        try:
            stopped = receive(
                lambda: self.transport.open(url, deadline, expected), out.write, expected, deadline, 0.0, 1.0
            )
        except FileNotFoundError:
            raise FetchError(f"{url}: shard {s} is not there (the manifest lists it); check the set") from None
        if stopped == TOO_LONG:
            raise FetchError(
                f"{url}: the server sent more than the {expected} bytes the manifest lists for shard {s}; "
                "it serves another file than the set's (check the URL and the server)"
            )
        if stopped == LATE:
            raise FetchError(late_message(url, f"shard {s}", self.deadline(s), out.tell(), expected))

    def _check_replaced(self, s: int, url: str) -> None:
        """ChecksumError at once when the server's object says it is another shard body than the manifest's."""
        if not isinstance(self.transport, Storage):
            return
        try:
            info = self.transport.stat(url)
        except Exception:
            return
        recorded = info.metadata.get(SHA256_KEY) if info is not None else None
        if recorded and recorded != self.entries[s]["sha256"]:
            raise ChecksumError(
                f"{url}: shard {s} on the server is not the one the manifest lists (its writer recorded SHA-256 "
                f"{recorded[:16]}..., the manifest {self.entries[s]['sha256'][:16]}...): it was written again after "
                "the set was finalized. Open the set again once it is finalized again (finalize_shards), or "
                "write that shard again with the set's settings"
            )

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
        owned, in_flight = eviction.holdings(self.root)
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
        owned, in_flight = eviction.holdings(self.root)
        total = sum(o.size for o in owned) + in_flight
        for item in sorted(owned, key=lambda o: o.last_use):  # oldest use first
            if total + need <= self.limit:
                break
            if item.path in protect:
                continue
            if eviction.evict_one(item):  # a process reading it keeps its mapping; the disk space returns after
                total -= item.size
