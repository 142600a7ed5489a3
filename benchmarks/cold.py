"""Cold reads: each loader's epoch with its files evicted from the page cache, checked with mincore.

Before each cold epoch every file of the loader's format is flushed and advised
``POSIX_FADV_DONTNEED``, and the fraction of its pages still in the page cache
is measured with ``mincore`` (through ctypes), so a run says when eviction did
not work (pages that a process keeps mapped cannot be dropped). The epoch then
runs in a freshly forked process, which has nothing mapped: it reads from disk.
Linux only (``posix_fadvise``, ``mincore``); elsewhere the section is skipped.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from torchrecord._store.advise import cached_pages

__all__ = ["ColdResult", "Eviction", "available", "evict", "resident_fraction", "run_in_child", "time_cold"]

T = TypeVar("T")


def available() -> str | None:
    """Why cold reads cannot be measured here, or None if they can."""
    if not sys.platform.startswith("linux") or not hasattr(os, "posix_fadvise"):
        return "needs Linux (posix_fadvise and mincore)"
    if cached_pages(__file__) is None:
        return "mincore cannot be asked here"
    return None


def resident_fraction(files: Sequence[Path]) -> float:
    """The fraction of the files' pages now in the page cache (``mincore``, as the readers ask it)."""
    cached = total = 0
    for path in files:
        counts = cached_pages(str(path))
        c, t = counts if counts is not None else (0, -(-path.stat().st_size // mmap.PAGESIZE))
        cached, total = cached + c, total + t
    return cached / total if total else 0.0


@dataclass
class Eviction:
    """The files' page-cache residency before and after an eviction."""

    before: float
    after: float

    @property
    def worked(self) -> bool:
        return self.after <= 0.01

    def describe(self) -> str:
        verdict = "evicted" if self.worked else "NOT evicted"
        return f"{verdict}: {self.before:.0%} of pages cached before, {self.after:.1%} after (mincore)"


def evict(files: Sequence[Path]) -> Eviction:
    """Flush each file and drop its pages from the page cache; says how much was cached before and after."""
    before = resident_fraction(files)
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return Eviction(before, resident_fraction(files))


def run_in_child(fn: Callable[[], T]) -> T:
    """Run ``fn`` in a forked child process (nothing mapped that the parent did not map) and return its result."""
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
    except BaseException:  # Ctrl-C or SIGTERM here: the child must not outlive the caller's cleanup
        child.terminate()
        child.join()
        raise
    child.join()
    return result  # type: ignore[no-any-return]


@dataclass
class ColdResult:
    """Cold epochs of one loader configuration."""

    workload: str
    loader: str
    workers: int | None
    expected: int
    seconds: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.loader if self.workers is None else f"{self.loader} w={self.workers}"

    @property
    def samples_per_second(self) -> float:
        return statistics.median(n / s for n, s in zip(self.samples, self.seconds))

    @property
    def evicted(self) -> bool:
        return all(e.worked for e in self.evictions)


def files_of(path: Path) -> list[Path]:
    """Every file of a format directory (or the file itself)."""
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def time_cold(result: ColdResult, files: Sequence[Path], epoch: Callable[[], tuple[float, int]]) -> Eviction:
    """Evict ``files``, time one ``epoch()`` in a fresh process, and record both in ``result``."""
    eviction = evict(files)
    seconds, samples = run_in_child(epoch)
    result.seconds.append(seconds)
    result.samples.append(samples)
    result.evictions.append(eviction)
    return eviction
