"""examples/shards_dask.py on a dask.distributed LocalCluster of 2 worker processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engines.examples import assert_same_samples, load_example, run_example
from torchrecord import RecordFile, ShardedSet, open_set, write_record

pytest.importorskip("dask.distributed", reason="needs dask[distributed]: pip install -e '.[dask]'")

pytestmark = pytest.mark.engines

COUNT, SHARDS, SEED = 1003, 5, 7


def test_dask_sharded_write_equals_write_record(tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    output = run_example(
        "shards_dask", str(folder), "--shards", str(SHARDS), "--count", str(COUNT), "--seed", str(SEED),
        "--workers", "2", "--read-workers", "0",
    )  # fmt: skip
    assert f"wrote {SHARDS} shards, {COUNT} samples" in output
    assert f"read {COUNT} samples in one epoch" in output
    manifest = json.loads((folder / "manifest.json").read_text())
    names = [f"shard-{i:05d}-of-{SHARDS:05d}.tr" for i in range(SHARDS)]
    assert [entry["name"] for entry in manifest["shards"]] == names

    sharded = open_set(folder)
    assert isinstance(sharded, ShardedSet) and sharded.num_shards == SHARDS
    one = write_record(load_example("shards_dask").Squares(COUNT), tmp_path / "one.tr", seed=SEED, progress=False)
    # the shards in order hold write_record's pre-shuffled order, sample for sample
    assert_same_samples(sharded, RecordFile(one.path))
    assert sorted(int(sharded[i][1]) for i in range(COUNT)) == list(range(COUNT))
