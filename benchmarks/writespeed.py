"""Write speed: write_record against a plain LMDB append of the very same encoded values.

The encoded values are taken from the record set write_record just wrote, so
both sides store identical bytes; the raw side skips what write_record adds
(reading and normalizing samples, protobuf encoding, shuffling, CRCs, metadata,
the atomic rename). Both end with a full sync to disk.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lmdb

import torchrecord
from benchmarks.workloads import ArraySamples, WorkloadData

__all__ = ["WriteResult", "measure_writes"]

_COMMIT_BYTES = 64 << 20


@dataclass
class WriteResult:
    """Seconds to write one workload both ways, and what was written."""

    workload: str
    samples: int
    value_bytes: int
    file_bytes: int
    torchrecord_seconds: float
    raw_lmdb_seconds: float

    def rates(self) -> dict[str, float]:
        """samples/s and MB/s (of stored values, 1 MB = 1e6 bytes) for both writers."""
        mb = self.value_bytes / 1e6
        return {
            "torchrecord_samples_per_second": self.samples / self.torchrecord_seconds,
            "torchrecord_mb_per_second": mb / self.torchrecord_seconds,
            "raw_lmdb_samples_per_second": self.samples / self.raw_lmdb_seconds,
            "raw_lmdb_mb_per_second": mb / self.raw_lmdb_seconds,
        }

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), **self.rates()}


def _remove(*paths: Path) -> None:
    for path in paths:
        if path.exists():
            path.unlink()


def _stored_values(path: Path) -> list[bytes]:
    """Every value of the ``records`` database (the layout in torchrecord._format), in key order."""
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


def measure_writes(data: WorkloadData, scratch: Path) -> WriteResult:
    """Time write_record on the workload, then a raw LMDB append of its encoded values."""
    scratch.mkdir(parents=True, exist_ok=True)
    record = scratch / "write-bench.tr"
    raw = scratch / "write-bench-raw.lmdb"
    _remove(record, raw, Path(str(raw) + "-lock"))
    start = time.perf_counter()
    torchrecord.write_record(ArraySamples(data.features, data.labels), record, progress=False)
    tr_seconds = time.perf_counter() - start
    file_bytes = os.path.getsize(record)
    values = _stored_values(record)
    _remove(record)
    raw_seconds = _raw_append(values, raw)
    _remove(raw, Path(str(raw) + "-lock"))
    return WriteResult(
        workload=data.name,
        samples=data.count,
        value_bytes=sum(len(v) for v in values),
        file_bytes=file_bytes,
        torchrecord_seconds=tr_seconds,
        raw_lmdb_seconds=raw_seconds,
    )
