"""Time to the first batch after resuming mid-epoch: ``python -m benchmarks.resume``.

For each workload, one record set is read with torchdata's StatefulDataLoader
(batch mode, ``RecordDataset(batch_size=B)``). A state is saved at 0%, 50% and
99% of an epoch; then, timed, a new loader is built, the state loaded, and the
first batch taken. Three ways side by side:

* fresh: a new loader at the start of the epoch (the reference);
* torchrecord: ``RecordDataset.load_state_dict`` (starts at the saved window);
* replay: the same dataset hidden behind a plain IterableDataset with no state,
  which StatefulDataLoader resumes by replaying (re-reading and re-decoding)
  every batch before the saved position.

Median of ``--repeats`` runs; one torch thread in the measuring process.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

import torchrecord
from benchmarks.workloads import WORKLOADS, ArraySamples, load_workload

POSITIONS = (0.0, 0.5, 0.99)


class _NoState(IterableDataset[Any]):
    """A RecordDataset without state_dict: StatefulDataLoader can only replay it."""

    def __init__(self, ds: torchrecord.RecordDataset) -> None:
        self.ds = ds

    def __iter__(self) -> Iterator[Any]:
        return iter(self.ds)


def _record_set(name: str, scale: float, data_dir: Path) -> tuple[Path, int]:
    data = load_workload(WORKLOADS[name], scale, data_dir)
    path = data.root / "resume" / "data.tr"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        torchrecord.write_record(ArraySamples(data.features, data.labels), path, progress=False)
    return path, data.batch_size


def _loader(dataset: Any, workers: int) -> StatefulDataLoader:
    ctx = "fork" if workers else None
    return StatefulDataLoader(dataset, batch_size=None, num_workers=workers, multiprocessing_context=ctx)


def _state_at(make: Any, fraction: float, batches: int, workers: int) -> dict[str, Any]:
    loader = _loader(make(), workers)
    stop = int(fraction * batches)
    state = loader.state_dict()
    for i, _ in enumerate(loader, 1):
        if i > stop:
            break
        state = loader.state_dict()
    return state


def _first_batch(make: Any, state: dict[str, Any] | None, workers: int) -> float:
    start = time.perf_counter()
    loader = _loader(make(), workers)
    if state is not None:
        loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["small-images", "tiny-vectors"], choices=sorted(WORKLOADS))
    parser.add_argument("--workers", nargs="+", type=int, default=[0, 2])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=Path("bench-data"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for name in args.workloads:
        path, batch = _record_set(name, args.scale, args.data_dir)

        def make_tr(path: Path = path, batch: int = batch) -> torchrecord.RecordDataset:
            return torchrecord.RecordDataset(path, batch_size=batch, seed=0)

        def make_replay(path: Path = path, batch: int = batch) -> _NoState:
            return _NoState(torchrecord.RecordDataset(path, batch_size=batch, seed=0))

        batches = len(make_tr())
        for workers in args.workers:
            fresh = statistics.median(_first_batch(make_tr, None, workers) for _ in range(args.repeats))
            rows.append((name, workers, "fresh start", "-", fresh, 1.0))
            for fraction in POSITIONS:
                for label, make in (("torchrecord resume", make_tr), ("StatefulDataLoader replay", make_replay)):
                    state = _state_at(make, fraction, batches, workers)
                    t = statistics.median(_first_batch(make, state, workers) for _ in range(args.repeats))
                    rows.append((name, workers, label, f"{fraction:.0%}", t, t / fresh))
                    print(f"  {name} w={workers} {label} at {fraction:.0%}: {t * 1000:.1f} ms", flush=True)
    print()
    print(f"{'workload':<13} {'workers':>7}  {'loader':<26} {'at':>4} {'first batch':>12} {'x fresh':>8}")
    for name, workers, label, at, t, ratio in rows:
        print(f"{name:<13} {workers:>7}  {label:<26} {at:>4} {t * 1000:>9.1f} ms {ratio:>8.2f}")
    print(f"median of {args.repeats}; time = build the loader, load the state, take the first batch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
