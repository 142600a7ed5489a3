"""What reading files of unknown provenance costs: the structural check, the key checks and the checksums.

``python -m benchmarks.checks --workloads small-images tiny-vectors --scale 0.2``

One sample a record by default; ``--samples-per-record 0`` writes the sets as ``write_record`` packs them
when left to itself (what a user gets: small images 25 a record, tiny vectors 112).

For each workload (the same generated samples as ``benchmarks.run``, written with
``write_record``), side by side in interleaved rounds, medians over the rounds:

* ``check_structure``: the pure-Python LMDB page-structure check that
  ``check="structure"`` and ``verify`` run, in seconds and seconds per 100 MB;
* the cursor walk over every record with its key checks (each key read compared with
  the index expected, in bulk per piece of 256) against the same walk without them,
  alone and in a whole epoch: the cost of never returning duplicated or skipped records;
* one epoch of ``RecordDataset(batch_size=B)`` (no workers: the reading process's own
  cost) with ``check=None`` and with ``check="structure"``, each made afresh and the
  check's per-process memo cleared, so every epoch pays the check once, as a new
  training process would;
* the same epoch with ``check="checksums"`` (every record's CRC-32), with the CRC-32
  torchrecord chose (ISA-L's with the ``fastcrc`` extra) and with zlib's;
* every record's checksum alone, computed where the record lies in LMDB's map, one call a
  record (the check's own work, without reading a sample): with each CRC-32, and with the
  hardware CRC-32C of the ``crc32c`` package where it is installed (not a dependency: a
  checksum another format version could store). ``floor`` is the epoch with that work added
  to the epoch without checks, over the epoch without checks: what checking costs when it
  is done in the reading thread, whatever the code around it;
* the epoch without checks while a helper thread computes every record's CRC-32 (torchrecord's)
  beside it, nothing waiting for the other: what the second core could hide at best, were no
  batch to wait for its records' checksums.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import torchrecord
from benchmarks.loaders.torchrecord_loader import library_samples_per_record, record_key, write_records
from benchmarks.workloads import WORKLOADS, load_workload
from torchrecord._core import crc as _crc_module
from torchrecord._core.crc import CRC32_BACKEND
from torchrecord._store import checked as _checked
from torchrecord._store import checks_ahead as _checks_ahead
from torchrecord._store import fastread as _fastread
from torchrecord._store import walk as _walk_module
from torchrecord._store.format import encode_key
from torchrecord._store.lmdb_check import check_structure
from torchrecord._store.walk import Walk

__all__ = ["main"]

_BESIDE = "epoch, checksums on a helper"


def _unchecked(cursor: Any, first: int, stop: int, path: str) -> list[Any]:
    """The cursor walk's read of records [first, stop) without its key checks (the baseline)."""
    cursor.set_range(encode_key(first))
    return [v for _, v in islice(cursor.iternext(keys=True, values=True), stop - first)]


@contextlib.contextmanager
def _keys_unchecked() -> Iterator[None]:
    """Readers made inside skip the key checks (a benchmark baseline only)."""
    checked = _walk_module._read_checked
    _walk_module._read_checked = _unchecked  # type: ignore[assignment]
    try:
        yield
    finally:
        _walk_module._read_checked = checked  # type: ignore[assignment]


def _walk(path: str, keys_checked: bool) -> int:
    """Read every record's value through the cursor walk, a piece at a time; returns the records read."""
    rf = torchrecord.RecordFile(path)
    env, db = rf.environment()
    with contextlib.nullcontext() if keys_checked else _keys_unchecked(), Walk(env, db, path) as walk:
        return sum(len(values) for _, values in walk.pieces([(0, rf.num_records)]))


@contextlib.contextmanager
def _zlib_crc() -> Iterator[None]:
    """Checksums checked with zlib.crc32 (the baseline without the fastcrc extra)."""
    fast = _walk_module.crc32
    # each record's (a walk's, or a window's at once: fastread), and each block's (crc32_joined)
    # (checks_ahead's helper thread: records of long samples)
    _walk_module.crc32 = _crc_module.crc32 = _fastread.crc32 = _checks_ahead.crc32 = zlib.crc32
    try:
        yield
    finally:
        _walk_module.crc32 = _crc_module.crc32 = _fastread.crc32 = _checks_ahead.crc32 = fast


def _epoch(path: str, batch_size: int, check: str | None, keys_checked: bool = True, zlib_crc: bool = False) -> int:
    _checked._PASSED.clear()  # a new process: nothing checked yet
    with (
        contextlib.nullcontext() if keys_checked else _keys_unchecked(),
        _zlib_crc() if zlib_crc else contextlib.nullcontext(),
    ):
        ds = torchrecord.RecordDataset(path, batch_size=batch_size, check=check)
        return sum(len(labels) for _, labels in ds)


def _checksum_functions() -> dict[str, Callable[[Any], int]]:
    """The checksums timed alone: torchrecord's CRC-32, zlib's, and crc32c's CRC-32C where it is installed."""
    functions: dict[str, Callable[[Any], int]] = {CRC32_BACKEND: _crc_module.crc32, "zlib": zlib.crc32}
    try:
        import crc32c  # optional: a hardware CRC-32C (SSE 4.2)
    except ImportError:
        return functions
    functions["crc32c (CRC-32C)"] = crc32c.crc32c
    return functions


@contextlib.contextmanager
def _mapped_records(path: str) -> Iterator[list[Any]]:
    """Every record's value as a view of LMDB's map (valid inside the block)."""
    rf = torchrecord.RecordFile(path)
    env, db = rf.environment()
    with env.begin(db=db, buffers=True) as txn:
        cursor = txn.cursor()
        cursor.set_range(encode_key(0))
        yield [value for _, value in islice(cursor.iternext(keys=True, values=True), rf.num_records)]


def _checksums_alone(values: list[Any], checksum: Callable[[Any], int]) -> int:
    """Compute every value's checksum, one call a value (as a check in the reading thread does)."""
    for value in values:
        checksum(value)
    return len(values)


def _epoch_beside_checksums(path: str, batch_size: int, values: list[Any]) -> int:
    """An epoch without checks while a helper thread computes every value's CRC-32 (torchrecord's)."""
    helper = threading.Thread(target=_checksums_alone, args=(values, _crc_module.crc32))
    helper.start()
    try:
        return _epoch(path, batch_size, None)
    finally:
        helper.join()


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["small-images", "tiny-vectors"], choices=list(WORKLOADS))
    parser.add_argument("--scale", type=float, default=0.2, help="multiply every workload's size (default 0.2)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median; default 5)")
    parser.add_argument("--data-dir", default="/tmp/torchrecord-bench", help="cache of generated data")
    parser.add_argument(
        "--samples-per-record",
        type=int,
        default=1,
        help="samples a record (default 1; 0: as write_record packs them when left to itself)",
    )
    args = parser.parse_args(argv)
    for name in args.workloads:
        data = load_workload(WORKLOADS[name], args.scale, Path(args.data_dir))
        per_record = args.samples_per_record or library_samples_per_record(data)
        dest = data.root / f"checks-{record_key(per_record)}"
        path = dest / "data.tr"
        if not path.exists():
            dest.mkdir(parents=True, exist_ok=True)
            write_records(data, dest, per_record)
        size = path.stat().st_size
        print(
            f"{name}: {data.count:,} samples, {per_record} a record, {size / 1e6:,.1f} MB, batch {data.batch_size}; "
            f"{args.rounds} rounds, medians"
        )
        file = str(path)
        configs: dict[str, Callable[[], Any]] = {
            "check_structure": lambda f=file: check_structure(f),
            "walk, keys checked": lambda f=file: _walk(f, True),
            "walk, keys not checked": lambda f=file: _walk(f, False),
            "epoch, check=None": lambda f=file, b=data.batch_size: _epoch(f, b, None),
            "epoch, keys not checked": lambda f=file, b=data.batch_size: _epoch(f, b, None, False),
            'epoch, check="structure"': lambda f=file, b=data.batch_size: _epoch(f, b, "structure"),
            'epoch, check="checksums"': lambda f=file, b=data.batch_size: _epoch(f, b, "checksums"),
            'epoch, "checksums", zlib': lambda f=file, b=data.batch_size: _epoch(f, b, "checksums", zlib_crc=True),
        }
        alone = {f"checksums alone, {name}": function for name, function in _checksum_functions().items()}
        with _mapped_records(file) as values:
            for name, function in alone.items():
                configs[name] = lambda v=values, c=function: _checksums_alone(v, c)
            configs[_BESIDE] = lambda f=file, b=data.batch_size, v=values: _epoch_beside_checksums(f, b, v)
            for fn in configs.values():  # warm the page cache and the imports
                fn()
            seconds: dict[str, list[float]] = {k: [] for k in configs}
            for _ in range(args.rounds):
                for label, fn in configs.items():
                    seconds[label].append(_time(fn))
        median = {k: statistics.median(v) for k, v in seconds.items()}
        for label, s in median.items():
            print(f"  {label:<36} {s * 1e3:9.1f} ms")
        check = median["check_structure"]
        print(
            f"  check_structure: {check / (size / 1e8):.3f} s per 100 MB, {check / data.count * 1e6:.2f} us per record"
        )
        keys = median["walk, keys checked"] / median["walk, keys not checked"]
        epoch_keys = median["epoch, check=None"] / median["epoch, keys not checked"]
        print(
            f"  key checks: walk x{keys:.3f} ({(keys - 1) * 100:+.1f}%), "
            f"epoch x{epoch_keys:.3f} ({(epoch_keys - 1) * 100:+.1f}%)"
        )
        epoch = median['epoch, check="structure"'] / median["epoch, check=None"]
        print(f'  check="structure": epoch x{epoch:.3f} ({(epoch - 1) * 100:+.1f}%, once per process)')
        crc = median['epoch, check="checksums"'] / median["epoch, check=None"]
        crc_zlib = median['epoch, "checksums", zlib'] / median["epoch, check=None"]
        print(f"  check=\"checksums\": epoch x{crc:.3f} with {CRC32_BACKEND}'s CRC-32, x{crc_zlib:.3f} with zlib's")
        unchecked = median["epoch, check=None"]
        for label in alone:
            bytes_per_second = size / median[label]
            print(
                f"  {label}: {bytes_per_second / 1e9:.1f} GB/s of the file; "
                f"floor x{(unchecked + median[label]) / unchecked:.3f} in the reading thread"
            )
        print(f"  an epoch beside {CRC32_BACKEND}'s checksums on a helper thread: x{median[_BESIDE] / unchecked:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
