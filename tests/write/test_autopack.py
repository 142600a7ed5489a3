"""Automatic samples_per_record: the default file stays near its payload size, for any fixed sample size."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import torchrecord
from torchrecord import RecordDataset, RecordFile, RecordWriter, write_record
from torchrecord._core.codec import encode_payloads
from torchrecord._core.layout import FixedLayout
from torchrecord._core.schema import Field, LeafSignature, Schema
from torchrecord._write.autopack import ChunkJoiner, choose, disk_bytes, record_length
from torchrecord.errors import VariableShapeWarning

SIZES = [8, 24, 72, 200, 700, 2000, 2100, 3000, 4100, 5000, 9000, 12300, 20000, 33000, 70000, 150528, 1 << 20]


def _schema(*sizes: int) -> Schema:
    fields = [Field(f"f{i}", "ndarray", "uint8", (s,)) for i, s in enumerate(sizes)]
    return Schema({"t": "tuple", "c": [{"t": "leaf"}] * len(sizes)}, fields)


def _pages(rf: RecordFile) -> int:
    """Pages of the records and checksum databases, as LMDB counts them."""
    env = rf.environment()[0]
    with env.begin() as txn:
        stats = [txn.stat(env.open_db(name, txn=txn, create=False)) for name in (b"records", b"crc32")]
    return sum(s["leaf_pages"] + s["overflow_pages"] + s["branch_pages"] for s in stats)


def test_record_length_is_the_encoders() -> None:
    schema = Schema(
        {"t": "dict", "k": ["a", "b", "c"], "c": [{"t": "leaf"}] * 3},
        [
            Field("a", "tensor", "float32", (3, 5)),
            Field("b", "int", "int64", ()),
            Field("c", "ndarray", "bfloat16", (200,)),
        ],
    )
    for rows in (1, 2, 7, 130, 1000):
        layout = FixedLayout.build(schema, rows)
        assert layout is not None and record_length(schema.fields, rows) == layout.length, rows


@pytest.mark.parametrize("size", [8, 72, 500, 2000, 3000, 5000, 20000])
def test_the_page_model_matches_lmdbs_own_count(tmp_path: Path, size: int) -> None:
    n = max(8, (1 << 20) // size)
    data = np.zeros((n, size), np.uint8)
    for k in (None, 1):
        rf = write_record(data, tmp_path / f"{k}.tr", shuffle=False, samples_per_record=k, progress=False)
        model = disk_bytes(record_length(rf.schema.fields, rf.samples_per_record), 4096, True) * rf.num_records
        measured = _pages(rf) * 4096
        assert abs(model / measured - 1) < 0.03, (size, k, model, measured)


def test_the_choice_packs_every_size_within_ten_percent_by_the_model() -> None:
    for size in [*range(1, 300, 7), *range(300, 70000, 173), 150528, 300000, 1 << 20]:
        schema = _schema(size)
        k = choose(schema, 4096)
        per_sample = disk_bytes(record_length(schema.fields, k), 4096, True) / k
        assert per_sample <= 1.10 * size + 1, (size, k, per_sample / size)


@pytest.mark.parametrize("size", SIZES)
def test_the_default_file_is_within_1_15x_of_its_payload(tmp_path: Path, size: int) -> None:
    n = max(3, (2 << 20) // size)
    rng = np.random.default_rng(size)
    data = rng.integers(0, 255, (n, size), dtype=np.uint8)
    rf = write_record(data, tmp_path / "a.tr", shuffle=False, progress=False)
    ratio = os.path.getsize(rf.path) / (n * size)
    assert ratio <= 1.15, (size, rf.samples_per_record, ratio)
    assert rf.metadata["samples_per_record"] == rf.samples_per_record and len(rf) == n
    for i in [0, n - 1, *rng.integers(0, n, 5).tolist()]:
        np.testing.assert_array_equal(rf[i], data[i])


def test_small_samples_were_far_bigger_at_one_per_record(tmp_path: Path) -> None:
    data = [(torch.randn(16), i) for i in range(5000)]
    packed = write_record(data, tmp_path / "auto.tr", progress=False)
    single = write_record(data, tmp_path / "one.tr", samples_per_record=1, progress=False)
    payload = 5000 * (16 * 4 + 8)
    assert single.samples_per_record == 1 and os.path.getsize(single.path) / payload > 1.5
    assert packed.samples_per_record > 1 and os.path.getsize(packed.path) / payload < 1.15


def test_the_explicit_argument_wins(tmp_path: Path) -> None:
    data = [np.zeros(16, np.float32)] * 100
    assert write_record(data, tmp_path / "a.tr", samples_per_record=7, progress=False).samples_per_record == 7
    assert write_record(data, tmp_path / "b.tr", samples_per_record=1, progress=False).samples_per_record == 1
    with pytest.raises(TypeError, match="samples_per_record"):
        write_record(data, tmp_path / "c.tr", samples_per_record=2.0, progress=False)  # type: ignore[arg-type]


def test_strings_and_stated_variable_shapes_stay_at_one_sample_per_record(tmp_path: Path) -> None:
    words = write_record([{"x": np.zeros(4, np.float32), "w": "abc"}] * 50, tmp_path / "w.tr", progress=False)
    assert words.samples_per_record == 1
    stated = write_record([np.zeros(4, np.float32)] * 50, tmp_path / "s.tr", schema={"value": (None,)}, progress=False)
    assert stated.samples_per_record == 1


@pytest.mark.parametrize("commit_bytes", [64 << 20, 256], ids=["pending", "committed"])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_later_shape_change_goes_back_to_one_sample_per_record(
    tmp_path: Path, commit_bytes: int, compression: str | None
) -> None:
    """The first 300 samples are float32[8]: packed; then one is float32[9]: every record is rewritten."""
    if compression:
        pytest.importorskip("cramjam")
    data = [np.full(8 if i != 300 else 9, i, np.float32) for i in range(400)]
    with pytest.warns(VariableShapeWarning):
        rf = write_record(
            data, tmp_path / "v.tr", shuffle=False, commit_bytes=commit_bytes, compression=compression, progress=False
        )
    assert rf.samples_per_record == 1 and rf.num_records == 400 and rf.schema.fields[0].shape == (None,)
    for i in range(400):
        np.testing.assert_array_equal(rf[i], data[i])
    assert torchrecord.verify(rf.path).ok


def test_a_shuffled_iterable_chooses_at_close(tmp_path: Path) -> None:
    data = [{"x": np.full(10, i, np.int16), "y": i} for i in range(3000)]
    rf = write_record(iter(data), tmp_path / "i.tr", seed=3, progress=False)
    assert rf.samples_per_record > 1
    assert sorted(int(s["y"]) for s in rf) == list(range(3000))
    with RecordWriter(tmp_path / "w.tr", seed=3) as w:
        for sample in data:
            w.append(sample)
    assert w.result is not None and w.result.samples_per_record == rf.samples_per_record
    assert [int(s["y"]) for s in w.result] == [int(s["y"]) for s in rf]


def test_the_chunk_joiner_builds_the_encoders_chunk() -> None:
    schema = _schema(3, 5)
    sigs = [LeafSignature("ndarray", "uint8", (3,)), LeafSignature("ndarray", "uint8", (5,))]
    rows = [[np.full(3, i, np.uint8), np.full(5, 100 + i, np.uint8)] for i in range(4)]
    singles = [encode_payloads(r, sigs) for r in rows]
    joiner = ChunkJoiner(schema, 4)
    full = encode_payloads([np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])], sigs)
    assert joiner.join(singles) == full
    short = encode_payloads([np.stack([r[0] for r in rows[:3]]), np.stack([r[1] for r in rows[:3]])], sigs)
    assert joiner.join(singles[:3]) == short
    assert joiner.join(singles[:1]) is None  # a chunk of one row: the checked path
    assert joiner.join([b"\x00" + singles[0][1:], *singles[1:]]) is None  # not the layout


@pytest.mark.parametrize("batch_size", [None, 32])
def test_readers_give_the_same_samples_packed_or_not(make_record: Callable[..., str], batch_size: int | None) -> None:
    data = [{"x": torch.full((6,), i, dtype=torch.float32), "y": i} for i in range(2000)]
    packed = make_record(data, shuffle=False)
    assert RecordFile(packed).samples_per_record > 1
    ds = RecordDataset(packed, batch_size=batch_size, seed=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None if batch_size else 16, num_workers=2)
    seen: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch in loader:
            assert torch.equal(batch["x"][:, 0].long(), batch["y"])
            seen += batch["y"].tolist()
    assert sorted(seen) == list(range(2000))
    rf = RecordFile(packed)
    assert [int(s["y"]) for s in rf[[5, 1999, 0, 5]]] == [5, 1999, 0, 5]
    assert int(rf[-1]["y"]) == 1999
