"""Where many buffers lie in memory: the address and length of each, found in one vectorized read.

The fixed-layout read path gathers samples straight from LMDB's map (``fastread.Mapped``), so it needs the
address of every record a window holds. py-lmdb hands records out as ``memoryview`` objects; asking each for
its address from Python (``np.frombuffer(view).ctypes.data``) costs 1-3 us a record, more than reading the
record. A CPython ``memoryview`` object holds a ``Py_buffer`` whose first fields are the buffer's address and,
two words on, its length. :func:`view_addresses` reads both for all views at once, through a NumPy view of the
memory that holds the view objects, at an offset found at import by probing views of known buffers
(:func:`_probe`). Where the probe does not recognise the layout (another Python implementation or version),
it falls back to asking each view. Each call also checks the first and last view the slow way, so a wrong
offset is an error, never a misread.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["address_of", "memory_at", "view_addresses", "views_at"]

_WORD = 8


def address_of(buffer: Any) -> int:
    """The address of a buffer's first byte (the slow way: one NumPy view)."""
    return int(np.frombuffer(buffer, np.uint8).ctypes.data)


class _Memory:
    """An address and a length offered to NumPy as an array (the array interface): no ctypes type per size."""

    def __init__(self, address: int, size: int, read_only: bool) -> None:
        self.__array_interface__ = {"data": (address, read_only), "shape": (size,), "typestr": "|u1", "version": 3}


def memory_at(address: int, size: int, *, read_only: bool = True) -> np.ndarray:
    """A uint8 view of ``size`` bytes of this process's memory at ``address`` (not copied).

    The caller keeps whatever owns those bytes alive while the view is used. ``read_only=False`` only drops
    NumPy's flag (for ``torch.from_numpy``, which warns on read-only arrays); it makes no memory writable.
    """
    memory: np.ndarray = np.asarray(_Memory(address, size, read_only))
    return memory


def views_at(addresses: np.ndarray, size: int) -> list[memoryview]:
    """A memoryview of ``size`` bytes at each address (not copied; the caller keeps their owner alive): slices of
    one view over the span that holds them all, the cheapest buffer to make one of a record."""
    if not len(addresses):
        return []
    base = int(addresses.min())
    memory = memory_at(base, int(addresses.max()) + size - base).data
    return [memory[at : at + size] for at in (addresses - base).tolist()]


def _words(obj: object, count: int) -> np.ndarray:
    """The first ``count`` machine words of a Python object's memory (CPython: ``id`` is its address)."""
    words: np.ndarray = memory_at(id(obj), count * _WORD).view(np.int64).copy()
    return words


def _probe() -> int | None:
    """The byte offset of ``Py_buffer.buf`` in a memoryview object, or None where it cannot be found for sure."""
    if sys.implementation.name != "cpython" or ctypes.sizeof(ctypes.c_void_p) != _WORD:
        return None
    words = (sys.getsizeof(memoryview(b"")) // _WORD) - 1
    found: set[int] = set()
    for length in (17, 40, 1 << 12):
        owner = np.arange(length, dtype=np.uint8)
        view = memoryview(owner.data)[1:]  # an address and a length that are not the owner's
        raw = _words(view, words)
        hits = [i for i in range(words - 2) if raw[i] == owner.ctypes.data + 1 and raw[i + 2] == length - 1]
        if len(hits) != 1:
            return None
        found.add(hits[0] * _WORD)
    return found.pop() if len(found) == 1 else None


_BUF_OFFSET = _probe()
_LEN_OFFSET = None if _BUF_OFFSET is None else _BUF_OFFSET + 2 * _WORD


def view_addresses(views: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The address and the length in bytes of each of ``views`` (int64 arrays).

    Vectorized for plain byte ``memoryview`` objects (what py-lmdb returns with ``buffers=True``); any other
    buffer is asked one by one. The views must stay alive while the addresses are used.
    """
    n = len(views)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if _BUF_OFFSET is None or _LEN_OFFSET is None or not all(type(v) is memoryview for v in views):
        return (
            np.fromiter((address_of(v) for v in views), np.int64, n),
            np.fromiter((len(memoryview(v).cast("B")) for v in views), np.int64, n),
        )
    ids = np.fromiter(map(id, views), np.int64, n)
    base = int(ids.min())
    span = int(ids.max()) - base + _LEN_OFFSET + _WORD
    memory = memory_at(base, span)
    words = np.ndarray((span - _WORD + 1,), np.int64, memory, 0, (1,))  # a word at every byte offset
    at = ids - base
    addresses = words[at + _BUF_OFFSET]
    lengths = words[at + _LEN_OFFSET]
    for i in {0, n - 1}:  # the offset is checked on every call: a wrong one must not read the wrong bytes
        view = views[i]
        if view.itemsize != 1 or int(addresses[i]) != address_of(view) or int(lengths[i]) != len(view):
            raise AssertionError("memoryview layout not as probed")  # an internal invariant
    return addresses, lengths
