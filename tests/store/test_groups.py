"""Grouped record sets: group_by on both writers, the stored offsets, and readers that ignore them."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import torch

import torchrecord
from torchrecord import RecordDataset, RecordFile, RecordWriter
from torchrecord.errors import CorruptRecordError, SampleTypeError, SampleValueError, SourceError

#: group sizes of the test source: 40 groups of 1 to 7 samples
SIZES = [1 + (g * 5) % 7 for g in range(40)]


def _episodes(sizes: list[int] = SIZES) -> list[dict[str, Any]]:
    """Samples {"episode": g, "step": k, "obs": float32[3] = (g, k, 0)}, group after group."""
    return [
        {"episode": g, "step": k, "obs": torch.tensor([g, k, 0], dtype=torch.float32)}
        for g, n in enumerate(sizes)
        for k in range(n)
    ]


class Episodes(torch.utils.data.Dataset[dict[str, Any]]):
    """The same samples as a map-style dataset (module level: works in worker processes)."""

    def __init__(self, sizes: list[int] = SIZES) -> None:
        self.samples = _episodes(sizes)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.samples[i]


def _episode_of(sample: dict[str, Any]) -> int:
    return int(sample["episode"])


def assert_grouped(rf: RecordFile, sizes: list[int] = SIZES) -> list[int]:
    """Each stored group is one whole source episode, steps in order; returns the stored episode order."""
    offsets = rf.groups
    assert offsets is not None and offsets.dtype == np.int64
    assert rf.num_groups == len(sizes) == len(offsets) - 1
    assert offsets[0] == 0 and offsets[-1] == len(rf) == sum(sizes)
    order = []
    for g in range(rf.num_groups):
        samples = rf.group(g)
        episode = samples[0]["episode"]
        assert [s["episode"] for s in samples] == [episode] * sizes[episode]
        assert [s["step"] for s in samples] == list(range(sizes[episode]))  # inner order kept
        assert all(s["obs"].tolist() == [episode, s["step"], 0] for s in samples)
        order.append(episode)
    assert sorted(order) == list(range(len(sizes)))
    return order


# -- round trips --------------------------------------------------------------------------------------


@pytest.mark.parametrize("per_record", [1, 4])
def test_round_trip_in_source_order(tmp_path: Path, per_record: int) -> None:
    rf = torchrecord.write_record(
        _episodes(), tmp_path / "g.tr", group_by="episode", shuffle=False, samples_per_record=per_record, progress=False
    )
    assert assert_grouped(rf) == list(range(len(SIZES)))
    assert rf.groups.tolist() == [0, *np.cumsum(SIZES).tolist()]
    assert rf.metadata["groups"] == len(SIZES) and rf.metadata["group_by"] == "episode"
    assert torchrecord.verify(rf.path).ok


@pytest.mark.parametrize("per_record", [1, 4])
def test_whole_groups_are_shuffled(tmp_path: Path, per_record: int) -> None:
    rf = torchrecord.write_record(
        _episodes(), tmp_path / "g.tr", group_by="episode", seed=3, samples_per_record=per_record, progress=False
    )
    order = assert_grouped(rf)
    assert order != list(range(len(SIZES)))  # the group order differs from the source's
    assert order == np.random.default_rng(3).permutation(len(SIZES)).tolist()  # the documented permutation
    assert rf.groups.tolist() == [0, *np.cumsum([SIZES[e] for e in order]).tolist()]
    other = torchrecord.write_record(_episodes(), tmp_path / "h.tr", group_by="episode", seed=4, progress=False)
    assert assert_grouped(other) != order


def test_group_access(tmp_path: Path) -> None:
    rf = torchrecord.write_record(_episodes(), tmp_path / "g.tr", group_by="episode", progress=False)
    assert [s["step"] for s in rf.group(-1)] == [s["step"] for s in rf.group(rf.num_groups - 1)]
    assert rf.group(-rf.num_groups)[0]["episode"] == rf.group(0)[0]["episode"]
    for g in (rf.num_groups, -rf.num_groups - 1):
        with pytest.raises(IndexError, match="40 groups"):
            rf.group(g)
    with pytest.raises(ValueError):
        rf.groups[0] = 5  # read-only view


def test_an_ungrouped_set_has_no_groups(tmp_path: Path) -> None:
    rf = torchrecord.write_record(_episodes(), tmp_path / "u.tr", progress=False)
    assert rf.groups is None and rf.num_groups == 0 and "groups" not in rf.metadata
    with pytest.raises(IndexError, match="no groups"):
        rf.group(0)


def test_an_empty_grouped_set(tmp_path: Path) -> None:
    with pytest.warns(torchrecord.TorchRecordWarning, match="no samples"):
        rf = torchrecord.write_record([], tmp_path / "e.tr", group_by="episode", progress=False)
    assert rf.groups is not None and rf.groups.tolist() == [0] and rf.num_groups == 0


def test_callable_and_nested_field_group_by(tmp_path: Path) -> None:
    as_tuples = [(s["obs"], s["step"], {"ep": s["episode"]}) for s in _episodes()]
    by_field = torchrecord.write_record(as_tuples, tmp_path / "f.tr", group_by="2.ep", seed=1, progress=False)
    by_call = torchrecord.write_record(
        as_tuples, tmp_path / "c.tr", group_by=lambda s: s[2]["ep"], seed=1, progress=False
    )
    assert by_field.metadata["group_by"] == "2.ep" and by_call.metadata["group_by"] == "<callable>"
    assert by_field.groups.tolist() == by_call.groups.tolist()
    for rf in (by_field, by_call):
        for g in range(rf.num_groups):
            samples = rf.group(g)
            assert len({s[2]["ep"] for s in samples}) == 1
            assert [s[1] for s in samples] == list(range(len(samples)))
    # a 0-d tensor key from a function is its value
    tensors = torchrecord.write_record(
        _episodes(), tmp_path / "t.tr", group_by=lambda s: torch.tensor(s["episode"]), progress=False
    )
    assert tensors.num_groups == len(SIZES)


def _stream() -> Iterator[dict[str, Any]]:
    yield from _episodes()


@pytest.mark.parametrize("shuffle", [False, True])
def test_iterable_source(tmp_path: Path, shuffle: bool) -> None:
    rf = torchrecord.write_record(_stream(), tmp_path / "g.tr", group_by="episode", shuffle=shuffle, progress=False)
    order = assert_grouped(rf)
    assert (order == list(range(len(SIZES)))) != shuffle


@pytest.mark.parametrize("shuffle", [False, True])
def test_map_style_with_two_workers(tmp_path: Path, shuffle: bool) -> None:
    sizes = [1 + (g * 3) % 5 for g in range(150)]  # 450 samples: several worker batches
    rf = torchrecord.write_record(
        Episodes(sizes), tmp_path / "g.tr", group_by=_episode_of, shuffle=shuffle, num_workers=2, progress=False
    )
    order = assert_grouped(rf, sizes)
    if shuffle:
        assert order == np.random.default_rng(0).permutation(len(sizes)).tolist()
    else:
        assert order == list(range(len(sizes)))
    # the same set as read without workers
    alone = torchrecord.write_record(
        Episodes(sizes), tmp_path / "h.tr", group_by="episode", shuffle=shuffle, progress=False
    )
    assert alone.groups.tolist() == rf.groups.tolist()
    assert [s["step"] for s in alone] == [s["step"] for s in rf]


def test_numpy_keys_survive_worker_processes(tmp_path: Path) -> None:
    """DataLoader workers turn NumPy scalars into tensors (hashed by identity): keys must be plain values."""
    sizes = [1 + (g * 3) % 5 for g in range(100)]
    rf = torchrecord.write_record(
        Episodes(sizes),
        tmp_path / "g.tr",
        group_by=lambda s: (np.int64(s["episode"]), "run"),
        num_workers=2,
        progress=False,
    )
    assert_grouped(rf, sizes)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("per_record", [1, 4])
def test_record_writer_groups(tmp_path: Path, shuffle: bool, per_record: int) -> None:
    with RecordWriter(
        tmp_path / "g.tr", group_by="episode", shuffle=shuffle, samples_per_record=per_record, seed=5, progress=False
    ) as w:
        for sample in _episodes():
            w.append(sample)
    assert w.result is not None
    order = assert_grouped(w.result)
    expected = np.random.default_rng(5).permutation(len(SIZES)).tolist() if shuffle else list(range(len(SIZES)))
    assert order == expected
    # the same set write_record gives
    same = torchrecord.write_record(
        _episodes(), tmp_path / "h.tr", group_by="episode", shuffle=shuffle, seed=5, progress=False
    )
    assert same.groups.tolist() == w.result.groups.tolist()


def test_skipped_samples_leave_their_group_whole(tmp_path: Path) -> None:
    samples: list[Any] = _episodes()
    samples[2] = {"episode": samples[2]["episode"], "bad": {1}}  # unstorable, in the middle of a group
    rf = torchrecord.write_record(samples, tmp_path / "g.tr", group_by="episode", on_error="skip", progress=False)
    assert rf.metadata["skipped"] == 1 and len(rf) == sum(SIZES) - 1
    assert rf.num_groups == len(SIZES)


# -- bad grouping ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_group_that_comes_back_names_both_samples(tmp_path: Path, num_workers: int, shuffle: bool) -> None:
    samples = _episodes([3, 2, 2])  # episodes 0 0 0 1 1 2 2
    samples.append(dict(samples[0]))  # sample 7: episode 0 again, after episodes 1 and 2
    path = tmp_path / "g.tr"
    with pytest.raises(SourceError) as info:
        torchrecord.write_record(
            samples, path, group_by="episode", shuffle=shuffle, num_workers=num_workers, progress=False
        )
    message = str(info.value)
    assert str(path) in message and "sample 7 has group key 0" in message
    assert "ended at sample 2" in message and "group 2 started at sample 5" in message
    assert list(tmp_path.iterdir()) == []


def test_a_group_that_comes_back_through_the_writer(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path / "g.tr", group_by=lambda s: s[1], progress=False)
    with pytest.raises(SourceError, match=r"sample 3 has group key 'a'.*ended at sample 1"), writer as w:
        for i, key in enumerate("aabab"):
            w.append((i, key))
    assert list(tmp_path.iterdir()) == []


def test_bad_group_keys(tmp_path: Path) -> None:
    with pytest.raises(SampleValueError, match=r"sample 0, group_by field 'episod'.*no such field.*'episode'\?"):
        torchrecord.write_record(_episodes(), tmp_path / "a.tr", group_by="episod", progress=False)
    with pytest.raises(SampleTypeError, match=r"sample 0, group_by field 'obs'.*one value; got shape \[3\]"):
        torchrecord.write_record(_episodes(), tmp_path / "b.tr", group_by="obs", progress=False)
    with pytest.raises(SampleTypeError, match=r"sample 0, group_by returned an unhashable list"):
        torchrecord.write_record(_episodes(), tmp_path / "c.tr", group_by=lambda s: [1], progress=False)
    with pytest.raises(ValueError, match="field name"):
        torchrecord.write_record(_episodes(), tmp_path / "d.tr", group_by=3, progress=False)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


# -- readers that do not know groups; damaged offsets ------------------------------------------------------


def _edit_meta(source: Path, target: Path, key: bytes, value: bytes | None) -> None:
    """Copy ``source`` to ``target`` and set (or with None delete) ``key`` in its meta database by raw LMDB."""
    shutil.copy(source, target)
    env = lmdb.open(str(target), subdir=False, max_dbs=4, lock=False)
    try:
        with env.begin(write=True, db=env.open_db(b"meta")) as txn:
            if value is None:
                assert txn.delete(key)
            else:
                txn.put(key, value)
    finally:
        env.close()


def test_a_reader_without_group_data_reads_every_sample(tmp_path: Path) -> None:
    grouped = torchrecord.write_record(_episodes(), tmp_path / "g.tr", group_by="episode", seed=2, progress=False)
    _edit_meta(tmp_path / "g.tr", tmp_path / "old.tr", b"groups", None)
    rf = RecordFile(tmp_path / "old.tr")
    expected = [(s["episode"], s["step"]) for s in grouped]
    assert [(s["episode"], s["step"]) for s in rf] == expected
    assert [(rf[i]["episode"], rf[i]["step"]) for i in range(len(rf))] == expected
    dataset = RecordDataset(tmp_path / "old.tr", shuffle=False)
    assert sorted((s["episode"], s["step"]) for s in dataset) == sorted(expected)
    assert torchrecord.verify(tmp_path / "old.tr").ok
    with pytest.raises(CorruptRecordError, match=r"old\.tr.*no offsets"):
        assert rf.groups is None


@pytest.mark.parametrize(
    ("offsets", "words"),
    [
        (np.array([0, 5, 3, 116], dtype="<i8"), "40 groups need"),  # wrong length
        (np.r_[1, np.cumsum(SIZES)].astype("<i8"), "not from 0"),
        (np.r_[0, np.cumsum(SIZES)[:-1], 999].astype("<i8"), "not from 0"),
        (np.r_[0, 3, 2, np.cumsum(SIZES)[2:]].astype("<i8"), "must increase"),
    ],
)
def test_damaged_offsets_are_corrupt_record_errors(tmp_path: Path, offsets: np.ndarray, words: str) -> None:
    torchrecord.write_record(_episodes(), tmp_path / "g.tr", group_by="episode", shuffle=False, progress=False)
    _edit_meta(tmp_path / "g.tr", tmp_path / "bad.tr", b"groups", offsets.tobytes())
    rf = RecordFile(tmp_path / "bad.tr")
    with pytest.raises(CorruptRecordError, match=rf"bad\.tr: the group offsets are damaged.*{words}"):
        assert rf.groups is None
    assert len(list(rf)) == sum(SIZES)  # the samples still read
