"""The workloads: what a sample looks like, how many there are, and their deterministic data.

Every loader reads the same samples: one features array and one int64 label per
sample, generated from a fixed seed and cached under the data directory, so a
rerun loads them instead of generating them again.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["WORKLOADS", "ArraySamples", "Workload", "WorkloadData", "load_workload"]


@dataclass(frozen=True)
class Workload:
    """One kind of dataset: sample shape and dtype, size at scale 1, batch size."""

    name: str
    count: int
    shape: tuple[int, ...]
    dtype: str
    batch_size: int

    def scaled_count(self, scale: float) -> int:
        """The number of samples at ``scale`` (at least one batch)."""
        return max(self.batch_size, round(self.count * scale))

    def describe(self, count: int) -> str:
        """``"50,000 x uint8[3,32,32] + int64 label"``."""
        dims = ",".join(str(d) for d in self.shape)
        return f"{count:,} x {self.dtype}[{dims}] + int64 label"

    @property
    def sample_bytes(self) -> int:
        """Bytes of one sample's features plus its label."""
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize + 8


WORKLOADS: dict[str, Workload] = {
    "small-images": Workload("small-images", 50_000, (3, 32, 32), "uint8", 256),
    "large-images": Workload("large-images", 8_000, (3, 224, 224), "uint8", 64),
    "tiny-vectors": Workload("tiny-vectors", 500_000, (16,), "float32", 256),
}


@dataclass
class WorkloadData:
    """A workload at a given size: its samples in memory and its cache directory."""

    workload: Workload
    count: int
    batch_size: int
    root: Path
    features: np.ndarray
    labels: np.ndarray

    @property
    def name(self) -> str:
        return self.workload.name

    @property
    def total_bytes(self) -> int:
        return int(self.features.nbytes + self.labels.nbytes)


class ArraySamples(Dataset[tuple[torch.Tensor, int]]):
    """Map-style view of a workload: sample i is (features[i] as a tensor, label i as int)."""

    def __init__(self, features: np.ndarray, labels: np.ndarray) -> None:
        self.features = features
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self.features[i]), int(self.labels[i])


def _generate(workload: Workload, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic features and labels: a pure function of (workload name, count, seed)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(workload.name.encode())]))
    shape = (count, *workload.shape)
    if workload.dtype == "uint8":
        features = rng.integers(0, 256, size=shape, dtype=np.uint8)
    else:
        features = rng.standard_normal(size=shape, dtype=np.float32).astype(workload.dtype)
    labels = rng.integers(0, 1000, size=count, dtype=np.int64)
    return features, labels


def load_workload(
    workload: Workload, scale: float, data_dir: Path, seed: int = 0, batch_size: int | None = None
) -> WorkloadData:
    """Load a workload's samples from the cache, generating and caching them on first use."""
    count = workload.scaled_count(scale)
    root = data_dir / f"{workload.name}-n{count}-seed{seed}"
    arrays = root / "arrays"
    if not (arrays / "labels.npy").exists():
        features, labels = _generate(workload, count, seed)
        tmp = root / "arrays.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        np.save(tmp / "features.npy", features)
        np.save(tmp / "labels.npy", labels)
        tmp.rename(arrays)
    else:
        features = np.load(arrays / "features.npy")
        labels = np.load(arrays / "labels.npy")
    return WorkloadData(workload, count, batch_size or workload.batch_size, root, features, labels)
