"""LeRobotDataset on sets converted from hand-made LeRobot folders, against LeRobot's item rules written plainly.

(The comparison with LeRobot itself is test_oracle.py, in the oracle's environment.)
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from tests.lerobot.handmade import CAMERAS, FPS, TASKS, assert_same_item, expected_item, write_dataset
from torchrecord import LeRobotDataset
from torchrecord.convert import from_lerobot
from torchrecord.errors import ArgumentError, ArgumentTypeError, IndexOutOfRangeError

LENGTHS = [7, 2, 12, 5, 9]  # one episode shorter than every window below
TOP, WRIST = CAMERAS
WINDOWS = {
    "observation.state": [-0.4, -0.3, -0.2, -0.1, 0.0],
    "action": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5],
    TOP: [-0.1, 0.0],
    WRIST: [0.2],
    "next.reward": [-0.1, 0.0, 0.1],
    "frame_index": [0.0, 0.1],
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("lerobot")
    frames = write_dataset(folder / "dataset", LENGTHS, rows_per_file=10)
    return from_lerobot(folder / "dataset", folder / "set.tr", progress=False).path, frames


@pytest.mark.parametrize("windows", [None, WINDOWS, {TOP: [0.0]}, {"observation.state": [-0.10004, 0.30009]}])
def test_every_item_follows_lerobots_rules(converted: tuple[str, list[dict[str, Any]]], windows: Any) -> None:
    path, frames = converted
    ds = LeRobotDataset(path, delta_timestamps=windows)
    assert len(ds) == len(frames) and ds.num_frames == len(frames) and ds.num_episodes == len(LENGTHS)
    for g in range(len(frames)):
        assert_same_item(ds[g], expected_item(frames, g, ds.delta_indices), f"item {g}")
    assert_same_item(ds[-1], expected_item(frames, len(frames) - 1, ds.delta_indices), "item -1")
    batch = ds.__getitems__([9, 0, 9, 30])  # a DataLoader's batch: repeats and any order
    for item, g in zip(batch, [9, 0, 9, 30]):
        assert_same_item(item, expected_item(frames, g, ds.delta_indices), f"batched item {g}")


def test_episodes_select_in_stored_order(converted: tuple[str, list[dict[str, Any]]]) -> None:
    path, frames = converted
    ds = LeRobotDataset(path, episodes=[3, 1, 3], delta_timestamps=WINDOWS)
    chosen = [g for g, f in enumerate(frames) if f["episode_index"] in (1, 3)]
    assert len(ds) == len(chosen) and ds.episodes == [1, 3] and ds.num_episodes == 2
    for i, g in enumerate(chosen):
        assert_same_item(ds[i], expected_item(frames, g, ds.delta_indices), f"item {i}")
    with pytest.raises(ValueError, match="has no episode 9"):
        LeRobotDataset(path, episodes=[1, 9])


def test_bad_arguments_are_refused(converted: tuple[str, list[dict[str, Any]]]) -> None:
    path, _ = converted
    with pytest.raises(ValueError, match=r"not multiples of 1/10 s.*0\.15"):
        LeRobotDataset(path, delta_timestamps={"action": [0.0, 0.15]})
    with pytest.raises(ArgumentError, match="'task', which is no feature"):
        LeRobotDataset(path, delta_timestamps={"task": [0.0]})
    with pytest.raises(ArgumentError, match=r"task_index.*several offsets"):
        LeRobotDataset(path, delta_timestamps={"task_index": [0.0, 0.1]})
    with pytest.raises(ArgumentTypeError, match="must be a dict"):
        LeRobotDataset(path, delta_timestamps=[0.0])  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="non-empty list"):
        LeRobotDataset(path, delta_timestamps={"action": []})
    ds = LeRobotDataset(path)
    with pytest.raises(IndexOutOfRangeError, match="item 35 out of range"):
        ds[35]
    with pytest.raises(ArgumentTypeError):
        ds.__getitems__([0.5])  # type: ignore[list-item]


def test_metadata_and_transforms(converted: tuple[str, list[dict[str, Any]]]) -> None:
    path, frames = converted
    ds = LeRobotDataset(path, image_transforms=lambda t: t * 2)
    assert ds.fps == FPS and isinstance(ds.fps, int)
    assert ds.meta.tasks == tuple(TASKS) and ds.meta.camera_keys == tuple(CAMERAS) and ds.meta.video_keys == ()
    assert ds.meta.total_frames == len(frames) and ds.meta.stats == {"action": {"mean": [0.0, 0.0, 0.0]}}
    assert set(ds.features) >= {"action", TOP} and ds.delta_indices is None
    plain = expected_item(frames, 3)
    assert torch.equal(ds[3][TOP], plain[TOP] * 2) and torch.equal(ds[3]["action"], plain["action"])
    assert "LeRobotDataset(" in repr(ds) and "frames=35" in repr(ds)


def test_a_batch_reads_each_record_once(converted: tuple[str, list[dict[str, Any]]]) -> None:
    path, _ = converted
    ds = LeRobotDataset(path, delta_timestamps={TOP: [-0.2, -0.1, 0.0]})
    filled = ds.records_read  # the columns held in memory: every record once
    ds.__getitems__([3, 4, 5, 4])  # frames 1..5 of episode 0
    per_record = ds.frames.layout.rows
    assert ds.records_read - filled == len(range(1 // per_record, 5 // per_record + 1))


def test_pickles_without_its_columns(converted: tuple[str, list[dict[str, Any]]]) -> None:
    path, frames = converted
    ds = LeRobotDataset(path, delta_timestamps=WINDOWS, check="checksums")
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.frames._held is None  # filled on first use in the process that reads
    assert len(pickle.dumps(ds)) < 20_000
    assert_same_item(copy[17], expected_item(frames, 17, ds.delta_indices), "unpickled")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers(converted: tuple[str, list[dict[str, Any]]], context: str) -> None:
    path, frames = converted
    ds = LeRobotDataset(path, delta_timestamps=WINDOWS)
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0)).tolist()
    loader = DataLoader(ds, batch_size=4, sampler=order, num_workers=2, multiprocessing_context=context)
    batches = list(loader)
    assert len(batches) == -(-len(ds) // 4)
    for b, batch in enumerate(batches):
        want = default_collate([expected_item(frames, g, ds.delta_indices) for g in order[b * 4 : b * 4 + 4]])
        assert list(batch) == list(want)
        for key, value in want.items():
            assert value == batch[key] if key == "task" else torch.equal(batch[key], value), (b, key)
