"""write_shard against the set already in its folder: settings checked before anything is written or removed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from torchrecord import RecordFile, finalize_shards, open_set, write_shard
from torchrecord.errors import ArgumentError, FormatError, IncompleteRecordSetError, SchemaError, SourceError

N = 2
COUNT = 20


def _data(offset: int = 0, kind: type = int) -> list[dict[str, Any]]:
    return [{"x": kind(i + offset)} for i in range(COUNT)]


def _shard(folder: Path, shard: int, data: Any = None, **kw: Any) -> RecordFile:
    kw.setdefault("num_shards", N)
    kw.setdefault("seed", 0)
    return write_shard(_data() if data is None else data, folder, shard=shard, progress=False, **kw)


def _finalized(tmp_path: Path) -> tuple[Path, bytes, list[int]]:
    folder = tmp_path / "shards"
    for i in range(N):
        _shard(folder, i)
    return folder, (folder / "manifest.json").read_bytes(), _values(folder)


def _values(folder: Path) -> list[int]:
    return [int(sample["x"]) for sample in open_set(folder)]


def _shard_ids(folder: Path) -> list[str]:
    return [RecordFile(folder / f"shard-{i:05d}-of-{N:05d}.tr").set_id for i in range(N)]


def test_a_retry_with_another_seed_leaves_the_finalized_set_readable(tmp_path: Path) -> None:
    folder, manifest, values = _finalized(tmp_path)
    ids = _shard_ids(folder)
    for overwrite in (True, False):
        with pytest.raises(ArgumentError, match=r"shard 1 has seed=1, but the finalized set .* seed=0") as err:
            _shard(folder, 1, seed=1, overwrite=overwrite)
        assert "nothing was written or removed" in str(err.value) and "another folder" in str(err.value)
    assert (folder / "manifest.json").read_bytes() == manifest  # the set was never taken offline
    assert _shard_ids(folder) == ids
    assert _values(folder) == values


def test_another_num_shards_is_refused_when_the_shard_starts(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    _shard(folder, 0)  # 1 of 2: not finalized
    before = sorted(os.listdir(folder))
    with pytest.raises(ArgumentError, match=r"shards of a set of 2 shards .* num_shards=3.*Pass num_shards=2"):
        _shard(folder, 2, num_shards=3)
    assert sorted(os.listdir(folder)) == before  # nothing written, nothing removed
    _shard(folder, 1)
    manifest = (folder / "manifest.json").read_bytes()
    with pytest.raises(ArgumentError, match=r"num_shards=3"):
        _shard(folder, 0, num_shards=3, overwrite=True)
    assert (folder / "manifest.json").read_bytes() == manifest


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [("seed", 5, "seed=5"), ("shuffle", False, "shuffle=False"), ("samples_per_record", 1, "samples_per_record=1")],
)
def test_other_settings_than_the_shards_present_are_refused_at_start(
    tmp_path: Path, option: str, value: Any, named: str
) -> None:
    folder = tmp_path / "shards"
    _shard(folder, 0, num_shards=3)
    before = sorted(os.listdir(folder))
    with pytest.raises(ArgumentError, match=rf"shard 1 has {named}, but shard 0 was written with {option}=") as err:
        _shard(folder, 1, num_shards=3, **{option: value})
    assert "shard-00000-of-00003.tr" in str(err.value)  # the stale one to remove, if it is the wrong one
    assert sorted(os.listdir(folder)) == before


def test_a_map_source_of_another_length_is_refused_at_start(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    _shard(folder, 0)
    with pytest.raises(ArgumentError, match=r"len\(dataset\)=19, but shard 0 was written with len\(dataset\)=20"):
        _shard(folder, 1, data=_data()[:19])


def test_overwrite_keeps_the_old_manifest_until_a_new_one_replaces_it(tmp_path: Path) -> None:
    folder, manifest, values = _finalized(tmp_path)

    class Failing(torch.utils.data.Dataset[Any]):
        def __len__(self) -> int:
            return COUNT

        def __getitem__(self, i: int) -> Any:
            if i == 15:
                raise OSError("the source broke")
            return {"x": i}

    with pytest.raises(SourceError):
        _shard(folder, 1, data=Failing(), overwrite=True)
    assert (folder / "manifest.json").read_bytes() == manifest  # a failed rewrite: still readable
    assert _values(folder) == values
    # a rewrite that is published but not finalized: the old manifest stays, readers refuse the new shard
    _shard(folder, 1, data=_data(100), overwrite=True, finalize=False)
    assert (folder / "manifest.json").read_bytes() == manifest
    with pytest.raises(FormatError, match="rewritten after the set was finalized"):
        _values(folder)
    # a rewrite is a new write attempt: the old shard 0 does not belong to it, so no set of both is published
    with pytest.raises(IncompleteRecordSetError, match=r"another write attempt.*shard 0 \(plan-"):
        finalize_shards(folder)
    assert (folder / "manifest.json").read_bytes() == manifest
    _shard(folder, 0, data=_data(100), overwrite=True)  # the rewrite's last shard: it finalizes the new set
    assert _values(folder) == [v + 100 for v in values]
    # with finalize=True (the default) a writer replaces the manifest itself once every shard is rewritten
    for i in range(N):
        _shard(folder, i, overwrite=True)
    assert _values(folder) == values


def test_overwrite_with_other_fields_is_not_published(tmp_path: Path) -> None:
    folder, manifest, values = _finalized(tmp_path)
    ids = _shard_ids(folder)
    with pytest.raises(SchemaError, match=r"shard-00001-of-00002.tr, field 'x': float of float64"):
        _shard(folder, 1, data=_data(kind=float), overwrite=True)
    assert _shard_ids(folder) == ids and (folder / "manifest.json").read_bytes() == manifest
    assert _values(folder) == values
    assert not [name for name in os.listdir(folder) if name.startswith(".")]  # its temporary is gone


def test_overwrite_with_another_packing_is_not_published(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    for i in range(N):  # iterable parts, packing chosen from the first sample
        write_shard(iter([torch.zeros(2, 3)] * 5), folder, shard=i, num_shards=N, progress=False)
    manifest = (folder / "manifest.json").read_bytes()
    with pytest.raises(FormatError, match=r"the new shard-00001-of-00002.tr holds \d+ samples per record"):
        write_shard(iter([torch.ones(2, 50)] * 5), folder, shard=1, num_shards=N, overwrite=True, progress=False)
    assert (folder / "manifest.json").read_bytes() == manifest
    assert len(open_set(folder)) == 10 and all(float(t.sum()) == 0 for t in open_set(folder))


def test_a_retry_of_a_finalized_shard_with_its_settings_is_a_no_op(tmp_path: Path) -> None:
    folder, manifest, _ = _finalized(tmp_path)
    ids = _shard_ids(folder)
    assert _shard(folder, 1).set_id == ids[1]
    assert _shard_ids(folder) == ids and (folder / "manifest.json").read_bytes() == manifest


def test_an_empty_shard_does_not_fail_the_packing_check(tmp_path: Path) -> None:
    folder = tmp_path / "few"
    data = [{"x": torch.zeros(3), "i": i} for i in range(3)]  # 3 samples in 4 shards: shard 0 is empty
    for i in range(4):
        write_shard(data, folder, shard=i, num_shards=4, seed=0, progress=False)
    rs = open_set(folder)
    assert [e["count"] for e in rs.manifest["shards"]] == [0, 1, 1, 1]
    assert sorted(int(s["i"]) for s in rs) == [0, 1, 2]
