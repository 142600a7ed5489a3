"""CRC-32 (zlib's polynomial and initial value) at the fastest speed installed.

The format's checksums are zlib's CRC-32. ISA-L (``isal``, the ``fastcrc`` extra)
computes the very same function with carry-less multiplication, 3-4x faster than
the zlib that CPython links, which is what makes ``check="checksums"`` cheap on
large records. Without it torchrecord uses :func:`zlib.crc32`; both give the same
value for every input, so files are the same either way.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["CRC32_BACKEND", "JOIN_BYTES", "crc32", "crc32_joined"]

#: Values of up to this many bytes on average are joined and checksummed in one call; longer ones one by one.
JOIN_BYTES = 2 << 10


def _fastest() -> tuple[Callable[[Any], int], str]:
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.crc32, "zlib"
    return isal_zlib.crc32, "isal"


crc32, CRC32_BACKEND = _fastest()
"""``crc32(data) -> int``: the CRC-32 of a bytes-like object; ``CRC32_BACKEND`` names its implementation."""


def crc32_joined(values: Sequence[Any], start: int = 0) -> int:
    """The CRC-32 of ``values`` (bytes-like) joined, continuing from ``start``: short values joined first and
    summed in one call, longer ones one call each (no copy)."""
    if len(values) > 1 and sum(map(len, values)) <= JOIN_BYTES * len(values):
        return crc32(b"".join(values), start)  # type: ignore[call-arg]
    crc = start
    for value in values:
        crc = crc32(value, crc)  # type: ignore[call-arg]
    return crc
