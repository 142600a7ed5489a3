"""In-memory columns: nested tuples, lists and dicts of [N, ...] tensors, batched by index.

:class:`Columns` flattens the user's data once (leaves in order, a rebuild
function for the structure, a name per leaf for error messages) and gathers a
batch with one ``index_select`` per tensor leaf. A leaf that is a
:class:`SampleList` (one Python object per sample: strings, tensors of varying
shape) is gathered item by item.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from torchrecord.errors import ArgumentError, ArgumentTypeError

__all__ = ["Columns", "SampleList", "epoch_rng"]


class SampleList(list[Any]):
    """A list with one item per sample: a column of values that do not stack into one tensor.

    :func:`torchrecord.load` returns strings, bytes and fields of varying shape as
    SampleLists. :class:`torchrecord.BatchIter` and :class:`torchrecord.GroupBatchIter`
    batch a SampleList like a tensor's first dimension (a batch holds a SampleList of
    the chosen items), while a plain list in the data is a container of fields, as a
    tuple is. Wrap a per-sample Python list in ``SampleList(...)`` to batch it.

    Example:
        >>> names = SampleList(["a", "b", "c"])
        >>> names[1], len(names)
        ('b', 3)
    """


def epoch_rng(seed: int, epoch: int, stream: int) -> np.random.Generator:
    """The generator of one epoch: a pure function of (seed, epoch, stream), independent for each."""
    return np.random.default_rng(np.random.SeedSequence([seed, epoch, stream]))


Builder = Callable[[list[Any]], Any]


class Columns:
    """The leaves of ``data`` and how to rebuild its structure from a list of leaves.

    Args:
        data: a tensor with a first dimension, a :class:`SampleList`, or tuples
            (named tuples too), lists and dicts of those, nested; every leaf must
            have the same number of rows.

    Raises:
        TypeError: a leaf is neither a tensor nor a SampleList.
        ValueError: a tensor has no first dimension, the leaves differ in length,
            or there is no leaf at all.
    """

    def __init__(self, data: Any) -> None:
        leaves: list[Any] = []
        names: list[str] = []
        self.build: Builder = _compile(data, "data", leaves, names)
        if not leaves:
            raise ArgumentError("data holds no tensors: give a tensor, or a tuple or dict of [N, ...] tensors")
        self.leaves = leaves
        self.names = names
        lengths = [_rows(leaf, name) for leaf, name in zip(leaves, names)]
        for name, length in zip(names, lengths):
            if length != lengths[0]:
                raise ArgumentError(
                    f"{names[0]} has {lengths[0]} rows but {name} has {length}; every field needs the same "
                    "first dimension (one row per sample)"
                )
        self.rows = lengths[0]
        self.device = next((leaf.device for leaf in leaves if isinstance(leaf, torch.Tensor)), torch.device("cpu"))
        self._select: list[Callable[[torch.Tensor], Any]] = [
            functools.partial(torch.index_select, leaf, 0) if isinstance(leaf, torch.Tensor) else _item_getter(leaf)
            for leaf in leaves
        ]

    def index_splits(self, order: np.ndarray, sizes: int | list[int]) -> list[tuple[torch.Tensor, ...]]:
        """Per leaf, ``order`` cut into batches of ``sizes``, on the leaf's device (one copy per device)."""
        cpu = torch.from_numpy(order)
        split: dict[torch.device, tuple[torch.Tensor, ...]] = {}
        out = []
        for leaf in self.leaves:
            device = leaf.device if isinstance(leaf, torch.Tensor) else torch.device("cpu")
            if device not in split:
                split[device] = torch.split(cpu.to(device), sizes)
            out.append(split[device])
        return out

    def take(self, indices: Sequence[torch.Tensor]) -> Any:
        """The batch of rows ``indices[i]`` of each leaf i, in fresh tensors, in the data's structure."""
        return self.build([select(idx) for select, idx in zip(self._select, indices)])


def _rows(leaf: Any, name: str) -> int:
    if isinstance(leaf, torch.Tensor):
        if leaf.dim() == 0:
            raise ArgumentError(f"{name} is a 0-d tensor; every field needs a first dimension of one row per sample")
        return int(leaf.shape[0])
    return len(leaf)


def _item_getter(column: SampleList) -> Callable[[torch.Tensor], SampleList]:
    def take(idx: torch.Tensor) -> SampleList:
        return SampleList([column[i] for i in idx.tolist()])

    return take


def _compile(node: Any, name: str, leaves: list[Any], names: list[str]) -> Builder:
    """Collect the leaves of ``node`` and return a function rebuilding it from a list of leaves."""
    if isinstance(node, (torch.Tensor, SampleList)):
        leaves.append(node)
        names.append(name)
        return _leaf_at(len(leaves) - 1)
    if isinstance(node, (tuple, list)):
        kids = [_compile(x, f"{name}[{i}]", leaves, names) for i, x in enumerate(node)]
        if isinstance(node, list):
            return _container(kids, list)
        if hasattr(node, "_fields"):  # a named tuple
            return _container(kids, lambda items: type(node)(*items))
        return _container(kids, tuple)
    if isinstance(node, Mapping):
        keys = list(node)
        kids = [_compile(node[k], f"{name}[{k!r}]", leaves, names) for k in keys]
        return _container(kids, lambda items: dict(zip(keys, items)))
    raise ArgumentTypeError(
        f"{name} is a {type(node).__name__}; data leaves must be tensors of shape [N, ...] or SampleLists, "
        "in tuples, lists and dicts: convert arrays with torch.as_tensor, and wrap a list of per-sample "
        "values in torchrecord.SampleList (a plain list is a container of fields)"
    )


def _leaf_at(i: int) -> Builder:
    return lambda leaves: leaves[i]


def _container(kids: list[Builder], make: Callable[[list[Any]], Any]) -> Builder:
    return lambda leaves: make([kid(leaves) for kid in kids])
