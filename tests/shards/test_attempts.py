"""Write attempts: a finalized set holds one attempt's shards, on a local folder and on S3 (moto on 127.0.0.1).

Each scenario ends in the old set, the new set, or a clear error naming the shards that do not
belong, never in a set that reads as a mix of two data versions. Writers are killed for real
(SIGKILL, in child processes).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.shards.faults import BUCKET, ROOT, Versioned, start_writer, versions, wait_for
from torchrecord import RecordDataset, finalize_shards, open_set, write_shard
from torchrecord.errors import (
    ArgumentError,
    ChecksumError,
    FormatError,
    IncompleteRecordSetError,
    NotARecordSetError,
    RecordExistsError,
    TorchRecordError,
)

N = 2
COUNT = 24
OLD_SET = Path(__file__).parent / "data" / "set-without-attempts"


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The set's folder: a local folder, or a prefix on the moto server (TMPDIR and the cache under tmp_path)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("TORCHRECORD_CACHE", str(tmp_path / "cache"))
    if request.param == "local":
        return str(tmp_path / "set")
    request.getfixturevalue("s3")
    return f"s3://{BUCKET}/set"


def _write(where: str, shard: int, version: int, **kw: Any) -> Any:
    return write_shard(Versioned(COUNT, version), where, shard=shard, num_shards=N, seed=1, progress=False, **kw)


def _read(where: str, cache: str | None = None) -> set[int] | TorchRecordError:
    """The data versions a fresh reader of the set reads, or the torchrecord error it gets."""
    try:
        return set(versions(open_set(where, cache_dir=cache)))
    except TorchRecordError as exc:
        return exc


def _names(where: str, s3: Any = None) -> list[str]:
    if where.startswith("s3://"):
        prefix = where.split("/", 3)[3]
        listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
        return sorted(o["Key"].rsplit("/", 1)[-1] for o in listing)
    return sorted(os.listdir(where)) if os.path.isdir(where) else []


def _writing(where: str, child: subprocess.Popen[bytes]) -> bool:
    """The child writer has started writing its shard (its temporary or staging copy exists)."""
    if where.startswith("s3://"):
        root = os.path.join(tempfile.gettempdir(), f"torchrecord-staging-{os.geteuid()}")
        return os.path.isdir(root) and any(e.startswith(f"shard-{child.pid}-") for e in os.listdir(root))
    return os.path.isdir(where) and any(".tmp-" in e and f"-{child.pid}-" in e for e in os.listdir(where))


def _kill_while_writing(where: str, child: subprocess.Popen[bytes]) -> None:
    wait_for(lambda: _writing(where, child) or child.poll() is not None, what="the writer to start writing")
    child.send_signal(signal.SIGKILL)
    assert child.wait(60) == -signal.SIGKILL


def _staged(where: str) -> list[str]:
    root = os.path.join(tempfile.gettempdir(), f"torchrecord-staging-{os.geteuid()}")
    return sorted(e for e in os.listdir(root) if not e.endswith(".lock")) if os.path.isdir(root) else []


def _killed_rewrite_round(where: str, tmp_path: Path, round_: int, s3: Any) -> None:
    """A finalized set of version ``round_`` rewritten as ``round_ + 1``; writer 0 is killed while it writes."""
    old, new = round_, round_ + 1
    for i in range(N):
        _write(where, i, old, overwrite=True)
    assert _read(where) == {old}
    killed = start_writer(where, 0, N, f"Slow({COUNT}, {new})", seed=1, overwrite=True)
    _kill_while_writing(where, killed)
    if where.startswith("s3://"):
        assert len(_staged(where)) == 1  # the killed writer's local copy, until the next writer starts
    _write(where, 1, new, overwrite=True)  # completes; it would finalize, but shard 0 is of the old attempt
    assert _staged(where) == []  # that writer removed it
    got = _read(where, str(tmp_path / f"fresh-{round_}"))
    assert isinstance(got, (FormatError, ChecksumError)), got  # the old manifest refuses the rewritten shard 1
    assert "shard 1" in str(got)
    with pytest.raises(IncompleteRecordSetError, match=r"another write attempt.*shard 0"):
        finalize_shards(where)
    _write(where, 0, new, overwrite=True)  # the rerun of writer 0: it finalizes the new set
    assert _read(where) == {new}
    assert _staged(where) == []
    assert not [name for name in _names(where, s3) if ".tmp-" in name]  # its temporaries are gone


def test_a_killed_rewrite_never_reads_as_a_mix(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    _killed_rewrite_round(where, tmp_path, 0, _client(request, where))


@pytest.mark.slow
def test_a_killed_rewrite_never_reads_as_a_mix_in_many_rounds(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    for round_ in range(6):
        _killed_rewrite_round(where, tmp_path, round_ * 2, _client(request, where))


def _client(request: pytest.FixtureRequest, where: str) -> Any:
    return request.getfixturevalue("s3") if where.startswith("s3://") else None


def test_a_rewrite_of_one_shard_is_not_finalized_with_the_old_ones(where: str) -> None:
    for i in range(N):
        _write(where, i, 0)
    _write(where, 1, 1, overwrite=True)  # last to finish, it tries to finalize: shard 0 is of the old set
    with pytest.raises(IncompleteRecordSetError, match=r"another write attempt.*shard 0 \(plan-"):
        finalize_shards(where)
    _write(where, 0, 1, overwrite=True)
    assert _read(where) == {1}


def test_an_earlier_unfinished_attempt_is_not_mixed_in(where: str) -> None:
    _write(where, 0, 0, attempt="run-1")  # run 1 wrote shard 0 only, and stopped
    _write(where, 1, 1, attempt="run-2")  # run 2: writer 0 died; writer 1 finished last
    got = _read(where)
    assert isinstance(got, NotARecordSetError) and "never finalized" in str(got)
    with pytest.raises(IncompleteRecordSetError, match=r"shard 0 \(run-1\); shard 1 \(run-2\)"):
        finalize_shards(where)
    _write(where, 0, 1, attempt="run-2")  # run 2's writer 0, retried: the set of run 2
    assert _read(where) == {1}
    manifest = open_set(where).manifest
    assert manifest["attempt"] == "run-2"
    # a later run with another attempt id does not silently keep the old set: it must say overwrite
    with pytest.raises(RecordExistsError, match=r"finalized by write attempt 'run-2'.*overwrite=True"):
        _write(where, 0, 2, attempt="run-3")
    _write(where, 0, 2, attempt="run-2")  # the same run retried: its shard, unchanged
    assert _read(where) == {1}


def test_the_attempt_can_come_from_the_environment(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHRECORD_WRITE_ATTEMPT", "job-7")
    for i in range(N):
        _write(where, i, 0)
    assert open_set(where).manifest["attempt"] == "job-7"
    with pytest.raises(ArgumentError, match="not an attempt id"):
        _write(where, 0, 0, attempt="no spaces/here")


def test_a_late_writer_with_another_plan_cannot_break_the_finalized_set(where: str) -> None:
    late = start_writer(where, 1, N, f"Slow({COUNT}, 9, after=0)", seed=5)  # another seed: another plan
    wait_for(lambda: _writing(where, late), what="the late writer to start writing")
    for i in range(N):  # meanwhile the set is written and finalized
        _write(where, i, 0)
    before = open_set(where).manifest
    assert late.wait(180) == 1  # refused before it published anything
    assert open_set(where).manifest == before
    assert _read(where) == {0}


def test_a_duplicate_writer_of_the_same_plan_publishes_nothing_after_finalize(where: str) -> None:
    twin = start_writer(where, 1, N, f"Slow({COUNT}, 0, after=0)", seed=1)  # same plan: same attempt
    wait_for(lambda: _writing(where, twin), what="the duplicate writer to start writing")
    for i in range(N):
        _write(where, i, 0)
    before = open_set(where).manifest
    assert twin.wait(180) == 0  # it finds its shard done by its own attempt, and publishes nothing
    assert open_set(where).manifest == before
    assert _read(where) == {0}


def test_a_stale_note_is_not_taken_for_a_new_body(s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHRECORD_CACHE", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/stale"
    _write(url, 1, 0, finalize=False)
    size = s3.head_object(Bucket=BUCKET, Key="stale/shard-00001-of-00002.tr")["ContentLength"]
    # shard 1 written again: killed after its upload, before its note (the old note stays)
    child = start_writer(url, 1, N, f"Versioned({COUNT}, 1)", seed=1, env={"TORCHRECORD_TEST_STOP": "before-note"})
    assert child.wait(180) == -signal.SIGKILL
    assert s3.head_object(Bucket=BUCKET, Key="stale/shard-00001-of-00002.tr")["ContentLength"] == size  # same size
    _write(url, 0, 1)  # the last writer: shard 1's note is not of its body, so the set is not finalized
    assert "manifest.json" not in _names(url, s3)
    with pytest.raises(IncompleteRecordSetError, match="shard 1 is not the file its note describes"):
        finalize_shards(url)
    _write(url, 1, 1)
    assert _read(url) == {1}


def test_a_remote_manifest_entry_of_zero_samples_is_refused_by_every_reader(s3: Any, tmp_path: Path) -> None:
    local = str(tmp_path / "local")
    for i in range(N):
        _write(local, i, 0)
    manifest = json.loads(Path(local, "manifest.json").read_text())
    manifest["shards"][1].update(count=0, records=0)
    manifest["count"] = manifest["shards"][0]["count"]
    Path(local, "manifest.json").write_text(json.dumps(manifest))
    for name in os.listdir(local):
        s3.upload_file(os.path.join(local, name), BUCKET, f"zero/{name}")
    url = f"s3://{BUCKET}/zero"
    cache = str(tmp_path / "cache")
    with pytest.raises(FormatError, match=r"shard 1 is not the file the manifest lists \(count: the file has 12"):
        open_set(url, cache_dir=cache)
    with pytest.raises(FormatError, match="count: the file has 12, the manifest says 0"):
        RecordDataset(url, cache_dir=cache)


def test_a_remote_count_that_disagrees_with_its_shard_is_refused_when_read(s3: Any, tmp_path: Path) -> None:
    local = str(tmp_path / "local")
    for i in range(N):
        _write(local, i, 0, samples_per_record=1)
    manifest = json.loads(Path(local, "manifest.json").read_text())
    manifest["shards"][1].update(count=11, records=11)
    manifest["count"] -= 1
    Path(local, "manifest.json").write_text(json.dumps(manifest))
    for name in os.listdir(local):
        s3.upload_file(os.path.join(local, name), BUCKET, f"fewer/{name}")
    for workers in (0, 2):
        ds = RecordDataset(f"s3://{BUCKET}/fewer", cache_dir=str(tmp_path / f"cache{workers}"), shuffle=False)
        loader = torch.utils.data.DataLoader(
            ds, batch_size=None, num_workers=workers, multiprocessing_context="fork" if workers else None
        )
        with pytest.raises(FormatError, match="count: the file has 12, the manifest says 11"):
            list(loader)


def test_write_shard_refuses_more_shards_than_a_reader_reads(tmp_path: Path) -> None:
    folder = tmp_path / "many"
    with pytest.raises(ArgumentError, match=r"num_shards=100001: a sharded set has at most 100000 shards"):
        write_shard(Versioned(4, 0), folder, shard=0, num_shards=100_001, progress=False)
    assert not folder.exists()


def test_a_set_finalized_by_the_previous_version_still_opens_and_is_rewritten_whole(tmp_path: Path) -> None:
    folder = tmp_path / "old"
    shutil.copytree(OLD_SET, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "attempt" not in manifest  # written before attempts existed
    assert sorted(int(s["x"]) for s in open_set(folder)) == list(range(12))
    old = [{"x": i, "v": 0} for i in range(12)]
    # a retry with the old set's plan: its shard, unchanged
    again = write_shard(old, folder, shard=1, num_shards=2, seed=3, progress=False)
    assert again.set_id == manifest["shards"][1]["set_id"]
    assert finalize_shards(folder).set_id == manifest["set_id"]  # finalizing it again: the same set
    # a rewrite is one new attempt over every shard
    new = [{"x": i, "v": 1} for i in range(12)]
    write_shard(new, folder, shard=0, num_shards=2, seed=3, overwrite=True, progress=False)
    with pytest.raises(IncompleteRecordSetError, match=r"shard 1 \(no attempt\)"):
        finalize_shards(folder)
    write_shard(new, folder, shard=1, num_shards=2, seed=3, overwrite=True, progress=False)
    assert set(versions(open_set(folder))) == {1}


_BARRIER_RANK = """
import os, sys
import torch.distributed as dist
from tests.shards.faults import Versioned
from torchrecord import RecordDataset, open_set, write_shard
rank, world, init, url, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
write_shard(Versioned(30, 0), url, seed=1, progress=False)  # shard and count: the rank and world size
dist.barrier()
cache = os.path.join(out, f"cache{rank}")
share = [int(s["x"]) for s in RecordDataset(url, shuffle=False, cache_dir=cache)]  # this rank's share
whole = sorted(int(s["x"]) for s in open_set(url, cache_dir=cache))
with open(os.path.join(out, f"rank{rank}"), "w") as f:
    f.write(repr((share, whole)))
dist.destroy_process_group()
"""


def test_write_shard_then_barrier_then_read_works_on_every_rank(s3: Any, tmp_path: Path) -> None:
    world = 3
    url = f"s3://{BUCKET}/barrier"
    init = f"file://{tmp_path / 'init'}"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _BARRIER_RANK, str(r), str(world), init, url, str(tmp_path)], env=env, cwd=ROOT
        )
        for r in range(world)
    ]
    assert [p.wait(300) for p in ranks] == [0] * world
    shares = []
    for r in range(world):  # every rank, not only the one that finalized, opened the set at once
        share, whole = eval((tmp_path / f"rank{r}").read_text())
        assert whole == list(range(30)) and len(share) == 10
        shares += share
    assert sorted(shares) == list(range(30))
    attempt = json.loads(s3.get_object(Bucket=BUCKET, Key="barrier/manifest.json")["Body"].read())["attempt"]
    assert not attempt.startswith("plan-")  # drawn by rank 0 and broadcast
