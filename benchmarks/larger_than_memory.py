"""A record set larger than memory, read cold: ``python -m benchmarks.larger_than_memory``.

Writes a set of large images (``uint8[3,224,224]`` + an int64 label, about 150 KB a
sample) of about 1.3x the machine's RAM (``MemTotal`` in ``/proc/meminfo``), so the page
cache cannot hold it, then reads it three ways, each in a freshly forked process (nothing
of the set mapped) right after every file of the set is flushed and its pages dropped
(``fdatasync``, ``posix_fadvise(POSIX_FADV_DONTNEED)``, residency checked with ``mincore``):

1. ``disk``: a plain loop of 16 MiB reads over the set's files: the disk's own
   sequential read speed, measured in the same run;
2. ``RecordDataset(batch_size=B)`` in ``DataLoader(batch_size=None)``, 0 workers;
3. ``torchrecord.RecordLoader`` over the same dataset with 2 workers.

It prints GB/s for each (the readers: sample bytes delivered; the disk: file bytes read)
and each reader's ratio to the disk. Free disk is checked before writing; the set is
deleted at the end, also after a failure, Ctrl-C or SIGTERM. Linux only.

    python -m benchmarks.larger_than_memory                 # the full run: on a quiet machine
    python -m benchmarks.larger_than_memory --bytes 200M    # a small trial (fits in memory)
"""

from __future__ import annotations

import argparse
import datetime
import math
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import torchrecord
from benchmarks import cold, report
from benchmarks.machine import describe_machine, load_average, versions

__all__ = ["main", "parse_args", "parse_size"]

SHAPE = (3, 224, 224)
SAMPLE_BYTES = math.prod(SHAPE) + 8  # the image and its int64 label
_READ_BYTES = 16 << 20
_POOL = 64  # distinct images the samples cycle through (writing is not what is timed)
_SUFFIXES = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_size(text: str) -> int:
    """Bytes from ``"200000000"``, ``"200M"``, ``"30G"`` (decimal suffixes K, M, G, T)."""
    plain = text.strip().upper().removesuffix("B")
    scale = _SUFFIXES.get(plain[-1:], 1)
    number = plain[:-1] if scale > 1 else plain
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} (e.g. 200000000, 200M, 30G)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a size must be positive: {text!r}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see ``--help``)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.larger_than_memory", description=__doc__.split("\n")[0])
    p.add_argument("--bytes", type=parse_size, default=None, help="size of the set (default: --factor x RAM)")
    p.add_argument("--factor", type=float, default=1.3, help="the set's size over MemTotal when --bytes is not given")
    p.add_argument("--dir", type=Path, default=Path("bench-data"), help="where the set is written (then deleted)")
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch (default 64)")
    p.add_argument("--workers", type=int, default=2, help="RecordLoader's num_workers (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the images")
    p.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    return p.parse_args(argv)


def memory_bytes() -> int:
    """The machine's RAM: ``MemTotal`` of ``/proc/meminfo``, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemTotal line: pass --bytes")


def disk_needed(count: int) -> int:
    """Free bytes to ask for before writing ``count`` samples: the payload, 10% for records and LMDB, 1 GiB spare."""
    return int(count * SAMPLE_BYTES * 1.1) + (1 << 30)


class Images(Dataset[tuple[torch.Tensor, int]]):
    """``count`` large images cycling through a few random ones, each with an int label."""

    def __init__(self, count: int, seed: int) -> None:
        self.count = count
        self.pool = np.random.default_rng(seed).integers(0, 256, size=(_POOL, *SHAPE), dtype=np.uint8)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self.pool[i % _POOL]), i % 1000


def write_set(path: Path, count: int, seed: int) -> float:
    """Write the set with ``write_record`` (defaults: shuffled, checksums, synced); returns the seconds it took."""
    start = time.perf_counter()
    torchrecord.write_record(Images(count, seed), path, progress=False)
    return time.perf_counter() - start


def read_disk(files: Sequence[Path]) -> tuple[float, int]:
    """Read every file front to back in 16 MiB reads; returns the seconds and the bytes read."""
    view = memoryview(bytearray(_READ_BYTES))
    total = 0
    start = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
    return time.perf_counter() - start, total


def read_set(path: Path, batch_size: int, workers: int) -> tuple[float, int]:
    """One epoch in batch mode, 0 workers (a DataLoader) or ``workers`` (RecordLoader); seconds and samples."""
    dataset = torchrecord.RecordDataset(path, batch_size=batch_size)
    loader: Any = (
        torchrecord.RecordLoader(dataset, num_workers=workers)
        if workers
        else DataLoader(dataset, batch_size=None, num_workers=0)
    )
    start = time.perf_counter()
    samples = sum(len(batch[1]) for batch in loader)
    return time.perf_counter() - start, samples


@dataclass
class Result:
    """One cold read: what read it, its seconds, bytes (sample bytes for readers), samples and eviction."""

    reader: str
    seconds: float
    bytes: int
    samples: int | None
    eviction: cold.Eviction

    @property
    def gb_per_second(self) -> float:
        return self.bytes / self.seconds / 1e9


def cold_read(reader: str, files: Sequence[Path], read: Callable[[], tuple[float, int]], sample: bool) -> Result:
    """Evict ``files``, run ``read()`` in a forked process, and say how it went."""
    eviction = cold.evict(files)
    seconds, amount = cold.run_in_child(read)
    result = Result(reader, seconds, amount * SAMPLE_BYTES if sample else amount, amount if sample else None, eviction)
    print(f"  {reader}: {seconds:.1f} s, {result.gb_per_second:.2f} GB/s ({eviction.describe()})", flush=True)
    return result


def rows(results: Sequence[Result], count: int) -> list[list[str]]:
    """Table rows: reader, seconds, GB/s, samples/s, ratio to the disk, all samples, eviction."""
    disk = results[0].gb_per_second
    out = []
    for r in results:
        complete = "-" if r.samples is None else ("yes" if r.samples == count else f"NO ({r.samples:,})")
        rate = "-" if r.samples is None else f"{r.samples / r.seconds:,.0f}"
        evicted = "yes" if r.eviction.worked else f"NO ({r.eviction.after:.1%} cached)"
        ratio = f"{r.gb_per_second / disk:.2f}"
        out.append([r.reader, f"{r.seconds:.1f}", f"{r.gb_per_second:.2f}", rate, ratio, complete, evicted])
    return out


HEADERS = ["reader", "seconds", "GB/s", "samples/s", "x disk", "all samples", "evicted first"]


def _stop(signum: int, frame: Any) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds through the finally that deletes the set


def _measure(folder: Path, count: int, args: argparse.Namespace) -> tuple[float, list[Result]]:
    path = folder / "data.tr"
    print(f"  writing {count:,} samples ...", flush=True)
    write_seconds = cold.run_in_child(lambda: write_set(path, count, args.seed))
    files = cold.files_of(folder)
    size = sum(f.stat().st_size for f in files)
    print(f"  written in {write_seconds:.0f} s: {size / 1e9:.2f} GB in {len(files)} file(s)", flush=True)
    b, w = args.batch_size, args.workers
    results = [
        cold_read("disk: sequential 16 MiB reads", files, lambda: read_disk(files), sample=False),
        cold_read(f"RecordDataset(batch_size={b}), 0 workers", files, lambda: read_set(path, b, 0), sample=True),
        cold_read(f"RecordLoader, {w} workers", files, lambda: read_set(path, b, w), sample=True),
    ]
    return write_seconds, results


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status (2: no room, or not Linux)."""
    args = parse_args(argv)
    why = cold.available()
    if why is not None:
        print(f"larger_than_memory: cannot run here: {why}", file=sys.stderr)
        return 2
    ram = memory_bytes()
    target = args.bytes or int(args.factor * ram)
    count = max(args.batch_size, target // SAMPLE_BYTES)
    args.dir.mkdir(parents=True, exist_ok=True)
    need, free = disk_needed(count), shutil.disk_usage(args.dir).free
    if free < need:
        print(
            f"larger_than_memory: not enough room in {args.dir.resolve()}: the set of {count:,} samples "
            f"({count * SAMPLE_BYTES / 1e9:.1f} GB, {count * SAMPLE_BYTES / ram:.2f}x RAM) needs {need / 1e9:.1f} GB "
            f"free, there are {free / 1e9:.1f} GB; free space, pass --dir on a larger disk, or a smaller --bytes",
            file=sys.stderr,
        )
        return 2
    machine, found = describe_machine(), versions()
    print("Machine:  " + ", ".join(f"{k}={v}" for k, v in machine.items()))
    print("Versions: " + ", ".join(f"{k}={v}" for k, v in found.items()))
    print(
        f"A set of {count:,} x uint8[3,224,224] + int64 label ({count * SAMPLE_BYTES / 1e9:.2f} GB of samples, "
        f"{count * SAMPLE_BYTES / ram:.2f}x the {ram / 2**30:.1f} GiB of RAM), batch {args.batch_size}",
        flush=True,
    )
    previous = signal.signal(signal.SIGTERM, _stop)
    folder = Path(tempfile.mkdtemp(prefix="larger-than-memory-", dir=args.dir))
    try:
        write_seconds, results = _measure(folder, count, args)
    except KeyboardInterrupt:
        print("  interrupted", file=sys.stderr, flush=True)
        return 130
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
        print(f"  deleted {folder}", flush=True)
    print()
    print(report.format_table(HEADERS, rows(results, count)))
    print("GB/s: the disk's file bytes read, the readers' sample bytes delivered (10^9 bytes a second).")
    if args.json is not None:
        report.write_json(args.json, _payload(args, argv, count, ram, write_seconds, results, machine, found))
        print(f"wrote {args.json}")
    return 0


def _payload(
    args: argparse.Namespace,
    argv: list[str] | None,
    count: int,
    ram: int,
    write_seconds: float,
    results: Sequence[Result],
    machine: dict[str, Any],
    found: dict[str, str],
) -> dict[str, Any]:
    machine["load_average_at_end"] = load_average()
    disk = results[0].gb_per_second
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.larger_than_memory", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine,
        "versions": found,
        "samples": count,
        "sample_bytes": SAMPLE_BYTES,
        "ram_bytes": ram,
        "batch_size": args.batch_size,
        "write_seconds": write_seconds,
        "reads": [
            {
                "reader": r.reader,
                "seconds": r.seconds,
                "bytes": r.bytes,
                "samples": r.samples,
                "gb_per_second": r.gb_per_second,
                "ratio_to_disk": r.gb_per_second / disk,
                "resident_before_eviction": r.eviction.before,
                "resident_after_eviction": r.eviction.after,
            }
            for r in results
        ],
    }


if __name__ == "__main__":
    sys.exit(main())
