"""robomimic's SequenceDataset against torchrecord's windows: ``python -m benchmarks.robomimic``.

Data: a generated lift-like set (``--demos`` 200 demos of 40-60 steps; low-dim
keys robot0_eef_pos[3], robot0_eef_quat[4], robot0_gripper_qpos[2], object[10],
all float64; two uint8[84,84,3] cameras drawn like renders: flat colours, a
gradient and moving shapes, so they compress as renders do, not as noise;
actions[7] that depend on the low-dim obs; next_obs = obs shifted by one), written
as HDF5 raw (contiguous) and gzip, and converted to a record set. ``--large``
makes it 10x larger.

Loaders (``--loaders``): robomimic 0.3.0 ``SequenceDataset`` with
``hdf5_cache_mode`` None / low_dim / all (shuffled ``DataLoader``), torchrecord's
map-style ``SequenceDataset`` with each cache mode (shuffled ``DataLoader``) and
its streaming ``WindowDataset`` with each cache mode (``DataLoader(batch_size=None)``).
The ``... zstd`` loaders read a copy of the record set converted with
``compression="zstd"`` (the camera images compress; fields that do not shrink are
left alone); needs the ``compress`` extra (skipped without it).

Sweep: batch sizes 16-256 at seq_length 10, seq_length 1-60 at batch 64, workers
0 and 2, one torch thread. An epoch is ``--steps`` batches (as in the study).
Each loader runs in its own process (so its peak memory is its own); per point it
reports the construction and the first batch apart from the median windows/s of
the later epochs, and the ratio to robomimic low_dim at the same point. robomimic
"all" keeps every window separately: a point whose estimate passes
``--max-cache-gb`` is skipped and says so.

Targets (seq_length 10, batch 64): the streaming version at least 3x robomimic
low_dim, no slower than robomimic "all", with at most 1.5x the record set's bytes
of memory (peak RSS of its process during the point, less its RSS after imports).

``--convergence``: a small behaviour-cloning MLP (low-dim obs -> actions) trained
``--bc-steps`` steps (1,000) on the "train" filter from robomimic low_dim,
torchrecord SequenceDataset and WindowDataset, 5 seeds each; held-out L1, L2 and
cosine losses on "valid" must be within 3 standard deviations of robomimic's; a
deliberately shifted-actions loader (the action of the next step) must fail.

Quick check: ``python -m benchmarks.robomimic --scale 0.02 --steps 3 --epochs 2``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

__all__ = ["LOADERS", "main", "write_lift_like"]

LOW_DIM = {"robot0_eef_pos": 3, "robot0_eef_quat": 4, "robot0_gripper_qpos": 2, "object": 10}
CAMERAS = ("agentview_image", "robot0_eye_in_hand_image")
OBS_KEYS = [*LOW_DIM, *CAMERAS]
DATASET_KEYS = ["actions", "rewards", "dones"]
ACTION_DIM = 7
BATCH_SIZES = (16, 32, 64, 128, 256)
SEQ_LENGTHS = (1, 5, 10, 20, 40, 60)
IMAGE = (84, 84, 3)


# -- data ------------------------------------------------------------------------------------


def _render(rng: np.random.Generator, centres: np.ndarray, palette: np.ndarray) -> np.ndarray:
    """Frames [T, 84, 84, 3] like a simple render: a gradient sky, a flat table, a cube and a gripper."""
    t = len(centres)
    rows = np.linspace(0, 1, IMAGE[0], dtype=np.float32)[:, None, None]
    sky = (palette[0] * (1 - rows) + palette[1] * rows).astype(np.uint8)
    base = np.broadcast_to(sky, IMAGE).copy()
    base[50:, :] = palette[2]
    frames = np.repeat(base[None], t, axis=0)
    for i, (x, y) in enumerate(centres):
        frames[i, 40 + y : 50 + y, 20 + x : 30 + x] = palette[3]
        frames[i, 10 + y // 2 : 16 + y // 2, 45 - x : 53 - x] = palette[4]
    return frames


def _demo(rng: np.random.Generator, n: int, mix: np.ndarray) -> dict[str, np.ndarray]:
    """One demo of n + 1 observations (the last is only a next_obs) and n actions."""
    obs: dict[str, np.ndarray] = {}
    walk = np.cumsum(rng.normal(scale=0.05, size=(n + 1, 3)), axis=0)
    obs["robot0_eef_pos"] = walk
    quat = rng.normal(size=(n + 1, 4))
    obs["robot0_eef_quat"] = quat / np.linalg.norm(quat, axis=1, keepdims=True)
    obs["robot0_gripper_qpos"] = rng.uniform(-0.04, 0.04, size=(n + 1, 2))
    obs["object"] = rng.normal(size=(n + 1, 10))
    low = np.concatenate([obs[k] for k in LOW_DIM], axis=1)
    centres = np.clip((low[:, :2] * 10 + 15).astype(np.int64), 0, 30)
    for c, key in enumerate(CAMERAS):
        palette = np.random.default_rng(c).integers(0, 256, size=(5, 3)).astype(np.float32)
        obs[key] = _render(rng, centres, palette)
    actions = np.tanh(low[:n] @ mix) + rng.normal(scale=0.05, size=(n, ACTION_DIM))
    return {"obs": obs, "actions": actions}


def write_lift_like(path: Path, demos: int, *, compression: str | None, seed: int = 0) -> None:
    """A robomimic file like Lift PH: ``demos`` demos of 40-60 steps (see the module docstring)."""
    import h5py

    rng = np.random.default_rng(seed)
    mix = np.random.default_rng(99).normal(scale=0.5, size=(sum(LOW_DIM.values()), ACTION_DIM))
    options = {"compression": compression} if compression else {}
    tmp = path.with_suffix(".partial")
    with h5py.File(tmp, "w") as f:
        data = f.create_group("data")
        data.attrs["env_args"] = json.dumps({"env_name": "Lift", "type": 1, "env_kwargs": {}})
        total = 0
        for d in range(demos):
            n = int(rng.integers(40, 61))
            demo = _demo(rng, n, mix)
            g = data.create_group(f"demo_{d}")
            g.attrs["num_samples"] = n
            for k, arr in demo["obs"].items():
                g.create_dataset(f"obs/{k}", data=arr[:n], **options)
                g.create_dataset(f"next_obs/{k}", data=arr[1:], **options)
            g.create_dataset("actions", data=demo["actions"], **options)
            rewards = np.zeros(n)
            rewards[-1] = 1
            g.create_dataset("rewards", data=rewards, **options)
            g.create_dataset("dones", data=rewards.astype(np.int64), **options)
            total += n
        data.attrs["total"] = total
        names = [f"demo_{d}" for d in range(demos)]
        f.create_dataset("mask/train", data=np.array([x for i, x in enumerate(names) if i % 10], dtype="S"))
        f.create_dataset("mask/valid", data=np.array([x for i, x in enumerate(names) if not i % 10], dtype="S"))
    tmp.rename(path)


def build_data(data_dir: Path, demos: int) -> dict[str, Any]:
    """The raw and gzip HDF5 files and the record set (made once per size), with sizes and conversion times."""
    from torchrecord.convert import from_robomimic

    root = data_dir / f"robomimic-{demos}"
    root.mkdir(parents=True, exist_ok=True)
    files = {
        "raw": root / "lift.hdf5",
        "gzip": root / "lift-gzip.hdf5",
        "tr": root / "lift.tr",
        "tr-zstd": root / "lift-zstd.tr",
    }
    for kind in ("raw", "gzip"):
        if not files[kind].exists():
            write_lift_like(files[kind], demos, compression="gzip" if kind == "gzip" else None)
    info: dict[str, Any] = {"demos": demos}
    for kind, name in (("gzip", "lift-from-gzip.tr"), ("raw", "lift.tr")):
        start = time.perf_counter()
        from_robomimic(files[kind], root / name, overwrite=True, progress=False)
        info[f"convert_{kind}_s"] = time.perf_counter() - start
    (root / "lift-from-gzip.tr").unlink()
    try:
        start = time.perf_counter()
        from_robomimic(files["raw"], files["tr-zstd"], overwrite=True, progress=False, compression="zstd")
        info["convert_zstd_s"] = time.perf_counter() - start
    except ImportError:  # no compress extra: the zstd loaders are skipped
        files.pop("tr-zstd")
    info["bytes"] = {kind: os.path.getsize(p) for kind, p in files.items() if p.exists()}
    info["files"] = {kind: str(p) for kind, p in files.items()}
    return info


# -- loaders -----------------------------------------------------------------------------------


def _quiet() -> contextlib.AbstractContextManager[Any]:
    return contextlib.redirect_stdout(io.StringIO())


def _robomimic(files: dict[str, str], cache: str | None, params: dict[str, Any]) -> Any:
    import robomimic.utils.obs_utils as obs_utils
    from robomimic.utils.dataset import SequenceDataset as RobomimicSequenceDataset

    with _quiet(), contextlib.redirect_stderr(io.StringIO()):
        obs_utils.initialize_obs_utils_with_obs_specs({"obs": {"low_dim": list(LOW_DIM), "rgb": list(CAMERAS)}})
        return RobomimicSequenceDataset(files["raw"], hdf5_cache_mode=cache, **params)


def _sequence(files: dict[str, str], cache: str | None, params: dict[str, Any], set_: str = "tr") -> Any:
    from torchrecord import SequenceDataset

    return SequenceDataset(files[set_], frame_cache=cache, **params)


def _windows(
    files: dict[str, str], cache: str | None, params: dict[str, Any], batch_size: int, set_: str = "tr"
) -> Any:
    from torchrecord import WindowDataset

    return WindowDataset(files[set_], frame_cache=cache, batch_size=batch_size, **params)


#: loader name -> (kind, cache mode); names ending in " zstd" read the zstd-compressed record set
LOADERS: dict[str, tuple[str, str | None]] = {
    "robomimic None": ("robomimic", None),
    "robomimic low_dim": ("robomimic", "low_dim"),
    "robomimic all": ("robomimic", "all"),
    "torchrecord map None": ("map", None),
    "torchrecord map low_dim": ("map", "low_dim"),
    "torchrecord map all": ("map", "all"),
    "torchrecord stream None": ("stream", None),
    "torchrecord stream low_dim": ("stream", "low_dim"),
    "torchrecord stream all": ("stream", "all"),
    "torchrecord map low_dim zstd": ("map", "low_dim"),
    "torchrecord stream None zstd": ("stream", None),
    "torchrecord stream low_dim zstd": ("stream", "low_dim"),
}


def _epochs(kind: str, ds: Any, batch_size: int, workers: int, epoch: int) -> Iterable[Any]:
    if kind == "stream":
        ds.set_epoch(epoch)
        return DataLoader(ds, batch_size=None, num_workers=workers)
    generator = torch.Generator().manual_seed(epoch)
    return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers, generator=generator)


def _robomimic_all_bytes(demos: int, seq_length: int) -> int:
    """robomimic "all" holds every window: windows x frames x (obs + next_obs) bytes, roughly."""
    frame = sum(LOW_DIM.values()) * 8 + len(CAMERAS) * int(np.prod(IMAGE))
    return demos * 50 * seq_length * 2 * frame


def run_loader(
    name: str,
    files: dict[str, str],
    points: list[dict[str, Any]],
    epochs: int,
    steps: int,
    max_cache_gb: float,
    demos: int,
) -> list[dict[str, Any]]:
    """Time one loader over the sweep points (in this process); one dict per point."""
    torch.set_num_threads(1)
    kind, cache = LOADERS[name]
    set_ = "tr-zstd" if name.endswith(" zstd") else "tr"
    if set_ not in files:
        return [
            {**point, "loader": name, "skipped": "no zstd copy (pip install torchrecord[compress])"} for point in points
        ]
    if kind == "robomimic":
        import robomimic.utils.dataset  # noqa: F401  (imported before the baseline, as torchrecord is)
    baseline = _rss()
    baseline_private = _rss("RssAnon:")
    out = []
    for point in points:
        batch_size, seq_length, workers = point["batch_size"], point["seq_length"], point["workers"]
        row = {**point, "loader": name}
        if name == "robomimic all" and _robomimic_all_bytes(demos, seq_length) > max_cache_gb * 2**30:
            row["skipped"] = f"needs ~{_robomimic_all_bytes(demos, seq_length) / 2**30:.0f} GiB (--max-cache-gb)"
            out.append(row)
            continue
        params = {"obs_keys": OBS_KEYS, "dataset_keys": DATASET_KEYS, "seq_length": seq_length}
        gc.collect()
        _reset_peak()
        start = time.perf_counter()
        if kind == "robomimic":
            ds = _robomimic(files, cache, params)
        elif kind == "map":
            ds = _sequence(files, cache, params, set_)
        else:
            ds = _windows(files, cache, params, batch_size, set_)
        row["construct_s"] = time.perf_counter() - start
        rates = []
        private = _rss("RssAnon:")
        for epoch in range(epochs):
            start = time.perf_counter()
            windows = 0
            for i, batch in enumerate(_epochs(kind, ds, batch_size, workers, epoch)):
                windows += int(batch["actions"].shape[0])
                private = max(private, _rss("RssAnon:"))  # sampled once a batch (about 20 us)
                if i == 0 and epoch == 0:
                    row["first_batch_s"] = time.perf_counter() - start
                if i + 1 == steps:
                    break
            if epoch:
                rates.append(windows / (time.perf_counter() - start))
        row["windows_per_s"] = statistics.median(rates) if rates else None
        row["epochs"] = epochs
        row["peak_bytes"] = _rss("VmHWM:")
        # private (anonymous) memory only: the peak RSS above also counts the pages of a memory-mapped
        # file that were read (page cache, shared and reclaimable: an LMDB set read whole adds its size)
        row["peak_private_bytes"] = private - baseline_private
        del ds
        out.append(row)
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    for row in out:
        row["peak_main_bytes"], row["peak_worker_bytes"], row["baseline_bytes"] = usage, children, baseline
    return out


def _rss(what: str = "VmRSS:") -> int:
    """This process's resident set now (``VmRSS:``) or its peak since the last reset (``VmHWM:``), bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(what):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    """Reset this process's peak resident set (Linux: ``5`` into ``/proc/self/clear_refs``)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _sweep(batch_sizes: Iterable[int], seq_lengths: Iterable[int], workers: Iterable[int]) -> list[dict[str, Any]]:
    points = []
    for w in workers:
        points += [{"batch_size": b, "seq_length": 10, "workers": w} for b in batch_sizes]
        points += [
            {"batch_size": 64, "seq_length": s, "workers": w} for s in seq_lengths if s != 10 or 64 not in batch_sizes
        ]
    return points


# -- convergence ---------------------------------------------------------------------------------


def _bc_batches(kind: str, files: dict[str, str], seed: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """(obs [B, 19], action [B, 7]) batches from one loader, forever (train filter, low_dim cache)."""
    shifted = kind == "shifted"
    params = {
        "obs_keys": list(LOW_DIM),
        "dataset_keys": ["actions"],
        "seq_length": 2 if shifted else 1,
        "filter_by_attribute": "train",
        "load_next_obs": False,
    }
    if kind == "robomimic":
        ds = _robomimic(files, "low_dim", params)
    elif kind == "map":
        ds = _sequence(files, "low_dim", params)
    else:
        ds = _windows(files, "low_dim", params, 64)
        ds.seed = seed
    epoch = 0
    while True:
        if kind in ("stream", "shifted"):
            loader = _epochs("stream", ds, 64, 0, epoch)
        else:
            generator = torch.Generator().manual_seed(seed * 1000 + epoch)
            loader = DataLoader(ds, batch_size=64, shuffle=True, generator=generator)
        for batch in loader:
            obs = torch.cat([batch["obs"][k][:, 0].float() for k in LOW_DIM], dim=1)
            action = batch["actions"][:, 1 if shifted else 0].float()
            yield obs, action
        epoch += 1


def _held_out(files: dict[str, str]) -> tuple[torch.Tensor, torch.Tensor]:
    ds = _robomimic(
        files,
        "low_dim",
        {
            "obs_keys": list(LOW_DIM),
            "dataset_keys": ["actions"],
            "filter_by_attribute": "valid",
            "load_next_obs": False,
        },
    )
    batch = next(iter(DataLoader(ds, batch_size=len(ds))))
    return torch.cat([batch["obs"][k][:, 0].float() for k in LOW_DIM], dim=1), batch["actions"][:, 0].float()


def _train(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]], steps: int, seed: int, held: tuple[torch.Tensor, torch.Tensor]
) -> dict[str, float]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(19, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, ACTION_DIM),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _, (x, y) in zip(range(steps), batches):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = model(held[0])
        return {
            "L1": float((pred - held[1]).abs().mean()),
            "L2": float(((pred - held[1]) ** 2).mean()),
            "cosine": float(1 - torch.nn.functional.cosine_similarity(pred, held[1], dim=1).mean()),
        }


def convergence(files: dict[str, str], steps: int, seeds: int = 5) -> dict[str, Any]:
    """Held-out losses per loader over seeds, and whether each is within 3 std of robomimic's."""
    torch.set_num_threads(1)
    held = _held_out(files)
    losses: dict[str, list[dict[str, float]]] = {}
    for kind in ("robomimic", "map", "stream", "shifted"):
        losses[kind] = [_train(_bc_batches(kind, files, s), steps, s, held) for s in range(seeds)]
    verdict: dict[str, Any] = {}
    base = losses["robomimic"]
    for kind, runs in losses.items():
        row = {}
        for metric in ("L1", "L2", "cosine"):
            a = [r[metric] for r in runs]
            b = [r[metric] for r in base]
            spread = max(statistics.pstdev(b), 1e-12)
            row[metric] = {
                "mean": statistics.mean(a),
                "std": statistics.pstdev(a),
                "within_3_std": abs(statistics.mean(a) - statistics.mean(b)) <= 3 * spread,
            }
        row["passes"] = all(v["within_3_std"] for v in row.values() if isinstance(v, dict))
        verdict[kind] = row
    return verdict


# -- report --------------------------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def print_table(rows: list[dict[str, Any]], info: dict[str, Any]) -> None:
    base = {
        (r["batch_size"], r["seq_length"], r["workers"]): r.get("windows_per_s")
        for r in rows
        if r["loader"] == "robomimic low_dim"
    }
    print(
        f"\nfiles: HDF5 raw {_gib(info['bytes']['raw'])} GiB, gzip {_gib(info['bytes']['gzip'])} GiB, "
        f"record set {_gib(info['bytes']['tr'])} GiB"
        + (f", zstd record set {_gib(info['bytes']['tr-zstd'])} GiB" if "tr-zstd" in info["bytes"] else "")
        + f"; conversion {info['convert_raw_s']:.1f} s (raw), "
        f"{info['convert_gzip_s']:.1f} s (gzip)"
    )
    print(
        "memory: peak RSS of the loader's process during the point, less its RSS after imports (mapped file"
        " pages read count here); private: the peak of its anonymous memory (RssAnon, sampled once a batch),"
        " less its value after imports; workers: the largest worker's peak RSS over the loader's sweep"
        " (shared pages included)"
    )
    print(
        f"{'loader':<33}{'w':>2}{'B':>5}{'T':>4}{'construct s':>13}{'1st batch s':>13}{'windows/s':>12}"
        f"{'x rm low_dim':>14}{'peak-base GiB':>15}{'private GiB':>13}{'peak worker GiB':>17}"
    )
    for r in rows:
        head = f"{r['loader']:<33}{r['workers']:>2}{r['batch_size']:>5}{r['seq_length']:>4}"
        if "skipped" in r:
            print(f"{head}  skipped: {r['skipped']}")
            continue
        ref = base.get((r["batch_size"], r["seq_length"], r["workers"]))
        rate = r["windows_per_s"] or 0.0
        ratio = f"{rate / ref:.2f}" if ref else "-"
        print(
            f"{head}{r['construct_s']:>13.2f}{r.get('first_batch_s', 0):>13.3f}{rate:>12,.0f}{ratio:>14}"
            f"{_gib(r['peak_bytes'] - r['baseline_bytes']):>15}{_gib(r.get('peak_private_bytes', 0)):>13}"
            f"{_gib(r['peak_worker_bytes']):>17}"
        )


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def check_targets(rows: list[dict[str, Any]], info: dict[str, Any]) -> list[str]:
    lines = []
    for w in sorted({r["workers"] for r in rows}):
        at = {r["loader"]: r for r in rows if (r["batch_size"], r["seq_length"], r["workers"]) == (64, 10, w)}
        low = at.get("robomimic low_dim", {}).get("windows_per_s")
        everything = at.get("robomimic all", {}).get("windows_per_s")
        for name in ("torchrecord stream low_dim", "torchrecord stream all", "torchrecord stream None"):
            r = at.get(name)
            if r is None or not r.get("windows_per_s") or not low:
                continue
            rate = r["windows_per_s"]
            memory = (r["peak_bytes"] - r["baseline_bytes"]) / info["bytes"]["tr"]
            private = r.get("peak_private_bytes", 0) / info["bytes"]["tr"]
            line = f"w={w} {name}: {rate / low:.2f}x robomimic low_dim (target 3x: {_met(rate >= 3 * low)})"
            if everything:
                line += f", {rate / everything:.2f}x robomimic all (target >= 1: {_met(rate >= everything)})"
            else:
                line += ", robomimic all not measured"
            line += (
                f", peak RSS {memory:.2f}x the record set (mapped file pages included), private memory"
                f" {private:.2f}x (target <= 1.5: {_met(private <= 1.5)})"
            )
            lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the 200 demos (quick checks)")
    parser.add_argument("--large", action="store_true", help="the 10x larger variant (2,000 demos)")
    parser.add_argument("--data-dir", type=Path, default=Path("bench-data"))
    parser.add_argument("--loaders", default=",".join(LOADERS), help="comma-separated loader names")
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    parser.add_argument("--seq-lengths", default=",".join(map(str, SEQ_LENGTHS)))
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--epochs", type=int, default=3, help="the first and the later epochs (median)")
    parser.add_argument("--steps", type=int, default=100, help="batches per epoch")
    parser.add_argument("--max-cache-gb", type=float, default=8.0, help="skip robomimic 'all' above this estimate")
    parser.add_argument("--convergence", action="store_true", help="also run the behaviour-cloning check")
    parser.add_argument("--bc-steps", type=int, default=1000)
    parser.add_argument("--out", type=Path, help="write every figure as JSON here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # one loader in its own process: its peak memory is its own
        job = json.loads(args.child)
        rows = run_loader(
            job["loader"], job["files"], job["points"], args.epochs, args.steps, args.max_cache_gb, job["demos"]
        )
        print("ROWS " + json.dumps(rows))
        return 0
    demos = max(4, round(200 * args.scale * (10 if args.large else 1)))
    info = build_data(args.data_dir, demos)
    files = info["files"]
    points = _sweep(
        [int(x) for x in args.batch_sizes.split(",")],
        [int(x) for x in args.seq_lengths.split(",")],
        [int(x) for x in args.workers.split(",")],
    )
    rows: list[dict[str, Any]] = []
    for name in args.loaders.split(","):
        job = json.dumps({"loader": name, "files": files, "points": points, "demos": demos})
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.robomimic",
            "--child",
            job,
            "--epochs",
            str(args.epochs),
            "--steps",
            str(args.steps),
            "--max-cache-gb",
            str(args.max_cache_gb),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        found = [line for line in done.stdout.splitlines() if line.startswith("ROWS ")]
        if done.returncode or not found:
            print(f"{name}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        rows += json.loads(found[-1][5:])
        print(f"{name}: done", flush=True)
    print_table(rows, info)
    for line in check_targets(rows, info):
        print(line)
    result: dict[str, Any] = {"data": info, "rows": rows}
    if args.convergence:
        verdict = convergence(files, args.bc_steps)
        result["convergence"] = verdict
        print("\nconvergence (held-out losses, 5 seeds, within 3 std of robomimic low_dim):")
        for kind, row in verdict.items():
            cells = "  ".join(f"{m} {row[m]['mean']:.4f}±{row[m]['std']:.4f}" for m in ("L1", "L2", "cosine"))
            expect = "fail" if kind == "shifted" else "pass"
            ok = row["passes"] == (expect == "pass")
            print(
                f"  {kind:<10} {cells}  {'passes' if row['passes'] else 'fails'} (expected {expect}: "
                f"{'ok' if ok else 'NOT OK'})"
            )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
