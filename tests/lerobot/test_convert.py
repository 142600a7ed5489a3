"""from_lerobot and `torchrecord convert` on LeRobot v3.0 folders written by hand: layout, metadata, shards, errors."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.lerobot.handmade import CAMERAS, FPS, INDEX, NUMERIC, TASKS, write_dataset
from torchrecord import LeRobotDataset, RecordFile, open_set, write_record
from torchrecord.cli import main
from torchrecord.convert import convert, detect_format, from_lerobot
from torchrecord.convert.lerobot import NOT_LEROBOT, find_lerobot
from torchrecord.errors import ArgumentError, SourceError

LENGTHS = [5, 2, 9, 4, 6]


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path / "lerobot"
    return root, write_dataset(root, LENGTHS, rows_per_file=7)  # 26 frames in 4 data files


def test_one_sample_per_frame_in_order_with_every_column(
    dataset: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    root, frames = dataset
    rf = from_lerobot(root, tmp_path / "out.tr", progress=False)
    assert len(rf) == len(frames) == sum(LENGTHS)
    assert rf.schema.names == [*NUMERIC, *CAMERAS, *INDEX]
    assert rf.groups.tolist() == np.cumsum([0, *LENGTHS]).tolist()  # one group per episode
    for g, sample in enumerate(rf):
        for name in [*NUMERIC, *CAMERAS]:
            want = np.asarray(frames[g][name])
            assert sample[name].dtype == want.dtype and np.array_equal(sample[name], want), (g, name)
        assert sample["timestamp"].dtype == np.float32 and sample["timestamp"] == np.float32(frames[g]["timestamp"])
        assert [int(sample[k]) for k in ("frame_index", "episode_index", "index", "task_index")] == [
            frames[g][k] for k in ("frame_index", "episode_index", "index", "task_index")
        ]
    meta = rf.user_metadata
    assert meta["source_format"] == "lerobot"
    info = meta["lerobot"]
    assert info["fps"] == FPS and info["tasks"] == TASKS and info["video_keys"] == []
    assert info["cameras"] == list(CAMERAS) and info["columns"] == [*NUMERIC, *CAMERAS, *INDEX]
    assert info["episodes"]["length"] == LENGTHS and info["episodes"]["dataset_to_index"][-1] == len(frames)
    assert info["info"]["robot_type"] == "handmade" and info["stats"] == {"action": {"mean": [0.0, 0.0, 0.0]}}
    assert rf.metadata["shuffled"] is False


def test_convert_detects_the_folder_and_refuses_options_that_do_not_apply(
    dataset: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    root, frames = dataset
    assert detect_format(root) == "lerobot"
    rf = convert(root, tmp_path / "a.tr", progress=False, metadata={"note": "x"})  # shuffle=True is ignored
    assert [int(s["index"]) for s in rf] == list(range(len(frames)))
    assert rf.user_metadata["note"] == "x"
    for name, value in [("seed", 3), ("num_workers", 2), ("group_by", "index"), ("on_error", "skip")]:
        with pytest.raises(ArgumentError, match=f"{name}=.*does not apply to a lerobot source"):
            convert(root, tmp_path / "b.tr", progress=False, **{name: value})
    with pytest.raises(ArgumentError, match="keys"):
        convert(root, tmp_path / "b.tr", keys=["action"], progress=False)
    assert not (tmp_path / "b.tr").exists()
    assert set(NOT_LEROBOT) < set(inspect.signature(convert).parameters)


def test_the_command_line_converts_and_refuses(
    dataset: tuple[Path, list[dict[str, Any]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, frames = dataset
    out = tmp_path / "cli.tr"
    assert main(["convert", str(root), str(out), "--compression", "observation.images.top=zstd", "-q"]) == 0
    assert len(RecordFile(out)) == len(frames)
    assert RecordFile(out).metadata["compression"]["observation.images.top"]["codec"] == "zstd"
    assert main(["convert", str(root), str(tmp_path / "w.tr"), "--workers", "2", "-q"]) != 0
    assert "--workers does not apply to a lerobot source" in capsys.readouterr().err
    assert not (tmp_path / "w.tr").exists()


def test_shards_hold_whole_episodes_and_read_as_one_set(
    dataset: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    root, frames = dataset
    folder = tmp_path / "shards"
    for i in range(3):
        shard = from_lerobot(root, folder, shard=i, num_shards=3, progress=False)
        assert shard.groups is None
    rs = open_set(folder)
    assert rs.num_shards == 3 and len(rs) == len(frames)
    episodes = [sorted({int(s["episode_index"]) for s in rs.shard(i)}) for i in range(3)]
    assert episodes == [[0], [1, 2], [3, 4]]  # episodes [i*5//3, (i+1)*5//3)
    single = from_lerobot(root, tmp_path / "one.tr", progress=False)
    a, b = (
        LeRobotDataset(folder, delta_timestamps={"action": [-0.2, 0.0, 0.3]}),
        LeRobotDataset(single, delta_timestamps={"action": [-0.2, 0.0, 0.3]}),
    )
    for i in range(len(frames)):
        x, y = a[i], b[i]
        assert all(np.array_equal(x[k], y[k]) for k in y if k != "task") and x["task"] == y["task"]
    with pytest.raises(ArgumentError, match="more than the dataset's 5 episodes"):
        from_lerobot(root, tmp_path / "many", shard=0, num_shards=6, progress=False)
    with pytest.raises(ArgumentError, match="together"):
        from_lerobot(root, tmp_path / "half", shard=0, progress=False)


def test_a_repo_id_is_found_in_the_local_cache_only(
    dataset: tuple[Path, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = dataset
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_LEROBOT_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError, match="nothing is downloaded"):
        find_lerobot("someone/robot")
    snapshot = home / "hub" / "datasets--someone--robot" / "snapshots" / "abc123"
    snapshot.parent.mkdir(parents=True)
    root.rename(snapshot)
    (home / "hub" / "datasets--someone--robot" / "refs").mkdir()
    (home / "hub" / "datasets--someone--robot" / "refs" / "main").write_text("abc123")
    assert find_lerobot("someone/robot") == str(snapshot)
    rf = convert("someone/robot", tmp_path / "hub.tr", format="lerobot", progress=False)
    assert rf.user_metadata["lerobot"]["source"] == "abc123"
    (home / "lerobot" / "someone").mkdir(parents=True)
    snapshot.rename(home / "lerobot" / "someone" / "robot")  # LeRobot's own home comes first
    assert find_lerobot("someone/robot") == str(home / "lerobot" / "someone" / "robot")


def _rewrite(path: Path, change: Any) -> None:
    table = pq.read_table(path)
    pq.write_table(change(table), path)


def _replace(table: Any, name: str, values: Any) -> Any:
    return table.set_column(table.column_names.index(name), name, values)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("version", r"format v2\.1.*convert_dataset_v21_to_v30"),
        ("order", r"frame 8 .*has index=9, expected 8"),
        ("episode", r"frame 3 .*episode_index=1, expected 0"),
        ("null", r"frame 7, column 'action' is null"),
        ("string", r"feature 'language' holds strings"),
        ("column", r"has no column 'observation.state'"),
        ("table", r"episode 2 holds frames \[8, 16\)"),
        ("image", r"frame 0, image 'observation.images.top' has mode I;16"),
        ("garbage", r"file-003.parquet: cannot read as parquet"),
        ("short", r"holds 21 frames, the episode table 26"),
    ],
)
def test_bad_sources_are_named_and_nothing_is_written(
    dataset: tuple[Path, list[dict[str, Any]]], tmp_path: Path, damage: str, message: str
) -> None:
    root, _ = dataset
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    data = root / "data" / "chunk-000"
    if damage == "version":
        info["codebase_version"] = "v2.1"
    elif damage == "string":
        info["features"]["language"] = {"dtype": "string", "shape": [1], "names": None}
    elif damage == "order":
        _rewrite(data / "file-001.parquet", lambda t: _replace(t, "index", pa.array([7, 9, 8, 10, 11, 12, 13])))
    elif damage == "episode":
        _rewrite(data / "file-000.parquet", lambda t: _replace(t, "episode_index", pa.array([0, 0, 0, 1, 0, 1, 1])))
    elif damage == "null":
        _rewrite(
            data / "file-001.parquet", lambda t: _replace(t, "action", pa.array([None] * 7, t.column("action").type))
        )
    elif damage == "column":
        _rewrite(data / "file-002.parquet", lambda t: t.drop_columns(["observation.state"]))
    elif damage == "table":
        episodes = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
        _rewrite(episodes, lambda t: _replace(t, "dataset_from_index", pa.array([0, 5, 8, 16, 20])))
    elif damage == "image":
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(np.zeros((6, 8), np.uint16)).save(buf, format="PNG")
        column = pa.array(
            [{"bytes": buf.getvalue(), "path": None}] * 7, pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        )
        _rewrite(data / "file-000.parquet", lambda t: _replace(t, "observation.images.top", column))
    elif damage == "garbage":
        (data / "file-003.parquet").write_bytes(b"PAR1 not really")
    elif damage == "short":
        (data / "file-003.parquet").unlink()
    info_path.write_text(json.dumps(info))
    with pytest.raises(SourceError, match=message):
        from_lerobot(root, tmp_path / "bad.tr", progress=False)
    assert not (tmp_path / "bad.tr").exists()
    assert [n for n in os.listdir(tmp_path) if n != "lerobot"] == []  # no temporary left either


def test_compressed_cameras_read_back_the_same(dataset: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    root, frames = dataset
    plain = LeRobotDataset(from_lerobot(root, tmp_path / "plain.tr", progress=False))
    packed = from_lerobot(root, tmp_path / "z.tr", compression="zstd", progress=False)
    assert packed.samples_per_record == 1  # compressed: one frame per record
    assert from_lerobot(root, tmp_path / "z4.tr", compression="lz4", samples_per_record=4).samples_per_record == 4
    zstd = LeRobotDataset(packed)
    for i in range(len(frames)):
        x, y = zstd[i], plain[i]
        assert all(np.array_equal(x[k], y[k]) for k in y if k != "task")


def test_not_a_lerobot_set_is_refused_by_the_reader(tmp_path: Path) -> None:
    from torchrecord.errors import FormatError, VersionError

    plain = write_record([{"x": np.zeros(2)}] * 3, tmp_path / "p.tr", progress=False)
    with pytest.raises(FormatError, match="not converted from a LeRobot dataset"):
        LeRobotDataset(plain)
    newer = write_record(
        [{"x": np.zeros(2)}] * 3, tmp_path / "n.tr", metadata={"lerobot": {"version": 99}}, progress=False
    )
    with pytest.raises(VersionError, match="version 99"):
        LeRobotDataset(newer)
    damaged = write_record(
        [{"x": np.zeros(2)}] * 3, tmp_path / "d.tr", metadata={"lerobot": {"version": 1}}, progress=False
    )
    with pytest.raises(FormatError, match="damaged"):
        LeRobotDataset(damaged)


def test_from_lerobot_takes_the_write_options_as_write_record_does() -> None:
    reference = inspect.signature(write_record).parameters
    ours = inspect.signature(from_lerobot).parameters
    for name, parameter in ours.items():
        if name in reference and name != "path":
            assert parameter.default == reference[name].default, name
            assert str(parameter.annotation) == str(reference[name].annotation), name
            assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
    lacking = {name for name in reference if name not in ours and name not in ("dataset", "path")}
    assert lacking == {*NOT_LEROBOT, "shuffle"}


def test_a_missing_decoder_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from torchrecord.convert.lerobot_video import VideoPlan
    from torchrecord.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "av", None)  # as if PyAV were not installed
    with pytest.raises(MissingDependencyError, match=r"needs av: pip install .*'av>=14'.*\.\[lerobot\]"):
        VideoPlan("episode.mp4")
