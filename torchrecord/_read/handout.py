"""A batch as ``RecordLoader`` hands it out in batch mode: the same structure at any number of workers.

A ``DataLoader(batch_size=None)`` passes each item through ``default_convert``, which
turns NumPy arrays into tensors and, for backwards compatibility, every tuple into a
list. ``RecordLoader`` hands bundles of batches over from its workers, which
``default_convert`` never sees, so its batches came out as tuples with workers and as
lists without. :func:`as_tensors` is its one conversion instead, applied to each batch
wherever the batch is made (the main process at 0 workers, the worker before the batch
leaves it): NumPy arrays (of a ``batch_transform``) become tensors as ``default_convert``
makes them, and every container keeps its type.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data._utils.collate import default_convert

__all__ = ["as_tensors"]


def as_tensors(batch: Any) -> Any:
    """``batch`` with its NumPy arrays as tensors (what ``default_convert`` makes of them), its tuples,
    lists and dicts kept as they are; other containers as ``default_convert`` converts them.

    A batch of tensors in a tuple, list or dict (what every reader yields) is returned as it is, after one
    look at its leaves.
    """
    kind = type(batch)
    if kind is torch.Tensor:
        return batch
    if kind is tuple or kind is list:
        for leaf in batch:  # a loop, not all() over a generator: this runs once a batch
            if type(leaf) is not torch.Tensor:
                return kind(as_tensors(part) for part in batch)
        return batch
    if kind is dict:
        if all(type(leaf) is torch.Tensor for leaf in batch.values()):
            return batch
        return {key: as_tensors(part) for key, part in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple keeps its type
        return kind(*(as_tensors(part) for part in batch))
    return default_convert(batch)  # type: ignore[no-untyped-call]
