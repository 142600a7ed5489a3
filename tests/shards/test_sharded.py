"""Sharded sets: parallel writers, finalize, and reading the shards as one set."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

import torchrecord
from tests.conftest import IndexedImages
from tests.helpers import assert_exactly_once
from torchrecord import (
    RecordDataset,
    RecordFile,
    RecordSet,
    ShardedSet,
    finalize_shards,
    open_set,
    write_record,
    write_shard,
)
from torchrecord._order.partition import reader_runs
from torchrecord.errors import (
    ArgumentError,
    FormatError,
    IncompleteRecordSetError,
    SchemaError,
    SourceError,
)

COUNT = 103  # not a multiple of 4: shards of 25 and 26


def _labels(rf: Any) -> list[int]:
    return [int(sample[1]) for sample in rf]


def _write(directory: str, shard: int, n: int = 4, count: int = COUNT, **kw: Any) -> None:
    write_shard(IndexedImages(count), directory, shard=shard, num_shards=n, seed=3, progress=False, **kw)


def _sharded(tmp_path: Path, n: int = 4, count: int = COUNT, **kw: Any) -> str:
    directory = str(tmp_path / "shards")
    for i in range(n):
        _write(directory, i, n, count, **kw)
    return directory


def test_four_writer_processes_equal_one_write_record(tmp_path: Path) -> None:
    directory = str(tmp_path / "shards")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write, args=(directory, i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert os.path.exists(os.path.join(directory, "manifest.json")), "the last writer finalizes"
    one = write_record(IndexedImages(COUNT), tmp_path / "one.tr", seed=3, progress=False)
    sharded = open_set(directory)
    assert isinstance(sharded, ShardedSet) and isinstance(sharded, RecordSet) and not isinstance(sharded, RecordFile)
    assert len(sharded) == COUNT and sharded.num_shards == 4
    assert list(sharded.shard_offsets) == [0, 25, 51, 77, 103]
    # the same global pre-shuffle: position p holds the same sample
    assert _labels(sharded) == _labels(one)
    assert [int(sharded[i][1]) for i in (0, 25, 50, 51, -1)] == [int(one[i][1]) for i in (0, 25, 50, 51, -1)]
    assert torch.equal(sharded[60][0], one[60][0])
    assert str(sharded.schema) == str(one.schema)
    assert sharded.metadata["seed"] == 3 and sharded.metadata["shards"] == 4
    # every shard is a record set on its own
    assert sum(len(RecordFile(os.path.join(directory, e["name"]))) for e in sharded.manifest["shards"]) == COUNT


def test_manifest_content(tmp_path: Path) -> None:
    directory = _sharded(tmp_path)
    manifest = json.loads(Path(directory, "manifest.json").read_text())
    assert manifest["format"] == "torchrecord-shards" and manifest["manifest_version"] == 1
    assert manifest["count"] == COUNT and manifest["source"] == "map" and manifest["seed"] == 3
    assert [s["count"] for s in manifest["shards"]] == [25, 26, 26, 26]
    for entry in manifest["shards"]:
        digest, size = torchrecord._shards.manifest.file_digest(os.path.join(directory, entry["name"]))
        assert (entry["sha256"], entry["bytes"]) == (digest, size)
        assert entry["set_id"] == RecordFile(os.path.join(directory, entry["name"])).set_id
    # finalize again: the same manifest (deterministic: concurrent finalizers agree)
    before = Path(directory, "manifest.json").read_bytes()
    again = finalize_shards(directory)
    assert Path(directory, "manifest.json").read_bytes() == before
    assert again.set_id == manifest["set_id"]


def test_iterable_source_each_writer_shuffles_its_part(tmp_path: Path) -> None:
    directory = str(tmp_path / "shards")
    parts = [range(0, 40), range(40, 70), range(70, 100)]
    for i, part in enumerate(parts):
        rows = ((torch.full((2,), x, dtype=torch.int32), x) for x in part)
        write_shard(rows, directory, shard=i, num_shards=3, seed=5, progress=False)
    rf = open_set(directory)
    labels = _labels(rf)
    assert sorted(labels) == list(range(100))
    for i, part in enumerate(parts):
        mine = labels[int(rf.shard_offsets[i]) : int(rf.shard_offsets[i + 1])]
        assert sorted(mine) == list(part) and mine != list(part), "each shard holds its own part, shuffled"
    assert rf.manifest["source"] == "iterable"


def _gloo_writer(rank: int, init_file: str, directory: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        write_shard(IndexedImages(COUNT), directory, seed=3, progress=False)  # shard and count from torch.distributed
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_write_one_set(tmp_path: Path) -> None:
    directory = str(tmp_path / "shards")
    mp.spawn(_gloo_writer, args=(str(tmp_path / "init"), directory), nprocs=2, join=True)
    one = write_record(IndexedImages(COUNT), tmp_path / "one.tr", seed=3, progress=False)
    sharded = open_set(directory)
    assert sharded.num_shards == 2
    assert _labels(sharded) == _labels(one)


class _Slow(torch.utils.data.Dataset[Any]):
    """IndexedImages that sleeps on every sample: a writer that can be killed mid-way."""

    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, i: int) -> Any:
        time.sleep(0.02)
        return IndexedImages(COUNT)[i]


def _write_slow(directory: str) -> None:
    write_shard(_Slow(), directory, shard=2, num_shards=4, seed=3, progress=False, commit_bytes=1)


def test_killed_writer_is_named_at_finalize_and_a_retry_completes_the_set(tmp_path: Path) -> None:
    directory = str(tmp_path / "shards")
    for i in (0, 1, 3):
        _write(directory, i)
    assert not os.path.exists(os.path.join(directory, "manifest.json"))
    proc = multiprocessing.get_context("fork").Process(target=_write_slow, args=(directory,))
    proc.start()
    deadline = time.monotonic() + 30
    while not any(".tmp-" in name for name in os.listdir(directory)) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert not os.path.exists(os.path.join(directory, "shard-00002-of-00004.tr")), "a killed writer leaves no shard"
    with pytest.raises(IncompleteRecordSetError, match=r"shard 2 \(shard-00002-of-00004.tr\) is missing") as err:
        finalize_shards(directory)
    assert f"pid {proc.pid}" in str(err.value) and "1 of 4 shards missing" in str(err.value)
    for opened in (RecordFile, open_set):  # at once, not at the first len()
        with pytest.raises(torchrecord.errors.NotARecordSetError, match=r"never finalized; run torchrecord\.finalize"):
            opened(directory)
    _write(directory, 2)  # the retried task: finalizes as the last writer, and clears the dead temporary
    assert not any(".tmp-" in name for name in os.listdir(directory))
    one = write_record(IndexedImages(COUNT), tmp_path / "one.tr", seed=3, progress=False)
    assert _labels(open_set(directory)) == _labels(one)


def test_failed_writer_is_named_at_finalize(tmp_path: Path) -> None:
    directory = str(tmp_path / "shards")
    _write(directory, 0, n=2)

    def bad(i: int) -> Any:
        raise RuntimeError("broken source")

    class Broken(IndexedImages):
        __getitem__ = staticmethod(bad)  # type: ignore[assignment]

    with pytest.raises(torchrecord.errors.SourceError):
        write_shard(Broken(COUNT), directory, shard=1, num_shards=2, seed=3, progress=False)
    with pytest.raises(IncompleteRecordSetError, match=r"shard 1 .* never written, or its writer failed"):
        finalize_shards(directory)


def test_retried_shard_is_idempotent(tmp_path: Path) -> None:
    directory = str(tmp_path / "shards")
    _write(directory, 1)
    first = RecordFile(os.path.join(directory, "shard-00001-of-00004.tr"))
    before = _labels(first)
    _write(directory, 1)  # retried before the set is finalized: written again, the same samples in order
    assert _labels(RecordFile(first.path)) == before
    for i in (0, 2, 3):
        _write(directory, i)
    manifest = Path(directory, "manifest.json").read_bytes()
    kept = RecordFile(first.path).set_id
    _write(directory, 1)  # retried after the set was finalized: a no-op
    assert Path(directory, "manifest.json").read_bytes() == manifest
    assert RecordFile(first.path).set_id == kept
    for overwrite in (False, True):  # another plan: refused before anything is written or removed
        with pytest.raises(ArgumentError, match=r"len\(dataset\)=50, but the finalized set .* len\(dataset\)=103"):
            _write(directory, 1, count=50, overwrite=overwrite)
    assert Path(directory, "manifest.json").read_bytes() == manifest
    assert RecordFile(first.path).set_id == kept


def test_schema_mismatch_between_shards_names_the_shard(tmp_path: Path) -> None:
    directory = str(tmp_path / "shards")
    _write(directory, 0, n=2)
    floats = [(torch.zeros(3, 4, 4), i) for i in range(COUNT)]
    pattern = r"shard-00001-of-00002.tr, field '0': tensor of float32 .* shard-00000"
    with pytest.raises(SchemaError, match=pattern):  # raised by this last writer's finalize
        write_shard(floats, directory, shard=1, num_shards=2, seed=3, progress=False)
    assert not os.path.exists(os.path.join(directory, "manifest.json"))
    with pytest.raises(SchemaError, match=pattern):
        finalize_shards(directory)


def test_shapes_that_differ_between_shards_are_widened(tmp_path: Path) -> None:
    directory = str(tmp_path / "shards")
    # shards of other shapes choose other packings: one packing for the whole set (see below)
    write_shard(iter([torch.zeros(2, 3)] * 5), directory, shard=0, num_shards=2, samples_per_record=1, progress=False)
    write_shard(iter([torch.ones(2, 5)] * 5), directory, shard=1, num_shards=2, samples_per_record=1, progress=False)
    rf = open_set(directory)
    assert rf.schema.fields[0].shape == (2, None)
    batches = list(RecordDataset(directory, batch_size=4))
    assert sum(len(b) for b in batches) == 10  # variable shapes come as lists


# -- the write options (issue 26): write_shard takes write_record's, with its defaults ------------


def _set_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, e["name"])) for e in open_set(directory).manifest["shards"])


def test_default_shards_pack_like_write_record_and_are_about_its_size(tmp_path: Path) -> None:
    samples = [(torch.full((16,), float(i)), i) for i in range(4000)]  # small samples: packing matters
    one = write_record(samples, tmp_path / "one.tr", seed=3, progress=False)
    directory = str(tmp_path / "shards")
    for i in range(4):
        write_shard(samples, directory, shard=i, num_shards=4, seed=3, progress=False)
    sharded = open_set(directory)
    assert sharded.samples_per_record == one.samples_per_record > 1
    assert [int(s[1]) for s in sharded] == [int(s[1]) for s in one]  # the same global order
    assert _set_bytes(directory) < 1.5 * os.path.getsize(one.path)
    # what the old default (one sample per record) gave: the bound above can fail
    unpacked = str(tmp_path / "unpacked")
    for i in range(4):
        write_shard(samples, unpacked, shard=i, num_shards=4, seed=3, samples_per_record=1, progress=False)
    assert _set_bytes(unpacked) > 2 * os.path.getsize(one.path)


def test_compressed_shards_hold_what_write_record_holds(tmp_path: Path) -> None:
    pytest.importorskip("cramjam")
    one = write_record(IndexedImages(COUNT, size=16), tmp_path / "one.tr", seed=3, compression="zstd", progress=False)
    directory = str(tmp_path / "shards")
    for i in range(4):
        write_shard(
            IndexedImages(COUNT, size=16), directory, shard=i, num_shards=4, seed=3, compression="zstd", progress=False
        )
    sharded = open_set(directory)
    for entry in sharded.manifest["shards"]:
        shard = RecordFile(os.path.join(directory, entry["name"]))
        assert shard.metadata["compression"]["0"]["applied"] and shard.metadata["compression"]["0"]["codec"] == "zstd"
    assert _labels(sharded) == _labels(one)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(sharded, one))
    plain = str(tmp_path / "plain")
    for i in range(4):
        write_shard(IndexedImages(COUNT, size=16), plain, shard=i, num_shards=4, seed=3, progress=False)
    assert _set_bytes(directory) < _set_bytes(plain)


def test_max_skipped_and_schema_reach_each_shard(tmp_path: Path) -> None:
    class Flaky(IndexedImages):
        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            if i % 10 == 0:
                raise OSError(f"cannot read sample {i}")
            return super().__getitem__(i)

    directory = str(tmp_path / "shards")
    with pytest.raises(SourceError, match="more than"):
        write_shard(Flaky(COUNT), directory, shard=0, num_shards=2, on_error="skip", max_skipped=1, progress=False)
    stated = {"0": (3, None, None)}
    for i in range(2):
        write_shard(Flaky(COUNT), directory, shard=i, num_shards=2, on_error="skip", schema=stated, progress=False)
    sharded = open_set(directory)
    assert len(sharded) == COUNT - 11 and sharded.metadata["skipped"] == 11
    assert sharded.schema.fields[0].shape == (3, None, None)


def test_group_by_is_refused_with_the_reason(tmp_path: Path) -> None:
    samples = [{"x": torch.tensor([i]), "episode": i // 5} for i in range(20)]
    with pytest.raises(ValueError, match="a sharded set has no groups"):
        write_shard(samples, tmp_path / "shards", shard=0, num_shards=2, group_by="episode", progress=False)
    assert not (tmp_path / "shards").exists() or not os.listdir(tmp_path / "shards")


@pytest.mark.parametrize(
    ("option", "value"),
    [("checksums", False), ("shuffle", False), ("samples_per_record", 4), ("schema", {"0": (3, None, None)})],
)
def test_shards_written_with_other_options_are_refused(tmp_path: Path, option: str, value: Any) -> None:
    directory = str(tmp_path / "shards")
    _write(directory, 0, n=2)
    with pytest.raises(ArgumentError, match=rf"shard 1 has {option}=.*, but shard 0 was written with {option}="):
        _write(directory, 1, n=2, **{option: value})  # refused when it starts
    assert sorted(os.listdir(directory)) == ["shard-00000-of-00002.tr", "shard-00000-of-00002.tr.json"]
    # writers that started at once are refused by finalize_shards
    elsewhere = str(tmp_path / "elsewhere")
    _write(elsewhere, 1, n=2, finalize=False, **{option: value})
    for name in ("shard-00001-of-00002.tr", "shard-00001-of-00002.tr.json"):
        os.rename(os.path.join(elsewhere, name), os.path.join(directory, name))
    with pytest.raises(FormatError, match=rf"shard 1 was written with {option}=.*, shard 0 with"):
        finalize_shards(directory)
    assert not os.path.exists(os.path.join(directory, "manifest.json"))


def test_shards_compressed_otherwise_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("cramjam")
    directory = str(tmp_path / "shards")
    _write(directory, 0, n=2, compression="zstd")
    with pytest.raises(ArgumentError, match=r"compression='lz4', but shard 0 was written with compression='zstd'"):
        _write(directory, 1, n=2, compression="lz4")
    with pytest.raises(ArgumentError, match=r"compression_level=9, but shard 0 .* compression_level=None"):
        _write(directory, 1, n=2, compression="zstd", compression_level=9)


def test_shards_that_choose_other_packings_are_refused_naming_the_fix(tmp_path: Path) -> None:
    directory = str(tmp_path / "shards")
    write_shard(iter([torch.zeros(2, 3)] * 5), directory, shard=0, num_shards=2, progress=False)
    pattern = r"shard 1 holds \d+ samples per record, shard 0 \d+ .*same samples_per_record=K"
    with pytest.raises(FormatError, match=pattern):
        write_shard(iter([torch.ones(2, 50)] * 5), directory, shard=1, num_shards=2, progress=False)


def test_blocks_never_straddle_a_shard() -> None:
    bounds = np.array([0, 25, 51, 51, 77, 103])  # an empty shard too
    for world, workers, batch in [(1, 1, None), (2, 3, None), (3, 2, 8)]:
        seen: list[int] = []
        for rank in range(world):
            for worker in range(workers):
                runs = reader_runs(
                    103, block_size=8, seed=1, epoch=2, shuffle=True, rank=rank, world_size=world,
                    worker=worker, num_workers=workers, unit=batch, bounds=bounds,
                )  # fmt: skip
                for a, b in runs:
                    shard = int(np.searchsorted(bounds, a, side="right")) - 1
                    assert b <= bounds[shard + 1], f"run {a, b} straddles shard {shard}"
                    seen.extend(range(a, b))
        assert_exactly_once(seen, 103, pad=-(-103 // world) * world - 103)


@pytest.mark.parametrize(
    ("world", "workers", "batch", "drop_last", "start"),
    [(1, 2, None, False, "fork"), (2, 2, 8, False, "fork"), (3, 2, None, True, "fork"), (2, 1, 4, True, "spawn")],
)
def test_exactly_once_over_ranks_and_workers(
    tmp_path: Path, world: int, workers: int, batch: Any, drop_last: bool, start: str
) -> None:
    directory = _sharded(tmp_path)
    seen: list[int] = []
    lengths = []
    for rank in range(world):
        ds = RecordDataset(
            directory, rank=rank, world_size=world, batch_size=batch, drop_last=drop_last, shuffle_buffer=16, seed=1
        )
        ds.set_epoch(1)
        items = list(DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context=start))
        assert len(items) == len(ds)
        lengths.append(len(items))
        labels = [int(x) for _, ys in items for x in ys] if batch else [int(y) for _, y in items]
        seen.extend(labels)
    assert len(set(lengths)) == 1, "every rank yields the same number"
    if drop_last and batch:
        assert len(seen) == len(lengths) * lengths[0] * batch
        assert len(set(seen)) == len(seen)
    elif drop_last:
        assert_exactly_once(seen, COUNT, drop=COUNT - COUNT // world * world)
    else:
        assert_exactly_once(seen, COUNT, pad=-(-COUNT // world) * world - COUNT)


def test_fast_and_generic_paths_and_chunked_shards_agree(tmp_path: Path) -> None:
    directory = _sharded(tmp_path, samples_per_record=4)  # 25 and 26 samples per shard: short final chunks
    assert open_set(directory).samples_per_record == 4
    fast = RecordDataset(directory, shuffle_buffer=32, batch_size=5)
    generic = RecordDataset(directory, shuffle_buffer=32, batch_size=5)
    generic._force_generic = True
    a = [y.tolist() for _, y in fast]
    b = [y.tolist() for _, y in generic]
    assert a == b
    assert sorted(x for ys in a for x in ys) == list(range(COUNT))


def test_each_reader_opens_only_the_shards_it_needs(tmp_path: Path) -> None:
    directory = _sharded(tmp_path, count=100)  # four shards of 25
    for name in ("shard-00001-of-00004.tr", "shard-00002-of-00004.tr", "shard-00003-of-00004.tr"):
        os.remove(os.path.join(directory, name))
    ds = RecordDataset(directory, shuffle=False, rank=0, world_size=4)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    assert sorted(int(y) for _, y in loader) == sorted(_labels(open_set(directory).shard(0)))
    with pytest.raises(torchrecord.errors.RecordNotFoundError, match="shard-00001"):
        list(RecordDataset(directory, shuffle=False, rank=1, world_size=4))


def test_resume_on_a_sharded_set(tmp_path: Path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    directory = _sharded(tmp_path)
    ds = RecordDataset(directory, batch_size=4, shuffle_buffer=16, seed=2)
    ds.set_epoch(1)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    full = [y.tolist() for _, y in loader]
    it = iter(loader)
    head = [next(it)[1].tolist() for _ in range(7)]
    state = loader.state_dict()
    del it
    assert head == full[:7]
    resumed_ds = RecordDataset(directory, batch_size=4, shuffle_buffer=16, seed=2)
    resumed_ds.set_epoch(1)
    resumed = StatefulDataLoader(resumed_ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    resumed.load_state_dict(state)
    assert head + [y.tolist() for _, y in resumed] == full
    # elastic: the same position on three workers of one rank, every sample not yet yielded exactly once
    position = torchrecord.loader_position(state)
    assert position["set_id"] == open_set(directory).set_id
    elastic = RecordDataset(directory, batch_size=4, shuffle_buffer=16, seed=2)
    elastic.set_epoch(1)
    elastic.load_state_dict(position)
    rest = [int(x) for _, ys in DataLoader(elastic, batch_size=None, num_workers=3) for x in ys]
    assert_exactly_once([x for ys in head for x in ys] + rest, COUNT)


def test_a_state_of_another_set_is_refused(tmp_path: Path) -> None:
    directory = _sharded(tmp_path)
    one = tmp_path / "one.tr"
    write_record(IndexedImages(COUNT), one, seed=3, progress=False)
    state = RecordDataset(one).state_dict()
    with pytest.raises(ValueError, match="another record set"):
        RecordDataset(directory).load_state_dict(state)


def test_load_and_verify_a_sharded_set(tmp_path: Path) -> None:
    directory = _sharded(tmp_path, samples_per_record=1)  # a record per sample: verify counts and names records
    one = tmp_path / "one.tr"
    write_record(IndexedImages(COUNT), one, seed=3, progress=False)
    images, labels = torchrecord.load(directory)
    images1, labels1 = torchrecord.load(one)
    assert torch.equal(labels, labels1) and torch.equal(images, images1)
    (picked,) = torchrecord.load(directory, fields="1", subset=[5, 80, 26])
    assert torch.equal(picked, labels1[[5, 80, 26]])
    report = torchrecord.verify(directory)
    assert report.ok and report.records == COUNT
    # flip one byte of shard 2: verify names the shard's file
    path = os.path.join(directory, "shard-00002-of-00004.tr")
    data = bytearray(Path(path).read_bytes())
    value = RecordFile(path).raw(3)
    at = data.find(value)
    data[at + len(value) - 1] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    report = torchrecord.verify(directory)
    assert not report.ok and report.first_bad == 51 + 3
    assert "shard-00002-of-00004.tr" in str(report.first_error)


# -- the command line -----------------------------------------------------------------


def test_cli_convert_shards_then_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.convert.test_convert import make_image_folder
    from torchrecord.cli import main

    make_image_folder(tmp_path / "src", {"cat": 3, "dog": 4})
    single = tmp_path / "one.tr"
    assert main(["convert", str(tmp_path / "src"), str(single), "--seed", "3"]) == 0
    folder = tmp_path / "shards"
    for i in range(3):
        assert main(["convert", str(tmp_path / "src"), str(folder), "--shards", "3", "--shard", str(i), "-q"]) == 0
    out = capsys.readouterr().out
    assert out.count("wrote ") == 4 and "the sharded set is finalized" in out
    for i in range(3):  # the seed applies to the global permutation
        assert main(["convert", str(tmp_path / "src"), str(folder / "s3"), "--shards", "3", "--shard", str(i),
                     "--seed", "3", "-q"]) == 0  # fmt: skip
    assert [s["label"] for s in open_set(folder / "s3")] == [s["label"] for s in RecordFile(single)]
    capsys.readouterr()
    assert main(["info", str(folder), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["count"] == 7 and info["shards"] == 3 and info["set_id"] == open_set(folder).set_id
    assert info["size_bytes"] == sum(os.path.getsize(folder / n) for n in os.listdir(folder) if n.endswith(".tr"))
    assert main(["info", str(folder / "manifest.json")]) == 0
    assert "shards:       3 (a sharded set" in capsys.readouterr().out
    assert main(["head", str(folder), "-n", "2", "--index", "-2"]) == 0
    assert capsys.readouterr().out.count("sample ") == 2
    assert main(["verify", str(folder), "-q"]) == 0
    assert "OK, 7 records checked" in capsys.readouterr().out
    assert main(["bench", str(folder), "--workers", "0", "--epochs", "1", "--batch-size", "2", "-q"]) == 0
    assert "samples/s" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "src"), str(folder), "--shards", "3"]) == 1
    assert "give both --shards N and --shard I" in capsys.readouterr().err
    os.remove(folder / "shard-00001-of-00003.tr")
    assert main(["info", str(folder)]) == 0  # the manifest describes the set
    capsys.readouterr()
    assert main(["head", str(folder), "--index", "3", "-n", "1"]) == 1
    err = capsys.readouterr().err
    assert "shard-00001-of-00003.tr: no record set here" in err and "Traceback" not in err


def test_cli_convert_array_stream_in_shards(tmp_path: Path) -> None:
    from torchrecord.cli import main

    src = tmp_path / "rows.npz"
    np.savez_compressed(src, x=np.arange(50, dtype=np.int64))  # compressed: read as a stream in order
    for i in range(2):
        assert main(["convert", str(src), str(tmp_path / "sh"), "--shards", "2", "--shard", str(i), "-q"]) == 0
    rf = open_set(tmp_path / "sh")
    assert sorted(int(s["x"]) for s in rf) == list(range(50))
    assert [len(rf.shard(i)) for i in range(2)] == [25, 25]


def test_manifest_checks(tmp_path: Path) -> None:
    directory = _sharded(tmp_path)
    manifest_path = Path(directory, "manifest.json")
    manifest = json.loads(manifest_path.read_text())

    def opened(changed: dict[str, Any]) -> int:
        manifest_path.write_text(json.dumps({**manifest, **changed}))
        return len(open_set(directory))

    assert opened({"a_later_key": [1, 2]}) == COUNT  # unknown keys are ignored
    with pytest.raises(torchrecord.errors.VersionError, match=r"manifest version 2 .* Upgrade torchrecord"):
        opened({"manifest_version": 2})
    with pytest.raises(torchrecord.errors.FormatError, match="not the sum of its shards"):
        opened({"count": COUNT + 1})
    with pytest.raises(torchrecord.errors.FormatError, match=r"the name .* is not .shard-00000-of-00004.tr."):
        opened({"shards": [{**manifest["shards"][0], "name": "../x.tr"}, *manifest["shards"][1:]]})
    with pytest.raises(torchrecord.errors.NotARecordSetError, match="not a torchrecord sharded-set manifest"):
        opened({"format": "something else"})
    manifest_path.write_text("{not json")
    with pytest.raises(torchrecord.errors.FormatError, match="not valid JSON"):
        len(open_set(directory))
    manifest_path.write_text(json.dumps(manifest))
    # a shard rewritten after finalizing (another set_id) is refused by readers until finalized again
    write_record([IndexedImages(COUNT)[i] for i in range(26)],
                 os.path.join(directory, "shard-00001-of-00004.tr"), overwrite=True, progress=False)  # fmt: skip
    with pytest.raises(torchrecord.errors.FormatError, match="rewritten after the set was finalized"):
        open_set(directory)[30]
    assert open_set(directory)[3] is not None  # the other shards still read
