"""Small remote files (a manifest, a note) fetched whole through a transport, within the deadline, retried."""

from __future__ import annotations

from torchrecord._storage.transfer import (
    LATE,
    TOO_LONG,
    late_message,
    receive,
    transfer_limits,
    with_retries,
)
from torchrecord._storage.transport import Transport
from torchrecord.errors import FetchError

__all__ = ["MANIFEST_LIMIT", "fetch_bytes"]

#: The largest manifest fetched (bytes): a server answering with more is refused.
MANIFEST_LIMIT = 256 << 20


def fetch_bytes(url: str, transport: Transport, what: str, limit: int = MANIFEST_LIMIT) -> bytes:
    """The bytes at ``url`` (at most ``limit``), fetched within the deadline, a failed transfer tried again.

    FileNotFoundError when there is nothing at ``url``; FetchError naming ``what`` otherwise.
    The deadline: the transfer must average ``$TORCHRECORD_FETCH_MIN_RATE`` after
    ``$TORCHRECORD_FETCH_GRACE`` seconds.
    """
    grace, rate = transfer_limits()
    got: list[bytes] = []

    def attempt(left: float | None) -> None:
        got.clear()
        stopped = receive(lambda: transport.open(url, None, None), got.append, limit, None, grace, rate)
        if stopped == TOO_LONG:
            raise FetchError(f"{url}: the server sent more than {limit} bytes; that is no {what}")
        if stopped == LATE:
            size = sum(map(len, got))
            raise FetchError(late_message(url, what, grace + size / rate, size))

    with_retries(url, what, None, attempt)
    return b"".join(got)
