"""LeRobot datasets built with lerobot-dataset's own API (``create``, ``add_frame``, ``save_episode``, ``finalize``).

Only in the oracle's environment (``scripts/setup-lerobot.sh``): the caller
imports ``tv_compat`` before this module (torchvision, which LeRobot imports,
needs it beside the CPU torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from ledataset.datasets.lerobot_dataset import LeRobotDataset

#: Episode lengths: one of 2 frames, shorter than the widest window of the tests.
LENGTHS = (11, 2, 17, 6, 9)
#: Two cameras of different sizes (even sizes: the videos are yuv420p).
CAMERAS = {"observation.images.front": (48, 64), "observation.images.wrist": (32, 40)}
TASKS = ("pick the red cube", "stack the blocks", "open the drawer")
FPS = 10
FEATURES: dict[str, Any] = {
    "observation.state": {"dtype": "float32", "shape": (6,), "names": [f"j{i}" for i in range(6)]},
    "observation.velocity": {"dtype": "float64", "shape": (3,), "names": None},
    "action": {"dtype": "float32", "shape": (6,), "names": [f"j{i}" for i in range(6)]},
    "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
    "next.done": {"dtype": "bool", "shape": (1,), "names": None},
}


def _image(h: int, w: int, e: int, f: int, seed: int) -> np.ndarray:
    y = np.arange(h)[:, None, None]
    x = np.arange(w)[None, :, None]
    c = np.arange(3)[None, None, :]
    base = (x * 5 + y * 3 + c * 70 + f * 9 + e * 37) % 256
    noise = np.random.default_rng(seed).integers(0, 30, size=(h, w, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def build(root: Path, *, video: bool, vcodec: str = "libsvtav1", lengths: Sequence[int] = LENGTHS) -> Path:
    """Build the dataset at ``root`` (a folder that must not exist) and return it."""
    features = dict(FEATURES)
    for name, (h, w) in CAMERAS.items():
        kind = "video" if video else "image"
        features[name] = {"dtype": kind, "shape": (h, w, 3), "names": ["height", "width", "channels"]}
    ds = LeRobotDataset.create(
        repo_id="local/oracle", root=root, fps=FPS, features=features, use_videos=video, vcodec=vcodec
    )
    g = 0
    for e, n in enumerate(lengths):
        for f in range(n):
            rng = np.random.default_rng(g)
            state = (e * 1000 + f + rng.standard_normal(6)).astype(np.float32)
            frame: dict[str, Any] = {
                "observation.state": state,
                "observation.velocity": rng.standard_normal(3),
                "action": -state,
                "next.reward": np.array([rng.standard_normal()], dtype=np.float32),
                "next.done": np.array([f == n - 1]),
                "task": TASKS[(e + f // 5) % len(TASKS)] if e != 2 else TASKS[2],
            }
            for i, (name, (h, w)) in enumerate(CAMERAS.items()):
                frame[name] = _image(h, w, e, f, g * 10 + i)
            ds.add_frame(frame)
            g += 1
        ds.save_episode()
    ds.finalize()
    return root
