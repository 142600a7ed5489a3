"""The writer's column path: many samples at a time, laid out as whole records of K samples.

Records written from columns must be byte for byte those of the per-sample
path, for every structure and every samples_per_record; a sample that does not
fit is still reported (or skipped) by its own index.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

import torchrecord
from tests.store.test_fastread import fixed_samples
from torchrecord._core.codec import encode_payloads
from torchrecord._core.layout import FixedLayout
from torchrecord._core.schema import Schema
from torchrecord._write.fastwrite import BytesColumn, FastEncoder, fill_records
from torchrecord._write.sources import normalize
from torchrecord.errors import SourceError


def _values(path: Path) -> list[bytes]:
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=4)
    try:
        db = env.open_db(b"records", create=False)
        with env.begin(db=db) as txn:
            return [bytes(v) for v in txn.cursor().iternext(keys=False)]
    finally:
        env.close()


class Listed(torch.utils.data.Dataset[Any]):
    """A map-style dataset over a list (read one sample at a time)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


class BatchedOnly(Listed):
    """Gives samples only through torch's batched protocol, ``__getitems__`` (after the first)."""

    def __getitem__(self, i: int) -> Any:
        if getattr(self, "first_done", False):
            raise AssertionError("read one by one: __getitems__ was not used")
        self.first_done = True
        return self.items[i]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        return [self.items[i] for i in indices]


@settings(max_examples=100, deadline=None)
@given(fixed_samples(), st.integers(1, 5), st.integers(1, 7))
def test_columns_make_the_per_sample_records(sample: Any, n: int, k: int) -> None:
    norm = normalize(sample)
    encoder = FastEncoder.build(norm.tree, norm.signatures)
    if encoder is None:
        return
    samples = [sample] * (n * k)
    columns = encoder.columns(samples)
    assert columns is not None
    single = fill_records(encoder.layout, columns)
    assert [bytes(r) for r in single] == [encoder.encode(s) for s in samples]
    chunked = FixedLayout.build(Schema.from_first(norm.tree, norm.signatures), k)
    assert chunked is not None
    records = fill_records(chunked, columns)
    for j, record in enumerate(records):
        rows = [c[j * k : (j + 1) * k] if k > 1 else c[j] for c in columns]
        assert bytes(record) == encode_payloads(rows, norm.signatures)


def test_columns_refuse_samples_that_do_not_fit() -> None:
    first = (torch.zeros(3), 1)
    norm = normalize(first)
    encoder = FastEncoder.build(norm.tree, norm.signatures)
    assert encoder is not None
    assert encoder.columns([first, (torch.zeros(3, dtype=torch.float64), 2)]) is None
    assert encoder.columns([first, (torch.zeros(4), 2)]) is None
    assert encoder.columns([first, (torch.zeros(3), 2.5)]) is None
    assert encoder.columns([first, [torch.zeros(3), 2]]) is None
    assert encoder.columns([first, (torch.zeros(3), 2**70)]) is None
    assert encoder.columns([first, (torch.zeros(3, requires_grad=True), 2)]) is None
    got = encoder.columns([first, (torch.arange(6.0)[::2], 7)])  # not contiguous: stacked all the same
    assert got is not None and got[0].tolist() == [[0, 0, 0], [0, 2, 4]] and got[1].tolist() == [1, 7]


@pytest.mark.parametrize("k", [1, 3, 64])
@pytest.mark.parametrize("count", [1, 2, 203])
def test_map_style_writes_the_records_of_the_per_sample_path(tmp_path: Path, k: int, count: int) -> None:
    rng = np.random.default_rng(0)
    items = [
        {"a": rng.integers(0, 9, (2, 3)).astype(np.int16), "b": bool(i % 2), "c": float(i), "l": [1, 2, i]}
        for i in range(count)
    ]
    # an iterable goes through the per-sample path (spooled and replayed in the same seeded order)
    torchrecord.write_record(Listed(items), tmp_path / "m.tr", samples_per_record=k, progress=False)
    torchrecord.write_record(iter(items), tmp_path / "i.tr", samples_per_record=k, progress=False)
    assert _values(tmp_path / "m.tr") == _values(tmp_path / "i.tr")


@pytest.mark.parametrize("k", [1, 5])
def test_tensor_datasets_and_arrays_are_read_as_columns(tmp_path: Path, k: int) -> None:
    features, labels = torch.randn(301, 4), torch.arange(301)
    torchrecord.write_record(TensorDataset(features, labels), tmp_path / "t.tr", samples_per_record=k, progress=False)
    samples = [(features[i], labels[i]) for i in range(301)]
    torchrecord.write_record(iter(samples), tmp_path / "ti.tr", samples_per_record=k, progress=False)
    assert _values(tmp_path / "t.tr") == _values(tmp_path / "ti.tr")
    torchrecord.write_record(features.numpy(), tmp_path / "a.tr", samples_per_record=k, progress=False)
    torchrecord.write_record(iter(list(features.numpy())), tmp_path / "ai.tr", samples_per_record=k, progress=False)
    assert _values(tmp_path / "a.tr") == _values(tmp_path / "ai.tr")
    back = torchrecord.RecordFile(tmp_path / "t.tr")
    assert sorted(int(label) for _, label in back) == list(range(301))


def test_getitems_is_used_when_the_dataset_has_it(tmp_path: Path) -> None:
    items = [(torch.full((2,), i, dtype=torch.int32), i) for i in range(500)]
    torchrecord.write_record(BatchedOnly(items), tmp_path / "b.tr", samples_per_record=4, progress=False)
    assert sorted(label for _, label in torchrecord.RecordFile(tmp_path / "b.tr")) == list(range(500))


class FailsAt(Listed):
    def __init__(self, items: list[Any], bad: set[int]) -> None:
        super().__init__(items)
        self.bad = bad

    def __getitem__(self, i: int) -> Any:
        if i in self.bad:
            raise ValueError(f"cannot read {i}")
        return self.items[i]


@pytest.mark.parametrize("k", [1, 7])
def test_a_bad_sample_in_a_batch_is_skipped_by_its_index(tmp_path: Path, k: int) -> None:
    items = [(torch.full((3,), i, dtype=torch.int64), i) for i in range(1000)]
    bad = {0, 5, 640, 999}
    path = tmp_path / "s.tr"
    rf = torchrecord.write_record(
        FailsAt(items, bad), path, samples_per_record=k, shuffle=False, on_error="skip", progress=False
    )
    assert rf.write_summary.skipped == len(bad)
    good = [s for i, s in enumerate(items) if i not in bad]
    torchrecord.write_record(iter(good), tmp_path / "g.tr", samples_per_record=k, shuffle=False, progress=False)
    assert _values(path) == _values(tmp_path / "g.tr")
    with pytest.raises(SourceError, match="640"):
        torchrecord.write_record(FailsAt(items, {640}), tmp_path / "r.tr", samples_per_record=k, progress=False)


# -- bytes and str fields: variable-length values in the column path --------------------------------

#: lengths whose varints (the value's and its field's) take one, two and three bytes
_LENGTHS = [0, 1, 5, 120, 124, 127, 128, 200, 16370, 16380, 16383, 16384, 20000, 70000]


def _blob(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _string_samples() -> list[Any]:
    out: list[Any] = []
    for i, n in enumerate(_LENGTHS):
        text = ("é€𝄞x" * (n // 4 + 1))[: n // 2]  # 2-, 3- and 4-byte UTF-8 characters
        out.append(
            {
                "image": _blob(n, i),
                "label": i,
                "caption": text,
                "box": np.full((2, 2), i, np.float32),
                "depth": np.full((8, 8), i, np.float64),  # 512 bytes: joined by row, like the values
            }
        )
    return out


@pytest.mark.parametrize(
    "shape",
    [
        lambda s: s,
        lambda s: (s["image"], s["label"]),
        lambda s: s["image"],
        lambda s: s["caption"],
        lambda s: (s["caption"], s["image"], s["box"]),
        lambda s: (s["depth"], s["image"], s["label"], s["caption"], s["depth"]),
        lambda s: (s["image"], s["depth"]),
    ],
)
def test_bytes_and_str_columns_make_the_per_sample_records(shape: Any) -> None:
    samples = [shape(s) for s in _string_samples()]
    norm = normalize(samples[0])
    encoder = FastEncoder.build(norm.tree, norm.signatures)
    assert encoder is not None and encoder.layout is None
    expected = []
    for sample in samples:
        n = normalize(sample)
        expected.append(encode_payloads(n.payloads, n.signatures))
        assert encoder.encode(sample) == expected[-1]
    columns = encoder.columns(samples)
    assert columns is not None
    flat, bounds = encoder.records(columns)
    got = [flat[a:b].tobytes() for a, b in itertools.pairwise(bounds)]
    assert got == expected
    # the same rows in another order, given as offsets into one buffer (as an Arrow BinaryArray holds them)
    order = np.random.default_rng(1).permutation(len(samples))
    stacked = [
        BytesColumn.from_offsets(c.data, np.append(c.starts, c.starts[-1] + c.lengths[-1]), order, text=c.text)
        if isinstance(c, BytesColumn)
        else c[order]
        for c in columns
    ]
    given = encoder.stacked(stacked, len(order))
    assert given is not None
    flat, bounds = encoder.records(given)
    assert [flat[a:b].tobytes() for a, b in itertools.pairwise(bounds)] == [expected[i] for i in order]
    # and joined from two buffers (two Arrow record batches), taken in that order
    half = len(order) // 2
    split = [
        BytesColumn.concat([c.take(np.arange(half)).compact(), c.take(np.arange(half, len(c))).compact()]).take(order)
        if isinstance(c, BytesColumn)
        else c[order]
        for c in columns
    ]
    given = encoder.stacked(split, len(order))
    assert given is not None
    flat, bounds = encoder.records(given)
    assert [flat[a:b].tobytes() for a, b in itertools.pairwise(bounds)] == [expected[i] for i in order]


def test_bytes_columns_refuse_what_the_per_sample_path_must_see() -> None:
    first = {"image": b"png", "caption": "a cat"}
    norm = normalize(first)
    encoder = FastEncoder.build(norm.tree, norm.signatures)
    assert encoder is not None
    assert encoder.columns([first, {"image": bytearray(b"x"), "caption": "c"}]) is None
    assert encoder.columns([first, {"image": b"x", "caption": b"c"}]) is None
    assert encoder.columns([first, {"image": b"x", "caption": "\ud800"}]) is None  # a lone surrogate
    assert encoder.encode({"image": b"x", "caption": "\ud800"}) is None
    raw = BytesColumn.of([b"a", b"b"])
    assert encoder.stacked([raw, raw], 2) is None  # str values whose UTF-8 nobody checked
    assert encoder.stacked([raw, BytesColumn.of([b"a"], text=True)], 2) is None  # wrong length
    assert encoder.stacked([raw, BytesColumn.of([b"a", b"\xc3\xa9"], text=True)], 2) is not None


def test_bytes_columns_slice_join_and_pickle() -> None:
    import pickle

    values = [_blob(n, n) for n in (3, 0, 300, 17)]
    column = BytesColumn.from_offsets(
        np.frombuffer(b"".join(values), np.uint8), np.cumsum([0] + [len(v) for v in values]), np.array([3, 0, 2])
    )
    assert column.values() == [values[3], values[0], values[2]]
    assert column[1:].values() == [values[0], values[2]]
    back = pickle.loads(pickle.dumps(column))
    assert back.values() == column.values() and back.data.nbytes == column.nbytes  # only its own bytes travel
    other = BytesColumn.of([b"zz", b""])
    joined = BytesColumn.concat([column, other, column[:1]])  # three buffers' values, not copied
    assert joined.values() == [*column.values(), b"zz", b"", values[3]]
    assert joined.take(np.array([3, 0, 5])).values() == [b"zz", values[3], values[3]]
    assert pickle.loads(pickle.dumps(joined[2:])).values() == joined.values()[2:]
    out = np.zeros(joined.nbytes + 2, np.uint8)
    joined.take(np.array([3, 2])).copy_into(out, np.array([0, 2]))
    assert out[: 2 + len(values[2])].tobytes() == b"zz" + values[2]


class Columnar(Listed):
    """A source that reads rows as columns through the writer's columns method (as from_hf's does)."""

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self.calls = 0

    def _torchrecord_columns(self, indices: np.ndarray) -> list[Any]:
        self.calls += 1
        rows = [self.items[i] for i in indices.tolist()]
        return [
            BytesColumn.of([r["image"] for r in rows]),
            np.array([r["label"] for r in rows], np.int64),
            BytesColumn.of([r["caption"].encode() for r in rows], text=True),
            np.stack([r["box"] for r in rows]),
        ]


@pytest.mark.parametrize("k", [None, 1, 3])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_map_style_bytes_fields_write_the_records_of_the_per_sample_path(
    tmp_path: Path, k: int | None, compression: Any
) -> None:
    items = _string_samples() * 23  # several batches
    options: dict[str, Any] = {"samples_per_record": k, "compression": compression, "progress": False}
    torchrecord.write_record(Listed(items), tmp_path / "m.tr", **options)
    columnar = Columnar(items)
    torchrecord.write_record(columnar, tmp_path / "c.tr", **options)
    assert columnar.calls > 0
    torchrecord.write_record(iter(items), tmp_path / "i.tr", **options)
    expected = _values(tmp_path / "i.tr")
    assert _values(tmp_path / "m.tr") == expected
    assert _values(tmp_path / "c.tr") == expected
    back = torchrecord.RecordFile(tmp_path / "c.tr")
    assert sorted((s["label"], s["image"], s["caption"]) for s in back) == sorted(
        (s["label"], s["image"], s["caption"]) for s in items
    )


def test_bytes_columns_cross_to_writer_workers(tmp_path: Path) -> None:
    items = _string_samples() * 5
    torchrecord.write_record(Columnar(items), tmp_path / "w.tr", num_workers=1, progress=False)
    torchrecord.write_record(iter(items), tmp_path / "i.tr", progress=False)
    assert _values(tmp_path / "w.tr") == _values(tmp_path / "i.tr")
