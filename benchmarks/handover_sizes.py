"""How a small batch should leave a DataLoader worker: one shared-memory block, or by value through the pipe.

``python -m benchmarks.handover_sizes``: a 2-worker DataLoader (persistent
workers, one torch thread) hands over batches of one float tensor of each size
plus two small [32, 16] tensors (a stream batch's mask and ids), packed either
as views of one shared storage (``torchrecord._read.ipc.one_storage``) or marked to
pickle by value (``torchrecord._read.ipc.by_value``). Milliseconds per batch, median
of 3 epochs; ``_ipc.BY_VALUE_LIMIT`` sits where the two cross.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from torchrecord._read.ipc import BY_VALUE_LIMIT, by_value, one_storage

__all__ = ["main"]


class _Batches(IterableDataset[Any]):
    def __init__(self, size: int, count: int, mode: str) -> None:
        self.size, self.count, self.mode = size, count, mode

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        assert info is not None
        base = {
            "data": torch.ones(self.size // 4),
            "mask": torch.zeros(32, 16, dtype=torch.bool),
            "sequence": torch.zeros(32, 16, dtype=torch.int64),
        }
        for _ in range(info.id, self.count, info.num_workers):
            batch = {key: value.clone() for key, value in base.items()}  # a fresh batch, as a reader makes one
            yield by_value(batch) if self.mode == "by value" else one_storage(batch)


def _ms_per_batch(size: int, mode: str, count: int) -> float:
    loader = DataLoader(_Batches(size, count, mode), batch_size=None, num_workers=2, persistent_workers=True)
    list(loader)  # start the workers
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in loader:
            pass
        times.append(time.perf_counter() - start)
    return statistics.median(times) / count * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-kb", default="80,256,1024,2048,4096")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"BY_VALUE_LIMIT = {BY_VALUE_LIMIT >> 10} KB")
    for kb in [int(x) for x in args.sizes_kb.split(",")]:
        size = kb << 10
        count = min(400, max(100, (200 << 20) // size))
        shared, value = (_ms_per_batch(size, mode, count) for mode in ("one shared block", "by value"))
        print(
            f"{kb:>6} KB: one shared block {shared:.3f} ms a batch, by value {value:.3f} ms a batch "
            f"({value / shared:.2f}x)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
