"""Protobuf's base-128 varints: one read from a record's bytes, one written, many written at once with NumPy.

Every hand-written reader and writer of the record encoding (the wire fast path,
the compressed-record expander, the fast writer, the packing estimate) uses
these, so they agree with each other and with protobuf on every length.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["encode_varint", "put_varints", "read_varint", "varint_size", "varint_sizes"]


def read_varint(data: Any, pos: int) -> tuple[int, int]:
    """The varint at ``data[pos]`` and the position after it.

    ``data``: bytes or a memoryview. IndexError past the end of ``data``;
    ValueError past protobuf's 10 bytes (the fast readers catch both and hand
    the record to the checked protobuf path, which names it).
    """
    result, shift = 0, 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def encode_varint(n: int) -> bytes:
    """The varint of ``n`` (>= 0)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def varint_size(n: int) -> int:
    """Bytes of the varint of ``n`` (>= 0)."""
    return max(1, -(-n.bit_length() // 7))


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes of each value's varint (values >= 0), as int64."""
    n = np.ones(values.shape, np.int64)
    for bits in range(7, 64, 7):
        n += values >= (1 << bits)
    return n


def put_varints(out: np.ndarray, at: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Write each value's varint at its position in the uint8 array ``out``; returns the positions after them."""
    size = varint_sizes(values)
    top = int(size.max()) if len(size) else 0
    same = bool(len(size)) and int(size.min()) == top
    for j in range(top):
        byte = (values >> (7 * j)) & 0x7F
        byte |= np.where(size > j + 1, 0x80, 0)
        if same:
            out[at + j] = byte
        else:
            keep = size > j
            out[at[keep] + j] = byte[keep]
    return np.asarray(at + size)
