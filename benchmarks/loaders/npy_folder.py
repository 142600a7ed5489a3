"""The conventional baseline: one ``.npy`` file per sample, a labels file, DataLoader(shuffle=True)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.loaders.base import Epochs, Loader, progress, worker_options
from benchmarks.workloads import WorkloadData

__all__ = ["NpyFolderLoader"]

_PER_DIR = 1000  # files per subdirectory, so no directory holds hundreds of thousands


def _sample_path(root: Path, index: int) -> Path:
    return root / f"{index // _PER_DIR:04d}" / f"{index:07d}.npy"


class NpyFiles(Dataset[tuple[torch.Tensor, int]]):
    """Map-style dataset over a folder of per-sample ``.npy`` files and a ``labels.npy``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.labels = np.load(root / "labels.npy")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        features = np.load(_sample_path(self.root, i))
        return torch.from_numpy(features), int(self.labels[i])


class _Epochs(Epochs):
    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = loader

    def epoch(self, index: int) -> Iterable[Any]:
        return self.loader


class NpyFolderLoader(Loader):
    """Folder of ``.npy`` files read by a map-style Dataset in DataLoader(shuffle=True, batch_size=B)."""

    name = "npy-folder"
    description = "one .npy file per sample + labels.npy; map-style Dataset, DataLoader(shuffle=True)"

    def format_key(self, data: WorkloadData) -> str | None:
        return "npy-folder"

    def build(self, data: WorkloadData, dest: Path) -> None:
        for sub in range(-(-data.count // _PER_DIR)):
            (dest / f"{sub:04d}").mkdir()
        for i in progress(range(data.count), data.count, "writing .npy files"):
            np.save(_sample_path(dest, i), data.features[i])
        np.save(dest / "labels.npy", data.labels)

    def open(self, data: WorkloadData, path: Path | None, num_workers: int) -> Epochs:
        assert path is not None
        loader = DataLoader(NpyFiles(path), batch_size=data.batch_size, shuffle=True, **worker_options(num_workers))
        return _Epochs(loader)
