"""Time epochs of several loader configurations, interleaved round by round.

Round r runs epoch r of every configuration before any runs epoch r+1, so a
change in background load during the run hits every loader alike; each
configuration's figure is the median over its epochs. Warm-up rounds come first
and are not timed: a loader with persistent workers starts them there, and
every loader finds the page cache (and its own caches) as a training run's
later epochs do.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.loaders import Epochs

__all__ = ["Measurement", "run_rounds", "time_epoch"]


@dataclass
class Measurement:
    """The timed epochs of one loader configuration on one workload."""

    workload: str
    loader: str
    workers: int | None
    batch_size: int
    expected: int
    is_limit: bool
    disk_bytes: int | None = None
    build_seconds: float | None = None
    seconds: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``"torchrecord w=2"`` (limits have no workers)."""
        return self.loader if self.workers is None else f"{self.loader} w={self.workers}"

    @property
    def samples_per_second(self) -> float:
        """The median over epochs of samples delivered per second."""
        return statistics.median(n / s for n, s in zip(self.samples, self.seconds))

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds)

    @property
    def complete(self) -> bool:
        """True when every epoch delivered exactly the workload's sample count."""
        return all(n == self.expected for n in self.samples)


def time_epoch(epochs: Epochs, index: int) -> tuple[float, int]:
    """Seconds and samples of one epoch, from creating the iterator to its last batch."""
    start = time.perf_counter()
    count = 0
    for batch in epochs.epoch(index):
        count += epochs.samples_in(batch)
    seconds = time.perf_counter() - start
    epochs.after_epoch()
    return seconds, count


def run_rounds(
    configs: list[tuple[Measurement, Epochs]], rounds: int, log: Callable[[str], None] = print, warmup: int = 0
) -> None:
    """Run ``warmup`` untimed epochs, then ``rounds`` timed epochs, of every configuration, interleaved, recording
    each timed one in its Measurement. Epoch indices run on across the warm-up (each epoch has its own order)."""
    width = max((len(m.label) for m, _ in configs), default=0)
    for r in range(warmup):
        for measurement, epochs in configs:
            seconds, count = time_epoch(epochs, r)
            log(f"  warm-up {r + 1}/{warmup}  {measurement.label:<{width}}  {seconds:7.2f} s  (not timed)")
    for r in range(rounds):
        for measurement, epochs in configs:
            seconds, count = time_epoch(epochs, warmup + r)
            measurement.seconds.append(seconds)
            measurement.samples.append(count)
            flag = "" if count == measurement.expected else f"  (expected {measurement.expected})"
            log(
                f"  epoch {r + 1}/{rounds}  {measurement.label:<{width}}  {seconds:7.2f} s  "
                f"{count / seconds:>12,.0f} samples/s{flag}"
            )
