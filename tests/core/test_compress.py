"""Optional per-field compression: every reader, the version rule, incompressible fields, damage, the extra."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import torch

import torchrecord
from torchrecord import RecordDataset, RecordFile, RecordWriter, write_record
from torchrecord._core.schema import Field
from torchrecord._proto import torchrecord_pb2 as pb
from torchrecord._store import format as _format
from torchrecord._store.format import check_schema, encode_key
from torchrecord.errors import CorruptRecordError, FormatError, VersionError

pytest.importorskip("cramjam")

N = 120


def _image(i: int) -> np.ndarray:
    """A rendered-like frame: flat background, a gradient band and a box that moves with ``i``."""
    img = np.full((3, 24, 32), 40, np.uint8)
    img[0] += (np.arange(32, dtype=np.uint8) * 3)[None, :]
    img[:, 5 + i % 10 : 15 + i % 10, 8:20] = 200
    return img


def _samples(n: int = N) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    return [
        {"image": _image(i), "noise": rng.integers(0, 256, 300, dtype=np.uint8), "label": i, "pos": np.float32(i)}
        for i in range(n)
    ]


def _check(sample: Any, i: int) -> None:
    want = _samples(i + 1)[i]
    np.testing.assert_array_equal(sample["image"], want["image"])
    np.testing.assert_array_equal(sample["noise"], want["noise"])
    assert int(sample["label"]) == i


@pytest.fixture(params=["zstd", "lz4"])
def compressed(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    path = tmp_path / f"{request.param}.tr"
    write_record(_samples(), path, shuffle=False, compression=request.param, progress=False)
    return str(path)


def test_the_schema_and_metadata_say_what_was_compressed(compressed: str) -> None:
    rf = RecordFile(compressed)
    codec = rf.metadata["compression"]["image"]["codec"]
    fields = {f.name: f.compression for f in rf.schema.fields}
    assert fields["image"] == codec and fields["noise"] is None  # noise does not shrink: left alone
    report = rf.metadata["compression"]
    assert report["image"]["applied"] and report["image"]["ratio"] < 0.5
    assert not report["noise"]["applied"] and report["noise"]["ratio"] > 0.9
    assert rf.metadata["format_version"] == 2
    raw = pb.TensorProtos.FromString(rf.raw(0))
    assert raw.protos[0].storage_type == _format_storage(codec)
    assert raw.protos[1].storage_type == pb.TensorProto.StorageType.RAW


def _format_storage(codec: str) -> int:
    return {"zstd": 100, "lz4": 101}[codec]


def test_random_access_and_iteration(compressed: str) -> None:
    rf = RecordFile(compressed)
    for i in (0, 7, N - 1):
        _check(rf[i], i)
    for i, sample in enumerate(rf[[3, 99, 3]]):
        _check(sample, [3, 99, 3][i])
    for i, sample in enumerate(rf):
        _check(sample, i)
    assert torchrecord.verify(compressed).ok


@pytest.mark.parametrize(
    ("context", "batch_size"),
    # spawn in per-sample mode repeats what spawn in batch mode shows (about 11 s a codec): slow
    [("fork", None), ("fork", 16), pytest.param("spawn", None, marks=pytest.mark.slow), ("spawn", 16)],
)
def test_dataset_both_paths_in_workers(compressed: str, batch_size: int | None, context: str) -> None:
    ds = RecordDataset(compressed, batch_size=batch_size, seed=2)
    assert ds._fixed_layout() is not None and ds._fixed_layout().expander is not None  # type: ignore[union-attr]
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None if batch_size else 16, num_workers=2, multiprocessing_context=context
    )
    seen = []
    for batch in loader:
        for j, label in enumerate(batch["label"].tolist()):
            np.testing.assert_array_equal(batch["image"][j].numpy(), _image(label))
            seen.append(label)
    assert sorted(seen) == list(range(N))


def test_fast_and_generic_paths_agree(compressed: str) -> None:
    fast = RecordDataset(compressed, batch_size=32, seed=5)
    slow = RecordDataset(compressed, batch_size=32, seed=5)
    slow._force_generic = True
    for a, b in zip(fast, slow):
        for key in ("image", "noise", "label"):
            assert torch.equal(a[key], b[key])


def test_load_reads_compressed_fields(compressed: str) -> None:
    columns = torchrecord.load(compressed)
    images = columns["image"]
    assert images.shape == (N, 3, 24, 32)
    np.testing.assert_array_equal(images[7].numpy(), _image(7))


def test_uncompressed_sets_keep_version_1(tmp_path: Path) -> None:
    plain = write_record(_samples(20), tmp_path / "plain.tr", progress=False)
    assert plain.metadata["format_version"] == 1 and "compression" not in plain.metadata
    noise = write_record(
        [np.random.default_rng(i).integers(0, 256, 4000, dtype=np.uint8) for i in range(30)],
        tmp_path / "noise.tr",
        compression="zstd",
        progress=False,
    )
    assert noise.metadata["format_version"] == 1  # asked for, but nothing shrank: older readers read it
    assert noise.metadata["compression"]["value"]["applied"] is False
    assert noise.schema.fields[0].compression is None


def test_an_older_reader_refuses_a_compressed_set(compressed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The version check of a reader of version 1 (torchrecord before compression) against a compressed set."""
    env = RecordFile(compressed).environment()[0]
    _format.read_metadata(env, compressed)  # this reader reads it
    monkeypatch.setattr(_format, "FORMAT_VERSION", 1)
    with pytest.raises(VersionError, match=r"record format version 2 .* versions up to 1\. Upgrade torchrecord"):
        _format.read_metadata(env, compressed)


def test_the_schema_check_refuses_an_unknown_codec() -> None:
    tree = {"t": "leaf"}
    good = {"name": "value", "kind": "ndarray", "dtype": "uint8", "shape": [4], "compression": "zstd"}
    check_schema({"tree": tree, "fields": [good]}, "x.tr")
    with pytest.raises(FormatError, match="unknown compression 'brotli'"):
        check_schema({"tree": tree, "fields": [{**good, "compression": "brotli"}]}, "x.tr")
    field = Field.from_dict(good)
    assert field.compression == "zstd" and Field.from_dict(field.to_dict()) == field


def test_per_field_choice_and_level(tmp_path: Path) -> None:
    rf = write_record(
        _samples(40),
        tmp_path / "d.tr",
        compression={"image": "lz4", "noise": None},
        compression_level=9,
        samples_per_record=1,
        shuffle=False,
        progress=False,
    )
    assert [f.compression for f in rf.schema.fields] == ["lz4", None, None, None]
    report = rf.metadata["compression"]
    assert list(report) == ["image"] and report["image"]["codec"] == "lz4" and report["image"]["level"] == 9
    _check(rf[39], 39)
    zstd = write_record(_samples(40), tmp_path / "z.tr", shuffle=False, compression="zstd", compression_level=19)
    assert zstd.metadata["compression"]["image"]["level"] == 19
    _check(zstd[5], 5)


def test_record_writer_compresses(tmp_path: Path) -> None:
    with RecordWriter(tmp_path / "w.tr", shuffle=False, compression="zstd") as w:
        for sample in _samples(30):
            w.append(sample)
    assert w.result is not None and w.result.schema.fields[0].compression == "zstd"
    _check(w.result[29], 29)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"compression": "gzip"}, ValueError, "unknown compression 'gzip'"),
        ({"compression": 3}, TypeError, "compression must be"),
        ({"compression_level": 3}, ValueError, "needs compression="),
        ({"compression": "zstd", "compression_level": 40}, ValueError, "zstd's levels"),
        ({"compression": "lz4", "compression_level": 0}, ValueError, "LZ4's"),
        ({"compression": {"nope": "zstd"}}, ValueError, "fields the samples do not have"),
    ],
)
def test_bad_options(tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        write_record(_samples(5), tmp_path / "bad.tr", progress=False, **kwargs)
    assert not (tmp_path / "bad.tr").exists()


def test_strings_named_for_compression_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"field 'w' is str; only numeric .*leave 'w' out of the dict"):
        write_record([{"w": "abc"}] * 3, tmp_path / "s.tr", compression={"w": "zstd"}, progress=False)
    rf = write_record([{"w": "abc" * 100, "x": np.zeros(500, np.uint8)}] * 3, tmp_path / "t.tr", compression="zstd")
    assert [f.compression for f in rf.schema.fields] == [None, "zstd"]


def test_compression_for_every_field_leaves_strings_out_of_the_report(tmp_path: Path) -> None:
    rows = [{"w": "abc" * 100, "b": b"x" * 300, "x": np.zeros(500, np.uint8)}] * 3
    rf = write_record(rows, tmp_path / "t.tr", compression="zstd", progress=False)
    assert list(rf.metadata["compression"]) == ["x"]  # not candidates: not reported as "not applied"
    assert rf.metadata["compression"]["x"]["applied"]


def _damage(path: str, record: int) -> None:
    """Cut the first field's compressed payload of ``record`` in half (flipped bytes may decode silently,
    as in a raw payload: the per-record CRC-32s catch those, see ``RecordDataset(check="checksums")``)."""
    env = lmdb.open(path, subdir=False, max_dbs=4, lock=False)
    try:
        db = env.open_db(b"records")
        with env.begin(write=True, db=db) as txn:
            msg = pb.TensorProtos.FromString(bytes(txn.get(encode_key(record))))
            data = msg.protos[0].raw_data
            msg.protos[0].raw_data = data[: len(data) // 2]
            txn.put(encode_key(record), msg.SerializeToString())
    finally:
        env.close()


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_damaged_compressed_data_names_file_record_and_field(tmp_path: Path, codec: str) -> None:
    path = str(tmp_path / "bad.tr")
    write_record(_samples(40), path, shuffle=False, compression=codec, checksums=False, samples_per_record=1)
    _damage(path, 3)
    rf = RecordFile(path)
    with pytest.raises(CorruptRecordError, match=rf"bad.tr: record 3, field 'image': its {codec} data"):
        rf[3]
    _check(rf[4], 4)
    assert not torchrecord.verify(path).ok


def test_damage_on_the_fast_path_names_the_record(tmp_path: Path) -> None:
    path = str(tmp_path / "bad.tr")
    write_record(_samples(40), path, shuffle=False, compression="zstd", checksums=False, samples_per_record=1)
    _damage(path, 11)
    with pytest.raises(CorruptRecordError, match=r"bad.tr: record 11, field 'image'"):
        list(RecordDataset(path, batch_size=8, shuffle=False))


def _without_cramjam(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cramjam", None)  # import cramjam raises ImportError


def test_writing_without_the_extra_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _without_cramjam(monkeypatch)
    with pytest.raises(ImportError, match=r"compression needs cramjam: pip install 'cramjam>=2.11' .*\[compress\]"):
        write_record(_samples(5), tmp_path / "x.tr", compression="zstd", progress=False)
    write_record(_samples(5), tmp_path / "y.tr", progress=False)  # no compression: no need


def test_reading_without_the_extra_names_it(compressed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _without_cramjam(monkeypatch)
    rf = RecordFile(compressed)
    assert len(rf) == N  # the metadata reads
    with pytest.raises(ImportError, match=r"needs cramjam: .*\[compress\]"):
        rf[0]
    with pytest.raises(ImportError, match=r"needs cramjam: .*\[compress\]"):
        next(iter(RecordDataset(compressed, batch_size=4)))


def test_a_chunked_compressed_set_packs_large_records(tmp_path: Path) -> None:
    rf = write_record(_samples(), tmp_path / "c.tr", compression="zstd", progress=False)
    assert rf.samples_per_record > 1
    payload = N * (3 * 24 * 32 + 300 + 8 + 4)
    assert os.path.getsize(rf.path) < payload  # the images shrink


def test_make_record_passes_compression(make_record: Callable[..., str]) -> None:
    path = make_record(_samples(10), compression="lz4")
    assert RecordFile(path).metadata["format_version"] == 2


def test_a_record_cut_short_on_the_fast_path_is_corrupt(tmp_path: Path) -> None:
    path = str(tmp_path / "cut.tr")
    write_record(_samples(40), path, shuffle=False, compression="zstd", checksums=False, samples_per_record=1)
    env = lmdb.open(path, subdir=False, max_dbs=4, lock=False)
    try:
        with env.begin(write=True, db=env.open_db(b"records")) as txn:
            value = bytes(txn.get(encode_key(6)))
            txn.put(encode_key(6), value[: len(value) // 2])
    finally:
        env.close()
    with pytest.raises(CorruptRecordError, match=r"cut.tr: record 6"):
        list(RecordDataset(path, batch_size=8, shuffle=False))


# -- crafted sizes (issue 30, finding 8): refused before anything is allocated ------------------------------


def _variable_set(path: str, codec: str) -> None:
    """A set whose one field is compressed and of variable length (its schema does not bound it)."""
    samples = [np.zeros(1000 + 10 * i, np.uint8) for i in range(8)]
    write_record(
        samples, path, shuffle=False, compression=codec, checksums=False, samples_per_record=1, schema={"value": [None]}
    )


def _put_record(path: str, record: int, dims: list[int], codec: str) -> None:
    """Replace ``record`` with a 30-odd-byte one: uint8 of ``dims`` as a tiny compressed payload."""
    import cramjam

    payload = (
        bytes(cramjam.zstd.compress(b"\0" * 16))
        if codec == "zstd"
        else bytes(cramjam.lz4.compress_block(b"\0" * 16, store_size=False))
    )
    msg = pb.TensorProtos()
    proto = msg.protos.add()
    proto.dims.extend(dims)
    proto.data_type = pb.TensorProto.DataType.UINT8
    proto.storage_type = {"zstd": 100, "lz4": 101}[codec]  # type: ignore[assignment]
    proto.raw_data = payload
    env = lmdb.open(path, subdir=False, max_dbs=4, lock=False)
    try:
        db = env.open_db(b"records")
        with env.begin(write=True, db=db) as txn:
            txn.put(encode_key(record), msg.SerializeToString())
    finally:
        env.close()


def _read_every_way(path: str) -> list[str]:
    """What each reader raised (class: message); run in a child with a small memory limit."""
    out = []
    for read in (
        lambda: RecordFile(path)[0],
        lambda: list(RecordDataset(path, shuffle=False)),
        lambda: list(RecordDataset(path, shuffle=False, batch_size=4)),
        lambda: torchrecord.load(path),
    ):
        try:
            read()
            out.append("read")
        except torchrecord.errors.TorchRecordError as exc:
            out.append(f"{type(exc).__name__}: {exc}")
    report = torchrecord.verify(path, progress=False)
    out.append("ok" if report.ok else f"verify: {report.first_error}")
    return out


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("power", [30, 31, 32, 33])
def test_a_tiny_record_claiming_gigabytes_is_refused_before_allocating(tmp_path: Path, codec: str, power: int) -> None:
    from torchrecord._check.isolate import run_in_child

    path = str(tmp_path / "v.tr")
    _variable_set(path, codec)
    _put_record(path, 0, [2**power], codec)
    outcome = run_in_child(_read_every_way, path, timeout=120, memory_limit=256 << 20)
    assert outcome.status == "returned", (outcome.status, outcome.error_type, outcome.message)
    *readers, verified = outcome.value
    for said in readers:
        assert said.startswith("CorruptRecordError: ") and "v.tr: record 0, field 'value'" in said, said
    want = "its zstd frame holds 16 bytes" if codec == "zstd" else "more than 1"
    assert want in readers[0]
    assert verified.startswith("verify: ") and "record 0, field 'value'" in verified


def test_a_compressed_field_of_a_huge_fixed_shape_fails_the_claims_check(tmp_path: Path) -> None:
    import msgpack

    from tests.untrusted import put_meta_bytes, raw_meta

    path = str(tmp_path / "c.tr")
    write_record([np.zeros((64, 64), np.float32)] * 4, path, compression="zstd", progress=False)
    meta = raw_meta(path)
    field = meta["schema"]["fields"][0]
    assert field["compression"] == "zstd"
    field["shape"] = [65536, 65536]  # 16 GiB a sample: at least 512 KiB of zstd data each, in a 40 KB file
    put_meta_bytes(path, msgpack.packb(meta))
    with pytest.raises(FormatError, match=r"c.tr: the metadata claims 4 samples of at least 524288 bytes each"):
        len(RecordFile(path))
    with pytest.raises(FormatError, match="at least 524288 bytes each"):
        torchrecord.verify(path, progress=False)


def test_check_expansion_bounds() -> None:
    import cramjam

    from torchrecord._core.compress import MAX_RATIO, check_expansion, zstd_content_size

    for n in (0, 1, 255, 256, 65791, 65792, 1 << 20):
        assert zstd_content_size(bytes(cramjam.zstd.compress(b"\1" * n))) == n
    zeros = bytes(cramjam.zstd.compress(b"\0" * (8 << 20), level=19))
    check_expansion("zstd", zeros, 8 << 20, "x")  # what the codec really made passes
    lz4 = bytes(cramjam.lz4.compress_block(b"\0" * (1 << 20), store_size=False))
    check_expansion("lz4", lz4, 1 << 20, "x")
    assert (1 << 20) / len(lz4) < MAX_RATIO["lz4"] and (8 << 20) / len(zeros) < MAX_RATIO["zstd"]
    with pytest.raises(CorruptRecordError, match="x: its shape needs 257 bytes, more than 1 bytes of lz4"):
        check_expansion("lz4", b"\0", 257, "x")
