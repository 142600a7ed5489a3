"""The codec registry keeps the recipe of docs/ARCHITECTURE.md ("How to add a compression codec").

Every registered codec has its name in the ``Codec`` literal, its ``StorageType``
value in proto/torchrecord.proto and the generated module, its rows in
docs/FORMAT.md and docs/compression.md, round-trips at its levels, and a set
written with it reads back the same through every path; no module outside the
codec package branches on a codec's name.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchrecord
from torchrecord._core import compress
from torchrecord._core.compression import BY_STORAGE, CODECS, Codec, CompressionCodec, register
from torchrecord._core.compression.base import Compressor, Decompressor
from torchrecord._proto import torchrecord_pb2 as pb
from torchrecord._store import format as _format
from torchrecord._write import settings as write_settings
from torchrecord.errors import ArgumentError

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGE = ROOT / "torchrecord"
NAMES = list(CODECS)
needs_cramjam = pytest.mark.skipif(importlib.util.find_spec("cramjam") is None, reason="the compress extra")


def _texts() -> dict[str, str]:
    return {
        "proto": (ROOT / "proto" / "torchrecord.proto").read_text(encoding="utf-8"),
        "format": (ROOT / "docs" / "FORMAT.md").read_text(encoding="utf-8"),
        "compression": (ROOT / "docs" / "compression.md").read_text(encoding="utf-8"),
    }


def recipe_problems(codec: CompressionCodec, texts: dict[str, str]) -> list[str]:
    """What the recipe asks for that ``codec`` lacks (an empty list: it follows the recipe)."""
    problems = []
    enum = codec.name.upper()
    value = int(codec.storage_type)
    if codec.name not in get_args(Codec):
        problems.append(f"{codec.name!r} is not in the Codec literal")
    storage = re.search(r"enum StorageType \{(.*?)\}", texts["proto"], re.S)
    if storage is None or not re.search(rf"^\s*{enum} = {value};", storage.group(1), re.M):
        problems.append(f"proto/torchrecord.proto has no StorageType {enum} = {value}")
    if pb.TensorProto.StorageType.DESCRIPTOR.values_by_number.get(value) is None:
        problems.append(f"the generated module has no StorageType {value}: run scripts/gen_proto.py")
    elif pb.TensorProto.StorageType.Name(value) != enum:  # type: ignore[arg-type]
        problems.append(f"StorageType {value} is {pb.TensorProto.StorageType.Name(value)}, not {enum}")  # type: ignore[arg-type]
    if value < 100:
        problems.append(f"storage_type {value} is caffe2's range; torchrecord's extensions start at 100")
    if f"| `{enum} = {value}` |" not in texts["format"]:
        problems.append(f"docs/FORMAT.md has no storage_type row `{enum} = {value}`")
    if f"{codec.max_ratio:,}" not in texts["format"]:
        problems.append(f"docs/FORMAT.md does not state {codec.name}'s expansion bound {codec.max_ratio:,}")
    low, high = codec.levels
    row = re.search(rf'^\| `"{re.escape(codec.name)}"` \|(.*)$', texts["compression"], re.M)
    if row is None:
        problems.append(f"docs/compression.md has no codec row for {codec.name!r}")
    elif f"`{enum} = {value}`" not in row.group(1) or f"{low} .. {high}" not in row.group(1):
        problems.append(f"docs/compression.md's row for {codec.name!r} lacks `{enum} = {value}` or {low} .. {high}")
    return problems


@pytest.mark.parametrize("name", NAMES)
def test_every_codec_follows_the_recipe(name: str) -> None:
    codec = CODECS[name]
    assert codec.name == name and BY_STORAGE[int(codec.storage_type)] is codec
    assert recipe_problems(codec, _texts()) == []


def test_the_registry_and_the_literal_agree() -> None:
    assert tuple(CODECS) == get_args(Codec)
    assert len({int(c.storage_type) for c in CODECS.values()}) == len(CODECS)
    assert tuple(sorted(CODECS)) == _format.COMPRESSION_CODECS
    assert {name: c.max_ratio for name, c in CODECS.items()} == compress.MAX_RATIO
    # the writers' option types are the registry's (re-exported where they were)
    assert write_settings.Codec is Codec


def test_the_recipe_check_can_fail() -> None:
    """Control: a codec that skipped the proto, the docs and the literal is reported for each."""

    class Brotli(CompressionCodec):
        name = "brotli"
        storage_type = 102
        max_ratio = 12345
        levels = (0, 11)
        levels_name = "brotli's levels"

        def compressor(self, library: object, level: int | None) -> Compressor:
            raise AssertionError("not called")

        def decompressor(self, library: object) -> Decompressor:
            raise AssertionError("not called")

    problems = recipe_problems(Brotli(), _texts())
    assert len(problems) == 6, problems
    with pytest.raises(torchrecord.errors.InternalError, match="clashes"):
        register(CODECS["zstd"])  # a second codec under a registered name or storage type


@needs_cramjam
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=4096),
    repeat=st.integers(1, 64),
    level=st.sampled_from(["default", "low", "high"]),
)
def test_round_trips_at_its_levels(name: str, data: bytes, repeat: int, level: str) -> None:
    codec = CODECS[name]
    lib = codec.library("the test")
    chosen = {"default": None, "low": codec.levels[0], "high": codec.levels[1]}[level]
    raw = data * repeat  # repeats: something to compress
    stored = codec.compressor(lib, chosen)(raw)
    out = bytearray(len(raw))
    assert codec.decompressor(lib)(stored, out) == len(raw) and bytes(out) == raw
    assert codec.stated_size(stored) in (None, len(raw))
    compress.check_expansion(name, stored, len(raw), "x")  # what the codec really made is within its bound
    assert compress.decompress(int(codec.storage_type), stored, len(raw), "x") == raw


@needs_cramjam
@pytest.mark.parametrize("name", NAMES)
def test_levels_outside_its_range_are_refused(name: str) -> None:
    low, high = CODECS[name].levels
    compress.parse_option(name, low)
    compress.parse_option({"a": name, "b": None}, high)
    for bad in (low - 1, high + 1):
        with pytest.raises(ArgumentError, match=rf"outside {re.escape(CODECS[name].levels_name)} {low} \.\. {high}"):
            compress.parse_option(name, bad)


@needs_cramjam
@pytest.mark.parametrize("name", NAMES)
def test_a_set_written_with_it_reads_back_by_every_path(tmp_path: Path, name: str) -> None:
    rows = [{"image": np.full((4, 64), i % 5, np.uint8), "label": i} for i in range(64)]
    rf = torchrecord.write_record(rows, tmp_path / "c.tr", shuffle=False, compression=name, progress=False)
    assert rf.schema.fields[0].compression == name and rf.metadata["compression"]["image"]["applied"]
    assert pb.TensorProtos.FromString(rf.raw(0)).protos[0].storage_type == CODECS[name].storage_type
    assert [int(rf[i]["label"]) for i in range(64)] == list(range(64))  # the checked decoder
    ds = torchrecord.RecordDataset(rf.path, batch_size=16, shuffle=False)
    assert ds._fixed_layout().expander.codecs == (name,)  # type: ignore[union-attr]  # the fast path
    for batch in ds:
        for image, label in zip(batch["image"], batch["label"].tolist()):
            assert torch.equal(image, torch.full((4, 64), label % 5, dtype=torch.uint8))
    assert torchrecord.verify(rf.path, progress=False).ok


def _codec_comparisons(path: Path, root: Path = PACKAGE) -> list[str]:
    """``x == "zstd"``-like comparisons (and ``in`` tests) with a codec's name in the module at ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = [
                c.value
                for o in operands
                for c in ([o] if not isinstance(o, ast.Tuple | ast.List | ast.Set) else o.elts)
                if isinstance(c, ast.Constant) and c.value in CODECS
            ]
            if names:
                found.append(f"{path.relative_to(root)}:{node.lineno}: compares with {names}")
    return found


def test_no_module_outside_the_codecs_branches_on_a_codec_name() -> None:
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if "compression" not in path.relative_to(PACKAGE).parts
        for hit in _codec_comparisons(path)
    ]
    assert found == []


def test_the_branch_scan_can_fail(tmp_path: Path) -> None:
    """Control: the scan finds the if-chain the registry replaced."""
    planted = tmp_path / "m.py"
    planted.write_text('def f(codec):\n    if codec == "zstd":\n        return 1\n    return codec in ("lz4", "x")\n')
    assert _codec_comparisons(planted, tmp_path) == [
        "m.py:2: compares with ['zstd']",
        "m.py:4: compares with ['lz4']",
    ]
