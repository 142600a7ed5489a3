"""WebDataset: pre-shuffled tar shards, a shard shuffle and a sample shuffle buffer (optional extra)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, default_collate

from benchmarks.loaders.base import Epochs, Loader, progress, worker_options
from benchmarks.workloads import WorkloadData

__all__ = ["WebDatasetLoader"]

_SHARD_BYTES = 128 << 20
_MIN_SHARDS = 8  # enough for every worker to get shards of its own


class _Epochs(Epochs):
    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = loader

    def epoch(self, index: int) -> Iterable[Any]:
        return self.loader


class WebDatasetLoader(Loader):
    """Tar shards of ``.npy`` + ``.cls`` members, read by ``wds.WebDataset`` with a shuffle buffer.

    Batches are built in the workers with ``.batched(B, collation_fn=default_collate)``
    and passed through ``DataLoader(batch_size=None)``, as WebDataset recommends.
    """

    name = "webdataset"
    description = "tar shards (pre-shuffled), shard shuffle + shuffle buffer, batched in workers"

    def __init__(self, shuffle_buffer: int = 2048) -> None:
        self.shuffle_buffer = shuffle_buffer

    def unavailable(self, data: WorkloadData) -> str | None:
        try:
            import webdataset  # noqa: F401
        except ImportError:
            return "webdataset is not installed (pip install webdataset)"
        return None

    def format_key(self, data: WorkloadData) -> str | None:
        return "webdataset-v2"

    def format_family(self, data: WorkloadData) -> str | None:
        return "webdataset"

    def build(self, data: WorkloadData, dest: Path) -> None:
        import webdataset as wds

        shards = max(_MIN_SHARDS, math.ceil(data.total_bytes / _SHARD_BYTES))
        per_shard = -(-data.count // shards)
        order = np.random.default_rng(0).permutation(data.count).tolist()
        sink: Any = None
        try:
            for position, i in enumerate(progress(order, data.count, "writing tar shards")):
                if position % per_shard == 0:
                    if sink is not None:
                        sink.close()
                    # a fixed integer mtime: deterministic shards, and no PAX header per
                    # member (TarWriter's default float mtime adds one, slowing every read)
                    sink = wds.TarWriter(str(dest / f"shard-{position // per_shard:05d}.tar"), mtime=0)
                sink.write({"__key__": f"{i:08d}", "npy": data.features[i], "cls": int(data.labels[i])})
        finally:
            if sink is not None:
                sink.close()

    def open(self, data: WorkloadData, path: Path | None, num_workers: int) -> Epochs:
        import webdataset as wds

        assert path is not None
        urls = sorted(str(p) for p in path.glob("shard-*.tar"))
        dataset = (
            wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False)
            .shuffle(self.shuffle_buffer)
            .decode()
            .to_tuple("npy", "cls")
            .batched(data.batch_size, collation_fn=default_collate)
        )
        return _Epochs(DataLoader(dataset, batch_size=None, **worker_options(num_workers)))
