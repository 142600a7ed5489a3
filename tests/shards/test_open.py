"""open_set opens a file, a folder, a manifest or an open set; every reader reads a sharded set as it reads a file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import torchrecord
from tests.helpers import assert_exactly_once
from torchrecord import (
    MixedDataset,
    RecordDataset,
    RecordFile,
    RecordSet,
    ShardedSet,
    StreamDataset,
    WindowDataset,
    load,
    open_set,
    verify,
    write_record,
    write_shard,
)
from torchrecord.cli import main

COUNT = 50
SHARDS = 3


def _fixed(i: int) -> dict[str, Any]:
    return {"x": torch.full((4,), float(i)), "label": i}


def _variable(i: int) -> dict[str, Any]:
    """A sample of a schema without a fixed layout (a string): the generic (protobuf) path."""
    return {"x": np.full(2, i, dtype=np.float32), "name": f"n{i}" * (i % 3 + 1), "label": i}


def _shards(folder: Path, make: Callable[[int], Any] = _fixed, base: int = 0, **kw: Any) -> Path:
    samples = [make(base + i) for i in range(COUNT)]
    for s in range(SHARDS):
        write_shard(samples, folder, shard=s, num_shards=SHARDS, seed=1, progress=False, **kw)
    return folder


def _file(path: Path, make: Callable[[int], Any] = _fixed, base: int = 0, **kw: Any) -> Path:
    write_record([make(base + i) for i in range(COUNT)], path, seed=1, progress=False, **kw)
    return path


def _labels(batches: Any) -> list[int]:
    out: list[int] = []
    for batch in batches:
        labels = batch["label"]
        out.extend(int(y) for y in (labels if isinstance(labels, (list, torch.Tensor)) else [labels]))
    return out


# -- open_set -------------------------------------------------------------------------------


def test_open_set_opens_a_file_a_folder_a_manifest_and_an_open_set(tmp_path: Path) -> None:
    file = _file(tmp_path / "one.tr")
    folder = _shards(tmp_path / "shards")
    one = open_set(file)
    assert type(one) is RecordFile and len(one) == COUNT
    assert type(open_set(str(file).encode())) is RecordFile
    sharded = open_set(folder)
    assert type(sharded) is ShardedSet and len(sharded) == COUNT and sharded.num_shards == SHARDS
    by_manifest = open_set(folder / "manifest.json")
    assert type(by_manifest) is ShardedSet and by_manifest.set_id == sharded.set_id
    for rs in (one, sharded):
        assert isinstance(rs, RecordSet)
        assert open_set(rs) is rs  # an open set is itself
    assert open_set(file, subset=range(10, 20)).subset == range(10, 20)


def test_open_set_applies_check_to_an_open_set_and_refuses_what_it_cannot_apply(tmp_path: Path) -> None:
    file = _file(tmp_path / "one.tr")
    folder = _shards(tmp_path / "shards")
    rf = open_set(file)
    assert open_set(rf, check="structure") is rf and rf._check == "structure"  # type: ignore[attr-defined]
    for given in ({"subset": range(3)}, {"cache_dir": str(tmp_path)}, {"cache_limit": 10}):
        with pytest.raises(ValueError, match="already open"):
            open_set(rf, **given)
    with pytest.raises(ValueError, match="subset= is not supported on a sharded set"):
        open_set(folder, subset=range(3))
    with pytest.raises(torchrecord.errors.RecordNotFoundError):
        open_set(tmp_path / "nothing" / "manifest.json")


def test_a_sharded_set_reads_its_manifest_when_opened(tmp_path: Path) -> None:
    folder = _shards(tmp_path / "shards")
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "count": COUNT + 1}))
    with pytest.raises(torchrecord.errors.FormatError, match="not the sum of its shards"):
        open_set(folder)  # at once, not at len()


# -- every reader reads a sharded set ------------------------------------------------------------


@pytest.mark.parametrize("make", [_fixed, _variable], ids=["fixed", "generic"])
@pytest.mark.parametrize("k", [1, 4])
def test_mixed_dataset_over_a_sharded_set(tmp_path: Path, make: Callable[[int], Any], k: int) -> None:
    """MixedDataset over a sharded set raised TypeError from environment() at its first batch."""
    folder = _shards(tmp_path / "shards", make, samples_per_record=k)
    file = _file(tmp_path / "one.tr", make, base=COUNT)
    ds = MixedDataset([str(folder), file], batch_size=8, seed=2)
    assert_exactly_once(_labels(ds), 2 * COUNT)
    mixed = MixedDataset({"shards": open_set(folder)}, seed=2)  # per sample, from an open set
    assert sorted(_labels(mixed)) == list(range(COUNT))


def test_mixed_dataset_over_a_sharded_set_in_workers(tmp_path: Path) -> None:
    folder = _shards(tmp_path / "shards")
    ds = MixedDataset([folder], batch_size=4, seed=0)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    assert_exactly_once(_labels(loader), COUNT)


def test_record_dataset_with_workers_over_a_sharded_set(tmp_path: Path) -> None:
    folder = _shards(tmp_path / "shards", _variable)
    for given in (folder, open_set(folder)):
        ds = RecordDataset(given, batch_size=5, seed=3)
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        assert_exactly_once(_labels(loader), COUNT)


def test_load_a_sharded_set(tmp_path: Path) -> None:
    folder = _shards(tmp_path / "shards")
    one = _file(tmp_path / "one.tr")
    got, want = load(folder), load(one)
    assert torch.equal(got["label"], want["label"]) and torch.equal(got["x"], want["x"])
    assert torch.equal(load(open_set(folder), fields="label", subset=[3, 40])["label"], want["label"][[3, 40]])


def test_verify_a_sharded_set(tmp_path: Path) -> None:
    folder = _shards(tmp_path / "shards")
    records = open_set(folder).num_records  # shards pack several samples per record by default
    assert records < COUNT
    for given in (folder, folder / "manifest.json", open_set(folder)):
        report = verify(given, progress=False)
        assert report.ok and report.records == records


def test_cli_info_head_and_verify_on_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _shards(tmp_path / "shards", _variable)
    assert main(["info", str(folder), "--json", "--scan"]) == 0  # scanned shard by shard
    info = json.loads(capsys.readouterr().out)
    assert info["count"] == COUNT and info["shards"] == SHARDS and info["set_id"] == open_set(folder).set_id
    assert info["payload_bytes"] and info["payload_bytes"] > 0
    assert main(["head", str(folder), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "sample 0:" in out and "sample 1:" in out and "name" in out
    assert main(["verify", str(folder), "-q"]) == 0
    assert "OK" in capsys.readouterr().out


def test_stream_dataset_over_a_sharded_set_says_it_has_no_groups(tmp_path: Path) -> None:
    folder = _shards(tmp_path / "shards")
    with pytest.raises(ValueError, match="has no groups"):
        StreamDataset(folder, batch_size=2)


def test_window_dataset_over_a_sharded_set_says_why_it_cannot(tmp_path: Path) -> None:
    """Robomimic sets are one file: write_shard takes no group_by, and a robomimic set needs a group per demo."""
    folder = _shards(tmp_path / "shards", metadata={"robomimic": {"version": 1, "demos": ["demo_0"]}})
    with pytest.raises(ValueError, match=r"a sharded set has no groups.*from_robomimic"):
        WindowDataset(folder, obs_keys=[], dataset_keys=["actions"])
    with pytest.raises(ValueError, match="not a set converted from robomimic"):
        WindowDataset(_shards(tmp_path / "plain"), obs_keys=[], dataset_keys=["actions"])


def test_record_file_of_a_folder_names_open_set(tmp_path: Path) -> None:
    folder = _shards(tmp_path / "shards")
    with pytest.raises(torchrecord.errors.NotARecordSetError, match=r"open it with torchrecord\.open_set"):
        RecordFile(folder)
    assert not os.path.exists(os.path.join(folder, "data.mdb"))
