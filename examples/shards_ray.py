"""Write a sharded set with Ray, one remote task per shard, then read it as one set.

Needs ray (``pip install 'ray>=2.9'``, or the ``ray`` extra); it is not a dependency
of torchrecord. Every task gets the whole (map-style) dataset and writes its
slice of one global seeded permutation, so the shards in order hold what one
``write_record`` of the dataset with the same seed holds, in the same order. The
last task to finish publishes the manifest. A task that Ray retries (a worker
died) simply writes its shard again.

    python examples/shards_ray.py /tmp/sharded --shards 8                  # a local Ray of 2 CPUs
    python examples/shards_ray.py /shared/sharded --address auto           # a running Ray cluster

On a real cluster the folder must be on a file system every node sees.
tests/engines/test_ray.py runs this script and compares the set with ``write_record``'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import ray
import torch

import torchrecord


class Squares(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """A stand-in dataset: sample i is (a float32[16] vector of i, label i); picklable."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((16,), float(i)), i


# --8<-- [start:tasks]
@ray.remote(num_cpus=1, max_retries=2)
def write_one(folder: str, shard: int, num_shards: int, count: int, seed: int) -> int:
    """One Ray task: write shard `shard` and return its sample count."""
    rf = torchrecord.write_shard(Squares(count), folder, shard=shard, num_shards=num_shards, seed=seed, progress=False)
    return len(rf)


# --8<-- [end:tasks]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--address", default=None, help="a running Ray cluster ('auto'); default: a local one")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray (one task each at a time)")
    parser.add_argument("--ray-temp-dir", default=None, help="Ray's session folder (keep it short: it holds sockets)")
    parser.add_argument("--read-workers", type=int, default=2, help="DataLoader workers of the final read")
    args = parser.parse_args(argv)

    # 1. one remote task per shard; no dashboard, no worker logs copied to this terminal
    options = {"include_dashboard": False, "log_to_driver": False}
    if args.address:
        ray.init(address=args.address, **options)
    else:
        ray.init(num_cpus=args.cpus, _temp_dir=args.ray_temp_dir, **options)
    try:
        tasks = [write_one.remote(args.folder, i, args.shards, args.count, args.seed) for i in range(args.shards)]
        counts = ray.get(tasks)
    finally:
        ray.shutdown()
    print(f"wrote {args.shards} shards, {sum(counts)} samples")

    # 2. finalizing again is harmless (the last task already did): it names any missing shard
    sharded = torchrecord.finalize_shards(args.folder)
    print(f"{sharded.path}: {len(sharded)} samples in {sharded.num_shards} shards, set_id {sharded.set_id}")

    # 3. read it as one set
    ds = torchrecord.RecordDataset(args.folder, batch_size=1024)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=args.read_workers)
    seen = sum(len(labels) for _, labels in loader)
    print(f"read {seen} samples in one epoch")


if __name__ == "__main__":
    main()
