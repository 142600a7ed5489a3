"""The RecordSet contract, checked the same way on a single file and on a sharded set of the same samples."""

from __future__ import annotations

import inspect
import pickle
import pydoc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import torchrecord
from torchrecord import RecordFile, RecordSet, ShardedSet, open_set, write_record, write_shard
from torchrecord.errors import NotARecordSetError

COUNT = 37  # not a multiple of the shards or of samples_per_record
SHARDS = 3
USER = {"source": "conformance", "classes": [1, 2]}


def _sample(i: int) -> dict[str, Any]:
    return {"x": torch.full((3,), float(i)), "label": i, "name": f"s{i:03d}"}


def _label(sample: dict[str, Any]) -> int:
    return int(sample["label"])


@pytest.fixture(params=["file", "sharded", "file-k4", "sharded-k4"])
def record_set(request: pytest.FixtureRequest, tmp_path: Path) -> RecordSet:
    """The same COUNT samples in stored order 0..COUNT-1, as one file or as shards (k4: 4 samples per record)."""
    kind = str(request.param)
    samples = [_sample(i) for i in range(COUNT)]
    kw: dict[str, Any] = {"shuffle": False, "progress": False, "metadata": USER}
    if kind.endswith("k4"):
        kw["samples_per_record"] = 4
    if kind.startswith("file"):
        write_record(samples, tmp_path / "set.tr", **kw)
        return open_set(tmp_path / "set.tr")
    for s in range(SHARDS):
        write_shard(samples, tmp_path / "shards", shard=s, num_shards=SHARDS, **kw)
    return open_set(tmp_path / "shards")


def test_it_is_a_record_set_of_the_right_kind(record_set: RecordSet) -> None:
    assert isinstance(record_set, RecordSet)
    assert isinstance(record_set, ShardedSet) == (record_set.num_shards > 1)
    assert isinstance(record_set, RecordFile) != isinstance(record_set, ShardedSet)


def test_description(record_set: RecordSet) -> None:
    assert len(record_set) == COUNT
    assert record_set.read_header()["count"] == COUNT
    assert record_set.metadata["count"] == COUNT
    assert sorted(record_set.schema.names) == ["label", "name", "x"]
    assert isinstance(record_set.set_id, str) and record_set.set_id
    k = record_set.samples_per_record
    assert k in (1, 4)
    assert record_set.num_records == sum(-(-len(record_set.shard(s)) // k) for s in range(record_set.num_shards))
    assert record_set.size_bytes > 0
    assert record_set.user_metadata == USER
    assert record_set.write_summary.count == COUNT and record_set.write_summary.skipped == 0
    assert record_set.subset is None


def test_indexing_slices_and_getitems(record_set: RecordSet) -> None:
    rs = record_set
    assert _label(rs[0]) == 0 and _label(rs[-1]) == COUNT - 1 and _label(rs[20]) == 20
    assert rs[20]["name"] == "s020" and torch.equal(rs[20]["x"], torch.full((3,), 20.0))
    assert [_label(s) for s in rs[2:30:7]] == list(range(2, 30, 7))
    assert [_label(s) for s in rs[[30, 1, 30, -2]]] == [30, 1, 30, COUNT - 2]
    assert [_label(s) for s in rs[np.array([5, 12, 25])]] == [5, 12, 25]
    assert [_label(s) for s in rs.__getitems__(torch.tensor([36, 0, 13]))] == [36, 0, 13]
    assert rs.__getitems__([]) == []
    twice = rs[[7, 7]]
    assert twice[0] is not twice[1] and twice[0]["x"] is not twice[1]["x"]  # no shared tensors
    for bad in (COUNT, -COUNT - 1):
        with pytest.raises(IndexError, match="out of range"):
            rs[bad]
    with pytest.raises(IndexError, match="out of range"):
        rs[[0, COUNT]]
    for wrong in (1.5, "3", True):
        with pytest.raises(TypeError):
            rs[wrong]
    with pytest.raises(TypeError, match=r"numpy\.flatnonzero"):
        rs.__getitems__(np.ones(COUNT, dtype=bool))


def test_iteration_and_files(record_set: RecordSet) -> None:
    rs = record_set
    assert [_label(s) for s in rs] == list(range(COUNT))
    offsets = rs.shard_offsets
    assert offsets.dtype == np.int64 and len(offsets) == rs.num_shards + 1
    assert offsets[0] == 0 and offsets[-1] == COUNT
    for s in range(rs.num_shards):
        shard = rs.shard(s)
        assert isinstance(shard, RecordFile)  # always one file: the place readers get an environment
        assert len(shard) == offsets[s + 1] - offsets[s]
        env, db = shard.environment()
        assert env is not None and db is not None
        assert rs.locate(int(offsets[s])) == (s, 0)
    with pytest.raises(IndexError):
        rs.shard(rs.num_shards)
    rs.prefetch(list(range(rs.num_shards)))
    rs.release(0)
    assert _label(rs[0]) == 0  # released shards open again


def test_records_raw_and_decode(record_set: RecordSet) -> None:
    rs, k = record_set, record_set.samples_per_record
    last = rs.num_records - 1
    assert isinstance(rs.raw(0), bytes) and rs.raw(-1) == rs.raw(last)
    with pytest.raises(IndexError, match="record index"):
        rs.raw(rs.num_records)
    for record in (0, last):
        samples = rs.decode_record(rs.raw(record), record)
        assert 1 <= len(samples) <= k
        if k == 1:
            assert _label(rs.decode(rs.raw(record), record)) == _label(samples[0])
    assert [_label(s) for s in rs.decode_record(rs.raw(0), 0)] == list(range(k))


def test_groups(record_set: RecordSet) -> None:
    assert record_set.groups is None and record_set.num_groups == 0
    with pytest.raises(IndexError, match="no groups"):
        record_set.group(0)


def test_grouped_file_groups(tmp_path: Path) -> None:
    samples = [{"g": i // 5, "v": i} for i in range(20)]
    rs = open_set(write_record(samples, tmp_path / "g.tr", group_by="g", shuffle=False, progress=False).path)
    assert rs.num_groups == 4 and list(rs.groups) == [0, 5, 10, 15, 20]  # type: ignore[arg-type]
    assert [s["v"] for s in rs.group(-1)] == [15, 16, 17, 18, 19]


def test_pickling(record_set: RecordSet) -> None:
    len(record_set), record_set[3]  # opened: what pickles is the location and the identity, not the handles
    copy = pickle.loads(pickle.dumps(record_set))
    assert type(copy) is type(record_set)
    assert copy.path == record_set.path and copy.set_id == record_set.set_id and len(copy) == COUNT
    assert [_label(s) for s in copy[[0, 18, 36]]] == [0, 18, 36]


def test_close_and_with(record_set: RecordSet) -> None:
    rs = record_set
    assert _label(rs[10]) == 10
    rs.close()
    assert _label(rs[11]) == 11  # usable again after close
    with rs as opened:
        assert opened is rs and len(opened) == COUNT
    assert [_label(s) for s in rs[0:3]] == [0, 1, 2]


def test_map_style_dataloader_with_workers(record_set: RecordSet) -> None:
    loader = DataLoader(record_set, batch_size=8, num_workers=2, multiprocessing_context="fork")
    labels = sorted(int(y) for batch in loader for y in batch["label"])
    assert labels == list(range(COUNT))


# -- RecordFile is one file ------------------------------------------------------------------


def test_record_file_shows_its_real_parameters() -> None:
    params = inspect.signature(RecordFile).parameters
    assert list(params) == ["path", "subset", "check"]
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    text = pydoc.render_doc(RecordFile, renderer=pydoc.plaintext)
    assert "RecordFile(path" in text and "**kwargs" not in text.split("Methods defined here")[0]
    assert "subset" in text and "check" in text


def test_record_file_of_a_sharded_set_says_how_to_open_it(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    for s in range(2):
        write_shard([_sample(i) for i in range(6)], folder, shard=s, num_shards=2, progress=False)
    for where in (folder, folder / "manifest.json", str(folder).encode(), "file://" + str(folder)):
        with pytest.raises(NotARecordSetError, match=r"sharded set.*torchrecord\.open_set\(") as err:
            RecordFile(where)  # type: ignore[arg-type]
        assert str(folder) in str(err.value)
    with pytest.raises(torchrecord.TorchRecordError):  # catchable as the library's error, as before
        RecordFile(folder)


def test_record_file_of_an_unfinalized_folder_fails_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    write_shard([_sample(i) for i in range(6)], folder, shard=0, num_shards=2, progress=False)  # 1 of 2
    with pytest.raises(NotARecordSetError, match=r"never finalized; run torchrecord\.finalize_shards"):
        RecordFile(folder)  # not at len()
    with pytest.raises(NotARecordSetError, match="never finalized"):
        open_set(folder)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NotARecordSetError, match="is a directory"):
        RecordFile(empty)
