"""Grouping on the write side: each sample's group key, contiguity, and the group order.

``group_by`` is a field name (a flattened name as in the schema: ``"episode"``,
``"meta.id"``, ``"1"``) or a function of the sample. Samples of one group must
arrive one after another; the pre-shuffle then permutes whole groups and keeps
the order inside each group.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np
import torch

from torchrecord._core.structure import field_names, flatten
from torchrecord.errors import ArgumentError, SampleTypeError, SampleValueError, SourceError

__all__ = ["CallableKey", "FieldKey", "GroupTracker", "describe", "group_order", "key_function", "scalar_key"]

_CONTAINERS = (tuple, list, Mapping)


def key_function(group_by: str | Callable[[Any], Any]) -> FieldKey | CallableKey:
    """The key function for a ``group_by`` argument (ValueError for anything else)."""
    if isinstance(group_by, str):
        if not group_by:
            raise ArgumentError("group_by must be a field name such as 'episode', or a function of the sample")
        return FieldKey(group_by)
    if callable(group_by):
        return CallableKey(group_by)
    raise ArgumentError(f"group_by must be a field name (str) or a function of the sample, got {group_by!r}")


def describe(group_by: str | Callable[[Any], Any]) -> str:
    """What the metadata records as ``group_by``: the field name, or ``"<callable>"``."""
    return group_by if isinstance(group_by, str) else "<callable>"


class FieldKey:
    """The value of one field of the sample as a group key (a scalar, str or bytes)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, sample: Any) -> Hashable:
        if type(sample) is dict:  # the common case: a top-level key
            leaf = sample.get(self.name, _MISSING)
            if leaf is not _MISSING and not isinstance(leaf, _CONTAINERS):
                return scalar_key(leaf, f"group_by field {self.name!r}")
        tree, leaves = flatten(sample)
        names = field_names(tree)
        try:
            position = names.index(self.name)
        except ValueError:
            close = difflib.get_close_matches(self.name, names, n=1)
            raise SampleValueError(
                f"group_by field {self.name!r}: the sample has no such field (its fields: {', '.join(names)})"
                + (f"; did you mean group_by={close[0]!r}?" if close else "; pass group_by= one of them")
            ) from None
        return scalar_key(leaves[position], f"group_by field {self.name!r}")


class CallableKey:
    """A user function's result as a group key.

    One-element tensors and arrays and NumPy scalars, also inside tuples, become
    Python scalars: they compare by value, and DataLoader workers would turn NumPy
    scalars into tensors, which hash by identity.
    """

    def __init__(self, function: Callable[[Any], Any]) -> None:
        self.function = function

    def __call__(self, sample: Any) -> Hashable:
        key = _plain(self.function(sample))
        try:
            hash(key)
        except TypeError:
            raise SampleTypeError(f"group_by returned an unhashable {type(key).__name__}: {key!r}") from None
        return key  # type: ignore[no-any-return]


def _plain(key: Any) -> Any:
    if isinstance(key, (torch.Tensor, np.ndarray, np.generic)):
        return scalar_key(key, "group_by")
    if type(key) is tuple:
        return tuple(_plain(k) for k in key)
    return key


_MISSING = object()


def scalar_key(value: Any, what: str) -> Hashable:
    """A hashable Python value for a group key leaf: scalars, one-element arrays, str, bytes."""
    if isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (torch.Tensor, np.ndarray, np.generic)):
        size = value.numel() if isinstance(value, torch.Tensor) else value.size
        if size == 1:
            return value.item()
        raise SampleTypeError(f"{what}: a group key must be one value; got shape {list(value.shape)}")
    raise SampleTypeError(f"{what}: a group key must be a scalar, str or bytes, not {type(value).__name__}")


class GroupTracker:
    """Counts the samples of each group in arrival order; refuses a group that comes back.

    ``sizes[g]`` is the number of samples of the g-th group to arrive.
    """

    def __init__(self, target: str) -> None:
        self.target = target
        self.sizes: list[int] = []
        self._key: Hashable = None
        self._first = -1  # source index of the current group's first sample
        self._last = -1  # ... and of its latest one
        self._ended: dict[Hashable, int] = {}  # key of each finished group -> its last sample's index

    def add(self, index: int, key: Hashable) -> None:
        """Count sample ``index`` (a source index) with group ``key``."""
        if self.sizes and key == self._key:
            self.sizes[-1] += 1
            self._last = index
            return
        if key in self._ended:
            raise SourceError(
                f"{self.target}: group_by: sample {index} has group key {key!r}, but that group ended at "
                f"sample {self._ended[key]} and group {self._key!r} started at sample {self._first}; the "
                "samples of one group must come one after another (sort the source by its group key)"
            )
        if self.sizes:
            self._ended[self._key] = self._last
        self._key, self._first, self._last = key, index, index
        self.sizes.append(1)


def group_order(sizes: list[int], permute: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The stored order of arrived samples and the stored group offsets.

    Returns ``(order, offsets)``: stored sample ``p`` is the ``order[p]``-th sample
    to arrive; with ``permute``, stored group ``j`` is arrived group
    ``numpy.random.default_rng(seed).permutation(G)[j]``, its samples in arrival
    order; ``offsets`` is int64[G+1].
    """
    lengths = np.asarray(sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])[:-1].astype(np.int64)
    groups = np.random.default_rng(seed).permutation(len(lengths)) if permute else np.arange(len(lengths))
    stored = lengths[groups]
    offsets = np.concatenate([[0], np.cumsum(stored)]).astype(np.int64)
    # within stored group j, sample k is arrived sample starts[groups[j]] + k
    order = np.repeat(starts[groups] - offsets[:-1], stored) + np.arange(offsets[-1], dtype=np.int64)
    return order, offsets
