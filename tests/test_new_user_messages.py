"""Issue 41, items 8 and 12: what a new user's mistakes get told, numbered one way.

Each test makes the mistake for real (real files under tmp_path, a real Hugging Face dataset)
and checks the error or warning names what is wrong and what to do.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import torchrecord
from torchrecord import RecordDataset, RecordFile, open_set, write_record
from torchrecord.errors import (
    ArgumentTypeError,
    NotARecordSetError,
    RecordNotFoundError,
    SchemaError,
    SourceError,
    TorchRecordWarning,
)


@pytest.fixture
def one_set(tmp_path: Path) -> Path:
    path = tmp_path / "set.tr"
    write_record([(torch.zeros(2), i) for i in range(10)], path, progress=False)
    return path


# -- one problem, numbered one way ---------------------------------------------------------
def test_a_shuffled_write_names_the_first_sample_read_by_its_source_index(tmp_path: Path) -> None:
    """The odd sample read first is the reference; the message says it was read first, and why."""
    samples: list[Any] = [{"a": 1}, {"a": 2}, {"b": 3}]  # a seed-0 shuffle reads sample 2 first
    with pytest.raises(SchemaError) as info:
        write_record(samples, tmp_path / "s.tr", progress=False, seed=0)
    message = str(info.value)
    first = re.search(
        r"the first sample read \(sample (\d+): a shuffled write reads the source out of order\)", message
    )
    assert first, message
    blamed = re.search(r"s\.tr: sample (\d+)", message)
    assert blamed and {blamed.group(1), first.group(1)} <= {"0", "1", "2"} and blamed.group(1) != first.group(1)
    with pytest.raises(SchemaError, match=r"sample 2: .*the first sample read \(sample 0\) has"):
        write_record(samples, tmp_path / "o.tr", progress=False, shuffle=False)


def test_from_hf_names_a_null_at_the_sample_that_holds_it(tmp_path: Path) -> None:
    """The writer's sample and the dataset's row are the same number (a batch of rows is read at once)."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"x": [1, 2, None, 4], "t": ["a", "b", "c", None]})
    from torchrecord.convert import from_hf

    for shuffle in (False, True):
        with pytest.raises(SourceError) as info:
            from_hf(ds, tmp_path / f"h{shuffle}.tr", shuffle=shuffle, progress=False)
        numbers = re.findall(r"(?:sample|row) (\d+)", str(info.value))
        assert len(numbers) == 2 and numbers[0] == numbers[1], str(info.value)
    skipped = from_hf(ds, tmp_path / "skip.tr", on_error="skip", progress=False, shuffle=False)
    assert [s.index for s in skipped.write_summary.skipped_samples] == [2, 3]
    assert sorted(int(s["x"]) for s in skipped) == [1, 2]  # the other rows keep their values and dtype
    assert all(type(s["x"]) is int for s in skipped)  # an integer column's values come back as int (huggingface.md)
    # after select(), the number is the dataset's index, not the Arrow table's row
    with pytest.raises(SourceError, match=r"failed at sample 0: .*row 0, column 't' holds a null"):  # table row 3
        from_hf(ds.select([3, 2, 1, 0]), tmp_path / "sel.tr", shuffle=False, progress=False)


# -- arguments -----------------------------------------------------------------------------
@pytest.mark.parametrize("reader", ["RecordDataset", "RecordFile", "ShardedSet", "MixedDataset", "StreamDataset"])
def test_verify_given_to_a_reader_names_check(one_set: Path, reader: str) -> None:
    with pytest.raises(ArgumentTypeError, match=r"has no argument verify=: .*check='checksums'.*torchrecord\.verify"):
        getattr(torchrecord, reader)(one_set, verify=True)


def test_other_keywords_get_pythons_own_error(one_set: Path) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        RecordDataset(one_set, bogus=True)  # type: ignore[call-arg]


def test_the_refusal_leaves_readers_as_they_were(one_set: Path) -> None:
    """Signatures, pickling by name and reading are unchanged by the check."""
    import inspect
    import pickle

    assert "check" in inspect.signature(RecordDataset).parameters
    assert pickle.loads(pickle.dumps(open_set)) is open_set
    assert len(list(RecordDataset(one_set, check="checksums"))) == 10


def test_swapped_arguments_to_write_record_are_named(tmp_path: Path) -> None:
    samples = [(torch.zeros(2), 1)]
    for path in ("set.tr", tmp_path / "set.tr", b"set.tr"):
        with pytest.raises(ArgumentTypeError, match=r"arguments look swapped.*write_record\(samples, "):
            write_record(path, samples)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=r"the source is a str .*not a dataset"):
        write_record("other.tr", tmp_path / "set.tr")
    with pytest.raises(ArgumentTypeError, match="path is a NoneType"):
        write_record(samples, None)  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


def test_an_empty_source_warns(tmp_path: Path) -> None:
    with pytest.warns(TorchRecordWarning, match=r"empty\.tr: the source has no samples \(len 0\)"):
        rf = write_record([], tmp_path / "empty.tr", progress=False)
    assert len(rf) == 0


# -- paths ---------------------------------------------------------------------------------
def test_a_path_through_a_file_says_what_the_file_is(one_set: Path) -> None:
    for make in (RecordDataset, RecordFile, open_set):
        with pytest.raises(NotARecordSetError, match=r"set\.tr is a file .*without the trailing '/'"):
            make(f"{one_set}/")
        with pytest.raises(NotARecordSetError, match=r"set\.tr is a file, not a folder, so nothing is under it"):
            make(f"{one_set}/inner.tr")


def test_tilde_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    write_record([(torch.zeros(2), i) for i in range(4)], "~/set.tr", progress=False)
    assert (home / "set.tr").is_file() and not (tmp_path / "~").exists()
    assert len(RecordDataset("~/set.tr")) == 4 and len(RecordFile("~/set.tr")) == 4
    assert open_set("~/set.tr").path == str(home / "set.tr")


def test_record_file_fails_when_made_on_a_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.tr"
    with pytest.raises(RecordNotFoundError, match=r"missing\.tr: no record set here") as made:
        RecordFile(missing)
    with pytest.raises(RecordNotFoundError) as dataset:
        RecordDataset(missing)
    assert str(made.value) == str(dataset.value)  # the same message as the dataset's
    assert not missing.exists()


def test_a_record_file_made_before_fork_holds_no_handle(one_set: Path) -> None:
    """The check when made is a stat: the LMDB file still opens on first use."""
    rf = RecordFile(one_set)
    assert rf._handle is None and rf._meta is None  # nothing of LMDB held: nothing to cross a fork
    assert len(rf) == 10 and rf._handle is not None


# -- a list of lists -----------------------------------------------------------------------
def test_a_list_of_lists_is_a_structure_and_a_varying_count_says_what_to_do(tmp_path: Path) -> None:
    rf = write_record([[[1, 2], [3]], [[4], [5, 6]]], tmp_path / "ok.tr", shuffle=False, progress=False)
    assert [[t.tolist() for t in s] for s in rf] == [[[1, 2], [3]], [[4], [5, 6]]]
    with pytest.raises(SchemaError, match=r"its items are lists of numbers.*padded tensor.*offsets"):
        write_record([{"t": [[1, 2], [3]]}, {"t": [[4]]}], tmp_path / "bad.tr", shuffle=False, progress=False)
