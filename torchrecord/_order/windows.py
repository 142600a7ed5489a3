"""The fine order inside a reader's share: windows, each permuted on its own (pure functions).

A reader's share of an epoch (its runs of sample indices, see
``torchrecord._order.partition``) is read as one virtual sequence of positions
``0 .. total-1``. That sequence is cut into windows of ``window`` positions;
window ``j`` covers positions ``[j * window, (j + 1) * window)`` and is permuted
by a generator seeded from ``(seed, epoch, rank, worker, j)`` alone. So:

* any window can be rebuilt without reading the ones before it (resuming at
  position ``p`` reads window ``p // window`` and nothing earlier);
* every read path (the fixed-layout fast path, the generic protobuf path)
  gives the same order for the same set, because the order depends only on
  positions, never on how the records were decoded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.random  # (numpy 2 loads it on first use: 20+ ms inside the first batch)

__all__ = ["WINDOW_BYTES", "slice_runs", "window_order", "window_runs", "window_size"]

Run = tuple[int, int]

#: The samples mixed at a time are capped at this many bytes of records per reader.
WINDOW_BYTES = 64 << 20

_TAG = 0x77696E64  # "wind": keeps these streams apart from the block order's


def window_size(shuffle_buffer: int, step: int, bytes_per_sample: int | None, *, shuffle: bool = True) -> int:
    """Samples per window: ``shuffle_buffer`` capped at WINDOW_BYTES of records, never below ``step``.

    ``step`` is the batch size (or the internal batch in per-sample mode), so a
    window always holds at least one batch. ``bytes_per_sample`` comes from the
    schema (None when samples vary in size), so every read path of a set agrees
    on it.
    """
    if not shuffle:
        return max(step, min(8192, WINDOW_BYTES // max(1, bytes_per_sample or 1)))
    size = shuffle_buffer
    if bytes_per_sample:
        size = min(size, WINDOW_BYTES // max(1, bytes_per_sample))
    return max(step, size, 1)


def window_order(n: int, *, seed: int, epoch: int, rank: int, worker: int, window: int) -> np.ndarray:
    """The permutation of window ``window``'s ``n`` positions (int64, a pure function of its arguments)."""
    entropy = [seed & 0xFFFFFFFFFFFFFFFF, epoch, rank, worker, window, _TAG]
    rng = np.random.default_rng(np.random.SeedSequence(_entropy_words(entropy)))
    return rng.permutation(n)


def _entropy_words(entropy: list[int]) -> np.ndarray | list[int]:
    """The uint32 words ``SeedSequence`` makes of a list of ints (each int's words, least significant first; 0 is
    one word), so that it skips its own conversion: a quarter of the time, and the same generator. Anything
    but non-negative ints is left to ``SeedSequence`` (which refuses it)."""
    words: list[int] = []
    for value in entropy:
        if type(value) is not int or value < 0:
            return entropy
        words.append(value & 0xFFFFFFFF)
        value >>= 32
        while value:
            words.append(value & 0xFFFFFFFF)
            value >>= 32
    return np.array(words, np.uint32)


def slice_runs(runs: Sequence[Run], lo: int, hi: int) -> list[Run]:
    """The runs covering virtual positions [lo, hi) of the sequence ``runs`` describes."""
    out: list[Run] = []
    pos = 0
    for start, stop in runs:
        length = stop - start
        if pos + length > lo and pos < hi:
            a = max(lo - pos, 0)
            b = min(hi - pos, length)
            out.append((start + a, start + b))
        pos += length
        if pos >= hi:
            break
    return out


def window_runs(runs: Sequence[Run], window: int, first: int = 0) -> list[list[Run]]:
    """The runs of every window from ``first`` on: ``slice_runs`` of each window's positions, in one pass.

    ``slice_runs`` of window ``j`` scans the runs from the start; called for every window of a share of
    many runs, that is quadratic (a share of 500,000 samples in 245 windows spent 10 ms an epoch there).
    """
    out: list[list[Run]] = []
    pos = 0  # the virtual position of the run's start
    lo = first * window  # the current window's positions: [lo, lo + window)
    current: list[Run] = []
    for start, stop in runs:
        length = stop - start
        while pos + length > lo:  # the run reaches into the current window
            a = max(lo - pos, 0)
            b = min(lo + window - pos, length)
            current.append((start + a, start + b))
            if pos + length < lo + window:  # the run ends inside the window: the next run continues it
                break
            out.append(current)
            current = []
            lo += window
        pos += length
    if current:
        out.append(current)
    return out
