"""What a DataLoader worker's batch costs to hand over, beside building it, for large WindowDataset batches.

``python -m benchmarks.handover`` (after ``python -m benchmarks.robomimic`` made
``bench-data/robomimic-200/lift.tr``): one torch thread; times

* ``WindowDataset`` (low_dim cache, batch 64, seq_length 10, both cameras) building
  batches in the main process (``num_workers=0``);
* prebuilt copies of one such batch handed over by a 2-worker DataLoader (the
  worker clones it, moves it to shared memory, the main process maps it): the
  handover alone;
* ``WindowDataset`` itself with 2 workers.

Milliseconds per batch over ``--batches`` batches after the first.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from benchmarks.robomimic import DATASET_KEYS, OBS_KEYS
from torchrecord import WindowDataset
from torchrecord._core.structure import flatten, unflatten

__all__ = ["main"]


def _nbytes(batch: Any) -> int:
    return sum(x.numel() * x.element_size() for x in flatten(batch)[1] if isinstance(x, torch.Tensor))


def _clone(batch: Any) -> Any:
    tree, leaves = flatten(batch)
    return unflatten(tree, [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves])


class _Prebuilt(IterableDataset[Any]):
    """The same batch, cloned, ``count`` times per worker."""

    def __init__(self, batch: Any, count: int) -> None:
        self.batch, self.count = batch, count

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.count):
            yield _clone(self.batch)


def _ms_per_batch(loader: Any, batches: int) -> float:
    it = iter(loader)
    next(it)  # start-up and the first batch are not counted
    start = time.perf_counter()
    n = 0
    for _ in it:
        n += 1
        if n == batches:
            break
    return (time.perf_counter() - start) / n * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", type=Path, default=Path("bench-data/robomimic-200/lift.tr"))
    parser.add_argument("--batches", type=int, default=60)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    params: dict[str, Any] = {"obs_keys": OBS_KEYS, "dataset_keys": DATASET_KEYS, "seq_length": 10}

    def windows() -> WindowDataset:
        return WindowDataset(args.path, cache="low_dim", batch_size=64, **params)

    batch = next(iter(windows()))
    built = _ms_per_batch(DataLoader(windows(), batch_size=None, num_workers=0), args.batches)
    handed = _ms_per_batch(DataLoader(_Prebuilt(batch, args.batches), batch_size=None, num_workers=2), args.batches)
    both = _ms_per_batch(DataLoader(windows(), batch_size=None, num_workers=2), args.batches)
    print(f"batch: {_nbytes(batch) / 1e6:.1f} MB (64 windows x 10 frames, obs and next_obs)")
    print(f"WindowDataset, 0 workers (built in the main process): {built:6.1f} ms a batch")
    print(f"prebuilt batches, 2 workers (handover alone):        {handed:6.1f} ms a batch")
    print(f"WindowDataset, 2 workers (built and handed over):    {both:6.1f} ms a batch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
