"""Write a sharded set with Dask, one task per shard, then read it as one set.

Needs dask and distributed (``pip install 'dask[distributed]>=2024.1'``, or the
``dask`` extra); they are not dependencies of torchrecord. Every task gets the
whole (map-style) dataset and writes its slice of one global seeded permutation,
so the shards in order hold what one ``write_record`` of the dataset with the
same seed holds, in the same order. The last task to finish publishes the
manifest. A task that Dask retries simply writes its shard again.

    python examples/shards_dask.py /tmp/sharded --shards 8                 # a LocalCluster of 2 processes
    python examples/shards_dask.py /shared/sharded --address tcp://sched:8786   # a running cluster

On a real cluster the folder must be on a file system every worker sees.
tests/engines/test_dask.py runs this script and compares the set with ``write_record``'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
from dask.distributed import Client, LocalCluster

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
def write_one(folder: str, shard: int, num_shards: int, count: int, seed: int) -> int:
    """One Dask task: write shard `shard` and return its sample count."""
    rf = torchrecord.write_shard(Squares(count), folder, shard=shard, num_shards=num_shards, seed=seed, progress=False)
    return len(rf)


def write_sharded(client: Client, folder: str, shards: int, count: int, seed: int) -> list[int]:
    """Submit one task per shard to ``client`` and wait for them; the samples each shard holds."""
    futures = [
        client.submit(write_one, folder, i, shards, count, seed, key=f"torchrecord-shard-{i}", pure=False)
        for i in range(shards)
    ]
    return list(client.gather(futures))


# --8<-- [end:tasks]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--address", default=None, help="a running Dask scheduler (default: a LocalCluster)")
    parser.add_argument("--workers", type=int, default=2, help="the LocalCluster's worker processes")
    parser.add_argument("--read-workers", type=int, default=2, help="DataLoader workers of the final read")
    args = parser.parse_args(argv)

    # 1. one task per shard on the cluster (here, by default, 2 local worker processes)
    if args.address:
        client = Client(args.address)
        cluster = None
    else:
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        counts = write_sharded(client, args.folder, args.shards, args.count, args.seed)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
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
