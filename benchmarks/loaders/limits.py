"""Reference points, not competitors: the raw LMDB read limit and the in-memory limit."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

import torchrecord
from benchmarks.loaders.base import Epochs, Loader
from benchmarks.loaders.torchrecord_loader import (
    library_samples_per_record,
    record_family,
    record_key,
    supports_samples_per_record,
    write_records,
)
from benchmarks.workloads import WorkloadData

__all__ = ["InMemoryLimit", "RawLmdbLimit"]

#: the in-memory gather read through a plain ``DataLoader(batch_size=None)`` at 0 workers
IN_MEMORY_DATALOADER = "in-memory-limit-dataloader"


class _RawEpochs(Epochs):
    """Copy every value of the records database, in stored order, into a reused batch buffer.

    A batch is ``batch_size`` values; with K samples per value it holds K times
    as many samples (fewer in the last value when K does not divide the count).
    """

    def __init__(self, path: Path, batch_size: int, samples_per_value: int, count: int, fresh: bool = False) -> None:
        self.path = path
        self.fresh = fresh
        self.batch_size = batch_size
        self.samples_per_value = samples_per_value
        self.count = count
        self._delivered = 0

    def samples_in(self, batch: Any) -> int:
        samples = min(int(batch[1]) * self.samples_per_value, self.count - self._delivered)
        self._delivered += samples
        return samples

    def epoch(self, index: int) -> Iterable[Any]:
        self._delivered = 0
        return self._batches()

    def _batches(self) -> Iterator[tuple[Any, int]]:
        return self._fresh_batches() if self.fresh else self._reused_batches()

    def _fresh_batches(self) -> Iterator[tuple[np.ndarray, int]]:
        """A new array per batch (what a loader handing batches out must do), one copy per value."""
        env, db = torchrecord.RecordFile(self.path).environment()
        size = self.batch_size
        batch: np.ndarray | None = None
        count = 0
        with env.begin(db=db, buffers=True) as txn:
            for value in txn.cursor().iternext(keys=False, values=True):
                if batch is None:
                    batch = np.empty((size, len(value)), np.uint8)  # values have a fixed size here
                batch[count] = np.frombuffer(value, np.uint8)
                count += 1
                if count == size:
                    yield batch, count
                    batch, count = None, 0
            if batch is not None and count:
                yield batch[:count], count

    def _reused_batches(self) -> Iterator[tuple[memoryview, int]]:
        env, db = torchrecord.RecordFile(self.path).environment()
        size = self.batch_size
        buffer = bytearray(1 << 16)
        view = memoryview(buffer)
        offset = count = 0
        with env.begin(db=db, buffers=True) as txn:
            for value in txn.cursor().iternext(keys=False, values=True):
                end = offset + len(value)
                if end > len(buffer):  # first batch only: values have a fixed size here
                    grown = bytearray(max(2 * len(buffer), size * len(value)))
                    grown[:offset] = view[:offset]
                    buffer, view = grown, memoryview(grown)
                view[offset:end] = value
                offset, count = end, count + 1
                if count == size:
                    yield view[:offset], count
                    offset = count = 0
            if count:
                yield view[:offset], count


class RawLmdbLimit(Loader):
    """One process walking a torchrecord file with a sequential cursor, memcpy only, no decoding.

    Args:
        fresh: copy into a new array per batch (as any loader that hands batches out
            must) instead of one reused buffer, so fresh memory is not what it skips.
        packed: read the record set of ``torchrecord-packed`` (K samples per value,
            chosen as for that loader) instead of the one-sample-per-value set;
            a batch is then ``batch_size`` values.
        samples_per_record: K as given to ``torchrecord-packed`` (``0``: as write_record chooses).
    """

    uses_workers = False
    is_limit = True

    def __init__(self, packed: bool = False, samples_per_record: int = 0, fresh: bool = False) -> None:
        self.packed = packed
        self.samples_per_record = samples_per_record
        self.fresh = fresh
        self.name = ("raw-limit-packed" if packed else "raw-limit") + ("-fresh" if fresh else "")
        what = "torchrecord-packed file, batches of B values" if packed else "torchrecord file"
        into = "a new array per batch" if fresh else "one reused batch buffer"
        self.description = f"1 process: sequential LMDB cursor over the {what}, memcpy into {into}"

    def packing(self, data: WorkloadData) -> int:
        if not self.packed:
            return 1
        return self.samples_per_record or library_samples_per_record(data)

    def unavailable(self, data: WorkloadData) -> str | None:
        if self.packed and not supports_samples_per_record():
            return "this torchrecord's write_record has no samples_per_record option"
        if self.packed and self.packing(data) < 2:
            return "samples too large to pack (K would be 1)"
        return None

    def format_key(self, data: WorkloadData) -> str | None:
        return record_key(self.packing(data))

    def format_family(self, data: WorkloadData) -> str | None:
        return record_family(self.packing(data))

    def build(self, data: WorkloadData, dest: Path) -> None:
        write_records(data, dest, self.packing(data))

    def open(self, data: WorkloadData, path: Path | None, num_workers: int) -> Epochs:
        assert path is not None
        return _RawEpochs(path / "data.tr", data.batch_size, self.packing(data), data.count, self.fresh)


class _MemoryEpochs(Epochs):
    def __init__(self, features: torch.Tensor, labels: torch.Tensor, batch_size: int) -> None:
        self.features = features
        self.labels = labels
        self.batch_size = batch_size

    def epoch(self, index: int) -> Iterable[Any]:
        return self._batches(index)

    def _batches(self, index: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(index)
        order = torch.randperm(len(self.labels), generator=generator)
        for chunk in torch.split(order, self.batch_size):
            yield self.features.index_select(0, chunk), self.labels.index_select(0, chunk)


class _Gathered(torch.utils.data.IterableDataset[Any]):
    """One epoch of the in-memory gather as an IterableDataset (for a DataLoader)."""

    def __init__(self, epochs: _MemoryEpochs, index: int) -> None:
        self.epochs, self.index = epochs, index

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.epochs._batches(self.index)


class _MemoryThroughLoader(_MemoryEpochs):
    def epoch(self, index: int) -> Iterable[Any]:
        return torch.utils.data.DataLoader(_Gathered(self, index), batch_size=None)


class InMemoryLimit(Loader):
    """All samples in one tensor, batches gathered by a random permutation: no storage at all.

    ``through_dataloader``: the same batches yielded by an IterableDataset through a plain
    ``DataLoader(batch_size=None)`` at 0 workers, the reference for a loader read that way (torch's
    iterator costs about 15 us a batch whatever the batch: its per-item profiler span and fetcher).
    """

    uses_workers = False
    is_limit = True

    def __init__(self, through_dataloader: bool = False) -> None:
        self.through_dataloader = through_dataloader
        self.name = IN_MEMORY_DATALOADER if through_dataloader else "in-memory-limit"
        self.description = "1 process: one tensor in RAM indexed by randperm batches" + (
            ", yielded through DataLoader(batch_size=None)" if through_dataloader else ""
        )

    def open(self, data: WorkloadData, path: Path | None, num_workers: int) -> Epochs:
        features = torch.from_numpy(data.features)
        labels = torch.from_numpy(data.labels)
        epochs = _MemoryThroughLoader if self.through_dataloader else _MemoryEpochs
        return epochs(features, labels, data.batch_size)
