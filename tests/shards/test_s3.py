"""Sharded sets on S3: read by ``s3://`` URL through s3fs, against a local moto server (no network)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import IndexedImages
from tests.shards.faults import BUCKET, free_port
from torchrecord import RecordDataset, ShardedSet, finalize_shards, open_set, write_shard
from torchrecord.errors import (
    ArgumentError,
    ChecksumError,
    FetchError,
    IncompleteRecordSetError,
    MissingDependencyError,
    NotARecordSetError,
    WriteError,
)

pytest.importorskip("moto")
s3fs = pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")

COUNT = 90
SHARDS = 3


def _local_set(tmp_path: Path) -> str:
    directory = str(tmp_path / "local")
    for i in range(SHARDS):
        write_shard(IndexedImages(COUNT), directory, shard=i, num_shards=SHARDS, seed=4, progress=False, finalize=False)
    finalize_shards(directory)
    return directory


def _upload(client: Any, directory: str, prefix: str, names: list[str] | None = None) -> None:
    for name in sorted(os.listdir(directory)) if names is None else names:
        client.upload_file(os.path.join(directory, name), BUCKET, f"{prefix}/{name}")


def _samples(dataset: Any, workers: int) -> list[tuple[torch.Tensor, int]]:
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=workers, multiprocessing_context="fork" if workers else None
    )
    return [(image.clone(), int(label)) for image, label in loader]


def test_read_by_s3_url_matches_the_local_set(s3: Any, tmp_path: Path) -> None:
    local = _local_set(tmp_path)
    _upload(s3, local, "train")
    url = f"s3://{BUCKET}/train"
    remote = open_set(url, cache_dir=str(tmp_path / "cache"))
    assert isinstance(remote, ShardedSet) and len(remote) == COUNT and remote.num_shards == SHARDS
    assert remote.set_id == open_set(local).set_id

    kw = {"shuffle": True, "seed": 9}
    want = _samples(RecordDataset(local, **kw), 0)
    got = _samples(RecordDataset(url, cache_dir=str(tmp_path / "cache2"), **kw), 2)
    assert sorted(label for _, label in got) == list(range(COUNT))
    by_label = {label: image for image, label in want}
    assert len(got) == len(want)
    for image, label in got:  # the 2 workers interleave; each sample is the local set's
        assert torch.equal(image, by_label[label])
    # in one process the order is the local set's, sample for sample
    one = _samples(RecordDataset(url, cache_dir=str(tmp_path / "cache3"), **kw), 0)
    assert [label for _, label in one] == [label for _, label in want]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(one, want))


def test_storage_options_instead_of_the_environment(
    s3: Any, moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = _local_set(tmp_path)
    _upload(s3, local, "opts")
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    s3fs.S3FileSystem.clear_instance_cache()
    options = {"key": "testing", "secret": "testing", "endpoint_url": moto_url}
    ds = RecordDataset(f"s3://{BUCKET}/opts", cache_dir=str(tmp_path / "cache"), storage_options=options, shuffle=False)
    assert sorted(label for _, label in _samples(ds, 2)) == list(range(COUNT))
    rs = open_set(f"s3://{BUCKET}/opts/manifest.json", cache_dir=str(tmp_path / "cache"), storage_options=options)
    assert rs[5][1] == open_set(local)[5][1]
    with pytest.raises(ValueError, match="storage_options"):
        open_set(rs, storage_options=options)
    # writing too: the options, not the environment (which no longer names the server)
    url = f"s3://{BUCKET}/opts-written"
    for i in range(SHARDS):
        write_shard(
            IndexedImages(COUNT), url, shard=i, num_shards=SHARDS, seed=4, progress=False, storage_options=options
        )
    assert len(finalize_shards(url, storage_options=options)) == COUNT
    written = open_set(url, cache_dir=str(tmp_path / "cache"), storage_options=options)
    assert [label for _, label in written] == [label for _, label in open_set(local)]
    # without them, the environment's endpoint is used: here one where no server listens
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore: no retries of the refused connection
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(WriteError, match=r"opts-written.*cannot list"):
        finalize_shards(url)


def test_shards_without_a_manifest_are_not_finalized(s3: Any, tmp_path: Path) -> None:
    local = _local_set(tmp_path)
    names = [n for n in sorted(os.listdir(local)) if n != "manifest.json"]
    _upload(s3, local, "partial", names)
    with pytest.raises(NotARecordSetError, match="never finalized"):
        open_set(f"s3://{BUCKET}/partial", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(FetchError, match="no manifest there"):
        open_set(f"s3://{BUCKET}/nothing-here", cache_dir=str(tmp_path / "cache"))


def test_missing_s3fs_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    registry = sys.modules["fsspec.registry"]
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs fails, as where it is not installed
    monkeypatch.delitem(registry._registry, "s3", raising=False)
    with pytest.raises(MissingDependencyError, match=r"s3fs>=2023\.1.*\.\[s3\]"):
        open_set("s3://bucket/set", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(MissingDependencyError, match=r"pip install 's3fs>=2023\.1' 'fsspec>=2023\.1'"):
        write_shard(IndexedImages(4), "s3://bucket/set", shard=0, num_shards=1, progress=False)
    with pytest.raises(MissingDependencyError, match=r"\.\[s3\]"):
        finalize_shards("s3://bucket/set")


def _listing(client: Any, prefix: str) -> list[str]:
    return sorted(
        o["Key"].rsplit("/", 1)[-1]
        for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
    )


def test_write_shards_to_s3_and_finalize(s3: Any, tmp_path: Path) -> None:
    local = _local_set(tmp_path)
    url = f"s3://{BUCKET}/written"
    for i in range(SHARDS):  # the last writer finalizes
        write_shard(IndexedImages(COUNT), url, shard=i, num_shards=SHARDS, seed=4, progress=False)
        names = _listing(s3, "written")
        assert ("manifest.json" in names) == (i == SHARDS - 1)
        assert f"shard-{i:05d}-of-{SHARDS:05d}.tr.json" in names  # the note, beside its shard
    assert not [n for n in _listing(s3, "written") if ".tmp-" in n]
    remote = open_set(url, cache_dir=str(tmp_path / "cache"))
    want = open_set(local)
    fields = ("name", "count", "records", "bytes")
    assert [[e[k] for k in fields] for e in remote.manifest["shards"]] == [
        [e[k] for k in fields] for e in want.manifest["shards"]
    ]
    # read with 2 fork workers, sample for sample the same as the local set read the same way
    kw = {"shuffle": True, "seed": 3}
    got = _samples(RecordDataset(url, cache_dir=str(tmp_path / "cache2"), **kw), 2)
    expected = _samples(RecordDataset(local, **kw), 2)
    assert [label for _, label in got] == [label for _, label in expected]
    assert sorted(label for _, label in got) == list(range(COUNT))
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got, expected))


def test_retried_writer_of_a_finalized_s3_set(s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHRECORD_CACHE", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/retried"
    for i in range(2):
        write_shard(IndexedImages(40), url, shard=i, num_shards=2, seed=4, progress=False)
    before = s3.get_object(Bucket=BUCKET, Key="retried/manifest.json")["Body"].read()
    entry = open_set(url).manifest["shards"][1]
    # the same plan again (a task retried after the set was finalized): the existing shard, unchanged
    again = write_shard(IndexedImages(40), url, shard=1, num_shards=2, seed=4, progress=False)
    assert again.set_id == entry["set_id"] and len(again) == 20
    # another plan: refused, and the set stays as it was
    with pytest.raises(ArgumentError, match="shard 1 has seed=5, but the finalized set"):
        write_shard(IndexedImages(40), url, shard=1, num_shards=2, seed=5, progress=False)
    assert s3.get_object(Bucket=BUCKET, Key="retried/manifest.json")["Body"].read() == before
    # overwrite: a new write attempt; the old manifest stays, and readers refuse the rewritten shard at once
    write_shard(IndexedImages(40), url, shard=1, num_shards=2, seed=4, overwrite=True, finalize=False, progress=False)
    assert s3.get_object(Bucket=BUCKET, Key="retried/manifest.json")["Body"].read() == before
    with pytest.raises(ChecksumError, match="shard 1 on the server is not the one the manifest lists"):
        list(open_set(url, cache_dir=str(tmp_path / "fresh")))
    with pytest.raises(IncompleteRecordSetError, match=r"another write attempt.*shard 0"):
        finalize_shards(url)  # shard 0 is of the old attempt: no set of both
    write_shard(IndexedImages(40), url, shard=0, num_shards=2, seed=4, overwrite=True, progress=False)
    assert (
        len(open_set(url)) == 40 and s3.get_object(Bucket=BUCKET, Key="retried/manifest.json")["Body"].read() != before
    )
    with pytest.raises(ArgumentError, match="cannot be written over http"):
        write_shard(IndexedImages(4), "http://127.0.0.1:9/set", shard=0, num_shards=1, progress=False)


def _killed_writer(url: str, shard: int, stop: str) -> Any:
    """Start ``write_shard`` of ``shard`` in a child that SIGKILLs itself at ``stop`` (the test hook)."""
    import subprocess
    import sys

    code = (
        "from tests.conftest import IndexedImages\n"
        "from torchrecord import write_shard\n"
        f"write_shard(IndexedImages({COUNT}), {url!r}, shard={shard}, num_shards={SHARDS}, seed=4, progress=False)\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "TORCHRECORD_TEST_STOP": stop}
    env["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=root)


def test_killed_writers_leave_no_readable_set(s3: Any, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    urls = {stop: f"s3://{BUCKET}/{stop}" for stop in ("before-note", "before-manifest")}
    for url in urls.values():
        for i in (0, 2):  # the last writer to finish finalizes: shard 1's, killed
            write_shard(IndexedImages(COUNT), url, shard=i, num_shards=SHARDS, seed=4, progress=False)
    children = [_killed_writer(url, 1, stop) for stop, url in urls.items()]  # both at once: quicker
    assert [child.wait(timeout=120) for child in children] == [-signal.SIGKILL] * 2

    # killed once its shard was up, before its note: the shard does not count as written
    url = urls["before-note"]
    names = _listing(s3, "before-note")
    assert "shard-00001-of-00003.tr" in names and "shard-00001-of-00003.tr.json" not in names
    with pytest.raises(NotARecordSetError, match="never finalized"):
        open_set(url, cache_dir=cache)
    with pytest.raises(IncompleteRecordSetError, match=r"1 of 3 shards missing: shard 1 \(shard-00001-of-00003"):
        finalize_shards(url)
    write_shard(IndexedImages(COUNT), url, shard=1, num_shards=SHARDS, seed=4, progress=False)  # the retry finalizes
    assert sorted(s[1] for s in open_set(url, cache_dir=cache)) == list(range(COUNT))

    # killed between the last note and the manifest: every shard is up, the set is not finalized
    url = urls["before-manifest"]
    names = _listing(s3, "before-manifest")
    assert "manifest.json" not in names and len([n for n in names if n.endswith(".tr.json")]) == SHARDS
    with pytest.raises(NotARecordSetError, match="never finalized"):
        open_set(url, cache_dir=cache)
    with pytest.raises(NotARecordSetError, match="never finalized"):
        RecordDataset(url, cache_dir=cache)
    done = finalize_shards(url)  # run again: completes the set
    assert len(done) == COUNT
    assert sorted(s[1] for s in open_set(url, cache_dir=cache)) == list(range(COUNT))


def test_other_readers_take_the_opened_set(s3: Any, tmp_path: Path) -> None:
    from torchrecord import MixedDataset

    local = _local_set(tmp_path)
    _upload(s3, local, "mixed")
    rs = open_set(f"s3://{BUCKET}/mixed", cache_dir=str(tmp_path / "cache"))
    ds = MixedDataset({"remote": rs, "local": local}, seed=2)
    labels = [int(label) for _, label in _samples(ds, 2)]
    assert sorted(labels) == sorted(list(range(COUNT)) * 2)


def test_a_dataset_dict_without_split_goes_to_s3_one_sharded_set_per_split(s3: Any, tmp_path: Path) -> None:
    """``from_hf`` of a whole DatasetDict to ``s3://``: a set per split there, and no stray local folder."""
    datasets = pytest.importorskip("datasets")
    from torchrecord.convert import from_hf

    parts = {
        name: datasets.Dataset.from_dict({"x": list(range(n)), "y": [i % 3 for i in range(n)]})
        for name, n in [("train", 12), ("test", 5)]
    }
    url = f"s3://{BUCKET}/dict"
    os.chdir(tmp_path)  # a stray local "s3:" folder would appear here
    for shard in range(2):
        from_hf(datasets.DatasetDict(parts), url, shard=shard, num_shards=2, seed=0, progress=False)
    assert not os.path.exists(tmp_path / "s3:")
    for name, part in parts.items():
        got = open_set(f"{url}/{name}", cache_dir=str(tmp_path / "cache"))
        assert sorted(int(got[i]["x"]) for i in range(len(got))) == list(range(len(part)))
