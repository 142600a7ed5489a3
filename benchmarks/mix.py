"""Weighted mixing of 32 record sets with slow sources: ``python -m benchmarks.mix``.

32 sets of 4,000 x (uint8[3,32,32], int) (``--scale`` multiplies the count and
the batches), mixed by size, batch 128, 2,000 batches after the first. Every
loader reads the same sets through the same source wrapper
(``torchrecord._mix.source.FileSource`` with delays), in the main process:

* ``exact``: :class:`torchrecord.MixedDataset`, ``policy="exact"``;
* ``ready``: the same with ``policy="ready"``;
* ``torchdata``: ``torchdata.nodes.MultiNodeWeightedSampler`` over one node per
  set (each reads blocks of 16 samples in stored order), ``Batcher(128)`` and a
  stacking collate: i.i.d. draws, each waiting on the chosen source.

Profiles: ``all-fast`` (no delays: the reference), ``slow-first`` (the first
read of 4 sources takes 300 ms), ``periodic-stall`` (one source stalls 100 ms
on every 20th read of a block of 16 samples: once per 320 samples it reads, so
the stalls do not depend on how a loader cuts its reads), ``slow-source`` (one
source delivers at a fifth of its share of the all-fast ``ready`` rate). Each (profile, loader) runs
``--repeats`` times, each run in a fresh process (its peak RSS is the memory
figure), interleaved round by round; the table shows medians. Per batch the
wait is the time ``next()`` took; ``open`` is the time to build the dataset
(every source's metadata read), ``first`` the time from creating the iterator
to the first batch (for torchdata too: its sampler is built in ``open``, with
every source's metadata read, as ``MixedDataset`` reads it); batches/s counts
the batches after the first.

Quick check: ``python -m benchmarks.mix --scale 0.01 --repeats 1``. Full run:
no arguments (the targets: slow-first ready's first batch within 50 ms;
periodic-stall ready's p99 within 2x of all-fast ready's and at least 90% of its
batches/s; slow-source reported as it is).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import torchrecord
from benchmarks.report import format_table
from torchrecord._mix.source import Chunk, FileSource

__all__ = ["PROFILES", "Throttled", "main", "parse_args"]

SETS, PER_SET, BATCH, BATCHES, BLOCK = 32, 4000, 128, 2000, 16
PROFILES = ("all-fast", "slow-first", "periodic-stall", "slow-source")
LOADERS = ("exact", "ready", "torchdata")


class Throttled(FileSource):
    """A record set with delays: a slow first read, a stall every ``stall_every`` samples, or a rate (samples/s)."""

    def __init__(
        self, path: str, *, first: float = 0.0, stall_every: int = 0, stall: float = 0.0, rate: float | None = None
    ) -> None:
        super().__init__(path)
        self.first, self.stall_every, self.stall, self.rate = first, stall_every, stall, rate
        self.reads = 0
        self.samples = 0
        self._free_at = 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "delays": (self.first, self.stall_every, self.stall, self.rate)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        first, every, stall, rate = state["delays"]
        self.__init__(state["file"], first=first, stall_every=every, stall=stall, rate=rate)  # type: ignore[misc]

    def read(self, runs: Sequence[tuple[int, int]], columns: bool) -> Chunk:
        self.reads += 1
        if self.reads == 1 and self.first:
            time.sleep(self.first)
        n = sum(b - a for a, b in runs)
        if self.stall_every:  # one stall per stall_every samples read, however the reads are cut
            crossed = (self.samples + n) // self.stall_every - self.samples // self.stall_every
            time.sleep(self.stall * crossed)
        self.samples += n
        chunk = super().read(runs, columns)
        if self.rate:
            now = time.perf_counter()
            self._free_at = max(self._free_at, now) + chunk.n / self.rate
            time.sleep(max(0.0, self._free_at - now))
        return chunk


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see ``--help``)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.mix", description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=float, default=1.0, help="multiply samples per set and batches (0.01: quick)")
    p.add_argument("--repeats", type=int, default=3, help="runs per configuration (median)")
    p.add_argument("--data-dir", type=Path, default=Path("bench-data"), help="cache of generated record sets")
    p.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    p.add_argument("--plot", type=Path, default=Path("results/mix.png"), help="latency plot (needs matplotlib)")
    p.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated subset of " + ", ".join(PROFILES))
    p.add_argument("--loaders", default=",".join(LOADERS), help="comma-separated subset of " + ", ".join(LOADERS))
    return p.parse_args(argv)


def _sets(data_dir: Path, per_set: int) -> list[str]:
    root = data_dir / f"mix-{SETS}x{per_set}"
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(SETS):
        path = root / f"set{s:02d}.tr"
        if not path.exists():
            rng = np.random.default_rng(s)
            images = rng.integers(0, 256, size=(per_set, 3, 32, 32), dtype=np.uint8)
            samples = ((torch.from_numpy(images[i]), s * 1_000_000 + i) for i in range(per_set))
            torchrecord.write_record(samples, path, seed=s, progress=False)
        paths.append(str(path))
    return paths


def _sources(paths: list[str], profile: str, slow_rate: float | None) -> list[Throttled]:
    out = [Throttled(p) for p in paths]
    if profile == "slow-first":
        for s in (3, 11, 19, 27):
            out[s] = Throttled(paths[s], first=0.3)
    elif profile == "periodic-stall":
        out[5] = Throttled(paths[5], stall_every=20 * BLOCK, stall=0.1)
    elif profile == "slow-source":
        out[5] = Throttled(paths[5], rate=slow_rate)
    return out


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _torchdata_batches(sources: list[Throttled], seed: int) -> Iterator[Batch]:
    """torchdata's weighted sampler over the sets, built now (its setup counts in ``open``, as for MixedDataset)."""
    from torchdata.nodes import Batcher, IterableWrapper, MultiNodeWeightedSampler

    counts = [src.describe().count for src in sources]

    def stream(s: int) -> Iterator[tuple[np.ndarray, int, int]]:
        src = sources[s]
        n = counts[s]
        pos = 0
        while True:  # a node reads blocks of 16 in stored order, round and round
            lo = pos % n
            chunk = src.read([(lo, min(n, lo + BLOCK))], True)
            assert chunk.columns is not None
            images, labels = chunk.columns
            for i in range(chunk.n):
                yield images[i], int(labels[i]), s
            pos += chunk.n

    nodes = {str(s): IterableWrapper(stream(s)) for s in range(len(sources))}
    weights = {str(s): float(c) for s, c in enumerate(counts)}
    sampler = MultiNodeWeightedSampler(nodes, weights, stop_criteria="CYCLE_FOREVER", seed=seed)
    batcher = Batcher(sampler, batch_size=BATCH)

    def batches() -> Iterator[Batch]:
        for batch in batcher:
            images = torch.from_numpy(np.stack([b[0] for b in batch]))
            yield images, torch.tensor([b[1] for b in batch]), torch.tensor([b[2] for b in batch])

    return batches()


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _one_run(args: tuple[list[str], str, str, float | None, int, int]) -> dict[str, Any]:
    """One (profile, loader) run in a fresh process: per-batch waits, shares, memory."""
    paths, profile, loader, slow_rate, batches, repeat = args
    torch.set_num_threads(1)
    if loader == "torchdata":
        import torchdata.nodes  # noqa: F401  (imported before the clock starts, as torchrecord is)
    sources = _sources(paths, profile, slow_rate)
    before = _rss_mib()
    epoch_size = (batches + 1) * BATCH
    opened = time.perf_counter()
    if loader != "torchdata":  # reads every source's metadata (schema check, sizes for the plan)
        ds = torchrecord.MixedDataset(
            sources,
            epoch_size=epoch_size,
            batch_size=BATCH,
            draw_size=BLOCK,
            policy=loader,
            seed=repeat,
            tag_source=True,
        )
    else:  # the same: every source's metadata, then the sampler's nodes
        sampled = _torchdata_batches(sources, repeat)
    start = time.perf_counter()
    it: Iterator[Any] = sampled if loader == "torchdata" else iter(ds)
    waits = []
    counts = np.zeros(len(paths), np.int64)
    first = None
    last = start
    for _ in range(batches + 1):
        batch = next(it)
        now = time.perf_counter()
        if first is None:
            first = now - start
        else:
            waits.append(now - last)
            tags = batch[-1]
            counts += np.bincount(tags.numpy(), minlength=len(paths))
        last = now
    seconds = sum(waits)
    stats = ds.stats() if loader != "torchdata" else {}
    close = getattr(it, "close", None)
    if close is not None:
        close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    w = np.array(waits)
    return {
        "profile": profile,
        "loader": loader,
        "repeat": repeat,
        "open": start - opened,
        "first": first,
        "p50": float(np.percentile(w, 50)),
        "p90": float(np.percentile(w, 90)),
        "p99": float(np.percentile(w, 99)),
        "max": float(w.max()),
        "batches_per_s": batches / seconds,
        "shares": (counts / counts.sum()).tolist(),
        "peak_mib": peak,
        "added_mib": peak - before,
        "waits": waits,
        "mixer_waits": stats.get("waits"),
        "deferrals": stats.get("deferrals"),
    }


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def _plot(results: dict[tuple[str, str], list[dict[str, Any]]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    profiles = sorted({p for p, _ in results}, key=PROFILES.index)
    fig, axes = plt.subplots(1, len(profiles), figsize=(4.5 * len(profiles), 3.6), sharey=True, squeeze=False)
    for ax, profile in zip(axes[0], profiles):
        for (p, loader), runs in results.items():
            if p != profile:
                continue
            w = np.sort(np.array(runs[0]["waits"])) * 1000
            ax.plot(w, 1 - np.arange(len(w)) / len(w), label=loader)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(profile)
        ax.set_xlabel("wait per batch (ms)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("fraction of batches waiting longer")
    axes[0][-1].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    per_set = max(BATCH // SETS + 1, int(PER_SET * args.scale))
    batches = max(10, int(BATCHES * args.scale))
    profiles = [p for p in args.profiles.split(",") if p]
    loaders = [x for x in args.loaders.split(",") if x]
    paths = _sets(args.data_dir, per_set)
    print(
        f"{SETS} sets x {per_set:,} samples of uint8[3,32,32] + int, batch {BATCH}, {batches:,} batches after "
        f"the first, {args.repeats} run(s) each",
        flush=True,
    )
    ctx = mp.get_context("spawn")
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    slow_rate: float | None = None
    order = ["all-fast", *(p for p in profiles if p != "all-fast")]
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        for profile in order:
            if profile == "slow-source":
                reference = results.get(("all-fast", "ready")) or results.get(("all-fast", loaders[0]))
                assert reference, "the slow-source profile needs the all-fast reference"
                speed = _median(reference, "batches_per_s") * BATCH
                slow_rate = speed / SETS / 5  # a fifth of one source's share of the all-fast rate
            for repeat in range(args.repeats):
                for loader in loaders:
                    run = pool.apply(_one_run, ((paths, profile, loader, slow_rate, batches, repeat),))
                    results.setdefault((profile, loader), []).append(run)
                    print(
                        f"  {profile:<15} {loader:<10} run {repeat + 1}: first {run['first'] * 1000:8.1f} ms  "
                        f"p99 {run['p99'] * 1000:8.2f} ms  {run['batches_per_s']:8.1f} batches/s",
                        flush=True,
                    )
    rows = []
    for (profile, loader), runs in results.items():
        if profile not in profiles:
            continue
        base = results.get(("all-fast", loader))
        shares = np.array(runs[-1]["shares"])
        ms = [
            f"{_median(runs, k) * 1000:.{2 if k in ('p50', 'p90', 'p99') else 1}f}"
            for k in ("open", "first", "p50", "p90", "p99", "max")
        ]
        speed = _median(runs, "batches_per_s")
        rows.append(
            [
                profile,
                loader,
                *ms,
                f"{speed:.1f}",
                f"{speed / _median(base, 'batches_per_s'):.2f}" if base else "-",
                f"{shares.min():.4f}-{shares.max():.4f}",
                f"{shares[5]:.4f}",
                f"{_median(runs, 'peak_mib'):.0f}",
            ]
        )
    headers = [
        "profile",
        "loader",
        "open ms",
        "first ms",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "batches/s",
        "x all-fast",
        "shares min-max",
        "share s5",
        "peak MiB",
    ]
    print()
    print(f"planned share per source {1 / SETS:.4f}")
    print(format_table(headers, rows))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {
            f"{p}/{x}": [{k: v for k, v in r.items() if k != "waits"} for r in runs] for (p, x), runs in results.items()
        }
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "runs": out}, indent=1))
    if _plot(results, args.plot):
        print(f"latency plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
