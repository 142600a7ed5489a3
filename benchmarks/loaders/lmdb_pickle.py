"""What users write today: an LMDB of pickled ``(features, label)`` values, read with ``txn.get``.

The environment is opened lazily in each process that reads (never used across
``fork()``), and every sample is one transaction, one ``get`` and one
``pickle.loads``; a DataLoader(shuffle=True) picks the indices. This module
unpickles data it wrote itself; it is a benchmark baseline, not a read path of
torchrecord (which never unpickles).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lmdb
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.loaders.base import Epochs, Loader, progress, worker_options
from benchmarks.workloads import WorkloadData

__all__ = ["LmdbPickleLoader"]

_COMMIT_BYTES = 64 << 20
_ENVS: dict[str, tuple[int, lmdb.Environment]] = {}


def _key(index: int) -> bytes:
    return f"{index:08d}".encode("ascii")


def _environment(path: str) -> lmdb.Environment:
    """This process's environment of ``path``, opened on first use.

    An environment inherited through ``fork()`` is closed unused: py-lmdb refuses
    to open a path that is already open in the process.
    """
    pid = os.getpid()
    entry = _ENVS.get(path)
    if entry is not None:
        if entry[0] == pid:
            return entry[1]
        entry[1].close()
    env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False, meminit=False)
    _ENVS[path] = (pid, env)
    return env


class PickledLmdb(Dataset[tuple[torch.Tensor, int]]):
    """Map-style dataset: sample i is ``pickle.loads(txn.get(key(i)))``."""

    def __init__(self, path: str, count: int) -> None:
        self.path = path
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        env = _environment(self.path)
        with env.begin(write=False) as txn:
            value = txn.get(_key(i))
        if value is None:
            raise IndexError(f"{self.path}: no sample {i}")
        features, label = pickle.loads(value)
        return torch.from_numpy(features), label


class _Epochs(Epochs):
    def __init__(self, loader: DataLoader[Any], path: str) -> None:
        self.loader = loader
        self.path = path

    def epoch(self, index: int) -> Iterable[Any]:
        return self.loader

    def after_epoch(self) -> None:
        entry = _ENVS.pop(self.path, None)
        if entry is not None and entry[0] == os.getpid():
            entry[1].close()


class LmdbPickleLoader(Loader):
    """Hand-written LMDB map-style dataset with pickle values, DataLoader(shuffle=True, batch_size=B)."""

    name = "lmdb-pickle"
    description = "LMDB of pickle.dumps((array, label)); txn.get + pickle.loads per sample; shuffle=True"

    def format_key(self, data: WorkloadData) -> str | None:
        return "lmdb-pickle"

    def build(self, data: WorkloadData, dest: Path) -> None:
        path = dest / "data.lmdb"
        map_size = 2 * data.total_bytes + (256 << 20)
        env = lmdb.open(str(path), subdir=False, map_size=map_size, sync=False, metasync=False)
        try:
            txn, pending = env.begin(write=True), 0
            for i in progress(range(data.count), data.count, "writing LMDB"):
                value = pickle.dumps((data.features[i], int(data.labels[i])), protocol=pickle.HIGHEST_PROTOCOL)
                txn.put(_key(i), value, append=True)
                pending += len(value)
                if pending >= _COMMIT_BYTES:
                    txn.commit()
                    txn, pending = env.begin(write=True), 0
            txn.commit()
            env.sync(True)
        finally:
            env.close()
        lock = Path(str(path) + "-lock")
        if lock.exists():
            lock.unlink()

    def open(self, data: WorkloadData, path: Path | None, num_workers: int) -> Epochs:
        assert path is not None
        file = str(path / "data.lmdb")
        dataset = PickledLmdb(file, data.count)
        loader = DataLoader(dataset, batch_size=data.batch_size, shuffle=True, **worker_options(num_workers))
        return _Epochs(loader, file)
