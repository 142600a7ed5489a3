"""Round trips through write_record and RecordFile: every kind, dtype, shape and order."""

from __future__ import annotations

import os
import pickle
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchrecord
from tests.conftest import IndexedImages
from torchrecord import RecordFile, Schema
from torchrecord.errors import VariableShapeWarning

MakeRecord = Callable[..., str]

# name -> (torch dtype, numpy dtype or None when NumPy has none)
DTYPES: dict[str, tuple[torch.dtype, np.dtype | None]] = {
    "bool": (torch.bool, np.dtype(np.bool_)),
    "uint8": (torch.uint8, np.dtype(np.uint8)),
    "int8": (torch.int8, np.dtype(np.int8)),
    "int16": (torch.int16, np.dtype(np.int16)),
    "int32": (torch.int32, np.dtype(np.int32)),
    "int64": (torch.int64, np.dtype(np.int64)),
    "float16": (torch.float16, np.dtype(np.float16)),
    "bfloat16": (torch.bfloat16, None),
    "float32": (torch.float32, np.dtype(np.float32)),
    "float64": (torch.float64, np.dtype(np.float64)),
    "uint16": (torch.uint16, np.dtype(np.uint16)),
    "uint32": (torch.uint32, np.dtype(np.uint32)),
    "uint64": (torch.uint64, np.dtype(np.uint64)),
}
NUMPY_DTYPES = [name for name, (_, npd) in DTYPES.items() if npd is not None]
SHAPES = [(), (0,), (3, 0), (5,), (2, 3), (2, 1, 3)]


def _values(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Values covering the dtype's range (extremes included), as a NumPy array."""
    rng = np.random.default_rng(seed)
    if name == "bool":
        return np.asarray(rng.integers(0, 2, size=shape)).astype(np.bool_)
    if name in ("float16", "float32", "float64", "bfloat16"):
        arr = np.asarray(rng.standard_normal(size=shape) * 1000)
        return arr.astype(np.float32 if name == "bfloat16" else name)
    info = np.iinfo(np.dtype(name))
    arr = np.asarray(rng.integers(info.min, info.max, size=shape, dtype=np.dtype(name), endpoint=True))
    if arr.size >= 2:
        arr.flat[0], arr.flat[1] = info.min, info.max
    return arr


def _tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    values = _values(name, shape, seed)
    if name == "bfloat16":
        return torch.from_numpy(values).to(torch.bfloat16)
    return torch.from_numpy(values)


def _bits(t: torch.Tensor) -> bytes:
    """A tensor's bytes (works for every dtype, bfloat16 and the unsigned ones too)."""
    if t.numel() == 0:
        return b""
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def assert_same(got: Any, want: Any) -> None:
    """Deep equality that also checks types, dtypes and shapes, bitwise for numbers."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"expected a tensor, got {type(got).__name__}"
        assert got.dtype == want.dtype
        assert tuple(got.shape) == tuple(want.shape)
        assert _bits(got) == _bits(want)
    elif isinstance(want, (np.ndarray, np.generic)):  # a NumPy scalar comes back as a 0-d array
        assert isinstance(got, np.ndarray), f"expected an ndarray, got {type(got).__name__}"
        assert got.dtype == want.dtype.newbyteorder("=")
        assert got.shape == want.shape
        assert got.tobytes() == want.astype(want.dtype.newbyteorder("=")).tobytes()
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    elif isinstance(want, dict):
        assert type(got) is dict
        assert list(got) == list(want), "dict keys or their order changed"
        for key in want:
            assert_same(got[key], want[key])
    else:
        assert type(got) is type(want), f"{type(got).__name__} != {type(want).__name__}"
        if isinstance(want, float) and want != want:
            assert got != got
        else:
            assert got == want


def _read_all(rf: RecordFile) -> list[Any]:
    return [rf[i] for i in range(len(rf))]


# -- dtypes and shapes ----------------------------------------------------------------


@pytest.mark.parametrize("name", list(DTYPES))
def test_tensor_dtypes_round_trip(make_record: MakeRecord, name: str) -> None:
    samples = [tuple(_tensor(name, shape, seed=10 * i + j) for j, shape in enumerate(SHAPES)) for i in range(3)]
    rf = RecordFile(make_record(samples, shuffle=False))
    assert len(rf) == 3
    for i, want in enumerate(samples):
        assert_same(rf[i], want)
    assert [f.dtype for f in rf.schema.fields] == [name] * len(SHAPES)
    assert [f.kind for f in rf.schema.fields] == ["tensor"] * len(SHAPES)
    assert [tuple(f.shape) for f in rf.schema.fields] == SHAPES


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_numpy_dtypes_round_trip(make_record: MakeRecord, name: str) -> None:
    samples = [tuple(_values(name, shape, seed=10 * i + j) for j, shape in enumerate(SHAPES)) for i in range(3)]
    rf = RecordFile(make_record(samples, shuffle=False))
    for i, want in enumerate(samples):
        got = rf[i]
        assert_same(got, want)
        assert got[0].ndim == 0, "a 0-d array must come back 0-d"
    assert [f.kind for f in rf.schema.fields] == ["ndarray"] * len(SHAPES)
    assert [f.dtype for f in rf.schema.fields] == [name] * len(SHAPES)


def test_numpy_scalars_come_back_as_0d_arrays(make_record: MakeRecord) -> None:
    sample = (np.float32(1.5), np.int16(-7), np.bool_(True), np.uint64(2**64 - 1))
    got = RecordFile(make_record([sample]))[0]
    for g, w in zip(got, sample, strict=True):
        assert isinstance(g, np.ndarray) and g.shape == () and g.dtype == w.dtype
        assert g.item() == w.item()


def test_bfloat16_is_stored_bit_exact(make_record: MakeRecord) -> None:
    t = torch.tensor([1.0, -2.5, float("inf"), 3.0e38, 1e-38, 0.0, -0.0], dtype=torch.bfloat16)
    got = RecordFile(make_record([t]))[0]
    assert got.dtype == torch.bfloat16
    assert _bits(got) == _bits(t)


def test_non_contiguous_tensor_and_array(make_record: MakeRecord) -> None:
    base = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    arr = np.arange(24, dtype=np.float64).reshape(4, 6)
    sample = (base.t(), base[:, ::2], arr.T, arr[::2, 1::2])
    got = RecordFile(make_record([sample]))[0]
    assert_same(got, tuple(x.contiguous() if isinstance(x, torch.Tensor) else x.copy() for x in sample))


def test_big_endian_numpy_reads_back_equal(make_record: MakeRecord) -> None:
    sample = {
        "i4": np.arange(-6, 6, dtype=">i4").reshape(3, 4),
        "u2": np.array([1, 256, 65535], dtype=">u2"),
        "f8": np.array([1.5, -2.25, 1e300], dtype=">f8"),
        "f2": np.array([0.5, -1.0, 65504.0], dtype=">f2"),
        "i8": np.array(-(2**40), dtype=">i8"),
    }
    got = RecordFile(make_record([sample]))[0]
    for key, want in sample.items():
        assert got[key].dtype == want.dtype.newbyteorder("="), key
        assert got[key].dtype.isnative
        np.testing.assert_array_equal(got[key], want)
    # the schema names the dtype, not the byte order
    assert {f.name: f.dtype for f in RecordFile(make_record([sample])).schema.fields} == {
        "i4": "int32",
        "u2": "uint16",
        "f8": "float64",
        "f2": "float16",
        "i8": "int64",
    }


# -- Python leaves and structures ------------------------------------------------------


def test_python_scalars_keep_their_type(make_record: MakeRecord) -> None:
    samples = [
        (0, 0.0, False),
        (-(2**63), float("inf"), True),
        (2**63 - 1, -0.0, False),
        (42, float("nan"), True),
        (-1, 1e-310, False),
    ]
    rf = RecordFile(make_record(samples, shuffle=False))
    for i, want in enumerate(samples):
        got = rf[i]
        assert [type(x) for x in got] == [int, float, bool]
        assert_same(got, want)
    assert str(rf[2][1]) == "-0.0"
    assert [f.kind for f in rf.schema.fields] == ["int", "float", "bool"]


def test_bytes_and_str(make_record: MakeRecord) -> None:
    samples = [
        (b"", ""),
        (b"\x00\xff\x00", "plain ascii"),
        (bytes(range(256)), "héllo wörld ✓ 日本語 🎉 \u0000 end"),
        (b"x" * 100_000, "ß" * 10_000),
    ]
    rf = RecordFile(make_record(samples, shuffle=False))
    for i, want in enumerate(samples):
        assert_same(rf[i], want)
    assert [(f.kind, f.dtype) for f in rf.schema.fields] == [("bytes", "bytes"), ("str", "str")]


def test_nested_structures(make_record: MakeRecord) -> None:
    def sample(i: int) -> dict[str, Any]:
        return {
            "image": torch.full((2, 2), i, dtype=torch.uint8),
            "meta": {"id": i, "name": f"s{i}", "tags": [b"a", b"b"], "pos": (float(i), -float(i))},
            "pairs": [(i, np.int32(i)), (i + 1, np.int32(i + 1))],
            "z_last": True,
            "a_after_z": "key order is kept",
        }

    samples = [sample(i) for i in range(4)]
    rf = RecordFile(make_record(samples, shuffle=False))
    for i in range(4):
        assert_same(rf[i], samples[i])
    assert rf.schema.names == [
        "image",
        "meta.id",
        "meta.name",
        "meta.tags.0",
        "meta.tags.1",
        "meta.pos.0",
        "meta.pos.1",
        "pairs.0.0",
        "pairs.0.1",
        "pairs.1.0",
        "pairs.1.1",
        "z_last",
        "a_after_z",
    ]


def test_single_leaf_sample(make_record: MakeRecord) -> None:
    rf = RecordFile(make_record([torch.tensor([i, i]) for i in range(3)], shuffle=False))
    assert rf.schema.names == ["value"]
    assert [int(t[0]) for t in rf] == [0, 1, 2]


def test_variable_shapes_schema_has_none(make_record: MakeRecord) -> None:
    samples = [
        (torch.zeros((i % 4 + 1, 3, 5 + i % 2), dtype=torch.float32) + i, np.zeros((2, 2)), torch.zeros(4), i)
        for i in range(10)
    ]
    rf = RecordFile(make_record(samples, schema={"0": (None, 3, None)}))  # shuffled: look samples up by label
    fields = rf.schema.fields
    assert tuple(fields[0].shape) == (None, 3, None)
    assert tuple(fields[1].shape) == (2, 2)
    assert tuple(fields[2].shape) == (4,)
    assert tuple(fields[3].shape) == ()
    assert not fields[0].is_fixed and fields[1].is_fixed
    for got in rf:
        assert_same(got, samples[got[3]])


def test_variable_empty_dim(make_record: MakeRecord) -> None:
    samples = [np.arange(n, dtype=np.int64) for n in (0, 3, 0, 1)]
    with pytest.warns(VariableShapeWarning, match="sample 1, field 'value'"):
        rf = RecordFile(make_record(samples, shuffle=False))
    assert tuple(rf.schema.fields[0].shape) == (None,)
    for i, want in enumerate(samples):
        assert_same(rf[i], want)


# -- property round trip --------------------------------------------------------------

_DTYPES = (
    hnp.boolean_dtypes()
    | hnp.integer_dtypes(endianness="?")
    | hnp.unsigned_integer_dtypes(endianness="?")
    | hnp.floating_dtypes(endianness="?", sizes=(16, 32, 64))
)


@st.composite
def _array_batches(draw: st.DrawFn) -> tuple[list[np.ndarray], bool]:
    dtype = draw(_DTYPES)
    ndim = draw(st.integers(0, 3))
    count = draw(st.integers(1, 4))
    arrays = [
        draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=ndim, max_dims=ndim, min_side=0, max_side=5)))
        for _ in range(count)
    ]
    return arrays, draw(st.booleans())


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(_array_batches())
def test_property_arrays_round_trip(batch: tuple[list[np.ndarray], bool]) -> None:
    arrays, as_tensor = batch
    samples: list[Any] = (
        [torch.from_numpy(a.astype(a.dtype.newbyteorder("="))) for a in arrays] if as_tensor else arrays
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "p.tr")
        with warnings.catch_warnings():  # shapes vary here on purpose
            warnings.simplefilter("ignore", VariableShapeWarning)
            rf = torchrecord.write_record([(s, i) for i, s in enumerate(samples)], path, shuffle=False, progress=False)
        got = _read_all(rf)
        assert [g[1] for g in got] == list(range(len(samples)))
        for g, want in zip(got, samples, strict=True):
            assert_same(g[0], want)
        shape = rf.schema.fields[0].shape
        assert len(shape) == arrays[0].ndim
        for d, size in enumerate(shape):
            sizes = {a.shape[d] for a in arrays}
            assert size == (sizes.pop() if len(sizes) == 1 else None)


# -- RecordFile -----------------------------------------------------------------------


def test_record_file_access(make_record: MakeRecord) -> None:
    n = 23
    rf = RecordFile(make_record(IndexedImages(n), shuffle=False))
    assert len(rf) == n
    labels = [rf[i][1] for i in range(n)]
    assert labels == list(range(n))
    image, _ = rf[5]
    assert image.dtype == torch.uint8 and image.shape == (3, 4, 4) and int(image[0, 0, 0]) == 5
    assert rf[-1][1] == n - 1
    assert rf[-n][1] == 0
    assert rf[np.int64(7)][1] == 7
    assert rf[torch.tensor(8)][1] == 8
    for bad in (n, n + 10, -n - 1):
        with pytest.raises(IndexError):
            rf[bad]
    assert [s[1] for s in rf] == list(range(n))
    assert [s[1] for s in rf] == list(range(n)), "iterating twice gives the same order"


def test_record_file_schema(make_record: MakeRecord) -> None:
    rf = RecordFile(make_record(IndexedImages(5, size=6)))
    schema = rf.schema
    assert isinstance(schema, Schema)
    assert [(f.name, f.kind, f.dtype, tuple(f.shape)) for f in schema.fields] == [
        ("0", "tensor", "uint8", (3, 6, 6)),
        ("1", "int", "int64", ()),
    ]
    assert schema.is_fixed


def test_record_file_metadata(make_record: MakeRecord) -> None:
    from torchrecord._store import format as _format

    user = {"source": "unit test", "classes": ["a", "b"], "n": 3, "nested": {"x": 1.5}}
    rf = RecordFile(make_record(IndexedImages(9), seed=123, metadata=user))
    meta = rf.metadata
    assert meta["format_version"] == _format.PLAIN_VERSION  # no compressed field: readable by version-1 readers
    assert meta["count"] == 9
    assert meta["seed"] == 123
    assert meta["shuffled"] is True
    assert meta["complete"] is True
    assert meta["user"] == user
    assert rf.user_metadata == user
    plain = RecordFile(make_record(IndexedImages(4), shuffle=False))
    assert plain.metadata["shuffled"] is False
    assert plain.metadata["seed"] == 0
    assert plain.user_metadata == {}


def test_empty_source(make_record: MakeRecord) -> None:
    with pytest.warns(torchrecord.TorchRecordWarning, match="no samples"):
        rf = RecordFile(make_record([]))
    assert len(rf) == 0
    assert list(rf) == []
    with pytest.raises(IndexError):
        rf[0]


def test_record_file_pickles_before_and_after_opening(make_record: MakeRecord) -> None:
    path = make_record(IndexedImages(6), shuffle=False)
    rf = RecordFile(path)
    fresh = pickle.loads(pickle.dumps(rf))
    assert fresh.path == path
    assert [s[1] for s in fresh] == list(range(6))
    _ = rf[2], len(rf), rf.schema  # now open in this process
    opened = pickle.loads(pickle.dumps(rf))
    assert len(opened) == 6
    assert opened[3][1] == 3
    assert [s[1] for s in opened] == list(range(6))
    assert rf[4][1] == 4, "the original still works"


def test_write_record_returns_record_file(tmp_path: Any) -> None:
    rf = torchrecord.write_record(IndexedImages(3), tmp_path / "r.tr", progress=False)
    assert isinstance(rf, RecordFile)
    assert rf.path == str(tmp_path / "r.tr")
    assert sorted(s[1] for s in rf) == [0, 1, 2]


# -- write order ----------------------------------------------------------------------


def _labels(rf: RecordFile) -> list[int]:
    return [int(s[1]) for s in rf]


def test_shuffle_false_keeps_source_order(make_record: MakeRecord) -> None:
    assert _labels(RecordFile(make_record(IndexedImages(50), shuffle=False))) == list(range(50))


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_shuffle_true_is_the_seeded_permutation(make_record: MakeRecord, seed: int) -> None:
    n = 60
    rf = RecordFile(make_record(IndexedImages(n), seed=seed))
    perm = np.random.default_rng(seed).permutation(n)
    for k in range(n):
        image, label = rf[k]
        assert label == perm[k]
        assert int(image[0, 0, 0]) == perm[k] % 251


def test_different_seeds_give_different_orders(make_record: MakeRecord) -> None:
    a = _labels(RecordFile(make_record(IndexedImages(40), seed=1)))
    b = _labels(RecordFile(make_record(IndexedImages(40), seed=2)))
    assert sorted(a) == sorted(b) == list(range(40))
    assert a != b


def _generate(n: int) -> Iterator[tuple[torch.Tensor, int]]:
    for i in range(n):
        yield torch.full((2,), i, dtype=torch.int16), i


class _Stream(torch.utils.data.IterableDataset[tuple[torch.Tensor, int]]):
    """An iterable dataset that also has a length (it must still be read as a stream)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        return _generate(self.n)

    def __len__(self) -> int:
        return self.n


@pytest.mark.parametrize("source", ["generator", "iterator", "iterable_dataset"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_iterable_sources(make_record: MakeRecord, source: str, shuffle: bool) -> None:
    n = 37
    data: Any = {
        "generator": _generate(n),
        "iterator": iter(list(_generate(n))),
        "iterable_dataset": _Stream(n),
    }[source]
    rf = RecordFile(make_record(data, shuffle=shuffle, seed=5))
    assert len(rf) == n
    want = np.random.default_rng(5).permutation(n) if shuffle else np.arange(n)
    assert _labels(rf) == want.tolist()
    assert all(int(s[0][1]) == s[1] for s in rf)
    assert rf.metadata["shuffled"] is shuffle


def test_parallel_write_gives_the_same_file_content(make_record: MakeRecord) -> None:
    n = 300
    serial = RecordFile(make_record(IndexedImages(n), seed=3, num_workers=0))
    parallel = RecordFile(make_record(IndexedImages(n), seed=3, num_workers=2))
    assert len(serial) == len(parallel) == n
    assert _labels(serial) == _labels(parallel) == np.random.default_rng(3).permutation(n).tolist()
    for a, b in zip(serial, parallel, strict=True):
        assert_same(b, a)
    assert serial.schema == parallel.schema


@pytest.mark.parametrize("shuffle", [False, True])
def test_chunked_records_read_like_single_ones(make_record: MakeRecord, shuffle: bool) -> None:
    n = 23  # not a multiple of the chunk: the last record holds 3 samples
    plain = RecordFile(make_record(IndexedImages(n), shuffle=shuffle, seed=2))
    chunked = RecordFile(make_record(IndexedImages(n), shuffle=shuffle, seed=2, samples_per_record=4))
    assert len(chunked) == len(plain) == n
    assert chunked.schema.names == plain.schema.names
    for i in [*range(n), -1, -n]:
        assert_same(chunked[i], plain[i])
    assert _labels(chunked) == _labels(plain)
    with pytest.raises(IndexError):
        chunked[n]


def _every_kind(i: int) -> dict[str, Any]:
    sample: dict[str, Any] = {f"t_{name}": _tensor(name, (2,), seed=i) for name in DTYPES}
    sample.update({f"t0_{name}": _tensor(name, (), seed=i) for name in DTYPES})
    sample.update({f"a_{name}": _values(name, (3, 1), seed=i) for name in NUMPY_DTYPES})
    sample.update({f"a0_{name}": _values(name, (), seed=i) for name in NUMPY_DTYPES})
    sample.update({"int": i - 5, "float": i / 3, "bool": i % 2 == 0, "label": i})
    return sample


@pytest.mark.parametrize("strings", [False, True])
def test_dataset_yields_what_record_file_holds(make_record: MakeRecord, strings: bool) -> None:
    """RecordDataset gives every leaf back with the same kind, dtype, shape and bits as RecordFile."""
    samples = [_every_kind(i) for i in range(40)]
    if strings:  # strings take the general (non fixed-layout) decoding path
        for s in samples:
            s["name"] = f"n{s['label']}"
    path = make_record(samples, shuffle=False)
    stored = list(RecordFile(path))
    for got, want in zip(torchrecord.RecordDataset(path, shuffle=False), stored, strict=True):
        assert_same(got, want)
    for got in torchrecord.RecordDataset(path, shuffle_buffer=8):
        assert_same(got, samples[got["label"]])


def _as_torch(leaf: Any) -> torch.Tensor:
    if isinstance(leaf, torch.Tensor):
        return leaf
    if isinstance(leaf, np.ndarray):
        return torch.from_numpy(leaf.copy())
    return torch.tensor(leaf, dtype={bool: torch.bool, int: torch.int64, float: torch.float64}[type(leaf)])


@pytest.mark.parametrize("strings", [False, True])
def test_batches_stack_fixed_leaves_and_list_the_rest(make_record: MakeRecord, strings: bool) -> None:
    """Batch mode: every fixed-shape numeric leaf is one stacked tensor; strings are lists."""
    samples = [_every_kind(i) for i in range(23)]
    if strings:
        for s in samples:
            s["name"] = f"n{s['label']}"
    path = make_record(samples, shuffle=False)
    stored = list(RecordFile(path))
    batches = list(torchrecord.RecordDataset(path, shuffle=False, batch_size=10))
    assert [len(b["label"]) for b in batches] == [10, 10, 3]
    for b, batch in enumerate(batches):
        rows = stored[10 * b : 10 * b + len(batch["label"])]
        assert list(batch) == list(rows[0]), "the batch keeps the sample's structure"
        for key, value in batch.items():
            if key == "name":
                assert value == [r["name"] for r in rows]
                continue
            want = torch.stack([_as_torch(r[key]) for r in rows])
            assert isinstance(value, torch.Tensor), key
            assert value.dtype == want.dtype, key
            assert tuple(value.shape) == tuple(want.shape), key
            assert _bits(value) == _bits(want), key
