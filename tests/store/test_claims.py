"""Nothing a file claims is trusted beyond what it can hold (issue 20, point 3).

The count against the records database's entries, the shapes and samples per record
against the file's bytes, buffers sized by the samples actually read, metadata size
bounded: each false claim is a FormatError naming it, never an OverflowError, a hang
or a huge allocation. Reads that a regression could turn into a huge allocation run in
a forked child with an address-space limit.
"""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch

import torchrecord
from tests.untrusted import error_or_value, outcome, put_meta_bytes, raw_meta, set_field, set_meta, write_set
from torchrecord._store import format as _format
from torchrecord.errors import FormatError

MiB = 1 << 20


def _open_all_ways(path: str) -> list[str]:
    """The error class each reader raises on the file ("ok" if it read)."""
    ways = [
        lambda: len(torchrecord.RecordFile(path)),
        lambda: list(torchrecord.RecordFile(path)),
        lambda: list(torchrecord.RecordDataset(path, batch_size=16)),
        lambda: list(torchrecord.RecordDataset(path)),
        lambda: torchrecord.verify(path, progress=False).ok,
    ]
    return [str(error_or_value(lambda w=way: w())[0]) for way in ways]


@pytest.mark.parametrize("count", [601, 10**12, 2**63, 2**64 - 1])
def test_a_count_beyond_the_records_is_a_format_error(tmp_path: Path, count: int) -> None:
    path = write_set(tmp_path / "set.tr", n=600)
    set_meta(path, count=count, records=count)
    result = outcome(_open_all_ways, path, memory_limit=2 << 30, timeout=120)
    assert result.status == "returned", result  # no hang, no 17 GB, no bare OverflowError
    assert result.value == ["FormatError"] * 4 + (["ok"] if count == 601 else ["FormatError"]), result.value


def test_verify_still_reports_each_missing_record(tmp_path: Path) -> None:
    """verify lets the count claim missing records (as many as the file holds), and names each."""
    path = write_set(tmp_path / "set.tr", n=600)
    set_meta(path, count=650, records=650)
    report = torchrecord.verify(path, progress=False)
    assert report.bad == 50 and report.first_bad == 600 and "missing" in str(report.first_error)
    with pytest.raises(FormatError, match="holds 600 records"):
        torchrecord.RecordFile(path)[0]


def test_a_shape_the_file_cannot_hold_is_refused_before_any_allocation(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=600)  # about 100 KB
    set_field(path, 0, shape=[2**15, 2**15])  # 1 GiB per sample
    result = outcome(_open_all_ways, path, memory_limit=512 * MiB)
    assert result.status == "returned", result
    assert result.value == ["FormatError"] * 5, result.value  # not MemoryError (7.3 GB per reader before)


@pytest.mark.parametrize("shape", [[2**40, 2**40], [0, 2**62, 2**62], [2**31] * 3])
def test_shapes_beyond_an_array_are_format_errors(tmp_path: Path, shape: list[int]) -> None:
    path = write_set(tmp_path / "set.tr", n=10)
    set_field(path, 0, shape=shape)
    with pytest.raises(FormatError, match="more than an array holds"):
        _ = torchrecord.RecordFile(path).schema


def test_an_empty_set_claiming_a_huge_shape_is_refused(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=10)
    set_meta(path, count=0, records=0)
    set_field(path, 0, shape=[2**20, 2**20])
    result = outcome(
        error_or_value, lambda p: len(list(torchrecord.RecordDataset(p, batch_size=4))), path, memory_limit=512 * MiB
    )
    assert result.status == "returned" and result.value in (["ok", 0], ["FormatError", result.value[1]]), result


def test_samples_per_record_beyond_the_file_is_refused(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=600, samples_per_record=4)
    set_meta(path, samples_per_record=2**40, count=600, records=1)
    assert _open_all_ways(path) == ["FormatError"] * 5
    path2 = write_set(tmp_path / "set2.tr", n=600, samples_per_record=4)
    set_meta(path2, samples_per_record=10**6, count=600, records=1)  # within the limit, but not in this file
    result = outcome(_open_all_ways, path2, memory_limit=512 * MiB)
    assert result.status == "returned", result  # no 10**6-sample probes
    assert result.value[0] == "ok" and result.value[1:4] == ["CorruptRecordError"] * 3, result.value


def _read_big_chunk(path: str) -> list[int]:
    ds = torchrecord.RecordDataset(path, batch_size=500)
    return sorted(int(x) for _, label in ds for x in label)


def test_a_short_chunk_of_many_samples_per_record_reads_without_the_claimed_memory(tmp_path: Path) -> None:
    """write_record(samples_per_record=10**5) of 2,000 samples: one record of 2,000; no 10**5-sample buffers."""
    path = write_set(tmp_path / "set.tr", n=2000, size=4096, samples_per_record=10**5)  # 8 MB of samples
    result = outcome(_read_big_chunk, path, memory_limit=600 * MiB)  # 10**5 samples of probes: 2 x 400 MB
    assert result.status == "returned", result
    assert result.value == list(range(2000))
    one = write_set(tmp_path / "one.tr", n=1, size=16, samples_per_record=8)  # a chunk of one sample
    assert [int(x) for _, label in torchrecord.RecordDataset(one, batch_size=4) for x in label] == [0]


def _huge_batch(path: str) -> int:
    ds = torchrecord.RecordDataset(path, batch_size=10**7, shuffle=True)
    return sum(len(label) for _, label in ds)


def test_a_huge_batch_size_allocates_for_the_samples_read(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=2000, size=3072)
    result = outcome(_huge_batch, path, memory_limit=600 * MiB)  # 10**7 samples of 3 KB: 28.9 GiB before
    assert result.status == "returned" and result.value == 2000, result


def _empty_maps(n: int) -> bytes:
    """The msgpack of an array of n empty maps (built without making the Python objects)."""
    return b"\xdd" + struct.pack(">I", n) + b"\x80" * n


def _meta_with_user_array(path: str, array: bytes) -> bytes:
    meta = raw_meta(path)
    meta["user"] = {}
    packed = msgpack.packb(meta, use_bin_type=True)
    # replace the empty user map by {"x": array}
    empty = msgpack.packb("user") + b"\x80"
    assert packed.count(empty) == 1
    return packed.replace(empty, msgpack.packb("user") + b"\x81" + msgpack.packb("x") + array)


def test_metadata_of_millions_of_empty_maps_is_refused_cheaply(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=10)
    put_meta_bytes(path, _meta_with_user_array(path, _empty_maps(3_000_000)))  # 3 MB, 200+ MB of dicts
    result = outcome(error_or_value, lambda p: len(torchrecord.RecordFile(p)), path, memory_limit=160 * MiB)
    assert result.status == "returned", result
    assert result.value[0] == "FormatError" and "maps and arrays" in result.value[1], result.value


def test_metadata_beyond_its_byte_limit_is_refused(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=10)
    blob = b"\xc6" + struct.pack(">I", 17 * MiB) + bytes(17 * MiB)
    put_meta_bytes(path, _meta_with_user_array(path, blob))
    with pytest.raises(FormatError, match="more than the 16777216"):
        _ = torchrecord.RecordFile(path).metadata


def test_metadata_within_the_limits_still_reads(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=10, metadata={"classes": [{"name": str(i)} for i in range(100_000)]})
    assert len(torchrecord.RecordFile(path).user_metadata["classes"]) == 100_000


def test_the_writer_refuses_what_readers_would(tmp_path: Path) -> None:
    samples = [np.zeros(4, np.uint8)] * 3
    with pytest.raises(ValueError, match="maps and lists"):
        many = [{}] * (_format.MAX_METADATA_CONTAINERS + 1)
        torchrecord.write_record(samples, tmp_path / "a.tr", metadata={"x": many})
    with pytest.raises(ValueError, match="readers accept"):
        torchrecord.write_record(samples, tmp_path / "b.tr", metadata={"x": b"\0" * (17 * MiB)})
    with pytest.raises(ValueError, match="samples_per_record must be from 1 to"):
        torchrecord.write_record(samples, tmp_path / "c.tr", samples_per_record=2**24 + 1)
    assert not any(tmp_path.iterdir())


def test_every_malformed_number_in_the_metadata_is_a_format_error(tmp_path: Path) -> None:
    base = write_set(tmp_path / "set.tr", n=10)
    original = raw_meta(base)
    cases: list[dict[str, object]] = [
        {"count": -1},
        {"count": 1.5},
        {"count": 2**64 - 1, "records": 2**64 - 1},
        {"samples_per_record": 0},
        {"samples_per_record": 2**64 - 1},
        {"records": 2**63},
    ]
    for i, change in enumerate(cases):
        path = str(tmp_path / f"case{i}.tr")
        Path(path).write_bytes(Path(base).read_bytes())
        put_meta_bytes(path, msgpack.packb({**original, **change}, use_bin_type=True))
        got = error_or_value(lambda p=path: len(torchrecord.RecordFile(p)))
        assert got[0] == "FormatError", (change, got)


def test_write_time_record_file_reads_a_huge_chunk_claim_lazily(tmp_path: Path) -> None:
    path = write_set(tmp_path / "set.tr", n=3, size=8, samples_per_record=10**5)
    rf = torchrecord.RecordFile(path)
    assert [int(s[1]) for s in rf] == [0, 1, 2] and torch.equal(rf[2][0], torch.full((8,), 2, dtype=torch.uint8))


def test_long_records_far_apart_in_the_map_gather_without_copying_the_span(tmp_path: Path) -> None:
    """A window of long records spans many MB of the map; a batch gathered from it copies only its samples.

    The gather sees the span as overlapping rows (one at every byte); a gather that copied that view would
    need span x record bytes (here terabytes) and fail at once.
    """
    rng = np.random.default_rng(3)
    samples = [rng.integers(0, 256, (4, 256, 256), dtype=np.uint8) for _ in range(48)]  # 256 KiB each
    path = tmp_path / "long.tr"
    torchrecord.write_record([{"x": torch.from_numpy(s)} for s in samples], path, shuffle=False)
    ds = torchrecord.RecordDataset(path, batch_size=16, shuffle=True, shuffle_buffer=48, seed=1)
    seen = 0
    for batch in ds:
        for row in batch["x"]:
            assert any(torch.equal(row, torch.from_numpy(s)) for s in samples)
            seen += 1
    assert seen == 48
