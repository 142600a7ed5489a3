"""Small robomimic-layout HDF5 files for the converter and dataset tests (written with h5py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

#: Observation keys: two low-dim (float64, float32) and two images (uint8 rgb, float32 depth).
OBS = {
    "pos": ((3,), np.float64),
    "eef": ((2,), np.float32),
    "cam": ((6, 5, 3), np.uint8),
    "depth": ((4, 4, 1), np.float32),
}
LOW_DIM = ("pos", "eef")
IMAGES = ("cam", "depth")
#: Dataset keys: float64 and int64 ones, 1-d and per-step vectors.
DATASET = {
    "actions": ((4,), np.float64),
    "rewards": ((), np.float64),
    "dones": ((), np.int64),
    "labels": ((2,), np.int64),
}
ENV_ARGS = {"env_name": "Lift", "type": 1, "env_kwargs": {"control_freq": 20}}


def _frames(rng: np.random.Generator, n: int, shape: tuple[int, ...], dtype: Any, demo: int) -> np.ndarray:
    if np.dtype(dtype).kind == "u":
        return rng.integers(0, 256, size=(n, *shape), dtype=dtype)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-5, 6, size=(n, *shape)).astype(dtype)
    out = rng.normal(size=(n, *shape)).astype(dtype)
    if shape == (3,):  # "pos" says where it is: (demo, step, noise)
        out[:, 0] = demo
        out[:, 1] = np.arange(n)
    return out


def write_demo_file(
    path: Path,
    lengths: Sequence[int],
    *,
    ids: Sequence[int] | None = None,
    seed: int = 0,
    compression: str | None = None,
    next_obs: str = "shift",
    masks: bool = True,
) -> dict[str, Any]:
    """Write a robomimic file with demos ``demo_<ids[i]>`` of ``lengths[i]`` steps; return what was written.

    ``next_obs``: ``"shift"`` (next_obs[t] = obs[t + 1], a new final frame), ``"noshift"``
    (independent frames) or ``"none"`` (no next_obs groups). ``compression="gzip"``
    writes chunked, compressed datasets; ``None`` contiguous ones.
    """
    rng = np.random.default_rng(seed)
    ids = list(range(len(lengths))) if ids is None else list(ids)
    written: dict[str, Any] = {}
    options = {"compression": compression} if compression else {}
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["env_args"] = json.dumps(ENV_ARGS)
        data.attrs["total"] = int(sum(lengths))
        for demo, (number, n) in enumerate(zip(ids, lengths)):
            name = f"demo_{number}"
            g = data.create_group(name)
            g.attrs["num_samples"] = n
            g.attrs["model_file"] = f"<mujoco model='{name}'/>"
            obs = {k: _frames(rng, n + 1, shape, dt, demo) for k, (shape, dt) in OBS.items()}
            for k, arr in obs.items():
                g.create_dataset(f"obs/{k}", data=arr[:n], **options)
                if next_obs == "shift":
                    g.create_dataset(f"next_obs/{k}", data=arr[1:], **options)
                elif next_obs == "noshift":
                    g.create_dataset(f"next_obs/{k}", data=_frames(rng, n, *OBS[k], demo), **options)
            for k, (shape, dt) in DATASET.items():
                g.create_dataset(k, data=_frames(rng, n, shape, dt, demo), **options)
            g.create_dataset("states", data=rng.normal(size=(n, 5)), **options)
            written[name] = n
        if masks:
            names = [f"demo_{i}" for i in ids]
            f.create_dataset("mask/train", data=np.array([d for i, d in enumerate(names) if i % 4 != 1], dtype="S"))
            f.create_dataset("mask/valid", data=np.array([d for i, d in enumerate(names) if i % 4 == 1], dtype="S"))
    return written
