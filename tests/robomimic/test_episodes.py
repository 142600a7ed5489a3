"""What a converted robomimic set holds: final frames beside the samples (description version 2), and the
sets of the earlier converter (version 1, final frames in a group of tail records) still read right."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest

from tests.robomimic_files import OBS, write_demo_file
from torchrecord import RecordFile, RecordWriter, SequenceDataset, WindowDataset
from torchrecord._robomimic.episodes import FINAL_PREFIX, TAIL_DEMO, RoboSet
from torchrecord._store.format import META_DB, encode_key
from torchrecord.convert import from_robomimic
from torchrecord.errors import ChecksumError, CorruptRecordError, VersionError

LENGTHS = [7, 3, 12, 5]
OBS_KEYS = ["pos", "cam", "eef"]
DATASET_KEYS = ["actions", "rewards", "dones"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(robomimic HDF5 file, the set this converter writes)."""
    root = tmp_path_factory.mktemp("episodes")
    write_demo_file(root / "demo.hdf5", LENGTHS, seed=5)
    from_robomimic(root / "demo.hdf5", root / "new.tr", progress=False)
    return root / "demo.hdf5", root / "new.tr"


def write_version_1(new: Path, path: Path) -> None:
    """The layout the converter of description version 1 wrote for the same file: one record per step, then
    one more group of tail records (``"demo": -1``, the demo's final next_obs frames in ``obs``, zeros elsewhere)."""
    rf = RecordFile(new)
    robo = RoboSet.open(rf)
    assert robo.finals is not None
    meta = copy.deepcopy(rf.user_metadata)
    described = meta["robomimic"]
    described["version"] = 1
    described["tail_group"] = True
    final_keys = described.pop("final_keys")
    del described["source_dataset_keys"]  # added with version 2
    steps = list(rf)
    names = [f"obs.{k}" for k in final_keys]
    finals = robo.finals.read(np.arange(len(robo.demos)), names, verify=True)
    with RecordWriter(path, shuffle=False, group_by="demo", samples_per_record=1, metadata=meta) as w:
        for step in steps:
            w.append(step)
        for d in range(len(robo.demos)):
            tail = _zeros_like(steps[0])
            tail["demo"] = TAIL_DEMO
            for k in final_keys:
                tail["obs"][k] = finals[f"obs.{k}"][d]
            w.append(tail)


def _zeros_like(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _zeros_like(v) for k, v in node.items()}
    return np.zeros_like(node) if isinstance(node, np.ndarray) else type(node)(0)


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(b, dict):
        assert list(a) == list(b), where
        for k in b:
            _same(a[k], b[k], f"{where}/{k}")
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), where


def test_final_frames_are_beside_the_samples(converted: tuple[Path, Path]) -> None:
    hdf5, path = converted
    import h5py

    rf = RecordFile(path)
    robo = RoboSet.open(rf)
    assert len(rf) == sum(LENGTHS) and rf.num_groups == len(LENGTHS)  # no fake steps
    assert all(s["demo"] >= 0 for s in rf)
    assert rf.user_metadata["robomimic"]["version"] == 2
    assert rf.user_metadata["robomimic"]["final_keys"] == sorted(OBS)  # in the file's key order
    assert robo.tail_first == len(rf) and robo.finals is not None
    finals = robo.finals.read(np.arange(len(LENGTHS)), [f"obs.{k}" for k in OBS], verify=True)
    with h5py.File(hdf5, "r") as f:
        for d in range(len(LENGTHS)):
            for k in OBS:
                want = f[f"data/demo_{d}/next_obs/{k}"][-1]
                got = finals[f"obs.{k}"][d]
                assert got.dtype == want.dtype and np.array_equal(got, want), (d, k)


@pytest.mark.parametrize("cache", [None, "low_dim", "all"])
def test_a_version_1_set_reads_the_same_windows(converted: tuple[Path, Path], tmp_path: Path, cache: Any) -> None:
    """A set of the earlier converter opens, and its windows (next_obs and goals from the tail records) are
    those of the new layout, byte for byte."""
    old = tmp_path / "old.tr"
    write_version_1(converted[1], old)
    assert len(RecordFile(old)) == sum(LENGTHS) + len(LENGTHS)  # the tail group that generic readers return
    assert RoboSet.open(RecordFile(old)).finals is None
    params: dict[str, Any] = dict(seq_length=4, frame_stack=2, get_pad_mask=True, goal_mode="last", frame_cache=cache)
    ours, theirs = (
        SequenceDataset(old, OBS_KEYS, DATASET_KEYS, **params),
        SequenceDataset(converted[1], OBS_KEYS, DATASET_KEYS, **params),
    )
    assert len(ours) == len(theirs) == sum(LENGTHS)
    for i in range(len(theirs)):
        _same(ours[i], theirs[i], f"window {i}")
    stream = dict(seq_length=3, frame_cache=cache, shuffle=False, batch_size=8)
    for a, b in zip(
        WindowDataset(old, OBS_KEYS, DATASET_KEYS, **stream),
        WindowDataset(converted[1], OBS_KEYS, DATASET_KEYS, **stream),
    ):
        _same(a, b, "WindowDataset batch")


def test_a_newer_description_is_refused(converted: tuple[Path, Path], tmp_path: Path) -> None:
    rf = RecordFile(converted[1])
    meta = copy.deepcopy(rf.user_metadata)
    meta["robomimic"]["version"] = 3
    with RecordWriter(tmp_path / "newer.tr", shuffle=False, group_by="demo", metadata=meta) as w:
        for step in rf:
            w.append(step)
    with pytest.raises(VersionError, match=r"robomimic description has version 3.*upgrade torchrecord"):
        SequenceDataset(tmp_path / "newer.tr", OBS_KEYS, DATASET_KEYS)


def _edit_final(path: Path, demo: int, edit: Any) -> None:
    env = lmdb.open(str(path), subdir=False, lock=False, max_dbs=4)
    try:
        db = env.open_db(META_DB)
        with env.begin(write=True, db=db) as txn:
            key = FINAL_PREFIX + encode_key(demo)
            value = txn.get(key)
            assert value is not None
            changed = edit(bytearray(value))
            if changed is None:
                txn.delete(key)
            else:
                txn.put(key, bytes(changed))
    finally:
        env.close()


def _flip_last(value: bytearray) -> bytearray:
    value[-1] ^= 1
    return value


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        (_flip_last, ChecksumError, "final next_obs frames of demo 2 fail their CRC-32"),
        (lambda value: value[:-1], CorruptRecordError, "final next_obs frames of demo 2 hold"),
        (lambda value: None, CorruptRecordError, "final next_obs frames of demo 2 are missing"),
    ],
)
def test_damaged_final_frames_are_named(
    converted: tuple[Path, Path], tmp_path: Path, edit: Any, error: type[Exception], match: str
) -> None:
    path = tmp_path / "damaged.tr"
    path.write_bytes(converted[1].read_bytes())
    _edit_final(path, 2, edit)
    ds = SequenceDataset(path, ["cam"], [], goal_mode="last", frame_cache=None, check="checksums")
    with pytest.raises(error, match=match):
        ds[LENGTHS[0] + LENGTHS[1]]  # a window of demo 2: its goal is demo 2's final frame
    assert len(RecordFile(path)) == sum(LENGTHS)  # the samples are untouched
