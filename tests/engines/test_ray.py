"""examples/shards_ray.py on a local Ray of 2 CPUs, one remote task per shard."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engines.examples import assert_same_samples, load_example, run_example
from torchrecord import RecordFile, ShardedSet, open_set, write_record

pytest.importorskip("ray", reason="needs ray: pip install -e '.[ray]'")

pytestmark = pytest.mark.engines

COUNT, SHARDS, SEED = 1003, 5, 7


@pytest.fixture
def ray_temp_dir() -> Iterator[str]:
    """A short folder for Ray's session: its socket paths must stay under the 107 characters of AF_UNIX."""
    folder = tempfile.mkdtemp(prefix="ray-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_ray_sharded_write_equals_write_record(tmp_path: Path, ray_temp_dir: str) -> None:
    folder = tmp_path / "sharded"
    output = run_example(
        "shards_ray", str(folder), "--shards", str(SHARDS), "--count", str(COUNT), "--seed", str(SEED),
        "--cpus", "2", "--ray-temp-dir", ray_temp_dir, "--read-workers", "0",
        env={"RAY_USAGE_STATS_ENABLED": "0"},
    )  # fmt: skip
    assert f"wrote {SHARDS} shards, {COUNT} samples" in output
    assert f"read {COUNT} samples in one epoch" in output
    manifest = json.loads((folder / "manifest.json").read_text())
    names = [f"shard-{i:05d}-of-{SHARDS:05d}.tr" for i in range(SHARDS)]
    assert [entry["name"] for entry in manifest["shards"]] == names

    sharded = open_set(folder)
    assert isinstance(sharded, ShardedSet) and sharded.num_shards == SHARDS
    one = write_record(load_example("shards_ray").Squares(COUNT), tmp_path / "one.tr", seed=SEED, progress=False)
    # the shards in order hold write_record's pre-shuffled order, sample for sample
    assert_same_samples(sharded, RecordFile(one.path))
    assert sorted(int(sharded[i][1]) for i in range(COUNT)) == list(range(COUNT))
