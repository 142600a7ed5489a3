"""Write speed: write_record against a plain LMDB append of the very same encoded values.

The encoded values are taken from the record set write_record just wrote, so
both sides store identical bytes; the raw side skips what write_record adds
(reading and normalizing samples, protobuf encoding, shuffling, CRCs, metadata,
the atomic rename). Both end with a full sync to disk.

write_record is timed on two sources of the same samples: a per-sample map-style
dataset (``dataset[i]`` builds each sample: its own cost is measured too, as the
floor of any writer pulling samples one by one) and a ``TensorDataset`` of the
same arrays (read as whole columns), each with one sample per record and, for
small samples, K per record (the chunked path).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import torch
from torch.utils.data import TensorDataset

import torchrecord
from benchmarks.workloads import ArraySamples, WorkloadData

__all__ = ["WriteResult", "measure_writes"]

_COMMIT_BYTES = 64 << 20


@dataclass
class WriteResult:
    """Seconds to write one workload with write_record (several sources and packings) and with a raw append.

    Attributes:
        raw_lmdb_seconds: a plain LMDB append of the one-sample records write_record stored.
        source_seconds: calling ``dataset[i]`` of the per-sample source for every i, nothing else:
            the floor of any writer that pulls samples one by one from it.
        writes: per writer variant (``"per-sample source, K=1"`` ...), its seconds.
    """

    workload: str
    samples: int
    value_bytes: int
    file_bytes: int
    torchrecord_seconds: float
    raw_lmdb_seconds: float
    source_seconds: float = 0.0
    writes: dict[str, float] = field(default_factory=dict)

    def rates(self) -> dict[str, float]:
        """samples/s and MB/s (of stored values, 1 MB = 1e6 bytes) for both writers."""
        mb = self.value_bytes / 1e6
        return {
            "torchrecord_samples_per_second": self.samples / self.torchrecord_seconds,
            "torchrecord_mb_per_second": mb / self.torchrecord_seconds,
            "raw_lmdb_samples_per_second": self.samples / self.raw_lmdb_seconds,
            "raw_lmdb_mb_per_second": mb / self.raw_lmdb_seconds,
        }

    def ratio(self, variant: str) -> float:
        """A write variant's speed as a fraction of the raw append's."""
        return self.raw_lmdb_seconds / self.writes[variant]

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            **self.rates(),
            "ratios_to_raw_append": {k: self.ratio(k) for k in self.writes},
        }


def _remove(*paths: Path) -> None:
    for path in paths:
        if path.exists():
            path.unlink()


def _stored_values(path: Path) -> list[bytes]:
    """Every value of the ``records`` database (the layout in torchrecord._store.format), in key order."""
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=4)
    try:
        db = env.open_db(b"records", create=False)
        with env.begin(db=db) as txn:
            return [bytes(v) for v in txn.cursor().iternext(keys=False, values=True)]
    finally:
        env.close()


def _raw_append(values: list[bytes], path: Path) -> float:
    """Seconds for a plain LMDB append loop: one big map, one transaction per ~64 MB, then sync."""
    map_size = 2 * sum(len(v) for v in values) + (64 << 20)
    start = time.perf_counter()
    env = lmdb.open(str(path), subdir=False, map_size=map_size, sync=False, metasync=False, meminit=False)
    txn, pending = env.begin(write=True), 0
    for i, value in enumerate(values):
        txn.put(i.to_bytes(8, "big"), value, append=True)
        pending += len(value)
        if pending >= _COMMIT_BYTES:
            txn.commit()
            txn, pending = env.begin(write=True), 0
    txn.commit()
    env.sync(True)
    env.close()
    return time.perf_counter() - start


def _timed_write(source: Any, path: Path, samples_per_record: int) -> float:
    _remove(path)
    start = time.perf_counter()
    torchrecord.write_record(source, path, progress=False, samples_per_record=samples_per_record)
    seconds = time.perf_counter() - start
    _remove(path)
    return seconds


def packing_for(sample_bytes: int) -> int:
    """K for the chunked writes: about 16 KiB per record (1 for samples too large to pack)."""
    from benchmarks.loaders.torchrecord_loader import auto_samples_per_record

    return auto_samples_per_record(sample_bytes)


def measure_writes(data: WorkloadData, scratch: Path) -> WriteResult:
    """Time write_record on the workload in several forms, then a raw LMDB append of its encoded values.

    Forms: a per-sample map-style source (``ArraySamples``: ``dataset[i]`` builds one
    sample), a ``TensorDataset`` of the same arrays (read as columns), each with one
    sample per record and, for small samples, with K samples per record.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    record = scratch / "write-bench.tr"
    raw = scratch / "write-bench-raw.lmdb"
    _remove(record, raw, Path(str(raw) + "-lock"))
    per_sample = ArraySamples(data.features, data.labels)
    columns = TensorDataset(torch.from_numpy(data.features), torch.from_numpy(data.labels))
    start = time.perf_counter()
    # K=1 stated: left out, write_record packs small samples itself, and the raw append below must
    # store one value per sample (what a hand-written LMDB writer does)
    torchrecord.write_record(per_sample, record, progress=False, samples_per_record=1)
    tr_seconds = time.perf_counter() - start
    file_bytes = os.path.getsize(record)
    values = _stored_values(record)
    _remove(record)
    raw_seconds = _raw_append(values, raw)
    _remove(raw, Path(str(raw) + "-lock"))
    start = time.perf_counter()
    for i in range(len(per_sample)):
        per_sample[i]
    source_seconds = time.perf_counter() - start
    writes = {"per-sample source, K=1": tr_seconds, "TensorDataset, K=1": _timed_write(columns, record, 1)}
    k = packing_for(data.workload.sample_bytes)
    if k > 1:
        writes[f"per-sample source, K={k}"] = _timed_write(per_sample, record, k)
        writes[f"TensorDataset, K={k}"] = _timed_write(columns, record, k)
    return WriteResult(
        workload=data.name,
        samples=data.count,
        value_bytes=sum(len(v) for v in values),
        file_bytes=file_bytes,
        torchrecord_seconds=tr_seconds,
        raw_lmdb_seconds=raw_seconds,
        source_seconds=source_seconds,
        writes=writes,
    )
