"""Transfers within torchrecord's own deadline: a stream copied on a helper thread, the caller never waits past it.

Every transfer has a deadline: ``FETCH_GRACE`` seconds plus its size at ``FETCH_MIN_RATE`` bytes a
second (``$TORCHRECORD_FETCH_GRACE``, ``$TORCHRECORD_FETCH_MIN_RATE``). The stream is opened and read
on a helper thread; the caller waits for each piece no longer than the time left, so a server that
stalls, drips, or a storage library that retries on its own, ends at torchrecord's deadline, whatever
the library does (the helper thread is abandoned and ends with the library's own timeout).
Failures are described in words (:func:`describe_failure`) for the messages that name them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from torchrecord._storage.location import env_number
from torchrecord.errors import ArgumentError

__all__ = [
    "ATTEMPTS",
    "Damaged",
    "FETCH_GRACE",
    "FETCH_MIN_RATE",
    "GRACE_ENV",
    "LATE",
    "RATE_ENV",
    "Stream",
    "TIMEOUT",
    "TOO_LONG",
    "deadline_words",
    "describe_failure",
    "late_message",
    "receive",
    "transfer_limits",
    "with_retries",
]

#: Attempts at one shard (a failed or damaged transfer is tried again within the deadline).
ATTEMPTS = 3
#: Seconds to connect, and between two reads of one response (the storage library's own timeouts).
TIMEOUT = 30.0
#: Seconds every transfer may take besides its share at FETCH_MIN_RATE (env TORCHRECORD_FETCH_GRACE).
FETCH_GRACE = 60.0
#: Bytes a second a transfer must average, after FETCH_GRACE (env TORCHRECORD_FETCH_MIN_RATE): 64 KiB/s.
FETCH_MIN_RATE = 64 << 10
GRACE_ENV = "TORCHRECORD_FETCH_GRACE"
RATE_ENV = "TORCHRECORD_FETCH_MIN_RATE"
#: What :func:`receive` says of a transfer it stopped: more than allowed, or past its deadline.
TOO_LONG, LATE = "too long", "late"
_CHUNK = 1 << 20


class Stream(Protocol):
    """What a transport opens: ``read(n)`` gives at most ``n`` bytes, ``b""`` at the end."""

    def read(self, n: int) -> bytes: ...

    def close(self) -> None: ...


def transfer_limits() -> tuple[float, float]:
    """(grace in seconds, minimum rate in bytes a second) from the environment or the defaults."""
    grace = env_number(GRACE_ENV, FETCH_GRACE)
    rate = env_number(RATE_ENV, FETCH_MIN_RATE)
    if not rate:
        raise ArgumentError(f"${RATE_ENV}: must be a number of bytes a second > 0")
    return float(grace or 0.0), float(rate)


def deadline_words() -> str:
    """How the deadline is set, for messages: the settings that change it."""
    return (
        f"a transfer may take ${GRACE_ENV} seconds (default {FETCH_GRACE:.0f}) plus its size at "
        f"${RATE_ENV} bytes a second (default {FETCH_MIN_RATE}), every attempt included"
    )


_END = object()


def receive(
    open_stream: Callable[[], Stream],
    write: Callable[[bytes], Any],
    limit: int,
    deadline: float | None,
    grace: float,
    rate: float,
) -> str | None:
    """Open a stream and copy it to ``write``: at most ``limit`` bytes, within the deadline; None if complete.

    ``deadline`` (seconds from now) bounds the whole transfer; None: the transfer must average
    ``rate`` bytes a second after ``grace`` seconds. Returns TOO_LONG (more than ``limit`` bytes)
    or LATE (past the deadline: the helper thread is left to end on its own); the stream's own
    errors are raised here.
    """
    started = time.monotonic()
    pieces: queue.Queue[Any] = queue.Queue(maxsize=4)
    stop = threading.Event()

    def pump() -> None:
        try:
            stream = open_stream()
            try:
                while not stop.is_set():
                    piece = stream.read(_CHUNK)
                    _offer(pieces, stop, piece if piece else _END)
                    if not piece:
                        return
            finally:
                try:
                    stream.close()
                except Exception:
                    pass
        except BaseException as exc:  # handed to the caller
            _offer(pieces, stop, exc)

    threading.Thread(target=pump, name="torchrecord-transfer", daemon=True).start()
    got = 0
    try:
        while True:
            allowed = deadline if deadline is not None else grace + got / rate
            left = allowed - (time.monotonic() - started)
            try:
                item = pieces.get(timeout=max(left, 0.0)) if left > 0 else pieces.get_nowait()
            except queue.Empty:
                return LATE
            if item is _END:
                return None
            if isinstance(item, BaseException):
                raise item
            got += len(item)
            if got > limit:
                return TOO_LONG
            write(item)
    finally:
        stop.set()


def _offer(pieces: queue.Queue[Any], stop: threading.Event, item: Any) -> None:
    """Put ``item`` for the caller, unless it has stopped waiting."""
    while not stop.is_set():
        try:
            pieces.put(item, timeout=0.5)
            return
        except queue.Full:
            continue


#: Words for the kinds of failure storage libraries raise (by class name), most specific first.
_CAUSES = (
    ("ChecksumError", "the data arrived damaged (the storage library's checksum did not match)"),
    ("IncompleteRead", "the server closed the connection before the whole file arrived"),
    ("ResponseStreamingError", "the server closed the connection before the whole file arrived"),
    ("ClientPayloadError", "the server closed the connection before the whole file arrived"),
    ("ConnectionReset", "the connection was reset"),
    ("ConnectionRefused", "the server refused the connection (is it up, at this address?)"),
    ("EndpointConnectionError", "the server could not be reached (is it up, at this address?)"),
    ("ClientConnectorError", "the server could not be reached (is it up, at this address?)"),
    ("ServerDisconnected", "the server closed the connection"),
    ("Timeout", "the server stopped answering (the storage library's own timeout)"),
)


def describe_failure(exc: BaseException) -> str:
    """A failed transfer's cause in words, with the library's own message after it."""
    names = [cls.__name__ for cls in type(exc).__mro__]
    text = f"{type(exc).__name__}: {exc}"[:300]
    for key, words in _CAUSES:
        if any(key in name for name in names):
            return f"{words} ({text})"
    status = _http_status(exc)
    if status is not None:
        return f"the server answered HTTP {status} ({text})"
    return text


def _http_status(exc: BaseException | None) -> int | None:
    """The HTTP status of a failed request, where the exception (or one it was raised from) carries one."""
    seen = 0
    while exc is not None and seen < 8:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(code, int):
                return code
        status = getattr(exc, "status", None)
        if isinstance(status, int):
            return status
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


class Damaged(Exception):
    """One attempt's data did not match what was expected (raised by an attempt, to be tried again)."""


def late_message(url: str, what: str, elapsed: float, got: int | None = None, size: int | None = None) -> str:
    """The message of a transfer stopped at its deadline: what had arrived, and the settings of the deadline."""
    if got is None:
        arrived = ""
    elif got == 0:
        arrived = ": no data arrived (the server stalled, or answers too slowly)"
    else:
        of = f" of {size}" if size is not None else ""
        arrived = f": {got}{of} bytes arrived, then the server stalled or slowed down"
    return f"{url}: {what} did not arrive within its deadline ({elapsed:.0f} s){arrived}; {deadline_words()}"


def with_retries(url: str, what: str, deadline: float | None, attempt: Callable[[float | None], None]) -> None:
    """Run ``attempt(seconds left)`` until it returns, at most ATTEMPTS times, all within ``deadline`` seconds.

    ``attempt`` raises :class:`Damaged` or a storage library's error to be tried again (after a
    short pause), FileNotFoundError or a torchrecord error (past the deadline: a FetchError) to
    stop at once. The last failure becomes a FetchError (ChecksumError for damaged data)
    that names ``what``, the cause in words and the settings of the deadline.
    """
    from torchrecord.errors import ChecksumError, FetchError, TorchRecordError

    started = time.monotonic()
    cause = ""
    for number in range(1, ATTEMPTS + 1):
        left = None if deadline is None else deadline - (time.monotonic() - started)
        if left is not None and left <= 0:
            break
        try:
            attempt(left)
            return
        except (FileNotFoundError, TorchRecordError):
            raise
        except Damaged as exc:
            cause = str(exc)
            if number == ATTEMPTS:
                raise ChecksumError(
                    f"{url}: {what} was fetched {ATTEMPTS} times and never matched the manifest ({cause}): the "
                    "copy on the server is damaged or was replaced"
                ) from None
        except Exception as exc:  # storage libraries raise many kinds (aiohttp, botocore, OSError)
            cause = describe_failure(exc)
        pause = min(0.2 * 4 ** (number - 1), 5.0)
        if deadline is not None:
            pause = min(pause, max(deadline - (time.monotonic() - started), 0.0))
        time.sleep(pause)
    elapsed = time.monotonic() - started
    if not cause:
        raise FetchError(late_message(url, what, elapsed))
    raise FetchError(
        f"{url}: cannot fetch {what}: {cause}; tried {number} times in {elapsed:.0f} s ({deadline_words()})"
    )
