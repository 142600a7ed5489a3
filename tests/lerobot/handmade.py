"""Small LeRobot v3.0 datasets written by hand (pyarrow, pandas, Pillow), and LeRobot's item rules written plainly.

The main test environment has no ``lerobot-dataset``: these folders follow the
v3.0 layout as LeRobot writes it (``meta/info.json``, ``meta/tasks.parquet``
with the task strings as the pandas index, ``meta/episodes/*/*.parquet``,
``data/*/*.parquet`` with images embedded as PNG), image mode only. The oracle
tests (``test_oracle.py``) build theirs with LeRobot itself.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

#: Numeric features: name -> (shape, dtype); shape (1,) is a scalar column.
NUMERIC: dict[str, tuple[tuple[int, ...], str]] = {
    "observation.state": ((4,), "float64"),
    "action": ((3,), "float32"),
    "next.reward": ((1,), "float32"),
    "next.done": ((1,), "bool"),
    "observation.count": ((2,), "int32"),
}
#: Cameras: name -> (height, width, channels).
CAMERAS = {"observation.images.top": (6, 8, 3), "observation.images.wrist": (4, 5, 1)}
TASKS = ["pick the cube", "place the cube", "wave"]
FPS = 10
INDEX = {
    "timestamp": "float32",
    "frame_index": "int64",
    "episode_index": "int64",
    "index": "int64",
    "task_index": "int64",
}


def frame_values(e: int, f: int, g: int) -> dict[str, np.ndarray]:
    """The deterministic content of frame ``f`` of episode ``e`` (global index ``g``)."""
    rng = np.random.default_rng(g)
    out: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in NUMERIC.items():
        shape = () if shape == (1,) else shape
        if dtype == "bool":
            out[name] = np.asarray(rng.random(shape) < 0.5)
        elif dtype.startswith("int"):
            out[name] = rng.integers(-50, 50, shape).astype(dtype)
        else:
            out[name] = (rng.standard_normal(shape) + e * 100 + f).astype(dtype)
    for name, (h, w, c) in CAMERAS.items():
        out[name] = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
    return out


def write_dataset(root: Path, lengths: Sequence[int], *, rows_per_file: int | None = None) -> list[dict[str, Any]]:
    """Write a LeRobot v3.0 folder at ``root``; returns every frame's values (with the index columns), in order."""
    if root.exists():
        shutil.rmtree(root)
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    frames: list[dict[str, Any]] = []
    episodes: dict[str, list[Any]] = {k: [] for k in ("episode_index", "tasks", "length")}
    episodes.update({"data/chunk_index": [], "data/file_index": [], "dataset_from_index": [], "dataset_to_index": []})
    for e, n in enumerate(lengths):
        task = (e * 2) % len(TASKS)
        episodes["episode_index"].append(e)
        episodes["tasks"].append([TASKS[task]])
        episodes["length"].append(n)
        episodes["dataset_from_index"].append(len(frames))
        for f in range(n):
            g = len(frames)
            values = frame_values(e, f, g)
            index = {"timestamp": np.float32(f / FPS), "frame_index": f, "episode_index": e, "index": g}
            frames.append({**values, **index, "task_index": task})
        episodes["dataset_to_index"].append(len(frames))
        episodes["data/chunk_index"].append(0)
        episodes["data/file_index"].append(0)
    _write_data(root, frames, rows_per_file or len(frames))
    pq.write_table(pa.table(episodes), root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    import pandas as pd

    pd.DataFrame({"task_index": range(len(TASKS))}, index=TASKS).to_parquet(root / "meta" / "tasks.parquet")
    features: dict[str, Any] = {}
    for name, (shape, dtype) in NUMERIC.items():
        features[name] = {"dtype": dtype, "shape": list(shape), "names": None}
    for name, (h, w, c) in CAMERAS.items():
        features[name] = {"dtype": "image", "shape": [h, w, c], "names": ["height", "width", "channels"]}
    for name, dtype in INDEX.items():
        features[name] = {"dtype": dtype, "shape": [1], "names": None}
    info = {
        "codebase_version": "v3.0",
        "robot_type": "handmade",
        "total_episodes": len(lengths),
        "total_frames": len(frames),
        "total_tasks": len(TASKS),
        "chunks_size": 1000,
        "fps": FPS,
        "splits": {"train": f"0:{len(lengths)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": None,
        "features": features,
    }
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2))
    (root / "meta" / "stats.json").write_text(json.dumps({"action": {"mean": [0.0, 0.0, 0.0]}}))
    return frames


def _write_data(root: Path, frames: list[dict[str, Any]], rows_per_file: int) -> None:
    from PIL import Image

    for file, lo in enumerate(range(0, len(frames), rows_per_file)):
        part = frames[lo : lo + rows_per_file]
        columns: dict[str, Any] = {}
        for name, (shape, _) in NUMERIC.items():
            values = np.stack([fr[name] for fr in part])
            if shape == (1,):
                columns[name] = pa.array(values)
            else:
                columns[name] = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), shape[0])
        for name in CAMERAS:
            pngs = []
            for fr in part:
                pixels = fr[name]
                buf = io.BytesIO()
                Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels).save(buf, format="PNG")
                pngs.append({"bytes": buf.getvalue(), "path": None})
            columns[name] = pa.array(pngs, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
        for name, dtype in INDEX.items():
            columns[name] = pa.array(np.array([fr[name] for fr in part], dtype=dtype))
        folder = root / "data" / "chunk-000"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns), folder / f"file-{file:03d}.parquet")


def expected_item(
    frames: list[dict[str, Any]], g: int, delta_indices: dict[str, list[int]] | None = None
) -> dict[str, Any]:
    """LeRobot's item for global frame ``g``, by its rules, one value at a time (the reference for the drop-in)."""
    ep = frames[g]["episode_index"]
    start = min(i for i, fr in enumerate(frames) if fr["episode_index"] == ep)
    end = max(i for i, fr in enumerate(frames) if fr["episode_index"] == ep) + 1

    def value(name: str, i: int) -> torch.Tensor:
        v = frames[i][name]
        if name in CAMERAS:
            return torch.from_numpy(np.ascontiguousarray(v.transpose(2, 0, 1))).to(torch.float32).div(255)
        return torch.tensor(np.asarray(v).tolist())  # LeRobot: torch.tensor of the Python value

    item: dict[str, Any] = {name: value(name, g) for name in [*NUMERIC, *CAMERAS, *INDEX]}
    pads = {}
    for name, deltas in (delta_indices or {}).items():
        item[name] = torch.stack([value(name, max(start, min(end - 1, g + d))) for d in deltas])
        pads[f"{name}_is_pad"] = torch.tensor([not start <= g + d < end for d in deltas])
    item.update(pads)
    item["task"] = TASKS[frames[g]["task_index"]]
    return item


def assert_same_item(ours: dict[str, Any], theirs: dict[str, Any], where: str = "") -> None:
    """Same keys in the same order, and each value equal (``torch.equal``, with dtype and shape)."""
    assert list(ours) == list(theirs), f"{where}: keys {list(ours)} != {list(theirs)}"
    for key, b in theirs.items():
        a = ours[key]
        if isinstance(b, str):
            assert a == b, f"{where}/{key}: {a!r} != {b!r}"
            continue
        assert isinstance(a, torch.Tensor), f"{where}/{key}: {type(a)}"
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{where}/{key}: {a.dtype} {a.shape} != {b.dtype} {b.shape}"
        assert torch.equal(a, b), f"{where}/{key}: values differ"
