"""Every reader with workers: ``python -m benchmarks.readers``.

Each reader dataset of the reader contract, in batch mode, is read for whole
epochs at 0 workers (the dataset iterated in this process) and through
:class:`torchrecord.RecordLoader` with 2 persistent workers, and the ratio of
the two is printed: the question is whether the one loader makes every reader
gain from workers, not how fast the readers are against each other.

* ``RecordDataset``: the ``small-images`` workload of ``benchmarks.run``
  (uint8[3,32,32] and a label; ``--scale`` of its 50,000 samples), batch 256;
* ``MixedDataset``: the same samples as two record sets (halves), mixed by size;
* ``StreamDataset``: sequences of float32[40] frames (``benchmarks.streams``'s data), batch 256;
* ``WindowDataset``: a robomimic-like file (``benchmarks.robomimic``'s data,
  converted), windows of 10 steps, batch 64.

The epochs alternate between the two ways in one process (0 workers, then the
loader, round after round; the loader's workers persist across its epochs);
medians of ``--epochs`` epochs after one warm-up epoch each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

import torchrecord
from benchmarks.streams import _record_set as stream_set
from benchmarks.workloads import WORKLOADS, load_workload

__all__ = ["main"]


def _count(batch: Any) -> int:
    """The samples in a batch (the length of its first tensor leaf)."""
    while not isinstance(batch, torch.Tensor):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return len(batch)


def _image_sets(data_dir: Path, scale: float) -> tuple[Path, Path, Path]:
    """The small-images samples as one record set and as two halves."""
    data = load_workload(WORKLOADS["small-images"], scale, data_dir)
    root = data.root / "readers"
    whole, first, second = root / "whole.tr", root / "first.tr", root / "second.tr"
    if not second.exists():
        root.mkdir(parents=True, exist_ok=True)
        half = data.count // 2
        for path, lo, hi in ((whole, 0, data.count), (first, 0, half), (second, half, data.count)):
            features, labels = data.features, data.labels
            samples = ({"image": torch.from_numpy(features[i]), "label": int(labels[i])} for i in range(lo, hi))
            torchrecord.write_record(samples, path, progress=False, overwrite=True)
    return whole, first, second


def _window_set(data_dir: Path, demos: int) -> Path:
    from benchmarks.robomimic import build_data

    return Path(build_data(data_dir, demos)["files"]["tr"])


def _readers(data_dir: Path, scale: float, demos: int) -> dict[str, Callable[[], Any]]:
    from benchmarks.robomimic import DATASET_KEYS, OBS_KEYS

    whole, first, second = _image_sets(data_dir, scale)
    streams = stream_set(data_dir, max(50, int(400 * scale)))
    windows = _window_set(data_dir, demos)
    return {
        "RecordDataset": lambda: torchrecord.RecordDataset(whole, batch_size=256),
        "MixedDataset": lambda: torchrecord.MixedDataset([first, second], batch_size=256),
        "StreamDataset": lambda: torchrecord.StreamDataset(streams, batch_size=256),
        "WindowDataset": lambda: torchrecord.WindowDataset(
            windows, obs_keys=OBS_KEYS, dataset_keys=DATASET_KEYS, seq_length=10, batch_size=64
        ),
    }


def _epoch(batches: Iterable[Any]) -> tuple[float, int]:
    start = time.perf_counter()
    samples = sum(_count(batch) for batch in batches)
    return time.perf_counter() - start, samples


def _measure(make: Callable[[], Any], epochs: int, workers: int) -> dict[str, float]:
    """Median samples/s at 0 workers and through RecordLoader with ``workers`` persistent workers."""
    plain, loaded = make(), make()
    loader = torchrecord.RecordLoader(loaded, num_workers=workers, persistent_workers=True)
    rates: dict[str, list[float]] = {"0 workers": [], f"RecordLoader, {workers} workers": []}
    for epoch in range(epochs + 1):  # epoch 0 warms the page cache and starts the workers
        plain.set_epoch(epoch)
        loader.set_epoch(epoch)
        for label, batches in (("0 workers", plain), (f"RecordLoader, {workers} workers", loader)):
            seconds, samples = _epoch(batches)
            if epoch:
                rates[label].append(samples / seconds)
    return {label: statistics.median(values) for label, values in rates.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=0.4, help="of the small-images workload (default 0.4)")
    parser.add_argument("--demos", type=int, default=40, help="robomimic demos of the WindowDataset file")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per way (median; >= 3)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, default=Path("bench-data"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    readers = _readers(args.data_dir, args.scale, args.demos)
    print(f"python -m benchmarks.readers: {os.cpu_count()} CPUs, {args.epochs} epochs each, medians (samples/s)")
    print(f"| reader | 0 workers | RecordLoader, {args.workers} workers | ratio |")
    print("|---|---:|---:|---:|")
    for name, make in readers.items():
        rates = _measure(make, args.epochs, args.workers)
        zero, loaded = rates.values()
        print(f"| {name} | {zero:,.0f} | {loaded:,.0f} | {loaded / zero:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
