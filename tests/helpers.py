"""Test helpers shared by every reader test."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


def assert_exactly_once(seen: Iterable[int], count: int, *, pad: int = 0, drop: int = 0) -> None:
    """Every index in [0, count) appears once, except `pad` repeats or `drop` absentees."""
    counts = Counter(int(i) for i in seen)
    assert all(0 <= i < count for i in counts), "index out of range"
    repeats = sum(c - 1 for c in counts.values())
    missing = count - len(counts)
    assert repeats == pad, f"{repeats} repeated samples, expected {pad}"
    assert missing == drop, f"{missing} missing samples, expected {drop}"


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of n (negative numbers as 64-bit two's complement)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def wire_field(number: int, wire: int, payload: bytes) -> bytes:
    """One protobuf field: its tag (number, wire type) followed by the encoded payload."""
    return varint(number << 3 | wire) + payload
