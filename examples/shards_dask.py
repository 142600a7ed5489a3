"""Write a sharded set with Dask, one task per shard, then read it as one set.

Needs dask (``pip install 'dask[distributed]'``); it is not a dependency of
torchrecord. Every task gets the whole (map-style) dataset and writes its slice
of one global seeded permutation; the last task to finish publishes the manifest.
A task that Dask retries simply writes its shard again.

    python examples/shards_dask.py /tmp/sharded --shards 8
"""

from __future__ import annotations

import argparse

import torch
from dask import compute, delayed

import torchrecord


class Squares(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """A stand-in dataset: sample i is (a float32[16] vector of i, label i % 10); picklable."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((16,), float(i)), i % 10


def write_one(folder: str, shard: int, num_shards: int, count: int) -> int:
    """One Dask task: write shard `shard` and return its sample count."""
    rf = torchrecord.write_shard(Squares(count), folder, shard=shard, num_shards=num_shards, seed=0, progress=False)
    return len(rf)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--count", type=int, default=100_000)
    args = parser.parse_args()

    # 1. one task per shard, run by whatever scheduler Dask is configured with (here: local processes)
    tasks = [delayed(write_one)(args.folder, i, args.shards, args.count) for i in range(args.shards)]
    counts = compute(*tasks, scheduler="processes")
    print(f"wrote {args.shards} shards, {sum(counts)} samples")

    # 2. finalizing again is harmless (the last task already did): it names any missing shard
    sharded = torchrecord.finalize_shards(args.folder)
    print(f"{sharded.path}: {len(sharded)} samples in {sharded.num_shards} shards, set_id {sharded.set_id}")

    # 3. read it as one set
    ds = torchrecord.RecordDataset(args.folder, batch_size=1024)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    seen = sum(len(labels) for _, labels in loader)
    print(f"read {seen} samples in one epoch")


if __name__ == "__main__":
    main()
