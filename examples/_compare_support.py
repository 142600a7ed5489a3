"""Helpers for compare_conventional.py that are not the point of the example.

Synthetic images (deterministic, cached), listing a class-per-folder tree, disk
usage, page-cache eviction with a check that it worked, and running a function
in a fresh child process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import io
import json
import mmap
import multiprocessing
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

__all__ = [
    "IMAGE_EXTENSIONS",
    "disk_bytes",
    "evict_from_page_cache",
    "find_images",
    "format_table",
    "generate_images",
    "read_through",
    "resident_fraction",
    "run_in_child",
]

T = TypeVar("T")

#: File name endings treated as images (as torchvision's ImageFolder does).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

_GENERATOR_VERSION = 1  # bump when the pictures change, so caches are rebuilt


# -- synthetic images -----------------------------------------------------------
def _picture(index: int, size: int, classes: int, seed: int) -> tuple[bytes, int]:
    """JPEG bytes and label of image ``index``: a pure function of its arguments.

    A gradient in a class colour, a few random shapes and mild noise, so the
    files compress like photographs rather than like flat colour or pure noise.
    """
    rng = np.random.default_rng([seed, index])
    label = index % classes
    base = np.array([(label * 73) % 256, (label * 151) % 256, (label * 211) % 256], np.float32)
    other = rng.integers(0, 256, 3).astype(np.float32)
    ramp = np.linspace(0.0, 1.0, size, dtype=np.float32)
    angle = rng.uniform(0, 2 * np.pi)
    mix = np.cos(angle) * ramp[None, :] + np.sin(angle) * ramp[:, None]
    mix = (mix - mix.min()) / (np.ptp(mix) + 1e-6)
    image = Image.fromarray((base * (1 - mix[..., None]) + other * mix[..., None]).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 7))):
        x, y = (int(v) for v in rng.integers(0, size, 2))
        w, h = (int(v) for v in rng.integers(size // 8, size // 2, 2))
        fill = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape([x, y, x + w, y + h], fill=fill)
    noisy = np.asarray(image).astype(np.int16) + rng.normal(0, 6, (size, size, 3)).astype(np.int16)
    out = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue(), label


def _write_pictures(root: str, indices: Sequence[int], size: int, classes: int, seed: int) -> int:
    for i in indices:
        data, label = _picture(i, size, classes, seed)
        with open(os.path.join(root, f"class_{label:03d}", f"img_{i:06d}.jpg"), "wb") as f:
            f.write(data)
    return len(indices)


def generate_images(root: Path, count: int, size: int, classes: int, seed: int = 0, workers: int = 2) -> bool:
    """Make ``count`` JPEGs in ``root/class_XXX/`` (cached: reused when the manifest matches).

    Returns True when the images were generated now, False when reused.
    """
    manifest = {"count": count, "size": size, "classes": classes, "seed": seed, "version": _GENERATOR_VERSION}
    marker = root / "manifest.json"
    if marker.exists() and json.loads(marker.read_text()) == manifest:
        return False
    shutil.rmtree(root, ignore_errors=True)
    for label in range(classes):
        (root / f"class_{label:03d}").mkdir(parents=True)
    chunks = [range(start, min(start + 250, count)) for start in range(0, count, 250)]
    with (
        ProcessPoolExecutor(max(1, workers), mp_context=multiprocessing.get_context("fork")) as pool,
        tqdm(total=count, desc="generating images", unit="img") as bar,
    ):
        futures = [pool.submit(_write_pictures, str(root), chunk, size, classes, seed) for chunk in chunks]
        for future in futures:
            bar.update(future.result())
    marker.write_text(json.dumps(manifest))  # written last: its presence means complete
    return True


def find_images(root: Path) -> tuple[list[str], list[int], list[str]]:
    """Image paths, labels and class names of a class-per-folder tree (classes sorted by name)."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        for path in sorted((root / name).rglob("*")):
            if path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file():
                paths.append(str(path))
                labels.append(label)
    if not paths:
        raise SystemExit(f"{root}: no images found in class sub-folders (expected {root}/<class>/<image>)")
    return paths, labels, classes


# -- files on disk and in the page cache -------------------------------------------
def disk_bytes(paths: Sequence[str]) -> int:
    """Bytes allocated on disk for ``paths`` (whole blocks, so small files cost what they cost)."""
    return sum(os.stat(p).st_blocks * 512 for p in paths)


def _libc() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def resident_fraction(paths: Sequence[str]) -> float | None:
    """The fraction of the files' pages in the page cache, from ``mincore`` (None where unavailable)."""
    if not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None:
        return None
    libc = _libc()
    cached = total = 0
    for path in paths:
        size = os.path.getsize(path)
        if size == 0:
            continue
        pages = -(-size // mmap.PAGESIZE)
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            vec = ctypes.create_string_buffer(pages)
            ok = libc.mincore(ctypes.c_void_p(addr), size, vec) == 0
            libc.munmap(ctypes.c_void_p(addr), size)
            if not ok:
                return None
        finally:
            os.close(fd)
        cached += sum(b & 1 for b in vec.raw)
        total += pages
    return cached / total if total else 0.0


def read_through(paths: Sequence[str]) -> int:
    """Read every file once (to load it into the page cache); returns the bytes read."""
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    return total


def evict_from_page_cache(paths: Sequence[str]) -> tuple[bool | None, str]:
    """Drop the file data of ``paths`` from the page cache; returns (worked, what was seen).

    Each file is flushed (dirty pages cannot be dropped) and then advised
    ``POSIX_FADV_DONTNEED``; the pages still cached are counted with ``mincore``
    before and after (``worked`` is None where that cannot be checked). Pages
    that some process has memory-mapped stay cached, which is why the example
    reads each cold epoch in a fresh process. Directory entries and inodes stay
    cached: only file contents are evicted.
    """
    if not hasattr(os, "posix_fadvise"):
        return False, "cannot evict here (no posix_fadvise): the 'cold' epochs read a warm page cache"
    before = resident_fraction(paths)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    after = resident_fraction(paths)
    if before is None or after is None:
        return None, "evicted (not checked: mincore unavailable)"
    worked = after <= 0.01
    verdict = "evicted" if worked else "NOT evicted"
    return worked, f"{verdict}: {before:.0%} of pages cached before, {after:.1%} after (mincore)"


# -- processes and tables ---------------------------------------------------------
def run_in_child(fn: Callable[[], T]) -> T:
    """Run ``fn`` in a forked child process and return its (picklable) result.

    The child starts with nothing memory-mapped that the parent did not map, and
    everything it maps is released when it exits.
    """
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)

    def target() -> None:
        sender.send(fn())

    child = ctx.Process(target=target)
    child.start()
    sender.close()
    try:
        result: Any = receiver.recv()
    except EOFError:
        child.join()
        raise RuntimeError(f"the measuring child process failed (exit code {child.exitcode})") from None
    child.join()
    return result  # type: ignore[no-any-return]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Align columns: the first left-aligned, the rest right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])
