"""What every benchmarked loader provides, and the cache of their on-disk formats."""

from __future__ import annotations

import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.workloads import WorkloadData

__all__ = [
    "PERSISTENT_WORKERS",
    "Epochs",
    "Loader",
    "disk_bytes",
    "ensure_built",
    "progress",
    "read_through",
    "worker_options",
]

T = TypeVar("T")


def progress(items: Iterable[T], total: int, desc: str) -> Iterable[T]:
    """``items`` with a tqdm bar (removed when done), or plain ``items`` without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, total=total, desc=f"  {desc}", unit="sample", leave=False, mininterval=1.0)


class Epochs(ABC):
    """One loader configuration, ready to produce epochs of ``(features, labels)`` batches."""

    @abstractmethod
    def epoch(self, index: int) -> Iterable[Any]:
        """The batches of epoch ``index`` (each with the labels as its second item)."""

    def samples_in(self, batch: Any) -> int:
        """How many samples ``batch`` holds (default: the length of its labels)."""
        return len(batch[1])

    def after_epoch(self) -> None:  # noqa: B027 (optional hook)
        """Release what the main process holds between epochs (not timed)."""


class Loader(ABC):
    """A competitor (or a limit): how it stores a workload and how it reads it back.

    Attributes:
        name: the key in the registry and the label in every table.
        description: one line for the report.
        uses_workers: runs once per ``num_workers`` setting; limits run once, in-process.
        is_limit: a reference point rather than a competitor.
    """

    name: str = ""
    description: str = ""
    uses_workers: bool = True
    is_limit: bool = False

    def unavailable(self, data: WorkloadData) -> str | None:
        """Why this loader cannot run on ``data`` (a missing extra, ...); ``None`` if it can."""
        return None

    def format_key(self, data: WorkloadData) -> str | None:
        """The cache directory name of its on-disk format (shared by loaders reading one format)."""
        return None

    def format_family(self, data: WorkloadData) -> str | None:
        """A prefix of :meth:`format_key` shared by outdated builds, which a new build removes."""
        return None

    def build(self, data: WorkloadData, dest: Path) -> None:  # noqa: B027 (optional hook)
        """Write ``data`` in this loader's format into the (new, empty) directory ``dest``."""

    @abstractmethod
    def open(self, data: WorkloadData, path: Path | None, num_workers: int) -> Epochs:
        """Prepare reading the format at ``path`` with ``num_workers`` DataLoader workers."""


def ensure_built(loader: Loader, data: WorkloadData, rebuild: bool = False) -> tuple[Path | None, float | None]:
    """The loader's format directory for ``data``, built now unless cached.

    Returns the directory and the build time in seconds (``None`` when cached).
    The format is built in a temporary directory and renamed into place, so an
    interrupted build is never mistaken for a finished one.
    """
    key = loader.format_key(data)
    if key is None:
        return None, None
    dest = data.root / key
    if dest.exists() and not rebuild:
        return dest, None
    family = loader.format_family(data)
    if family is not None and data.root.exists():
        for stale in data.root.glob(family + "*"):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = data.root / (key + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.mkdir(parents=True)
    start = time.perf_counter()
    loader.build(data, tmp)
    seconds = time.perf_counter() - start
    tmp.rename(dest)
    return dest, seconds


def read_through(path: Path) -> int:
    """Read every file under ``path`` once, so timing starts from a warm page cache; returns bytes read."""
    total = 0
    for file in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
        with open(file, "rb") as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    return total


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk under ``path`` (blocks, so per-file overhead counts)."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


#: DataLoaders with workers keep them across epochs (``persistent_workers=True``), as a training
#: loop would; ``python -m benchmarks.run --fresh-workers`` starts them afresh each epoch.
PERSISTENT_WORKERS = True


def worker_options(num_workers: int) -> dict[str, Any]:
    """The DataLoader keywords for ``num_workers``: the count, and whether workers persist across epochs."""
    return {"num_workers": num_workers, "persistent_workers": num_workers > 0 and PERSISTENT_WORKERS}
