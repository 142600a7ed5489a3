"""A folder of image files versus torchrecord: one epoch each, side by side.

With no argument (and no download) this script:

1. makes 10,000 deterministic 128x128 JPEG images in a class-per-folder tree
   under ``bench-data/compare/`` (generated once, reused by later runs);
2. writes the very same samples into one record set with ``write_record``;
3. times one epoch of each loader, for ``num_workers`` 0, 2 and 4:

   * conventional: a map-style Dataset that opens, reads and decodes one file
     per sample, in ``DataLoader(shuffle=True)``;
   * torchrecord: ``RecordDataset`` in a ``DataLoader``;

4. prints a table: samples/s, seconds per epoch, size on disk and speedup.

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
    python examples/compare_conventional.py --cold             # evict files from the page cache first
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import statistics
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
parser.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4], help="DataLoader num_workers")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--stored", choices=["encoded", "decoded"], default="encoded",
                    help="the record holds the image files' bytes (default) or decoded pixels")
parser.add_argument("--torchrecord-mode", choices=["batch", "sample"], default="batch",
                    help="batch: RecordDataset(batch_size=B) + DataLoader(batch_size=None); "
                         "sample: RecordDataset + DataLoader(batch_size=B)")
parser.add_argument("--epochs", type=int, default=1, help="epochs per loader and setting (median reported)")
parser.add_argument("--threads", type=int, default=1,
                    help="torch threads of this process (DataLoader workers always use 1)")
parser.add_argument("--cold", action="store_true", help="evict the files from the page cache before each epoch")
parser.add_argument("--data-dir", type=Path, default=Path("bench-data/compare"))


# -- 2. The work per sample, shared by both loaders -----------------------------------
def decode(data: bytes, size: int) -> torch.Tensor:
    """Image file bytes -> uint8 tensor [3, size, size] (RGB, resized only if needed)."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    if image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)


class DecodeSample:
    """The transform RecordDataset applies to each stored (bytes, label) sample."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, sample: tuple[bytes, int]) -> tuple[torch.Tensor, int]:
        data, label = sample
        return decode(data, self.size), label


# -- 3. The conventional way: one file per sample ------------------------------------
class ImageFiles(Dataset[tuple[Any, int]]):
    """Map-style dataset over image files; ``raw=True`` gives the file bytes (for writing)."""

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
        print(f"{'generated' if made else 'reusing'} {args.count:,} JPEGs in {root} "
              f"({time.perf_counter() - start:.1f} s)")
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
    def conventional(workers: int) -> DataLoader[Any]:
        dataset = ImageFiles(paths, labels, args.size)
        return DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=workers)

    def torchrecord(workers: int) -> DataLoader[Any]:
        if args.torchrecord_mode == "batch":  # batches are collated inside the workers
            dataset = RecordDataset(record, batch_size=args.batch_size, transform=transform)
            return DataLoader(dataset, batch_size=None, num_workers=workers)
        dataset = RecordDataset(record, transform=transform)
        return DataLoader(dataset, batch_size=args.batch_size, num_workers=workers)

    tr_label = "torchrecord" + (" (stored decoded)" if args.stored == "decoded" else "")
    loaders: list[tuple[str, Callable[[int], DataLoader[Any]], list[str]]] = [
        ("conventional", conventional, paths),
        (tr_label, torchrecord, [record]),
    ]

    # -- 7. Time one epoch of each ------------------------------------------------------
    # The clock runs from creating the loader (worker start-up included) to its last
    # batch. By default both loaders read from a warm page cache: every file is read
    # once beforehand. With --cold, the files are dropped from the page cache before
    # each epoch, which then runs in a fresh process: a process that memory-mapped the
    # record file (LMDB does) would otherwise keep its pages cached.
    def one_epoch(make: Callable[[int], DataLoader[Any]], workers: int, desc: str) -> tuple[float, int]:
        start = time.perf_counter()
        loader = make(workers)
        samples = 0
        for _, batch_labels in tqdm(loader, desc=desc, total=len(loader), leave=True):
            samples += len(batch_labels)
        return time.perf_counter() - start, samples

    if not args.cold:
        for _, _, files in loaders:
            read_through(files)
    results = []
    for workers in args.workers:
        for name, make, files in loaders:
            times = []
            for epoch in range(args.epochs):
                desc = f"{name:<12} w={workers}" + (f" epoch {epoch + 1}" if args.epochs > 1 else "")
                if args.cold:
                    print(f"{desc}: {evict_from_page_cache(files)}")
                    seconds, samples = run_in_child(functools.partial(one_epoch, make, workers, desc))
                else:
                    seconds, samples = one_epoch(make, workers, desc)
                if samples != len(paths):
                    print(f"warning: {desc} gave {samples} samples, expected {len(paths)}")
                times.append(seconds)
            seconds = statistics.median(times)
            results.append((name, workers, len(paths) / seconds, seconds, disk_bytes(files)))

    # -- 8. The table ---------------------------------------------------------------------
    baseline = {w: rate for name, w, rate, _, _ in results if name == "conventional"}
    rows = [
        [name, str(w), f"{rate:,.0f}", f"{secs:.2f}", f"{size / 1e6:,.1f} MB", f"{rate / baseline[w]:.2f}x"]
        for name, w, rate, secs, size in results
    ]
    cache = "cold page cache" if args.cold else "warm page cache"
    epochs = "1 epoch" if args.epochs == 1 else f"median of {args.epochs} epochs"
    print(f"\n{len(paths):,} images of {args.size}x{args.size}, batch {args.batch_size}, {cache}, {epochs}, "
          f"torchrecord {args.torchrecord_mode} mode, {cpus} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(format_table(["loader", "workers", "samples/s", "s/epoch", "size on disk", "speedup"], rows))


if __name__ == "__main__":
    main()
