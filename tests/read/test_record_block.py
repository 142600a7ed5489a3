"""RecordBlock: every record holding some samples read once by key, then gathered into cells.

Checked against ``RecordFile[i]`` on every storage variant the fixed-layout path
has: one sample per record, packed records with a short final one, long records
kept as views of the map, compressed fields, bool fields, and a sharded set;
and on damaged files (a missing record, a wrong checksum).
"""

from __future__ import annotations

import importlib.util
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchrecord
from tests.read.test_reliability import put
from torchrecord._core.layout import FixedLayout
from torchrecord._read.record_block import RecordBlock
from torchrecord._store import format as _format
from torchrecord._store.fastread import JOIN_LIMIT, FixedWindowReader
from torchrecord._write.shards import write_shard
from torchrecord.errors import ChecksumError, CorruptRecordError

COUNT = 103  # not a multiple of any packing below: every set ends in a short record


def _rows(count: int, width: int = 3) -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    return [
        {"x": rng.standard_normal(width).astype(np.float32), "i": np.int64(i), "flag": np.bool_(i % 3 == 0)}
        for i in range(count)
    ]


def _variants() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = [
        ("one per record", {"samples_per_record": 1}),
        ("packed", {"samples_per_record": 7}),
        ("long records", {"samples_per_record": 2, "width": JOIN_LIMIT // 4}),  # views of the map
    ]
    if importlib.util.find_spec("cramjam") is not None:
        out.append(("compressed", {"samples_per_record": 5, "compression": "zstd"}))
    return out


def _write(tmp_path: Path, kw: dict[str, Any]) -> torchrecord.RecordFile:
    kw = dict(kw)
    width = kw.pop("width", 3)
    path = tmp_path / "set.tr"
    torchrecord.write_record(_rows(COUNT, width), path, seed=4, progress=False, **kw)
    return torchrecord.RecordFile(path)


def _expected(file: torchrecord.RecordSet, samples: np.ndarray) -> list[np.ndarray]:
    """The columns RecordFile[i] gives, zeros where a sample is -1."""
    first = file[0]
    columns = []
    for name in ("x", "i", "flag"):
        like = np.asarray(first[name])
        rows = [np.asarray(file[int(s)][name]) if s >= 0 else np.zeros_like(like) for s in samples]
        columns.append(np.stack(rows))
    return columns


def _block(file: torchrecord.RecordSet, samples: np.ndarray, **kw: Any) -> RecordBlock:
    layout = FixedLayout.of_file(file)
    assert layout is not None
    return RecordBlock(file, layout, samples[samples >= 0], reader=FixedWindowReader(layout, 16), **kw)


def _field_order(file: torchrecord.RecordSet) -> list[int]:
    names = [f.name for f in file.schema.fields]
    return [names.index(n) for n in ("x", "i", "flag")]


@pytest.mark.parametrize(("name", "kw"), _variants(), ids=[n for n, _ in _variants()])
def test_cells_equal_the_stored_samples(tmp_path: Path, name: str, kw: dict[str, Any]) -> None:
    file = _write(tmp_path, kw)
    rng = np.random.default_rng(2)
    samples = rng.integers(-1, COUNT, size=(4, 30))  # any order, repeats, padding (-1)
    samples[2] = -1  # a batch of padding only
    samples[3, :5] = COUNT - 1  # the short final record
    k = file.samples_per_record
    with _block(file, samples.reshape(-1), verify=True) as block:
        got = block.columns_many(samples)
    wanted_records = {int(s) // k for s in samples.reshape(-1) if s >= 0}
    assert block.records_read == len(wanted_records)  # each record holding a wanted sample, once
    order = _field_order(file)
    for row, columns in zip(samples, got):
        for got_column, want in zip([columns[j] for j in order], _expected(file, row)):
            assert got_column.dtype == want.dtype and got_column.shape == want.shape
            assert np.array_equal(got_column, want)


def test_a_sharded_set_is_read_across_its_shards(tmp_path: Path) -> None:
    rows = _rows(COUNT)
    for shard in range(3):
        write_shard(rows, tmp_path / "shards", shard=shard, num_shards=3, seed=5, samples_per_record=4, progress=False)
    file = torchrecord.open_set(tmp_path / "shards")
    assert file.num_shards == 3
    samples = np.random.default_rng(3).permutation(COUNT)[:60]
    samples = np.concatenate([samples, [-1, COUNT - 1, 0]])
    with _block(file, samples, verify=False) as block:
        (columns,) = block.columns_many(samples[None])
    order = _field_order(file)
    for got_column, want in zip([columns[j] for j in order], _expected(file, samples)):
        assert np.array_equal(got_column, want)


def test_a_missing_record_is_named(tmp_path: Path) -> None:
    file = _write(tmp_path, {"samples_per_record": 4})
    path = Path(file.path)
    file.close()
    put(path, _format.RECORDS_DB, _format.encode_key(6), None)
    put(path, _format.RECORDS_DB, _format.encode_key(26), b"x")  # one beyond the last: the entry count holds
    file = torchrecord.RecordFile(path)
    with pytest.raises(CorruptRecordError, match=rf"{path.name}: record 6 is missing"):
        _block(file, np.array([3, 25, 27, 60]), verify=False)  # samples 25, 27: record 6


def test_a_wrong_checksum_is_caught_with_verify(tmp_path: Path) -> None:
    file = _write(tmp_path, {"samples_per_record": 4})
    path = Path(file.path)
    file.close()
    put(path, _format.CRC_DB, _format.encode_key(2), zlib.crc32(b"other").to_bytes(4, "little"))
    file = torchrecord.RecordFile(path)
    with pytest.raises(ChecksumError, match=rf"{path.name}: record 2"):
        _block(file, np.array([9, 40]), verify=True)
    with _block(file, np.array([9, 40]), verify=False) as block:  # without verify the bytes are still read
        (columns,) = block.columns_many(np.array([[9, 40]]))
    assert block.records_read == 2
    assert np.array_equal(columns[_field_order(file)[1]], [file[9]["i"], file[40]["i"]])
