"""The on-disk format as docs/FORMAT.md writes it down, built by hand and read back.

These tests do not use the writer: they build a version-1 file from the spec with
raw lmdb, protobuf wire bytes and msgpack, so a change to the format that breaks
files already on users' disks fails here.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import lmdb
import msgpack
import numpy as np
import pytest
import torch

import torchrecord
from tests.helpers import varint, wire_field
from torchrecord._proto import torchrecord_pb2 as pb
from torchrecord.errors import VersionError


def _tensor(dims: list[int], dtype_code: int, raw: bytes) -> bytes:
    body = b"".join(wire_field(1, 0, varint(d)) for d in dims)
    body += wire_field(2, 0, varint(dtype_code))
    body += wire_field(12, 0, varint(2))  # storage_type = RAW
    body += wire_field(13, 2, varint(len(raw)) + raw)
    return body


def _record(image: np.ndarray, label: int, name: str) -> bytes:
    protos = [
        _tensor(list(image.shape), 6, image.astype("<u1").tobytes()),  # UINT8
        _tensor([], 10, struct.pack("<q", label)),  # INT64, 0-d
        wire_field(6, 2, varint(len(name.encode())) + name.encode()) + wire_field(2, 0, varint(4)),  # STRING
    ]
    return b"".join(wire_field(1, 2, varint(len(p)) + p) for p in protos)


def _metadata(count: int, version: int = 1) -> dict:
    return {
        "format": "torchrecord",
        "format_version": version,
        "library_version": "0.1.0",
        "count": count,
        "records": count,
        "samples_per_record": 1,
        "schema": {
            "tree": {"t": "tuple", "c": [{"t": "leaf"}, {"t": "leaf"}, {"t": "leaf"}]},
            "fields": [
                {"name": "0", "kind": "tensor", "dtype": "uint8", "shape": [2, 3]},
                {"name": "1", "kind": "int", "dtype": "int64", "shape": []},
                {"name": "2", "kind": "str", "dtype": "str", "shape": []},
            ],
        },
        "shuffled": False,
        "seed": 0,
        "skipped": 0,
        "checksum": "crc32",
        "created": "2026-11-23T00:00:00+00:00",
        "user": {"source": "hand-built"},
        "complete": True,
    }


def _build_v1(path: Path, count: int = 5, version: int = 1) -> list[tuple[np.ndarray, int, str]]:
    samples = [(np.arange(6, dtype=np.uint8).reshape(2, 3) + i, i * 1000 - 7, f"ñame-{i}") for i in range(count)]
    env = lmdb.open(str(path), subdir=False, max_dbs=4, map_size=1 << 22)
    records, crcs, meta = env.open_db(b"records"), env.open_db(b"crc32"), env.open_db(b"meta")
    with env.begin(write=True) as txn:
        for i, (image, label, name) in enumerate(samples):
            value = _record(image, label, name)
            txn.put(struct.pack(">Q", i), value, db=records, append=True)
            txn.put(struct.pack(">Q", i), zlib.crc32(value).to_bytes(4, "little"), db=crcs, append=True)
        txn.put(b"metadata", msgpack.packb(_metadata(count, version)), db=meta)
    env.close()
    (path.parent / (path.name + "-lock")).unlink(missing_ok=True)
    return samples


def test_hand_built_v1_file_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "v1.tr"
    samples = _build_v1(path)
    rf = torchrecord.RecordFile(path)
    assert len(rf) == len(samples)
    assert rf.user_metadata == {"source": "hand-built"}
    for i, (image, label, name) in enumerate(samples):
        got_image, got_label, got_name = rf[i]
        assert torch.equal(got_image, torch.from_numpy(image))
        assert got_label == label and type(got_label) is int
        assert got_name == name
    assert torchrecord.verify(path).ok


@pytest.mark.parametrize("batch_size", [None, 2])
def test_hand_built_v1_file_streams(tmp_path: Path, batch_size: int | None) -> None:
    path = tmp_path / "v1.tr"
    samples = _build_v1(path, count=7)
    ds = torchrecord.RecordDataset(path, shuffle=False, batch_size=batch_size)
    labels: list[int] = []
    for item in ds:
        labels.extend(item[1].tolist() if batch_size else [item[1]])
    assert labels == [s[1] for s in samples]


def test_writer_output_matches_the_spec_bytes(tmp_path: Path) -> None:
    """What write_record stores is byte for byte the canonical encoding of the spec."""
    samples = [(torch.from_numpy(np.arange(6, dtype=np.uint8).reshape(2, 3) + i), i * 1000 - 7) for i in range(4)]
    rf = torchrecord.write_record(samples, tmp_path / "w.tr", shuffle=False, samples_per_record=1, progress=False)
    for i, (image, label) in enumerate(samples):
        expected = b"".join(
            wire_field(1, 2, varint(len(p)) + p)
            for p in (_tensor([2, 3], 6, image.numpy().tobytes()), _tensor([], 10, struct.pack("<q", label)))
        )
        assert rf.raw(i) == expected
        # and protobuf parses it as caffe2-style TensorProtos
        msg = pb.TensorProtos.FromString(expected)
        assert list(msg.protos[0].dims) == [2, 3] and msg.protos[0].data_type == pb.TensorProto.UINT8


def test_newer_version_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "v3.tr"
    _build_v1(path, version=3)
    with pytest.raises(VersionError, match=r"version 3.*up to 2.*Upgrade"):
        len(torchrecord.RecordFile(path))


def test_a_version_2_file_without_compressed_records_reads(tmp_path: Path) -> None:
    """Version 2 only adds compressed payloads: a version-2 file of raw payloads reads as before."""
    path = tmp_path / "v2.tr"
    _build_v1(path, version=2)
    assert len(torchrecord.RecordFile(path)) == 5
