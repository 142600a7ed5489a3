"""Converters against reading their source once: ``python -m benchmarks.convert [--rows N]``.

Two sources of the same small labelled images (PNG, 32x32 by default):

* a Hugging Face ``Dataset`` (``Image`` + ``ClassLabel`` columns) saved with
  ``save_to_disk`` and opened with ``load_from_disk`` (memory-mapped Arrow).
  The baseline reads its Arrow columns once: every record batch, the image
  bytes materialized as Python ``bytes`` and the labels as a NumPy array.
  ``from_hf`` is timed on the same opened dataset, shuffled (the default).
* WebDataset tars written with ``webdataset.TarWriter`` (4 tars). The baseline
  reads them once with ``webdataset.WebDataset`` (raw bytes, no decoding);
  ``from_webdataset`` converts them, shuffled.

Each conversion ends with a synced, published record set. Ratios above 1 mean
the conversion takes longer than the read. The default size runs in about a
minute; the issue's target is measured with ``--rows 100000``.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np


def _pngs(rows: int, size: int, seed: int = 0) -> list[bytes]:
    """``rows`` distinct-ish PNGs (a few hundred drawn at random, each reused with a changed corner pixel)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(64)]
    out = []
    for i in range(rows):
        pixels = base[i % len(base)]
        pixels[0, 0] = (i & 255, (i >> 8) & 255, (i >> 16) & 255)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
        out.append(buffer.getvalue())
    return out


def _best(run: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_hf(folder: str, images: list[bytes], repeat: int) -> dict[str, float]:
    import datasets
    import pyarrow.compute as pc

    from torchrecord.convert import from_hf

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    source = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in images], "label": [i % 10 for i in range(len(images))]},
        features=features,
    )
    saved = os.path.join(folder, "hf")
    source.save_to_disk(saved)
    ds = datasets.load_from_disk(saved)

    def read_columns() -> None:
        for batch in ds.data.table.to_batches():
            pc.struct_field(batch.column("image"), "bytes").to_pylist()
            batch.column("label").to_numpy()

    def convert() -> None:
        from_hf(ds, os.path.join(folder, "hf.tr"), overwrite=True, progress=False)

    return {"read": _best(read_columns, repeat), "convert": _best(convert, repeat)}


def bench_webdataset(folder: str, images: list[bytes], repeat: int, tars: int = 4) -> dict[str, float]:
    import webdataset as wds

    from torchrecord.convert import from_webdataset

    paths = [os.path.join(folder, f"shard-{t:03d}.tar") for t in range(tars)]
    for t, path in enumerate(paths):
        with wds.TarWriter(path) as writer:
            for i in range(t, len(images), tars):
                writer.write({"__key__": f"s{i:08d}", "png": images[i], "cls": i % 10})

    def read_tars() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            for _ in wds.WebDataset(paths, shardshuffle=False, empty_check=False):
                pass

    def convert() -> None:
        from_webdataset(paths, os.path.join(folder, "wds.tr"), overwrite=True, progress=False)

    return {"read": _best(read_tars, repeat), "convert": _best(convert, repeat)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.convert", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000, help="samples (default 10,000; the target: 100,000)")
    parser.add_argument("--size", type=int, default=32, help="image side in pixels (default 32)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each timing; the best is shown (default 1)")
    args = parser.parse_args(argv)
    images = _pngs(args.rows, args.size)
    mean = sum(map(len, images)) / len(images)
    print(f"{args.rows} images of {args.size}x{args.size} (PNG, {mean:.0f} bytes on average) with labels")
    with tempfile.TemporaryDirectory(prefix="tr-convert-bench-") as folder:
        for name, bench in (("from_hf", bench_hf), ("from_webdataset", bench_webdataset)):
            try:
                t = bench(folder, images, args.repeat)
            except ImportError as exc:
                print(f"{name:16s} skipped: {exc}")
                continue
            print(
                f"{name:16s} read once {t['read']:7.3f} s   convert {t['convert']:7.3f} s   "
                f"ratio {t['convert'] / t['read']:6.1f}x   ({args.rows / t['convert']:,.0f} samples/s)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
