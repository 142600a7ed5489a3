"""DataLoader glue: does a DataLoader yield ``len(loader)`` batches, and which loader is asking.

``len(loader)`` of a DataLoader over an IterableDataset is computed from
``len(dataset)`` and the loader's batch size, in the main process, before any
worker starts. That is the moment a wrong count does harm (a schedule's total
steps, a progress bar), so the dataset looks at who asked, to warn then.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from torchrecord._order import partition as _partition

__all__ = ["calling_loader", "loader_batches_again", "loader_problem"]


def calling_loader(dataset: Any) -> Any:
    """The DataLoader whose ``__len__`` is calling ``dataset.__len__``, or None.

    Recognised by shape (a ``__len__`` frame whose ``self`` has ``.dataset is
    dataset``), so torch's DataLoader and torchdata's StatefulDataLoader both
    count; anything else (a plain ``len(ds)``) gives None.
    """
    try:
        frame = sys._getframe(2)  # 0: here, 1: dataset.__len__, 2: its caller
    except ValueError:  # no caller frame at all
        return None
    try:
        if frame.f_code.co_name != "__len__":
            return None
        loader = frame.f_locals.get("self")
        return loader if getattr(loader, "dataset", None) is dataset else None
    finally:
        del frame


def loader_batches_again() -> bool:
    """Is a DataLoader that collates the dataset's items into batches calling the dataset's ``__iter__``?

    A DataLoader over an IterableDataset makes ``iter(dataset)`` in its fetcher's
    ``__init__`` (in the main process, or in each worker), with ``auto_collation``
    set when the loader has a ``batch_size``: recognised by shape, as in
    :func:`calling_loader`.
    """
    try:
        frame = sys._getframe(2)  # 0: here, 1: dataset.__iter__, 2: its caller
    except ValueError:
        return False
    try:
        fetcher = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
        return bool(getattr(fetcher, "auto_collation", False)) and hasattr(fetcher, "collate_fn")
    finally:
        del frame


def loader_problem(
    loader: Any,
    *,
    path: str,
    batch_size: int | None,
    per_rank: int,
    unit_of: Callable[[int], int],
    dataset: str = "RecordDataset",
) -> str | None:
    """Why ``loader`` yields another number of batches than ``len(loader)`` from a dataset, or None.

    Args:
        loader: a DataLoader (its ``batch_size``, ``num_workers``, ``drop_last``).
        path: the record set, for the message.
        batch_size: the dataset's batch size (None: per-sample mode).
        per_rank: samples the dataset yields on this rank per epoch.
        unit_of: what the rank's span is cut on among a number of readers.
        dataset: the dataset's class name, for the fix the message gives.
    """
    size = getattr(loader, "batch_size", None)
    if batch_size is not None:
        if size is not None:
            return (
                f"{path}: the dataset yields whole batches (batch_size={batch_size}) and the DataLoader "
                f"batches them again (batch_size={size}): use DataLoader(ds, batch_size=None)"
            )
        return None
    if size is None:
        return None
    workers = int(getattr(loader, "num_workers", 0))
    drop = bool(getattr(loader, "drop_last", False))
    unit = unit_of(max(1, workers))
    actual = _partition.loader_batches(per_rank, workers, unit, size, drop)
    promised = per_rank // size if drop else -(-per_rank // size)
    if actual == promised:
        return None
    return (
        f"{path}: len(loader) is {promised}, but DataLoader(batch_size={size}, num_workers={workers}) yields "
        f"{actual} batches per epoch from this dataset: each worker batches its own share and ends on its own "
        f"short batch, and {size} does not divide the {unit} samples the shares are cut on. Fix: "
        f"{dataset}(..., loader_batch_size={size}), or a DataLoader batch size that divides {unit}"
    )
