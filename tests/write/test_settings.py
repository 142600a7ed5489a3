"""Write-time checks (issue 20, point 7; issue 11, point 10): options that cannot work fail before
the source is read, samples that every reader would refuse are refused when written."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from torchrecord import RecordFile, RecordWriter, write_record
from torchrecord.errors import IgnoredOptionWarning, SchemaError, SourceError


class Untouchable(torch.utils.data.Dataset[Any]):
    """A source that fails the test if the writer reads it."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> Any:
        raise AssertionError("the source was read before the options were checked")


@pytest.mark.parametrize("seed", [2**70, 2**64, -1, 1.5, True])
def test_a_seed_that_cannot_be_stored_fails_at_once(tmp_path: Path, seed: Any) -> None:
    with pytest.raises((ValueError, TypeError), match=r"seed"):
        write_record(Untouchable(), tmp_path / "s.tr", seed=seed, progress=False)
    with pytest.raises((ValueError, TypeError), match=r"seed"):
        RecordWriter(tmp_path / "w.tr", seed=seed)
    assert os.listdir(tmp_path) == []


def test_the_largest_seed_works(tmp_path: Path) -> None:
    rf = write_record(list(range(5)), tmp_path / "s.tr", seed=2**64 - 1, progress=False)
    assert rf.metadata["seed"] == 2**64 - 1


@pytest.mark.parametrize(
    ("metadata", "where"),
    [
        ({"n": 2**70}, r"metadata\['n'\]"),
        ({"a": {"b": [1, -(2**64)]}}, r"metadata\['a'\]\['b'\]\[1\]"),
        ({"a": {1: "x"}}, r"metadata\['a'\].*key 1"),
        ({"f": {1, 2}}, r"metadata\['f'\].*set"),
        ({"t": torch.zeros(1)}, r"metadata\['t'\].*Tensor"),
    ],
)
def test_metadata_that_cannot_be_stored_fails_at_once(tmp_path: Path, metadata: Any, where: str) -> None:
    with pytest.raises((ValueError, TypeError), match=where):
        write_record(Untouchable(), tmp_path / "s.tr", metadata=metadata, progress=False)
    with pytest.raises((ValueError, TypeError), match=where):
        RecordWriter(tmp_path / "w.tr", metadata=metadata)
    assert os.listdir(tmp_path) == []


def test_metadata_that_can_be_stored(tmp_path: Path) -> None:
    meta = {"n": 2**64 - 1, "neg": -(2**63), "t": (1, 2), "b": b"\x00", "nested": {"x": [None, 1.5, True]}}
    rf = write_record([1], tmp_path / "s.tr", metadata=meta, progress=False)
    assert rf.user_metadata["n"] == 2**64 - 1 and rf.user_metadata["t"] == [1, 2]


@pytest.mark.parametrize(
    "bad",
    [
        lambda: torch.tensor([0, 2], dtype=torch.uint8).view(torch.bool),
        lambda: np.array([1, 7], dtype=np.uint8).view(np.bool_),
    ],
)
@pytest.mark.parametrize("first", [False, True])
def test_bool_arrays_must_hold_zero_or_one(tmp_path: Path, bad: Any, first: bool) -> None:
    good = torch.tensor([0, 1], dtype=torch.bool) if "tensor" in repr(bad()).lower() else np.array([0, 1], "?")
    samples = [{"mask": good}] * 5
    samples.insert(0 if first else 3, {"mask": bad()})
    path = tmp_path / "s.tr"
    index = 0 if first else 3
    with pytest.raises(SourceError, match=rf"sample {index}.*field 'mask'.*bool.*0 and 1"):
        write_record(samples, path, shuffle=False, progress=False)
    assert os.listdir(tmp_path) == []
    rf = write_record(samples, path, shuffle=False, on_error="skip", progress=False)
    assert len(rf) == 5 and [s.index for s in rf.write_summary.skipped_samples] == [index]
    assert all(s["mask"].tolist() == [False, True] for s in rf)


def test_rank_above_32_is_refused(tmp_path: Path) -> None:
    deep = np.zeros((1,) * 33, dtype=np.float32)
    with pytest.raises(SourceError, match=r"sample 0.*field 'x'.*rank 33.*32"):
        write_record([{"x": deep}], tmp_path / "s.tr", progress=False)
    rf = write_record([{"x": np.zeros((1,) * 32, dtype=np.float32)}], tmp_path / "ok.tr", progress=False)
    assert rf[0]["x"].ndim == 32


def test_field_names_must_be_unique_after_flattening(tmp_path: Path) -> None:
    path = tmp_path / "s.tr"
    with pytest.raises(SchemaError, match=r"sample 0.*'a\.b'.*twice.*rename"):
        write_record([{"a.b": 1, "a": {"b": 2}}], path, progress=False)
    with pytest.raises(SchemaError, match=r"'a\.b'"), RecordWriter(path) as w:
        w.append({"a.b": 1, "a": {"b": 2}})
    assert os.listdir(tmp_path) == []


def test_bytes_paths_work_like_record_file(tmp_path: Path) -> None:
    path = os.fsencode(tmp_path / "b.tr")
    rf = write_record([1, 2, 3], path, progress=False)
    assert sorted(RecordFile(path)) == [1, 2, 3] and len(rf) == 3
    with RecordWriter(os.fsencode(tmp_path / "w.tr"), progress=False) as w:
        w.append(1)
    assert list(RecordFile(tmp_path / "w.tr")) == [1]


def _stream(n: int) -> Iterator[int]:
    yield from range(n)


def test_workers_with_an_iterable_source_are_not_silently_ignored(tmp_path: Path) -> None:
    with pytest.warns(IgnoredOptionWarning, match=r"num_workers=2.*iterable.*DataLoader"):
        rf = write_record(_stream(10), tmp_path / "s.tr", num_workers=2, progress=False)
    assert sorted(rf) == list(range(10))


def test_unknown_leaf_types_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"sample 0.*field 'meta\.x'.*cannot store a leaf of type set"):
        write_record([{"meta": {"x": {1}}}], tmp_path / "s.tr", progress=False)
