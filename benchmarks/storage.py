"""Size on disk and compression: file size against the payload, and read speed, side by side in one run.

Three parts, each printed as a table with medians and ratios:

1. **packing**: for fixed-size samples of several sizes, the file size of the
   default write (``samples_per_record`` chosen automatically) and of one
   sample per record (the old default) against the payload bytes, and the read
   speed of both and of a few explicit ``samples_per_record`` (the best of them
   stands for "today's best setting"), in batch mode and per-sample mode.
2. **compression**: rendered-like images (flat colours, gradients, shapes) and
   noise of the same shape, written uncompressed, with zstd and with lz4: file
   size, write time, and read speed (batch mode) with a warm page cache and,
   where the kernel drops the file's pages on request, a cold one. The
   resident fraction of the file is measured with ``mincore`` before each cold
   epoch and printed; "eviction did not work" is said when it stays high.

Every reader runs in this process (``num_workers=0``) with one torch thread;
configurations are timed round by round, interleaved, and the figure is the
median over rounds (at least 3).

    python -m benchmarks.storage                # default scale (about a minute)
    python -m benchmarks.storage --scale 0.2    # quick look
    python -m benchmarks.storage --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import torchrecord
from torchrecord._store import envcache as _envcache
from torchrecord._store.advise import cached_pages

__all__ = ["main", "rendered_images", "resident_fraction"]

SIZES = (8, 72, 512, 3072, 9000, 150528)
EXPLICIT_K = (16, 64, 256)


# -- page cache ---------------------------------------------------------------------------
def resident_fraction(path: str) -> float | None:
    """The fraction of the file's pages in the page cache (``mincore``), or None where it cannot be asked."""
    counts = cached_pages(path)
    if counts is None:
        return None
    cached, pages = counts
    return cached / pages if pages else 1.0


def evict(path: str) -> float | None:
    """Ask the kernel to drop the file's pages (fsync, POSIX_FADV_DONTNEED); returns the resident fraction.

    The kernel keeps pages that a process maps, so this process's own mapping of
    the file (torchrecord keeps one environment per file) is closed first.
    """
    _envcache.drop_idle()  # the readers of the last round are done: their environments are idle
    gc.collect()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident_fraction(path)


# -- data ----------------------------------------------------------------------------------
def rendered_images(n: int, size: int = 96, seed: int = 0) -> np.ndarray:
    """uint8[n, 3, size, size] frames like a simulator's: a flat floor, a sky gradient, boxes and a disc."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, 3, size, size), np.uint8)
    yy, xx = np.mgrid[0:size, 0:size]
    sky = (np.linspace(200, 120, size)[:, None] * np.ones(size)[None, :]).astype(np.uint8)
    for i in range(n):
        img = out[i]
        img[0], img[1], img[2] = sky // 2, sky, np.full_like(sky, 230)
        img[:, size // 2 :, :] = np.array([90, 110, 70], np.uint8)[:, None, None]  # the floor
        for _ in range(3):  # boxes of flat colour
            x0, y0 = rng.integers(0, size - 20, 2)
            w, h = rng.integers(8, 30, 2)
            img[:, y0 : y0 + h, x0 : x0 + w] = rng.integers(0, 256, 3, dtype=np.uint8)[:, None, None]
        cx, cy, r = *rng.integers(20, size - 20, 2), rng.integers(5, 15)
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
        img[:, disc] = np.array([220, 40, 40], np.uint8)[:, None]
    return out


def _noise(n: int, size: int = 96, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 3, size, size), dtype=np.uint8)


class _Pairs(torch.utils.data.Dataset[dict[str, Any]]):
    def __init__(self, images: np.ndarray) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": self.images[i], "label": i}


# -- timing ---------------------------------------------------------------------------------
def _epoch(path: str, batch_size: int | None) -> float:
    """Samples per second of one shuffled epoch in this process."""
    ds = torchrecord.RecordDataset(path, batch_size=batch_size, seed=0)
    n = 0
    start = time.perf_counter()
    for item in ds:
        n += len(item["label"]) if batch_size else 1
    return n / (time.perf_counter() - start)


def _rounds(configs: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Median of each configuration's figure over ``rounds`` interleaved rounds."""
    figures: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, run in configs.items():
            figures[name].append(run())
    return {name: statistics.median(v) for name, v in figures.items()}


# -- the parts ------------------------------------------------------------------------------
def packing(root: Path, scale: float, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for size in SIZES:
        n = max(16, int((8 << 20) * scale) // size)
        data = np.random.default_rng(size).integers(0, 256, (n, size), dtype=np.uint8)
        samples = [{"x": data[i], "label": i} for i in range(n)]
        payload = n * (size + 8)
        paths: dict[str, str] = {}
        for k in [None, 1, *(k for k in EXPLICIT_K if k * size <= 4 << 20)]:
            name = "auto" if k is None else f"K={k}"
            rf = torchrecord.write_record(samples, root / f"p{size}-{name}.tr", samples_per_record=k, progress=False)
            paths[name] = rf.path
        auto_k = torchrecord.RecordFile(paths["auto"]).samples_per_record
        configs: dict[str, Callable[[], float]] = {}
        for name, path in paths.items():
            configs[f"{name} batch"] = lambda p=path: _epoch(p, 64)
            configs[f"{name} sample"] = lambda p=path: _epoch(p, None)
        speed = _rounds(configs, rounds)
        explicit = [name for name in paths if name != "auto"]
        best_batch = max(explicit, key=lambda nm: speed[f"{nm} batch"])
        best_sample = max(explicit, key=lambda nm: speed[f"{nm} sample"])
        rows.append(
            {
                "size": size + 8,
                "samples": n,
                "auto_k": auto_k,
                "auto_ratio": os.path.getsize(paths["auto"]) / payload,
                "k1_ratio": os.path.getsize(paths["K=1"]) / payload,
                "speed": speed,
                "best_batch": best_batch,
                "best_sample": best_sample,
            }
        )
        r = rows[-1]
        print(
            f"  {size + 8:>7} B  K auto={auto_k:<5} size/payload: auto {r['auto_ratio']:.3f}x, "
            f"K=1 {r['k1_ratio']:.3f}x | "
            f"batch: auto {speed['auto batch']:,.0f}/s = {speed['auto batch'] / speed[f'{best_batch} batch']:.2f}x "
            f"of best explicit ({best_batch}) | per-sample: auto {speed['auto sample']:,.0f}/s = "
            f"{speed['auto sample'] / speed[f'{best_sample} sample']:.2f}x of best explicit ({best_sample})",
            flush=True,
        )
    return rows


def compression(root: Path, scale: float, rounds: int) -> list[dict[str, Any]]:
    n = max(64, int(3000 * scale))
    rows = []
    for kind, images in (("rendered", rendered_images(n)), ("noise", _noise(n))):
        payload = images.nbytes + 8 * n
        paths: dict[str, str] = {}
        writes: dict[str, float] = {}
        for codec in (None, "zstd", "lz4"):
            name = codec or "none"
            start = time.perf_counter()
            rf = torchrecord.write_record(
                _Pairs(images), root / f"c-{kind}-{name}.tr", compression=codec, progress=False
            )
            writes[name] = time.perf_counter() - start
            paths[name] = rf.path
        warm = _rounds({name: (lambda p=path: _epoch(p, 64)) for name, path in paths.items()}, rounds)
        resident: dict[str, list[float | None]] = {name: [] for name in paths}

        def cold(name: str, path: str, seen: dict[str, list[float | None]] = resident) -> float:
            seen[name].append(evict(path))
            return _epoch(path, 64)

        cold_speed = _rounds({name: (lambda nm=name, p=path: cold(nm, p)) for name, path in paths.items()}, rounds)
        for name, path in paths.items():
            fractions = [f for f in resident[name] if f is not None]
            worst = max(fractions) if fractions else None
            row = {
                "data": kind,
                "codec": name,
                "samples": n,
                "bytes": os.path.getsize(path),
                "size_ratio": os.path.getsize(path) / payload,
                "write_seconds": writes[name],
                "warm": warm[name],
                "cold": cold_speed[name],
                "resident_before_cold": worst,
                "evicted": worst is not None and worst < 0.05,
            }
            rows.append(row)
            note = (
                "eviction: unknown (mincore unavailable)"
                if worst is None
                else f"resident before cold epochs <= {worst:.1%}"
                + ("" if row["evicted"] else " -- eviction did not work: 'cold' is warm")
            )
            print(
                f"  {kind:<8} {name:<5} {row['bytes'] / 1e6:8.2f} MB = {row['size_ratio']:.3f}x payload, "
                f"write {writes[name]:.2f}s | warm {warm[name]:,.0f}/s ({warm[name] / warm['none']:.2f}x none) | "
                f"cold {cold_speed[name]:,.0f}/s ({cold_speed[name] / cold_speed['none']:.2f}x none) | {note}",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="data size factor (1: 8 MB per size, 3000 images)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per configuration (>= 3)")
    parser.add_argument("--only", choices=("packing", "compression"), help="run one part")
    parser.add_argument("--dir", help="where to write the sets (default: a temporary folder)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rounds = max(3, args.rounds)
    out: dict[str, Any] = {"scale": args.scale, "rounds": rounds}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        if args.only in (None, "packing"):
            print(
                "packing: file size against payload (sample size incl. an 8-byte label), read speed (samples/s, "
                "medians) of the default write against the best explicit samples_per_record",
                flush=True,
            )
            out["packing"] = packing(root, args.scale, rounds)
        if args.only in (None, "compression"):
            print(f"compression: uint8[3, 96, 96] images + label, batch 64, medians of {rounds} rounds", flush=True)
            try:
                out["compression"] = compression(root, args.scale, rounds)
            except ImportError as exc:
                print(f"  skipped: {exc}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
