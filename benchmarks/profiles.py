"""Where the time goes in the two fast-path figures that miss issue 17's targets.

``python -m benchmarks.profiles`` (one torch thread, warm page cache, interleaved
rounds, medians; the first round is a warm-up and is not counted):

* ``large-read``: one shuffled batch-mode epoch of ``RecordDataset`` over the
  large-image set of ``benchmarks.run`` (8,000 x uint8[3,224,224] + label, one
  sample per record, batch 64, shuffle buffer 2,048), split into its parts by
  timing the read layer's functions, beside four hand-written loops over the same
  file: the raw limit (cursor, copy each value into one reused batch), the raw
  limit with a new array per batch, the bare cursor walk, and the simplest
  shuffling reader there is (hold a window of zero-copy values, copy them in a
  random order into a new array per batch).
* ``tiny-write``: ``write_record`` of 500,000 x float32[16] + label (automatic
  packing, pre-shuffled) from a ``TensorDataset`` and from a per-sample source
  (``dataset[i]`` builds each sample, as ``benchmarks.run``'s), split into their
  parts the same way, beside a raw LMDB append of one 72-byte value per sample.

The parts are wall time inside the named functions (nested calls counted once,
in the outermost part named); "other" is the rest of the epoch or write.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import torch

import torchrecord
from benchmarks.loaders.torchrecord_loader import record_key, write_records
from benchmarks.workloads import WORKLOADS, ArraySamples, load_workload
from torchrecord._store import fastread as _fastread
from torchrecord._store import walk as _walk
from torchrecord._store.format import encode_keys
from torchrecord._write import fastwrite as _fastwrite
from torchrecord._write import lmdb_writer as _lmdb_writer
from torchrecord._write import packing as _packing
from torchrecord._write import sources as _sources

__all__ = ["main"]


class _Parts:
    """Wall time spent inside chosen functions (outermost timed call only)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._depth = 0
        self._undo: list[Callable[[], None]] = []

    def time(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return original(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start
                self._depth -= 1

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original))

    def restore(self) -> None:
        for undo in reversed(self._undo):
            undo()


def _median_rounds(cases: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(rounds + 1):
        for name, run in cases.items():
            start = time.perf_counter()
            run()
            if r:  # round 0 warms the page cache and the allocator
                times[name].append(time.perf_counter() - start)
    return times


def _large_read(data_dir: Path, rounds: int) -> None:
    workload = WORKLOADS["large-images"]
    data = load_workload(workload, 1.0, data_dir, 0)
    root = data_dir / f"{workload.name}-n{data.count}-seed0" / record_key(1)
    path = root / "data.tr"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        write_records(data, root, 1)
    env, db = torchrecord.RecordFile(path).environment()
    count, batch = data.count, data.batch_size
    with env.begin(db=db) as txn:
        width = len(txn.cursor().iternext(keys=False, values=True).__next__())  # every record: one length

    def raw(fresh: bool) -> None:
        out = np.empty((batch, width), np.uint8)
        with env.begin(db=db, buffers=True) as txn:
            for i, value in enumerate(txn.cursor().iternext(keys=False, values=True)):
                if fresh and i % batch == 0:
                    out = np.empty((batch, width), np.uint8)
                out[i % batch, : len(value)] = np.frombuffer(value, np.uint8)

    def walk_only() -> None:
        with env.begin(db=db, buffers=True) as txn:
            for _ in txn.cursor().iternext(keys=False, values=True):
                pass

    def window_of_views() -> None:
        rng = np.random.default_rng(0)
        with env.begin(db=db, buffers=True) as txn:
            values = list(txn.cursor().iternext(keys=False, values=True))
            for w in range(0, len(values), 2048):
                window = values[w : w + 2048]
                order = rng.permutation(len(window)).tolist()
                for b in range(0, len(order), batch):
                    flat = np.empty((batch, width), np.uint8).data.cast("B")
                    for j, r in enumerate(order[b : b + batch]):
                        value = window[r]
                        flat[j * width : j * width + len(value)] = value

    parts = _Parts()
    parts.time(_fastread.FixedWindow, "gather", "gather: copy each sample from the map into the batch")
    parts.time(_walk.Walk, "records", "walk: cursor, key checks, zero-copy values")
    parts.time(_fastread._WindowBuilder, "finish", "window check against the layout")
    ds = torchrecord.RecordDataset(path, shuffle=True, shuffle_buffer=2048, seed=0, batch_size=batch)
    epochs = iter(range(10**9))
    split: list[dict[str, float]] = []

    def torchrecord_epoch() -> None:
        parts.seconds.clear()
        ds.set_epoch(next(epochs))
        start = time.perf_counter()
        for _ in ds:
            pass
        split.append(dict(parts.seconds, total=time.perf_counter() - start))

    try:
        times = _median_rounds(
            {
                "raw limit (one reused batch buffer)": lambda: raw(False),
                "raw limit, a new array per batch": lambda: raw(True),
                "bare cursor walk, no copy": walk_only,
                "window of views, shuffled copy into new arrays": window_of_views,
                "torchrecord RecordDataset(batch_size=64)": torchrecord_epoch,
            },
            rounds,
        )
    finally:
        parts.restore()
    print(f"== large-read: {count:,} x uint8[3,224,224] + label, batch {batch}, median of {rounds} epochs")
    _table(times, count, "samples")
    print("torchrecord's epoch, by part (median):")
    _split_table(split[1:])


def _tiny_write(rounds: int) -> None:
    n = 500_000
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(n, 16, generator=generator)
    labels = torch.randint(0, 10, (n,), generator=generator)
    sources = {
        "TensorDataset": torch.utils.data.TensorDataset(features, labels),
        "per-sample source": ArraySamples(features.numpy(), labels.numpy()),
    }
    values = [bytes(72)] * n  # what a raw append of one 72-byte value per sample stores
    parts = _Parts()
    parts.time(ArraySamples, "__getitem__", "the source: dataset[i] for every i")
    parts.time(_fastwrite.FastEncoder, "columns", "per-sample sources: samples checked and stacked into columns")
    parts.time(_sources, "_rows_of", "TensorDataset: gather its rows in the shuffled order")
    parts.time(_packing._Layouts, "records", "packing: columns into records of K samples")
    parts.time(_lmdb_writer.LmdbAppender, "flush", "LMDB: put the records, commit (before the end)")
    parts.time(_lmdb_writer.LmdbAppender, "finish", "LMDB: put the last records and the metadata, commit, sync")
    splits: dict[str, list[dict[str, float]]] = {name: [] for name in sources}
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(10**9))

        def write(name: str) -> None:
            parts.seconds.clear()
            start = time.perf_counter()
            torchrecord.write_record(sources[name], Path(tmp) / f"w{next(counter)}.tr", progress=False)
            splits[name].append(dict(parts.seconds, total=time.perf_counter() - start))

        def raw_append() -> None:
            env = lmdb.open(str(Path(tmp) / f"raw{next(counter)}"), map_size=1 << 30, subdir=True)
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(zip(encode_keys(0, n), values), append=True)
            env.sync(True)
            env.close()

        try:
            cases: dict[str, Callable[[], Any]] = {"raw LMDB append, 1 value per sample": raw_append}
            cases.update({f"write_record, {name}": functools.partial(write, name) for name in sources})
            times = _median_rounds(cases, rounds)
        finally:
            parts.restore()
    print(f"== tiny-write: {n:,} x float32[16] + label (automatic packing, pre-shuffled), median of {rounds} writes")
    _table(times, n, "samples")
    for name, split in splits.items():
        print(f"write_record, {name}, by part (median):")
        _split_table(split[1:])


def _table(times: dict[str, list[float]], count: int, unit: str) -> None:
    medians = {name: statistics.median(t) for name, t in times.items()}
    reference = next(iter(medians.values()))
    for name, seconds in medians.items():
        print(f"  {name:50s} {seconds * 1000:8.1f} ms {count / seconds:12,.0f} {unit}/s {reference / seconds:6.2f}x")


def _split_table(split: list[dict[str, float]]) -> None:
    total = statistics.median(s["total"] for s in split)
    labels = list(dict.fromkeys(label for s in split for label in s if label != "total"))
    named = 0.0
    for label in labels:
        seconds = statistics.median(s.get(label, 0.0) for s in split)
        named += seconds
        print(f"  {label:60s} {seconds * 1000:8.1f} ms {seconds / total:6.1%}")
    print(f"  {'other':60s} {(total - named) * 1000:8.1f} ms {(total - named) / total:6.1%}")
    print(f"  {'total':60s} {total * 1000:8.1f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sections = ["large-read", "tiny-write"]
    parser.add_argument("--sections", nargs="+", choices=sections, default=sections)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (median), after one warm-up round")
    parser.add_argument("--data-dir", type=Path, default=Path("bench-data"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if "large-read" in args.sections:
        _large_read(args.data_dir, args.rounds)
    if "tiny-write" in args.sections:
        _tiny_write(args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
