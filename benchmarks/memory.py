"""In-memory batches against their baselines: ``python -m benchmarks.memory``.

Three comparisons, each timed in ``--rounds`` interleaved epochs (median), with
one torch thread unless ``--threads`` says otherwise:

1. samples: on the project's three workloads and on 500,000 x float32[256]
   (batch 64, the issue's measurement): a bare ``randperm`` + ``index_select``
   loop, :class:`torchrecord.BatchIter`, and ``DataLoader(TensorDataset)``
   (shuffle, no workers). Targets: BatchIter within 2x of the bare loop, and at
   least 8x faster than the DataLoader.
2. groups: the 500,000-sample workload in groups of about 8 samples (group ids
   drawn as in the post), 64 groups per batch: a bare vectorised loop (group
   ``randperm``, ``repeat_interleave``, ``index_select``), :class:`torchrecord.GroupBatchIter`,
   and the post's algorithm (``benchmarks/post_groups.py``). Each includes its
   shuffle. Target: GroupBatchIter within 2x of the bare loop. The samples column
   shows what the post's iterator loses.
3. load: :func:`torchrecord.load` of each project workload's record set against
   batch-mode ``RecordDataset`` read in a ``DataLoader(batch_size=None,
   num_workers=0)``, both from a warm page cache. Target: load at least 0.8x the
   RecordDataset's samples/s.

Quick check: ``python -m benchmarks.memory --scale 0.01``. Full run: no arguments.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

import torchrecord
from benchmarks import report
from benchmarks.loaders import Epochs, ensure_built, read_through
from benchmarks.loaders.torchrecord_loader import TorchRecordLoader
from benchmarks.machine import describe_machine, versions
from benchmarks.post_groups import PostGroupBatchIter
from benchmarks.timing import Measurement, run_rounds
from benchmarks.workloads import WORKLOADS, Workload, WorkloadData, load_workload
from torchrecord._memory.load import host_empty

__all__ = ["WIDE", "Target", "main", "parse_args"]

#: The issue's (and the post's) in-memory workload: 500,000 x float32[256] + label, batch 64.
WIDE = Workload("wide-vectors", 500_000, (256,), "float32", 64)
#: Groups: about this many samples each, this many per batch.
GROUP_SIZE = 8
GROUPS_PER_BATCH = 64

BARE, BATCH_ITER, DATALOADER = "bare randperm+index_select", "BatchIter", "DataLoader(TensorDataset)"
BARE_GROUPS, GROUP_ITER, POST = "bare group loop", "GroupBatchIter", "post's GroupBatchIter"
LOAD, RECORD_DATASET, FRESH = "load()", "RecordDataset batch mode", "fresh memory (empty + fill)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see ``--help``)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=float, default=1.0, help="multiply every workload's size (0.01: quick check)")
    p.add_argument("--rounds", type=int, default=3, help="timed epochs per configuration (median; >= 3)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--data-dir", type=Path, default=Path("bench-data"), help="cache of generated data and sets")
    p.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    args = p.parse_args(argv)
    if args.rounds < 3:
        p.error("--rounds must be at least 3 (figures are medians)")
    return args


def _log(message: str) -> None:
    print(message, flush=True)


# -- the configurations --------------------------------------------------------------------------


class _Bare(Epochs):
    """``randperm`` + ``split`` + one ``index_select`` per tensor: the floor for shuffled batches."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> None:
        self.x, self.y, self.batch_size = x, y, batch_size

    def epoch(self, index: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        perm = torch.randperm(len(self.y), generator=torch.Generator().manual_seed(index))
        for idx in perm.split(self.batch_size):
            yield self.x.index_select(0, idx), self.y.index_select(0, idx)


class _Iterable(Epochs):
    """An iterator object with ``set_epoch`` (BatchIter, GroupBatchIter)."""

    def __init__(self, iterator: Any, grouped: bool = False) -> None:
        self.iterator, self.grouped = iterator, grouped

    def epoch(self, index: int) -> Iterable[Any]:
        self.iterator.set_epoch(index)
        return self.iterator  # type: ignore[no-any-return]

    def samples_in(self, batch: Any) -> int:
        return len(batch[0][1]) if self.grouped else len(batch[1])


class _Loader(Epochs):
    """``DataLoader(TensorDataset(x, y), batch_size, shuffle=True)`` in the main process."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> None:
        self.loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)

    def epoch(self, index: int) -> Iterable[Any]:
        torch.manual_seed(index)
        return self.loader


class _BareGroups(Epochs):
    """Group ``randperm``, rows by ``repeat_interleave``, every 64th group boundary, ``index_select``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, offsets: torch.Tensor, per_batch: int) -> None:
        self.x, self.y, self.offsets, self.per_batch = x, y, offsets, per_batch

    def epoch(self, index: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        offsets = self.offsets
        perm = torch.randperm(len(offsets) - 1, generator=torch.Generator().manual_seed(index))
        lengths = (offsets[1:] - offsets[:-1])[perm]
        visited = torch.nn.functional.pad(lengths.cumsum(0), (1, 0))
        order = torch.repeat_interleave(offsets[:-1][perm] - visited[:-1], lengths)
        order += torch.arange(len(order))
        bounds = visited[:: self.per_batch].tolist()
        if bounds[-1] != len(order):
            bounds.append(len(order))
        for idx in order.split(np.diff(bounds).tolist()):
            yield self.x.index_select(0, idx), self.y.index_select(0, idx)


class _Post(Epochs):
    """The post's GroupBatchIter, built per epoch (its shuffle runs in ``__init__``)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, group_id: torch.Tensor, per_batch: int) -> None:
        self.x, self.y, self.group_id, self.per_batch = x, y, group_id, per_batch

    def epoch(self, index: int) -> Iterable[Any]:
        return PostGroupBatchIter(self.group_id, self.x, self.y, batch_size=self.per_batch, shuffle_seed=index)

    def samples_in(self, batch: Any) -> int:
        return len(batch[0])


class _Load(Epochs):
    """``torchrecord.load(path)``: one 'batch' that is the whole set."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def epoch(self, index: int) -> Iterable[Any]:
        return [torchrecord.load(self.path)]


class _FreshMemory(Epochs):
    """The floor of anything that returns new [N, ...] tensors: allocate them and write every byte once.

    A RecordDataset epoch recycles its batch buffers; ``load()`` cannot: its result
    is new memory the size of the set, and the first write to each page costs a
    fault and a zeroed page (on this VM also the host backing it on first touch).
    Allocated as ``load()`` allocates (``torchrecord._memory.load.host_empty``: NumPy's
    allocator, transparent huge pages), the cheapest fresh memory found here.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.shapes = [(tuple(x.shape), x.dtype), (tuple(y.shape), y.dtype)]

    def epoch(self, index: int) -> Iterable[Any]:
        return [tuple(host_empty(shape, dtype).fill_(1) for shape, dtype in self.shapes)]


class _RecordDataset(Epochs):
    """Batch-mode RecordDataset in a DataLoader without workers (the README's best configuration)."""

    def __init__(self, path: Path, batch_size: int) -> None:
        self.dataset = torchrecord.RecordDataset(path, batch_size=batch_size, shuffle_buffer=2048, seed=0)
        self.loader = DataLoader(self.dataset, batch_size=None, num_workers=0)

    def epoch(self, index: int) -> Iterable[Any]:
        self.dataset.set_epoch(index)
        return self.loader


# -- the sections ------------------------------------------------------------------------------------


def _measurement(data: WorkloadData, loader: str) -> Measurement:
    return Measurement(data.name, loader, None, data.batch_size, data.count, False)


def _tensors(data: WorkloadData) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(data.features), torch.from_numpy(data.labels)


def _samples_section(data: WorkloadData, rounds: int) -> list[Measurement]:
    x, y = _tensors(data)
    configs: list[tuple[Measurement, Epochs]] = [
        (_measurement(data, BARE), _Bare(x, y, data.batch_size)),
        (_measurement(data, BATCH_ITER), _Iterable(torchrecord.BatchIter((x, y), batch_size=data.batch_size))),
        (_measurement(data, DATALOADER), _Loader(x, y, data.batch_size)),
    ]
    run_rounds(configs, rounds, _log)
    return [m for m, _ in configs]


def group_ids(count: int, group_size: int, seed: int = 0) -> torch.Tensor:
    """Sorted group ids as the post draws them: ``count`` draws from ``count // group_size`` ids."""
    groups = max(1, count // group_size)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.multinomial(torch.ones(groups) / groups, count, replacement=True, generator=generator)
    return ids.sort().values


def _groups_section(data: WorkloadData, rounds: int) -> tuple[list[Measurement], int]:
    x, y = _tensors(data)
    ids = group_ids(data.count, GROUP_SIZE)
    _, counts = ids.unique_consecutive(return_counts=True)
    offsets = torch.nn.functional.pad(counts.cumsum(0), (1, 0))
    per_batch = GROUPS_PER_BATCH
    grouped = torchrecord.GroupBatchIter((x, y), offsets, groups_per_batch=per_batch)
    configs: list[tuple[Measurement, Epochs]] = [
        (_measurement(data, BARE_GROUPS), _BareGroups(x, y, offsets, per_batch)),
        (_measurement(data, GROUP_ITER), _Iterable(grouped, grouped=True)),
        (_measurement(data, POST), _Post(x, y, ids, per_batch)),
    ]
    run_rounds(configs, rounds, _log)
    return [m for m, _ in configs], len(counts)


def _load_section(data: WorkloadData, rounds: int) -> list[Measurement]:
    directory, _ = ensure_built(TorchRecordLoader("torchrecord-batch", batch_mode=True), data)
    assert directory is not None
    path = directory / "data.tr"
    read_through(path)
    configs: list[tuple[Measurement, Epochs]] = [
        (_measurement(data, RECORD_DATASET), _RecordDataset(path, data.batch_size)),
        (_measurement(data, LOAD), _Load(path)),
        (_measurement(data, FRESH), _FreshMemory(*_tensors(data))),
    ]
    run_rounds(configs, rounds, _log)
    return [m for m, _ in configs]


# -- targets and tables --------------------------------------------------------------------------------


@dataclass
class Target:
    """One target of the issue: ``ratio`` compared with ``bound`` (``at_most`` or at least)."""

    workload: str
    what: str
    ratio: float
    bound: float
    at_most: bool

    @property
    def met(self) -> bool:
        return self.ratio <= self.bound if self.at_most else self.ratio >= self.bound

    def row(self) -> list[str]:
        sign = "<=" if self.at_most else ">="
        verdict = "met" if self.met else "MISSED"
        return [self.workload, self.what, f"{self.ratio:.2f}", f"{sign} {self.bound:g}", verdict]


def _seconds(ms: list[Measurement], loader: str) -> float:
    return next(m.median_seconds for m in ms if m.loader == loader)


def _rate(ms: list[Measurement], loader: str) -> float:
    return next(m.samples_per_second for m in ms if m.loader == loader)


def _targets(workload: str, ms: list[Measurement]) -> list[Target]:
    names = {m.loader for m in ms}
    if BATCH_ITER in names:
        batch_iter = _seconds(ms, BATCH_ITER)
        return [
            Target(workload, "BatchIter s / bare s", batch_iter / _seconds(ms, BARE), 2.0, True),
            Target(workload, "DataLoader s / BatchIter s", _seconds(ms, DATALOADER) / batch_iter, 8.0, False),
        ]
    if GROUP_ITER in names:
        ratio = _seconds(ms, GROUP_ITER) / _seconds(ms, BARE_GROUPS)
        return [Target(workload, "GroupBatchIter s / bare group loop s", ratio, 2.0, True)]
    ratio = _rate(ms, LOAD) / _rate(ms, RECORD_DATASET)
    return [Target(workload, "load() samples/s / RecordDataset samples/s", ratio, 0.8, False)]


def _rows(ms: list[Measurement], reference: str) -> list[list[str]]:
    base = _seconds(ms, reference)
    return [
        [
            m.workload,
            m.loader,
            f"{m.median_seconds:.4f}",
            f"{m.samples_per_second:,.0f}",
            f"{m.samples[0]:,} of {m.expected:,}",
            f"{m.median_seconds / base:.2f}",
        ]
        for m in ms
    ]


HEADERS = ["workload", "iterator", "median s/epoch", "samples/s", "samples", "x time of first"]


def _json(m: Measurement) -> dict[str, Any]:
    return {
        "workload": m.workload,
        "loader": m.loader,
        "batch_size": m.batch_size,
        "expected": m.expected,
        "epoch_seconds": m.seconds,
        "epoch_samples": m.samples,
        "median_epoch_seconds": m.median_seconds,
        "samples_per_second": m.samples_per_second,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the three sections and print their tables and the targets; returns the exit status."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    _log("Machine:  " + ", ".join(f"{k}={v}" for k, v in describe_machine().items()))
    _log("Versions: " + ", ".join(f"{k}={v}" for k, v in versions().items()))
    sections: dict[str, list[Measurement]] = {"samples": [], "groups": [], "load": []}
    targets: list[Target] = []
    tables: list[str] = []
    for workload in [*WORKLOADS.values(), WIDE]:
        data = load_workload(workload, args.scale, args.data_dir)
        _log(f"\n== samples: {workload.describe(data.count)}, batch {data.batch_size}")
        ms = _samples_section(data, args.rounds)
        sections["samples"] += ms
        targets += _targets(data.name, ms)
        tables.append(report.format_table(HEADERS, _rows(ms, BARE)))
    wide = load_workload(WIDE, args.scale, args.data_dir)
    _log(f"\n== groups: {WIDE.describe(wide.count)}, groups of about {GROUP_SIZE}, {GROUPS_PER_BATCH} a batch")
    ms, groups = _groups_section(wide, args.rounds)
    _log(f"  {groups:,} groups")
    sections["groups"] = ms
    targets += _targets(wide.name, ms)
    tables.append(report.format_table(HEADERS, _rows(ms, BARE_GROUPS)))
    for workload in WORKLOADS.values():
        data = load_workload(workload, args.scale, args.data_dir)
        _log(f"\n== load: {workload.describe(data.count)}, RecordDataset batch {data.batch_size}")
        ms = _load_section(data, args.rounds)
        sections["load"] += ms
        targets += _targets(data.name, ms)
        tables.append(report.format_table(HEADERS, _rows(ms, RECORD_DATASET)))
    _log(f"\n== Results (median of {args.rounds} epochs, {args.threads} torch thread(s), scale {args.scale:g})")
    for table in tables:
        _log("\n" + table)
    _log("\n== Targets")
    _log(report.format_table(["workload", "ratio", "value", "target", ""], [t.row() for t in targets]))
    if args.json is not None:
        payload = {
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python -m benchmarks.memory", *(argv if argv is not None else sys.argv[1:])]),
            "machine": describe_machine(),
            "versions": versions(),
            "config": {"scale": args.scale, "rounds": args.rounds, "threads": args.threads, "groups": groups},
            "sections": {name: [_json(m) for m in ms] for name, ms in sections.items()},
            "targets": [{**vars(t), "met": t.met} for t in targets],
        }
        report.write_json(args.json, payload)
        _log(f"\nwrote {args.json}")
    _log(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
