"""Sharded sets: write speed of parallel writers, reading shards against one file, remote cold and warm.

``python -m benchmarks.shards`` on the small-image workload:

1. **Writing** with 1, 2 and 4 writer processes (``write_shard``, one process per
   shard, all started at once): samples/s of the whole job and its speed-up over
   one writer on this machine; and the speed-up projected from per-writer
   throughput: each shard's writer is also run alone, and the job is projected to
   take as long as its slowest writer (what it reaches where every writer has a
   core of its own and the disk keeps up).
2. **Reading** a 4-shard set against the same data in one file (same seed, so the
   same samples in the same stored order), ``RecordDataset(batch_size=B)`` in this
   process: median samples/s over ``--epochs`` epochs and the ratio (target:
   within 5%).
3. **Remote**: the 4-shard set served by ``python -m http.server`` on 127.0.0.1,
   read through ``cache_dir``: time to the first batch and the steady speed after
   it, with an empty cache and then with a warm one.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import torchrecord
from benchmarks.machine import describe_machine
from benchmarks.workloads import WORKLOADS, ArraySamples, load_workload

WRITERS = (1, 2, 4)


def _write_one(samples: ArraySamples, folder: str, shard: int, n: int, out: Any) -> None:
    start = time.perf_counter()
    rf = torchrecord.write_shard(samples, folder, shard=shard, num_shards=n, seed=0, progress=False)
    out.put((shard, len(rf), time.perf_counter() - start))


def _run_writers(samples: ArraySamples, folder: Path, shards: list[int], n: int) -> list[tuple[int, int, float]]:
    """Start one writer process per shard in ``shards`` at once; (shard, samples, seconds) of each."""
    shutil.rmtree(folder, ignore_errors=True)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_write_one, args=(samples, str(folder), i, n, out)) for i in shards]
    for p in procs:
        p.start()
    results = [out.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"a writer failed: exit codes {[p.exitcode for p in procs]}")
    return results


def bench_writers(samples: ArraySamples, root: Path, writers: int) -> dict[str, float]:
    """Wall time of ``writers`` processes writing one set at once, and of each shard's writer alone."""
    folder = root / f"write-{writers}"
    start = time.perf_counter()
    _run_writers(samples, folder, list(range(writers)), writers)
    wall = time.perf_counter() - start
    alone = [_run_writers(samples, folder, [i], writers)[0] for i in range(writers)]
    shutil.rmtree(folder, ignore_errors=True)
    slowest = max(t for _, _, t in alone)
    return {
        "writers": writers,
        "seconds": wall,
        "samples_per_s": len(samples) / wall,
        "per_writer_samples_per_s": statistics.mean(n / t for _, n, t in alone),
        "projected_samples_per_s": len(samples) / slowest,
    }


def _epochs(datasets: list[torchrecord.RecordDataset], epochs: int) -> list[float]:
    """Median samples/s of each dataset over ``epochs`` epochs, taken in turn (after one warm-up epoch each)."""
    rates: list[list[float]] = [[] for _ in datasets]
    for epoch in range(epochs + 1):
        for dataset, rate in zip(datasets, rates):
            dataset.set_epoch(epoch)
            seen, start = 0, time.perf_counter()
            for _, labels in dataset:
                seen += len(labels)
            if epoch:
                rate.append(seen / (time.perf_counter() - start))
    return [statistics.median(r) for r in rates]


def _first_and_steady(dataset: torchrecord.RecordDataset) -> tuple[float, float]:
    """(seconds to the first batch, samples/s for the rest of the epoch)."""
    start = time.perf_counter()
    it = iter(dataset)
    next(it)
    first = time.perf_counter() - start
    seen, start = 0, time.perf_counter()
    for _, labels in it:
        seen += len(labels)
    return first, seen / max(time.perf_counter() - start, 1e-9)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_remote(folder: Path, batch: int, cache: Path) -> dict[str, Any]:
    """Cold and warm reads of ``folder`` from a local HTTP server (killed at the end)."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(folder.parent)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/{folder.name}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait for the server, at most 30 s
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        shutil.rmtree(cache, ignore_errors=True)
        rows = {}
        for label in ("empty cache", "warm cache"):
            ds = torchrecord.RecordDataset(url, batch_size=batch, seed=0, cache_dir=str(cache))
            first, steady = _first_and_steady(ds)
            rows[label] = {"first_batch_s": first, "steady_samples_per_s": steady}
        return rows
    finally:
        server.terminate()
        server.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="workload size (1.0: 50,000 small images)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=Path("bench-data"))
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    workload = WORKLOADS["small-images"]
    data = load_workload(workload, args.scale, args.data_dir)
    samples = ArraySamples(data.features, data.labels)
    root = data.root / "shards"
    root.mkdir(parents=True, exist_ok=True)
    print(f"{workload.describe(len(samples))}, batch {data.batch_size}; {os.cpu_count()} CPUs", flush=True)

    writes = [bench_writers(samples, root, n) for n in WRITERS]
    one = writes[0]
    print(f"\n{'writers':>7} {'samples/s':>12} {'speed-up':>9} {'one writer alone':>17} {'projected':>10}")
    for w in writes:
        w["speedup"] = w["samples_per_s"] / one["samples_per_s"]
        w["projected_speedup"] = w["projected_samples_per_s"] / one["projected_samples_per_s"]
        print(
            f"{w['writers']:>7} {w['samples_per_s']:>12,.0f} {w['speedup']:>8.2f}x "
            f"{w['per_writer_samples_per_s']:>17,.0f} {w['projected_speedup']:>9.2f}x"
        )

    single, sharded = root / "one.tr", root / "four"
    shutil.rmtree(sharded, ignore_errors=True)
    torchrecord.write_record(samples, single, seed=0, overwrite=True, progress=False)
    for i in range(4):
        torchrecord.write_shard(samples, sharded, shard=i, num_shards=4, seed=0, progress=False)
    read_one, read_four = _epochs(
        [torchrecord.RecordDataset(p, batch_size=data.batch_size) for p in (single, sharded)], args.epochs
    )
    ratio = read_four / read_one
    verdict = "within 5%" if abs(1 - ratio) <= 0.05 else "not within 5%"
    print(f"\nread, one file: {read_one:,.0f} samples/s; 4 shards: {read_four:,.0f} samples/s", end="")
    print(f" ({ratio:.3f}x, {verdict})")

    remote = bench_remote(sharded, data.batch_size, root / "cache")
    print()
    for label, r in remote.items():
        print(
            f"http, {label}: first batch {r['first_batch_s'] * 1000:,.0f} ms, "
            f"then {r['steady_samples_per_s']:,.0f} samples/s"
        )
    if args.out is not None:
        report = {
            "workload": workload.describe(len(samples)),
            "machine": describe_machine(),
            "write": writes,
            "read": {"one_file": read_one, "four_shards": read_four, "ratio": ratio},
            "remote": remote,
        }
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
