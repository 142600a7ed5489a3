"""DataLoader glue: does a DataLoader yield ``len(loader)`` batches, and which loader is asking.

``len(loader)`` of a DataLoader over an IterableDataset is computed from
``len(dataset)`` and the loader's batch size, in the main process, before any
worker starts. That is the moment a wrong count does harm (a schedule's total
steps, a progress bar), so the dataset looks at who asked, to warn then.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

from torchrecord._order import partition as _partition
from torchrecord.errors import ArgumentError, LoaderMismatchError

__all__ = ["LoaderGlue", "calling_loader", "loader_batches_again", "loader_problem"]


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


class LoaderGlue:
    """``len()``, ``len(loader)`` and :meth:`check_loader` of a reader dataset (a mixin of ``ReaderDataset``).

    It needs the dataset's ``batch_size``, ``loader_batch_size``, ``drop_last``, ``_per_rank()``,
    ``_where()`` and ``_refresh_distributed()``.
    """

    batch_size: int | None
    loader_batch_size: int | None
    drop_last: bool
    _per_rank: Callable[[], int]
    _where: Callable[[], str]
    _refresh_distributed: Callable[[], None]

    @staticmethod
    def _positive(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentError(f"{name} must be an integer >= 1, got {value!r}")
        return value

    def __len__(self) -> int:
        """Items this rank yields per epoch: samples, or batches when ``batch_size`` is set."""
        self._refresh_distributed()
        per_rank = self._per_rank()
        if self.batch_size is None:
            loader = calling_loader(self)
            if loader is not None:  # len(loader): say so now if the loader will yield another count
                problem = self._loader_problem(loader)
                if problem:
                    warnings.warn(problem, UserWarning, stacklevel=3)
            return per_rank
        if self.drop_last:
            return per_rank // self.batch_size
        return -(-per_rank // self.batch_size)

    def _unit(self, num_workers: int) -> int:
        """What this rank's span is cut on among ``num_workers`` readers."""
        return _partition.worker_unit(self._per_rank(), num_workers, self.batch_size, self.loader_batch_size)

    def _loader_problem(self, loader: Any) -> str | None:
        """Why ``loader`` yields another number of batches than ``len(loader)``, or None."""
        return loader_problem(
            loader,
            path=self._where(),
            batch_size=self.batch_size,
            per_rank=self._per_rank(),
            unit_of=self._unit,
            dataset=type(self).__name__,
        )

    def check_loader(self, loader: Any) -> int:
        """The number of batches ``loader`` yields from this rank per epoch; raises when it is not ``len(loader)``.

        Use it to size schedules (``OneCycleLR(total_steps=epochs * ds.check_loader(loader))``)
        or as an assertion before training. In per-sample mode the count
        differs when the DataLoader's batch size does not divide the unit
        worker shares are cut on; the error says which ``loader_batch_size``
        fixes it. In batch mode the DataLoader must not batch again.

        Raises:
            ValueError: ``loader`` does not read this dataset, or it yields
                another number of batches than ``len(loader)``, or it would break
                this dataset's order.
        """
        if getattr(loader, "dataset", None) is not self:
            raise LoaderMismatchError(
                "check_loader: the loader does not read this dataset (loader.dataset is another object)"
            )
        if getattr(loader, "in_order", True) is False and getattr(loader, "num_workers", 0) > 0:
            raise LoaderMismatchError(
                f"{self._where()}: DataLoader(in_order=False) hands items out as workers finish them, not in "
                f"{type(self).__name__}'s order: the epoch's order and a resume would not be reproducible; "
                "use in_order=True (the default)"
            )
        self._refresh_distributed()
        problem = self._loader_problem(loader)
        if problem:
            raise LoaderMismatchError(problem)
        return len(loader)

    def _loader_batch(self, batches: int, loader_batch_size: int | None) -> int | None:
        """The DataLoader batch size ``position_after`` counts samples in (None: batch mode), checked."""
        where = self._where()
        if self.batch_size is not None:
            if loader_batch_size is not None:
                raise ArgumentError(
                    f"{where}: position_after(loader_batch_size={loader_batch_size}) is for per-sample mode; this "
                    f"dataset yields whole batches (batch_size={self.batch_size}), so `batches` counts them: leave "
                    "loader_batch_size out"
                )
            return None
        if loader_batch_size is None:
            if self.loader_batch_size is None:
                raise ArgumentError(
                    f"{where}: position_after({batches}, ...) in per-sample mode needs the DataLoader's batch size "
                    "to turn batches into samples: pass position_after(step, num_workers=..., loader_batch_size=B) "
                    "with B the DataLoader's batch_size (1 if it yields single samples), or make the dataset with "
                    "loader_batch_size=B"
                )
            return self.loader_batch_size
        if self.loader_batch_size is not None and loader_batch_size != self.loader_batch_size:
            raise ArgumentError(
                f"{where}: position_after(loader_batch_size={loader_batch_size}) differs from the dataset's "
                f"loader_batch_size={self.loader_batch_size}, which cuts its worker shares: pass the DataLoader's "
                "batch_size, the same as the dataset's"
            )
        return self._positive("loader_batch_size", loader_batch_size)
