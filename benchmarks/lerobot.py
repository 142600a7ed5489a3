"""LeRobot's LeRobotDataset against torchrecord's: ``python -m benchmarks.lerobot`` (in .venv-lerobot).

Runs in the oracle's environment (``bash scripts/setup-lerobot.sh``, then
``.venv-lerobot/bin/python -m benchmarks.lerobot``), where ``lerobot-dataset``
0.4.4 is installed.

Data: a LeRobot v3.0 dataset built with LeRobot's own API (``create``,
``add_frame``, ``save_episode``): ``--episodes`` episodes (default 40) of 40-100
frames at 30 fps; two cameras (uint8 96x128 and 72x96: gradients, a moving
shape and a camera's sensor noise), ``observation.state`` and ``action`` float32[14],
a scalar reward, three tasks; image mode by default, video with ``--video h264``
or ``--video libsvtav1``. It is converted once with
``torchrecord.convert.from_lerobot``; both are kept under ``--data-dir``.

Loaders, each in a ``DataLoader(batch_size=--batch-size, shuffle=True)`` at 0 and
2 workers (fork; LeRobot's decoder cache is cleared before workers start,
huggingface/lerobot#2488):

* ``lerobot``: LeRobot's ``LeRobotDataset`` (the oracle);
* ``drop-in``: ``torchrecord.LeRobotDataset`` on the converted set;
* ``drop-in+collate``: the same with ``collate_fn=torchrecord.collate``, which stacks each batch
  into the worker's reused shared-memory slot (what docs/lerobot.md advises with workers);
* ``stream``: ``torchrecord.LeRobotStreamDataset`` over the same windows, batches built in the reader,
  read by ``torchrecord.RecordLoader`` (``STREAM``).

Modes: ``plain`` (no ``delta_timestamps``) and ``windows`` (both cameras at
[-1/fps, 0], the state at [-1/fps, 0], 16 actions from 0: a diffusion-policy-like
query). Per point: items/s over ``--batches`` batches after one warm-up batch per worker,
and the ratio to LeRobot's. Target: the drop-in at least 10x LeRobot's items/s
with windows at 0 workers, on a quiet machine.

Quick check that it runs: ``python -m benchmarks.lerobot --tiny``; ``--out FILE`` writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

__all__ = ["LOADERS", "STREAM", "build", "main"]

FPS = 30
TASKS = ("pick the cube", "stack the blocks", "open the drawer")
CAMERAS = {"observation.images.top": (96, 128), "observation.images.wrist": (72, 96)}
DIM = 14


def _windows() -> dict[str, list[float]]:
    step = 1 / FPS
    return {
        **{camera: [-step, 0.0] for camera in CAMERAS},
        "observation.state": [-step, 0.0],
        "action": [i * step for i in range(16)],
    }


MODES: dict[str, dict[str, list[float]] | None] = {"plain": None, "windows": _windows()}


# -- data ---------------------------------------------------------------------------------------------


def _render(h: int, w: int, t: float, seed: int) -> np.ndarray:
    y = np.linspace(0, 1, h, dtype=np.float32)[:, None]
    x = np.linspace(0, 1, w, dtype=np.float32)[None, :]
    frame = np.empty((h, w, 3), np.uint8)
    for c in range(3):
        frame[:, :, c] = (255 * (0.3 + 0.4 * y + 0.1 * c)).astype(np.uint8)
    cx, cy = 0.5 + 0.3 * np.sin(t + seed), 0.5 + 0.2 * np.cos(1.3 * t)
    cube = (np.abs(x - cx) < 0.1) & (np.abs(y - cy) < 0.1)
    frame[cube] = (200, 40 + seed % 50, 40)
    noise = np.random.default_rng([seed, int(t * FPS)]).integers(-3, 4, frame.shape)  # a camera's sensor noise
    return np.clip(frame.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def build(root: Path, episodes: int, video: str | None, *, short: bool = False) -> Path:
    """The LeRobot dataset at ``root``, built with LeRobot's API (reused when it is there)."""
    if (root / "meta" / "info.json").exists():
        return root
    from ledataset.datasets.lerobot_dataset import LeRobotDataset

    features: dict[str, Any] = {
        "observation.state": {"dtype": "float32", "shape": (DIM,), "names": None},
        "action": {"dtype": "float32", "shape": (DIM,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
    }
    for name, (h, w) in CAMERAS.items():
        kind = "video" if video else "image"
        features[name] = {"dtype": kind, "shape": (h, w, 3), "names": ["height", "width", "channels"]}
    shutil.rmtree(root, ignore_errors=True)
    ds = LeRobotDataset.create(
        repo_id="bench/lerobot", root=root, fps=FPS, features=features, use_videos=video is not None,
        vcodec=video or "libsvtav1",
    )  # fmt: skip
    rng = np.random.default_rng(0)
    for e in range(episodes):
        n = int(rng.integers(10, 20) if short else rng.integers(40, 100))
        for f in range(n):
            state = rng.standard_normal(DIM).astype(np.float32)
            frame: dict[str, Any] = {
                "observation.state": state,
                "action": state * 0.5,
                "next.reward": np.array([f / n], np.float32),
                "task": TASKS[e % len(TASKS)],
            }
            for i, (name, (h, w)) in enumerate(CAMERAS.items()):
                frame[name] = _render(h, w, f / FPS, e * 7 + i)
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    return root


# -- loaders ------------------------------------------------------------------------------------------


def _lerobot(root: Path, converted: Path, deltas: dict[str, list[float]] | None) -> Any:
    from ledataset.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("bench/lerobot", root=root, delta_timestamps=deltas)


def _drop_in(root: Path, converted: Path, deltas: dict[str, list[float]] | None) -> Any:
    import torchrecord

    return torchrecord.LeRobotDataset(converted, delta_timestamps=deltas)


def _stream(root: Path, converted: Path, deltas: dict[str, list[float]] | None, batch_size: int) -> Any:
    import torchrecord

    return torchrecord.LeRobotStreamDataset(converted, delta_timestamps=deltas, batch_size=batch_size)


#: The streaming reader: ``STREAM(root, converted, deltas, batch_size)``, read by ``torchrecord.RecordLoader``.
STREAM: Callable[[Path, Path, dict[str, list[float]] | None, int], Any] | None = _stream

LOADERS: dict[str, Callable[[Path, Path, dict[str, list[float]] | None], Any]] = {
    "lerobot": _lerobot,
    "drop-in": _drop_in,
    "drop-in+collate": _drop_in,  # the same, with collate_fn=torchrecord.collate (docs/lerobot.md, for workers)
}


def _collate_of(name: str) -> Callable[..., Any] | None:
    """The DataLoader's collate_fn for loader ``name``: torchrecord.collate for ``drop-in+collate``, else None."""
    if name != "drop-in+collate":
        return None
    import torchrecord

    return torchrecord.collate


def _clear_decoder_cache() -> None:
    """LeRobot's module-level video decoders must not cross into fork workers (huggingface/lerobot#2488)."""
    from ledataset.datasets import video_utils

    video_utils._default_decoder_cache.clear()


def _items_per_second(
    ds: Any, *, batch_size: int, workers: int, batches: int, streaming: bool, collate: Callable[..., Any] | None = None
) -> float:
    _clear_decoder_cache()
    if streaming:
        import torchrecord

        loader: Any = torchrecord.RecordLoader(ds, num_workers=workers)
    else:
        generator = torch.Generator().manual_seed(0)
        loader = DataLoader(
            ds, batch_size=batch_size, shuffle=True, num_workers=workers, generator=generator, collate_fn=collate
        )
    it = iter(loader)
    for _ in range(max(1, workers)):  # warm-up, a batch from each worker: every worker started, its caches filled
        next(it)
    start = time.perf_counter()
    got = 0
    for _ in range(batches):
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        got += len(batch["index"])
    took = time.perf_counter() - start
    del it
    _clear_decoder_cache()
    return got / took


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.1f}x"


def run(root: Path, converted: Path, *, batch_size: int, batches: int, workers: list[int]) -> list[dict[str, Any]]:
    rows = []
    for mode, deltas in MODES.items():
        for w in workers:
            row: dict[str, Any] = {"mode": mode, "workers": w}
            for name, make in LOADERS.items():
                row[name] = _items_per_second(
                    make(root, converted, deltas),
                    batch_size=batch_size,
                    workers=w,
                    batches=batches,
                    streaming=False,
                    collate=_collate_of(name),
                )
            row["stream"] = None
            if STREAM is not None:
                ds = STREAM(root, converted, deltas, batch_size)
                row["stream"] = _items_per_second(ds, batch_size=batch_size, workers=w, batches=batches, streaming=True)
            rows.append(row)
            print_row(row)
    return rows


def print_header() -> None:
    print(
        f"{'mode':8} {'workers':>7} {'lerobot':>10} {'drop-in':>10} {'ratio':>7} {'+collate':>10} {'ratio':>7} "
        f"{'stream':>10} {'ratio':>7}"
    )


def print_row(row: dict[str, Any]) -> None:
    base = row["lerobot"]
    collated = row.get("drop-in+collate")
    print(
        f"{row['mode']:8} {row['workers']:>7} {_fmt(base):>10} {_fmt(row['drop-in']):>10} "
        f"{_ratio(row['drop-in'], base):>7} {_fmt(collated):>10} {_ratio(collated, base):>7} "
        f"{_fmt(row['stream']):>10} {_ratio(row['stream'], base):>7}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--video", choices=("h264", "libsvtav1"), help="cameras as video (default: images)")
    parser.add_argument("--data-dir", type=Path, default=Path("bench-data"))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=20, help="timed batches per point (after one warm-up)")
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--tiny", action="store_true", help="a tiny dataset and a few batches: checks that it runs")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    import tv_compat  # noqa: F401  (the oracle's environment: before LeRobot imports torchvision)

    torch.set_num_threads(1)
    if args.tiny:
        args.episodes, args.batch_size, args.batches = 3, 4, 2
    name = f"lerobot-{args.video or 'images'}-{args.episodes}{'-tiny' if args.tiny else ''}"
    root = args.data_dir / name
    converted = args.data_dir / f"{name}.tr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = time.perf_counter()
        build(root, args.episodes, args.video, short=args.tiny)
        built = time.perf_counter() - started
        if not converted.exists():
            from torchrecord.convert import from_lerobot

            from_lerobot(root, converted, progress=False)
        frames = len(_drop_in(root, converted, None))
        print(f"{name}: {frames} frames, {args.episodes} episodes, {FPS} fps (built in {built:.1f} s)")
        print(f"batch size {args.batch_size}, {args.batches} timed batches per point, items/s")
        print_header()
        rows = run(
            root,
            converted,
            batch_size=args.batch_size,
            batches=args.batches,
            workers=[int(w) for w in args.workers.split(",")],
        )
    if args.out is not None:
        info = {"dataset": name, "frames": frames, "batch_size": args.batch_size, "batches": args.batches}
        args.out.write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
