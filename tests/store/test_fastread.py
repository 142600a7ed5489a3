"""The fixed-layout fast paths: the writer's spliced encoding and the batch reader.

Both must be exact: the same bytes as protobuf's serializer, the same samples as
the checked slow decoder, and a clear error (never a silent misread) for records
that do not fit the layout.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import torchrecord
from tests.conftest import IndexedImages
from tests.helpers import assert_exactly_once
from torchrecord._core.codec import encode_payloads
from torchrecord._proto import torchrecord_pb2 as pb
from torchrecord._store import fastread
from torchrecord._store.addresses import address_of
from torchrecord._store.fastread import JOIN_LIMIT, ROW_COPY, Mapped
from torchrecord._write.fastwrite import FastEncoder
from torchrecord._write.sources import normalize
from torchrecord.errors import ChecksumError, CorruptRecordError

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]


@st.composite
def fixed_samples(draw: st.DrawFn) -> Any:
    def leaf() -> Any:
        kind = draw(st.sampled_from(["tensor", "ndarray", "int", "float", "bool"]))
        if kind == "int":
            return draw(st.integers(-(2**63), 2**63 - 1))
        if kind == "float":
            return draw(st.floats(allow_nan=False))
        if kind == "bool":
            return draw(st.booleans())
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        dtype = draw(st.sampled_from(DTYPES))
        arr = np.random.default_rng(draw(st.integers(0, 1000))).integers(0, 2, shape).astype(dtype)
        return torch.from_numpy(arr) if kind == "tensor" else arr

    leaves = [leaf() for _ in range(draw(st.integers(1, 4)))]
    structure = draw(st.sampled_from(["tuple", "list", "dict", "leaf"]))
    if structure == "leaf":
        return leaves[0]
    if structure == "dict":
        return {f"k{i}": x for i, x in enumerate(leaves)}
    return tuple(leaves) if structure == "tuple" else leaves


@settings(max_examples=200, deadline=None)
@given(fixed_samples())
def test_fast_encoder_matches_protobuf_byte_for_byte(sample: Any) -> None:
    norm = normalize(sample)
    encoder = FastEncoder.build(norm.tree, norm.signatures)
    assert encoder is not None
    assert encoder.encode(sample) == encode_payloads(norm.payloads, norm.signatures)


def test_fast_encoder_refuses_samples_unlike_the_first() -> None:
    first = (torch.zeros(2, 3, dtype=torch.uint8), 1)
    norm = normalize(first)
    encoder = FastEncoder.build(norm.tree, norm.signatures)
    assert encoder is not None
    for other in [
        (torch.zeros(3, 2, dtype=torch.uint8), 1),  # shape
        (torch.zeros(2, 3, dtype=torch.int16), 1),  # dtype
        (torch.zeros(2, 3, dtype=torch.uint8), 1.5),  # kind
        (torch.zeros(2, 3, dtype=torch.uint8).t().contiguous().t(), 1),  # not contiguous
        [torch.zeros(2, 3, dtype=torch.uint8), 1],  # list, not tuple
        (torch.zeros(2, 3, dtype=torch.uint8), 2**70),  # int out of int64
        (torch.zeros(2, 3, dtype=torch.uint8),),
    ]:
        assert encoder.encode(other) is None


def _rewrite(path: str, changes: dict[int, bytes], fix_crc: bool) -> None:
    """Replace record values with raw lmdb (before torchrecord opens the file in this process)."""
    env = lmdb.open(path, subdir=False, max_dbs=4, lock=False)
    records, crcs = env.open_db(b"records"), env.open_db(b"crc32")
    with env.begin(write=True) as txn:
        for index, value in changes.items():
            key = struct.pack(">Q", index)
            txn.put(key, value, db=records)
            if fix_crc:
                txn.put(key, zlib.crc32(value).to_bytes(4, "little"), db=crcs)
    env.close()


def _raw(path: str, index: int) -> bytes:
    env = lmdb.open(path, subdir=False, max_dbs=4, lock=False, readonly=True)
    with env.begin(db=env.open_db(b"records", create=False)) as txn:
        value = bytes(txn.get(struct.pack(">Q", index)))
    env.close()
    return value


def _labels_and_images(ds: torchrecord.RecordDataset) -> tuple[list[int], list[torch.Tensor]]:
    labels, images = [], []
    for images_batch, labels_batch in ds:
        labels.extend(labels_batch.tolist())
        images.extend(images_batch)
    return labels, images


def test_non_canonical_records_read_the_same(make_record: Any) -> None:
    path = make_record(IndexedImages(300), samples_per_record=1)
    expected = {}
    changes = {}
    for index in (0, 17, 299):
        msg = pb.TensorProtos.FromString(_raw(path, index))
        msg.protos[0].name = "image"  # valid protobuf, different bytes and length
        msg.protos[1].name = "label"
        changes[index] = msg.SerializeToString()
        expected[index] = msg
    _rewrite(path, changes, fix_crc=True)
    rf = torchrecord.RecordFile(path)
    reference = {rf[i][1]: rf[i][0] for i in range(len(rf))}
    ds = torchrecord.RecordDataset(path, batch_size=32, seed=3, check="checksums")
    labels, images = _labels_and_images(ds)
    assert_exactly_once(labels, 300)
    for label, image in zip(labels, images):
        assert torch.equal(image, reference[label])


def test_same_length_record_with_a_wrong_header_is_an_error(make_record: Any) -> None:
    path = make_record(IndexedImages(100), samples_per_record=1)
    value = bytearray(_raw(path, 42))
    assert value[2:4] == b"\x08\x03"  # protos[0].dims[0] = 3
    value[3] = 0x02  # dims [2, 4, 4] with the data length of [3, 4, 4]: same length, wrong header
    _rewrite(path, {42: bytes(value)}, fix_crc=True)
    with pytest.raises(CorruptRecordError, match=r"record 42.*field '0'"):
        list(torchrecord.RecordDataset(path, batch_size=16))


@pytest.mark.parametrize("batch_size", [None, 16])
def test_truncated_record_is_an_error(make_record: Any, batch_size: int | None) -> None:
    path = make_record(IndexedImages(100), samples_per_record=1)
    _rewrite(path, {7: _raw(path, 7)[:-1]}, fix_crc=True)
    with pytest.raises(CorruptRecordError, match="record 7"):
        list(torchrecord.RecordDataset(path, batch_size=batch_size))


def test_invalid_bool_payload_is_an_error(make_record: Any) -> None:
    path = make_record([(np.array([True, False]), i) for i in range(50)], shuffle=False, samples_per_record=1)
    value = bytearray(_raw(path, 9))
    position = value.index(b"\x6a\x02\x01\x00") + 2  # raw_data of the bool field
    value[position] = 2
    _rewrite(path, {9: bytes(value)}, fix_crc=True)
    with pytest.raises(CorruptRecordError, match="bool"):
        list(torchrecord.RecordDataset(path, batch_size=8))


@pytest.mark.parametrize("batch_size", [None, 16])
def test_verify_catches_a_flipped_payload_byte(make_record: Any, batch_size: int | None) -> None:
    path = make_record(IndexedImages(100), samples_per_record=1)
    value = bytearray(_raw(path, 5))
    value[-20] ^= 0xFF  # inside the image payload: still decodes, checksum does not match
    _rewrite(path, {5: bytes(value)}, fix_crc=False)
    with pytest.raises(ChecksumError, match="record 5"):
        list(torchrecord.RecordDataset(path, batch_size=batch_size, check="checksums"))
    # without verify the damaged record is read as stored (that is what checksums are for)
    assert len(list(torchrecord.RecordDataset(path, batch_size=batch_size))) > 0


def test_generic_path_verify_catches_a_flipped_byte(make_record: Any) -> None:
    path = make_record([(f"text-{i}", i) for i in range(60)], shuffle=False)
    value = bytearray(_raw(path, 30))
    value[6] ^= 0x01  # inside the string
    _rewrite(path, {30: bytes(value)}, fix_crc=False)
    with pytest.raises(ChecksumError, match="record 30"):
        list(torchrecord.RecordDataset(path, check="checksums"))


@pytest.mark.parametrize("chunk", [1, 7, 16])
@pytest.mark.parametrize("world_size", [1, 3])
def test_chunked_sets_cover_every_sample_once(make_record: Any, chunk: int, world_size: int) -> None:
    count = 101
    path = make_record(IndexedImages(count), samples_per_record=chunk)
    rf = torchrecord.RecordFile(path)
    assert len(rf) == count and rf.num_records == -(-count // chunk)
    reference = {rf[i][1]: rf[i][0] for i in range(count)}
    seen: list[int] = []
    per_rank = []
    for rank in range(world_size):
        ds = torchrecord.RecordDataset(path, batch_size=8, rank=rank, world_size=world_size, shuffle_buffer=32)
        got = 0
        for images, labels in DataLoader(ds, batch_size=None, num_workers=2):
            for image, label in zip(images, labels.tolist()):
                assert torch.equal(image, reference[label])
            seen.extend(labels.tolist())
            got += len(labels)
        per_rank.append(got)
    pad = -(-count // world_size) * world_size - count
    assert len(set(per_rank)) == 1
    assert_exactly_once(seen, count, pad=pad)


def test_chunked_set_reads_like_the_unchunked_one(make_record: Any) -> None:
    samples = [(np.full(4, i, dtype=np.float32), i, f"s{i}") for i in range(45)]
    plain = torchrecord.RecordFile(make_record(samples, shuffle=False, samples_per_record=1))
    chunked = torchrecord.RecordFile(make_record(samples, shuffle=False, samples_per_record=8))
    assert chunked.num_records == 6
    for i in range(-45, 45):
        a, b = plain[i], chunked[i]
        assert np.array_equal(a[0], b[0]) and a[1:] == b[1:]
    assert [s[1] for s in chunked] == list(range(45))
    per_sample = sorted(item[1] for item in torchrecord.RecordDataset(chunked.path, shuffle_buffer=16))
    assert per_sample == list(range(45))
    assert torchrecord.verify(chunked.path).ok


def test_chunked_records_need_fixed_shapes(tmp_path: Path) -> None:
    samples = [np.zeros(3 + (i == 5), dtype=np.float32) for i in range(10)]
    with pytest.raises(torchrecord.errors.SchemaError, match=r"sample 5.*samples_per_record"):
        torchrecord.write_record(samples, tmp_path / "x.tr", samples_per_record=4, shuffle=False, progress=False)
    assert not (tmp_path / "x.tr").exists()


def test_large_records_take_the_view_path(make_record: Any) -> None:
    size = 80
    assert 3 * size * size > JOIN_LIMIT
    path = make_record(IndexedImages(40, size=size))
    labels, images = _labels_and_images(torchrecord.RecordDataset(path, batch_size=6, shuffle_buffer=10))
    assert_exactly_once(labels, 40)
    for label, image in zip(labels, images):
        assert image.shape == (3, size, size) and bool((image == label % 251).all())


@pytest.mark.parametrize("pending", [1, 3, fastread.PENDING_VIEWS])
def test_view_path_finds_records_of_the_wrong_length_whenever_their_addresses_are_read(
    make_record: Any, monkeypatch: pytest.MonkeyPatch, pending: int
) -> None:
    """The addresses of records read from the map are read a few thousand at a time (``PENDING_VIEWS``), not
    a piece at a time: a record of another length must still be found at its own row, wherever the reads cut."""
    size = 80
    path = make_record(IndexedImages(60, size=size), samples_per_record=1)
    changes = {}
    for index in (0, 17, 18, 59):
        msg = pb.TensorProtos.FromString(_raw(path, index))
        msg.protos[0].name = "image"  # valid protobuf, another length: decoded the checked way
        changes[index] = msg.SerializeToString()
    _rewrite(path, changes, fix_crc=True)
    assert torchrecord.RecordFile(path).fixed_layout().length >= JOIN_LIMIT  # read from the map
    monkeypatch.setattr(fastread, "PENDING_VIEWS", pending)
    ds = torchrecord.RecordDataset(path, batch_size=7, shuffle_buffer=20, seed=1)
    labels, images = _labels_and_images(ds)
    assert_exactly_once(labels, 60)
    for label, image in zip(labels, images):
        assert image.shape == (3, size, size) and bool((image == label % 251).all())


def test_per_sample_mode_returns_the_written_kinds(make_record: Any) -> None:
    samples = [
        {
            "t": torch.full((2,), i, dtype=torch.bfloat16),
            "a": np.full(3, i, np.int16),
            "i": i,
            "f": i / 2,
            "b": i % 2 == 0,
        }
        for i in range(20)
    ]
    path = make_record(samples)
    rf = torchrecord.RecordFile(path)
    for sample in torchrecord.RecordDataset(path):
        ref = rf[[s["i"] for s in rf].index(sample["i"])]
        assert sample.keys() == ref.keys()
        assert isinstance(sample["t"], torch.Tensor) and sample["t"].dtype == torch.bfloat16
        assert torch.equal(sample["t"], ref["t"])
        assert isinstance(sample["a"], np.ndarray) and np.array_equal(sample["a"], ref["a"])
        assert type(sample["i"]) is int and type(sample["f"]) is float and type(sample["b"]) is bool
        assert (sample["f"], sample["b"]) == (ref["f"], ref["b"])


def test_batch_mode_structure_and_batch_transform(make_record: Any) -> None:
    samples = [{"x": np.full((2, 2), i, np.float32), "meta": (i, float(i))} for i in range(30)]
    path = make_record(samples)
    ds = torchrecord.RecordDataset(path, batch_size=8, drop_last=True, batch_transform=lambda b: (b["x"] * 2, b))
    batches = list(ds)
    assert len(batches) == len(ds) == 3
    doubled, batch = batches[0]
    assert isinstance(batch["meta"], tuple) and batch["meta"][0].dtype == torch.int64
    assert torch.equal(doubled[:, 0, 0], batch["meta"][0].float() * 2)


class _ArraysOnly(torch.utils.data.Dataset[Any]):
    def __len__(self) -> int:
        return 300

    def __getitem__(self, i: int) -> Any:
        return np.full(3, i, np.int64), np.float32(i)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_parallel_write_with_the_fast_encoder(tmp_path: Path, context: str) -> None:
    """The fast encoder travels to spawn workers (it pickles as its recipe)."""
    rf = torchrecord.write_record(
        _ArraysOnly(), tmp_path / "a.tr", num_workers=2, multiprocessing_context=context, progress=False
    )
    assert sorted(int(a[0]) for a, _ in rf) == list(range(300))
    norm = normalize(_ArraysOnly()[0])
    encoder = FastEncoder.build(norm.tree, norm.signatures)
    assert encoder is not None
    import pickle

    clone = pickle.loads(pickle.dumps(encoder))
    sample = _ArraysOnly()[5]
    assert clone.encode(sample) == encoder.encode(sample) == encode_payloads(*_payloads(sample))


def _payloads(sample: Any) -> tuple[Any, Any]:
    norm = normalize(sample)
    return norm.payloads, norm.signatures


@pytest.mark.parametrize(("per_record", "side"), [(1, 48), (3, 48), (1, 8), (3, 8)])
def test_records_are_gathered_straight_from_the_map(tmp_path: Path, per_record: int, side: int) -> None:
    """Every window of long records is gathered with one take a field from LMDB's map (``Mapped``), a window
    holding the shard's short final chunk (re-encoded, gathered from where its canonical bytes lie) too; short
    records are joined into a window buffer; all give the stored samples."""
    from torchrecord._store import fastread

    path = tmp_path / f"long{per_record}.tr"
    count = 40  # with 3 a record, the final chunk is short: its window holds a re-encoded record
    samples = [(np.full((3, side, side), i % 251, np.uint8), i) for i in range(count)]  # 6.9 KB or 192 B a sample
    torchrecord.write_record(samples, path, samples_per_record=per_record, shuffle=False, progress=False)
    seen: list[Any] = []
    original = fastread.FixedWindow.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        seen.append(self.mapped)

    fastread.FixedWindow.__init__ = spy  # type: ignore[method-assign]
    try:
        ds = torchrecord.RecordDataset(path, batch_size=7, shuffle_buffer=16, seed=2)
        images, labels = [], []
        for x, y in ds:
            images.append(x)
            labels.append(y)
    finally:
        fastread.FixedWindow.__init__ = original  # type: ignore[method-assign]
    got = torch.cat(labels).tolist()
    assert sorted(got) == list(range(count))
    for image, label in zip(torch.cat(images), got):
        assert torch.equal(image, torch.full((3, side, side), label % 251, dtype=torch.uint8))
    long = torchrecord.RecordFile(path).fixed_layout().length >= JOIN_LIMIT
    assert seen and all((m is not None) == long for m in seen)  # long records: every window from the map


@pytest.mark.parametrize("size", [8, 3072, ROW_COPY + 16])
@pytest.mark.parametrize("into_given", [False, True])
def test_a_take_from_the_map_copies_the_same_bytes_on_one_thread_or_several(size: int, into_given: bool) -> None:
    """On one thread ``Mapped.take`` gathers with torch (straight into the batch), on several with NumPy (no
    torch operation that could start OpenMP threads): both copy exactly the asked samples' bytes."""
    rng = np.random.default_rng(size)
    per_record, offset, records = 3, 40, 9
    length = offset + per_record * size + 24  # a header before the field, a tail after it
    memory = rng.integers(0, 256, records * length + 100, dtype=np.uint8)
    order = rng.permutation(records)  # records lie anywhere in the span, not in row order
    addresses = address_of(memory) + 50 + order.astype(np.int64) * length
    rec = rng.integers(0, records, 25)
    row = rng.integers(0, per_record, 25)
    starts = 50 + order[rec] * length + offset + row * size
    expected = np.stack([memory[s : s + size] for s in starts])
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            mapped = Mapped([memory], addresses, length)
            dst = np.full((25, size), 7, np.uint8) if into_given else None
            got = mapped.take(rec, row, offset, size, dst)
            assert got.shape == (25, size) and np.array_equal(got, expected), count
            assert dst is None or got is dst
    finally:
        torch.set_num_threads(threads)
