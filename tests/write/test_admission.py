"""on_error="skip" (issue 11, point 2): never an empty set reported as success, max_skipped,
and the skipped samples kept in the metadata and in the write summary."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import torchrecord
from torchrecord import RecordFile, RecordWriter, SkippedSample, WriteSummary, write_record
from torchrecord.errors import SourceError


class Flaky(torch.utils.data.Dataset[Any]):
    """n samples (i, label i); the indices in ``bad`` raise ValueError."""

    def __init__(self, n: int, bad: set[int]) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i in self.bad:
            raise ValueError(f"bad sample {i}")
        return (torch.tensor([i]), i)


class FlakyStream:
    """An iterator (not a generator) of n samples; the indices in ``bad`` raise and it goes on."""

    def __init__(self, n: int, bad: set[int]) -> None:
        self.n, self.bad = n, bad

    def __iter__(self) -> Iterator[Any]:
        return _Steps(self.n, self.bad)


class _Steps:
    def __init__(self, n: int, bad: set[int]) -> None:
        self.n, self.bad, self.i = n, bad, 0

    def __iter__(self) -> _Steps:
        return self

    def __next__(self) -> Any:
        i = self.i
        if i >= self.n:
            raise StopIteration
        self.i += 1
        if i in self.bad:
            raise ValueError(f"bad sample {i}")
        return (torch.tensor([i]), i)


@pytest.mark.parametrize("source", ["map", "iterable"])
def test_skipping_every_sample_is_an_error_and_writes_nothing(tmp_path: Path, source: str) -> None:
    n = 100
    data: Any = Flaky(n, set(range(n))) if source == "map" else FlakyStream(n, set(range(n)))
    path = tmp_path / "set.tr"
    with pytest.raises(SourceError) as info:
        write_record(data, path, on_error="skip", progress=False)
    message = str(info.value)
    assert str(path) in message and "100 of 100" in message
    assert "sample 0: ValueError: bad sample 0" in message and "sample 1: ValueError" in message
    assert os.listdir(tmp_path) == []


def test_a_pushed_write_that_keeps_nothing_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "set.tr"
    writer = RecordWriter(path, on_error="skip", progress=False)
    writer.append({"x": {1, 2}})  # a set is not storable: skipped
    with pytest.raises(SourceError, match="1 of 1"):
        writer.close()
    assert os.listdir(tmp_path) == []


def test_an_empty_source_still_writes_an_empty_set(tmp_path: Path) -> None:
    with pytest.warns(torchrecord.TorchRecordWarning, match="no samples"):
        rf = write_record([], tmp_path / "empty.tr", on_error="skip", progress=False)
    assert len(rf) == 0 and rf.write_summary.skipped == 0


@pytest.mark.parametrize("source", ["map", "iterable"])
def test_max_skipped_as_a_count(tmp_path: Path, source: str) -> None:
    bad = {3, 10, 11}

    def data() -> Any:
        return Flaky(50, bad) if source == "map" else FlakyStream(50, bad)

    rf = write_record(data(), tmp_path / "ok.tr", on_error="skip", max_skipped=3, progress=False)
    assert len(rf) == 47
    with pytest.raises(SourceError, match=r"max_skipped=2") as info:
        write_record(data(), tmp_path / "no.tr", on_error="skip", max_skipped=2, progress=False)
    assert "sample 3: ValueError: bad sample 3" in str(info.value)
    assert not (tmp_path / "no.tr").exists()


@pytest.mark.parametrize("source", ["map", "iterable", "writer"])
def test_max_skipped_as_a_fraction(tmp_path: Path, source: str) -> None:
    bad = set(range(0, 100, 10))  # 10%

    def write(path: Path, fraction: float) -> RecordFile:
        if source == "writer":
            with RecordWriter(path, on_error="skip", max_skipped=fraction, progress=False) as w:
                for i in range(100):
                    w.append({"x": {i}} if i in bad else {"x": i})
            assert w.result is not None
            return w.result
        data: Any = Flaky(100, bad) if source == "map" else FlakyStream(100, bad)
        return write_record(data, path, on_error="skip", max_skipped=fraction, progress=False)

    assert len(write(tmp_path / "ok.tr", 0.1)) == 90
    with pytest.raises(SourceError, match=r"max_skipped=0\.05"):
        write(tmp_path / "no.tr", 0.05)
    assert not (tmp_path / "no.tr").exists()


@pytest.mark.parametrize("value", [-1, 1.0, 0.0, 1.5, True, "3"])
def test_bad_max_skipped_values(tmp_path: Path, value: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="max_skipped"):
        write_record([1], tmp_path / "s.tr", on_error="skip", max_skipped=value, progress=False)
    with pytest.raises(ValueError, match="max_skipped"):
        write_record([1], tmp_path / "s.tr", max_skipped=3, progress=False)  # needs on_error="skip"
    assert os.listdir(tmp_path) == []


def test_skipped_samples_are_in_the_summary_and_the_metadata(tmp_path: Path) -> None:
    bad = {2, 5, 40}
    rf = write_record(Flaky(50, bad), tmp_path / "s.tr", on_error="skip", num_workers=0, progress=False)
    summary = rf.write_summary
    assert isinstance(summary, WriteSummary)
    assert summary.count == 47 and summary.skipped == 3
    assert [s.index for s in summary.skipped_samples] == [2, 5, 40]
    assert summary.skipped_samples[0] == SkippedSample(2, "ValueError: bad sample 2")
    again = RecordFile(rf.path)  # read back from the metadata
    assert again.write_summary == summary
    assert again.metadata["skipped_samples"][1] == {"index": 5, "error": "ValueError: bad sample 5"}


def test_the_metadata_keeps_the_first_thousand_skipped_and_the_total(tmp_path: Path) -> None:
    n = 2600
    bad = set(range(0, n, 2))  # 1,300 bad
    rf = write_record(Flaky(n, bad), tmp_path / "s.tr", on_error="skip", progress=False)
    assert len(rf.write_summary.skipped_samples) == 1300  # the returned summary holds them all
    stored = RecordFile(rf.path).write_summary
    assert stored.skipped == 1300
    assert [s.index for s in stored.skipped_samples] == sorted(bad)[:1000]


def test_the_raise_message_suggests_skip_with_max_skipped(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"on_error='skip'.*max_skipped=") as info:
        write_record(Flaky(10, {4}), tmp_path / "s.tr", progress=False)
    assert "sample 4" in str(info.value)


def test_writer_summary_of_a_clean_write(tmp_path: Path) -> None:
    with RecordWriter(tmp_path / "w.tr", progress=False) as w:
        w.append(1)
    assert w.result is not None
    assert w.result.write_summary == WriteSummary(count=1, skipped=0, skipped_samples=(), variable_fields={})
    assert torchrecord.WriteSummary is WriteSummary


# -- issue 27: skip covers samples that do not fit the schema; the first failures by source index --------


def test_record_writer_skips_a_sample_whose_field_changes_kind(tmp_path: Path) -> None:
    with RecordWriter(tmp_path / "w.tr", on_error="skip", shuffle=False, progress=False) as w:
        for sample in ({"a": 1}, {"a": "x"}, {"a": 2}, {"b": 3}, {"a": 4}):
            w.append(sample)
    rf = w.result
    assert rf is not None and [int(s["a"]) for s in rf] == [1, 2, 4]
    skipped = rf.write_summary.skipped_samples
    assert [s.index for s in skipped] == [1, 3]
    assert skipped[0].error.startswith("SchemaError: field 'a': str of str differs")
    assert str(rf.schema) == "a: int int64[]"


def test_a_skipped_sample_leaves_nothing_in_the_schema(tmp_path: Path) -> None:
    rows = [{"x": torch.zeros(3), "y": 1}, {"x": torch.zeros(4), "y": "s"}, {"x": torch.zeros(3), "y": 2}]
    rf = write_record(rows, tmp_path / "s.tr", on_error="skip", shuffle=False, progress=False)
    assert len(rf) == 2 and rf.schema.fields[0].shape == (3,)  # the refused sample widened nothing
    assert rf.write_summary.variable_fields == {}


def test_the_first_failures_are_listed_by_source_index(tmp_path: Path) -> None:
    bad = set(range(3, 100, 10))
    with pytest.raises(SourceError) as info:
        write_record(Flaky(100, bad), tmp_path / "a.tr", on_error="skip", max_skipped=3, shuffle=False, progress=False)
    assert "the first failures, by source index:\n  sample 3:" in str(info.value)
    with pytest.raises(SourceError) as info:
        write_record(Flaky(100, bad), tmp_path / "b.tr", on_error="skip", max_skipped=3, seed=1, progress=False)
    message = str(info.value)
    assert "the failures met before the write stopped, by source index" in message and "shuffled" in message
    listed = [int(line.split(":")[0].split()[-1]) for line in message.splitlines() if line.startswith("  sample ")]
    assert len(listed) == 4 and listed == sorted(listed)
