"""A subset of a record set's samples: a range, a slice, an index array or a mask, resolved once.

A :class:`Subset` maps *positions* ``0 .. len-1`` to sample indices of the
set. Readers work in position space (sharding, block order, windows and
resume all see a set of ``len(subset)`` samples) and map the runs of
positions they visit to runs of sample indices only to read them
(:meth:`Subset.runs`). A subset is identified by a digest of its indices, so a
resume state saved on one subset is refused by another.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from torchrecord.errors import ArgumentError, ArgumentTypeError, IndexOutOfRangeError

__all__ = ["Subset", "position", "resolve"]

Run = tuple[int, int]

_HOW = (
    "pass a range, a slice, a sequence or array of integer sample indices, or a boolean mask with one entry per sample"
)


class Subset:
    """Positions of a selection mapped to the sample indices of a set of ``count`` samples.

    Args:
        indices: the selected sample indices in position order: a ``range`` (kept
            as one) or an int64 array of distinct indices in ``[0, count)``.
        count: samples in the whole set.
    """

    def __init__(self, indices: range | np.ndarray, count: int) -> None:
        self.indices = indices
        self.count = count

    def __len__(self) -> int:
        return len(self.indices)

    def __repr__(self) -> str:
        return f"Subset({self.describe()} of {self.count})"

    def describe(self) -> str:
        """A short description: the range, or how many indices."""
        if isinstance(self.indices, range):
            return repr(self.indices)
        return f"{len(self.indices)} indices"

    @property
    def digest(self) -> str:
        """An identity of the selected indices, in order (equal selections give equal digests)."""
        h = hashlib.sha256()
        if isinstance(self.indices, range):
            r = self.indices
            h.update(b"range" + struct.pack(">qqq", r[0] if len(r) else 0, len(r), r.step if len(r) > 1 else 1))
        else:
            h.update(b"index" + self.indices.astype(">i8").tobytes())
        return "sha256:" + h.hexdigest()[:32]

    def take(self, positions: np.ndarray) -> np.ndarray:
        """The sample indices at ``positions`` (int64, each in ``[0, len)``)."""
        if isinstance(self.indices, range):
            out: np.ndarray = self.indices.start + positions.astype(np.int64) * self.indices.step
            return out
        return np.asarray(self.indices[positions], dtype=np.int64)

    def runs(self, position_runs: Sequence[Run]) -> list[Run]:
        """The runs of consecutive sample indices that runs of positions select, in order."""
        out: list[Run] = []
        r = self.indices
        for a, b in position_runs:
            if b <= a:
                continue
            if isinstance(r, range) and r.step == 1:
                out.append((r.start + a, r.start + b))
                continue
            idx = self.take(np.arange(a, b, dtype=np.int64))
            bounds = np.concatenate(([0], np.flatnonzero(np.diff(idx) != 1) + 1, [len(idx)]))
            out.extend((int(idx[lo]), int(idx[hi - 1]) + 1) for lo, hi in itertools.pairwise(bounds))
        return out


def resolve(selection: Any, count: int, path: str) -> Subset:
    """Check a user's selection against a set of ``count`` samples and make it a :class:`Subset`.

    Slices are clipped as Python clips them; ranges and index arrays must lie
    within the set (negative indices in arrays count from the end); a boolean
    mask needs one entry per sample. Every sample may be selected once.

    Raises:
        TypeError: the selection is not one of those kinds.
        IndexError: an index is outside the set.
        ValueError: an index is selected twice, or a mask has the wrong length.
    """
    if isinstance(selection, Subset):
        if selection.count != count:
            raise ArgumentError(
                f"{path}: the subset was made for a set of {selection.count} samples, this one has {count}"
            )
        return selection
    if isinstance(selection, slice):
        return Subset(range(*selection.indices(count)), count)
    if isinstance(selection, range):
        ends = (selection[0], selection[-1]) if len(selection) else (0, 0)
        if len(selection) and (min(ends) < 0 or max(ends) >= count):
            raise IndexOutOfRangeError(
                f"{path}: subset {selection!r} reaches outside the set's {count} samples (indices 0 to {count - 1})"
            )
        return Subset(_canonical_range(selection), count)
    if isinstance(selection, (str, bytes)) or not hasattr(selection, "__len__"):
        raise ArgumentTypeError(f"{path}: subset {_short(selection)} is not a selection of samples; {_HOW}")
    if hasattr(selection, "detach"):  # a torch tensor
        selection = selection.detach().cpu().numpy()
    arr = np.asarray(selection)
    if arr.ndim != 1:
        raise ArgumentTypeError(f"{path}: subset has shape {arr.shape}, not one index per selected sample; {_HOW}")
    if arr.dtype == np.bool_:
        if len(arr) != count:
            raise ArgumentError(f"{path}: a boolean subset mask needs {count} entries (one per sample), got {len(arr)}")
        arr = np.flatnonzero(arr)
    elif len(arr) == 0:
        arr = np.zeros(0, np.int64)
    elif not np.issubdtype(arr.dtype, np.integer):
        raise ArgumentTypeError(f"{path}: subset holds {arr.dtype} values, not integer sample indices; {_HOW}")
    arr = arr.astype(np.int64)
    arr = np.where(arr < 0, arr + count, arr)
    bad = np.flatnonzero((arr < 0) | (arr >= count))
    if len(bad):
        raise IndexOutOfRangeError(
            f"{path}: subset index {int(np.asarray(selection)[bad[0]])} (at position {int(bad[0])}) is outside the "
            f"set's {count} samples"
        )
    if len(np.unique(arr)) != len(arr):
        values, counts = np.unique(arr, return_counts=True)
        raise ArgumentError(
            f"{path}: subset selects sample {int(values[counts > 1][0])} more than once; a subset selects each "
            "sample at most once (repeat samples with a sampler instead)"
        )
    steps = np.diff(arr)
    if len(arr) == 1 or (len(arr) > 1 and steps[0] != 0 and bool((steps == steps[0]).all())):
        step = int(steps[0]) if len(arr) > 1 else 1
        return Subset(_canonical_range(range(int(arr[0]), int(arr[-1]) + (1 if step > 0 else -1), step)), count)
    if len(arr) == 0:
        return Subset(range(0), count)
    arr.setflags(write=False)
    return Subset(arr, count)


def _canonical_range(r: range) -> range:
    """The same selection with a normalised stop and step (range(0, 10, 3) == range(0, 11, 3))."""
    if len(r) == 0:
        return range(0)
    step = r.step if len(r) > 1 else 1
    return range(r[0], r[0] + len(r) * step, step)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def position(index: Any, length: int, path: str) -> int:
    """A single sample index as a position in ``[0, length)`` (negative counts from the end).

    Raises TypeError for anything that is not an integer (floats, strings and
    bools included, which ``int()`` would silently accept) and IndexError when
    out of range.
    """
    if isinstance(index, (bool, np.bool_)) or str(getattr(index, "dtype", "")) in ("bool", "torch.bool"):
        raise ArgumentTypeError(f"{path}: sample index {index!r} is a bool, not an integer")
    try:
        i = operator.index(index)
    except TypeError:
        raise ArgumentTypeError(
            f"{path}: sample index {_short(index)} ({type(index).__name__}) is not an integer; index with an int, "
            "a slice or a list of ints"
        ) from None
    p = i + length if i < 0 else i
    if not 0 <= p < length:
        raise IndexOutOfRangeError(f"sample index {i} out of range for {path} with {length} samples")
    return p
