"""LeRobotDataset against lerobot-dataset 0.4.4 itself: the same len() and, for every index, the same item.

Runs in the oracle's environment only (``scripts/setup-lerobot.sh``, CI's lerobot
leg: ``pytest -m lerobot``); elsewhere the module is skipped. The datasets are
built with LeRobot's own API: image mode, and video mode with H.264 and AV1
(``libsvtav1``); video items are compared with LeRobot's torchcodec decode.
"""

from __future__ import annotations

import importlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from tests.lerobot.handmade import assert_same_item
from torchrecord import LeRobotDataset, LeRobotStreamDataset, RecordLoader
from torchrecord.convert import from_lerobot


def _oracle(module: str) -> Any:
    """Import a module of the oracle's environment (scripts/setup-lerobot.sh); elsewhere skip this file.

    In CI's lerobot leg (``TORCHRECORD_LEROBOT_LEG=1``) a missing module fails instead: a broken
    environment must not pass as skipped tests.
    """
    if os.environ.get("TORCHRECORD_LEROBOT_LEG") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason="the oracle's environment: scripts/setup-lerobot.sh")


_oracle("tv_compat")  # before anything imports torchvision
oracle_module = _oracle("ledataset.datasets.lerobot_dataset")
video_utils = _oracle("ledataset.datasets.video_utils")

from tests.lerobot import oracle_build  # noqa: E402  (imports LeRobot: after the skips)

pytestmark = [
    pytest.mark.lerobot,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning:torchvision.*"),
    pytest.mark.filterwarnings("ignore::UserWarning:torchcodec.*"),
]

FRONT, WRIST = oracle_build.CAMERAS
MODES = ["image", "h264", "libsvtav1"]
#: delta_timestamps: wider than the 2-frame episode, past and future, cameras of both sizes, scalars and index
#: fields; single offsets (LeRobot squeezes a one-frame video window, stacks a one-frame image window); offsets
#: off the frame grid by less than the tolerance.
DELTAS: dict[str, dict[str, list[float]] | None] = {
    "none": None,
    "windows": {
        FRONT: [-0.2, -0.1, 0.0],
        WRIST: [0.0, 0.1],
        "observation.state": [-0.5, -0.4, -0.3, -0.2, -0.1, 0.0],
        "action": [round(0.1 * i, 1) for i in range(10)],
        "next.reward": [-0.1, 0.0, 0.1],
        "observation.velocity": [0.3],
        "index": [-0.1, 0.0],
    },
    # one timestamp offset: LeRobot then decodes the video keys without offsets at the shifted timestamp
    "single": {FRONT: [0.0], "action": [0.1], "next.done": [0.0], "timestamp": [0.3], "frame_index": [-0.2]},
    "tolerance": {"observation.state": [-0.10004, 0.0], FRONT: [0.20009]},
}


@pytest.fixture(scope="module", params=MODES)
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the LeRobot folder, its converted record set)."""
    mode = request.param
    folder = tmp_path_factory.mktemp(f"lerobot-{mode}")
    with warnings.catch_warnings():  # LeRobot's own writing warns (its stats of a bool feature)
        warnings.simplefilter("ignore")
        root = oracle_build.build(folder / "dataset", video=mode != "image", vcodec=mode if mode != "image" else "h264")
    out = folder / "set.tr"
    from_lerobot(root, out, progress=False)
    return root, out


def _codec(root: Path) -> str | None:
    """The video codec of the dataset's cameras (None in image mode)."""
    info = json.loads((root / "meta" / "info.json").read_text())
    return info["features"][FRONT].get("info", {}).get("video.codec")  # type: ignore[no-any-return]


def oracle(root: Path, **kw: Any) -> Any:
    return oracle_module.LeRobotDataset("local/oracle", root=root, **kw)


@pytest.mark.parametrize(
    ("deltas", "episodes"),
    [("none", None), ("windows", None), ("single", None), ("tolerance", None), ("windows", [4, 1, 2]), ("none", [3])],
)
def test_every_item_equals_the_oracle(built: tuple[Path, Path], deltas: str, episodes: list[int] | None) -> None:
    root, path = built
    kw = {"delta_timestamps": DELTAS[deltas], "episodes": episodes}
    theirs, ours = oracle(root, **kw), LeRobotDataset(path, **kw)
    assert len(ours) == len(theirs)
    assert ours.fps == theirs.fps and ours.num_episodes == theirs.num_episodes
    assert ours.delta_indices == theirs.delta_indices
    for i in range(len(theirs)):
        assert_same_item(ours[i], theirs[i], f"item {i} of {deltas}, episodes {episodes}")
    # a DataLoader's batch read: the same items
    batch = ours.__getitems__(list(range(len(theirs) - 1, -1, -3)))
    for item, i in zip(batch, range(len(theirs) - 1, -1, -3)):
        assert_same_item(item, theirs[i], f"batched item {i}")


def test_the_tolerance_rule_is_the_oracle(built: tuple[Path, Path]) -> None:
    root, path = built
    for offsets in ([0.15], [0.1002], [-0.03]):
        with pytest.raises(ValueError):
            oracle(root, delta_timestamps={"action": offsets})
        with pytest.raises(ValueError, match="multiples of 1/10"):
            LeRobotDataset(path, delta_timestamps={"action": offsets})
    for offsets in ([0.10009], [-0.29991]):  # within 1e-4: accepted and rounded by both
        assert (
            oracle(root, delta_timestamps={"action": offsets}).delta_indices
            == LeRobotDataset(path, delta_timestamps={"action": offsets}).delta_indices
        )


def test_windowed_timestamps_fail_both_in_video_mode(built: tuple[Path, Path]) -> None:
    root, path = built
    kw = {"delta_timestamps": {"timestamp": [0.0, 0.1]}}
    if "video" not in {f["dtype"] for f in oracle(root).features.values()}:
        for i, item in enumerate(oracle(root, **kw)):
            assert_same_item(LeRobotDataset(path, **kw)[i], item, f"item {i}")
        return
    with pytest.raises(RuntimeError):
        oracle(root, **kw)[0]
    with pytest.raises(ValueError, match="LeRobot fails on every item"):
        LeRobotDataset(path, **kw)


def test_a_video_tolerance_of_zero_fails_both(built: tuple[Path, Path]) -> None:
    root, path = built
    if "video" not in {f["dtype"] for f in oracle(root).features.values()}:
        pytest.skip("image mode: no video tolerance")
    with pytest.raises(AssertionError, match="tolerance"):
        oracle(root, tolerance_s=0.0)[0]
    with pytest.raises(ValueError, match="tolerance_s"):
        LeRobotDataset(path, tolerance_s=0.0)


def _batches(loader: Any) -> Iterator[Any]:
    yield from loader


def _assert_same_batch(ours: dict[str, Any], theirs: dict[str, Any], where: str) -> None:
    assert list(ours) == list(theirs), where
    for key, value in theirs.items():
        if isinstance(value, list):
            assert ours[key] == value, f"{where}/{key}"
        else:
            assert torch.equal(ours[key], value), f"{where}/{key}"


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_give_the_oracle_batches(built: tuple[Path, Path], context: str) -> None:
    root, path = built
    if context == "spawn" and _codec(root) != "h264":  # a minute each (workers import torch afresh): one mode
        pytest.skip("spawn workers: checked on the H.264 dataset (and on every kind of set in test_dataset.py)")
    kw = {"delta_timestamps": DELTAS["windows"]}
    theirs = oracle(root, **kw)
    n = len(theirs)
    expected = [default_collate([theirs[i] for i in range(a, min(a + 4, n))]) for a in range(0, n, 4)]
    ours = DataLoader(LeRobotDataset(path, **kw), batch_size=4, num_workers=2, multiprocessing_context=context)
    got = list(_batches(ours))
    assert len(got) == len(expected)
    for b, (mine, want) in enumerate(zip(got, expected)):
        _assert_same_batch(mine, want, f"{context} batch {b}")
    if context == "fork":  # the oracle in fork workers, its decoder cache cleared first (huggingface/lerobot#2488)
        video_utils._default_decoder_cache.clear()
        loader = DataLoader(theirs, batch_size=4, num_workers=2, multiprocessing_context="fork")
        for b, (mine, want) in enumerate(zip(got, _batches(loader))):
            _assert_same_batch(mine, want, f"oracle fork batch {b}")


@pytest.mark.parametrize("deltas", ["none", "windows"])
def test_the_streaming_readers_batches_are_the_oracles(built: tuple[Path, Path], deltas: str) -> None:
    """LeRobotStreamDataset through RecordLoader with 2 workers: each batch is default_collate of the oracle's items
    at the indices the reader's plan visits."""
    root, path = built
    kw = {"delta_timestamps": DELTAS[deltas]}
    theirs = oracle(root, **kw)
    plan = LeRobotStreamDataset(path, batch_size=4, shuffle_buffer=12, seed=1, **kw)
    orders = [np.concatenate(plan.reader_items(w, 2)).tolist() for w in range(2)]
    # a DataLoader takes one batch from each worker in turn
    chunks = [[o[a : a + 4] for a in range(0, len(o), 4)] for o in orders]
    expected = [c[i] for i in range(max(map(len, chunks))) for c in chunks if i < len(c)]
    video_utils._default_decoder_cache.clear()
    got = list(RecordLoader(LeRobotStreamDataset(path, batch_size=4, shuffle_buffer=12, seed=1, **kw), num_workers=2))
    assert len(got) == len(expected) and sorted(i for chunk in expected for i in chunk) == list(range(len(theirs)))
    for b, (mine, chunk) in enumerate(zip(got, expected)):
        _assert_same_batch(mine, default_collate([theirs[i] for i in chunk]), f"stream batch {b} ({deltas})")
