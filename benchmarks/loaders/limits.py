"""Reference points, not competitors: the raw LMDB read limit and the in-memory limit."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

import torchrecord
from benchmarks.loaders.base import Epochs, Loader
from benchmarks.loaders.torchrecord_loader import record_key, write_records
from benchmarks.workloads import WorkloadData

__all__ = ["InMemoryLimit", "RawLmdbLimit"]


class _RawEpochs(Epochs):
    """Copy every value of the records database, in stored order, into a reused batch buffer."""

    def __init__(self, path: Path, batch_size: int) -> None:
        self.path = path
        self.batch_size = batch_size

    def samples_in(self, batch: Any) -> int:
        return int(batch[1])

    def epoch(self, index: int) -> Iterable[Any]:
        return self._batches()

    def _batches(self) -> Iterator[tuple[memoryview, int]]:
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
    """One process walking the torchrecord file with a sequential cursor, memcpy only, no decoding."""

    name = "raw-limit"
    description = "1 process: sequential LMDB cursor over the torchrecord file, memcpy into batch buffers"
    uses_workers = False
    is_limit = True

    def format_key(self, data: WorkloadData) -> str | None:
        return record_key(1)

    def build(self, data: WorkloadData, dest: Path) -> None:
        write_records(data, dest)

    def open(self, data: WorkloadData, path: Path | None, num_workers: int) -> Epochs:
        assert path is not None
        return _RawEpochs(path / "data.tr", data.batch_size)


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
            yield self.features[chunk], self.labels[chunk]


class InMemoryLimit(Loader):
    """All samples in one tensor, batches gathered by a random permutation: no storage at all."""

    name = "in-memory-limit"
    description = "1 process: one tensor in RAM indexed by randperm batches"
    uses_workers = False
    is_limit = True

    def open(self, data: WorkloadData, path: Path | None, num_workers: int) -> Epochs:
        features = torch.from_numpy(data.features)
        labels = torch.from_numpy(data.labels)
        return _MemoryEpochs(features, labels, data.batch_size)
