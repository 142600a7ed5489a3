"""torchrecord's RecordDataset, in per-sample mode, batch mode, and packed records (when supported)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

import torchrecord
from benchmarks.loaders.base import Epochs, Loader, worker_options
from benchmarks.workloads import ArraySamples, WorkloadData

__all__ = [
    "TorchRecordLoader",
    "auto_samples_per_record",
    "library_digest",
    "library_samples_per_record",
    "record_family",
    "record_key",
    "supports_samples_per_record",
    "write_records",
]

#: The chunked writes of benchmarks.writespeed aim at about this many bytes a record (auto_samples_per_record).
_PACKED_RECORD_BYTES = 16 << 10


def supports_samples_per_record() -> bool:
    """True when this torchrecord's write_record accepts ``samples_per_record``."""
    return "samples_per_record" in inspect.signature(torchrecord.write_record).parameters


def auto_samples_per_record(sample_bytes: int) -> int:
    """The largest power of two K with K samples in about 16 KiB (1 for big samples)."""
    ratio = _PACKED_RECORD_BYTES / max(sample_bytes, 1)
    return 1 if ratio < 2 else 2 ** int(math.log2(ratio))


#: Samples written to find the K write_record chooses for a workload.
_PROBE_SAMPLES = 512
_CHOSEN: dict[tuple[Any, ...], int] = {}


def library_samples_per_record(data: WorkloadData) -> int:
    """K as ``write_record`` chooses it when left to itself (what a user gets), found by writing a few samples.

    ``torchrecord-packed`` and ``raw-limit-packed`` use it when ``--samples-per-record`` is 0. Small images
    get K=25 (records of 77 KB, read from LMDB's map), tiny vectors K=112 (8 KB, joined in a window buffer).
    """
    key = (data.features.shape[1:], data.features.dtype.str, data.labels.dtype.str)
    if key not in _CHOSEN:
        n = min(len(data.labels), _PROBE_SAMPLES)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "probe.tr"
            torchrecord.write_record(ArraySamples(data.features[:n], data.labels[:n]), path, progress=False)
            file = torchrecord.RecordFile(path)
            _CHOSEN[key] = file.samples_per_record
            file.close()
    return _CHOSEN[key]


@functools.cache
def library_digest() -> str:
    """A short hash of torchrecord's source files: any change to the library rebuilds its record sets."""
    root = Path(torchrecord.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def record_family(samples_per_record: int = 1) -> str:
    """The cache directory prefix shared by every build of one kind of record set."""
    return f"torchrecord-k{samples_per_record}-"


def record_key(samples_per_record: int = 1) -> str:
    """The cache directory of a record set written by this exact torchrecord source."""
    return record_family(samples_per_record) + library_digest()


def write_records(data: WorkloadData, dest: Path, samples_per_record: int = 1) -> Path:
    """Write the workload with write_record into ``dest/data.tr``."""
    path = dest / "data.tr"
    # K=1 stated too: write_record packs small samples on its own when samples_per_record is left out, and
    # the unpacked loaders and raw-limit (one value per sample) need one sample per record
    extra: dict[str, Any] = {"samples_per_record": samples_per_record} if supports_samples_per_record() else {}
    torchrecord.write_record(ArraySamples(data.features, data.labels), path, progress=False, **extra)
    return path


class BusyTransform:
    """A per-sample transform that spins ``us`` microseconds and returns the sample: decoding's stand-in."""

    def __init__(self, us: float) -> None:
        self.seconds = us / 1e6

    def __call__(self, sample: Any) -> Any:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return sample


class _Epochs(Epochs):
    def __init__(self, dataset: torchrecord.RecordDataset, loader: DataLoader[Any]) -> None:
        self.dataset = dataset
        self.loader = loader

    def epoch(self, index: int) -> Iterable[Any]:
        self.dataset.set_epoch(index)
        return self.loader


class TorchRecordLoader(Loader):
    """RecordDataset in a DataLoader.

    Args:
        batch_mode: ``RecordDataset(batch_size=B)`` with ``DataLoader(batch_size=None)``
            (batches collated in the worker); else per-sample ``RecordDataset`` with
            ``DataLoader(batch_size=B)``.
        samples_per_record: pack K samples per record at write time (``0``: the K
            write_record chooses itself, :func:`library_samples_per_record`; needs a
            write_record with ``samples_per_record``). ``None`` stores one sample per record.
        shuffle_buffer: RecordDataset's ``shuffle_buffer``.
        transform_us: a per-sample :class:`BusyTransform` of this many microseconds (0: none).
        record_loader: batch mode through ``torchrecord.RecordLoader`` (its workers hand
            several batches over at once) instead of ``DataLoader(batch_size=None)``.

    Per-sample mode collates with ``torchrecord.collate`` (what the docs recommend with workers).
    """

    def __init__(
        self,
        name: str,
        *,
        batch_mode: bool,
        samples_per_record: int | None = None,
        shuffle_buffer: int = 2048,
        transform_us: float = 0.0,
        record_loader: bool = False,
    ) -> None:
        self.name = name
        self.batch_mode = batch_mode
        self.record_loader = record_loader
        self.samples_per_record = samples_per_record
        self.shuffle_buffer = shuffle_buffer
        self.transform_us = transform_us
        mode = (
            ("RecordDataset(batch_size=B), " if batch_mode else "RecordDataset, ") + "RecordLoader (bundles of batches)"
            if record_loader
            else "RecordDataset(batch_size=B), DataLoader(batch_size=None)"
            if batch_mode
            else ("RecordDataset, DataLoader(batch_size=B, collate_fn=torchrecord.collate)")
        )
        packing = "; K samples per record" if samples_per_record is not None else ""
        busy = f"; a {transform_us:g} us transform per sample" if transform_us else ""
        self.description = mode + packing + busy

    def packing(self, data: WorkloadData) -> int:
        """K, the samples per record this loader stores for ``data`` (1: unpacked)."""
        if self.samples_per_record is None:
            return 1
        return self.samples_per_record or library_samples_per_record(data)

    def unavailable(self, data: WorkloadData) -> str | None:
        if self.samples_per_record is None:
            return None
        if not supports_samples_per_record():
            return "this torchrecord's write_record has no samples_per_record option"
        if self.packing(data) < 2:
            return "samples too large to pack (K would be 1)"
        return None

    def format_key(self, data: WorkloadData) -> str | None:
        return record_key(self.packing(data))

    def format_family(self, data: WorkloadData) -> str | None:
        return record_family(self.packing(data))

    def build(self, data: WorkloadData, dest: Path) -> None:
        write_records(data, dest, self.packing(data))

    def open(self, data: WorkloadData, path: Path | None, num_workers: int) -> Epochs:
        assert path is not None
        batch = data.batch_size if self.batch_mode else None
        transform = BusyTransform(self.transform_us) if self.transform_us else None
        dataset = torchrecord.RecordDataset(
            path / "data.tr",
            shuffle=True,
            shuffle_buffer=self.shuffle_buffer,
            seed=0,
            batch_size=batch,
            transform=transform,
        )
        if self.record_loader:
            sample_batch = {} if self.batch_mode else {"batch_size": data.batch_size}
            return _Epochs(dataset, torchrecord.RecordLoader(dataset, **sample_batch, **worker_options(num_workers)))
        if self.batch_mode:
            return _Epochs(dataset, DataLoader(dataset, batch_size=None, **worker_options(num_workers)))
        collate = getattr(torchrecord, "collate", None)  # older torchrecords (benchmarked as baselines) lack it
        loader = DataLoader(dataset, batch_size=data.batch_size, collate_fn=collate, **worker_options(num_workers))
        return _Epochs(dataset, loader)
