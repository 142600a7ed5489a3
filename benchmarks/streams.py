"""Sequence streams against the guide's schemes: ``python -m benchmarks.streams``.

2,000 sequences of 20-400 frames (float32[40] + int64), B = 32 streams, steps 1
and 16, num_workers 0 and 2, with and without a 20 us per-frame transform.

* torchrecord: ``StreamDataset`` (worker w builds the batches t with t % n == w), in a plain
  ``DataLoader(batch_size=None)`` and in a ``StreamLoader`` (bundles of consecutive batches per
  handover, for small batches);
* islice: the guide's first scheme, every worker computes every batch and keeps
  its own slice of them (every worker reads everything);
* zipped parts: the guide's fix, one DataLoader (one worker) per part of the B
  positions, zipped into one batch;
* batch-mode ``RecordDataset`` over the same frames (no streams): the speed to
  compare steps=16 with.

Every configuration's batches are checked equal to torchrecord with 0 workers.
Median of ``--repeats`` epochs; one torch thread in the measuring process.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import resource
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import torchrecord
from torchrecord import StreamDataset, StreamLoader

B = 32


def _frames(count: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    for g, n in enumerate(rng.integers(20, 401, size=count).tolist()):
        x = rng.standard_normal((n, 40), dtype=np.float32)
        for t in range(n):
            yield {"x": x[t], "seq": g}


def _record_set(data_dir: Path, count: int) -> Path:
    path = data_dir / f"streams-{count}" / "seqs.tr"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        torchrecord.write_record(_frames(count), path, group_by="seq", shuffle=True, progress=False)
    return path


def _spin_20us(sample: dict[str, Any]) -> dict[str, Any]:
    end = time.perf_counter() + 20e-6
    while time.perf_counter() < end:
        pass
    return sample


class _Islice(IterableDataset[dict[str, Any]]):
    """The guide's first scheme: each worker makes every batch and keeps every n-th."""

    def __init__(self, ds: StreamDataset) -> None:
        self.ds = ds

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        w, n = (info.id, info.num_workers) if info is not None else (0, 1)
        return itertools.islice(self.ds.batches(0, 1), w, None, n)


class _Part(StreamDataset):
    """Streams [lo, hi) of the plan only: one part of the zipped-loaders scheme."""

    part: tuple[int, int] = (0, B)

    def _streams(self) -> range:
        return range(*self.part)


def _stream_loader(path: Path, steps: int, transform: Any, workers: int) -> Any:
    ds = StreamDataset(path, batch_size=B, steps=steps, transform=transform, seed=0)
    return ds if workers == 0 else DataLoader(ds, batch_size=None, num_workers=workers)


def _bundled_loader(path: Path, steps: int, transform: Any, workers: int) -> Any:
    ds = StreamDataset(path, batch_size=B, steps=steps, transform=transform, seed=0)
    return StreamLoader(ds, num_workers=workers)


def _islice_loader(path: Path, steps: int, transform: Any, workers: int) -> Any:
    ds = StreamDataset(path, batch_size=B, steps=steps, transform=transform, seed=0)
    return DataLoader(_Islice(ds), batch_size=None, num_workers=workers)


def _zipped(path: Path, steps: int, transform: Any, parts: int) -> Iterator[dict[str, Any]]:
    loaders = []
    for p in range(parts):
        ds = _Part(path, B, steps=steps, transform=transform, seed=0)
        ds.part = (p * B // parts, (p + 1) * B // parts)
        loaders.append(DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork"))
    for pieces in zip(*loaders):
        batch = {key: torch.cat([x[key] for x in pieces]) for key in ("mask", "start", "sequence")}
        batch["data"] = {k: torch.cat([x["data"][k] for x in pieces]) for k in pieces[0]["data"]}
        yield batch


def _fingerprint(batch: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """What is checked equal across configurations: every frame's data sum, mask, start and sequence."""
    return batch["data"]["x"].sum(2), batch["mask"], batch["start"], batch["sequence"]


def _cpu(who: int) -> float:
    """User + system CPU seconds of this process (RUSAGE_SELF) or of its reaped children."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _epoch(batches: Any) -> tuple[float, list[tuple[torch.Tensor, ...]]]:
    start = time.perf_counter()
    out = [_fingerprint(b) for b in batches]  # checked below
    return time.perf_counter() - start, out


def _steps16_target(path: str, repeats: int) -> tuple[float, float]:
    """Frames/s of batch-mode RecordDataset and of StreamDataset steps=16 (0 workers), epochs interleaved."""
    torch.set_num_threads(1)
    frames = len(torchrecord.RecordFile(path))
    batch_ds = torchrecord.RecordDataset(path, batch_size=B * 16)
    stream_ds = StreamDataset(path, batch_size=B, steps=16, seed=0)
    flat_times, stream_times = [], []
    for e in range(repeats):
        batch_ds.set_epoch(e)
        start = time.perf_counter()
        for _ in batch_ds:
            pass
        flat_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        for _ in stream_ds.batches(0, 1):
            pass
        stream_times.append(time.perf_counter() - start)
    return frames / statistics.median(flat_times), frames / statistics.median(stream_times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", default="1,16", help="comma-separated steps settings (default 1,16)")
    parser.add_argument("--data-dir", type=Path, default=Path("bench-data"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    path = _record_set(args.data_dir, args.sequences)
    frames = len(torchrecord.RecordFile(path))
    print(f"{args.sequences:,} sequences, {frames:,} frames of float32[40] + int64, B={B}")
    # the steps=16 target first, in a fresh process: measured after the table, at the end of a long run, both
    # loops once came out about 2.5x slower than in a fresh process (and the ratio moved with them)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        target = pool.apply(_steps16_target, (str(path), args.repeats))
    rows = []
    for transform in (None, _spin_20us):
        tname = "20us/frame" if transform else "none"
        for steps in [int(x) for x in args.steps.split(",")]:
            reference: list[tuple[torch.Tensor, ...]] | None = None
            configs: list[tuple[str, int, Any]] = []
            for workers in (0, 2):
                configs.append(("torchrecord StreamDataset", workers, (_stream_loader, workers)))
            configs.append(("torchrecord StreamLoader", 2, (_bundled_loader, 2)))
            configs.append(("islice (guide)", 2, (_islice_loader, 2)))
            configs.append(("zipped parts (guide)", 2, (_zipped, 2)))
            for name, workers, make in configs:
                times, main_cpu, worker_cpu = [], [], []
                for _ in range(args.repeats):
                    build, n = make
                    self0, children0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
                    t, out = _epoch(build(path, steps, transform, n))
                    times.append(t)
                    main_cpu.append(_cpu(resource.RUSAGE_SELF) - self0)
                    worker_cpu.append(_cpu(resource.RUSAGE_CHILDREN) - children0)  # workers exited: reaped
                if reference is None:
                    reference = out
                same = len(out) == len(reference) and all(
                    all(torch.equal(x, y) for x, y in zip(a, b)) for a, b in zip(out, reference)
                )
                median = statistics.median(times)
                rows.append((tname, steps, name, workers, frames / median, same))
                print(
                    f"  {tname} steps={steps} {name} w={workers}: {frames / median:,.0f} frames/s "
                    f"(CPU: main process {statistics.median(main_cpu):.2f} s, "
                    f"workers {statistics.median(worker_cpu):.2f} s; wall {median:.2f} s)",
                    flush=True,
                )
    base = {}
    print()
    print(f"{'transform':<11}{'steps':>6}  {'loader':<27}{'workers':>8}{'frames/s':>12}{'x w=0':>7}  same batches")
    for tname, steps, name, workers, speed, same in rows:
        if name.startswith("torchrecord") and workers == 0:
            base[(tname, steps)] = speed
        ratio = speed / base[(tname, steps)]
        print(f"{tname:<11}{steps:>6}  {name:<27}{workers:>8}{speed:>12,.0f}{ratio:>7.2f}  {'yes' if same else 'NO'}")
    flat, stream = target
    print(
        f"interleaved epochs in a fresh process, before the table: batch-mode RecordDataset (batch {B * 16}, no "
        f"streams) {flat:,.0f} frames/s, StreamDataset steps=16 w=0 {stream:,.0f} frames/s: {stream / flat:.2f}x "
        "of it (target >= 0.5)"
    )
    print(f"median of {args.repeats} epochs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
