"""from_robomimic and `torchrecord convert` on robomimic files: layout, next_obs stored once, checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from tests.robomimic_files import DATASET, ENV_ARGS, OBS, write_demo_file
from torchrecord import RecordFile
from torchrecord._robomimic.episodes import RoboSet
from torchrecord.cli import main
from torchrecord.convert import convert, detect_format, from_robomimic
from torchrecord.errors import RecordExistsError, SourceError

LENGTHS = [6, 1, 13, 4]
IDS = [3, 0, 12, 5]  # non-dense; robomimic's order is demo_0, demo_3, demo_5, demo_12


def check_against_source(hdf5: Path, path: Path, obs_keys: list[str] | None = None) -> RoboSet:
    """Every frame of every converted key, read back through the layout, equals the HDF5 file's."""
    rf = RecordFile(path)
    robo = RoboSet.open(rf)
    records = list(rf)
    with h5py.File(hdf5, "r") as f:
        order = sorted(f["data"].keys(), key=lambda d: int(d[5:]))
        assert list(robo.demos) == order
        for d, demo in enumerate(robo.demos):
            g = f["data"][demo]
            n = int(g.attrs["num_samples"])
            steps = records[robo.first[d] : robo.first[d] + n]
            assert all(s["demo"] == d for s in steps)
            for k in obs_keys or list(OBS):
                np.testing.assert_array_equal(np.stack([s["obs"][k] for s in steps]), g[f"obs/{k}"][()])
                if "next_obs" not in g:
                    continue
                if robo.next_obs[k] == "shift":
                    assert robo.tail_first is not None
                    tail = records[robo.tail_first + d]
                    nxt = np.stack([s["obs"][k] for s in steps[1:]] + [tail["obs"][k]])
                else:
                    nxt = np.stack([s["next_obs"][k] for s in steps])
                np.testing.assert_array_equal(nxt, g[f"next_obs/{k}"][()])
                assert nxt.dtype == g[f"next_obs/{k}"].dtype
            for k in robo.dataset_keys:
                np.testing.assert_array_equal(np.stack([s[k] for s in steps]), g[k][()])
    return robo


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_layout_order_and_metadata(tmp_path: Path, compression: str | None) -> None:
    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS, compression=compression)
    with h5py.File(hdf5, "r") as f:
        assert (f["data/demo_3/obs/cam"].chunks is not None) == (compression == "gzip")
    rf = from_robomimic(hdf5, tmp_path / "out.tr", progress=False)
    robo = check_against_source(hdf5, tmp_path / "out.tr")
    assert robo.demos == ("demo_0", "demo_3", "demo_5", "demo_12")
    assert robo.lengths.tolist() == [1, 6, 4, 13]
    # every next_obs is a shift here: stored once, one tail record per demo in a last group
    assert robo.next_obs == dict.fromkeys(OBS, "shift")
    assert not [n for n in rf.schema.names if n.startswith("next_obs")]
    assert len(rf) == sum(LENGTHS) + len(LENGTHS)
    assert rf.groups.tolist() == [0, 1, 7, 11, 24, 28]
    meta = rf.user_metadata
    assert meta["source_format"] == "robomimic"
    info = meta["robomimic"]
    assert json.loads(info["env_args"]) == ENV_ARGS
    assert info["data_attrs"] == {"total": sum(LENGTHS)}
    assert info["attrs"][1] == {"num_samples": 6, "model_file": "<mujoco model='demo_3'/>"}
    assert info["masks"] == {"train": ["demo_3", "demo_12", "demo_5"], "valid": ["demo_0"]}
    assert info["dataset_keys"] == ["actions", "rewards", "dones"]
    assert rf.schema.names[0] == "demo" and rf.metadata["shuffled"] is False


def test_gzip_and_contiguous_give_the_same_records(tmp_path: Path) -> None:
    for name, compression in (("raw", None), ("gz", "gzip")):
        write_demo_file(tmp_path / f"{name}.hdf5", LENGTHS, ids=IDS, compression=compression, seed=4)
        from_robomimic(tmp_path / f"{name}.hdf5", tmp_path / f"{name}.tr", progress=False)
    a, b = RecordFile(tmp_path / "raw.tr"), RecordFile(tmp_path / "gz.tr")
    assert [a.raw(i) for i in range(a.num_records)] == [b.raw(i) for i in range(b.num_records)]


def test_next_obs_that_is_not_a_shift_is_stored(tmp_path: Path) -> None:
    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS, next_obs="noshift")
    rf = from_robomimic(hdf5, tmp_path / "out.tr", progress=False)
    robo = check_against_source(hdf5, tmp_path / "out.tr")
    assert robo.next_obs == dict.fromkeys(OBS, "stored") and robo.tail_first is None
    assert len(rf) == sum(LENGTHS) and rf.num_groups == len(LENGTHS)


def test_a_shift_broken_in_a_later_demo_is_stored(tmp_path: Path) -> None:
    """Demo 0 looks shifted; demo 12's cam next_obs differs in one byte: cam is stored, the rest shifted."""
    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS)
    with h5py.File(hdf5, "r+") as f:
        f["data/demo_12/next_obs/cam"][3, 0, 0, 0] ^= 1
    from_robomimic(hdf5, tmp_path / "out.tr", progress=False)
    robo = check_against_source(hdf5, tmp_path / "out.tr")
    assert robo.next_obs == {**dict.fromkeys(OBS, "shift"), "cam": "stored"}
    assert robo.tail_first is not None


def test_no_next_obs(tmp_path: Path) -> None:
    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS, next_obs="none")
    rf = from_robomimic(hdf5, tmp_path / "out.tr", progress=False)
    robo = check_against_source(hdf5, tmp_path / "out.tr")
    assert robo.next_obs == {} and robo.tail_first is None and len(rf) == sum(LENGTHS)


def test_chosen_keys_and_a_dataset_key_no_demo_has(tmp_path: Path) -> None:
    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS)
    rf = from_robomimic(
        hdf5, tmp_path / "out.tr", obs_keys=["pos"], dataset_keys=["actions", "labels", "absent"], progress=False
    )
    check_against_source(hdf5, tmp_path / "out.tr", obs_keys=["pos"])
    assert rf.schema.names == ["demo", "obs.pos", "actions", "labels"]
    assert rf.user_metadata["robomimic"]["missing_dataset_keys"] == ["absent"]
    assert {f.name: f.dtype for f in rf.schema.fields}["labels"] == "int64" == np.dtype(DATASET["labels"][1]).name


def _edit(hdf5: Path, action: Any) -> None:
    with h5py.File(hdf5, "r+") as f:
        action(f)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda f: f["data/demo_5"].attrs.__setitem__("num_samples", 5), r"demo 'demo_5', key '\w+' has 4 rows"),
        (lambda f: f["data/demo_3"].attrs.__delitem__("num_samples"), "demo 'demo_3' has no num_samples"),
        (lambda f: f.__delitem__("data/demo_12/obs/eef"), "demo 'demo_12' has no dataset 'obs/eef'"),
        (lambda f: f.__delitem__("data/demo_0/actions"), "demo 'demo_0' lacks key 'actions'"),
        (lambda f: f.__delitem__("data/demo_3/next_obs"), "demo 'demo_3' has no next_obs"),
        (lambda f: f.create_dataset("mask/bad", data=np.array([b"demo_9"])), "mask 'bad' lists demo 'demo_9'"),
        (lambda f: f.move("data/demo_5", "data/demo_x"), "demo_<number>"),
    ],
)
def test_source_errors_name_demo_and_key(tmp_path: Path, edit: Any, match: str) -> None:
    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS)
    _edit(hdf5, edit)
    with pytest.raises(SourceError, match=match):
        from_robomimic(hdf5, tmp_path / "out.tr", progress=False)
    assert not (tmp_path / "out.tr").exists()


def test_dataset_length_mismatch_names_demo_and_key(tmp_path: Path) -> None:
    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS)
    with h5py.File(hdf5, "r+") as f:
        del f["data/demo_12/rewards"]
        f["data/demo_12"].create_dataset("rewards", data=np.zeros(12))
    with pytest.raises(SourceError, match=r"demo 'demo_12', key 'rewards' has 12 rows but num_samples is 13"):
        from_robomimic(hdf5, tmp_path / "out.tr", progress=False)


def test_overwrite(tmp_path: Path) -> None:
    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS)
    from_robomimic(hdf5, tmp_path / "out.tr", progress=False)
    with pytest.raises(RecordExistsError):
        from_robomimic(hdf5, tmp_path / "out.tr", progress=False)
    from_robomimic(hdf5, tmp_path / "out.tr", progress=False, overwrite=True, obs_keys=["pos"])
    assert RecordFile(tmp_path / "out.tr").user_metadata["robomimic"]["obs_keys"] == ["pos"]


def test_detection_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS)
    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f["x"] = np.arange(10)
    assert detect_format(hdf5) == "robomimic" and detect_format(plain) == "hdf5"
    assert main(["convert", str(hdf5), str(tmp_path / "cli.tr"), "-q"]) == 0
    assert "(robomimic)" in capsys.readouterr().out
    check_against_source(hdf5, tmp_path / "cli.tr")
    assert main(["convert", str(hdf5), str(tmp_path / "keys.tr"), "--keys", "pos,cam", "-q"]) == 0
    assert RecordFile(tmp_path / "keys.tr").user_metadata["robomimic"]["obs_keys"] == ["pos", "cam"]
    assert len(convert(plain, tmp_path / "plain.tr", progress=False)) == 10


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_compressed_conversion_reads_the_same(tmp_path: Path, codec: str) -> None:
    pytest.importorskip("cramjam")
    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS)
    rf = from_robomimic(hdf5, tmp_path / "out.tr", progress=False, compression={"obs.cam": codec, "actions": codec})
    check_against_source(hdf5, tmp_path / "out.tr")
    assert set(rf.metadata["compression"]) == {"obs.cam", "actions"}
    every = from_robomimic(hdf5, tmp_path / "all.tr", progress=False, compression=codec, compression_level=5)
    check_against_source(hdf5, tmp_path / "all.tr")
    assert every.metadata["compression"]["obs.cam"]["level"] == 5
    with pytest.raises(ValueError, match="unknown compression"):
        from_robomimic(hdf5, tmp_path / "bad.tr", compression="gzip")
