"""What a failed sample is reported as: the library's own error for a sample it cannot store, the
source's own exception as the cause of a SourceError (issue 27, item 11)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from torchrecord import write_record
from torchrecord.errors import SampleTypeError, SampleValueError, SourceError


@pytest.mark.parametrize(
    ("rows", "kw", "error", "words"),
    [
        ([{"a": 1, "b": None}], {}, SampleTypeError, "field 'b' is None, which cannot be stored; give it a value"),
        ([{"a": 2**70}], {}, SampleValueError, "field 'a': int 1180591620717411303424 does not fit in int64"),
        ([{"episode": 1, "x": 2}], {"group_by": "epsiode"}, SampleValueError, "did you mean group_by='episode'?"),
    ],
    ids=["none", "beyond-int64", "group-by-typo"],
)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sample_the_format_cannot_store_is_the_librarys_own_error(
    tmp_path: Path, rows: list[Any], kw: dict[str, Any], error: type[Exception], words: str, num_workers: int
) -> None:
    path = tmp_path / "s.tr"
    with pytest.raises(error) as info:
        write_record(rows, path, num_workers=num_workers, progress=False, **kw)
    message = str(info.value)
    assert not isinstance(info.value, SourceError)
    assert message.startswith(f"{path}: sample 0, ") and words in message
    assert "Traceback" not in message and "source failed" not in message
    assert "on_error='skip'" not in message  # it would skip every sample
    assert os.listdir(tmp_path) == []


def test_a_later_unstorable_sample_mentions_skip(tmp_path: Path) -> None:
    with pytest.raises(SampleTypeError, match=r"sample 2, field 'b' is None.*on_error='skip'"):
        write_record([{"b": 1}, {"b": 2}, {"b": None}], tmp_path / "s.tr", shuffle=False, progress=False)


class _Unreadable(Exception):
    """The user's own exception type."""


class Broken(torch.utils.data.Dataset[Any]):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> Any:
        if i == 17:
            raise _Unreadable(f"cannot decode item {i}")
        return {"x": i}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_sources_exception_is_the_cause_not_the_text(tmp_path: Path, num_workers: int) -> None:
    with pytest.raises(SourceError) as info:
        write_record(Broken(), tmp_path / "s.tr", num_workers=num_workers, progress=False)
    message = str(info.value)
    assert "sample 17: _Unreadable: cannot decode item 17" in message and "on_error='skip'" in message
    assert "Traceback" not in message and "File " not in message
    cause = info.value.__cause__
    assert isinstance(cause, _Unreadable) and str(cause) == "cannot decode item 17"
    if num_workers:  # its traceback in the worker comes along as a note
        assert any("__getitem__" in note for note in getattr(cause, "__notes__", []))
    else:
        assert cause.__traceback__ is not None


def _generator() -> Iterator[dict[str, int]]:
    yield {"x": 0}
    raise KeyError("boom")


def test_a_generators_exception_is_the_cause(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"generator raised at sample 1: KeyError: 'boom'") as info:
        write_record(_generator(), tmp_path / "s.tr", progress=False)
    assert "Traceback" not in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)


class _TwoArguments(Exception):
    """An exception that does not unpickle (its __init__ needs two arguments, its args hold one)."""

    def __init__(self, what: str, where: int) -> None:
        super().__init__(f"{what} at {where}")


class BrokenOddly(torch.utils.data.Dataset[Any]):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> Any:
        if i == 9:
            raise _TwoArguments("cannot decode", i)
        return {"x": i}


def test_an_exception_that_does_not_pickle_out_of_a_worker_comes_as_a_note(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"sample 9: _TwoArguments: cannot decode at 9") as info:
        write_record(BrokenOddly(), tmp_path / "s.tr", num_workers=2, progress=False)
    assert "Traceback" not in str(info.value)
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1 and "Traceback" in notes[0] and "__getitem__" in notes[0]
