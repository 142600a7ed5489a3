"""Lance (``pylance``, optional): the set converted once to a Lance dataset, one ``take`` per shuffled batch.

This is how Lance's documentation reads a finite set for training: a map-style
dataset over ``lance.dataset(uri)`` whose reads are ``dataset.take(indices)``
(``lance.torch.data.SafeLanceDataset``), the dataset opened lazily in each
process that reads, and DataLoader workers started with ``spawn`` (Lance is not
fork-safe; ``lance.torch.data.get_safe_loader`` forces ``spawn`` too). Here a
``BatchSampler`` over a ``RandomSampler`` hands the dataset each shuffled batch
of indices, so every batch is one ``take``; the Arrow columns it returns are
turned into the tensors every other loader produces (``features`` shaped
``[B, *shape]`` of the workload's dtype, ``int64`` labels) without a copy, as
``lance.torch`` does for fixed-size lists (the tensors view the Arrow buffers of
that take, so they are read-only).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from benchmarks.loaders.base import Epochs, Loader, worker_options
from benchmarks.workloads import WorkloadData

__all__ = ["LanceLoader", "LanceTakeDataset"]

_DATASET = "data.lance"
_COLUMNS = ["features", "label"]


def _lance() -> Any:
    """The ``lance`` module, imported on first use.

    Importing lance registers an at-fork hook that warns on every ``fork()`` of this
    process. The benchmark forks for other loaders' workers and cold epochs, which never
    call lance (Lance's own workers are spawned), so that warning is silenced here.
    """
    warnings.filterwarnings("ignore", message="lance is not fork-safe", category=UserWarning)
    import lance

    return lance


def _tensors(table: Any, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The features column of a take as one ``[B, *shape]`` tensor and the labels as ``int64``, no copies."""
    column = table.column("features")
    features = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    values = features.flatten().to_numpy(zero_copy_only=True).reshape(len(features), *shape)
    labels = table.column("label").to_numpy()
    with warnings.catch_warnings():  # Arrow buffers are read-only; lance.torch hands them out the same way
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
        return torch.from_numpy(values), torch.from_numpy(labels)


class LanceTakeDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Map-style dataset whose item is a whole batch: ``dataset[indices]`` is one ``take(indices)``.

    The Lance dataset is opened on first use in each process (never pickled to a worker).
    """

    def __init__(self, uri: str, count: int, shape: tuple[int, ...]) -> None:
        self.uri = uri
        self.count = count
        self.shape = shape
        self._opened: tuple[int, Any] | None = None

    def __len__(self) -> int:
        return self.count

    def _dataset(self) -> Any:
        pid = os.getpid()
        if self._opened is None or self._opened[0] != pid:
            self._opened = (pid, _lance().dataset(self.uri))
        return self._opened[1]

    def __getitem__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return _tensors(self._dataset().take(indices, columns=_COLUMNS), self.shape)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_opened"] = None
        return state


class _Epochs(Epochs):
    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = loader

    def epoch(self, index: int) -> Iterable[Any]:
        return self.loader


class LanceLoader(Loader):
    """A Lance dataset (``features`` a fixed-size list, ``label`` int64) read by one ``take`` per shuffled batch."""

    name = "lance"
    description = (
        "Lance dataset; map-style Dataset, one dataset.take per shuffled batch (BatchSampler), "
        "opened lazily per process, spawned workers"
    )

    def unavailable(self, data: WorkloadData) -> str | None:
        try:
            _lance()
        except ImportError:
            return "lance is not installed (pip install pylance)"
        return None

    def format_key(self, data: WorkloadData) -> str | None:
        return "lance-v1"

    def format_family(self, data: WorkloadData) -> str | None:
        return "lance"

    def build(self, data: WorkloadData, dest: Path) -> None:
        import pyarrow as pa

        width = math.prod(data.workload.shape)
        flat = pa.array(np.ascontiguousarray(data.features).reshape(-1))  # no copy for a contiguous array
        table = pa.table(
            {"features": pa.FixedSizeListArray.from_arrays(flat, width), "label": pa.array(data.labels)},
        )
        _lance().write_dataset(table, str(dest / _DATASET))

    def open(self, data: WorkloadData, path: Path | None, num_workers: int) -> Epochs:
        assert path is not None
        dataset = LanceTakeDataset(str(path / _DATASET), data.count, data.workload.shape)
        batches = BatchSampler(RandomSampler(dataset), data.batch_size, drop_last=False)
        context = {"multiprocessing_context": "spawn"} if num_workers else {}
        loader = DataLoader(dataset, sampler=batches, batch_size=None, **context, **worker_options(num_workers))
        return _Epochs(loader)
