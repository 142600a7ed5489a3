"""Fuzz the record decoder and the metadata checks with hypothesis.

Every input either decodes to exactly what was written (or, for a mutated
record, to a sample that fits the schema), or raises a torchrecord error: no
other exception, no crash, no hang, and no allocation beyond a small multiple of
the record's size. Inputs: random bytes, and valid records with flipped bits,
truncations, spliced bytes, and structural edits made with the protobuf API and
by hand (dims that do not match the data, absurd or negative dims, unknown
dtype codes, wrong field and string counts).

The number of inputs decoded is printed at the end of the module's run
("fuzz: N inputs decoded"); ``--runslow`` adds long random runs of each property.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import random
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchrecord
from tests.helpers import varint, wire_field
from tests.write.test_reliability import report_line
from torchrecord._core import dtypes as _dtypes
from torchrecord._core.codec import decode_leaves, encode_payloads
from torchrecord._core.kinds import materialize
from torchrecord._core.schema import Field, Schema
from torchrecord._core.structure import unflatten
from torchrecord._proto import torchrecord_pb2 as pb
from torchrecord._store import format as _format
from torchrecord._write.sources import normalize
from torchrecord.errors import FormatError

_INPUTS = {"decoded": 0}
#: set once a decode ran in this process (the first one loads what every later one shares)
_WARMED: list[bool] = []


@pytest.fixture(scope="module", autouse=True)
def _report_count(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    report_line(request, f"fuzz: {_INPUTS['decoded']} inputs decoded by tests/test_fuzz.py")


def fuzz_settings(examples: int, *, slow: bool = False) -> Callable[[Any], Any]:
    """Default runs are deterministic (the same inputs in every CI run); slow runs are random."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=not slow,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# -- samples ------------------------------------------------------------------------

_DTYPES = [info.name for info in _dtypes._TABLE]


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    info = _dtypes.by_name(draw(st.sampled_from(_DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    size = int(np.prod(shape, dtype=np.int64)) * info.itemsize
    raw = bytearray(draw(st.binary(min_size=size, max_size=size)))
    if info.name == "bool":
        raw = bytearray(b & 1 for b in raw)
    return np.frombuffer(bytes(raw), dtype=info.numpy).reshape(shape).copy()


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    tensor = torch.from_numpy(draw(arrays()).copy())
    if tensor.dtype == torch.uint16 and draw(st.booleans()):
        tensor = tensor.view(torch.bfloat16)
    return tensor


leaves = st.one_of(
    arrays(),
    tensors(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.booleans(),
    st.binary(max_size=40),
    st.text(max_size=20),
)

samples = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.tuples(inner, inner),
        st.lists(inner, min_size=1, max_size=3),
        st.dictionaries(st.text(min_size=1, max_size=5), inner, min_size=1, max_size=3),
    ),
    max_leaves=6,
)


def encoded(sample: Any, widen: bool = False) -> tuple[bytes, list[Field], list[Any], Any]:
    """(record bytes, schema fields, payloads, tree) for one sample; ``widen`` makes dims variable."""
    norm = normalize(sample)
    schema = Schema.from_first(norm.tree, norm.signatures)
    fields = schema.fields
    if widen:
        fields = [Field(f.name, f.kind, f.dtype, tuple(None for _ in f.shape)) for f in fields]
    return encode_payloads(norm.payloads, norm.signatures), fields, norm.payloads, norm.tree


# -- the property ---------------------------------------------------------------------


def check_decode(value: bytes, fields: list[Field], tree: Any, original: bytes, payloads: list[Any]) -> None:
    """Decode ``value``; it must raise a FormatError or give a schema-conforming sample.

    If ``value`` is the original record it must give exactly the written payloads.
    Memory: the Python/NumPy allocation peak stays within 4x the input + 64 KiB.
    """
    _INPUTS["decoded"] += 1
    where = "fuzz: record 0"
    error: FormatError | None = None
    if not _WARMED:  # what the first decode in a process loads (about 100 KiB) is not the decode's to count:
        _WARMED.append(True)  # the codecs' module (a mutated record can name a codec), then one decode
        with contextlib.suppress(ImportError):
            importlib.import_module("cramjam")
        with contextlib.suppress(FormatError):
            leaves = decode_leaves(original, fields, where)
            unflatten(tree, [materialize(p, f, where) for p, f in zip(leaves, fields, strict=True)])
    tracemalloc.start()
    try:
        out = decode_leaves(value, fields, where)
        unflatten(tree, [materialize(p, f, where) for p, f in zip(out, fields, strict=True)])
    except FormatError as exc:
        error = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 4 * len(value) + (64 << 10), f"decode of {len(value)} bytes peaked at {peak} bytes"
    if error is not None:
        assert where in str(error)
        return
    assert len(out) == len(fields)
    for got, fld in zip(out, fields, strict=True):
        if not fld.is_numeric:
            assert isinstance(got, bytes)
            continue
        info = _dtypes.by_name(fld.dtype)
        assert isinstance(got, np.ndarray)
        assert got.dtype == info.numpy
        assert got.ndim == len(fld.shape)
        assert all(s is None or s == d for d, s in zip(got.shape, fld.shape, strict=True))
    if value == original:
        for got, want in zip(out, payloads, strict=True):
            if isinstance(want, bytes):
                assert got == want
            else:
                assert got.dtype == want.dtype and got.shape == want.shape
                assert got.tobytes() == want.tobytes()


def detected_by_crc(original: bytes, value: bytes) -> None:
    """Bit flips and truncations of a record always change its CRC-32."""
    if value != original:
        assert zlib.crc32(value) != zlib.crc32(original)


# -- mutations --------------------------------------------------------------------------


def hand_made(dims: list[int], dtype_code: int, raw: bytes, strings: list[bytes], nfields: int) -> bytes:
    """A TensorProtos written byte by byte: any dims (negative, 2**60...), any dtype code."""
    proto = b"".join(wire_field(1, 0, varint(d)) for d in dims)
    proto += wire_field(2, 0, varint(dtype_code)) + wire_field(12, 0, varint(2))
    proto += b"".join(wire_field(6, 2, varint(len(s)) + s) for s in strings)
    if raw:
        proto += wire_field(13, 2, varint(len(raw)) + raw)
    one = wire_field(1, 2, varint(len(proto)) + proto)
    return one * nfields


_DTYPE_CODES = list(pb.TensorProto.DataType.values())
_ODD_CODES = [0, 3, 11, 14, 99, 103, 2**31 - 1, -1]
_ODD_DIMS = [0, 1, 2, 3, 8, 2**31, 2**32 + 1, 2**60, 2**62, 2**63 - 1, -1, -(2**63)]


def _dims(rng: random.Random) -> list[int]:
    return [rng.choice(_ODD_DIMS) if rng.random() < 0.5 else rng.randrange(9) for _ in range(rng.randrange(6))]


def structural_edit(value: bytes, rng: random.Random) -> bytes:
    """Edit a valid record through the protobuf API: dims, dtype, counts, payload lengths."""
    msg = pb.TensorProtos.FromString(value)
    protos = msg.protos
    choice = rng.randrange(8)
    if choice == 7 or not len(protos):  # unknown dtype codes and absurd dims, written by hand
        codes = [p.data_type for p in protos] + _ODD_CODES
        return hand_made(
            _dims(rng),
            rng.choice(codes),
            rng.randbytes(rng.choice([0, 0, 1, 4, 16])),
            [rng.randbytes(rng.randrange(4)) for _ in range(rng.randrange(3))],
            rng.randrange(4),
        )
    p = protos[rng.randrange(len(protos))]
    if choice == 0:  # drop a field
        del protos[rng.randrange(len(protos))]
    elif choice == 1:  # add a field
        protos.add().CopyFrom(p)
    elif choice == 2:  # dims that do not match the data: absurd, negative, zero or merely wrong
        del p.dims[:]
        p.dims.extend(_dims(rng))
    elif choice == 3:  # another known dtype
        p.data_type = rng.choice(_DTYPE_CODES)  # type: ignore[assignment]
    elif choice == 4:  # payload cut or extended
        p.raw_data = p.raw_data[: rng.randrange(len(p.raw_data) + 1)] + rng.randbytes(rng.randrange(9))
    elif choice == 5:  # string counts
        del p.string_data[:]
        p.string_data.extend(rng.randbytes(rng.randrange(5)) for _ in range(rng.randrange(4)))
    else:  # storage type and name: fields the reader ignores
        p.storage_type = rng.choice(list(pb.TensorProto.StorageType.values()))  # type: ignore[assignment]
        p.name = str(rng.random())
    return msg.SerializeToString()


def byte_mutation(value: bytes, rng: random.Random) -> tuple[bytes, bool]:
    """(mutated bytes, whether CRC-32 must catch it): bit flips, truncation, splices, insertions."""
    choice = rng.randrange(4)
    if choice == 0 and value:  # flip 1..3 bits of one byte (a burst < 32 bits): CRC-32 always catches it
        out = bytearray(value)
        pos = rng.randrange(len(value))
        for bit in rng.sample(range(8), rng.randint(1, 3)):
            out[pos] ^= 1 << bit
        return bytes(out), True
    if choice == 1:  # truncation
        return value[: rng.randrange(len(value) + 1)], False
    if choice == 2:  # overwrite a slice with random bytes
        start = rng.randrange(len(value) + 1)
        junk = rng.randbytes(rng.randrange(1, 13))
        return value[:start] + junk + value[start + len(junk) :], False
    at = rng.randrange(len(value) + 1)  # insertion
    return value[:at] + rng.randbytes(rng.randrange(1, 13)) + value[at:], False


def mutations(value: bytes, seed: int, n: int) -> Iterator[tuple[bytes, bool]]:
    """``n`` mutations of ``value``, half byte-level and half structural, from one seed."""
    rng = random.Random(seed)
    for i in range(n):
        yield byte_mutation(value, rng) if i % 2 == 0 else (structural_edit(value, rng), False)


# -- tests --------------------------------------------------------------------------------


def _valid_records_decode_to_exactly_what_was_written(sample: Any, widen: bool) -> None:
    value, fields, payloads, tree = encoded(sample, widen)
    check_decode(value, fields, tree, value, payloads)
    out = decode_leaves(value, fields, "fuzz")  # and it does not raise
    assert len(out) == len(fields)


@fuzz_settings(200)
@given(sample=samples, widen=st.booleans())
def test_valid_records_decode_to_exactly_what_was_written(sample: Any, widen: bool) -> None:
    _valid_records_decode_to_exactly_what_was_written(sample, widen)


@pytest.mark.slow
@fuzz_settings(5000, slow=True)
@given(sample=samples, widen=st.booleans())
def test_valid_records_decode_to_exactly_what_was_written_long(sample: Any, widen: bool) -> None:
    _valid_records_decode_to_exactly_what_was_written(sample, widen)


def _mutated_records_raise_a_format_error_or_fit_the_schema(sample: Any, widen: bool, seed: int) -> None:
    value, fields, payloads, tree = encoded(sample, widen)
    for mutated, crc_must_catch in mutations(value, seed, 40):
        check_decode(mutated, fields, tree, value, payloads)
        if crc_must_catch:
            detected_by_crc(value, mutated)


@fuzz_settings(150)
@given(sample=samples, widen=st.booleans(), seed=st.integers(0, 2**32))
def test_mutated_records_raise_a_format_error_or_fit_the_schema(sample: Any, widen: bool, seed: int) -> None:
    _mutated_records_raise_a_format_error_or_fit_the_schema(sample, widen, seed)


@pytest.mark.slow
@fuzz_settings(5000, slow=True)
@given(sample=samples, widen=st.booleans(), seed=st.integers(0, 2**32))
def test_mutated_records_raise_a_format_error_or_fit_the_schema_long(sample: Any, widen: bool, seed: int) -> None:
    _mutated_records_raise_a_format_error_or_fit_the_schema(sample, widen, seed)


def _random_bytes_raise_a_format_error_or_fit_the_schema(sample: Any, junk: bytes) -> None:
    value, fields, payloads, tree = encoded(sample, widen=True)
    check_decode(junk, fields, tree, value, payloads)


@fuzz_settings(300)
@given(sample=samples, junk=st.binary(max_size=300))
def test_random_bytes_raise_a_format_error_or_fit_the_schema(sample: Any, junk: bytes) -> None:
    _random_bytes_raise_a_format_error_or_fit_the_schema(sample, junk)


@pytest.mark.slow
@fuzz_settings(30000, slow=True)
@given(sample=samples, junk=st.binary(max_size=300))
def test_random_bytes_raise_a_format_error_or_fit_the_schema_long(sample: Any, junk: bytes) -> None:
    _random_bytes_raise_a_format_error_or_fit_the_schema(sample, junk)


@pytest.mark.parametrize(
    "dims",
    [
        [2**60],
        [2**62, 0],
        [2**63 - 1, 0, 2**63 - 1],
        [-1],
        [-(2**63)],
        [0, -4],
        [2**31, 2**31],
        [3, 3, 3, 3, 3],
    ],
)
@pytest.mark.parametrize("code", [1, 6, 10, 0, 99, 2**31 - 1])
def test_absurd_dims_and_unknown_dtypes(dims: list[int], code: int) -> None:
    """Dims far beyond the data, negative dims, unknown dtype codes: a CorruptRecordError."""
    for shape in [(None,) * len(dims), (4,)]:
        for raw in (b"", b"\x01" * 4):
            fields = [Field("x", "tensor", "uint8", shape)]
            value = hand_made(dims, code, raw, [], 1)
            _INPUTS["decoded"] += 1
            try:
                (out,) = decode_leaves(value, fields, "fuzz")
            except torchrecord.errors.CorruptRecordError as exc:
                assert "fuzz, field 'x'" in str(exc)
                continue
            # only a consistent record decodes: uint8, no negative dim, as many bytes as the dims say
            assert code == 6 and min(dims) >= 0 and math.prod(dims) == len(raw)
            assert out.shape == tuple(dims) and out.tobytes() == raw


def test_decode_of_a_huge_claimed_length_allocates_nothing_big() -> None:
    """A record claiming 2**40 bytes of raw data but holding 10 is refused without allocating."""
    proto = wire_field(1, 0, varint(4)) + wire_field(2, 0, varint(2)) + wire_field(13, 2, varint(2**40)) + b"x" * 10
    value = wire_field(1, 2, varint(len(proto)) + proto)
    fields = [Field("x", "tensor", "uint8", (None,))]
    check_decode(value, fields, {"t": "leaf"}, b"", [])
    with pytest.raises(torchrecord.errors.CorruptRecordError):
        decode_leaves(value, fields, "fuzz")


# -- RecordFile.decode on a real record set -----------------------------------------------


class _Mixed(torch.utils.data.Dataset[Any]):
    """Samples with every kind of leaf, fixed and variable shapes."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        return {
            "image": torch.full((3, 4, 2 + i % 3), i, dtype=torch.uint8),
            "emb": np.arange(4, dtype=np.float32) * i,
            "label": i,
            "score": i / 3,
            "ok": bool(i % 2),
            "raw": bytes([i]) * i,
            "name": f"s{i}",
            "half": torch.full((2,), i, dtype=torch.bfloat16),
        }


@pytest.fixture(scope="module")
def mixed_record(tmp_path_factory: pytest.TempPathFactory) -> torchrecord.RecordFile:
    path = tmp_path_factory.mktemp("fuzz") / "mixed.tr"
    torchrecord.write_record(_Mixed(), path, shuffle=False, progress=False, schema={"image": [3, 4, None]})
    return torchrecord.RecordFile(path)


def _recordfile_decode_of_mutated_records(mixed_record: torchrecord.RecordFile, seed: int) -> None:
    rng = random.Random(seed)
    index = rng.randrange(len(mixed_record))
    value = mixed_record.raw(index)
    expected = _Mixed()[index]
    for mutated, _ in mutations(value, seed, 20):
        _INPUTS["decoded"] += 1
        try:
            sample = mixed_record.decode(mutated, index)
        except FormatError as exc:
            assert f"record {index}" in str(exc)
            continue
        assert set(sample) == set(expected)
        assert isinstance(sample["image"], torch.Tensor) and sample["image"].dtype == torch.uint8
        assert sample["image"].shape[:2] == (3, 4)
        assert isinstance(sample["emb"], np.ndarray) and sample["emb"].shape == (4,)
        assert isinstance(sample["label"], int) and isinstance(sample["score"], float)
        assert isinstance(sample["ok"], bool) and isinstance(sample["raw"], bytes)
        assert isinstance(sample["name"], str) and sample["half"].dtype == torch.bfloat16
        if mutated == value:
            assert torch.equal(sample["image"], expected["image"]) and sample["name"] == expected["name"]


@fuzz_settings(100)
@given(seed=st.integers(0, 2**32))
def test_recordfile_decode_of_mutated_records(mixed_record: torchrecord.RecordFile, seed: int) -> None:
    _recordfile_decode_of_mutated_records(mixed_record, seed)


@pytest.mark.slow
@fuzz_settings(3000, slow=True)
@given(seed=st.integers(0, 2**32))
def test_recordfile_decode_of_mutated_records_long(mixed_record: torchrecord.RecordFile, seed: int) -> None:
    _recordfile_decode_of_mutated_records(mixed_record, seed)


def test_recordfile_decode_of_every_unmutated_record(mixed_record: torchrecord.RecordFile) -> None:
    for i in range(len(mixed_record)):
        got, want = mixed_record[i], _Mixed()[i]
        assert torch.equal(got["image"], want["image"]) and np.array_equal(got["emb"], want["emb"])
        assert (got["label"], got["score"], got["ok"], got["raw"], got["name"]) == (
            want["label"],
            want["score"],
            want["ok"],
            want["raw"],
            want["name"],
        )
        assert torch.equal(got["half"], want["half"])


# -- metadata -------------------------------------------------------------------------------


def _good_meta() -> dict[str, Any]:
    norm = normalize(_Mixed()[1])
    schema = Schema.from_first(norm.tree, norm.signatures)
    return {
        "format": "torchrecord",
        "format_version": 1,
        "library_version": torchrecord.__version__,
        "count": 8,
        "records": 8,
        "samples_per_record": 1,
        "schema": schema.to_dict(),
        "shuffled": False,
        "seed": 0,
        "skipped": 0,
        "checksum": "crc32",
        "created": "2026-01-01T00:00:00+00:00",
        "user": {},
        "complete": True,
    }


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _replace(obj: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        return {k: (_replace(v, rest, new) if k == head else v) for k, v in obj.items()}
    return [(_replace(v, rest, new) if i == head else v) for i, v in enumerate(obj)]


def _use_metadata(meta: dict[str, Any]) -> None:
    """What RecordFile does with metadata: build the schema, rebuild a sample's structure."""
    schema = Schema.from_dict(meta["schema"]) if meta.get("schema") is not None else Schema({"t": "leaf"}, [])
    dummy = [None] * len(schema.fields)
    unflatten(schema.tree, dummy)
    for f in schema.fields:
        if f.is_numeric:
            _dtypes.by_name(f.dtype)
    int(meta["count"])


def _damaged_metadata_is_a_format_error_or_usable(data: st.DataObject) -> None:
    meta = _good_meta()
    paths = list(_paths(meta))
    for _ in range(3):
        where = data.draw(st.sampled_from(paths))
        meta = _replace(meta, where, data.draw(json_like))
        paths = list(_paths(meta))
    raw = _format.pack_metadata(meta) if isinstance(meta, dict) else msgpack.packb(meta)
    if data.draw(st.booleans()):
        raw, _ = byte_mutation(raw, random.Random(data.draw(st.integers(0, 2**32))))
    _INPUTS["decoded"] += 1
    try:
        checked = _format.check_metadata(_format.unpack_metadata(raw, "fuzz.tr"), "fuzz.tr")
    except FormatError as exc:
        assert "fuzz.tr" in str(exc)
        return
    _use_metadata(checked)


@fuzz_settings(200)
@given(data=st.data())
def test_damaged_metadata_is_a_format_error_or_usable(data: st.DataObject) -> None:
    _damaged_metadata_is_a_format_error_or_usable(data)


@pytest.mark.slow
@fuzz_settings(20000, slow=True)
@given(data=st.data())
def test_damaged_metadata_is_a_format_error_or_usable_long(data: st.DataObject) -> None:
    _damaged_metadata_is_a_format_error_or_usable(data)


def test_good_metadata_passes_the_checks() -> None:
    _use_metadata(_format.check_metadata(_good_meta(), "x"))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("count", -1, "count"),
        ("count", "8", "count"),
        ("records", 3, "records"),
        ("samples_per_record", 0, "samples_per_record"),
        ("checksum", "md5", "checksum"),
        ("user", [1], "user"),
        ("schema", {"tree": {"t": "leaf"}, "fields": []}, "leaves"),
        ("schema", {"tree": {"t": "tuple", "c": "x"}, "fields": []}, "structure"),
        ("schema", None, "no schema"),
    ],
)
def test_metadata_checks_name_the_problem(key: str, value: Any, message: str) -> None:
    meta = _good_meta()
    meta[key] = value
    with pytest.raises(FormatError, match=message):
        _format.check_metadata(meta, "x.tr")


def test_deep_metadata_tree_is_refused_without_recursion_error() -> None:
    tree: dict[str, Any] = {"t": "leaf"}
    for _ in range(200):
        tree = {"t": "list", "c": [tree]}
    meta = _good_meta()
    meta["schema"] = {"tree": tree, "fields": meta["schema"]["fields"][:1]}
    _INPUTS["decoded"] += 1
    with pytest.raises(FormatError):
        _format.check_metadata(_format.unpack_metadata(_format.pack_metadata(meta), "x.tr"), "x.tr")


# -- atheris (coverage-guided), optional -------------------------------------------------------


@pytest.mark.slow
def test_atheris_short_run(tmp_path: Path) -> None:
    """A short coverage-guided run of scripts/fuzz_atheris.py (needs `pip install atheris`)."""
    pytest.importorskip("atheris")
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "fuzz_atheris.py"
    result = subprocess.run(
        [sys.executable, str(script), "-atheris_runs=20000", f"-artifact_prefix={tmp_path}/"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
