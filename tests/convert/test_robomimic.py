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
                    assert robo.finals is not None and robo.tail_first == len(rf)
                    final = robo.finals.read(np.array([d]), [f"obs.{k}"], verify=True)[f"obs.{k}"][0]
                    nxt = np.stack([s["obs"][k] for s in steps[1:]] + [final])
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
    # every next_obs is a shift here: stored once, each demo's final frame beside the samples
    assert robo.next_obs == dict.fromkeys(OBS, "shift")
    assert not [n for n in rf.schema.names if n.startswith("next_obs")]
    assert len(rf) == sum(LENGTHS)
    assert rf.groups.tolist() == [0, 1, 7, 11, 24]
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


def _columns(items: list[Any]) -> dict[str, np.ndarray]:
    """Nested dicts of tensors or arrays (samples [..] or batches [B, ..]) as one array per dotted field."""

    def flat(node: Any, prefix: str, out: dict[str, list[np.ndarray]], batched: bool) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                flat(v, f"{prefix}{k}.", out, batched)
            return
        array = np.asarray(node)
        out.setdefault(prefix[:-1], []).append(array if batched else array[None])

    parts: dict[str, list[np.ndarray]] = {}
    for item, batched in items:
        flat(item, "", parts, batched)
    return {k: np.concatenate(v) for k, v in parts.items()}


def _file_steps(hdf5: Path) -> dict[str, np.ndarray]:
    """Every step of the file in robomimic's demo order: the demo position, obs keys and dataset keys."""
    out: dict[str, list[np.ndarray]] = {}
    with h5py.File(hdf5, "r") as f:
        for d, demo in enumerate(sorted(f["data"].keys(), key=lambda n: int(n[5:]))):
            g = f["data"][demo]
            n = int(g.attrs["num_samples"])
            out.setdefault("demo", []).append(np.full(n, d, np.int64))
            for k in OBS:
                out.setdefault(f"obs.{k}", []).append(g[f"obs/{k}"][()])
            for k in ("actions", "rewards", "dones"):
                out.setdefault(k, []).append(g[k][()])
    return {k: np.concatenate(v) for k, v in out.items()}


def _assert_same_steps(got: dict[str, np.ndarray], want: dict[str, np.ndarray], reader: str) -> None:
    """The same steps, in any order: rows matched by (demo, step) ("pos" holds the step)."""
    assert sorted(got) == sorted(want), reader
    assert len(got["demo"]) == len(want["demo"]), (
        f"{reader}: {len(got['demo'])} steps, the file has {len(want['demo'])}"
    )
    order = np.lexsort((got["obs.pos"][:, 1], got["demo"]))
    for name, column in want.items():
        np.testing.assert_array_equal(got[name][order], column, err_msg=f"{reader}: {name}")


def test_every_reader_gives_exactly_the_files_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No fake steps: the final next_obs frames are kept where no generic reader takes them for steps."""
    import torch
    from torch.utils.data import DataLoader

    from torchrecord import BatchIter, MixedDataset, RecordDataset, StreamDataset, load

    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS)
    want = _file_steps(hdf5)
    path = tmp_path / "out.tr"
    assert main(["convert", str(hdf5), str(path), "-q"]) == 0
    assert f"{sum(LENGTHS)} steps from {len(LENGTHS)} demos" in capsys.readouterr().out
    rf = RecordFile(path)
    assert len(rf) == sum(LENGTHS) and rf.num_groups == len(LENGTHS)
    _assert_same_steps(_columns([(s, False) for s in rf]), want, "RecordFile")
    loader = DataLoader(RecordDataset(path, batch_size=5, seed=1), batch_size=None, num_workers=2)
    _assert_same_steps(_columns([(b, True) for b in loader]), want, "RecordDataset")
    columns = load(path)
    _assert_same_steps(_columns([(columns, True)]), want, "load")
    _assert_same_steps(_columns([(b, True) for b in BatchIter(columns, batch_size=7)]), want, "BatchIter")
    _assert_same_steps(_columns([(b, True) for b in MixedDataset([path], batch_size=6)]), want, "MixedDataset")
    frames = []
    for batch in StreamDataset(path, batch_size=2, steps=3):
        mask = batch["mask"].bool()
        frames.append((_map(batch["data"], lambda t: t[mask]), True))  # noqa: B023
    _assert_same_steps(_columns(frames), want, "StreamDataset")
    assert isinstance(columns["actions"], torch.Tensor)


def _map(node: Any, fn: Any) -> Any:
    return {k: _map(v, fn) for k, v in node.items()} if isinstance(node, dict) else fn(node)


def test_convert_takes_dataset_keys_and_packing_and_refuses_options_of_other_formats(tmp_path: Path) -> None:
    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS)
    rf = convert(hdf5, tmp_path / "out.tr", dataset_keys=["actions", "states"], samples_per_record=4, progress=False)
    assert rf.schema.names[-2:] == ["actions", "states"] and rf.samples_per_record == 4
    check_against_source(hdf5, tmp_path / "out.tr")
    for option, value in (("keep_paths", False), ("check_images", False), ("extensions", [".png"])):
        with pytest.raises(ValueError, match=f"{option}=.* does not apply to a robomimic source"):
            convert(hdf5, tmp_path / "bad.tr", progress=False, **{option: value})
    np.save(tmp_path / "a.npy", np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"dataset_keys=.* does not apply to a npy source.*robomimic"):
        convert(tmp_path / "a.npy", tmp_path / "bad.tr", dataset_keys=["actions"])
    assert not (tmp_path / "bad.tr").exists()


def test_packed_and_unpacked_sets_give_the_same_windows(tmp_path: Path) -> None:
    """Steps packed several per record (the default) read exactly as one per record."""
    from torchrecord import SequenceDataset

    hdf5 = tmp_path / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS, next_obs="noshift")
    packed = from_robomimic(hdf5, tmp_path / "packed.tr", progress=False)
    one = from_robomimic(hdf5, tmp_path / "one.tr", progress=False, samples_per_record=1)
    assert packed.samples_per_record > 1 and one.samples_per_record == 1
    for cache in (None, "low_dim"):
        kw: dict[str, Any] = dict(seq_length=3, goal_mode="last", frame_cache=cache)
        a = SequenceDataset(packed, list(OBS), ["actions", "dones"], **kw)
        b = SequenceDataset(one, list(OBS), ["actions", "dones"], **kw)
        assert len(a) == len(b) == sum(LENGTHS)
        for i in range(len(a)):
            x, y = a[i], b[i]
            for group in ("obs", "next_obs", "goal_obs"):
                for k in OBS:
                    np.testing.assert_array_equal(x[group][k], y[group][k])
            np.testing.assert_array_equal(x["actions"], y["actions"])
