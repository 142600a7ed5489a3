"""Block checksums: the CRC-32 of every block of records (about 4 KiB, at most 256 records), written beside
each record's, checked by readers."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import torch

import torchrecord
from tests.read.test_reliability import _flip_in_file, encoded, put, write
from torchrecord._store import format as _format
from torchrecord.errors import ChecksumError, FormatError


def _records(path: Path) -> list[bytes]:
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=_format.MAX_DBS)
    try:
        records_db = env.open_db(_format.RECORDS_DB, create=False)
        with env.begin(db=records_db) as txn:
            return [bytes(v) for _, v in txn.cursor()]
    finally:
        env.close()


def _raw_meta(path: Path) -> dict[str, Any]:
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=_format.MAX_DBS)
    try:
        return _format.read_metadata(env, str(path))
    finally:
        env.close()


def _stored_blocks(path: Path) -> bytes | None:
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=_format.MAX_DBS)
    try:
        meta_db = env.open_db(_format.META_DB, create=False)
        with env.begin(db=meta_db) as txn:
            return txn.get(_format.CRC_BLOCKS_KEY)
    finally:
        env.close()


def _expected_blocks(values: list[bytes], block: int) -> bytes:
    crcs = [zlib.crc32(b"".join(values[at : at + block])) for at in range(0, len(values), block)]
    return np.asarray(crcs, dtype="<u4").tobytes()


@pytest.mark.filterwarnings("ignore:.*writing an empty record set")
@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 700])
def test_every_block_holds_the_crc_of_its_records_joined(tmp_path: Path, n: int) -> None:
    path = write(tmp_path / "set.tr", n=n)
    block = _raw_meta(path)["checksum_block"]
    values = _records(path)
    assert block == max(1, min(256, int((4 << 10) / (sum(map(len, values)) / max(1, n) or 1))))
    assert _stored_blocks(path) == _expected_blocks(values, block)


@pytest.mark.parametrize(("size", "blocks"), [(1, range(256, 257)), (100, range(30, 41)), (5000, range(1, 2))])
def test_a_block_holds_about_4_kib_of_records(tmp_path: Path, size: int, blocks: range) -> None:
    samples = [{"x": torch.full((size,), i % 256, dtype=torch.uint8)} for i in range(300)]
    path = tmp_path / "set.tr"
    torchrecord.write_record(samples, path, progress=False, samples_per_record=1)
    values = _records(path)
    block = _raw_meta(path)["checksum_block"]
    assert block in blocks and block == max(1, min(256, int((4 << 10) / (sum(map(len, values)) / len(values)))))
    assert _stored_blocks(path) == _expected_blocks(values, block)


def test_a_set_written_without_checksums_has_no_blocks(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", n=300, checksums=False)
    assert "checksum_block" not in _raw_meta(path)
    assert _stored_blocks(path) is None
    assert torchrecord.RecordFile(path).crc_blocks() is None


@pytest.mark.filterwarnings("ignore::torchrecord.errors.VariableShapeWarning")
def test_blocks_are_summed_again_when_automatic_chunks_are_split(tmp_path: Path) -> None:
    """A sample of another shape makes the writer split its chunks into single records (regroup): every
    block is summed again from the records as they are stored."""
    samples: list[Any] = [{"x": torch.full((16,), float(i))} for i in range(3000)]
    samples.append({"x": torch.zeros(17)})
    samples += [{"x": torch.full((16,), float(i))} for i in range(300)]
    path = tmp_path / "set.tr"
    torchrecord.write_record(samples, path, progress=False, shuffle=False)
    meta = _raw_meta(path)
    assert meta["samples_per_record"] == 1 and meta["records"] == 3301
    assert _stored_blocks(path) == _expected_blocks(_records(path), meta["checksum_block"])


def test_runs_read_from_any_record_with_checksums_equal_those_read_without(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", n=1100, offset=5)
    plain, checked = torchrecord.RecordFile(path), torchrecord.RecordFile(path, check="checksums")
    for lo, hi in [(0, 1100), (3, 4), (255, 257), (100, 900), (1023, 1100), (1099, 1100)]:
        got, want = checked[lo:hi], plain[lo:hi]
        assert [int(s[1]) for s in got] == [int(s[1]) for s in want]
    for rank in range(3):  # windows of every rank start and end anywhere
        kwargs = {"batch_size": 32, "seed": 3, "rank": rank, "world_size": 3}
        a = list(torchrecord.RecordDataset(path, check="checksums", **kwargs))
        b = list(torchrecord.RecordDataset(path, **kwargs))
        assert all(torch.equal(x[1], y[1]) for x, y in zip(a, b)) and len(a) == len(b)


def test_a_damaged_record_is_named_through_its_block(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", n=600, offset=1000)
    value = encoded(1000 + 300)
    _flip_in_file(path, value, len(value) // 2)
    assert len(list(torchrecord.RecordDataset(path, batch_size=16))) == 38  # unchecked: read as it is
    with pytest.raises(ChecksumError, match=rf"{path}: record 300: CRC-32 is"):
        list(torchrecord.RecordDataset(path, batch_size=16, check="checksums"))


def test_damaged_block_checksums_are_an_error_when_checked(tmp_path: Path) -> None:
    path = write(tmp_path / "set.tr", n=600)
    block = _raw_meta(path)["checksum_block"]
    blocks = bytearray(_stored_blocks(path) or b"")
    blocks[5] ^= 1  # block 1
    put(path, _format.META_DB, _format.CRC_BLOCKS_KEY, bytes(blocks))
    assert len(torchrecord.RecordFile(path)[:]) == 600
    first, last = block, min(600, 2 * block) - 1
    message = rf"{path}: records {first} to {last}: the checksum of their block does not match while every record's"
    with pytest.raises(ChecksumError, match=message):
        torchrecord.RecordFile(path, check="checksums")[:]
    report = torchrecord.verify(path)
    assert (report.bad, report.first_bad) == (1, block)
    assert "the block checksums are damaged" in report.errors[0][1]


@pytest.mark.parametrize("stored", [None, b"\0" * 4])
def test_missing_or_short_block_checksums_are_an_error_when_checked(tmp_path: Path, stored: bytes | None) -> None:
    path = write(tmp_path / "set.tr", n=600)
    need = 4 * -(-600 // _raw_meta(path)["checksum_block"])
    put(path, _format.META_DB, _format.CRC_BLOCKS_KEY, stored)
    assert len(list(torchrecord.RecordDataset(path, batch_size=16))) == 38
    found = "none" if stored is None else "4 bytes"
    damaged = rf"{path}: the block checksums are damaged: .* need {need} bytes .*{found}"
    with pytest.raises(ChecksumError, match=damaged):
        list(torchrecord.RecordDataset(path, batch_size=16, check="checksums"))
    assert not torchrecord.verify(path).ok


def test_a_set_from_before_block_checksums_is_checked_record_by_record(tmp_path: Path) -> None:
    """A set written before block checksums (no ``checksum_block``, no entry) opens, and checksums are
    checked one a record, as they were."""
    path = write(tmp_path / "set.tr", n=600, offset=1000)
    meta = _raw_meta(path)
    del meta["checksum_block"]
    put(path, _format.META_DB, _format.META_KEY, _format.pack_metadata(meta))
    put(path, _format.META_DB, _format.CRC_BLOCKS_KEY, None)
    assert torchrecord.RecordFile(path).crc_blocks() is None
    assert len(list(torchrecord.RecordDataset(path, batch_size=16, check="checksums"))) == 38
    assert torchrecord.verify(path).ok
    value = encoded(1000 + 433)
    _flip_in_file(path, value, len(value) // 2)
    with pytest.raises(ChecksumError, match=rf"{path}: record 433: CRC-32 is"):
        list(torchrecord.RecordDataset(path, batch_size=16, check="checksums"))


@pytest.mark.parametrize("block", [0, 4097, "256", True])
def test_a_checksum_block_out_of_range_is_refused(tmp_path: Path, block: Any) -> None:
    path = write(tmp_path / "set.tr", n=10)
    meta = _raw_meta(path)
    meta["checksum_block"] = block
    put(path, _format.META_DB, _format.META_KEY, _format.pack_metadata(meta))
    with pytest.raises(FormatError, match=rf"{path}: metadata checksum_block"):
        torchrecord.RecordFile(path).read_header()
