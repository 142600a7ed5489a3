"""A folder of image files versus torchrecord: one epoch each, side by side.

With no argument (and no download) this script:

1. makes 10,000 deterministic 128x128 JPEG images in a class-per-folder tree
   under ``bench-data/compare/`` (generated once, reused by later runs);
2. writes the very same samples into one record set with ``write_record``;
3. times one epoch of each loader, for ``num_workers`` 0 and 2, first with a
   warm page cache (every file read once beforehand), then with a cold one
   (the files evicted before each epoch, checked with ``mincore``, and the
   epoch read in a fresh process):

   * conventional: a map-style Dataset that opens, reads and decodes one file
     per sample, in ``DataLoader(shuffle=True)``;
   * torchrecord: ``RecordDataset`` in a ``DataLoader``;

4. prints a table: samples/s, seconds per epoch, size on disk and speedup
   (saying where torchrecord is not faster), and one line per case saying where
   the time goes: reading (the same loader timed without decoding) and decoding
   (every image decoded once, timed).

Both loaders do the same work per sample: the record stores the JPEG bytes,
and both decode them with the same function into the same uint8 tensor. So the
ratio measures how the data is stored and loaded, not skipped work. With
``--stored decoded`` the record stores decoded pixels instead, and the
torchrecord rows say so: that measures what skipping decoding buys, at the
cost of a bigger file.

Usage::

    python examples/compare_conventional.py                    # the default comparison
    python examples/compare_conventional.py --stored decoded   # record holds decoded pixels
    python examples/compare_conventional.py --image-folder ~/data/train --size 224
    python examples/compare_conventional.py --cache cold       # only the cold page cache
"""

from __future__ import annotations

import argparse
import functools
import io
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _compare_support import (
    disk_bytes,
    evict_from_page_cache,
    find_images,
    format_table,
    generate_images,
    read_through,
    run_in_child,
)
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from torchrecord import RecordDataset, write_record

# -- 1. Settings ----------------------------------------------------------------------
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--image-folder", type=Path, help="your own class-per-folder images (default: generate)")
parser.add_argument("--count", type=int, default=10_000, help="images to generate")
parser.add_argument("--size", type=int, default=128, help="image side in pixels (your images are resized)")
parser.add_argument("--classes", type=int, default=10, help="classes to generate")
parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="DataLoader num_workers")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument(
    "--stored",
    choices=["encoded", "decoded"],
    default="encoded",
    help="the record holds the image files' bytes (default) or decoded pixels",
)
parser.add_argument(
    "--torchrecord-mode",
    choices=["batch", "sample"],
    default="batch",
    help="batch: RecordDataset(batch_size=B) + DataLoader(batch_size=None); "
    "sample: RecordDataset + DataLoader(batch_size=B)",
)
parser.add_argument("--epochs", type=int, default=1, help="epochs per loader and setting (median reported)")
parser.add_argument(
    "--threads", type=int, default=1, help="torch threads of this process (DataLoader workers always use 1)"
)
parser.add_argument(
    "--cache",
    choices=["both", "warm", "cold"],
    default="both",
    help="warm: files read once before timing; cold: evicted before each epoch; both (default)",
)
parser.add_argument("--cold", action="store_true", help="same as --cache cold")
parser.add_argument("--data-dir", type=Path, default=Path("bench-data/compare"))


# -- 2. The work per sample, shared by both loaders -----------------------------------
#: the CPU seconds spent decoding in the epoch being timed, summed over the processes that decode
#: (the epoch's process and its DataLoader workers, which fork from it and share this counter)
_decode_cpu: Any = None


def decode(data: bytes, size: int) -> torch.Tensor:
    """Image file bytes -> uint8 tensor [3, size, size] (RGB, resized only if needed)."""
    start = time.thread_time()
    image = Image.open(io.BytesIO(data)).convert("RGB")
    if image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BILINEAR)
    out = torch.from_numpy(np.array(image)).permute(2, 0, 1)
    if _decode_cpu is not None:
        with _decode_cpu.get_lock():
            _decode_cpu.value += time.thread_time() - start
    return out


class DecodeSample:
    """The transform RecordDataset applies to each stored (bytes, label) sample."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, sample: tuple[bytes, int]) -> tuple[torch.Tensor, int]:
        data, label = sample
        return decode(data, self.size), label


# -- 3. The conventional way: one file per sample ------------------------------------
class ImageFiles(Dataset[tuple[Any, int]]):
    """Map-style dataset over image files; ``raw=True`` gives the file bytes (for writing, and timing reads)."""

    def __init__(self, paths: list[str], labels: list[int], size: int, raw: bool = False) -> None:
        self.paths, self.labels, self.size, self.raw = paths, labels, size, raw

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        with open(self.paths[i], "rb") as f:
            data = f.read()
        return (data if self.raw else decode(data, self.size)), self.labels[i]


def main() -> None:
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    if max(args.workers) > cpus:  # say it once, instead of DataLoader's warning at every epoch
        print(f"note: up to {max(args.workers)} workers on {cpus} CPUs, so some runs oversubscribe the CPUs")
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    # DataLoader workers run torch on one thread; so does this process, where the
    # num_workers=0 loaders run (several threads only stall when the CPUs are busy).
    torch.set_num_threads(args.threads)

    # -- 4. The data: generated (cached) or yours ---------------------------------------
    if args.image_folder is None:
        root = args.data_dir / f"images-{args.count}x{args.size}px"
        start = time.perf_counter()
        made = generate_images(root, args.count, args.size, args.classes)
        print(
            f"{'generated' if made else 'reusing'} {args.count:,} JPEGs in {root} ({time.perf_counter() - start:.1f} s)"
        )
    else:
        root = args.image_folder.expanduser()
    paths, labels, classes = find_images(root)
    print(f"{len(paths):,} images in {len(classes)} classes; batch size {args.batch_size}")

    # -- 5. The torchrecord way: write the same samples once ----------------------------
    # "encoded": each sample is (file bytes, label), decoded by the transform when read.
    # "decoded": each sample is (uint8 tensor, label), decoded now, once; no transform.
    args.data_dir.mkdir(parents=True, exist_ok=True)
    record = str(args.data_dir / f"{root.name}-{args.stored}.tr")
    source = ImageFiles(paths, labels, args.size, raw=args.stored == "encoded")
    start = time.perf_counter()
    write_record(source, record, overwrite=True, num_workers=0 if args.stored == "encoded" else 2)
    print(f"write_record: {len(paths):,} samples ({args.stored}) in {time.perf_counter() - start:.1f} s")
    transform = DecodeSample(args.size) if args.stored == "encoded" else None

    # -- 6. The two loaders -----------------------------------------------------------
    # decoded=False gives the stored bytes undecoded: the same loader, timed for its reading alone.
    def conventional(workers: int, decoded: bool = True) -> DataLoader[Any]:
        dataset = ImageFiles(paths, labels, args.size, raw=not decoded)
        return DataLoader(
            dataset,
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=workers,
            collate_fn=None if decoded else _as_list,
        )

    def torchrecord(workers: int, decoded: bool = True) -> DataLoader[Any]:
        t = transform if decoded else None
        if args.torchrecord_mode == "batch":  # batches are collated inside the workers
            dataset = RecordDataset(record, batch_size=args.batch_size, transform=t)
            # undecoded batches pass as they are, as the conventional loader's _as_list passes its own
            return DataLoader(dataset, batch_size=None, num_workers=workers, collate_fn=None if decoded else _as_is)
        dataset = RecordDataset(record, transform=t)
        return DataLoader(
            dataset,
            batch_size=args.batch_size,
            num_workers=workers,
            collate_fn=None if decoded or args.stored == "decoded" else _as_list,
        )

    tr_label = "torchrecord" + (" (stored decoded)" if args.stored == "decoded" else "")
    loaders: list[tuple[str, Callable[..., DataLoader[Any]], list[str]]] = [
        ("conventional", conventional, paths),
        (tr_label, torchrecord, [record]),
    ]

    # -- 7. Time one epoch of each, warm then cold ---------------------------------------
    # The clock runs from creating the loader (worker start-up included) to its last
    # batch. Warm: every file is read once beforehand. Cold: the files are dropped from
    # the page cache before each epoch. Every epoch runs in a fresh process: a process
    # that memory-mapped the record file (LMDB does) would keep its pages cached.
    def one_epoch(
        make: Callable[..., DataLoader[Any]], workers: int, desc: str, decoded: bool = True
    ) -> tuple[float, int, float]:
        """(seconds, samples, CPU seconds of decoding in this process and its workers) of one epoch."""
        global _decode_cpu
        _decode_cpu = multiprocessing.get_context("fork").Value("d", 0.0)  # the workers fork after this
        start = time.perf_counter()
        loader = make(workers, decoded)
        samples = 0
        for batch in tqdm(loader, desc=desc, total=len(loader), leave=False):
            samples += len(batch[1])
        seconds = time.perf_counter() - start
        del loader  # its workers have exited: every decode is counted
        return seconds, samples, float(_decode_cpu.value)

    def timed(
        cache: str,
        name: str,
        make: Callable[..., DataLoader[Any]],
        files: list[str],
        workers: int,
        decoded: bool = True,
    ) -> tuple[float, float]:
        """The median seconds of an epoch, and that epoch's CPU seconds of decoding."""
        desc = f"{cache} {name} w={workers}" + ("" if decoded else " (reading only)")
        times = []
        for _ in range(args.epochs):
            if cache == "cold":
                worked, seen = evict_from_page_cache(files)
                evictions[name] = evictions.get(name, True) and worked is not False
                print(f"{desc}: {seen}")
            # every epoch runs in a fresh process, so this one never maps the record file
            seconds, samples, decoding = run_in_child(functools.partial(one_epoch, make, workers, desc, decoded))
            if samples != len(paths):
                print(f"warning: {desc} gave {samples} samples, expected {len(paths)}")
            times.append((seconds, decoding))
        return sorted(times)[(len(times) - 1) // 2]

    caches = ["cold"] if args.cold else (["warm", "cold"] if args.cache == "both" else [args.cache])
    evictions: dict[str, bool] = {}
    results = []  # (cache, name, workers, samples/s, seconds, size, CPU seconds of decoding)
    reading = {}  # (cache, name) -> seconds of one epoch without decoding, 0 workers
    for cache in caches:
        if cache == "warm":
            for _, _, files in loaders:
                read_through(files)
        for workers in args.workers:
            for name, make, files in loaders:
                seconds, decoding = timed(cache, name, make, files, workers)
                results.append((cache, name, workers, len(paths) / seconds, seconds, disk_bytes(files), decoding))
        for name, make, files in loaders:
            reading[cache, name] = timed(cache, name, make, files, 0, decoded=False)[0]

    # -- 8. The table and where the time goes -------------------------------------------
    baseline = {(c, w): rate for c, name, w, rate, *_ in results if name == "conventional"}
    rows = []
    for cache, name, w, rate, secs, size, _ in results:
        ratio = rate / baseline[cache, w]
        verdict = (
            "-"
            if name == "conventional"
            else (f"{ratio:.2f}x faster" if ratio >= 1.05 else f"{ratio:.2f}x: not faster")
        )
        rows.append([cache, name, str(w), f"{rate:,.0f}", f"{secs:.2f}", f"{size / 1e6:,.1f} MB", verdict])
    epochs = "1 epoch" if args.epochs == 1 else f"median of {args.epochs} epochs"
    print(
        f"\n{len(paths):,} images of {args.size}x{args.size}, batch {args.batch_size}, {epochs}, "
        f"torchrecord {args.torchrecord_mode} mode, {cpus} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    if "cold" in caches:
        said = {
            n: ("evicted (mincore checked)" if ok else "NOT evicted: the cold rows read cached data")
            for n, ok in evictions.items()
        }
        print("cold page cache: " + "; ".join(f"{n}: {v}" for n, v in said.items()))
    print(format_table(["cache", "loader", "workers", "samples/s", "s/epoch", "size on disk", "vs conventional"], rows))
    print_where_the_time_goes(results, reading, len(paths))


def print_where_the_time_goes(
    results: list[tuple[str, str, int, float, float, int, float]],
    reading: dict[tuple[str, str], float],
    count: int,
) -> None:
    """One line per case: reading alone, decoding (CPU measured in the processes that decode), the rest.

    Decoding is CPU time summed over the processes that decoded (the main process, or the
    ``w`` workers); its share of the epoch is per process (the sum divided by ``w``), which a
    process's CPU time within the epoch cannot exceed.
    """
    per_image = [d / count for _, name, w, _, _, _, d in results if w == 0 and d]
    each = f"{min(per_image) * 1e3:.2f} ms per image at best; " if per_image else ""
    print(
        f"\nwhere the time goes (decoding: {each}its CPU time, measured in the processes that decode; "
        "reading: the same loader without decoding, 0 workers, timed):"
    )
    for cache, name, w, _, secs, _, decoding in results:
        read = reading[cache, name]
        per_process = decoding / max(1, w)
        spread = (
            "in the loading process"
            if w == 0
            else "in its worker"
            if w == 1
            else f"over its {w} workers, ~{per_process:.2f} s each"
        )
        rest = max(0.0, secs - read - per_process)
        print(
            f"  {cache} {name} w={w}: {secs:.2f} s/epoch: reading alone {read:.2f} s ({read / secs:.0%} of it), "
            f"decoding {decoding:.2f} s of CPU {spread} ({per_process / secs:.0%} of the epoch"
            f"{'' if w <= 1 else ' per worker'}), the rest {rest:.2f} s (collation, worker start-up and transfer, "
            "waiting)"
        )
        other = next(r for r in results if r[:3] == (cache, "conventional", w))
        if name != "conventional" and other[4] / secs < 1.05:  # under 1.05x the folder's samples/s
            folder = reading[cache, "conventional"]
            print(
                f"    not faster here: decoding takes ~{per_process:.2f} s of this {secs:.2f} s epoch per process, "
                f"~{other[6] / max(1, w):.2f} s with the folder; what differs is reading, {folder:.2f} s (folder) "
                f"against {read:.2f} s (torchrecord), {abs(folder - read) / secs:.0%} of the epoch"
            )


def _as_is(batch: Any) -> Any:
    """A batch of undecoded records as the reader built it (no conversion walk over its bytes)."""
    return batch


def _as_list(batch: list[Any]) -> list[Any]:
    """Collate undecoded (bytes, label) samples as they are: reading is all that is timed."""
    return [[s[0] for s in batch], [s[1] for s in batch]]


if __name__ == "__main__":
    main()
