"""The wire fast path (torchrecord._core.wire): the same samples as the checked codec, and the same errors."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import torch

from tests.helpers import varint, wire_field
from torchrecord import RecordDataset, RecordFile, write_record
from torchrecord._core.wire import WireDecoder
from torchrecord._proto import torchrecord_pb2 as pb
from torchrecord._store.format import encode_key
from torchrecord.errors import CorruptRecordError


def same(a: Any, b: Any) -> bool:
    """Equal values of the very same types, dtypes, shapes and bits (NaN included)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.is_contiguous() == b.is_contiguous()
            and a.reshape(-1).view(torch.uint8).numpy().tobytes() == b.reshape(-1).view(torch.uint8).numpy().tobytes()
        )
    if isinstance(a, np.ndarray):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.flags.writeable == b.flags.writeable
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return bool(a == b)


def _samples(n: int) -> list[Any]:
    rng = np.random.default_rng(5)
    floats = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-300, 2.5]
    out = []
    for i in range(n):
        size = [0, 1, 127, 128, 16383, 16384, 70000][i % 7]  # every length of the lengths' varints
        out.append(
            {
                "blob": rng.integers(0, 256, size, dtype=np.uint8).tobytes(),
                "text": ["", "a", "hé ✓", "x" * 200][i % 4],
                "label": [0, -1, 2**63 - 1, -(2**63), 300][i % 5],
                "score": floats[i % len(floats)],
                "flag": bool(i % 2),
                "meta": (
                    torch.full((2, 3), i, dtype=torch.float32),
                    np.full(4, i % 2 == 0),
                    torch.tensor(i, dtype=torch.bfloat16),
                    np.int16(i),
                ),
            }
        )
    return out


def _checked(rf: RecordFile, value: bytes, record: int) -> Any:
    return rf._decode_checked(value, record)


def _values(path: str) -> list[bytes]:
    rf = RecordFile(path)
    return [rf.raw(r) for r in range(rf.num_records)]


def test_records_of_the_usual_form_take_the_wire_path_and_read_as_the_checked_codec(tmp_path: Path) -> None:
    samples = _samples(21)
    rf = write_record(samples, tmp_path / "v.tr", shuffle=False, progress=False)
    wire = WireDecoder.of(rf.schema)
    assert wire is not None
    for r, value in enumerate(_values(rf.path)):
        assert wire.leaves(value) is not None, f"record {r} left the fast path"
        fast, slow = rf.decode(value, r), _checked(rf, value, r)
        assert same(fast, slow), r
        want = samples[r]
        assert same([fast[k] for k in ("blob", "text", "label", "score", "flag")], [want[k] for k in list(want)[:5]])
        assert same(fast["meta"][:3], want["meta"][:3]) and same(fast["meta"][3], np.array(r, np.int16))


@pytest.mark.parametrize("per_record", [2, 4])
@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_packed_and_compressed_records_read_the_same_with_and_without_the_wire_path(
    tmp_path: Path, per_record: int, compression: str | None
) -> None:
    if compression is not None:
        pytest.importorskip("cramjam")
    samples = [(b"\x00" * (i * 50), "t" * i, i, float(i), i % 3 == 0, np.zeros(64, np.uint8) + i) for i in range(11)]
    rf = write_record(
        samples,
        tmp_path / "p.tr",
        shuffle=False,
        progress=False,
        samples_per_record=per_record,
        compression=compression,
    )
    slow = RecordFile(rf.path)
    slow._wire_on = False
    assert slow._wire() is None
    fast = RecordFile(rf.path)
    wire = fast._wire()
    assert wire is not None
    values = _values(rf.path)
    assert len(values) == -(-11 // per_record)
    taken = 0
    for r, value in enumerate(values):
        rows = min(per_record, 11 - r * per_record)
        taken += wire.columns(value, rows) is not None
        got, want = fast.decode_record(value, r), slow.decode_record(value, r)
        assert same(got, want)
        assert same(got, samples[r * per_record : r * per_record + rows])
        assert same(fast.decode_record(value, r, row=rows - 1), want[-1:])
    if compression is None:
        assert taken == len(values)  # every record of a set without compression is of the usual form
    assert same(list(fast), samples) and same(fast[[3, 10, 0]], [samples[3], samples[10], samples[0]])


@pytest.mark.parametrize("per_record", [1, 3])
@pytest.mark.parametrize("check", [None, "checksums"])
def test_the_dataset_yields_the_same_samples_and_batches_either_way(
    tmp_path: Path, per_record: int, check: str | None
) -> None:
    samples = _samples(30)
    path = str(write_record(samples, tmp_path / "d.tr", progress=False, samples_per_record=per_record).path)
    assert RecordFile(path).samples_per_record == per_record

    def read(wire: bool, **kw: Any) -> list[Any]:
        ds = RecordDataset(path, seed=3, shuffle_buffer=16, check=check, **kw)  # type: ignore[arg-type]
        ds.file._wire_on = wire  # type: ignore[attr-defined]
        return list(ds)

    for kw in ({}, {"batch_size": 8}, {"batch_size": 8, "transform": lambda s: (s["blob"], s["label"])}):
        fast, slow = read(True, **kw), read(False, **kw)
        assert len(fast) == len(slow) > 0
        assert all(same(a, b) for a, b in zip(fast, slow)), kw


def _message(*protos: bytes) -> bytes:
    return b"".join(wire_field(1, 2, varint(len(p)) + p) for p in protos)


def _string(data: bytes) -> bytes:
    return wire_field(2, 0, varint(4)) + wire_field(6, 2, varint(len(data)) + data)


def _int(value: int) -> bytes:
    return (
        wire_field(2, 0, varint(10))
        + wire_field(12, 0, varint(2))
        + wire_field(13, 2, b"\x08" + struct.pack("<q", value))
    )


ODD = {
    # still valid: the checked codec reads them (and so must the reader)
    "fields in another order": _message(wire_field(6, 2, b"\x02hi") + wire_field(2, 0, b"\x04"), _int(7)),
    "an unknown field": _message(_string(b"hi") + wire_field(15, 0, b"\x01"), _int(7)),
    "a long varint": _message(wire_field(2, 0, b"\x84\x00") + wire_field(6, 2, b"\x02hi"), _int(7)),
    # damaged: the checked codec's errors
    "bad UTF-8": _message(_string(b"\xff\xfe"), _int(7)),
    "truncated": _message(_string(b"hi"), _int(7))[:-3],
    "a field missing": _message(_string(b"hi")),
    "a field too many": _message(_string(b"hi"), _int(7), _int(8)),
    "two strings": _message(_string(b"hi") + wire_field(6, 2, b"\x01a"), _int(7)),
    "a number as a string": _message(_int(7), _int(7)),
    "an int of 4 bytes": _message(
        _string(b"hi"), wire_field(2, 0, varint(10)) + wire_field(12, 0, varint(2)) + wire_field(13, 2, b"\x04abcd")
    ),
    "garbage": b"\x0a\xff\xff\xff\xff\x0f",
    "empty": b"",
}


@pytest.mark.parametrize("case", sorted(ODD))
def test_an_odd_or_damaged_record_reads_or_fails_exactly_as_the_checked_codec(tmp_path: Path, case: str) -> None:
    rf = write_record([("hi", 7)] * 3, tmp_path / "o.tr", progress=False, checksums=False)
    value = ODD[case]
    assert rf._wire() is not None and rf._wire().leaves(value) is None  # type: ignore[union-attr]
    try:
        want: Any = _checked(rf, value, 1)
    except CorruptRecordError as exc:
        with pytest.raises(CorruptRecordError) as got:
            rf.decode(value, 1)
        assert str(got.value) == str(exc)
        assert f"{rf.path}: record 1" in str(exc)
        return
    assert same(rf.decode(value, 1), want)
    assert want == ("hi", 7)


def test_a_damaged_record_in_a_file_names_file_record_and_field(tmp_path: Path) -> None:
    path = str(write_record([("hi", 7, True)] * 6, tmp_path / "b.tr", progress=False, checksums=False).path)
    env = lmdb.open(path, subdir=False, max_dbs=4, lock=False)
    try:
        with env.begin(write=True, db=env.open_db(b"records")) as txn:
            msg = pb.TensorProtos.FromString(bytes(txn.get(encode_key(4))))
            msg.protos[0].string_data[0] = b"\xc3"  # UTF-8 cut in the middle of a character
            txn.put(encode_key(4), msg.SerializeToString())
            msg = pb.TensorProtos.FromString(bytes(txn.get(encode_key(5))))
            msg.protos[2].raw_data = b"\x02"  # a bool byte that is neither 0 nor 1
            txn.put(encode_key(5), msg.SerializeToString())
    finally:
        env.close()
    with pytest.raises(CorruptRecordError, match=r"b\.tr: record 4, field '0': not valid UTF-8"):
        list(RecordDataset(path, shuffle=False))
    rf = RecordFile(path)
    assert rf[3] == ("hi", 7, True)
    with pytest.raises(CorruptRecordError, match=r"record 4, field '0'"):
        rf[4]
    with pytest.raises(CorruptRecordError, match=r"b\.tr: record 5, field '2': bool data holds values other than 0"):
        list(RecordDataset(path, shuffle=False, subset=[5], batch_size=1))


def test_a_bool_byte_other_than_0_or_1_is_refused_by_name(tmp_path: Path) -> None:
    path = str(write_record([("hi", True, np.ones(3, bool))] * 2, tmp_path / "c.tr", progress=False).path)
    rf = RecordFile(path)
    value = rf.raw(1)
    for at in (value.index(b"\x6a\x01\x01") + 2, len(value) - 1):  # the bool scalar, then the bool array
        bad = value[:at] + b"\x02" + value[at + 1 :]
        assert rf._wire().leaves(bad) is None  # type: ignore[union-attr]
        with pytest.raises(CorruptRecordError, match=r"record 1, field '[12]': bool data holds values other than 0"):
            rf.decode(bad, 1)


def test_schemas_the_wire_path_does_not_take(tmp_path: Path) -> None:
    varying = write_record(
        [np.zeros(n, np.float32) for n in (1, 2, 3)],
        tmp_path / "v.tr",
        progress=False,
        shuffle=False,
        schema={"value": [None]},
    )
    assert WireDecoder.of(varying.schema) is None
    assert same(list(varying), [np.zeros(n, np.float32) for n in (1, 2, 3)])


def _general_flatten(node: Any) -> tuple[Any, list[Any]]:
    """flatten() without the flat-tuple shortcut: the tuple walked child by child."""
    from torchrecord._core.structure import flatten

    if type(node) is tuple:
        parts = [flatten(x) for x in node]
        return {"t": "tuple", "c": [t for t, _ in parts]}, [leaf for _, ls in parts for leaf in ls]
    return flatten(node)


@pytest.mark.parametrize(
    "sample",
    [
        (b"x", 1),
        ("s", 2.5, True, None, np.zeros(2), torch.ones(1)),
        (b"x", [1, 2]),  # a number list: a leaf, but not a plain one (the general walk)
        (b"x", (1, 2)),
        (),
    ],
)
def test_a_flat_tuple_flattens_as_the_general_walk(sample: Any) -> None:
    from torchrecord._core.structure import flatten

    tree, leaves = flatten(sample)
    want_tree, want_leaves = _general_flatten(sample)
    assert tree == want_tree and len(leaves) == len(want_leaves)
    assert all(a is b for a, b in zip(leaves, want_leaves))


def test_scalar_fields_collate_to_the_same_tensors_as_stacking_them() -> None:
    from torchrecord._core.kinds import collate_samples
    from torchrecord._core.schema import Field, Schema

    schema = Schema(
        {"t": "tuple", "c": [{"t": "leaf"}] * 3},
        [Field("0", "int", "int64", ()), Field("1", "float", "float64", ()), Field("2", "bool", "bool", ())],
    )
    batch = collate_samples([(2**63 - 1, -0.0, True), (-(2**63), math.nan, False)], schema)
    stacked = [
        torch.from_numpy(np.stack([np.asarray(x) for x in col]))
        for col in zip(*[(2**63 - 1, -0.0, True), (-(2**63), math.nan, False)])
    ]
    assert same(list(batch), stacked)
    assert [t.dtype for t in batch] == [torch.int64, torch.float64, torch.bool]
    mixed = collate_samples([(np.int64(1), 1.0, True), (2, 2.0, False)], schema)  # not all Python ints: stacked
    assert mixed[0].dtype == torch.int64 and mixed[0].tolist() == [1, 2]
