"""CRC-32 (zlib's polynomial and initial value) at the fastest speed installed.

The format's checksums are zlib's CRC-32. ISA-L (``isal``, the ``fastcrc`` extra)
computes the very same function with carry-less multiplication, 3-4x faster than
the zlib that CPython links, which is what makes ``check="checksums"`` cheap on
large records. Without it torchrecord uses :func:`zlib.crc32`; both give the same
value for every input, so files are the same either way.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

__all__ = ["CRC32_BACKEND", "crc32"]


def _fastest() -> tuple[Callable[[Any], int], str]:
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.crc32, "zlib"
    return isal_zlib.crc32, "isal"


crc32, CRC32_BACKEND = _fastest()
"""``crc32(data) -> int``: the CRC-32 of a bytes-like object; ``CRC32_BACKEND`` names its implementation."""
